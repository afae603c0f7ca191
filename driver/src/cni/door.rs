//! The driver's side of the CNI door: a root-only unix socket where the `knic` plugin asks,
//! one JSON line per connection, to attach the pod's claim of a Network into the netns the
//! runtime made, and gets the interface's facts back.
//!
//! The claim of the Network is found among the pod's prepared claims by the Network its
//! attachment records (the `knic.dev/network` label generated templates put on claims, else
//! the config's `ipam.network`), so a static-IPAM Network's claims are found too. The attach is the NRI hook's own `attach_pod`, idempotent,
//! so the hook that runs after the runtime's sandbox set-up finds the pod attached.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::result::{Attached, Ip, Route};
use super::{CniError, Command, DoorAnswer, DoorRequest, code, no_claim_message};
use crate::claims::checkpoint::PreparedClaim;
use crate::error::Result;
use crate::netns::{Kernel, mac_text};
use crate::pods::PodNetworks;

/// A plugin-specific CNI code (the spec leaves 100 and up to plugins): the attach failed, or
/// the pod's interface cannot be given the name asked for.
pub const ATTACH_FAILED: u32 = 100;

/// The largest request read.
const MAX_REQUEST: u64 = 64 * 1024;

/// Whether `claim` serves `network`: its attachments say so (the claim's `knic.dev/network`
/// label from a generated template, else its `ipam.network`); a claim prepared by a driver
/// too old to record that is matched by the Network its addresses came from.
fn serves(claim: &PreparedClaim, network: &str) -> bool {
    claim
        .attachments
        .iter()
        .any(|a| a.plan.network.as_deref() == Some(network))
        || claim.allocations.iter().any(|a| a.network == network)
}

/// Answers one request.
pub async fn answer<K: Kernel>(pods: &PodNetworks<K>, req: &DoorRequest) -> DoorAnswer {
    let failed = |code, msg: String| DoorAnswer::Failed(CniError::new(code, msg, ""));
    let claims = match pods.pod_claims(&req.pod_uid).await {
        Ok(claims) => claims,
        Err(e) => return failed(code::IO_FAILURE, format!("reading prepared claims: {e}")),
    };
    let Some(claim) = claims.iter().find(|c| serves(c, &req.network)) else {
        return DoorAnswer::Failed(CniError::new(
            code::TRY_AGAIN_LATER,
            no_claim_message(&req.pod, &req.network),
            "the kubelet prepares a pod's claims before its sandbox starts",
        ));
    };
    let Some(attachment) = claim.attachments.first() else {
        return failed(
            ATTACH_FAILED,
            format!(
                "claim {}/{} of Network {:?} has no network interface to attach",
                claim.namespace, claim.name, req.network
            ),
        );
    };
    let plan = &attachment.plan;
    if plan.pod_ifname != req.ifname {
        return failed(
            ATTACH_FAILED,
            format!(
                "Network {:?} gives pod {} the interface {:?} but the runtime asked for {:?}: \
                 name it in the pod's annotation ({{\"name\": \"{}\", \"interface\": \"{}\"}}) \
                 or set the Network's spec.interfaceName to {:?}",
                req.network,
                req.pod,
                plan.pod_ifname,
                req.ifname,
                req.network,
                plan.pod_ifname,
                req.ifname
            ),
        );
    }
    let netns = PathBuf::from(&req.netns);
    if req.command == Command::Add
        && let Err(e) = pods.attach_pod(&req.pod_uid, &req.pod, netns.clone()).await
    {
        return failed(ATTACH_FAILED, format!("attaching the pod's claims: {e}"));
    }
    match pods.link_in(&netns, &req.ifname).await {
        Ok(Some(link)) => {
            let gateway = |ip: &knic_proto::netconfig::Cidr| {
                plan.routes
                    .iter()
                    .filter(|r| r.destination.prefix_len == 0)
                    .filter_map(|r| r.gateway)
                    .find(|g| g.is_ipv4() == ip.addr.is_ipv4())
                    .map(|g| g.to_string())
            };
            DoorAnswer::Attached(Attached {
                interface: link.name.clone(),
                mac: link.mac.as_ref().map(mac_text),
                mtu: Some(link.mtu),
                ips: plan
                    .addresses
                    .iter()
                    .map(|a| Ip {
                        address: a.to_string(),
                        gateway: gateway(a),
                    })
                    .collect(),
                routes: plan
                    .routes
                    .iter()
                    .map(|r| Route {
                        dst: r.destination.to_string(),
                        gw: r.gateway.map(|g| g.to_string()),
                    })
                    .collect(),
            })
        }
        Ok(None) => failed(
            ATTACH_FAILED,
            format!("interface {:?} is not in {}", req.ifname, req.netns),
        ),
        Err(e) => failed(
            ATTACH_FAILED,
            format!("reading {:?} in {}: {e}", req.ifname, req.netns),
        ),
    }
}

/// Serves the door at `socket` (0600) until `stop` turns true; the socket is removed then.
pub fn serve<K: Kernel + 'static>(
    socket: &Path,
    pods: Arc<PodNetworks<K>>,
    mut stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = crate::kubelet::bind_socket(socket)?;
    let path = socket.to_path_buf();
    tracing::info!(socket = %path.display(), "CNI door listening");
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                conn = listener.accept() => match conn {
                    Ok((stream, _)) => {
                        let pods = pods.clone();
                        tokio::spawn(async move { one(stream, &pods).await });
                    }
                    Err(e) => tracing::warn!(error = %e, "CNI door: accept failed"),
                },
            }
        }
        crate::kubelet::remove_socket(&path);
    }))
}

/// One connection: one request line, one answer line.
/// How long a connection may take to send its request line.
const REQUEST_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

async fn one<K: Kernel>(stream: UnixStream, pods: &PodNetworks<K>) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    // The plugin writes its one line at once; a connection that sends nothing must not keep
    // its task for ever.
    let mut reader = BufReader::new(read.take(MAX_REQUEST));
    let read_line = reader.read_line(&mut line);
    let read = tokio::time::timeout(REQUEST_READ_TIMEOUT, read_line)
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no request within {REQUEST_READ_TIMEOUT:?}"),
            ))
        });
    let answer = match read {
        Err(e) => DoorAnswer::Failed(CniError::new(
            code::IO_FAILURE,
            format!("reading the request: {e}"),
            "",
        )),
        Ok(_) => match serde_json::from_str::<DoorRequest>(&line) {
            Err(e) => DoorAnswer::Failed(CniError::new(
                code::DECODING_FAILURE,
                format!("the request is not a knic CNI request: {e}"),
                "",
            )),
            Ok(req) => {
                let answer = answer(pods, &req).await;
                match &answer {
                    DoorAnswer::Attached(a) => {
                        tracing::info!(pod = %req.pod, network = %req.network,
                        interface = %a.interface, "CNI: attached")
                    }
                    DoorAnswer::Failed(e) => tracing::warn!(pod = %req.pod, network = %req.network,
                        error = %e.msg, "CNI: refused"),
                }
                answer
            }
        },
    };
    let mut out = serde_json::to_vec(&answer).unwrap_or_default();
    out.push(b'\n');
    if let Err(e) = write.write_all(&out).await {
        tracing::debug!(error = %e, "CNI door: the plugin left before the answer");
    }
}
