//! The webhook's serving certificate: read from PEM files mounted from a Secret and swapped in
//! when they change, so a renewed certificate (cert-manager, or a chart upgrade) is served
//! without restarting the controller.
//!
//! The files are polled by content rather than watched: the kubelet updates a Secret volume by
//! swapping a symlink to a new directory, which inotify on the files themselves never sees,
//! and a poll every few seconds costs two small reads.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::{Error, Result};

/// Larger than any certificate chain or key a Secret holds (a Secret is at most 1 MiB); a path
/// pointing at something else is refused instead of read whole.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// The certificate and key currently served, with the bytes they came from.
#[derive(Debug)]
struct Loaded {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    key: Arc<CertifiedKey>,
}

/// The served certificate; a rustls certificate resolver, so a reload takes effect for the next
/// handshake while connections already open keep theirs.
#[derive(Debug)]
pub struct Certificates {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<Loaded>>,
}

fn certificate_error(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Certificate {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// A regular file of at most [`MAX_PEM_BYTES`].
fn read_pem(path: &Path) -> Result<Vec<u8>> {
    let file = std::fs::File::open(path).map_err(|e| certificate_error(path, e))?;
    let meta = file.metadata().map_err(|e| certificate_error(path, e))?;
    if !meta.is_file() {
        return Err(certificate_error(path, "not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| certificate_error(path, e))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(certificate_error(
            path,
            format!("larger than {MAX_PEM_BYTES} bytes"),
        ));
    }
    Ok(bytes)
}

impl Certificates {
    /// Loads the pair; an unreadable, malformed or mismatched pair is an error, so the
    /// controller does not start serving a webhook nobody can connect to.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Certificates>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let loaded = load(cert, key, &provider)?;
        Ok(Arc::new(Certificates {
            cert: cert.to_owned(),
            key: key.to_owned(),
            provider,
            current: RwLock::new(Arc::new(loaded)),
        }))
    }

    /// Reads the files again and serves them if they changed; `Ok(false)` when unchanged. A
    /// broken new pair (say, the certificate written before the key) is an error and the old
    /// pair stays served, so a half-finished rotation never takes the webhook down.
    pub fn reload(&self) -> Result<bool> {
        let cert_pem = read_pem(&self.cert)?;
        let key_pem = read_pem(&self.key)?;
        let current = self.current();
        if cert_pem == current.cert_pem && key_pem == current.key_pem {
            return Ok(false);
        }
        let loaded = parse(&self.cert, &self.key, cert_pem, key_pem, &self.provider)?;
        match self.current.write() {
            Ok(mut slot) => *slot = Arc::new(loaded),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(loaded),
        }
        Ok(true)
    }

    /// Polls the files every `interval` until `shutdown` completes; failures are logged and
    /// retried, as the kubelet may be midway through updating the volume.
    pub async fn watch(self: Arc<Self>, interval: Duration, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut failing = false;
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(interval) => {}
            }
            let this = self.clone();
            match tokio::task::spawn_blocking(move || this.reload()).await {
                Ok(Ok(true)) => {
                    failing = false;
                    tracing::info!(cert = %self.cert.display(), "webhook certificate reloaded");
                }
                Ok(Ok(false)) => failing = false,
                Ok(Err(e)) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "webhook certificate not reloaded; serving the previous one");
                }
                Ok(Err(_)) => {}
                Err(e) => tracing::warn!(error = %e, "webhook certificate reload task failed"),
            }
        }
    }

    /// A TLS configuration serving these certificates (HTTP/1.1 only: admission reviews are
    /// single requests, and the apiserver falls back to it).
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| certificate_error(&self.cert, e))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    fn current(&self) -> Arc<Loaded> {
        match self.current.read() {
            Ok(slot) => slot.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current().key.clone())
    }
}

fn load(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<Loaded> {
    let cert_pem = read_pem(cert)?;
    let key_pem = read_pem(key)?;
    parse(cert, key, cert_pem, key_pem, provider)
}

fn parse(
    cert: &Path,
    key: &Path,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    provider: &CryptoProvider,
) -> Result<Loaded> {
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| certificate_error(cert, format!("not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err(certificate_error(cert, "no CERTIFICATE block"));
    }
    let private = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| certificate_error(key, format!("no usable private key: {e}")))?;
    let certified = CertifiedKey::from_der(chain, private, provider)
        .map_err(|e| certificate_error(key, format!("does not fit the certificate: {e}")))?;
    Ok(Loaded {
        cert_pem,
        key_pem,
        key: Arc::new(certified),
    })
}
