//! IPAM's API calls: Networks, pod and namespace labels, and the `NetworkAddress` objects
//! whose create-by-name makes an address unique.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use knic_proto::network::{NETWORK_LABEL, Network, NetworkAddress};
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};

use crate::BoxFuture;
use crate::claims::ipam::{AddressBook, Created};
use crate::error::Result;

/// [`AddressBook`] over the Kubernetes API.
#[derive(Clone)]
pub struct KubeAddressBook {
    client: kube::Client,
}

impl KubeAddressBook {
    /// Wraps a client; no request is made until an allocation is needed.
    pub fn new(client: kube::Client) -> Self {
        KubeAddressBook { client }
    }
}

impl AddressBook for KubeAddressBook {
    fn network<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Network>>> {
        Box::pin(async move {
            let api: kube::Api<Network> = kube::Api::all(self.client.clone());
            Ok(api.get_opt(name).await?)
        })
    }

    fn pod_labels<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>>> {
        Box::pin(async move {
            let api: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), namespace);
            Ok(api
                .get_opt(name)
                .await?
                .map(|p| p.metadata.labels.unwrap_or_default()))
        })
    }

    fn namespace_labels<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>>> {
        Box::pin(async move {
            let api: kube::Api<Namespace> = kube::Api::all(self.client.clone());
            Ok(api
                .get_opt(name)
                .await?
                .map(|n| n.metadata.labels.unwrap_or_default()))
        })
    }

    fn list<'a>(&'a self, network: &'a str) -> BoxFuture<'a, Result<Vec<NetworkAddress>>> {
        Box::pin(async move {
            let api: kube::Api<NetworkAddress> = kube::Api::all(self.client.clone());
            let params = ListParams::default().labels(&format!("{NETWORK_LABEL}={network}"));
            Ok(api.list(&params).await?.items)
        })
    }

    fn create<'a>(&'a self, address: &'a NetworkAddress) -> BoxFuture<'a, Result<Created>> {
        Box::pin(async move {
            let api: kube::Api<NetworkAddress> = kube::Api::all(self.client.clone());
            match api.create(&PostParams::default(), address).await {
                Ok(stored) => Ok(Created::Created(stored.metadata.uid.unwrap_or_default())),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Created::AlreadyExists),
                Err(e) => Err(e.into()),
            }
        })
    }

    fn delete<'a>(&'a self, name: &'a str, uid: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let api: kube::Api<NetworkAddress> = kube::Api::all(self.client.clone());
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.to_owned()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(name, &params).await {
                Ok(_) => Ok(()),
                // 404: already released (or collected). 409: the precondition failed, so the
                // name now belongs to another allocation, which must be left alone.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
                Err(e) => Err(e.into()),
            }
        })
    }
}
