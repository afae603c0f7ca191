//! The plugin side: reads the CNI call (environment and stdin config) as Multus or a runtime
//! makes it, asks the driver through its socket, and prints the CNI answer. Every bad input
//! gets a CNI error naming the variable or field and the rule.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use knic_proto::network::nad::NadConfig;

use super::result::{check_version, render, version_info};
use super::{CniError, Command, DoorAnswer, DoorRequest, code};

/// How long the plugin waits for the driver: longer than one attach (a VF move and its
/// addresses take well under a second), shorter than the runtime's sandbox timeout.
pub const DOOR_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest answer read from the socket.
const MAX_ANSWER: u64 = 1 << 20;

/// One CNI call, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// The config's `cniVersion` (answers use it).
    pub version: String,
    /// What goes to the driver (ADD and CHECK; `None` for the others).
    pub request: Option<DoorRequest>,
}

/// Reads a CNI variable that must be set and non-empty.
fn required<'a>(env: &'a BTreeMap<String, String>, name: &str) -> Result<&'a str, CniError> {
    match env.get(name).map(String::as_str) {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(CniError::new(
            code::INVALID_ENVIRONMENT,
            format!("{name} is not set"),
            "the runtime (or Multus) must set it for this command",
        )),
    }
}

/// Parses `CNI_ARGS` (`K=V;K=V`), refusing an entry without `=`.
pub fn parse_args(args: &str) -> Result<BTreeMap<String, String>, CniError> {
    let mut out = BTreeMap::new();
    for part in args.split(';').filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once('=') else {
            return Err(CniError::new(
                code::INVALID_ENVIRONMENT,
                format!("CNI_ARGS entry {part:?} is not KEY=VALUE"),
                "CNI_ARGS is a ;-separated list of KEY=VALUE",
            ));
        };
        out.insert(k.to_owned(), v.to_owned());
    }
    Ok(out)
}

/// Parses the call from the environment and the stdin config.
pub fn parse(env: &BTreeMap<String, String>, stdin: &[u8]) -> Result<Invocation, CniError> {
    let command = match required(env, "CNI_COMMAND")? {
        "ADD" => Command::Add,
        "DEL" => Command::Del,
        "CHECK" => Command::Check,
        "STATUS" => Command::Status,
        "GC" => Command::Gc,
        "VERSION" => Command::Version,
        other => {
            return Err(CniError::new(
                code::INVALID_ENVIRONMENT,
                format!("CNI_COMMAND {other:?} is not one of ADD, DEL, CHECK, STATUS, GC, VERSION"),
                "",
            ));
        }
    };
    if command == Command::Version {
        return Ok(Invocation {
            command,
            version: "1.1.0".into(),
            request: None,
        });
    }
    let config: NadConfig = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            code::DECODING_FAILURE,
            format!("the network configuration on stdin is not valid: {e}"),
            r#"want at least {"cniVersion":"1.0.0","name":"blue","type":"knic"}"#,
        )
    })?;
    check_version(&config.cni_version)?;
    if config.network().is_empty() {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            "network configuration: name (or network) is empty",
            "it names the knic Network",
        ));
    }
    let request = match command {
        Command::Add | Command::Check => {
            let args = parse_args(env.get("CNI_ARGS").map(String::as_str).unwrap_or(""))?;
            let pod_uid = args.get("K8S_POD_UID").filter(|v| !v.is_empty()).ok_or_else(|| {
                CniError::new(
                    code::INVALID_ENVIRONMENT,
                    "CNI_ARGS has no K8S_POD_UID",
                    "knic finds the pod's claim by the pod's UID; Multus and current runtimes pass it",
                )
            })?;
            let pod = format!(
                "{}/{}",
                args.get("K8S_POD_NAMESPACE")
                    .map(String::as_str)
                    .unwrap_or("?"),
                args.get("K8S_POD_NAME").map(String::as_str).unwrap_or("?")
            );
            Some(DoorRequest {
                command,
                pod_uid: pod_uid.clone(),
                pod,
                netns: required(env, "CNI_NETNS")?.to_owned(),
                ifname: required(env, "CNI_IFNAME")?.to_owned(),
                network: config.network().to_owned(),
            })
        }
        _ => None,
    };
    Ok(Invocation {
        command,
        version: config.cni_version,
        request,
    })
}

/// Sends `request` to the driver's socket and reads its one-line answer.
pub fn ask(
    socket: &Path,
    request: &DoorRequest,
    timeout: Duration,
) -> Result<DoorAnswer, CniError> {
    let unavailable = |what: &str, e: &dyn std::fmt::Display| {
        CniError::new(
            code::TRY_AGAIN_LATER,
            format!("the knic driver at {} {what}: {e}", socket.display()),
            "is the knic driver running on this node with the CNI door enabled (driver.cni.enabled)?",
        )
    };
    let mut stream =
        UnixStream::connect(socket).map_err(|e| unavailable("cannot be reached", &e))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| unavailable("cannot be used", &e))?;
    let mut line = serde_json::to_vec(request).map_err(|e| unavailable("request", &e))?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|e| unavailable("did not take the request", &e))?;
    let mut answer = String::new();
    BufReader::new(std::io::Read::take(&stream, MAX_ANSWER))
        .read_line(&mut answer)
        .map_err(|e| unavailable("did not answer", &e))?;
    serde_json::from_str(&answer).map_err(|e| unavailable("answered something unreadable", &e))
}

/// Runs one call: what to print on stdout and whether it succeeded (exit 0).
pub fn run(env: &BTreeMap<String, String>, stdin: &[u8], socket: &Path) -> (String, bool) {
    let fail = |version: &str, mut e: CniError| {
        e.cni_version = version.to_owned();
        (serde_json::to_string(&e).unwrap_or_default(), false)
    };
    let call = match parse(env, stdin) {
        Ok(call) => call,
        Err(e) => return fail("1.1.0", e),
    };
    let version = call.version.clone();
    match (call.command, call.request) {
        (Command::Version, _) => (version_info().to_string(), true),
        // The claim's devices leave with NRI's StopPodSandbox; the driver's sweeps collect.
        (Command::Del | Command::Gc, _) => (String::new(), true),
        (Command::Status, _) => match UnixStream::connect(socket) {
            Ok(_) => (String::new(), true),
            Err(e) => fail(
                &version,
                CniError::new(
                    code::NOT_AVAILABLE,
                    format!(
                        "the knic driver at {} cannot be reached: {e}",
                        socket.display()
                    ),
                    "",
                ),
            ),
        },
        (command, Some(request)) => match ask(socket, &request, DOOR_TIMEOUT) {
            Ok(DoorAnswer::Attached(a)) if command == Command::Add => {
                (render(&version, &request.netns, &a).to_string(), true)
            }
            Ok(DoorAnswer::Attached(_)) => (String::new(), true),
            Ok(DoorAnswer::Failed(e)) => fail(&version, e),
            Err(e) => fail(&version, e),
        },
        (_, None) => fail(
            &version,
            CniError::new(code::INVALID_ENVIRONMENT, "nothing to ask the driver", ""),
        ),
    }
}

/// The process environment's CNI variables.
pub fn environment() -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("CNI_"))
        .collect()
}

#[cfg(test)]
mod tests;
