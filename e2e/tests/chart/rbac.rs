//! The chart's RBAC against the binaries' API calls: every (apiGroup, resource, verb[, name])
//! the driver and the controller call is granted to their ServiceAccount through a binding, in
//! the right scope; and nothing is granted beyond the list below (no wildcards), so the roles
//! stay minimal. The list says where each permission is used; keep it in step with the code.
//! The objects are Helm's render of the chart (super::defaults).

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};

use knic_e2e::helm::Rendered;

use super::{RELEASE_NAMESPACE, defaults};

/// The Lease the controller elects its leader with (controller/src/main.rs).
const LEASE: &str = "knic-controller";

/// Why a permission is in the list: where the code calls it. There is no "kept just in case":
/// a grant no code uses is one a compromised node could use instead (issue 11).
#[derive(Debug, Clone, Copy)]
enum Why {
    /// Called by the code today, at the place named.
    Used(&'static str),
}

/// One permission a ServiceAccount needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Need {
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    /// The object name the request carries when the rule is limited by `resourceNames`;
    /// `None` for requests RBAC sees without a name (create, list, watch) or that any name
    /// may be used with.
    name: Option<&'static str>,
    /// `Some(namespace)`: needed in that namespace only (a Role may grant it); `None`:
    /// cluster-scoped or across all namespaces (only a ClusterRoleBinding grants it).
    namespace: Option<&'static str>,
    why: Why,
}

const fn cluster(
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    why: Why,
) -> Need {
    Need {
        group,
        resource,
        verbs,
        name: None,
        namespace: None,
        why,
    }
}

/// What `knic-driver run` calls.
pub(crate) const DRIVER: &[Need] = &[
    cluster(
        "resource.k8s.io",
        "resourceclaims",
        &["get"],
        Why::Used(
            "driver/src/api/claims.rs KubeClaims::get: prepare reads the claim; \
             driver/src/api/addresses.rs claim_state: a returning identity's former claim",
        ),
    ),
    cluster(
        "resource.k8s.io",
        "resourceclaims/status",
        &["patch"],
        Why::Used(
            "driver/src/api/status.rs KubeStatus::write: server-side apply of status.devices",
        ),
    ),
    Need {
        name: Some("knic.dev"),
        ..cluster(
            "resource.k8s.io",
            "resourceclaims/driver",
            &["associated-node:patch"],
            Why::Used(
                "driver/src/api/status.rs KubeStatus::write: the same apply, authorized on 1.36+ \
                 through this synthetic subresource (shared/spec §3.6)",
            ),
        )
    },
    cluster(
        "resource.k8s.io",
        "resourceslices",
        &["list", "watch", "create", "update", "delete"],
        Why::Used(
            "driver/src/api/slices.rs: list by node and driver, watch_slices, create, \
             replace, delete",
        ),
    ),
    cluster(
        "",
        "nodes",
        &["get"],
        Why::Used("driver/src/api/slices.rs: the Node owns the slices (its uid)"),
    ),
    cluster(
        "knic.dev",
        "networks",
        &["get"],
        Why::Used(
            "driver/src/api/addresses.rs KubeAddressBook::network: the Network of `ipam.network`",
        ),
    ),
    cluster(
        "knic.dev",
        "networks",
        &["list", "watch"],
        Why::Used("driver/src/api/networks.rs: a reflector over Networks (exhaustion status)"),
    ),
    cluster(
        "knic.dev",
        "networkaddresses",
        &["get", "create", "list", "delete", "patch"],
        Why::Used(
            "driver/src/api/addresses.rs KubeAddressBook::{create, list, delete}, get after \
             AlreadyExists or a delete conflict, hold (merge patch of metadata)",
        ),
    ),
    cluster(
        "knic.dev",
        "networkaddresses",
        &["list", "watch"],
        Why::Used(
            "driver/src/api/overlay.rs: a reflector over NetworkAddresses labelled \
             knic.dev/overlay=true, whose overlay facts are the forwarding entries (issue 26)",
        ),
    ),
    cluster(
        "",
        "namespaces",
        &["get"],
        Why::Used(
            "driver/src/api/addresses.rs KubeAddressBook::namespace_labels: a Network offered by \
             namespace selector",
        ),
    ),
    cluster(
        "events.k8s.io",
        "events",
        &["create"],
        Why::Used(
            "driver/src/api/events.rs KubeEvents: Events on the claim and its pods for prepare \
             and attach failures",
        ),
    ),
    cluster(
        "resource.k8s.io",
        "deviceclasses",
        &["list"],
        Why::Used(
            "driver/src/api/catalog.rs KubeCatalog::classes: the selectors of a Network's class \
             for the KNI socket and the NodeNetworks object",
        ),
    ),
    cluster(
        "knic.dev",
        "nodenetworks",
        &["create", "patch"],
        Why::Used(
            "driver/src/api/nodenetworks.rs write: server-side apply of this node's object (a \
             create when it does not exist yet: the real apiserver refused it with patch alone)",
        ),
    ),
    cluster(
        "knic.dev",
        "nodenetworks/status",
        &["patch"],
        Why::Used("driver/src/api/nodenetworks.rs write: server-side apply of its status"),
    ),
];

/// What `knic-driver run --pod-label-reads=true` calls besides [`DRIVER`]; the chart grants it
/// only with `driver.podLabelReads: true`. Without the flag the driver makes no pod request at
/// all (a `by: label` claim is refused before any), so the default grants no pod.
pub(crate) const DRIVER_POD_LABEL_READS: &[Need] = &[cluster(
    "",
    "pods",
    &["get"],
    Why::Used(
        "driver/src/api/addresses.rs KubeAddressBook::pod_labels, only with --pod-label-reads: \
         stableAddresses by label",
    ),
)];

/// What `knic-controller` calls.
pub(crate) const CONTROLLER: &[Need] = &[
    cluster(
        "knic.dev",
        "networks",
        &["list", "watch"],
        Why::Used("controller/src/reconcile.rs run: Controller::new and .watches(networks)"),
    ),
    cluster(
        "knic.dev",
        "networks",
        &["get", "list"],
        Why::Used(
            "controller/src/reconcile.rs reconcile: re-read of a deleting Network, every \
             Network for cross-validation",
        ),
    ),
    cluster(
        "knic.dev",
        "networks",
        &["patch"],
        Why::Used(
            "controller/src/reconcile.rs set_finalizer: merge patch guarded by resourceVersion \
             (templates' owner references set no blockOwnerDeletion, so no networks/finalizers)",
        ),
    ),
    cluster(
        "knic.dev",
        "networks/status",
        &["patch"],
        Why::Used("controller/src/reconcile.rs write_status: merge patch"),
    ),
    cluster(
        "knic.dev",
        "networkaddresses",
        &["list", "watch", "delete", "patch"],
        Why::Used(
            "controller/src/reconcile.rs: .watches(addresses), the address count; \
             controller/src/gc.rs collect_addresses (list, delete with uid precondition, \
             merge patch marking held)",
        ),
    ),
    cluster(
        "resource.k8s.io",
        "resourceclaimtemplates",
        &["list", "watch"],
        Why::Used(
            "controller/src/reconcile.rs: .watches(templates), generate (list by name), \
             delete_templates (list by label)",
        ),
    ),
    cluster(
        "resource.k8s.io",
        "resourceclaimtemplates",
        &["create", "patch"],
        Why::Used(
            "controller/src/reconcile.rs generate: server-side apply is a patch, authorized as \
             a create when the template does not exist yet",
        ),
    ),
    cluster(
        "resource.k8s.io",
        "resourceclaimtemplates",
        &["delete"],
        Why::Used("controller/src/reconcile.rs delete_templates"),
    ),
    cluster(
        "k8s.cni.cncf.io",
        "network-attachment-definitions",
        &["list"],
        Why::Used("controller/src/nad.rs sync (list by name), delete_all (list by label)"),
    ),
    cluster(
        "k8s.cni.cncf.io",
        "network-attachment-definitions",
        &["create", "patch"],
        Why::Used(
            "controller/src/nad.rs sync: server-side apply is a patch, authorized as a create \
             when the NAD does not exist yet",
        ),
    ),
    cluster(
        "k8s.cni.cncf.io",
        "network-attachment-definitions",
        &["delete"],
        Why::Used("controller/src/nad.rs delete (uid precondition)"),
    ),
    cluster(
        "resource.k8s.io",
        "resourceclaims",
        &["get"],
        Why::Used("controller/src/gc.rs collect_addresses: does the claim still exist"),
    ),
    cluster(
        "resource.k8s.io",
        "resourceclaims",
        &["list", "watch"],
        Why::Used("controller/src/availability.rs run: a reflector over claims (devices taken)"),
    ),
    cluster(
        "resource.k8s.io",
        "resourceslices",
        &["list", "watch"],
        Why::Used("controller/src/availability.rs run: a reflector over slices (devices offered)"),
    ),
    cluster(
        "resource.k8s.io",
        "deviceclasses",
        &["list", "watch"],
        Why::Used("controller/src/availability.rs run: a reflector over classes (their selectors)"),
    ),
    cluster(
        "knic.dev",
        "networks",
        &["list", "watch"],
        Why::Used("controller/src/availability.rs run: a reflector over Networks"),
    ),
    cluster(
        "knic.dev",
        "networks/status",
        &["patch"],
        Why::Used("controller/src/availability.rs run: merge patch of status.availableNodes"),
    ),
    cluster(
        "",
        "namespaces",
        &["list", "watch"],
        Why::Used("controller/src/reconcile.rs: .watches(namespaces), generate (selection)"),
    ),
    cluster(
        "",
        "namespaces",
        &["get"],
        Why::Used("controller/src/gc.rs collect_addresses: a held address's namespace exists"),
    ),
    cluster(
        "apps",
        "statefulsets",
        &["get"],
        Why::Used(
            "controller/src/gc.rs identity_fate (controller.identityReads, default on): a held \
             pod-name identity's StatefulSet and replicas",
        ),
    ),
    cluster(
        "kubevirt.io",
        "virtualmachines",
        &["get"],
        Why::Used(
            "controller/src/gc.rs identity_fate (controller.identityReads, default on): a held \
             kubevirtVM identity's VirtualMachine",
        ),
    ),
    cluster(
        "events.k8s.io",
        "events",
        &["create", "patch"],
        Why::Used(
            "controller/src/reconcile.rs publish: kube-runtime's Recorder creates, then merge \
             patches a series (events.k8s.io/v1 only)",
        ),
    ),
    Need {
        namespace: Some(RELEASE_NAMESPACE),
        ..cluster(
            "coordination.k8s.io",
            "leases",
            &["create"],
            Why::Used("controller/src/leader.rs attempt: the first replica creates the Lease"),
        )
    },
    Need {
        namespace: Some(RELEASE_NAMESPACE),
        name: Some(LEASE),
        ..cluster(
            "coordination.k8s.io",
            "leases",
            &["get", "update"],
            Why::Used("controller/src/leader.rs attempt and release: read, then guarded update"),
        )
    },
];

/// The RBAC objects of the chart.
pub(crate) struct Rbac {
    cluster_roles: Vec<ClusterRole>,
    roles: Vec<Role>,
    cluster_bindings: Vec<ClusterRoleBinding>,
    bindings: Vec<RoleBinding>,
}

/// One thing a rule allows: group, resource, verb, name (`None`: any), namespace (`None`: all).
pub(crate) type Grant = (String, String, String, Option<String>, Option<String>);

impl Rbac {
    /// The RBAC of the chart's default render.
    pub(crate) fn load() -> anyhow::Result<Rbac> {
        Ok(Rbac::of(defaults()?))
    }

    /// The RBAC of `rendered`.
    pub(crate) fn of(rendered: &Rendered) -> Rbac {
        Rbac {
            cluster_roles: rendered.all::<ClusterRole>().into_iter().cloned().collect(),
            roles: rendered.all::<Role>().into_iter().cloned().collect(),
            cluster_bindings: rendered
                .all::<ClusterRoleBinding>()
                .into_iter()
                .cloned()
                .collect(),
            bindings: rendered.all::<RoleBinding>().into_iter().cloned().collect(),
        }
    }

    /// The rules bound to ServiceAccount `account` of the release namespace, each with the
    /// namespace it applies in (`None`: every namespace and cluster-scoped objects).
    fn rules_of(&self, account: &str) -> anyhow::Result<Vec<(PolicyRule, Option<String>)>> {
        let is_ours = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
            subjects.iter().flatten().any(|s| {
                s.kind == "ServiceAccount"
                    && s.name == account
                    && s.namespace.as_deref() == Some(RELEASE_NAMESPACE)
            })
        };
        let cluster_role = |name: &str| -> anyhow::Result<&ClusterRole> {
            self.cluster_roles
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(name))
                .with_context(|| {
                    format!("a binding refers to ClusterRole {name}, not in the chart")
                })
        };
        let mut rules = Vec::new();
        for binding in self
            .cluster_bindings
            .iter()
            .filter(|b| is_ours(&b.subjects))
        {
            ensure!(
                binding.role_ref.kind == "ClusterRole",
                "ClusterRoleBinding {:?} refers to a {}",
                binding.metadata.name,
                binding.role_ref.kind
            );
            let role = cluster_role(&binding.role_ref.name)?;
            for rule in role.rules.iter().flatten() {
                rules.push((rule.clone(), None));
            }
        }
        for binding in self.bindings.iter().filter(|b| is_ours(&b.subjects)) {
            let namespace = binding.metadata.namespace.clone().with_context(|| {
                format!("RoleBinding {:?} has no namespace", binding.metadata.name)
            })?;
            let role_rules = match binding.role_ref.kind.as_str() {
                "ClusterRole" => cluster_role(&binding.role_ref.name)?.rules.clone(),
                "Role" => self
                    .roles
                    .iter()
                    .find(|r| {
                        r.metadata.name.as_deref() == Some(binding.role_ref.name.as_str())
                            && r.metadata.namespace.as_deref() == Some(namespace.as_str())
                    })
                    .with_context(|| {
                        format!(
                            "RoleBinding {:?} refers to Role {}/{}, not in the chart",
                            binding.metadata.name, namespace, binding.role_ref.name
                        )
                    })?
                    .rules
                    .clone(),
                other => bail!(
                    "RoleBinding {:?} refers to a {other}",
                    binding.metadata.name
                ),
            };
            for rule in role_rules.into_iter().flatten() {
                rules.push((rule, Some(namespace.clone())));
            }
        }
        Ok(rules)
    }

    /// Everything granted to `account`, expanded; wildcards are refused outright.
    pub(crate) fn grants(&self, account: &str) -> anyhow::Result<Vec<Grant>> {
        let mut grants = Vec::new();
        for (rule, namespace) in self.rules_of(account)? {
            ensure!(
                rule.non_resource_urls.as_ref().is_none_or(Vec::is_empty),
                "{account}: nonResourceURLs are not needed: {rule:?}"
            );
            let names: Vec<Option<String>> = match &rule.resource_names {
                Some(names) if !names.is_empty() => names.iter().cloned().map(Some).collect(),
                _ => vec![None],
            };
            for group in rule.api_groups.iter().flatten() {
                for resource in rule.resources.iter().flatten() {
                    for verb in &rule.verbs {
                        ensure!(
                            [group, resource, verb].iter().all(|s| !s.contains('*')),
                            "{account}: wildcard in {rule:?}"
                        );
                        for name in &names {
                            grants.push((
                                group.clone(),
                                resource.clone(),
                                verb.clone(),
                                name.clone(),
                                namespace.clone(),
                            ));
                        }
                    }
                }
            }
        }
        Ok(grants)
    }
}

/// Whether `grant` allows the request `need` describes (with `verb`).
fn allows(grant: &Grant, need: &Need, verb: &str) -> bool {
    let (group, resource, granted_verb, name, namespace) = grant;
    group == need.group
        && resource == need.resource
        && granted_verb == verb
        // A rule limited to names never matches a request without one.
        && name.as_ref().is_none_or(|n| Some(n.as_str()) == need.name)
        && match (namespace, need.namespace) {
            (None, _) => true,
            (Some(granted), Some(wanted)) => granted == wanted,
            (Some(_), None) => false,
        }
}

fn describe(need: &Need, verb: &str) -> String {
    let group = if need.group.is_empty() {
        "core"
    } else {
        need.group
    };
    let mut s = format!("{verb} {group}/{}", need.resource);
    if let Some(name) = need.name {
        s.push_str(&format!(" named {name}"));
    }
    match need.namespace {
        Some(ns) => s.push_str(&format!(" in namespace {ns}")),
        None => s.push_str(" cluster-wide"),
    }
    let Why::Used(why) = need.why;
    let why = format!("used by {why}");
    format!("{s} ({why})")
}

/// Every permission in `needs` is granted to `account` by `rbac`.
pub(crate) fn covers(rbac: &Rbac, account: &str, needs: &[Need]) -> anyhow::Result<()> {
    let grants = rbac.grants(account)?;
    let missing: Vec<String> = needs
        .iter()
        .flat_map(|need| need.verbs.iter().map(move |verb| (need, verb)))
        .filter(|(need, verb)| !grants.iter().any(|g| allows(g, need, verb)))
        .map(|(need, verb)| describe(need, verb))
        .collect();
    ensure!(
        missing.is_empty(),
        "ServiceAccount {account} lacks:\n  {}",
        missing.join("\n  ")
    );
    Ok(())
}

/// Nothing is granted to `account` that `needs` does not list: each grant is exactly a listed
/// permission (same group, resource, verb, at most as wide in names and namespaces).
pub(crate) fn minimal(rbac: &Rbac, account: &str, needs: &[Need]) -> anyhow::Result<()> {
    let grants = rbac.grants(account)?;
    let extra: Vec<String> = grants
        .iter()
        .filter(|(group, resource, verb, name, namespace)| {
            !needs.iter().any(|need| {
                need.group == group
                    && need.resource == resource
                    && need.verbs.contains(&verb.as_str())
                    // A grant for any name is wider than a need for one name.
                    && (need.name.is_none() || name.as_deref() == need.name)
                    // A cluster-wide grant is wider than a need in one namespace.
                    && match (namespace, need.namespace) {
                        (None, None) => true,
                        (Some(granted), Some(wanted)) => granted == wanted,
                        (None, Some(_)) => false,
                        (Some(_), None) => false,
                    }
            })
        })
        .map(|(group, resource, verb, name, namespace)| {
            format!(
                "{verb} {}/{resource}{}{}",
                if group.is_empty() { "core" } else { group },
                name.as_ref()
                    .map(|n| format!(" named {n}"))
                    .unwrap_or_default(),
                namespace
                    .as_ref()
                    .map(|n| format!(" in namespace {n}"))
                    .unwrap_or_else(|| " cluster-wide".into())
            )
        })
        .collect();
    ensure!(
        extra.is_empty(),
        "ServiceAccount {account} is granted more than e2e/tests/chart.rs lists (add the use \
         to the list, or drop the grant):\n  {}",
        extra.join("\n  ")
    );
    Ok(())
}
