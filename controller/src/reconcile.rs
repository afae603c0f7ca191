//! The Network reconciler: each Network becomes a ResourceClaimTemplate in every namespace it
//! selects, or an `Invalid` condition and nothing at all.
//!
//! Built on kube-runtime's `Controller` rather than a hand-written watch loop, because it already
//! deduplicates triggers, never runs two reconciles of one Network at once, retries with a delay,
//! and resumes watches; the reconcile itself is level-based (it recomputes everything from the
//! API each time), so a missed or repeated trigger costs work, never correctness. Triggers:
//! * the Network itself (spec, deletion);
//! * its generated templates (through their `knic.dev/network` label), so a template deleted or
//!   edited by hand is put back;
//! * Namespaces, mapped to every Network, since a label change can select or deselect a
//!   namespace for any of them;
//! * NetworkAddress objects, mapped to their network, so free/total addresses stay current;
//! * other Networks: whenever one appears, changes its spec (generation) or starts deleting,
//!   every Network is reconciled, because validity is decided against all of them;
//! * a periodic resync ([`Config::resync`]) as the safety net for anything else.
//!
//! Conflicts between Networks are decided by age: a Network is validated only against Networks
//! created before it (ties broken by name) that are not being deleted, so creating a new Network
//! can never break one that pods already use; the newcomer is the one marked `Invalid`. Once
//! the older one is deleted, the newer one becomes valid on its own.
//!
//! Every write is a server-side apply with the single field manager [`FIELD_MANAGER`]
//! (templates) or a merge patch guarded by `metadata.resourceVersion` (finalizer), or a merge
//! patch of the status subresource, which this controller alone writes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceClaimTemplateSpec};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::network::{
    CONDITION_INVALID, CONDITION_READY, NETWORK_LABEL, Network, NetworkAddress, NetworkStatus,
    TemplateRef,
};
pub use crate::plan::{
    FINALIZER, Plan, REQUEST_NAME, address_count_held, condition, exhausted_condition, plan,
    reason, template, template_spec,
};
use crate::plan::{generated_message, is_ours, is_ready, same_status, same_template_spec};
use crate::{Error, FIELD_MANAGER, Result};
use knic_proto::network::CONDITION_EXHAUSTED;

/// Tunables of the reconciler.
#[derive(Debug, Clone)]
pub struct Config {
    /// How often every Network is reconciled even without a trigger.
    pub resync: Duration,
    /// How often NetworkAddress objects whose claim is gone are collected.
    pub gc_interval: Duration,
    /// Whether held addresses' identities are read (StatefulSets, KubeVirt VirtualMachines),
    /// so a hold ends when its identity cannot return rather than only at its grace period.
    pub identity_reads: bool,
    /// Retry delay after a failed reconcile.
    pub retry: Duration,
    /// This replica's name in Events (e.g. the pod name).
    pub instance: Option<String>,
    /// How `status.availableNodes` is kept current.
    pub availability: crate::availability::Settings,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            resync: Duration::from_secs(300),
            gc_interval: Duration::from_secs(60),
            identity_reads: true,
            retry: Duration::from_secs(5),
            instance: None,
            availability: crate::availability::Settings::default(),
        }
    }
}

/// Shared state of all reconciles.
struct Context {
    client: Client,
    recorder: Recorder,
    config: Config,
}

/// Runs the reconciler and the NetworkAddress collector until `shutdown` completes.
pub async fn run(
    client: Client,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let networks: Api<Network> = Api::all(client.clone());
    let templates: Api<ResourceClaimTemplate> = Api::all(client.clone());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let addresses: Api<NetworkAddress> = Api::all(client.clone());
    let controller = Controller::new(networks.clone(), watcher::Config::default());
    let store = controller.store();
    let (graceful, forceful) = shutdown_triggers(shutdown, store.clone());
    let everyone = {
        let store = store.clone();
        move || {
            store
                .state()
                .iter()
                .map(|n| ObjectRef::from_obj(n.as_ref()))
                .collect::<Vec<_>>()
        }
    };
    let on_namespace = everyone.clone();
    // The last (generation, deleting) seen per Network: only a change of either (or a new
    // Network) can change another Network's validity, and status writes change neither, so they
    // do not fan out.
    let seen: Mutex<HashMap<String, (Option<i64>, bool)>> = Mutex::default();
    let on_network = move |n: Network| {
        let key = (
            n.metadata.generation,
            n.metadata.deletion_timestamp.is_some(),
        );
        let name = n.name_any();
        let Ok(mut seen) = seen.lock() else {
            return everyone();
        };
        let gone = key.1 && n.finalizers().is_empty();
        let changed = if gone {
            seen.remove(&name).is_none_or(|old| old != key)
        } else {
            seen.insert(name, key) != Some(key)
        };
        if changed { everyone() } else { Vec::new() }
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: config.instance.clone(),
        },
    );
    let context = Arc::new(Context {
        client: client.clone(),
        recorder,
        config: config.clone(),
    });
    let (stop_availability, availability_stopped) = tokio::sync::oneshot::channel::<()>();
    let availability = tokio::spawn(crate::availability::run(
        client.clone(),
        config.availability.clone(),
        async {
            let _ = availability_stopped.await;
        },
    ));
    let (stop_gc, mut gc_stopped) = tokio::sync::oneshot::channel::<()>();
    let gc = {
        let client = client.clone();
        let interval = config.gc_interval;
        let identity_reads = config.identity_reads;
        tokio::spawn(async move {
            loop {
                // A stop does not wait for a collection round against a slow apiserver: each
                // deletion is complete on its own and the next replica's round redoes the rest.
                let collected = tokio::select! {
                    _ = &mut gc_stopped => return,
                    collected = crate::gc::collect_addresses(&client, identity_reads) => collected,
                };
                match collected {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(collected = n, "released addresses of deleted claims"),
                    Err(e) => tracing::warn!(error = %e, "collecting NetworkAddress objects"),
                }
                tokio::select! {
                    _ = &mut gc_stopped => return,
                    () = tokio::time::sleep(interval) => {}
                }
            }
        })
    };
    controller
        // Mapped by label, not `owns`: kube-runtime gives an owner found through a namespaced
        // child the child's namespace, which for a cluster-scoped Network is another key than
        // the Network's own, and would let two reconciles of one Network run at once.
        .watches(
            templates,
            watcher::Config::default().labels(NETWORK_LABEL),
            |t: ResourceClaimTemplate| {
                t.labels()
                    .get(NETWORK_LABEL)
                    .map(|network| ObjectRef::new(network))
            },
        )
        .watches(namespaces, watcher::Config::default(), move |_| {
            on_namespace()
        })
        .watches(networks, watcher::Config::default(), on_network)
        .watches(
            addresses,
            watcher::Config::default(),
            |a: NetworkAddress| Some(ObjectRef::new(&a.spec.network)),
        )
        .graceful_shutdown_on(graceful)
        .run(reconcile, error_policy, context)
        .take_until(forceful)
        .for_each(|result| async move {
            match result {
                Ok((network, _)) => tracing::debug!(network = %network.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile failed"),
            }
        })
        .await;
    let _ = stop_gc.send(());
    let _ = stop_availability.send(());
    let _ = gc.await;
    let _ = availability.await;
}

/// Splits one stop request into kube-runtime's two: graceful (running reconciles finish) and,
/// only when the Network cache has not filled yet, immediate. kube-runtime holds its runner
/// until that cache is ready, but a graceful stop also ends the watch that fills it, so a stop
/// in the first moments after start (a replica told to stop right after winning the lease)
/// would otherwise wait forever; before the cache is ready no reconcile has started, so
/// nothing is cut short.
fn shutdown_triggers(
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    store: kube::runtime::reflector::Store<Network>,
) -> (
    impl Future<Output = ()> + Send + Sync + 'static,
    impl Future<Output = ()> + Send + Sync + 'static,
) {
    use futures::FutureExt;
    let shutdown = shutdown.boxed().shared();
    let forceful = {
        let shutdown = shutdown.clone();
        async move {
            shutdown.await;
            if store.wait_until_ready().now_or_never().is_none() {
                tracing::debug!("stop before the Network cache was ready: nothing is running");
                return;
            }
            std::future::pending::<()>().await
        }
    };
    (shutdown, forceful)
}

fn error_policy(network: Arc<Network>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(network = %network.name_any(), error = %error, "reconcile failed; retrying");
    Action::requeue(ctx.config.retry)
}

async fn reconcile(network: Arc<Network>, ctx: Arc<Context>) -> Result<Action> {
    let started = std::time::Instant::now();
    let outcome = reconcile_network(network, ctx).await;
    let m = crate::metrics::metrics();
    m.reconciles
        .inc([if outcome.is_ok() { "success" } else { "error" }]);
    m.reconcile_duration.observe_since([], started);
    outcome
}

async fn reconcile_network(network: Arc<Network>, ctx: Arc<Context>) -> Result<Action> {
    let name = network.name_any();
    let networks: Api<Network> = Api::all(ctx.client.clone());
    let has_finalizer = network.finalizers().iter().any(|f| f == FINALIZER);
    if network.metadata.deletion_timestamp.is_some() {
        // Re-read: triggers queued while the last round removed the finalizer still carry the
        // cached object, and a cleanup of an object already gone must not be reported again.
        let fresh = networks.get_opt(&name).await?;
        if let Some(fresh) = fresh.filter(|n| n.finalizers().iter().any(|f| f == FINALIZER)) {
            // No count in the note: an earlier attempt that failed at the finalizer may already
            // have removed some, and the Event reports the outcome, not this attempt.
            delete_templates(&ctx.client, &name, &BTreeSet::new()).await?;
            crate::nad::delete_all(&ctx.client, &name).await?;
            if set_finalizer(&networks, &fresh, false).await? {
                let note = "removed every ResourceClaimTemplate generated for it".to_owned();
                publish(&ctx, &network, EventType::Normal, reason::CLEANED_UP, note).await;
            }
        }
        crate::metrics::metrics().network_gone(&name);
        return Ok(Action::await_change());
    }
    if !has_finalizer {
        set_finalizer(&networks, &network, true).await?;
    }

    let all = networks.list(&ListParams::default()).await?.items;
    let previous = network.status.clone().unwrap_or_default();
    let generation = network.metadata.generation;
    let mut status = NetworkStatus {
        observed_generation: generation,
        devices_summary: Some(network.spec.devices_summary()),
        available_nodes: previous.available_nodes,
        ..NetworkStatus::default()
    };
    let mut invalid = match plan(&network, &all) {
        Plan::Invalid(message) => Some(message),
        Plan::Generate(spec) => match generate(&ctx.client, &network, *spec).await? {
            Generated::Applied {
                templates,
                foreign,
                selected,
            } => {
                status.templates = templates;
                let nads = crate::nad::sync(&ctx.client, &network, &selected).await?;
                let (why, message) = if !foreign.is_empty() {
                    (reason::TEMPLATE_CONFLICT, foreign.join("; "))
                } else {
                    match nads {
                        crate::nad::Outcome::CrdMissing => (
                            crate::nad::REASON_CRD_MISSING,
                            crate::nad::crd_missing_message(),
                        ),
                        crate::nad::Outcome::Synced { foreign, .. } if !foreign.is_empty() => {
                            (crate::nad::REASON_CONFLICT, foreign.join("; "))
                        }
                        crate::nad::Outcome::Synced { nads, .. } => {
                            status.network_attachment_definitions = nads;
                            (
                                reason::GENERATED,
                                generated_message(
                                    &status.templates,
                                    &status.network_attachment_definitions,
                                ),
                            )
                        }
                        crate::nad::Outcome::Off => {
                            (reason::GENERATED, generated_message(&status.templates, &[]))
                        }
                    }
                };
                let ready = why == reason::GENERATED;
                status.conditions = vec![
                    condition(
                        CONDITION_READY,
                        ready,
                        why,
                        &message,
                        generation,
                        &previous.conditions,
                    ),
                    condition(
                        CONDITION_INVALID,
                        false,
                        reason::VALID,
                        "",
                        generation,
                        &previous.conditions,
                    ),
                ];
                None
            }
            Generated::Refused(message) => Some(message),
        },
    };
    if let Some(message) = invalid.take() {
        delete_templates(&ctx.client, &name, &BTreeSet::new()).await?;
        crate::nad::delete_all(&ctx.client, &name).await?;
        status.conditions = vec![
            condition(
                CONDITION_READY,
                false,
                reason::INVALID,
                &message,
                generation,
                &previous.conditions,
            ),
            condition(
                CONDITION_INVALID,
                true,
                reason::INVALID,
                &message,
                generation,
                &previous.conditions,
            ),
        ];
        let was = previous
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_INVALID);
        if !was.is_some_and(|c| c.status == "True" && c.message == message) {
            publish(&ctx, &network, EventType::Warning, reason::INVALID, message).await;
        }
    } else {
        let addresses: Api<NetworkAddress> = Api::all(ctx.client.clone());
        let live = addresses
            .list(&ListParams::default().labels(&format!("{NETWORK_LABEL}={name}")))
            .await?
            .items;
        let held: Vec<&str> = live
            .iter()
            .filter(|a| a.spec.network == name && crate::gc::is_held(a))
            .map(|a| a.spec.address.as_str())
            .collect();
        let live: Vec<&str> = live
            .iter()
            .filter(|a| a.spec.network == name)
            .map(|a| a.spec.address.as_str())
            .collect();
        status.addresses = address_count_held(&network.spec, &live, &held);
        status.address_summary = status.addresses.map(|a| a.summary());
        if let Some(exhausted) = exhausted_condition(&network.spec, &live, generation, &previous) {
            let was = previous
                .conditions
                .iter()
                .find(|c| c.type_ == CONDITION_EXHAUSTED)
                .map(|c| c.status == "True");
            let now = exhausted.status == "True";
            if was.unwrap_or(false) != now {
                let (type_, why) = if now {
                    (EventType::Warning, reason::EXHAUSTED)
                } else {
                    (EventType::Normal, reason::ADDRESSES_FREE)
                };
                publish(&ctx, &network, type_, why, exhausted.message.clone()).await;
            }
            status.conditions.push(exhausted);
        }
        if previous.templates != status.templates
            || previous.network_attachment_definitions != status.network_attachment_definitions
            || !is_ready(&previous)
        {
            let message =
                generated_message(&status.templates, &status.network_attachment_definitions);
            publish(
                &ctx,
                &network,
                EventType::Normal,
                reason::GENERATED,
                message,
            )
            .await;
        }
    }
    if !same_status(&previous, &status) {
        crate::status::write_status(&networks, &name, &status).await?;
    }
    crate::metrics::metrics().network_status(&name, &status);
    Ok(Action::requeue(ctx.config.resync))
}

/// What applying the templates came to.
enum Generated {
    /// Templates now present (sorted), and why some namespaces were skipped.
    Applied {
        templates: Vec<TemplateRef>,
        foreign: Vec<String>,
        /// The namespaces the Network selects (NADs go to the same ones).
        selected: BTreeSet<String>,
    },
    /// The apiserver refused the template (e.g. a selector that does not compile as CEL).
    Refused(String),
}

/// Applies the template in every selected namespace that lacks it or has a drifted copy, and
/// deletes it from namespaces no longer selected.
async fn generate(
    client: &Client,
    network: &Network,
    spec: ResourceClaimTemplateSpec,
) -> Result<Generated> {
    let name = network.name_any();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let selected: BTreeSet<String> = namespaces
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|ns| ns.metadata.deletion_timestamp.is_none())
        .filter(|ns| {
            network.spec.namespaces.selects(
                &ns.name_any(),
                ns.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
            )
        })
        .map(|ns| ns.name_any())
        .collect();
    let all: Api<ResourceClaimTemplate> = Api::all(client.clone());
    // Every template with the network's name, generated or not, in one list.
    let same_name: HashMap<String, ResourceClaimTemplate> = all
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await?
        .items
        .into_iter()
        .map(|t| (t.namespace().unwrap_or_default(), t))
        .collect();
    let mut templates = Vec::new();
    let mut foreign = Vec::new();
    for namespace in &selected {
        let desired = template(network, namespace, spec.clone());
        match same_name.get(namespace) {
            Some(existing) if !is_ours(existing, &name) => {
                foreign.push(format!(
                    "namespace {namespace}: a ResourceClaimTemplate named {name:?} that knic did not generate already exists; it is left alone"
                ));
                continue;
            }
            Some(existing)
                if same_template_spec(&existing.spec, &desired.spec)
                    && existing.metadata.owner_references == desired.metadata.owner_references => {}
            current => {
                let api: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), namespace);
                if let Some(existing) =
                    current.filter(|e| !same_template_spec(&e.spec, &desired.spec))
                {
                    // A template's spec is immutable: replace it. Claims already made from the
                    // old one keep it; pods created in the gap get their claim once it is back
                    // (the resourceclaim controller retries).
                    let uid = existing.metadata.uid.clone();
                    let precondition = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid,
                            resource_version: None,
                        }),
                        ..DeleteParams::default()
                    };
                    match api.delete(&name, &precondition).await {
                        Ok(_) => {}
                        // Gone already, or replaced meanwhile: the apply below settles it.
                        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                let params = PatchParams::apply(FIELD_MANAGER).force();
                match api.patch(&name, &params, &Patch::Apply(&desired)).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 422 => {
                        return Ok(Generated::Refused(format!(
                            "spec.devices: the apiserver refused the generated ResourceClaimTemplate in namespace {namespace}: {}",
                            s.message
                        )));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        templates.push(TemplateRef {
            namespace: namespace.clone(),
            name: name.clone(),
        });
    }
    delete_templates(client, &name, &selected).await?;
    Ok(Generated::Applied {
        templates,
        foreign,
        selected,
    })
}

/// Deletes the network's templates outside `keep` (namespaces); returns how many.
async fn delete_templates(
    client: &Client,
    network: &str,
    keep: &BTreeSet<String>,
) -> Result<usize> {
    let all: Api<ResourceClaimTemplate> = Api::all(client.clone());
    let ours = all
        .list(&ListParams::default().labels(&format!("{NETWORK_LABEL}={network}")))
        .await?
        .items;
    let mut removed = 0;
    for t in ours {
        let namespace = t.namespace().unwrap_or_default();
        if keep.contains(&namespace) {
            continue;
        }
        let api: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), &namespace);
        let params = DeleteParams {
            preconditions: t.uid().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&t.name_any(), &params).await {
            Ok(_) => removed += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(removed)
}

/// Adds or removes [`FINALIZER`], guarded by the resourceVersion the decision was made on, so
/// another writer's finalizer is never dropped by a stale list. `false` when the Network was
/// already gone (removing the finalizer then has nothing left to do).
async fn set_finalizer(api: &Api<Network>, network: &Network, present: bool) -> Result<bool> {
    let mut finalizers: Vec<String> = network
        .finalizers()
        .iter()
        .filter(|f| f.as_str() != FINALIZER)
        .cloned()
        .collect();
    if present {
        finalizers.push(FINALIZER.to_owned());
    }
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": network.resource_version(),
    }});
    match api
        .patch(
            &network.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(true),
        // Already gone: the finalizer was the last thing keeping it.
        Err(kube::Error::Api(s)) if s.code == 404 && !present => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Publishes an Event on the Network; best effort, since a lost Event must not fail or repeat
/// a reconcile whose outcome the status already records.
async fn publish(ctx: &Context, network: &Network, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note.chars().take(1024).collect()),
        action: "Reconcile".to_owned(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &network.object_ref(&())).await {
        tracing::debug!(error = %e, "publishing an Event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An apiserver that takes every request and never answers, so no cache ever fills.
    fn silent_client() -> Client {
        let service = tower::service_fn(|_: http::Request<kube::client::Body>| {
            futures::future::pending::<
                std::result::Result<http::Response<kube::client::Body>, std::convert::Infallible>,
            >()
        });
        Client::new(service, "default")
    }

    /// A replica told to stop right after it starts (e.g. just after winning the lease) must
    /// exit, not wait for caches that a stopped watch will never fill.
    #[tokio::test]
    async fn a_stop_before_the_caches_fill_ends_the_run() {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(run(silent_client(), Config::default(), async {
            let _ = stopped.await;
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.send(()).expect("the run is still waiting");
        tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .expect("the run ended within 5 s of the stop")
            .expect("the run did not panic");
    }
}
