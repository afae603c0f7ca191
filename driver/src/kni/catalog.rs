//! Where the KNI door learns the knic Networks and the DeviceClasses their devices are chosen
//! by: the cluster's objects when the driver runs in a cluster, local files in standalone mode
//! (`knic-driver kni --standalone --networks FILE`), where no controller exists.
//!
//! The classes knic ships (`deviceclasses/knic.yaml`) are built in for standalone mode, so a
//! Network naming `nic.knic.dev` or a friendly device form (class `knic.dev`) works without
//! writing a class; a file may add classes of its own or replace a built-in one.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::resource::v1::DeviceClass;
use knic_proto::network::Network;

use crate::BoxFuture;
use crate::error::{Error, Result};

/// DeviceClass name → its CEL selectors.
pub type Classes = BTreeMap<String, Vec<String>>;

/// The Networks and classes, read when asked (each KNI call sees the current ones).
pub trait Catalog: Send + Sync + 'static {
    /// Every Network.
    fn networks(&self) -> BoxFuture<'_, Result<Vec<Network>>>;
    /// Every DeviceClass: name → its CEL selectors.
    fn classes(&self) -> BoxFuture<'_, Result<Classes>>;
    /// Whether Networks must be validated by the reader (no controller judged them).
    fn validates(&self) -> bool;
}

/// The CEL selectors of a class.
pub fn selectors(class: &DeviceClass) -> Vec<String> {
    class
        .spec
        .selectors
        .iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
        .collect()
}

/// The classes of `deviceclasses/knic.yaml`, as every knic install has them.
pub fn builtin_classes() -> Classes {
    const SHIPPED: &str = include_str!("../../../deviceclasses/knic.yaml");
    let mut out = BTreeMap::new();
    for doc in serde_yaml_ng::Deserializer::from_str(SHIPPED) {
        use serde::Deserialize as _;
        if let Ok(class) = DeviceClass::deserialize(doc) {
            out.insert(
                class.metadata.name.clone().unwrap_or_default(),
                selectors(&class),
            );
        }
    }
    out
}

/// The largest Networks file read: a Network is about a kilobyte.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Networks and DeviceClasses from YAML or JSON files (documents of `kind: Network` and `kind:
/// DeviceClass`; a `kind: List` of them too), re-read on each call so an edit takes effect at
/// the next one.
pub struct FileCatalog {
    files: Vec<PathBuf>,
}

impl FileCatalog {
    /// Reads `files`; [`FileCatalog::load`] once at start reports a bad one before serving.
    pub fn new(files: Vec<PathBuf>) -> Self {
        FileCatalog { files }
    }

    /// Every Network and class of the files, the built-in classes first.
    pub fn load(&self) -> Result<(Vec<Network>, Classes)> {
        let mut networks: BTreeMap<String, Network> = BTreeMap::new();
        let mut classes = builtin_classes();
        for path in &self.files {
            let text = crate::bounded::read_policy_text(path, MAX_FILE_BYTES, "Networks file")?;
            let bad = |index: usize, reason: String| Error::Setting {
                setting: "--networks/KNIC_NETWORKS",
                reason: format!("{} document {index}: {reason}", path.display()),
            };
            let mut docs = Vec::new();
            for (index, doc) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
                use serde::Deserialize as _;
                let value = serde_json::Value::deserialize(doc)
                    .map_err(|e| bad(index + 1, e.to_string()))?;
                match value.get("kind").and_then(|k| k.as_str()) {
                    Some("List") => docs.extend(
                        value["items"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .cloned()
                            .map(|v| (index, v)),
                    ),
                    _ if value.is_null() => {}
                    _ => docs.push((index, value)),
                }
            }
            for (index, value) in docs {
                match value.get("kind").and_then(|k| k.as_str()) {
                    Some("Network") => {
                        let network: Network = serde_json::from_value(value)
                            .map_err(|e| bad(index + 1, format!("Network: {e}")))?;
                        let name = network.metadata.name.clone().unwrap_or_default();
                        if name.is_empty() {
                            return Err(bad(
                                index + 1,
                                "Network: metadata.name is required".into(),
                            ));
                        }
                        if network.spec.vxlan.is_some() {
                            return Err(bad(
                                index + 1,
                                format!(
                                    "Network {name:?} has spec.vxlan, which needs the cluster's NetworkAddress objects to find other nodes' pods; standalone mode has none"
                                ),
                            ));
                        }
                        if networks.insert(name.clone(), network).is_some() {
                            return Err(bad(
                                index + 1,
                                format!("Network {name:?} is defined twice"),
                            ));
                        }
                    }
                    Some("DeviceClass") => {
                        let class: DeviceClass = serde_json::from_value(value)
                            .map_err(|e| bad(index + 1, format!("DeviceClass: {e}")))?;
                        classes.insert(
                            class.metadata.name.clone().unwrap_or_default(),
                            selectors(&class),
                        );
                    }
                    other => {
                        return Err(bad(
                            index + 1,
                            format!(
                                "kind {} is not read here (Network or DeviceClass)",
                                other.map_or("(none)".to_owned(), |k| format!("{k:?}"))
                            ),
                        ));
                    }
                }
            }
        }
        Ok((networks.into_values().collect(), classes))
    }
}

impl Catalog for FileCatalog {
    fn networks(&self) -> BoxFuture<'_, Result<Vec<Network>>> {
        Box::pin(async move { self.load().map(|(n, _)| n) })
    }

    fn classes(&self) -> BoxFuture<'_, Result<Classes>> {
        Box::pin(async move { self.load().map(|(_, c)| c) })
    }

    fn validates(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<(Vec<Network>, Classes)> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("networks.yaml");
        std::fs::write(&path, text).expect("write");
        FileCatalog::new(vec![path]).load()
    }

    #[test]
    fn builtin_classes_include_the_overlay_class() {
        let classes = builtin_classes();
        assert_eq!(
            classes.get(knic_proto::network::OVERLAY_DEVICE_CLASS),
            Some(&vec![
                "device.driver == \"knic.dev\" && device.attributes[\"knic.dev\"].kind == \"overlay\""
                    .to_owned()
            ])
        );
    }

    #[test]
    fn standalone_refuses_a_vxlan_network() {
        let text = "apiVersion: knic.dev/v1alpha1\nkind: Network\nmetadata: {name: ovl}\n\
                    spec:\n  vxlan: {vni: 4242}\n  ipam: {subnets: [{cidr: 10.42.0.0/24}]}\n  \
                    namespaces: {names: [default]}\n";
        let error = load(text).expect_err("vxlan refused").to_string();
        assert!(
            error.ends_with(
                "document 1: Network \"ovl\" has spec.vxlan, which needs the cluster's NetworkAddress objects to find other nodes' pods; standalone mode has none"
            ),
            "{error}"
        );
        // The same Network with devices instead loads.
        let plain = text.replace("vxlan: {vni: 4242}", "devices: {kind: vf}");
        assert_eq!(load(&plain).expect("loads").0.len(), 1);
    }
}
