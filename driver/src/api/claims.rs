//! ResourceClaims read at prepare time.

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::BoxFuture;
use crate::claims::ClaimSource;
use crate::error::Result;

/// Reads claims from the Kubernetes API (`resource.k8s.io/v1`).
#[derive(Clone)]
pub struct KubeClaims {
    client: kube::Client,
}

impl KubeClaims {
    /// Wraps a client; no request is made until a claim is needed.
    pub fn new(client: kube::Client) -> Self {
        KubeClaims { client }
    }
}

impl ClaimSource for KubeClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>>> {
        Box::pin(async move {
            let api: kube::Api<ResourceClaim> =
                kube::Api::namespaced(self.client.clone(), namespace);
            Ok(api.get_opt(name).await?)
        })
    }
}
