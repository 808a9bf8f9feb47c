//! TLS for https:// sources, with rustls: certificate verification is always
//! on, against the system's roots or a CA bundle given by `ca_bundle` (or
//! `AWS_CA_BUNDLE`, as the AWS SDKs read it). The configuration is built once
//! per loader, at the first https connection, and serves both backends: the
//! thread backend's rustls streams and the io_uring backend's unbuffered
//! handshakes (`fetch/uring_tls.rs`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, RootCertStore};

/// Lazily built client configuration, shared by a loader's connections.
#[derive(Debug, Default)]
pub struct TlsSetup {
    ca_bundle: Option<PathBuf>,
    config: OnceLock<Result<Arc<ClientConfig>, String>>,
}

impl TlsSetup {
    pub fn new(ca_bundle: Option<PathBuf>) -> TlsSetup {
        TlsSetup {
            ca_bundle,
            config: OnceLock::new(),
        }
    }

    /// The client configuration, or why it cannot be built.
    pub fn config(&self) -> Result<Arc<ClientConfig>, String> {
        self.config
            .get_or_init(|| build(self.ca_bundle.as_deref()))
            .clone()
    }
}

fn build(ca_bundle: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    match ca_bundle {
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("`ca_bundle` {}: {e}", path.display()))?
                .collect::<Result<_, _>>()
                .map_err(|e| format!("`ca_bundle` {}: {e}", path.display()))?;
            if certs.is_empty() {
                return Err(format!(
                    "`ca_bundle` {} holds no PEM certificate",
                    path.display()
                ));
            }
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| format!("`ca_bundle` {}: {e}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(
                    "no system CA certificates found; set `ca_bundle` to a PEM file".into(),
                );
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // The io_uring path takes the traffic keys out of rustls once the
    // handshake is done and opens the records in place in the arena
    // (`fetch/uring_tls.rs`); the keys stay in this process.
    config.enable_secret_extraction = true;
    Ok(Arc::new(config))
}
