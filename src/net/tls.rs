//! TLS for https:// sources, with rustls: certificate verification is always
//! on, against the system's roots or a CA bundle given by `ca_bundle` (or
//! `AWS_CA_BUNDLE`, as the AWS SDKs read it). The configuration is built once
//! per loader, at the first https connection, and serves both backends: the
//! thread backend's rustls streams and the io_uring backend's unbuffered
//! handshakes (`fetch/uring_tls.rs`), whose sessions go to the kernel's
//! TLS where it has it and `kernel_tls` allows (`fetch/ktls.rs`). It counts
//! the sessions by where their records were opened.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, RootCertStore};

/// Lazily built client configuration, shared by a loader's connections,
/// and where their sessions' records are opened.
#[derive(Debug, Default)]
pub struct TlsSetup {
    ca_bundle: Option<PathBuf>,
    config: OnceLock<Result<Arc<ClientConfig>, String>>,
    /// Sessions go to the kernel's TLS where it has it (`kernel_tls`);
    /// turned off for the loader when the kernel broke a session.
    kernel: AtomicBool,
    kernel_off: OnceLock<String>,
    /// Sessions whose records the kernel opened, and those opened here.
    /// Relaxed: statistics.
    pub sessions_kernel: AtomicU64,
    pub sessions_user: AtomicU64,
}

impl TlsSetup {
    pub fn new(ca_bundle: Option<PathBuf>, kernel_tls: bool) -> TlsSetup {
        TlsSetup {
            ca_bundle,
            config: OnceLock::new(),
            kernel: AtomicBool::new(kernel_tls),
            ..TlsSetup::default()
        }
    }

    /// Whether a session opened now goes to the kernel's TLS, where it has it.
    pub fn kernel_wanted(&self) -> bool {
        self.kernel.load(Ordering::Relaxed)
    }

    /// The kernel broke a session (`why`): the loader's later sessions
    /// stay in user space.
    pub fn kernel_failed(&self, why: &str) {
        self.kernel.store(false, Ordering::Relaxed);
        let _ = self
            .kernel_off
            .set(format!("kernel TLS: off for this loader after {why}"));
    }

    /// Where the sessions' records were opened: "none" (no https session
    /// yet), "kernel", "user" or "kernel+user".
    pub fn records(&self) -> &'static str {
        let k = self.sessions_kernel.load(Ordering::Relaxed) > 0;
        let u = self.sessions_user.load(Ordering::Relaxed) > 0;
        match (k, u) {
            (false, false) => "none",
            (true, false) => "kernel",
            (false, true) => "user",
            (true, true) => "kernel+user",
        }
    }

    /// For the stats' notes: why sessions that could have gone to the
    /// kernel did not, given the kernel's refusal of kernel TLS in this
    /// process (`refused`), if any.
    pub fn notes(&self, refused: Option<&str>) -> Vec<String> {
        let mut notes = Vec::new();
        let user = self.sessions_user.load(Ordering::Relaxed) > 0;
        if let Some(r) =
            refused.filter(|_| user && self.kernel_off.get().is_none() && self.kernel_wanted())
        {
            notes.push(r.to_string());
        }
        notes.extend(self.kernel_off.get().cloned());
        notes
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
