//! Held addresses (`spec.stableAddresses.gracePeriodSeconds`): the names, identity parsing and
//! texts the driver (which holds and takes over) and the controller (which releases holds)
//! must agree on.
//!
//! A hold is an ordinary `NetworkAddress` whose claim is gone, marked in its metadata only
//! (`knic.dev/held=true`, `knic.dev/held-since=RFC3339`): the spec stays immutable, so the
//! create-by-unique-name rule that makes an address unique is untouched. Only a claim of the
//! same identity may replace the object, by deleting it (uid precondition) and creating it
//! again for itself; a racing allocator loses at the create, as for any address.

use super::{StableAddresses, StableBy};

/// Label on a held allocation: its claim is gone, the address waits for its identity.
pub const HELD_LABEL: &str = "knic.dev/held";
/// Annotation with the RFC 3339 time the hold began; the grace period runs from it.
pub const HELD_SINCE_ANNOTATION: &str = "knic.dev/held-since";
/// The longest grace period: a year, so a forgotten identity cannot pin an address forever.
pub const MAX_GRACE_PERIOD_SECONDS: u64 = 365 * 24 * 3600;

const LAUNCHER_PREFIX: &str = "virt-launcher-";
/// KubeVirt names launcher pods with generateName, which appends 5 characters.
const SUFFIX_LEN: usize = 5;
/// The longest generateName prefix Kubernetes keeps (63 minus the suffix).
const MAX_GENERATED_NAME: usize = 58;

impl StableAddresses {
    /// The grace period in seconds (0: no hold).
    pub fn grace(&self) -> u64 {
        self.grace_period_seconds.unwrap_or(0)
    }
}

/// The VirtualMachine's name in a KubeVirt launcher pod's name `virt-launcher-<vm>-<xxxxx>`,
/// or `None` for any other pod. Kubernetes truncates a generateName prefix to 58 characters,
/// so VMs whose names exceed 44 characters and share their first 44 share an identity (they
/// then get different addresses, never one: uniqueness does not depend on the identity).
pub fn kubevirt_vm(pod_name: &str) -> Option<&str> {
    let rest = pod_name.strip_prefix(LAUNCHER_PREFIX)?;
    let random = |suffix: &str| {
        suffix.len() == SUFFIX_LEN
            && suffix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    // A name of the full 63 characters had its prefix cut to 58 (VM names of 44 characters and
    // more): the dash before the random suffix went with the cut.
    if pod_name.len() == MAX_GENERATED_NAME + SUFFIX_LEN
        && rest.is_char_boundary(rest.len() - SUFFIX_LEN)
    {
        let (base, suffix) = rest.split_at(rest.len() - SUFFIX_LEN);
        let vm = base.trim_end_matches('-');
        return (random(suffix) && !vm.is_empty()).then_some(vm);
    }
    let (vm, suffix) = rest.rsplit_once('-')?;
    (random(suffix) && !vm.is_empty()).then_some(vm)
}

/// The prepare refusal for a pod that is not a launcher on a `by: kubevirtVM` Network.
pub fn not_a_launcher(network: &str, pod: &str) -> String {
    format!(
        "Network {network:?} has spec.stableAddresses.by: kubevirtVM, but pod {pod:?} is not a \
         KubeVirt launcher pod (virt-launcher-<vm>-<suffix>)"
    )
}

/// An identity `namespace/key[#N]` split into namespace and key (the interface suffix
/// dropped), `None` when it has no namespace.
pub fn split_identity(identity: &str) -> Option<(&str, &str)> {
    let (namespace, rest) = identity.split_once('/')?;
    let key = rest.split_once('#').map_or(rest, |(k, _)| k);
    (!namespace.is_empty() && !key.is_empty()).then_some((namespace, key))
}

/// A StatefulSet pod name `<set>-<ordinal>` split into the set's name and the ordinal.
pub fn statefulset_ordinal(pod: &str) -> Option<(&str, u32)> {
    let (set, ordinal) = pod.rsplit_once('-')?;
    if set.is_empty() || ordinal.is_empty() || (ordinal.len() > 1 && ordinal.starts_with('0')) {
        return None;
    }
    Some((set, ordinal.parse().ok()?))
}

/// Whether `by` names an identity that reads can show gone for good: a pod name may be a
/// StatefulSet's, a VM name a VirtualMachine's; a label value has no owner to read.
pub fn identity_is_checkable(by: StableBy) -> bool {
    matches!(by, StableBy::PodName | StableBy::KubevirtVm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launcher_names_give_the_vm() {
        assert_eq!(kubevirt_vm("virt-launcher-db-7x2kq"), Some("db"));
        assert_eq!(kubevirt_vm("virt-launcher-my-vm-1-abcde"), Some("my-vm-1"));
        // As Kubernetes names them: the prefix `virt-launcher-<vm>-` cut to 58 characters, then
        // 5 random ones. A 43-character VM name just fits with its dash.
        let generated = |vm: &str| {
            let mut base = format!("virt-launcher-{vm}-");
            base.truncate(58);
            format!("{base}k2p9z")
        };
        let vm43 = "a".repeat(43);
        assert_eq!(generated(&vm43).len(), 63);
        assert_eq!(kubevirt_vm(&generated(&vm43)), Some(vm43.as_str()));
        // 44 characters: the dash is cut, the whole name kept.
        let vm44 = "b".repeat(44);
        assert_eq!(kubevirt_vm(&generated(&vm44)), Some(vm44.as_str()));
        // Longer: the first 44 are the identity (shared by VMs that share them).
        let long = format!("{}-tail-of-a-long-name", "c".repeat(40));
        assert_eq!(kubevirt_vm(&generated(&long)), Some(&long[..44]));
        // A VM name ending at the cut with a dash of its own loses it too.
        let dashed = format!("{}-x", "d".repeat(43));
        assert_eq!(
            kubevirt_vm(&generated(&dashed)),
            Some("d".repeat(43).as_str())
        );
    }

    #[test]
    fn other_pods_are_not_launchers() {
        for pod in [
            "web-0",
            "virt-launcher-db",        // no suffix
            "virt-launcher--abcde",    // no VM name
            "virt-launcher-db-abcd",   // suffix too short
            "virt-launcher-db-abcdef", // suffix too long
            "virt-launcher-db-ABCDE",  // generateName never makes capitals
            "virt-handler-db-abcde",   // not the launcher
            "xvirt-launcher-db-abcde", // prefix must start the name
        ] {
            assert_eq!(kubevirt_vm(pod), None, "{pod}");
        }
    }

    #[test]
    fn refusal_text_names_network_pod_and_form() {
        assert_eq!(
            not_a_launcher("blue", "web-0"),
            "Network \"blue\" has spec.stableAddresses.by: kubevirtVM, but pod \"web-0\" is not \
             a KubeVirt launcher pod (virt-launcher-<vm>-<suffix>)"
        );
    }

    #[test]
    fn identities_and_ordinals_split() {
        assert_eq!(split_identity("team-a/db-0"), Some(("team-a", "db-0")));
        assert_eq!(split_identity("team-a/db-0#2"), Some(("team-a", "db-0")));
        assert_eq!(split_identity("db-0"), None);
        assert_eq!(split_identity("/db-0"), None);
        assert_eq!(statefulset_ordinal("db-12"), Some(("db", 12)));
        assert_eq!(statefulset_ordinal("my-db-0"), Some(("my-db", 0)));
        assert_eq!(statefulset_ordinal("db-01"), None);
        assert_eq!(statefulset_ordinal("db-x"), None);
        assert_eq!(statefulset_ordinal("db"), None);
        assert_eq!(statefulset_ordinal("-3"), None);
    }

    #[test]
    fn kubevirt_identity_is_the_vm() {
        let stable = StableAddresses {
            by: StableBy::KubevirtVm,
            label: None,
            grace_period_seconds: Some(60),
        };
        let none = Default::default();
        assert_eq!(
            stable.identity("ns", "virt-launcher-db-7x2kq", &none, 0),
            Some("ns/db".to_owned())
        );
        assert_eq!(
            stable.identity("ns", "virt-launcher-db-7x2kq", &none, 1),
            Some("ns/db#1".to_owned())
        );
        assert_eq!(stable.identity("ns", "web-0", &none, 0), None);
        assert_eq!(stable.grace(), 60);
        let yaml: StableAddresses =
            serde_json::from_value(serde_json::json!({"by": "kubevirtVM"})).unwrap();
        assert_eq!(yaml.by, StableBy::KubevirtVm);
        assert_eq!(yaml.grace(), 0);
    }
}
