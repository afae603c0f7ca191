//! An in-memory [`AddressBook`] with the apiserver's create-by-name semantics, for tests.

use super::*;
use knic_proto::network::stable::{HELD_LABEL, HELD_SINCE_ANNOTATION};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[derive(Default)]
pub(crate) struct MemBook {
    pub networks: Mutex<BTreeMap<String, Network>>,
    pub pods: Mutex<BTreeMap<(String, String), BTreeMap<String, String>>>,
    pub namespaces: Mutex<BTreeMap<String, BTreeMap<String, String>>>,
    pub objects: Mutex<BTreeMap<String, NetworkAddress>>,
    /// Names another node creates between our LIST and our CREATE: invisible to `list`
    /// until a create of that name is attempted, which then answers `AlreadyExists`.
    pub racing: Mutex<BTreeMap<String, NetworkAddress>>,
    pub creates: AtomicU64,
    uids: AtomicU64,
    /// Whether the book may read pods (`--pod-label-reads`); off, like the driver's default.
    pub pod_reads: AtomicBool,
    /// Pod reads made, to show none is made when none may be.
    pub pod_reads_made: AtomicU64,
    /// Claims that exist, by (namespace, name): uid and whether being deleted.
    pub claims: Mutex<BTreeMap<(String, String), (String, bool)>>,
    /// `stable_in_use` reports (the Events a real book sends).
    pub in_use: Mutex<Vec<String>>,
}

impl MemBook {
    pub(crate) fn add_network(&self, name: &str, spec: serde_json::Value) {
        let network = Network::new(name, serde_json::from_value(spec).unwrap());
        self.networks
            .lock()
            .unwrap()
            .insert(name.to_owned(), network);
    }

    pub(crate) fn edit_network(&self, name: &str, edit: impl FnOnce(&mut Network)) {
        edit(self.networks.lock().unwrap().get_mut(name).unwrap());
    }

    /// Records a claim as existing (`deleting`: with a deletionTimestamp).
    pub(crate) fn set_claim(&self, name: &str, uid: &str, deleting: bool) {
        self.claims
            .lock()
            .unwrap()
            .insert(("ns".into(), name.into()), (uid.into(), deleting));
    }

    /// Forgets a claim (deleted for good).
    pub(crate) fn drop_claim(&self, name: &str) {
        self.claims
            .lock()
            .unwrap()
            .remove(&("ns".to_owned(), name.to_owned()));
    }

    /// The object of an address, if any.
    pub(crate) fn object_of(&self, address: &str) -> Option<NetworkAddress> {
        self.objects
            .lock()
            .unwrap()
            .values()
            .find(|o| o.spec.address == address)
            .cloned()
    }

    pub(crate) fn addresses(&self) -> Vec<String> {
        self.objects
            .lock()
            .unwrap()
            .values()
            .map(|o| o.spec.address.clone())
            .collect()
    }
}

impl AddressBook for MemBook {
    fn network<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Network>>> {
        Box::pin(async move { Ok(self.networks.lock().unwrap().get(name).cloned()) })
    }

    fn reads_pod_labels(&self) -> bool {
        self.pod_reads.load(Ordering::SeqCst)
    }

    fn pod_labels<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>>> {
        Box::pin(async move {
            self.pod_reads_made.fetch_add(1, Ordering::SeqCst);
            Ok(self
                .pods
                .lock()
                .unwrap()
                .get(&(namespace.to_owned(), name.to_owned()))
                .cloned())
        })
    }

    fn namespace_labels<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>>> {
        Box::pin(async move { Ok(self.namespaces.lock().unwrap().get(name).cloned()) })
    }

    fn list<'a>(&'a self, network: &'a str) -> BoxFuture<'a, Result<Vec<NetworkAddress>>> {
        Box::pin(async move {
            Ok(self
                .objects
                .lock()
                .unwrap()
                .values()
                .filter(|o| {
                    o.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(NETWORK_LABEL))
                        .is_some_and(|n| n == network)
                })
                .cloned()
                .collect())
        })
    }

    fn create<'a>(&'a self, address: &'a NetworkAddress) -> BoxFuture<'a, Result<Created>> {
        Box::pin(async move {
            self.creates.fetch_add(1, Ordering::SeqCst);
            let name = address.metadata.name.clone().unwrap_or_default();
            let mut objects = self.objects.lock().unwrap();
            if let Some(raced) = self.racing.lock().unwrap().remove(&name) {
                objects.insert(name.clone(), raced);
            }
            if objects.contains_key(&name) {
                return Ok(Created::AlreadyExists);
            }
            let uid = format!("uid-{}", self.uids.fetch_add(1, Ordering::SeqCst) + 1);
            let mut stored = address.clone();
            stored.metadata.uid = Some(uid.clone());
            objects.insert(name, stored);
            Ok(Created::Created(uid))
        })
    }

    fn delete<'a>(&'a self, name: &'a str, uid: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let mut objects = self.objects.lock().unwrap();
            if objects
                .get(name)
                .is_some_and(|o| o.metadata.uid.as_deref() == Some(uid))
            {
                objects.remove(name);
            }
            Ok(())
        })
    }

    fn claim_state<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<ClaimState>> {
        Box::pin(async move {
            let claims = self.claims.lock().unwrap();
            Ok(match claims.get(&(namespace.to_owned(), name.to_owned())) {
                Some((u, deleting)) if u == uid => {
                    if *deleting {
                        ClaimState::Deleting
                    } else {
                        ClaimState::Live
                    }
                }
                _ => ClaimState::Gone,
            })
        })
    }

    fn hold<'a>(
        &'a self,
        name: &'a str,
        uid: &'a str,
        since: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let mut objects = self.objects.lock().unwrap();
            if let Some(o) = objects
                .get_mut(name)
                .filter(|o| o.metadata.uid.as_deref() == Some(uid))
            {
                o.metadata
                    .labels
                    .get_or_insert_default()
                    .insert(HELD_LABEL.into(), "true".into());
                o.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(HELD_SINCE_ANNOTATION.into(), since.into());
            }
            Ok(())
        })
    }

    fn stable_in_use(&self, _: &Requester, message: String) {
        self.in_use.lock().unwrap().push(message);
    }
}
