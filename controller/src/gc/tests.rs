//! Every collection rule, held or not, at the edges of the grace period.

use super::*;
use k8s_openapi::api::apps::v1::StatefulSetSpec;

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// An allocation held since 12:00 for a grace of an hour, namespace present, identity unknown.
fn held() -> Facts {
    Facts {
        claim_exists: false,
        held: true,
        held_since: Some(at("2026-01-01T12:00:00Z")),
        has_identity: true,
        grace: 3600,
        namespace_exists: true,
        identity: IdentityFate::Unknown,
    }
}

#[test]
fn an_allocation_with_a_live_claim_is_kept() {
    let facts = Facts {
        claim_exists: true,
        held: false,
        ..held()
    };
    assert_eq!(decide(&facts, at("2027-01-01T00:00:00Z")), Decision::Keep);
}

#[test]
fn a_gone_claim_without_grace_or_identity_is_released_at_once() {
    let now = at("2026-01-01T12:00:00Z");
    let no_grace = Facts {
        held: false,
        grace: 0,
        ..held()
    };
    assert_eq!(decide(&no_grace, now), Decision::Delete("claim gone"));
    let no_identity = Facts {
        held: false,
        has_identity: false,
        ..held()
    };
    assert_eq!(decide(&no_identity, now), Decision::Delete("claim gone"));
}

#[test]
fn a_claim_gone_without_unprepare_is_marked_held() {
    let facts = Facts {
        held: false,
        held_since: None,
        ..held()
    };
    assert_eq!(
        decide(&facts, at("2026-01-01T12:00:00Z")),
        Decision::MarkHeld
    );
    let namespace_gone = Facts {
        namespace_exists: false,
        ..facts
    };
    assert_eq!(
        decide(&namespace_gone, at("2026-01-01T12:00:00Z")),
        Decision::Delete("claim gone and its namespace too")
    );
}

#[test]
fn a_hold_lasts_exactly_the_grace_period() {
    assert_eq!(decide(&held(), at("2026-01-01T12:59:59Z")), Decision::Keep);
    assert_eq!(
        decide(&held(), at("2026-01-01T13:00:00Z")),
        Decision::Delete("held, and the grace period passed")
    );
    // The old claim lingering (its unprepare ran, the garbage collector is slow) changes
    // nothing: a held allocation is not in use.
    let lingering = Facts {
        claim_exists: true,
        ..held()
    };
    assert_eq!(
        decide(&lingering, at("2026-01-01T13:00:01Z")),
        Decision::Delete("held, and the grace period passed")
    );
    assert_eq!(
        decide(&lingering, at("2026-01-01T12:30:00Z")),
        Decision::Keep
    );
}

#[test]
fn a_hold_ends_early_when_the_identity_cannot_return() {
    let now = at("2026-01-01T12:00:05Z");
    let namespace_gone = Facts {
        namespace_exists: false,
        ..held()
    };
    assert_eq!(
        decide(&namespace_gone, now),
        Decision::Delete("held, and the identity's namespace is gone")
    );
    let gone = Facts {
        identity: IdentityFate::Gone,
        ..held()
    };
    assert_eq!(
        decide(&gone, now),
        Decision::Delete("held, and the identity cannot return")
    );
    let alive = Facts {
        identity: IdentityFate::Alive,
        ..held()
    };
    assert_eq!(decide(&alive, now), Decision::Keep);
}

#[test]
fn a_hold_whose_network_lost_its_grace_is_released_and_a_bad_start_restarts() {
    let now = at("2026-01-01T12:00:05Z");
    let no_grace = Facts { grace: 0, ..held() };
    assert_eq!(
        decide(&no_grace, now),
        Decision::Delete("held, but the Network has no grace period (any more)")
    );
    let unreadable = Facts {
        held_since: None,
        ..held()
    };
    assert_eq!(decide(&unreadable, now), Decision::MarkHeld);
}

#[test]
fn statefulset_scale_down_and_deletion_end_the_identity() {
    let set = |replicas: Option<i32>| StatefulSet {
        spec: Some(StatefulSetSpec {
            replicas,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(statefulset_fate(None, 0), IdentityFate::Gone);
    assert_eq!(
        statefulset_fate(Some(&set(Some(3))), 2),
        IdentityFate::Alive
    );
    assert_eq!(statefulset_fate(Some(&set(Some(2))), 2), IdentityFate::Gone);
    assert_eq!(statefulset_fate(Some(&set(Some(0))), 0), IdentityFate::Gone);
    assert_eq!(statefulset_fate(Some(&set(None)), 0), IdentityFate::Alive);
    assert_eq!(statefulset_fate(Some(&set(None)), 1), IdentityFate::Gone);
}

#[test]
fn held_marks_are_read_from_metadata() {
    let mut a: NetworkAddress = serde_json::from_value(serde_json::json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkAddress",
        "metadata": {"name": "blue-10-0-0-1"},
        "spec": {"network": "blue", "address": "10.0.0.1/24",
                 "claim": {"namespace": "ns", "name": "c", "uid": "u"}},
    }))
    .unwrap();
    assert!(!is_held(&a));
    assert_eq!(held_since(&a), None);
    a.metadata.labels = Some([(HELD_LABEL.to_owned(), "true".to_owned())].into());
    a.metadata.annotations = Some(
        [(
            HELD_SINCE_ANNOTATION.to_owned(),
            "2026-01-01T12:00:00Z".to_owned(),
        )]
        .into(),
    );
    assert!(is_held(&a));
    assert_eq!(held_since(&a), Some(at("2026-01-01T12:00:00Z")));
    a.metadata.annotations = Some([(HELD_SINCE_ANNOTATION.to_owned(), "noon".to_owned())].into());
    assert_eq!(held_since(&a), None);
}
