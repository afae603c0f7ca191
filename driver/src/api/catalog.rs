//! The cluster's Networks and DeviceClasses for the KNI door (`crate::kni::catalog`).

use k8s_openapi::api::resource::v1::DeviceClass;
use knic_proto::network::Network;

use crate::BoxFuture;
use crate::error::Result;
use crate::kni::catalog::{Catalog, Classes, selectors};

/// The cluster's Networks and DeviceClasses, listed through the API on each call (KNI calls are
/// rare; a list is one request).
pub struct KubeCatalog {
    client: kube::Client,
}

impl KubeCatalog {
    /// Reads through `client`.
    pub fn new(client: kube::Client) -> Self {
        KubeCatalog { client }
    }
}

impl Catalog for KubeCatalog {
    fn networks(&self) -> BoxFuture<'_, Result<Vec<Network>>> {
        Box::pin(async move {
            let api: kube::Api<Network> = kube::Api::all(self.client.clone());
            Ok(api.list(&kube::api::ListParams::default()).await?.items)
        })
    }

    fn classes(&self) -> BoxFuture<'_, Result<Classes>> {
        Box::pin(async move {
            let api: kube::Api<DeviceClass> = kube::Api::all(self.client.clone());
            Ok(api
                .list(&kube::api::ListParams::default())
                .await?
                .items
                .iter()
                .map(|c| (c.metadata.name.clone().unwrap_or_default(), selectors(c)))
                .collect())
        })
    }

    fn validates(&self) -> bool {
        false
    }
}
