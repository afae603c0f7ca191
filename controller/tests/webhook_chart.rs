//! The chart's webhook (charts/knic/templates/webhook.yaml) rendered by Helm's own engine
//! (PyPI helm-python-sdk): the configuration points at the Service, the Service at the
//! controller's port, the Secret at the files the controller reads; the self-signed bootstrap
//! really serves (the controller's server with the rendered pair, a client trusting the rendered
//! caBundle and checking the Service's DNS name); the matchConditions, evaluated by the
//! controller's CEL policy evaluator, send exactly the objects knic checks.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingWebhook, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use knic_controller::cel::policy::{Env, Program, Val};
use knic_controller::webhook::{Certificates, Limits, Server, Snapshot};
use serde::Deserialize;
use serde_json::{Value, json};

const NAMESPACE: &str = "knic-system";
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/knic");
const RENDER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/render_chart.py");
const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/webhook_client.py");

/// Every object the chart renders with `values`, by template file name.
fn render(values: Value) -> anyhow::Result<BTreeMap<String, Vec<Value>>> {
    let out = std::process::Command::new("python3")
        .args([RENDER, CHART, NAMESPACE, &values.to_string()])
        .output()
        .context("running python3 (the chart tests need PyPI helm-python-sdk)")?;
    ensure!(
        out.status.success(),
        "rendering the chart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files: BTreeMap<String, String> = serde_json::from_slice(&out.stdout)?;
    let mut objects = BTreeMap::new();
    for (path, text) in files {
        let name = path.rsplit('/').next().unwrap_or(&path).to_owned();
        // The install notes are text for the user, not objects.
        if name == "NOTES.txt" {
            continue;
        }
        let mut list = Vec::new();
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = Value::deserialize(document)
                .with_context(|| format!("{path} is not YAML:\n{text}"))?;
            if !value.is_null() {
                list.push(value);
            }
        }
        objects.insert(name, list);
    }
    Ok(objects)
}

fn of_kind<T: serde::de::DeserializeOwned>(
    objects: &[Value],
    kind: &str,
) -> anyhow::Result<Vec<T>> {
    objects
        .iter()
        .filter(|o| o["kind"] == kind)
        .map(|o| serde_json::from_value(o.clone()).with_context(|| format!("a {kind}")))
        .collect()
}

fn one<T: serde::de::DeserializeOwned>(objects: &[Value], kind: &str) -> anyhow::Result<T> {
    let mut all = of_kind::<T>(objects, kind)?;
    ensure!(all.len() == 1, "{} {kind} objects, wanted one", all.len());
    Ok(all.remove(0))
}

fn file<'a>(rendered: &'a BTreeMap<String, Vec<Value>>, name: &str) -> &'a [Value] {
    rendered.get(name).map(Vec::as_slice).unwrap_or_default()
}

/// The controller container's environment.
fn controller_env(deployment: &Deployment) -> BTreeMap<String, String> {
    deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect()
}

/// The four webhooks by resource, each checked for what every one of them must say.
fn webhooks(
    config: &ValidatingWebhookConfiguration,
    failure_policy: &str,
) -> anyhow::Result<BTreeMap<String, ValidatingWebhook>> {
    let mut out = BTreeMap::new();
    for hook in config.webhooks.iter().flatten() {
        let rules = hook.rules.as_deref().unwrap_or_default();
        let [rule] = rules else {
            bail!("{}: one rule, got {rules:?}", hook.name);
        };
        let resource = rule.resources.as_deref().unwrap_or_default().join(",");
        ensure!(
            hook.name == format!("{resource}.validate.knic.dev"),
            "{}",
            hook.name
        );
        ensure!(hook.side_effects == "None");
        ensure!(hook.admission_review_versions == ["v1"]);
        ensure!(
            hook.timeout_seconds == Some(5),
            "{:?}",
            hook.timeout_seconds
        );
        ensure!(hook.failure_policy.as_deref() == Some(failure_policy));
        ensure!(hook.match_policy.as_deref() == Some("Equivalent"));
        ensure!(
            rule.operations.as_deref() == Some(&["CREATE".to_owned(), "UPDATE".to_owned()][..])
        );
        let service = hook.client_config.service.as_ref().context("service")?;
        ensure!(
            (
                service.name.as_str(),
                service.namespace.as_str(),
                service.path.as_deref(),
                service.port
            ) == ("knic-webhook", NAMESPACE, Some("/validate"), Some(443))
        );
        out.insert(resource, hook.clone());
    }
    let names: Vec<&str> = out.keys().map(String::as_str).collect();
    ensure!(
        names
            == [
                "deviceclasses",
                "networks",
                "resourceclaims",
                "resourceclaimtemplates"
            ],
        "{names:?}"
    );
    let versions = |r: &str| {
        let rule = &out[r].rules.as_ref().unwrap()[0];
        (
            rule.api_groups.clone().unwrap_or_default(),
            rule.api_versions.clone().unwrap_or_default(),
        )
    };
    ensure!(versions("networks") == (vec!["knic.dev".to_owned()], vec!["v1alpha1".to_owned()]));
    ensure!(
        versions("resourceclaims") == (vec!["resource.k8s.io".to_owned()], vec!["v1".to_owned()])
    );
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_self_signed_bootstrap_is_served_by_the_controller() -> anyhow::Result<()> {
    let rendered = render(json!({}))?;
    let objects = file(&rendered, "webhook.yaml");
    let secret: Secret = one(objects, "Secret")?;
    let config: ValidatingWebhookConfiguration = one(objects, "ValidatingWebhookConfiguration")?;
    let service: Service = one(objects, "Service")?;
    let deployment: Deployment = one(file(&rendered, "deployment.yaml"), "Deployment")?;
    ensure!(of_kind::<Value>(objects, "Certificate")?.is_empty());
    ensure!(config.metadata.annotations.is_none());

    // The caBundle is the Secret's CA, and the Secret is what the controller mounts and reads.
    ensure!(secret.type_.as_deref() == Some("kubernetes.io/tls"));
    let data = secret.data.as_ref().context("data")?;
    let hooks = webhooks(&config, "Fail")?;
    for hook in hooks.values() {
        ensure!(hook.client_config.ca_bundle.as_ref() == data.get("ca.crt"));
    }
    let pod = deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "webhook-tls")
        .context("volume")?;
    ensure!(
        volume
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.as_deref())
            == secret.metadata.name.as_deref()
    );
    let mount = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "webhook-tls")
        .context("mount")?;
    let env = controller_env(&deployment);
    ensure!(env.get("KNIC_WEBHOOK_CERT") == Some(&format!("{}/tls.crt", mount.mount_path)));
    ensure!(env.get("KNIC_WEBHOOK_KEY") == Some(&format!("{}/tls.key", mount.mount_path)));
    ensure!(
        mount.sub_path.is_none(),
        "a subPath mount never sees the Secret's updates"
    );

    // The Service reaches the controller's webhook port.
    let spec = service.spec.as_ref().context("service spec")?;
    let pod_labels = deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap_or_default();
    ensure!(
        spec.selector
            .iter()
            .flatten()
            .all(|(k, v)| pod_labels.get(k) == Some(v))
    );
    let port = &spec.ports.as_ref().context("ports")?[0];
    ensure!(port.port == 443);
    let target = match &port.target_port {
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p)) => *p,
        other => bail!("targetPort {other:?}"),
    };
    ensure!(env.get("KNIC_WEBHOOK_ADDRESS") == Some(&format!("0.0.0.0:{target}")));

    // And the rendered pair really serves, to a client that trusts only the caBundle and checks
    // the name the apiserver dials.
    let tmp = tempfile::tempdir()?;
    let write = |name: &str| -> anyhow::Result<std::path::PathBuf> {
        let path = tmp.path().join(name);
        std::fs::write(&path, &data.get(name).context(name.to_owned())?.0)?;
        Ok(path)
    };
    let (cert, key, ca) = (write("tls.crt")?, write("tls.key")?, write("ca.crt")?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let local = listener.local_addr()?.port();
    let server = Server::new(
        listener,
        Certificates::load(&cert, &key)?,
        Arc::new(Snapshot::default()),
        Limits::default(),
    )?;
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.serve(async {
        let _ = stopped.await;
    }));
    let review = tmp.path().join("review.json");
    std::fs::write(
        &review,
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u-1", "kind": {"group": "knic.dev", "version": "v1alpha1", "kind": "Network"},
            "operation": "DELETE", "oldObject": {}}})
        .to_string(),
    )?;
    let out = tokio::process::Command::new("python3")
        .arg(CLIENT)
        .arg(&ca)
        .arg(format!("knic-webhook.{NAMESPACE}.svc"))
        .arg(local.to_string())
        .args(["POST", "/validate"])
        .arg(&review)
        .arg("--connect=127.0.0.1")
        .output()
        .await?;
    let got: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    ensure!(got["status"] == 200, "{got}");
    let body: Value = serde_json::from_str(got["body"].as_str().unwrap_or_default())?;
    ensure!(
        body["response"] == json!({"uid": "u-1", "allowed": true}),
        "{body}"
    );
    Ok(())
}

/// Whether the apiserver would send `object`, written by `user`, to the webhook `hook`: every
/// matchCondition true.
fn sent(hook: &ValidatingWebhook, object: &Value, user: &str) -> anyhow::Result<bool> {
    let env = Env::new([
        ("object".to_owned(), Val::from_json(object)?),
        ("oldObject".to_owned(), Val::Null),
        (
            "request".to_owned(),
            Val::from_json(&json!({"operation": "CREATE", "userInfo": {"username": user}}))?,
        ),
    ]);
    for condition in hook.match_conditions.iter().flatten() {
        let program = Program::compile(&condition.expression, &env.declared())
            .with_context(|| condition.expression.clone())?;
        if !program
            .eval_bool(&env)
            .with_context(|| condition.expression.clone())?
        {
            return Ok(false);
        }
    }
    Ok(true)
}

#[test]
fn match_conditions_send_only_objects_with_knic_configs() -> anyhow::Result<()> {
    let rendered = render(json!({}))?;
    let config: ValidatingWebhookConfiguration = one(
        file(&rendered, "webhook.yaml"),
        "ValidatingWebhookConfiguration",
    )?;
    let hooks = webhooks(&config, "Fail")?;
    let admin = "kubernetes-admin";
    let controller = format!("system:serviceaccount:{NAMESPACE}:knic-controller");
    let knic = json!({"opaque": {"driver": "knic.dev", "parameters": {}}});
    let other = json!({"opaque": {"driver": "gpu.example.com", "parameters": {}}});

    let class = |config: Value| json!({"metadata": {"name": "c"}, "spec": {"config": config}});
    let h = &hooks["deviceclasses"];
    ensure!(sent(h, &class(json!([other, knic])), admin)?);
    ensure!(!sent(h, &class(json!([other])), admin)?);
    ensure!(!sent(
        h,
        &json!({"metadata": {"name": "c"}, "spec": {}}),
        admin
    )?);
    ensure!(!sent(h, &class(json!([knic])), &controller)?);

    let claim = |config: Value, annotations: Value| {
        json!({"metadata": {"name": "c", "annotations": annotations},
            "spec": {"devices": {"requests": [], "config": config}}})
    };
    let h = &hooks["resourceclaims"];
    ensure!(sent(h, &claim(json!([knic]), json!({"team": "a"})), admin)?);
    ensure!(!sent(h, &claim(json!([other]), json!({})), admin)?);
    ensure!(!sent(
        h,
        &json!({"metadata": {"name": "c"}, "spec": {}}),
        admin
    )?);
    // Made from a template for a pod (the template was checked): pods never wait on the webhook.
    let generated = claim(
        json!([knic]),
        json!({"resource.kubernetes.io/pod-claim-name": "net"}),
    );
    ensure!(!sent(
        h,
        &generated,
        "system:serviceaccount:kube-system:resource-claim-controller"
    )?);

    let template = |config: Value| json!({"metadata": {"name": "t"}, "spec": {"spec": {"devices": {"config": config}}}});
    let h = &hooks["resourceclaimtemplates"];
    ensure!(sent(h, &template(json!([knic])), admin)?);
    ensure!(!sent(h, &template(json!([other])), admin)?);
    ensure!(!sent(
        h,
        &json!({"metadata": {"name": "t"}, "spec": {"spec": {}}}),
        admin
    )?);
    // The controller's generated templates come from Networks the webhook checked.
    ensure!(!sent(h, &template(json!([knic])), &controller)?);

    let h = &hooks["networks"];
    ensure!(sent(
        h,
        &json!({"metadata": {"name": "n"}, "spec": {}}),
        admin
    )?);
    ensure!(!sent(
        h,
        &json!({"metadata": {"name": "n"}, "spec": {}}),
        &controller
    )?);
    Ok(())
}

#[test]
fn cert_manager_or_nothing_when_asked() -> anyhow::Result<()> {
    // cert-manager with the chart's own CA chain.
    let rendered =
        render(json!({"webhook": {"certManager": {"enabled": true}, "failurePolicy": "Ignore"}}))?;
    let objects = file(&rendered, "webhook.yaml");
    ensure!(
        of_kind::<Value>(objects, "Secret")?.is_empty(),
        "cert-manager writes the Secret"
    );
    let config: ValidatingWebhookConfiguration = one(objects, "ValidatingWebhookConfiguration")?;
    for hook in webhooks(&config, "Ignore")?.values() {
        ensure!(hook.client_config.ca_bundle.is_none());
    }
    let certificates = of_kind::<Value>(objects, "Certificate")?;
    let serving = certificates
        .iter()
        .find(|c| c["spec"]["secretName"] == "knic-webhook-tls")
        .context("the serving Certificate")?;
    let annotation = config
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("cert-manager.io/inject-ca-from"));
    ensure!(
        annotation
            == Some(&format!(
                "{NAMESPACE}/{}",
                serving["metadata"]["name"].as_str().unwrap_or_default()
            )),
        "{annotation:?}"
    );
    ensure!(
        serving["spec"]["dnsNames"]
            .as_array()
            .is_some_and(|n| n.contains(&json!(format!("knic-webhook.{NAMESPACE}.svc")))),
        "{serving}"
    );
    let issuer = &serving["spec"]["issuerRef"];
    ensure!(issuer["name"] == "knic-webhook-ca" && issuer["kind"] == "Issuer");
    let ca = certificates
        .iter()
        .find(|c| c["spec"]["isCA"] == true)
        .context("the CA Certificate")?;
    let issuers = of_kind::<Value>(objects, "Issuer")?;
    ensure!(
        issuers
            .iter()
            .any(|i| i["metadata"]["name"] == "knic-webhook-ca"
                && i["spec"]["ca"]["secretName"] == ca["spec"]["secretName"])
    );

    // An issuer of the admin's: used, and no CA of the chart's.
    let rendered = render(json!({"webhook": {"certManager": {"enabled": true,
        "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}}))?;
    let objects = file(&rendered, "webhook.yaml");
    ensure!(of_kind::<Value>(objects, "Issuer")?.is_empty());
    let [serving] = of_kind::<Value>(objects, "Certificate")?
        .try_into()
        .map_err(|c: Vec<Value>| anyhow::anyhow!("{} Certificates", c.len()))?;
    ensure!(
        serving["spec"]["issuerRef"]
            == json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
    );

    // Off: nothing rendered, and the controller neither serves nor mounts anything.
    let rendered = render(json!({"webhook": {"enabled": false}}))?;
    ensure!(file(&rendered, "webhook.yaml").is_empty());
    let deployment: Deployment = one(file(&rendered, "deployment.yaml"), "Deployment")?;
    ensure!(
        !controller_env(&deployment)
            .keys()
            .any(|k| k.starts_with("KNIC_WEBHOOK"))
    );
    let pod = deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    ensure!(pod.volumes.is_none() && pod.containers[0].volume_mounts.is_none());
    Ok(())
}
