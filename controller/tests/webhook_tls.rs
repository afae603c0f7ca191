//! The webhook over real TLS: certificates made by the `openssl` CLI, a real client (Python's
//! `ssl`, which is OpenSSL, verifying the CA and the host name) against the running server,
//! the certificate renewed on disk the way the kubelet updates a Secret volume, and requests
//! no apiserver would send refused with their reasons.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use knic_controller::webhook::{Certificates, Limits, Server, Snapshot};
use serde_json::{Value, json};

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/webhook_client.py");

fn openssl(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .context("running the openssl CLI (Debian package openssl)")?;
    ensure!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A CA `<name>-ca.crt` and a server pair `<name>.crt`/`<name>.key` it signed, for `localhost`
/// and 127.0.0.1, with the server certificate's common name `cn`.
fn issue(dir: &Path, name: &str, cn: &str) -> anyhow::Result<()> {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let ca_key = format!("{name}-ca.key");
    let ca_crt = format!("{name}-ca.crt");
    let mut args = vec!["req", "-x509"];
    args.extend(ec);
    args.extend([
        "-keyout",
        &ca_key,
        "-out",
        &ca_crt,
        "-days",
        "2",
        "-subj",
        "/CN=knic test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(dir, &args)?;
    let key = format!("{name}.key");
    let csr = format!("{name}.csr");
    let subject = format!("/CN={cn}");
    let mut args = vec!["req"];
    args.extend(ec);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
    openssl(dir, &args)?;
    let ext = format!("{name}.ext");
    std::fs::write(
        dir.join(&ext),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n\
         subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n",
    )?;
    let crt = format!("{name}.crt");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "1",
            "-extfile",
            &ext,
        ],
    )
}

/// A Secret volume as the kubelet lays it out: `tls.crt` and `tls.key` are symlinks through
/// `..data`, itself a symlink to a timestamped directory; an update writes a new directory
/// and swaps `..data` in one rename.
struct SecretVolume {
    dir: PathBuf,
    generation: u32,
}

impl SecretVolume {
    fn new(dir: PathBuf, cert: &Path, key: &Path) -> anyhow::Result<SecretVolume> {
        std::fs::create_dir_all(&dir)?;
        let mut volume = SecretVolume { dir, generation: 0 };
        volume.update(cert, key)?;
        std::os::unix::fs::symlink("..data/tls.crt", volume.dir.join("tls.crt"))?;
        std::os::unix::fs::symlink("..data/tls.key", volume.dir.join("tls.key"))?;
        Ok(volume)
    }

    fn update(&mut self, cert: &Path, key: &Path) -> anyhow::Result<()> {
        self.generation += 1;
        let version = format!("..2026_11_23_00_00_0{}", self.generation);
        let target = self.dir.join(&version);
        std::fs::create_dir(&target)?;
        std::fs::copy(cert, target.join("tls.crt"))?;
        std::fs::copy(key, target.join("tls.key"))?;
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &tmp)?;
        std::fs::rename(&tmp, self.dir.join("..data"))?;
        Ok(())
    }

    fn cert(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }
    fn key(&self) -> PathBuf {
        self.dir.join("tls.key")
    }
}

/// A running server on 127.0.0.1 with `limits`, stopped when the returned sender is dropped.
async fn start(
    certificates: Arc<Certificates>,
    limits: Limits,
) -> anyhow::Result<(u16, tokio::sync::oneshot::Sender<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let server = Server::new(
        listener,
        certificates,
        Arc::new(Snapshot::default()),
        limits,
    )?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.serve(async {
        let _ = stopped.await;
    }));
    Ok((port, stop))
}

/// One request from the Python client: `{"status", "body", "peer_cn"}` or `{"error"}`.
async fn call(
    ca: &Path,
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Path>,
    chunked: bool,
) -> anyhow::Result<Value> {
    let mut cmd = tokio::process::Command::new("python3");
    cmd.arg(CLIENT)
        .arg(ca)
        .arg("localhost")
        .arg(port.to_string())
        .arg(method)
        .arg(path);
    if let Some(body) = body {
        cmd.arg(body);
    }
    if chunked {
        cmd.arg("--chunked");
    }
    let out = cmd.output().await.context("running python3")?;
    ensure!(
        out.status.success(),
        "the client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn review(object: Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "b1f4c3e2-0000-4000-8000-000000000001",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "DeviceClass"},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "deviceclasses"},
        "operation": "CREATE", "userInfo": {"username": "admin"}, "object": object}})
}

fn device_class(mtu: u32) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "vf.knic.dev"},
        "spec": {"config": [{"opaque": {"driver": "knic.dev", "parameters": {
            "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
            "interface": {"mtu": mtu}}}}]}})
}

fn write_json(dir: &Path, name: &str, value: &Value) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec(value)?)?;
    Ok(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_are_answered_over_tls_to_a_verifying_client() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    issue(dir, "one", "knic-webhook-1")?;
    let certificates = Certificates::load(&dir.join("one.crt"), &dir.join("one.key"))?;
    let (port, _stop) = start(certificates, Limits::default()).await?;
    let ca = dir.join("one-ca.crt");

    let good = write_json(dir, "good.json", &review(device_class(9000)))?;
    let got = call(&ca, port, "POST", "/validate", Some(&good), false).await?;
    ensure!(got["status"] == 200, "{got}");
    ensure!(got["peer_cn"] == "knic-webhook-1", "{got}");
    let body: Value = serde_json::from_str(got["body"].as_str().context("body")?)?;
    ensure!(
        body == json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": "b1f4c3e2-0000-4000-8000-000000000001", "allowed": true}}),
        "{body}"
    );

    let bad = write_json(dir, "bad.json", &review(device_class(50)))?;
    let got = call(&ca, port, "POST", "/validate", Some(&bad), false).await?;
    ensure!(got["status"] == 200, "{got}");
    let body: Value = serde_json::from_str(got["body"].as_str().context("body")?)?;
    ensure!(
        body["response"]
            == json!({"uid": "b1f4c3e2-0000-4000-8000-000000000001", "allowed": false,
                "status": {"code": 422, "reason": "Invalid", "message":
                    "spec.config: interface.mtu: must be between 68 and 65535, got 50"}}),
        "{body}"
    );

    // A client that trusts another CA does not get through.
    issue(dir, "other", "someone-else")?;
    let got = call(
        &dir.join("other-ca.crt"),
        port,
        "POST",
        "/validate",
        Some(&good),
        false,
    )
    .await?;
    let error = got["error"].as_str().unwrap_or_default();
    ensure!(
        error.starts_with("SSLCertVerificationError")
            && error.contains("certificate verify failed"),
        "{got}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_malformed_and_misrouted_requests_are_refused() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    issue(dir, "one", "knic-webhook-1")?;
    let certificates = Certificates::load(&dir.join("one.crt"), &dir.join("one.key"))?;
    let limits = Limits {
        max_body: 64 << 10,
        ..Limits::default()
    };
    let (port, _stop) = start(certificates, limits).await?;
    let ca = dir.join("one-ca.crt");

    // A review padded past the bound: refused by its Content-Length, and when chunked (no
    // length up front) once the bound is crossed.
    let mut padded = review(device_class(9000));
    padded["request"]["object"]["metadata"]["annotations"] =
        json!({"padding": "x".repeat(100 << 10)});
    let big = write_json(dir, "big.json", &padded)?;
    for chunked in [false, true] {
        let got = call(&ca, port, "POST", "/validate", Some(&big), chunked).await?;
        ensure!(
            got["status"] == 413 && got["body"] == "an AdmissionReview is at most 65536 bytes\n",
            "chunked {chunked}: {got}"
        );
    }

    let broken = dir.join("broken.json");
    std::fs::write(
        &broken,
        b"{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": ",
    )?;
    let got = call(&ca, port, "POST", "/validate", Some(&broken), false).await?;
    ensure!(
        got["status"] == 400
            && got["body"]
                == "malformed AdmissionReview: EOF while parsing a value at line 1 column 46",
        "{got}"
    );

    let v1beta1 = write_json(
        dir,
        "v1beta1.json",
        &json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
            "request": {"uid": "u"}}),
    )?;
    let got = call(&ca, port, "POST", "/validate", Some(&v1beta1), false).await?;
    ensure!(
        got["status"] == 400
            && got["body"]
                == "expected an admission.k8s.io/v1 AdmissionReview, got \
                    \"admission.k8s.io/v1beta1\" \"AdmissionReview\"",
        "{got}"
    );

    let got = call(&ca, port, "GET", "/validate", None, false).await?;
    ensure!(
        got["status"] == 405 && got["body"] == "/validate takes POST\n",
        "{got}"
    );
    let good = write_json(dir, "good.json", &review(device_class(9000)))?;
    let got = call(&ca, port, "POST", "/mutate", Some(&good), false).await?;
    ensure!(
        got["status"] == 404 && got["body"] == "only /validate is served\n",
        "{got}"
    );

    // Still serving after all that.
    let got = call(&ca, port, "POST", "/validate", Some(&good), false).await?;
    ensure!(got["status"] == 200, "{got}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_is_served_without_a_restart() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    issue(dir, "one", "knic-webhook-1")?;
    issue(dir, "two", "knic-webhook-2")?;
    let mut volume = SecretVolume::new(
        dir.join("secret"),
        &dir.join("one.crt"),
        &dir.join("one.key"),
    )?;
    let certificates = Certificates::load(&volume.cert(), &volume.key())?;
    let (stop_watch, stopped) = tokio::sync::oneshot::channel::<()>();
    let watch = tokio::spawn(
        certificates
            .clone()
            .watch(Duration::from_millis(50), async {
                let _ = stopped.await;
            }),
    );
    let (port, _stop) = start(certificates.clone(), Limits::default()).await?;
    let good = write_json(dir, "good.json", &review(device_class(9000)))?;
    let (ca_one, ca_two) = (dir.join("one-ca.crt"), dir.join("two-ca.crt"));
    let got = call(&ca_one, port, "POST", "/validate", Some(&good), false).await?;
    ensure!(got["peer_cn"] == "knic-webhook-1", "{got}");

    // Midway through a rotation (new certificate, old key) the old pair stays served.
    let mut half = SecretVolume::new(dir.join("half"), &dir.join("two.crt"), &dir.join("one.key"))?;
    let mismatched = Certificates::load(&half.cert(), &half.key())
        .err()
        .context("a certificate with another's key must not load")?;
    ensure!(
        mismatched.to_string()
            == format!(
                "webhook certificate {}: does not fit the certificate: keys may not be \
                 consistent: KeyMismatch",
                half.key().display()
            ),
        "{mismatched}"
    );
    half.update(&dir.join("one.crt"), &dir.join("one.key"))?;
    ensure!(Certificates::load(&half.cert(), &half.key()).is_ok());

    // The kubelet swaps the volume to the renewed pair: the next handshakes get it.
    volume.update(&dir.join("two.crt"), &dir.join("two.key"))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let got = loop {
        let got = call(&ca_two, port, "POST", "/validate", Some(&good), false).await?;
        if got["status"] == 200 || tokio::time::Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    ensure!(
        got["status"] == 200 && got["peer_cn"] == "knic-webhook-2",
        "the renewed certificate was not served within 10 s: {got}"
    );
    let old = call(&ca_one, port, "POST", "/validate", Some(&good), false).await?;
    ensure!(
        old["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("SSLCertVerificationError"),
        "{old}"
    );
    // Unchanged files are not reloaded.
    ensure!(!certificates.reload()?);
    let _ = stop_watch.send(());
    watch.await?;
    Ok(())
}

#[test]
fn an_unusable_certificate_is_refused_at_start_with_the_reason() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    issue(dir, "one", "knic-webhook-1")?;
    let (cert, key) = (dir.join("one.crt"), dir.join("one.key"));
    let missing = dir.join("missing.crt");
    let text = |result: knic_controller::Result<Arc<Certificates>>| {
        result.err().map(|e| e.to_string()).unwrap_or_default()
    };
    ensure!(
        text(Certificates::load(&missing, &key))
            == format!(
                "webhook certificate {}: No such file or directory (os error 2)",
                missing.display()
            )
    );
    ensure!(
        text(Certificates::load(dir, &key))
            == format!("webhook certificate {}: not a regular file", dir.display())
    );
    let empty = dir.join("empty.crt");
    std::fs::write(&empty, "not a certificate\n")?;
    ensure!(
        text(Certificates::load(&empty, &key))
            == format!(
                "webhook certificate {}: no CERTIFICATE block",
                empty.display()
            )
    );
    ensure!(
        text(Certificates::load(&cert, &cert))
            == format!(
                "webhook certificate {}: no usable private key: no items found",
                cert.display()
            )
    );
    let huge = dir.join("huge.crt");
    std::fs::write(&huge, vec![b'A'; (1 << 20) + 1])?;
    ensure!(
        text(Certificates::load(&huge, &key))
            == format!(
                "webhook certificate {}: larger than 1048576 bytes",
                huge.display()
            )
    );
    ensure!(Certificates::load(&cert, &key).is_ok());
    Ok(())
}

/// A rustls client trusting `ca`, connected to the server on 127.0.0.1 as `localhost`.
async fn rustls_client(
    ca: &Path,
    port: u16,
) -> anyhow::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_file(ca)?)?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost")?;
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    issue(dir, "one", "knic-webhook-1")?;
    let certificates = Certificates::load(&dir.join("one.crt"), &dir.join("one.key"))?;
    let limits = Limits {
        handshake_timeout: Duration::from_millis(300),
        body_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let (port, _stop) = start(certificates, limits).await?;
    let within = Duration::from_secs(5);

    // A connection that never starts its handshake is closed.
    let mut idle = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let mut buf = Vec::new();
    let n = tokio::time::timeout(within, idle.read_to_end(&mut buf))
        .await
        .context("a silent connection was kept open")??;
    ensure!(n == 0, "{n} bytes to a client that said nothing");

    // Headers promising a body that never comes: 408, then the connection is closed.
    let mut tls = rustls_client(&dir.join("one-ca.crt"), port).await?;
    tls.write_all(
        b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"apiVersion\"",
    )
    .await?;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(within, tls.read_to_end(&mut answer)).await;
    ensure!(read.is_ok(), "a trickling body kept the connection open");
    let answer = String::from_utf8_lossy(&answer);
    ensure!(
        answer.starts_with("HTTP/1.1 408 Request Timeout\r\n")
            && answer.ends_with("the body did not arrive within 300ms\n"),
        "{answer}"
    );

    // Headers that never finish: closed too.
    let mut tls = rustls_client(&dir.join("one-ca.crt"), port).await?;
    tls.write_all(b"POST /validate HTTP/1.1\r\nHost: loc")
        .await?;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(within, tls.read_to_end(&mut answer)).await;
    ensure!(read.is_ok(), "unfinished headers kept the connection open");
    let answer = String::from_utf8_lossy(&answer);
    ensure!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    Ok(())
}
