//! A KNI client generated from the KNI project's own `api.proto` (`shared/fixtures/kni`), by
//! Python's grpcio-tools at the start of each client (`e2e/python/kni_client.py`): the tests
//! talk to knic's socket the way a runtime built against upstream KNI would, so a drift of
//! knic's own .proto or of its serving (authority, framing, limits) shows up as a failure.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Where the upstream `api.proto` is: `shared/fixtures/kni` beside the checkout.
pub fn upstream_proto_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/kni")
}

/// A refusal: the gRPC status code's name and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `FAILED_PRECONDITION`, `INVALID_ARGUMENT`, …
    pub code: String,
    /// The status message.
    pub details: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.details)
    }
}

/// One Python client process on one socket; killed when dropped.
pub struct KniClient {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// The grpcio version the client runs.
    pub grpcio: String,
}

impl KniClient {
    /// Starts a client for `socket`, its stubs generated from the upstream .proto.
    pub async fn connect(socket: &Path) -> anyhow::Result<KniClient> {
        let proto = upstream_proto_dir();
        if !proto.join("api.proto").is_file() {
            bail!(
                "the upstream KNI api.proto is not at {} (put ../shared beside the checkout)",
                proto.display()
            );
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/kni_client.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(&proto)
            .arg(socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("running python3 (the KNI client tests need it)")?;
        let stdin = child.stdin.take().context("client stdin")?;
        let stdout = child.stdout.take().context("client stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .context("the Python KNI client did not start within 60 s")??;
        let Some(first) = first else {
            let out = child.wait_with_output().await?;
            bail!(
                "the Python KNI client exited ({}): {}\nthese tests need Python's grpcio and \
                 grpcio-tools: `python3 -m pip install grpcio==1.85.1 grpcio-tools==1.85.1` \
                 (e2e/run-tests.sh installs them)",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ready: Value = serde_json::from_str(&first)
            .with_context(|| format!("the client's first line: {first}"))?;
        let grpcio = ready["ready"].as_str().unwrap_or_default().to_owned();
        Ok(KniClient {
            child,
            stdin,
            lines,
            grpcio,
        })
    }

    /// Calls `method` with `request` (protobuf JSON, `.proto` field names); the response as
    /// JSON, or the refusal.
    pub async fn call(
        &mut self,
        method: &str,
        request: Value,
    ) -> anyhow::Result<Result<Value, Refusal>> {
        let line = json!({"method": method, "request": request}).to_string();
        self.stdin.write_all(line.as_bytes()).await?;
        self.stdin.write_all(b"\n").await?;
        self.stdin.flush().await?;
        let answer = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .with_context(|| format!("{method}: no answer within 60 s"))??;
        let Some(answer) = answer else {
            bail!(
                "{method}: the Python client exited: {:?}",
                self.child.try_wait()
            );
        };
        let answer: Value = serde_json::from_str(&answer)?;
        if let Some(ok) = answer.get("ok") {
            return Ok(Ok(ok.clone()));
        }
        Ok(Err(Refusal {
            code: answer["error"].as_str().unwrap_or_default().to_owned(),
            details: answer["details"].as_str().unwrap_or_default().to_owned(),
        }))
    }

    /// [`KniClient::call`] that must succeed.
    pub async fn ok(&mut self, method: &str, request: Value) -> anyhow::Result<Value> {
        match self.call(method, request).await? {
            Ok(v) => Ok(v),
            Err(refusal) => bail!("{method} refused: {refusal}"),
        }
    }

    /// [`KniClient::call`] that must be refused.
    pub async fn refused(&mut self, method: &str, request: Value) -> anyhow::Result<Refusal> {
        match self.call(method, request).await? {
            Ok(v) => bail!("{method} answered {v} where a refusal was expected"),
            Err(refusal) => Ok(refusal),
        }
    }
}
