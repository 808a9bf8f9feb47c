//! `ringfeed csi`: a CSI node driver, so that a Kubernetes pod gets a
//! `ringfeed mount` as a volume. The kubelet calls it over a Unix socket
//! with the CSI spec's gRPC (tonic's server, prost's messages of
//! `proto/csi.proto`, spec v1.3.0); it answers Identity and Node, with
//! static provisioning only (a PersistentVolume names its source; no
//! controller, no staging).
//!
//! - `volume.rs`: a publish's request into the `ringfeed mount` command,
//!   or a refusal naming the field, attribute or mount option — pure.
//! - `service.rs`: the gRPC services: each call checked, looked up, done,
//!   answered with its CSI code.
//! - `mounts.rs`: each volume a `ringfeed mount` process in a session of
//!   its own, outliving the driver; unmounting.
//! - `handover.rs`: a mount on the node engine's cache made by the driver
//!   and served by a process of the cache's owner.
//! - `check.rs`: `--check-volume`, a PersistentVolume checked as a publish
//!   of it would be, nothing served.
//! - `state.rs`: a record per published target under `--state-dir`, read
//!   back by a driver started again; `mountinfo.rs`: the kernel's mount
//!   table, which the records are checked against.
//!
//! This file parses the endpoint, takes the socket, finds the mounts an
//! earlier driver left, and serves until SIGTERM or SIGINT; the mounts
//! stay when it exits.

mod check;
mod handover;
mod mountinfo;
mod mounts;
pub(crate) mod proto;
mod service;
mod state;
mod volume;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::AnyResult;
use crate::args::CsiArgs;
use proto::identity_server::IdentityServer;
use proto::node_server::NodeServer;
use service::{DRIVER_NAME, Driver};

/// The socket path of a `--endpoint`: `unix:///PATH`, `unix:/PATH` or a
/// path (the forms the CSI sidecars accept).
fn socket_path(endpoint: &str) -> Result<PathBuf, String> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if path.contains("://") || !path.starts_with('/') {
        return Err(format!(
            "--endpoint `{endpoint}`: a Unix socket's absolute path (unix:///csi/csi.sock) is \
             all the kubelet speaks to a driver"
        ));
    }
    Ok(PathBuf::from(path))
}

/// Takes the socket at `path`: a socket left by a driver that is gone is
/// replaced; one a live driver listens on, or a file of another kind, is
/// refused.
fn listen(path: &Path) -> AnyResult<tokio::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(
                format!("--endpoint `{}` exists and is not a socket", path.display()).into(),
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(format!("another driver listens on `{}`", path.display()).into());
        }
        std::fs::remove_file(path)
            .map_err(|e| format!("cannot replace the old socket `{}`: {e}", path.display()))?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("socket directory `{}`: {e}", dir.display()))?;
    }
    let l = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| format!("cannot listen on `{}`: {e}", path.display()))?;
    l.set_nonblocking(true)?;
    Ok(tokio::net::UnixListener::from_std(l)?)
}

pub(crate) fn csi_cmd(a: CsiArgs) -> AnyResult<()> {
    if let Some(file) = &a.check_volume {
        return check::check_volume(file, a.cache_dir.as_deref());
    }
    if a.node_id.is_empty() || a.node_id.len() > volume::MAX_STRING {
        return Err(format!(
            "--node-id must be 1 to {} bytes (the node's name)",
            volume::MAX_STRING
        )
        .into());
    }
    let socket = socket_path(&a.endpoint)?;
    if let Some(dir) = &a.cache_dir
        && !dir.is_absolute()
    {
        return Err(format!("--cache-dir `{}` must be an absolute path", dir.display()).into());
    }
    let state = state::State::open(&a.state_dir)?;
    let node = volume::Node {
        cache_dir: a.cache_dir.clone(),
    };
    let (driver, lines) = Driver::recover(a.node_id.clone(), node, state)?;
    for l in &lines {
        eprintln!("ringfeed csi: {l}");
    }
    let driver = Arc::new(driver);
    // Calls are few and short (a publish waits on a blocking thread for
    // its mount): two threads serve them.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = listen(&socket)?;
        eprintln!(
            "ringfeed csi: {DRIVER_NAME} {} on node `{}` listening on {} (state {}{})",
            env!("CARGO_PKG_VERSION"),
            a.node_id,
            socket.display(),
            a.state_dir.display(),
            a.cache_dir
                .as_ref()
                .map(|d| format!(", cache {}", d.display()))
                .unwrap_or_default()
        );
        let stop = async {
            use tokio::signal::unix::{SignalKind, signal};
            let (mut term, mut int) = match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(t), Ok(i)) => (t, i),
                _ => return std::future::pending().await,
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            eprintln!("ringfeed csi: stopping (the mounts stay)");
        };
        let served = tonic::transport::Server::builder()
            .add_service(IdentityServer::new(Arc::clone(&driver)))
            .add_service(NodeServer::new(Arc::clone(&driver)))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                stop,
            )
            .await;
        let _ = std::fs::remove_file(&socket);
        served.map_err(|e| format!("serving on `{}`: {e}", socket.display()).into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_socket_paths() {
        for e in [
            "unix:///csi/csi.sock",
            "unix:/csi/csi.sock",
            "/csi/csi.sock",
        ] {
            assert_eq!(socket_path(e).unwrap(), Path::new("/csi/csi.sock"), "{e}");
        }
        for e in ["tcp://127.0.0.1:10000", "csi.sock", "unix://relative", ""] {
            let err = socket_path(e).unwrap_err();
            assert!(err.contains("absolute path"), "{e}: {err}");
        }
    }

    #[test]
    fn a_live_socket_or_another_file_is_never_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = listen(&file).unwrap_err().to_string();
        assert!(err.contains("is not a socket"), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"x");
        let sock = tmp.path().join("csi.sock");
        let live = listen(&sock).unwrap();
        let err = listen(&sock).unwrap_err().to_string();
        assert!(err.contains("another driver listens"), "{err}");
        // Gone: the old socket is replaced.
        drop(live);
        listen(&sock).unwrap();
    }
}
