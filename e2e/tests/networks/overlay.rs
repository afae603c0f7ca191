//! Overlay Networks (issue 26, API part): a `spec.vxlan` Network, as the real apiserver's CRD
//! schema stores it, compiles to a template asking for the overlay class; a second Network on
//! the same VNI is `Invalid` (the older one keeps it) until it picks another; a NetworkAddress
//! keeps the `spec.overlay` facts nodes forward by.
//!
//! On the real cluster the CRDs may predate `vxlan` (the twins never take them over, see
//! `ensure_crds`): this scenario adds exactly the new fields to the installed schema for its
//! run and puts the installed schema back afterwards, so other branches' fields are kept.

use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionSpec,
};
use knic_proto::network::OVERLAY_DEVICE_CLASS;
use kube::CustomResourceExt;

use super::*;

/// The installed CRD specs this run changed, to put back.
struct Saved {
    crds: Vec<(String, CustomResourceDefinitionSpec)>,
    /// Whether this run created the overlay DeviceClass (deleted again afterwards).
    class_created: bool,
}

pub(crate) async fn overlay_networks_compile_and_keep_their_vni(
    env: &mut Env,
) -> anyhow::Result<()> {
    let Some(_) = env.cluster.real else {
        return scenario(env).await;
    };
    // Whatever was changed is put back, also when widening stopped halfway.
    let mut saved = Saved {
        crds: Vec::new(),
        class_created: false,
    };
    let outcome = match widen(&env.cluster.client, &mut saved).await {
        Ok(()) => scenario(env).await,
        Err(e) => Err(e),
    };
    let restored = restore(&env.cluster.client, saved).await;
    outcome.and(restored)
}

async fn scenario(env: &mut Env) -> anyhow::Result<()> {
    let ns = env.namespace("s1", true).await?;
    // A VNI of this run's own (from the id's clock digits), so leftovers never clash.
    let tail = env.id.trim_start_matches("e2e-");
    let vni = 1 + u32::from_str_radix(tail, 16).context("id tail is hex")? % 16_000_000;
    let first = env.name("ovl");
    let second = env.name("ovl2");
    let id = env.id.clone();
    let spec = |cidr: &str, vni: u32| {
        json!({
            "vxlan": {"vni": vni},
            "mtu": 1400,
            "ipam": {"subnets": [{"cidr": cidr}]},
            "namespaces": {"selector": {"matchLabels": {SELECT_KEY: id}}},
        })
    };
    create_raw(env, &first, spec("10.142.0.0/24", vni)).await?;

    let n = env.wait_condition(&first, CONDITION_READY, "True").await?;
    // The apiserver kept the field (a schema without it would prune it silently).
    assert_eq!(
        serde_json::to_value(&n.spec.vxlan)?,
        json!({"vni": vni}),
        "spec.vxlan as stored"
    );
    let st = n.status.clone().unwrap_or_default();
    assert_eq!(
        st.devices_summary.as_deref(),
        Some(format!("vxlan vni={vni}").as_str())
    );
    env.wait_templates(&first, &[&ns]).await?;
    let api: Api<ResourceClaimTemplate> = Api::namespaced(env.cluster.client.clone(), &ns);
    let template = api.get(&first).await?;
    assert_eq!(
        serde_json::to_value(&template.spec)?,
        json!({"metadata": {"labels": {"knic.dev/network": first}}, "spec": {"devices": {
            "requests": [{"name": "network", "exactly": {
                "deviceClassName": "overlay.knic.dev",
                "selectors": [{"cel": {"expression": exhaustion_selector(&first)}}],
                "allocationMode": "ExactCount", "count": 1}}],
            "config": [{"requests": ["network"], "opaque": {"driver": "knic.dev", "parameters": {
                "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                "interface": {"mtu": 1400}, "ipam": {"network": first}}}}],
        }}})
    );

    // The same VNI again: the newer Network is Invalid, generates nothing, the older keeps it.
    create_raw(env, &second, spec("10.143.0.0/24", vni)).await?;
    let n = env
        .wait_condition(&second, CONDITION_INVALID, "True")
        .await?;
    let expected = format!(
        "spec.vxlan.vni: VNI {vni} is already used by network {first:?}; two Networks on one VNI \
         would be one layer-2 segment (pick another vni)"
    );
    assert_eq!(message(&n, CONDITION_INVALID), expected);
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        env.template_namespaces(&second).await?.is_empty(),
        "templates for a Network on a taken VNI"
    );
    env.wait_condition(&first, CONDITION_READY, "True").await?;
    // Another VNI separates them.
    env.patch_spec(&second, json!({"vxlan": {"vni": vni + 1}}))
        .await?;
    env.wait_condition(&second, CONDITION_READY, "True").await?;
    env.wait_templates(&second, &[&ns]).await?;

    // A node's announcement of one overlay pod: the facts survive the apiserver's schema.
    let claim = env.cluster.create_claim("ovl", None).await?;
    let addresses: Api<NetworkAddress> = Api::all(env.cluster.client.clone());
    let overlay = json!({"vni": vni, "mac": "02:5e:1c:9a:33:07", "vtep": "192.168.10.12"});
    let address: NetworkAddress = serde_json::from_value(json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkAddress",
        "metadata": {"name": format!("{first}-10-142-0-17"),
                     "labels": {NETWORK_LABEL: first, "knic.dev/overlay": "true"}},
        "spec": {"network": first, "address": "10.142.0.17/24", "node": env.cluster.node,
                 "overlay": overlay,
                 "claim": {"namespace": env.cluster.namespace, "name": "ovl", "uid": claim.uid}},
    }))?;
    addresses.create(&PostParams::default(), &address).await?;
    let stored = addresses.get(&address.name_any()).await?;
    assert_eq!(serde_json::to_value(&stored.spec.overlay)?, overlay);
    let labelled = addresses
        .list(&ListParams::default().labels("knic.dev/overlay=true"))
        .await?;
    ensure!(
        labelled
            .items
            .iter()
            .any(|a| a.name_any() == address.name_any()),
        "the overlay label selects it"
    );
    addresses
        .delete(&address.name_any(), &DeleteParams::default())
        .await?;

    // Gone before the schema is narrowed again.
    for name in [second, first] {
        env.networks()
            .delete(&name, &DeleteParams::default())
            .await?;
        eventually(&format!("{name} deleted"), WAIT, || async {
            Ok(env.networks().get_opt(&name).await?.is_none().then_some(()))
        })
        .await?;
        env.networks.retain(|n| *n != name);
    }
    Ok(())
}

/// Creates a Network from a raw spec (no devices), as `kubectl apply` of the README's YAML.
async fn create_raw(env: &mut Env, name: &str, spec: Value) -> anyhow::Result<()> {
    let network: Network = serde_json::from_value(json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": name}, "spec": spec,
    }))?;
    env.networks()
        .create(&PostParams::default(), &network)
        .await?;
    env.networks.push(name.to_owned());
    Ok(())
}

/// The object schema of `spec` in version 0 of a CRD spec.
fn spec_schema(spec: &mut Value) -> anyhow::Result<&mut serde_json::Map<String, Value>> {
    spec.pointer_mut("/versions/0/schema/openAPIV3Schema/properties/spec")
        .and_then(Value::as_object_mut)
        .context("CRD has no spec schema")
}

/// Adds the overlay fields of this build's CRDs (`spec.vxlan` of Network, `spec.devices` no
/// longer required; `spec.overlay` of NetworkAddress) to the installed ones, and the overlay
/// DeviceClass when missing (its CEL compiled by this apiserver).
async fn widen(client: &kube::Client, saved: &mut Saved) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (ours, field) in [
        (Network::crd(), "vxlan"),
        (NetworkAddress::crd(), "overlay"),
    ] {
        let name = ours.name_any();
        let mut installed = api.get(&name).await?;
        let before = installed.spec.clone();
        let mut our_spec = serde_json::to_value(&ours.spec)?;
        let our_schema = spec_schema(&mut our_spec)?.clone();
        let mut spec = serde_json::to_value(&installed.spec)?;
        let schema = spec_schema(&mut spec)?;
        let property = our_schema
            .get("properties")
            .and_then(|p| p.get(field))
            .cloned()
            .with_context(|| format!("this build's {name} has no spec.{field}"))?;
        schema
            .get_mut("properties")
            .and_then(Value::as_object_mut)
            .context("installed schema has no properties")?
            .insert(field.to_owned(), property);
        if field == "vxlan"
            && let Some(Value::Array(required)) = schema.get_mut("required")
        {
            required.retain(|r| r != "devices");
        }
        installed.spec = serde_json::from_value(spec)?;
        installed.metadata.managed_fields = None;
        api.replace(&name, &PostParams::default(), &installed)
            .await
            .with_context(|| format!("widening CRD {name}"))?;
        saved.crds.push((name, before));
    }
    // The apiserver serves the new schema a moment after the update.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let classes: Api<DeviceClass> = Api::all(client.clone());
    if classes.get_opt(OVERLAY_DEVICE_CLASS).await?.is_none() {
        let shipped = include_str!("../../../deviceclasses/knic.yaml");
        let class = serde_yaml_ng::Deserializer::from_str(shipped)
            .filter_map(|doc| {
                use serde::Deserialize as _;
                DeviceClass::deserialize(doc).ok()
            })
            .find(|c| c.metadata.name.as_deref() == Some(OVERLAY_DEVICE_CLASS))
            .context("deviceclasses/knic.yaml has the overlay class")?;
        classes
            .create(&PostParams::default(), &class)
            .await
            .context("the apiserver refuses the overlay DeviceClass")?;
        saved.class_created = true;
    }
    Ok(())
}

/// Puts the installed CRD specs back and deletes the class this run created.
async fn restore(client: &kube::Client, saved: Saved) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (name, spec) in saved.crds {
        let mut crd = api.get(&name).await?;
        crd.spec = spec;
        crd.metadata.managed_fields = None;
        api.replace(&name, &PostParams::default(), &crd)
            .await
            .with_context(|| format!("restoring CRD {name}"))?;
    }
    if saved.class_created {
        Api::<DeviceClass>::all(client.clone())
            .delete(OVERLAY_DEVICE_CLASS, &DeleteParams::default())
            .await?;
    }
    Ok(())
}
