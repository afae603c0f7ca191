//! Every write of a Network's status, in one place.
//!
//! Two writers own disjoint status fields: the reconciler everything but `availableNodes`, the
//! availability loop `availableNodes` alone. Both write JSON merge patches of the status
//! subresource, not server-side apply: a merge patch changes exactly the fields it names, so
//! neither writer can drop the other's field, whereas applies from one field manager would
//! each remove the field the other wrote (and two managers would fight over `conditions`).
//! The reconciler names the fields it owns with explicit nulls, so one that no longer applies
//! is removed.

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::Result;
use crate::network::{Network, NetworkStatus};

/// The status fields the reconciler owns (all but `availableNodes`).
const RECONCILER_FIELDS: [&str; 7] = [
    "observedGeneration",
    "conditions",
    "templates",
    "networkAttachmentDefinitions",
    "addresses",
    "addressSummary",
    "devicesSummary",
];

/// Writes the reconciler's fields of `status` (see the module docs).
pub async fn write_status(api: &Api<Network>, name: &str, status: &NetworkStatus) -> Result<()> {
    let mut value = serde_json::to_value(status)?;
    if let Some(map) = value.as_object_mut() {
        map.remove("availableNodes");
        for key in RECONCILER_FIELDS {
            map.entry(key).or_insert(serde_json::Value::Null);
        }
    }
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": value})),
    )
    .await?;
    Ok(())
}

/// Writes `status.availableNodes` alone (`None` removes it: the number is unknown).
pub async fn write_available_nodes(
    api: &Api<Network>,
    name: &str,
    available: Option<u32>,
) -> Result<()> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"availableNodes": available}})),
    )
    .await?;
    Ok(())
}
