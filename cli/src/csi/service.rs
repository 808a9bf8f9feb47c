//! The CSI services the kubelet calls: Identity (who the driver is,
//! whether it is ready) and Node (publish a volume on a target path,
//! unpublish it, the node's id). Each call is checked (`volume.rs`),
//! looked up against the records and the kernel's mount table, done on a
//! blocking thread (mounting waits for a process), and answered with the
//! CSI code its case has in the spec; one line per call goes to stderr.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tonic::{Code, Request, Response, Status};

use super::mountinfo;
use super::mounts;
use super::proto::identity_server::Identity;
use super::proto::node_server::Node;
use super::proto::*;
use super::state::{Record, State};
use super::volume::{self, Refusal};

/// The driver's name, as the CSIDriver object and the kubelet know it.
pub(crate) const DRIVER_NAME: &str = "csi.ringfeed.dev";

/// The device every FUSE mount opens: without it the driver is not ready.
const FUSE_DEVICE: &str = "/dev/fuse";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl From<Refusal> for Status {
    fn from(r: Refusal) -> Status {
        Status::new(r.code, r.message)
    }
}

/// The driver: its node, its records, the targets with a call in flight.
pub(crate) struct Driver {
    pub(crate) node_id: String,
    pub(crate) node: volume::Node,
    state: State,
    records: Mutex<HashMap<PathBuf, Record>>,
    busy: Mutex<HashSet<PathBuf>>,
}

/// A target claimed by one call; released when dropped.
struct Claim<'a> {
    driver: &'a Driver,
    target: PathBuf,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        lock(&self.driver.busy).remove(&self.target);
    }
}

impl Driver {
    /// The driver over `state`, its records checked against the kernel's
    /// mount table: a record whose mount is gone is dropped; the lines
    /// say what was found.
    pub(crate) fn recover(
        node_id: String,
        node: volume::Node,
        state: State,
    ) -> Result<(Driver, Vec<String>), super::state::StateError> {
        let (found, mut lines) = state.load()?;
        let mut records = HashMap::new();
        for (target, r) in found {
            match mountinfo::mounted(&target) {
                Ok(Some(e)) if e.is_ringfeed() => {
                    let how = if mounts::alive(&r) {
                        format!("serving (pid {})", r.pid)
                    } else {
                        "its process is gone: unpublish unmounts it, a publish mounts it again"
                            .to_string()
                    };
                    lines.push(format!(
                        "found volume `{}` on `{}`: {how}",
                        r.volume_id,
                        target.display()
                    ));
                    records.insert(target, r);
                }
                other => {
                    lines.push(format!(
                        "volume `{}` on `{}` is no longer mounted ({}): record dropped",
                        r.volume_id,
                        target.display(),
                        match other {
                            Ok(Some(e)) => format!("a `{}` mount is there", e.fstype),
                            Ok(None) => "nothing there".into(),
                            Err(e) => e.to_string(),
                        }
                    ));
                    let _ = state.remove(&target);
                }
            }
        }
        Ok((
            Driver {
                node_id,
                node,
                state,
                records: Mutex::new(records),
                busy: Mutex::new(HashSet::new()),
            },
            lines,
        ))
    }

    /// Claims `target` for one call: another call on it at the same
    /// time is `ABORTED`, as the spec asks.
    fn claim(&self, target: &Path) -> Result<Claim<'_>, Refusal> {
        if !lock(&self.busy).insert(target.to_path_buf()) {
            return Err(Refusal::new(
                Code::Aborted,
                format!(
                    "a call on target_path `{}` is in progress",
                    target.display()
                ),
            ));
        }
        Ok(Claim {
            driver: self,
            target: target.to_path_buf(),
        })
    }

    /// Publishes: mounts `plan` on its target, or finds it there already.
    fn publish(&self, p: &volume::Plan) -> Result<&'static str, Refusal> {
        let _claim = self.claim(&p.target)?;
        let parent = mounts::parent(&p.target);
        if !parent.is_dir() {
            return Err(Refusal::new(
                Code::FailedPrecondition,
                format!(
                    "the parent of target_path, `{}`, is not a directory (the kubelet makes it)",
                    parent.display()
                ),
            ));
        }
        let there = mountinfo::mounted(&p.target)
            .map_err(|e| Refusal::new(Code::Internal, format!("/proc/self/mountinfo: {e}")))?;
        let record = lock(&self.records).get(&p.target).cloned();
        match (there, record) {
            (Some(e), _) if !e.is_ringfeed() => {
                return Err(Refusal::new(
                    Code::FailedPrecondition,
                    format!(
                        "target_path `{}` holds a `{}` mount that is not this driver's",
                        p.target.display(),
                        e.fstype
                    ),
                ));
            }
            (Some(_), Some(r)) if r.volume_id != p.volume_id => {
                return Err(Refusal::new(
                    Code::AlreadyExists,
                    format!(
                        "target_path `{}` holds volume `{}`, not `{}`",
                        p.target.display(),
                        r.volume_id,
                        p.volume_id
                    ),
                ));
            }
            (Some(_), Some(r)) if r.args != p.args => {
                return Err(Refusal::new(
                    Code::AlreadyExists,
                    format!(
                        "volume `{}` is published at `{}` with other arguments ({}), not these \
                         ({})",
                        p.volume_id,
                        p.target.display(),
                        r.args[1..].join(" "),
                        p.args[1..].join(" ")
                    ),
                ));
            }
            (Some(_), Some(r)) => {
                if mounts::alive(&r) && mounts::answers(&p.target) {
                    return Ok("already published");
                }
                // Its process is gone (the node's driver container was
                // restarted, or it was killed): mounted again.
                eprintln!(
                    "ringfeed csi: the mount of `{}` on `{}` no longer answers: mounting it again",
                    r.volume_id,
                    p.target.display()
                );
                mounts::stop(&p.target, Some(&r)).map_err(|e| Refusal::new(Code::Internal, e))?;
            }
            (Some(e), None) => {
                return Err(Refusal::new(
                    Code::AlreadyExists,
                    format!(
                        "target_path `{}` holds a ringfeed mount of `{}` with no record of its \
                         volume",
                        p.target.display(),
                        e.source
                    ),
                ));
            }
            (None, Some(_)) => {
                lock(&self.records).remove(&p.target);
            }
            (None, None) => {}
        }
        self.look_at_source(p)?;
        let log = self.state.log_path(&p.target);
        let r = mounts::start(p, &log).map_err(|e| {
            Refusal::new(
                Code::Internal,
                format!("mounting `{}` on `{}`: {e}", p.source, p.target.display()),
            )
        })?;
        if let Err(e) = self.state.save(&r) {
            // Unrecorded, a restarted driver could not tell whose it is.
            let _ = mounts::stop(&p.target, Some(&r));
            return Err(Refusal::new(Code::Internal, e.to_string()));
        }
        lock(&self.records).insert(p.target.clone(), r);
        Ok("mounted")
    }

    /// Lists the volume's source once, as its mount will: a bucket that
    /// does not exist is `NOT_FOUND`, a denied one `PERMISSION_DENIED`.
    fn look_at_source(&self, p: &volume::Plan) -> Result<(), Refusal> {
        let cfg =
            ringfeed::Config::for_objects(&serde_json::Value::Object(p.config.clone()).to_string())
                .map_err(|e| {
                    Refusal::new(
                        Code::InvalidArgument,
                        format!("volume `{}`: {e}", p.volume_id),
                    )
                })?;
        ringfeed::mount::Fs::probe(&p.source, &cfg).map_err(|e| source_refusal(&p.source, &e))
    }

    /// Unpublishes `target`: unmounts what this driver mounted there.
    fn unpublish(&self, volume_id: &str, target: &Path) -> Result<&'static str, Refusal> {
        let _claim = self.claim(target)?;
        let there = mountinfo::mounted(target)
            .map_err(|e| Refusal::new(Code::Internal, format!("/proc/self/mountinfo: {e}")))?;
        let record = lock(&self.records).get(target).cloned();
        if let Some(e) = &there
            && !e.is_ringfeed()
        {
            return Err(Refusal::new(
                Code::FailedPrecondition,
                format!(
                    "target_path `{}` holds a `{}` mount that is not this driver's: left alone",
                    target.display(),
                    e.fstype
                ),
            ));
        }
        if let Some(r) = &record
            && r.volume_id != volume_id
        {
            return Err(Refusal::new(
                Code::NotFound,
                format!(
                    "volume `{volume_id}` is not published at `{}` (volume `{}` is)",
                    target.display(),
                    r.volume_id
                ),
            ));
        }
        mounts::stop(target, record.as_ref()).map_err(|e| Refusal::new(Code::Internal, e))?;
        self.state
            .remove(target)
            .map_err(|e| Refusal::new(Code::Internal, e.to_string()))?;
        lock(&self.records).remove(target);
        Ok(if there.is_some() {
            "unmounted"
        } else {
            "not mounted"
        })
    }
}

/// The CSI code of a source that cannot be listed.
fn source_refusal(source: &str, e: &ringfeed::Error) -> Refusal {
    use ringfeed::Error as E;
    let code = match e {
        E::Url { .. } => Code::InvalidArgument,
        E::S3 { status: 404, .. } => Code::NotFound,
        E::S3 {
            status: 401 | 403, ..
        } => Code::PermissionDenied,
        E::Hub { status: 404, .. } => Code::NotFound,
        E::Http { message, .. } if message.contains("404") => Code::NotFound,
        E::Http { message, .. } if message.contains("403") || message.contains("401") => {
            Code::PermissionDenied
        }
        E::Credentials(_) => Code::FailedPrecondition,
        E::Config(_) => Code::InvalidArgument,
        _ => Code::Unavailable,
    };
    let what = if code == Code::InvalidArgument {
        "volume attribute `source`"
    } else {
        "the volume's source"
    };
    Refusal::new(
        code,
        format!(
            "{what} `{}` cannot be listed: {e}",
            ringfeed::redact::url(source)
        ),
    )
}

/// Says one call and its answer on stderr.
fn said<T>(
    call: &str,
    about: &str,
    r: &Result<&'static str, Refusal>,
    ok: T,
) -> Result<Response<T>, Status> {
    match r {
        Ok(how) => {
            eprintln!("ringfeed csi: {call} {about}: ok ({how})");
            Ok(Response::new(ok))
        }
        Err(e) => {
            eprintln!("ringfeed csi: {call} {about}: {:?}: {}", e.code, e.message);
            Err(Status::from(e.clone()))
        }
    }
}

/// Runs `f` on a blocking thread (mounting waits on a process).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Refusal> + Send + 'static,
) -> Result<T, Refusal> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(Refusal::new(
            Code::Internal,
            format!("the call's thread: {e}"),
        ))
    })
}

#[tonic::async_trait]
impl Identity for Arc<Driver> {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        // A node plugin alone: no controller service, no topology.
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![],
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        if !Path::new(FUSE_DEVICE).exists() {
            return Err(Status::failed_precondition(format!(
                "{FUSE_DEVICE} is missing: the driver's container needs the host's /dev/fuse"
            )));
        }
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for Arc<Driver> {
    async fn node_publish_volume(
        &self,
        req: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let r = req.into_inner();
        let about = format!("volume `{}` on `{}`", r.volume_id, r.target_path);
        let plan = volume::plan(
            &volume::Publish {
                volume_id: &r.volume_id,
                target_path: &r.target_path,
                capability: r.volume_capability.as_ref(),
                readonly: r.readonly,
                context: &r.volume_context,
            },
            &self.node,
        );
        let driver = Arc::clone(self);
        let done = match plan {
            Ok(plan) => blocking(move || driver.publish(&plan)).await,
            Err(e) => Err(e),
        };
        said(
            "NodePublishVolume",
            &about,
            &done,
            NodePublishVolumeResponse {},
        )
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let r = req.into_inner();
        let about = format!("volume `{}` on `{}`", r.volume_id, r.target_path);
        let checked =
            volume::volume_id(&r.volume_id).and_then(|()| volume::target_path(&r.target_path));
        let driver = Arc::clone(self);
        let done = match checked {
            Ok(target) => blocking(move || driver.unpublish(&r.volume_id, &target)).await,
            Err(e) => Err(e),
        };
        said(
            "NodeUnpublishVolume",
            &about,
            &done,
            NodeUnpublishVolumeResponse {},
        )
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        // No staging (a mount per target), no volume stats (an object
        // store has no size to fill), no expansion.
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            // No bound of the driver's: each volume is a process.
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}
