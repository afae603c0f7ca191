//! Keeps the node's ResourceSlices equal to the inventory: the one place that writes slices.
//!
//! A sync lists this driver's slices for the node, asks the pure [`crate::slices::plan`] for the writes
//! and performs them (deletes with preconditions, then updates guarded by resourceVersion, then
//! creates). Syncs are triggered by a new inventory, by any slice event not caused by our own
//! writes (the kubelet wipes a node's slices when it restarts or loses the plugin for 30 s), and
//! by a slow periodic timer; a burst of triggers is coalesced into one sync. Failures retry with
//! exponential backoff. Fields an apiserver drops (a feature gate is off) are accepted as the
//! stored form after one warning, so the publisher never loops rewriting them.
//!
//! PF budgets are the exception: the publisher starts in [`Mode::Partitionable`] and, when the
//! apiserver drops `sharedCounters` or `consumesCounters` (`DRAPartitionableDevices` is off),
//! switches to [`Mode::Plain`] for the rest of its life and republishes at once. Accepting the
//! stored form there would leave a pool of counter-less devices beside counter slices emptied by
//! the apiserver, and a pool whose devices name counter sets nobody publishes is refused whole.
//!
//! Shared parents likewise: the publisher starts in [`ShareMode::Capacity`] and, when the
//! apiserver drops `allowMultipleAllocations` or a capacity's `requestPolicy`
//! (`DRAConsumableCapacity` is off), switches to [`ShareMode::Slots`] for good, says so to
//! whoever follows the mode (the preparer's view of the devices, see [`crate::sharing::follow`])
//! and republishes at once. Accepting the stored form there would publish every shared parent as
//! one plain device that the scheduler gives out whole, once.
//!
//! Device taints too: when the apiserver drops `taints` (`DRADeviceTaints` is off, as before
//! 1.36 by default), the publisher stops sending them for good and republishes at once. The
//! taints lower the per-slice device cap, so the stored form can have a different layout than
//! the one planned; the health stream still reports those devices unhealthy.

use crate::metrics::metrics;
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice, ResourceSliceSpec};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions, WatchEvent, WatchParams};
use tokio::sync::{mpsc, watch};

use crate::error::Result;
use crate::sharing::{self, ShareMode};
use crate::slices::{Mode, PoolOwner, layout_owned, plan_owned};

/// Timing knobs; tests shorten them.
#[derive(Debug, Clone)]
pub struct PublisherSettings {
    /// How long to wait after a trigger for more triggers before syncing.
    pub coalesce: Duration,
    /// Resync even without triggers this often.
    pub resync: Duration,
    /// Resync this often while the slice watch is failing, so a slice someone deleted is put
    /// back within seconds even when no watch event says so.
    pub unhealthy_resync: Duration,
    /// First retry delay after a failed sync; doubles up to `max_backoff`.
    pub min_backoff: Duration,
    /// Largest retry delay.
    pub max_backoff: Duration,
}

impl Default for PublisherSettings {
    fn default() -> Self {
        PublisherSettings {
            coalesce: Duration::from_millis(200),
            resync: Duration::from_secs(600),
            unhealthy_resync: Duration::from_secs(5),
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// What one sync did, for logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Slices deleted.
    pub deleted: usize,
    /// Slices updated.
    pub updated: usize,
    /// Slices created.
    pub created: usize,
    /// Pool generation after the sync.
    pub generation: i64,
    /// Whether the pool carries PF budgets (false once the apiserver dropped them).
    pub counters: bool,
    /// Whether shared parents carry consumable capacity (false once the apiserver dropped it:
    /// they are published as child slots).
    pub capacity: bool,
    /// Whether devices carry their taints (false once the apiserver dropped them).
    pub taints: bool,
}

/// Publishes one node's pool.
pub struct Publisher {
    slices: Api<ResourceSlice>,
    nodes: Api<Node>,
    driver: String,
    node: String,
    accepted: Vec<(ResourceSliceSpec, ResourceSliceSpec)>,
    /// resourceVersions our own writes produced; their watch events do not trigger a sync.
    own_writes: VecDeque<String>,
    owner: Option<PoolOwner>,
    mode: Mode,
    share_mode: watch::Sender<ShareMode>,
    taints: bool,
}

fn selector(driver: &str, node: &str) -> String {
    format!("spec.nodeName={node},spec.driver={driver}")
}

impl Publisher {
    /// A publisher for `node`'s pool of `driver`.
    pub fn new(client: kube::Client, driver: &str, node: &str) -> Self {
        Publisher {
            slices: Api::all(client.clone()),
            nodes: Api::all(client),
            driver: driver.into(),
            node: node.into(),
            accepted: Vec::new(),
            own_writes: VecDeque::new(),
            owner: None,
            mode: Mode::Partitionable,
            share_mode: watch::Sender::new(ShareMode::Capacity),
            taints: true,
        }
    }

    /// Reports the share mode (and every switch of it) to `mode`'s receivers.
    pub fn with_share_mode(mut self, mode: watch::Sender<ShareMode>) -> Self {
        mode.send_replace(*self.share_mode.borrow());
        self.share_mode = mode;
        self
    }

    /// How shared parents are published (see [`ShareMode`]).
    pub fn share_mode(&self) -> ShareMode {
        *self.share_mode.borrow()
    }

    /// Whether device taints are still published.
    pub fn taints(&self) -> bool {
        self.taints
    }

    /// Whether PF budgets are still published (see [`Mode`]).
    pub fn mode(&self) -> Mode {
        self.mode
    }

    async fn owner(&mut self) -> Result<PoolOwner> {
        if let Some(owner) = &self.owner {
            return Ok(owner.clone());
        }
        let node = self.nodes.get(&self.node).await?;
        let owner = PoolOwner {
            node_name: self.node.clone(),
            node_uid: node.metadata.uid.unwrap_or_default(),
        };
        self.owner = Some(owner.clone());
        Ok(owner)
    }

    fn remember_write(&mut self, slice: &ResourceSlice) {
        if let Some(rv) = &slice.metadata.resource_version {
            self.own_writes.push_back(rv.clone());
            while self.own_writes.len() > 256 {
                self.own_writes.pop_front();
            }
        }
    }

    /// Compares what was written with what was stored. Returns true when the apiserver dropped
    /// the counters, the consumable capacity or the taints: the publisher is then in plain
    /// (slot, untainted) mode and the current plan is void.
    fn check_dropped(&mut self, sent: &ResourceSliceSpec, stored: &ResourceSlice) -> bool {
        let mut switched = false;
        if self.mode == Mode::Partitionable && has_counters(sent) && !has_counters(&stored.spec) {
            tracing::warn!(slice = ?stored.metadata.name,
                "DRAPartitionableDevices is off: publishing plain devices without PF budgets");
            self.mode = Mode::Plain;
            switched = true;
        }
        let (sent_multiple, sent_policies) = consumable_fields(sent);
        let (stored_multiple, stored_policies) = consumable_fields(&stored.spec);
        if self.share_mode() == ShareMode::Capacity
            && ((sent_multiple && !stored_multiple) || (sent_policies && !stored_policies))
        {
            tracing::warn!(slice = ?stored.metadata.name,
                "DRAConsumableCapacity is off: publishing shared parents as child-slot devices");
            self.share_mode.send_replace(ShareMode::Slots);
            switched = true;
        }
        if self.taints && has_taints(sent) && !has_taints(&stored.spec) {
            tracing::warn!(slice = ?stored.metadata.name,
                "DRADeviceTaints is off: publishing devices without taints");
            self.taints = false;
            switched = true;
        }
        if switched {
            return true;
        }
        if !crate::slices::same(sent, &stored.spec) {
            tracing::warn!(slice = ?stored.metadata.name,
                "the apiserver dropped fields of a ResourceSlice (a DRA feature gate is off); \
                 accepting the stored form");
            self.accepted.push((sent.clone(), stored.spec.clone()));
            if self.accepted.len() > 64 {
                self.accepted.remove(0);
            }
        }
        false
    }

    /// One sync: list, plan, write. Returns what was written. When a write shows that the
    /// apiserver drops counters, the rest of the plan is abandoned and the pool is planned and
    /// written again at once in plain mode (at most once per process: plain mode is sticky).
    pub async fn sync(&mut self, devices: &[Device]) -> Result<SyncReport> {
        let mut total = SyncReport::default();
        loop {
            let (report, switched) = self.sync_once(devices).await?;
            total = SyncReport {
                deleted: total.deleted + report.deleted,
                updated: total.updated + report.updated,
                created: total.created + report.created,
                generation: report.generation,
                counters: self.mode == Mode::Partitionable,
                capacity: self.share_mode() == ShareMode::Capacity,
                taints: self.taints,
            };
            if !switched {
                return Ok(total);
            }
        }
    }

    /// `devices` in the form the apiserver takes: shared parents expanded in slot mode, taints
    /// left out once the apiserver dropped them.
    fn shaped(&self, devices: &[Device]) -> Vec<Device> {
        let mut out = sharing::expand(devices, self.share_mode());
        if !self.taints {
            for device in &mut out {
                device.taints = None;
            }
        }
        out
    }

    async fn sync_once(&mut self, devices: &[Device]) -> Result<(SyncReport, bool)> {
        let owner = self.owner().await?;
        let existing = self
            .slices
            .list(&ListParams::default().fields(&selector(&self.driver, &self.node)))
            .await?;
        // Each step moves the devices on: one copy of them alive at a time.
        let plan = plan_owned(
            &self.driver,
            &owner,
            &existing.items,
            layout_owned(self.shaped(devices), self.mode),
            &self.accepted,
        );
        let mut report = SyncReport {
            generation: plan.generation,
            ..Default::default()
        };
        for slice in &plan.deletes {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: slice.metadata.uid.clone(),
                    resource_version: slice.metadata.resource_version.clone(),
                }),
                ..Default::default()
            };
            let deleted = self.slices.delete(&name, &params).await;
            count_write("delete", &deleted);
            match deleted {
                Ok(_) => report.deleted += 1,
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        for slice in &plan.updates {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let stored = self
                .slices
                .replace(&name, &PostParams::default(), slice)
                .await;
            count_write("update", &stored);
            let stored = stored?;
            self.remember_write(&stored);
            report.updated += 1;
            if self.check_dropped(&slice.spec, &stored) {
                return Ok((report, true));
            }
        }
        for slice in &plan.creates {
            let stored = self.slices.create(&PostParams::default(), slice).await;
            count_write("create", &stored);
            let stored = stored?;
            self.remember_write(&stored);
            report.created += 1;
            if self.check_dropped(&slice.spec, &stored) {
                return Ok((report, true));
            }
        }
        if !plan.is_empty() {
            tracing::info!(node = %self.node, generation = report.generation, created = report.created,
                updated = report.updated, deleted = report.deleted, "ResourceSlices published");
        }
        Ok((report, false))
    }

    /// Runs until `devices`' sender is dropped: syncs on every trigger, with backoff.
    pub async fn run(self, devices: watch::Receiver<Vec<Device>>, settings: PublisherSettings) {
        self.run_reporting(devices, settings, watch::channel(false).0)
            .await;
    }

    /// [`Publisher::run`], saying in `published` whether the last sync succeeded (readiness),
    /// and exporting the published devices by kind.
    pub async fn run_reporting(
        mut self,
        mut devices: watch::Receiver<Vec<Device>>,
        settings: PublisherSettings,
        published: watch::Sender<bool>,
    ) {
        let (events_tx, mut events) = mpsc::channel::<String>(64);
        let (healthy_tx, healthy) = watch::channel(true);
        let watcher = tokio::spawn(watch_slices(
            self.slices.clone(),
            selector(&self.driver, &self.node),
            events_tx,
            healthy_tx,
        ));
        let mut backoff = settings.min_backoff;
        let mut dirty = true;
        loop {
            if dirty {
                // Coalesce a burst of triggers into one sync.
                tokio::time::sleep(settings.coalesce).await;
                while let Ok(rv) = events.try_recv() {
                    let _ = rv;
                }
                let snapshot = devices.borrow_and_update().clone();
                match self.sync(&snapshot).await {
                    Ok(_) => {
                        published.send_replace(true);
                        metrics()
                            .published_devices
                            .replace_all(devices_by_kind(&snapshot));
                        dirty = false;
                        backoff = settings.min_backoff;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?backoff, "publishing ResourceSlices failed");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(settings.max_backoff);
                        continue;
                    }
                }
            }
            tokio::select! {
                changed = devices.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    dirty = true;
                }
                Some(rv) = events.recv() => {
                    if !self.own_writes.contains(&rv) {
                        dirty = true;
                    }
                }
                () = tokio::time::sleep(if *healthy.borrow() {
                    settings.resync
                } else {
                    settings.unhealthy_resync
                }) => dirty = true,
            }
        }
        watcher.abort();
    }
}

/// Counts one ResourceSlice write; a delete of a slice already gone is not a failure.
fn count_write<T>(operation: &str, outcome: &std::result::Result<T, kube::Error>) {
    let result = match outcome {
        Ok(_) => crate::metrics::SUCCESS,
        Err(kube::Error::Api(e)) if operation == "delete" && e.code == 404 => {
            crate::metrics::SUCCESS
        }
        Err(_) => crate::metrics::ERROR,
    };
    metrics().slice_writes.inc([operation, result]);
}

/// Devices by their `kind` attribute (`unknown` without one).
pub fn devices_by_kind(devices: &[Device]) -> Vec<([String; 1], f64)> {
    let mut counts: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    for d in devices {
        let kind = d
            .attributes
            .as_ref()
            .and_then(|a| a.get("kind"))
            .and_then(|v| v.string.clone())
            .unwrap_or_else(|| "unknown".into());
        *counts.entry(kind).or_default() += 1.0;
    }
    counts.into_iter().map(|(k, n)| ([k], n)).collect()
}

/// Whether a spec carries PF budgets: counter sets or devices consuming them.
fn has_counters(spec: &ResourceSliceSpec) -> bool {
    spec.shared_counters.as_ref().is_some_and(|s| !s.is_empty())
        || spec
            .devices
            .iter()
            .flatten()
            .any(|d| d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty()))
}

/// Whether any device of a spec carries a taint.
fn has_taints(spec: &ResourceSliceSpec) -> bool {
    spec.devices
        .iter()
        .flatten()
        .any(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
}

/// Whether a spec carries the fields of consumable capacity: `(a device allocatable many
/// times, a capacity with a request policy)`. Losing either means the gate is off: a shared
/// device without its request policies would let one claim take the whole link.
fn consumable_fields(spec: &ResourceSliceSpec) -> (bool, bool) {
    let devices = || spec.devices.iter().flatten();
    (
        devices().any(|d| d.allow_multiple_allocations == Some(true)),
        devices().any(|d| {
            d.capacity
                .iter()
                .flatten()
                .any(|(_, c)| c.request_policy.is_some())
        }),
    )
}

/// Watches this node's slices and forwards each event's resourceVersion ("" for a deletion, so
/// it is never mistaken for our own write), and says in `healthy` whether the watch works.
/// Reconnects forever: the client paces watches that end early (see `api::client`), an error
/// event or a closed stream marks the watch unhealthy (the publisher then resyncs on a short
/// timer), and a 410 (the resource version expired) starts over from a fresh list.
async fn watch_slices(
    api: Api<ResourceSlice>,
    fields: String,
    events: mpsc::Sender<String>,
    healthy: watch::Sender<bool>,
) {
    let mut version = "0".to_string();
    let mut seen = BTreeSet::new();
    loop {
        let params = WatchParams::default().fields(&fields).timeout(290);
        let started = tokio::time::Instant::now();
        match api.watch(&params, &version).await {
            Ok(stream) => {
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    let (rv, deleted) = match event {
                        Ok(WatchEvent::Added(s)) | Ok(WatchEvent::Modified(s)) => {
                            (s.metadata.resource_version.unwrap_or_default(), false)
                        }
                        Ok(WatchEvent::Deleted(s)) => {
                            (s.metadata.resource_version.unwrap_or_default(), true)
                        }
                        Ok(WatchEvent::Bookmark(b)) => {
                            version = b.metadata.resource_version;
                            healthy.send_replace(true);
                            continue;
                        }
                        Ok(WatchEvent::Error(e)) => {
                            tracing::debug!(code = e.code, message = %e.message, "ResourceSlice watch ended with an error event");
                            if e.code == 410 {
                                version = "0".into();
                            }
                            healthy.send_replace(false);
                            break;
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "ResourceSlice watch stream failed");
                            healthy.send_replace(false);
                            break;
                        }
                    };
                    healthy.send_replace(true);
                    if !rv.is_empty() {
                        version = rv.clone();
                    }
                    if seen.insert(rv.clone()) || deleted {
                        let forwarded = if deleted { String::new() } else { rv };
                        if events.send(forwarded).await.is_err() {
                            return;
                        }
                    }
                    if seen.len() > 1024 {
                        seen.clear();
                    }
                }
                // A healthy watch lasts until its timeout; one that ends early is not.
                if started.elapsed() < knic_proto::backoff::HEALTHY_WATCH {
                    healthy.send_replace(false);
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "watching ResourceSlices failed; retrying");
                healthy.send_replace(false);
                // Unpaced clients (tests) still must not spin.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        if events.is_closed() {
            return;
        }
    }
}
