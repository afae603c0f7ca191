//! The NetworkAttachmentDefinition a Network produces for Multus users: its coordinates in the
//! `k8s.cni.cncf.io` API (the de-facto standard CRD of the Network Plumbing Working Group) and
//! the CNI config it carries, which names the `knic` plugin and the Network. Pure, so the
//! controller that writes it and the plugin that reads it back agree by construction.

use serde::{Deserialize, Serialize};

/// API group of the NetworkAttachmentDefinition CRD.
pub const NAD_GROUP: &str = "k8s.cni.cncf.io";
/// The only served version of that CRD.
pub const NAD_VERSION: &str = "v1";
/// Its kind.
pub const NAD_KIND: &str = "NetworkAttachmentDefinition";
/// Its plural (the URL path segment and the RBAC resource).
pub const NAD_PLURAL: &str = "network-attachment-definitions";
/// The CNI `type`, i.e. the file name Multus runs from its CNI bin directory.
pub const CNI_TYPE: &str = "knic";
/// The CNI spec version written into generated configs: the newest all current Multus
/// releases pass through. The plugin answers whatever version the runtime asks for.
pub const CNI_CONFIG_VERSION: &str = "1.0.0";

/// The CNI network configuration of a generated NAD, and what the plugin reads from stdin.
/// Unknown fields are ignored on reading: Multus and runtimes add their own (`runtimeConfig`,
/// `prevResult`, `args`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NadConfig {
    /// The CNI spec version of this config (and of the result the caller expects).
    pub cni_version: String,
    /// The CNI network name (the NAD's, which is the Network's).
    pub name: String,
    /// The plugin: `knic`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The knic Network whose claim provides the interface; unset means `name`, so a
    /// hand-written NAD with a different name can still point at a Network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

impl NadConfig {
    /// The Network this config asks for.
    pub fn network(&self) -> &str {
        self.network.as_deref().unwrap_or(&self.name)
    }
}

/// The `spec.config` string of the NAD generated for `network`.
pub fn nad_config(network: &str) -> String {
    let config = NadConfig {
        cni_version: CNI_CONFIG_VERSION.to_owned(),
        name: network.to_owned(),
        type_: CNI_TYPE.to_owned(),
        network: Some(network.to_owned()),
    };
    // A struct of four strings always serializes.
    serde_json::to_string(&config).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_the_documented_string() {
        assert_eq!(
            nad_config("blue"),
            r#"{"cniVersion":"1.0.0","name":"blue","type":"knic","network":"blue"}"#
        );
    }

    #[test]
    fn config_reads_back_and_escapes() {
        let text = nad_config("a\"b");
        let back: NadConfig = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(back.network(), "a\"b");
        assert_eq!(back.type_, "knic");
    }

    #[test]
    fn network_defaults_to_name_and_extra_fields_are_ignored() {
        let c: NadConfig = serde_json::from_str(
            r#"{"cniVersion":"0.3.1","name":"red","type":"knic","runtimeConfig":{"x":1}}"#,
        )
        .expect("parses");
        assert_eq!(c.network(), "red");
        let missing = serde_json::from_str::<NadConfig>(r#"{"name":"red","type":"knic"}"#)
            .expect_err("cniVersion is required");
        assert!(missing.to_string().contains("cniVersion"), "{missing}");
    }
}
