//! The two cert-manager kinds the chart renders (for the webhook's certificates), typed after
//! cert-manager's `cert-manager.io/v1` API for the fields the chart uses, with unknown fields
//! refused, so they are checked like every k8s-openapi kind (cert-manager's types are not in
//! k8s-openapi). A field the chart starts to use must be added here first.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{NamespaceResourceScope, Resource};
use serde::{Deserialize, Serialize};

/// `cert-manager.io/v1` Issuer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Issuer {
    /// `cert-manager.io/v1`.
    pub api_version: String,
    /// `Issuer`.
    pub kind: String,
    /// Name and namespace.
    pub metadata: ObjectMeta,
    /// What signs.
    pub spec: IssuerSpec,
}

/// An Issuer's one signer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IssuerSpec {
    /// Self-signed (the CA's own issuer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_signed: Option<serde_json::Map<String, serde_json::Value>>,
    /// A CA kept in a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<CaIssuer>,
}

/// `spec.ca`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CaIssuer {
    /// The CA's Secret.
    pub secret_name: String,
}

/// `cert-manager.io/v1` Certificate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Certificate {
    /// `cert-manager.io/v1`.
    pub api_version: String,
    /// `Certificate`.
    pub kind: String,
    /// Name and namespace.
    pub metadata: ObjectMeta,
    /// What to issue.
    pub spec: CertificateSpec,
}

/// The Certificate fields the chart sets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificateSpec {
    /// Where the key pair goes.
    pub secret_name: String,
    /// Issued by.
    pub issuer_ref: IssuerRef,
    /// A CA certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_ca: Option<bool>,
    /// Subject CN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub common_name: Option<String>,
    /// Subject alternative names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_names: Option<Vec<String>>,
    /// Lifetime (Go duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// Renewal margin (Go duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
    /// Key usages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usages: Option<Vec<String>>,
    /// The private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<PrivateKey>,
}

/// `spec.issuerRef`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IssuerRef {
    /// Issuer name.
    pub name: String,
    /// `Issuer` or `ClusterIssuer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `cert-manager.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// `spec.privateKey`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrivateKey {
    /// `RSA`, `ECDSA` or `Ed25519`.
    pub algorithm: String,
    /// Key size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    /// `Never` or `Always`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation_policy: Option<String>,
}

macro_rules! resource {
    ($ty:ident, $plural:literal) => {
        impl Resource for $ty {
            const API_VERSION: &'static str = "cert-manager.io/v1";
            const GROUP: &'static str = "cert-manager.io";
            const KIND: &'static str = stringify!($ty);
            const VERSION: &'static str = "v1";
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = NamespaceResourceScope;
        }
    };
}
resource!(Issuer, "issuers");
resource!(Certificate, "certificates");
