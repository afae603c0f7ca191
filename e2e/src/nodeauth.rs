//! The chart's node-scoped authorization on a real apiserver: the driver's ServiceAccount,
//! ClusterRole and ValidatingAdmissionPolicies rendered by Helm's engine and applied into a
//! test's own namespace, a token bound to the test node, and a client (and a kubeconfig for the
//! driver binary) that acts with it, so forged cross-node writes meet the real apiserver.
//!
//! The chart names its cluster-scoped objects without the release (one install per cluster),
//! so a twin applies them under `<test namespace>-<name>` instead: the shared cluster may hold
//! another install, and two twins never share one. Only `metadata.name` and the references to
//! the renamed objects change; the rules, expressions and messages are applied as rendered.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, PostParams};
use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::harness::eventually;
use crate::helm::{self, Object};

/// A node no driver runs on: every forged write names it.
pub const OTHER_NODE: &str = "knic-e2e-other";
/// The chart's driver ServiceAccount (the policies match its username).
pub const DRIVER_SA: &str = "knic-driver";
/// What the policies say to a token that carries no node.
pub const NO_NODE: &str = "no node association found for user, this user must run in a pod on a node and ServiceAccountTokenPodNodeInfo must be enabled";
/// The harness's nft table that routes Service addresses on this machine.
const NFT_TABLE: &str = "knic_harness";

/// Cluster-scoped objects and Service routes a twin made, removed by [`Leftovers::remove`] on
/// the normal path and, whatever is still listed, when dropped (a failed or panicking twin):
/// a webhook configuration or an admission policy left behind would act on the shared cluster.
pub struct Leftovers {
    kubeconfig: std::path::PathBuf,
    objects: Vec<(ApiResource, String)>,
    routes: Vec<String>,
}

impl Leftovers {
    /// Nothing yet; removals go through the admin `kubeconfig`.
    pub fn new(kubeconfig: &Path) -> Leftovers {
        Leftovers {
            kubeconfig: kubeconfig.to_owned(),
            objects: Vec::new(),
            routes: Vec::new(),
        }
    }

    /// Removes cluster-scoped object `name` of kind `K` at the end.
    pub fn track<K: kube::Resource<DynamicType = ()>>(&mut self, name: &str) {
        self.objects
            .push((ApiResource::erase::<K>(&()), name.to_owned()));
    }

    /// Removes the nft DNAT rules `route-service` added for Service address `vip` at the end.
    pub fn track_route(&mut self, vip: &str) {
        self.routes.push(vip.to_owned());
    }

    /// Removes everything listed, newest first; the first failure is returned after every
    /// removal was tried.
    pub async fn remove(&mut self) -> anyhow::Result<()> {
        let client = client_from(&self.kubeconfig).await?;
        let mut first = None;
        while let Some((resource, name)) = self.objects.pop() {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    let e = anyhow::anyhow!("deleting {} {name}: {e}", resource.kind);
                    first.get_or_insert(e);
                }
            }
        }
        while let Some(vip) = self.routes.pop() {
            if let Err(e) = unroute(&vip) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        if self.objects.is_empty() && self.routes.is_empty() {
            return;
        }
        let mut rest = Leftovers {
            kubeconfig: self.kubeconfig.clone(),
            objects: std::mem::take(&mut self.objects),
            routes: std::mem::take(&mut self.routes),
        };
        // A runtime of its own on a thread of its own: drop may run inside the twin's runtime
        // (which cannot block on itself) or while it unwinds.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(rest.remove())
        })
        .join();
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("leftovers not removed: {e:#}"),
            Err(_) => eprintln!("leftovers not removed: the removal thread panicked"),
        }
    }
}

/// Deletes the DNAT rules of `vip` from both of the harness's Service chains, as
/// `route-service` itself does before adding new ones.
fn unroute(vip: &str) -> anyhow::Result<()> {
    for chain in ["services_pre", "services_out"] {
        let out = std::process::Command::new("nft")
            .args(["-a", "list", "chain", "ip", NFT_TABLE, chain])
            .output()
            .context("running nft")?;
        ensure!(
            out.status.success(),
            "nft list chain {chain}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let listing = String::from_utf8_lossy(&out.stdout);
        let needle = format!("daddr {vip} ");
        for line in listing.lines().filter(|l| l.contains(&needle)) {
            let handle = line
                .rsplit_once("# handle ")
                .map(|(_, h)| h.trim())
                .context("an nft rule without its handle")?;
            let status = std::process::Command::new("nft")
                .args(["delete", "rule", "ip", NFT_TABLE, chain, "handle", handle])
                .status()?;
            ensure!(status.success(), "nft delete rule {chain} handle {handle}");
        }
    }
    Ok(())
}

/// Whether the harness's Service chains still route `vip` (a twin checks its own cleanup).
pub fn routed(vip: &str) -> anyhow::Result<bool> {
    let out = std::process::Command::new("nft")
        .args(["list", "table", "ip", NFT_TABLE])
        .output()
        .context("running nft")?;
    Ok(String::from_utf8_lossy(&out.stdout).contains(&format!("daddr {vip} ")))
}

/// A client acting as the user of `kubeconfig`.
pub async fn client_from(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let file = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// The chart as Helm renders it for release `knic` in `namespace`, for the cluster's own
/// Kubernetes version (the chart's kubeVersion check runs against it).
pub async fn render(client: &kube::Client, namespace: &str) -> anyhow::Result<helm::Rendered> {
    let version = client.apiserver_version().await?;
    let version = version.git_version.trim_start_matches('v');
    let version = version
        .split(['+', '-'])
        .next()
        .unwrap_or(version)
        .to_owned();
    let namespace = namespace.to_owned();
    // Python and Helm's engine run for a second or two: off the runtime's workers.
    tokio::task::spawn_blocking(move || {
        helm::template_release(&json!({}), Some(&version), helm::RELEASE_NAME, &namespace)
    })
    .await??
    .map_err(|refusal| anyhow::anyhow!("Helm refused the default values: {refusal}"))
}

/// `name` of a cluster-scoped chart object, as a twin in `namespace` applies it.
pub fn renamed(namespace: &str, name: &str) -> String {
    format!("{namespace}-{name}")
}

/// What [`install`] applied.
pub struct Installed {
    /// The policies' names on the cluster (renamed), by the chart's names.
    pub policies: Vec<(String, String)>,
}

impl Installed {
    /// The applied name of the chart's policy `chart_name`.
    pub fn policy(&self, chart_name: &str) -> anyhow::Result<&str> {
        self.policies
            .iter()
            .find(|(c, _)| c == chart_name)
            .map(|(_, applied)| applied.as_str())
            .with_context(|| format!("the chart has no policy {chart_name}"))
    }
}

/// Applies, from the chart rendered with default values into the twin's namespace: the
/// driver's ServiceAccount, its ClusterRole and ClusterRoleBinding, and every
/// ValidatingAdmissionPolicy and binding of admission.yaml (renamed, see the module), then
/// waits until the apiserver has type-checked each policy and fails on any warning its checker
/// found in the chart's expressions.
pub async fn install(cluster: &Cluster, leftovers: &mut Leftovers) -> anyhow::Result<Installed> {
    let ns = cluster.namespace.clone();
    let rendered = render(&cluster.client, &ns).await?;
    let post = PostParams::default();
    let client = cluster.client.clone();
    let mut policies = Vec::new();
    for source in &rendered.objects {
        match &source.object {
            Object::ServiceAccount(sa) if sa.metadata.name.as_deref() == Some(DRIVER_SA) => {
                Api::<ServiceAccount>::namespaced(client.clone(), &ns)
                    .create(&post, sa)
                    .await
                    .context("creating the driver's ServiceAccount")?;
            }
            Object::ClusterRole(role) if role.metadata.name.as_deref() == Some(DRIVER_SA) => {
                let mut role = (**role).clone();
                role.metadata.name = Some(renamed(&ns, DRIVER_SA));
                leftovers.track::<ClusterRole>(&renamed(&ns, DRIVER_SA));
                Api::<ClusterRole>::all(client.clone())
                    .create(&post, &role)
                    .await?;
            }
            Object::ClusterRoleBinding(binding)
                if binding.metadata.name.as_deref() == Some(DRIVER_SA) =>
            {
                let mut binding = (**binding).clone();
                ensure!(
                    binding.role_ref.name == DRIVER_SA,
                    "the driver's binding refers to {}",
                    binding.role_ref.name
                );
                binding.metadata.name = Some(renamed(&ns, DRIVER_SA));
                binding.role_ref.name = renamed(&ns, DRIVER_SA);
                leftovers.track::<ClusterRoleBinding>(&renamed(&ns, DRIVER_SA));
                Api::<ClusterRoleBinding>::all(client.clone())
                    .create(&post, &binding)
                    .await?;
            }
            Object::ValidatingAdmissionPolicy(policy) => {
                let mut policy = (**policy).clone();
                let name = policy.metadata.name.clone().context("a nameless policy")?;
                policy.metadata.name = Some(renamed(&ns, &name));
                leftovers.track::<ValidatingAdmissionPolicy>(&renamed(&ns, &name));
                Api::<ValidatingAdmissionPolicy>::all(client.clone())
                    .create(&post, &policy)
                    .await?;
                policies.push((name.clone(), renamed(&ns, &name)));
            }
            Object::ValidatingAdmissionPolicyBinding(binding) => {
                let mut binding = (**binding).clone();
                let name = binding
                    .metadata
                    .name
                    .clone()
                    .context("a nameless binding")?;
                let spec = binding.spec.as_mut().context("a binding without spec")?;
                let policy = spec
                    .policy_name
                    .clone()
                    .context("a binding without policy")?;
                spec.policy_name = Some(renamed(&ns, &policy));
                binding.metadata.name = Some(renamed(&ns, &name));
                leftovers.track::<ValidatingAdmissionPolicyBinding>(&renamed(&ns, &name));
                Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
                    .create(&post, &binding)
                    .await?;
            }
            _ => {}
        }
    }
    ensure!(
        policies.len() == 5,
        "admission.yaml rendered {} policies, the twins cover 5",
        policies.len()
    );
    let api: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    for (_, name) in &policies {
        let checked = eventually(
            &format!("policy {name} type-checked"),
            Duration::from_secs(30),
            || async {
                let p = api.get(name).await?;
                let generation = p.metadata.generation;
                let status = p.status.unwrap_or_default();
                Ok((status.observed_generation.is_some()
                    && status.observed_generation == generation)
                    .then_some(status))
            },
        )
        .await?;
        let warnings = checked
            .type_checking
            .and_then(|t| t.expression_warnings)
            .unwrap_or_default();
        ensure!(
            warnings.is_empty(),
            "the apiserver's type checker warns about policy {name}: {}",
            serde_json::to_string(&warnings)?
        );
    }
    Ok(Installed { policies })
}

/// A token of the driver's ServiceAccount: bound to Node `node` (the apiserver then adds
/// `authentication.kubernetes.io/node-name` to its user), or, with `None`, bound to nothing.
pub async fn driver_token(cluster: &Cluster, node: Option<&str>) -> anyhow::Result<String> {
    let bound = match node {
        Some(node) => {
            let uid = Api::<Node>::all(cluster.client.clone())
                .get(node)
                .await?
                .metadata
                .uid;
            json!({"kind": "Node", "apiVersion": "v1", "name": node, "uid": uid})
        }
        None => Value::Null,
    };
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": 3600, "boundObjectRef": bound},
    }))?;
    let answer = Api::<ServiceAccount>::namespaced(cluster.client.clone(), &cluster.namespace)
        .create_token_request(DRIVER_SA, &PostParams::default(), &request)
        .await
        .context("TokenRequest for the driver's ServiceAccount")?;
    Ok(answer.status.context("TokenRequest without status")?.token)
}

/// The driver's identity on the cluster: the chart's objects [`install`]ed, and a kubeconfig
/// and a client with the ServiceAccount's token bound to the test node.
pub struct DriverIdentity {
    /// What the chart applied.
    pub installed: Installed,
    /// For the driver binary: `KUBECONFIG`.
    pub kubeconfig: PathBuf,
    /// For the twin's own writes as the driver.
    pub client: kube::Client,
}

/// [`install`]s the chart's objects and makes the driver's identity, checked with a
/// SelfSubjectReview: the ServiceAccount's user with the node-name extra of the test node.
pub async fn driver_identity(
    cluster: &Cluster,
    leftovers: &mut Leftovers,
) -> anyhow::Result<DriverIdentity> {
    let installed = install(cluster, leftovers).await?;
    let token = driver_token(cluster, Some(&cluster.node)).await?;
    let kubeconfig = cluster.tmp.path().join("driver.kubeconfig");
    token_kubeconfig(&cluster.kubeconfig, &token, &kubeconfig)?;
    let client = client_from(&kubeconfig).await?;
    let (user, nodes) = whoami(&client).await?;
    let want = format!("system:serviceaccount:{}:{DRIVER_SA}", cluster.namespace);
    ensure!(
        user == want && nodes == [cluster.node.clone()],
        "the node-bound token is {user} on nodes {nodes:?}, want {want} on [{}]",
        cluster.node
    );
    println!("{user} acts with node-name extra {nodes:?}");
    Ok(DriverIdentity {
        installed,
        kubeconfig,
        client,
    })
}

/// Writes a kubeconfig at `out` for the admin kubeconfig's cluster with `token` as the user
/// (the driver binary reads it; [`client_from`] too).
pub fn token_kubeconfig(admin: &Path, token: &str, out: &Path) -> anyhow::Result<()> {
    let file = kube::config::Kubeconfig::read_from(admin)?;
    let context = file
        .current_context
        .as_deref()
        .and_then(|c| file.contexts.iter().find(|x| x.name == c))
        .and_then(|c| c.context.as_ref())
        .context("the admin kubeconfig has no current context")?;
    let cluster = file
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .context("the admin kubeconfig lacks its context's cluster")?;
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [serde_json::to_value(cluster)?],
        "users": [{"name": "driver", "user": {"token": token}}],
        "contexts": [{"name": "driver", "context": {"cluster": cluster.name, "user": "driver"}}],
        "current-context": "driver",
    });
    std::fs::write(out, serde_json::to_vec(&config)?)?;
    Ok(())
}

/// Who the apiserver takes the user of `client` for: its name and its node-name extra.
pub async fn whoami(client: &kube::Client) -> anyhow::Result<(String, Vec<String>)> {
    let review: SelfSubjectReview = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
    }))?;
    let answer = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let user = answer
        .status
        .and_then(|s| s.user_info)
        .context("SelfSubjectReview without userInfo")?;
    let nodes = user
        .extra
        .unwrap_or_default()
        .remove("authentication.kubernetes.io/node-name")
        .unwrap_or_default();
    Ok((user.username.unwrap_or_default(), nodes))
}

/// The apiserver's refusal of `result`: its HTTP code and message; an error when it was let
/// through or failed otherwise.
pub fn refusal<T>(what: &str, result: Result<T, kube::Error>) -> anyhow::Result<(u16, String)> {
    match result {
        Ok(_) => bail!("{what}: the apiserver let it through"),
        Err(kube::Error::Api(status)) => Ok((status.code, status.message)),
        Err(e) => bail!("{what}: {e}"),
    }
}

/// The apiserver's words when `policy`'s binding (the same name, as the chart makes them)
/// denies a request.
pub fn policy_denial(policy: &str, message: &str) -> String {
    format!(
        "ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: {message}"
    )
}

/// Asserts that `result` was refused by `policy` with `message` (HTTP 422: a denying policy
/// without a `reason` is answered as Invalid, not Forbidden).
pub fn assert_denied<T>(
    what: &str,
    result: Result<T, kube::Error>,
    policy: &str,
    message: &str,
) -> anyhow::Result<()> {
    let (code, text) = refusal(what, result)?;
    let want = policy_denial(policy, message);
    ensure!(
        code == 422 && text.ends_with(&want),
        "{what}: refused with {code} {text:?}, want 422 ending in {want:?}"
    );
    println!("refused as it should be: {what}: {text}");
    Ok(())
}

/// Polls a dry-run `attempt` until the apiserver refuses it with `needle` in its message:
/// admission policies and webhook configurations take effect a moment after they are created.
pub async fn until_refused<F, Fut, T>(
    what: &str,
    needle: &str,
    mut attempt: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    eventually(what, Duration::from_secs(60), || {
        let tried = attempt();
        async move {
            match tried.await {
                Ok(_) => Ok(None),
                Err(kube::Error::Api(s)) if s.message.contains(needle) => Ok(Some(())),
                Err(e) => bail!("{e}"),
            }
        }
    })
    .await
}
