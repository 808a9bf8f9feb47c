//! `ringfeed csi` driven as the kubelet drives a CSI node driver: a gRPC
//! client over the driver's Unix socket (the CSI spec's own messages,
//! generated from `proto/csi.proto` as the driver's are), volumes of the
//! tests' S3-compatible server (`examples/s3_server.rs`) published on
//! target paths and read and written there through the real mount, the
//! driver killed and started again, and garbage in every field a kubelet
//! fills. Each call and its answer is printed (`cargo test --test csi --
//! --nocapture` shows a whole conversation), with the driver's own log.
//!
//! Publishing mounts FUSE with `allow_other` (pods run as any user),
//! which takes root: elsewhere the tests say they skip.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "common/s3.rs"]
mod s3;
#[path = "../../tests/support/skip.rs"]
mod skip;

#[allow(dead_code, clippy::all, clippy::pedantic)]
mod proto {
    include!(concat!(env!("OUT_DIR"), "/csi.v1.rs"));
}

use proto::identity_client::IdentityClient;
use proto::node_client::NodeClient;
use proto::volume_capability::access_mode::Mode;
use proto::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use proto::*;
use tonic::Code;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_ringfeed");
const BUCKET: &str = "train";
/// S3's smallest part: a checkpoint above it is a multipart upload.
const PART: &str = "part-size=5MiB";
/// The bound on one call: a driver that does not answer fails the test
/// (a hang is the failure this catches, never a slow machine: a publish
/// takes well under a second).
const CALL_LIMIT: Duration = Duration::from_secs(90);

/// Root, or this test cannot mount with `allow_other`.
fn root_or_skip() -> bool {
    // SAFETY: a plain getter.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    crate::skip!("publishing mounts FUSE with allow_other, which takes root");
    false
}

/// Bytes of a pattern different per seed.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// The driver as a process, its stderr echoed and kept.
struct Driver {
    child: Child,
    socket: PathBuf,
    log: Arc<Mutex<String>>,
}

impl Driver {
    fn start(dir: &Path, cache: Option<&Path>) -> Driver {
        Driver::start_from(Path::new(BIN), dir, cache)
    }

    /// The driver run from the program `bin`.
    fn start_from(bin: &Path, dir: &Path, cache: Option<&Path>) -> Driver {
        Driver::start_under(&[], bin, dir, cache)
    }

    /// The driver run from `bin` under the command `wrap` (a namespace's
    /// entry: `nsenter ... unshare ... --`).
    fn start_under(wrap: &[String], bin: &Path, dir: &Path, cache: Option<&Path>) -> Driver {
        let socket = dir.join("plugin").join("csi.sock");
        let mut cmd = match wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("csi")
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .args(["--node-id", "node-a"])
            .arg("--state-dir")
            .arg(dir.join("state"));
        if let Some(c) = cache {
            cmd.arg("--cache-dir").arg(c);
        }
        s3::with_credentials(&mut cmd);
        let mut child = cmd
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (err, kept) = (child.stderr.take().unwrap(), Arc::clone(&log));
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("    driver | {line}");
                kept.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let until = Instant::now() + CALL_LIMIT;
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the driver exited ({status}): {}", log.lock().unwrap());
            }
            assert!(Instant::now() < until, "the driver never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        Driver { child, socket, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The log once it holds every line of `want` (it reaches the test
    /// through a pipe and a thread: a line the driver wrote before its
    /// answer may come in after it).
    fn wait_log(&self, want: &[&str]) -> String {
        let until = Instant::now() + CALL_LIMIT;
        loop {
            let log = self.log();
            if want.iter().all(|w| log.contains(w)) {
                return log;
            }
            assert!(
                Instant::now() < until,
                "{want:?} not in the driver's log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, as a node's driver dies without a word.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The kubelet's side: the two services' clients over the socket.
struct Kubelet {
    rt: tokio::runtime::Runtime,
    identity: IdentityClient<Channel>,
    node: NodeClient<Channel>,
}

type Answer<T> = Result<T, (Code, String)>;

impl Kubelet {
    fn connect(socket: &Path) -> Kubelet {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let path = socket.to_path_buf();
        let channel = rt
            .block_on(
                tonic::transport::Endpoint::from_static("http://driver").connect_with_connector(
                    tower::service_fn(move |_: tonic::transport::Uri| {
                        let p = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                                tokio::net::UnixStream::connect(p).await?,
                            ))
                        }
                    }),
                ),
            )
            .unwrap();
        Kubelet {
            rt,
            identity: IdentityClient::new(channel.clone()),
            node: NodeClient::new(channel),
        }
    }

    /// One call, printed with its answer, within [`CALL_LIMIT`].
    fn call<Q: std::fmt::Debug, A: std::fmt::Debug, F>(
        &self,
        name: &str,
        req: &Q,
        f: F,
    ) -> Answer<A>
    where
        F: std::future::Future<Output = Result<tonic::Response<A>, tonic::Status>>,
    {
        println!("kubelet -> {name} {req:?}");
        let got = self
            .rt
            .block_on(async { tokio::time::timeout(CALL_LIMIT, f).await })
            .unwrap_or_else(|_| panic!("{name}: no answer in {} s", CALL_LIMIT.as_secs()));
        let answer = got
            .map(tonic::Response::into_inner)
            .map_err(|s| (s.code(), s.message().to_string()));
        match &answer {
            Ok(a) => println!("driver  <- OK {a:?}"),
            Err((code, msg)) => println!("driver  <- {code:?}: {msg}"),
        }
        answer
    }

    fn probe(&mut self) -> Answer<ProbeResponse> {
        let (mut c, req) = (self.identity.clone(), ProbeRequest {});
        self.call("Probe", &req, c.probe(req))
    }

    fn publish(&mut self, req: NodePublishVolumeRequest) -> Answer<NodePublishVolumeResponse> {
        let mut c = self.node.clone();
        self.call(
            "NodePublishVolume",
            &req,
            c.node_publish_volume(req.clone()),
        )
    }

    fn unpublish(&mut self, volume_id: &str, target: &str) -> Answer<NodeUnpublishVolumeResponse> {
        let req = NodeUnpublishVolumeRequest {
            volume_id: volume_id.into(),
            target_path: target.into(),
        };
        let mut c = self.node.clone();
        self.call(
            "NodeUnpublishVolume",
            &req,
            c.node_unpublish_volume(req.clone()),
        )
    }
}

fn capability(mode: Mode, flags: &[&str]) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: String::new(),
            mount_flags: flags.iter().map(|f| f.to_string()).collect(),
        })),
    }
}

/// A publish as the kubelet sends it for a PersistentVolume.
fn publish(
    volume: &str,
    target: &Path,
    cap: VolumeCapability,
    readonly: bool,
    context: &[(&str, &str)],
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: volume.into(),
        publish_context: HashMap::new(),
        staging_target_path: String::new(),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: Some(cap),
        readonly,
        secrets: HashMap::new(),
        volume_context: context
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([("csi.storage.k8s.io/pod.name".into(), "trainer-0".into())])
            .collect(),
    }
}

/// A kubelet's target path: `pods/UID/volumes/kubernetes.io~csi/PV/mount`
/// under `root`, its parent made as the kubelet makes it.
fn target(root: &Path, pod: &str, pv: &str) -> PathBuf {
    let t = root
        .join("pods")
        .join(pod)
        .join("volumes/kubernetes.io~csi")
        .join(pv)
        .join("mount");
    std::fs::create_dir_all(t.parent().unwrap()).unwrap();
    t
}

/// The file system type mounted on `path` (`/proc/self/mountinfo`).
fn mounted(path: &Path) -> Option<String> {
    let want = path.to_string_lossy().replace(' ', "\\040");
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.get(4) == Some(&want.as_str()))
            .then(|| {
                f.iter()
                    .skip_while(|x| **x != "-")
                    .nth(1)
                    .map(|s| s.to_string())
            })
            .flatten()
    })
}

fn ok<T>(a: Answer<T>) -> T {
    a.unwrap_or_else(|(code, msg)| panic!("refused: {code:?}: {msg}"))
}

fn refused<T: std::fmt::Debug>(a: Answer<T>, code: Code, want: &str) {
    match a {
        Ok(v) => panic!("accepted ({v:?}); wanted {code:?} naming `{want}`"),
        Err((c, msg)) => {
            assert_eq!(c, code, "{msg}");
            assert!(msg.contains(want), "`{want}` not in: {msg}");
        }
    }
}

/// The volume attributes that name the test server's bucket and prefix.
fn source<'a>(s3: &'a s3::S3, prefix: &'a str, out: &'a mut String) -> Vec<(&'a str, &'a str)> {
    *out = format!("s3://{BUCKET}/{prefix}");
    vec![
        ("source", out.as_str()),
        ("endpointUrl", s3.endpoint.as_str()),
        ("pathStyle", "true"),
        ("region", "us-east-1"),
    ]
}

/// `ringfeed cache ls DIR`: the cache entries, `URL\tSIZE` a line.
fn cache_entries(dir: &Path) -> Vec<String> {
    let out = Command::new(BIN)
        .args(["cache", "ls"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("s3://"))
        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join("\t"))
        .collect();
    v.sort();
    v
}

#[test]
fn volumes_are_published_read_written_and_unpublished_as_the_kubelet_asks() {
    if !root_or_skip() {
        return;
    }
    let s3 = s3::S3::start(&[BUCKET]);
    let big = bytes((12 << 20) + 321, 1);
    let small = bytes(4000, 2);
    s3.put(BUCKET, "data/big.bin", &big);
    s3.put(BUCKET, "data/dir/small.bin", &small);
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let _cache_fs = CacheFs::mount(&cache, "mode=0700");
    let driver = Driver::start(tmp.path(), Some(&cache));
    let mut k = Kubelet::connect(&driver.socket);

    assert_eq!(ok(k.probe()).ready, Some(true));
    let req = GetPluginInfoRequest {};
    let mut id = k.identity.clone();
    let info = ok(k.call("GetPluginInfo", &req, id.get_plugin_info(req)));
    assert_eq!(info.name, "csi.ringfeed.dev");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let req = GetPluginCapabilitiesRequest {};
    let caps = ok(k.call(
        "GetPluginCapabilities",
        &req,
        id.get_plugin_capabilities(req),
    ));
    assert_eq!(caps.capabilities, []);
    let mut node = k.node.clone();
    let req = NodeGetCapabilitiesRequest {};
    let caps = ok(k.call("NodeGetCapabilities", &req, node.node_get_capabilities(req)));
    assert_eq!(caps.capabilities, []);
    let req = NodeGetInfoRequest {};
    let info = ok(k.call("NodeGetInfo", &req, node.node_get_info(req)));
    assert_eq!(
        (info.node_id.as_str(), info.max_volumes_per_node),
        ("node-a", 0)
    );

    // A read-only volume with its owner and modes.
    let data = target(tmp.path(), "pod-1", "pv-data");
    let mut url = String::new();
    let mut ctx = source(&s3, "data/", &mut url);
    ctx.extend([
        ("uid", "1234"),
        ("gid", "4321"),
        ("fileMode", "0640"),
        ("dirMode", "0750"),
    ]);
    let req = publish(
        "vol-data",
        &data,
        capability(Mode::MultiNodeReaderOnly, &[]),
        true,
        &ctx,
    );
    ok(k.publish(req.clone()));
    assert!(mounted(&data).is_some_and(|t| t.starts_with("fuse")));
    assert_eq!(std::fs::read(data.join("big.bin")).unwrap(), big);
    assert_eq!(std::fs::read(data.join("dir/small.bin")).unwrap(), small);
    let (f, d) = (
        std::fs::metadata(data.join("big.bin")).unwrap(),
        std::fs::metadata(data.join("dir")).unwrap(),
    );
    // The write bits dropped: the volume is read-only.
    assert_eq!((f.uid(), f.gid(), f.mode() & 0o777), (1234, 4321, 0o440));
    assert_eq!((d.uid(), d.gid(), d.mode() & 0o777), (1234, 4321, 0o550));
    let err = std::fs::write(data.join("new.bin"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    // The node's cache took both files (its writer thread fills it
    // behind the reads).
    let want = vec![
        format!("s3://{BUCKET}/data/big.bin\t{}", big.len()),
        format!("s3://{BUCKET}/data/dir/small.bin\t{}", small.len()),
    ];
    let until = Instant::now() + CALL_LIMIT;
    while cache_entries(&cache) != want && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(cache_entries(&cache), want);

    // The same publish again is done already; another volume, or the
    // same one with other options, on that target is refused.
    ok(k.publish(req.clone()));
    let other = publish(
        "vol-other",
        &data,
        capability(Mode::MultiNodeReaderOnly, &[]),
        true,
        &ctx,
    );
    refused(
        k.publish(other),
        Code::AlreadyExists,
        "holds volume `vol-data`, not `vol-other`",
    );
    let changed = publish(
        "vol-data",
        &data,
        capability(Mode::MultiNodeReaderOnly, &["metadata-ttl=5"]),
        true,
        &ctx,
    );
    refused(
        k.publish(changed),
        Code::AlreadyExists,
        "with other arguments",
    );

    // A write-once volume: a checkpoint is one object once closed, and
    // nothing before.
    let ckpt = target(tmp.path(), "pod-2", "pv-ckpt");
    let mut url = String::new();
    let mut ctx = source(&s3, "ckpt/", &mut url);
    ctx.extend([("access", "write-once"), ("cache", "none")]);
    ok(k.publish(publish(
        "vol-ckpt",
        &ckpt,
        capability(Mode::SingleNodeWriter, &[PART]),
        false,
        &ctx,
    )));
    let model = bytes((11 << 20) + 5, 3);
    let mut f = std::fs::File::create(ckpt.join("model.bin")).unwrap();
    for piece in model.chunks(1 << 20) {
        f.write_all(piece).unwrap();
    }
    assert_eq!(
        s3.stored(BUCKET, "ckpt/model.bin"),
        None,
        "visible before close"
    );
    drop(f);
    assert_eq!(
        s3.stored(BUCKET, "ckpt/model.bin").as_deref(),
        Some(&model[..])
    );
    assert_eq!(std::fs::read(ckpt.join("model.bin")).unwrap(), model);

    // Unpublish unmounts and removes the target; twice is fine.
    for (vol, t) in [("vol-data", &data), ("vol-ckpt", &ckpt)] {
        ok(k.unpublish(vol, &t.to_string_lossy()));
        assert_eq!(mounted(t), None);
        assert!(!t.exists(), "{} left", t.display());
        ok(k.unpublish(vol, &t.to_string_lossy()));
    }
    driver.wait_log(&["NodeUnpublishVolume volume `vol-data`", "ok (not mounted)"]);
    // The store's objects are as they were, the checkpoint added.
    assert_eq!(s3.stored(BUCKET, "data/big.bin").as_deref(), Some(&big[..]));
}

#[test]
fn a_driver_killed_and_started_again_leaves_its_mounts_serving_and_unpublishes_them() {
    if !root_or_skip() {
        return;
    }
    let s3 = s3::S3::start(&[BUCKET]);
    let data = bytes(3 << 20, 4);
    s3.put(BUCKET, "keep/weights.bin", &data);
    let tmp = tempfile::tempdir().unwrap();
    let t = target(tmp.path(), "pod-1", "pv");
    let mut url = String::new();
    let ctx = source(&s3, "keep/", &mut url);
    let req = publish(
        "vol-keep",
        &t,
        capability(Mode::MultiNodeMultiWriter, &[PART]),
        false,
        &ctx,
    );

    let driver = Driver::start(tmp.path(), None);
    ok(Kubelet::connect(&driver.socket).publish(req.clone()));
    driver.kill();
    // The mount is its own process: it serves on.
    assert_eq!(std::fs::read(t.join("weights.bin")).unwrap(), data);
    std::fs::write(t.join("after-kill.txt"), b"written with no driver").unwrap();
    assert_eq!(
        s3.stored(BUCKET, "keep/after-kill.txt").as_deref(),
        Some(&b"written with no driver"[..])
    );

    let driver = Driver::start(tmp.path(), None);
    let log = driver.wait_log(&["found volume `vol-keep` on", "serving (pid"]);
    let pid: u32 = log
        .split("serving (pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap();
    let mut k = Kubelet::connect(&driver.socket);
    // The kubelet asking again (as after its own restart): done already.
    ok(k.publish(req.clone()));
    driver.wait_log(&["ok (already published)"]);
    ok(k.unpublish("vol-keep", &t.to_string_lossy()));
    assert_eq!(mounted(&t), None);
    // Its process ended with its mount (gone, or a zombie left to init).
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next());
    assert!(matches!(state, None | Some("Z")), "{stat}");
    ok(k.unpublish("vol-keep", &t.to_string_lossy()));

    // The control: a mount whose process is gone (killed, as when a
    // driver's container is restarted with it) is found dead, unmounted
    // and mounted again by the next publish.
    ok(k.publish(req.clone()));
    let pid = mount_pid(&t);
    // SAFETY: a signal to the mount process this test published.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let until = Instant::now() + CALL_LIMIT;
    while std::fs::read_dir(&t).is_ok() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    // A directory opened asks the process (a `stat` may be answered from
    // the kernel's cache of attributes for --metadata-ttl).
    let err = std::fs::read_dir(&t).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
    ok(k.publish(req.clone()));
    driver.wait_log(&["no longer answers: mounting it again"]);
    assert_eq!(std::fs::read(t.join("weights.bin")).unwrap(), data);
    ok(k.unpublish("vol-keep", &t.to_string_lossy()));
    assert_eq!(mounted(&t), None);
}

/// A file system of its own for a node's cache (a tmpfs of 256 MiB,
/// unmounted when dropped): the cache keeps 10% of its file system free,
/// so one on the machine's own disk would fill nothing where that disk is
/// nearly full; a node's cache has its NVMe.
struct CacheFs(PathBuf);

impl CacheFs {
    fn mount(dir: &Path, options: &str) -> CacheFs {
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size=256m,{options}"))
            .arg("ringfeed-test-cache")
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs on {}", dir.display());
        CacheFs(dir.to_path_buf())
    }
}

impl Drop for CacheFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The node engine's user in the manifests (the images' user).
const ENGINE_UID: u32 = 10001;

/// The user id of process `pid` (`/proc/PID/status`, its real uid).
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .unwrap()
}

#[test]
fn a_volume_on_the_node_engines_cache_is_served_by_the_caches_owner() {
    if !root_or_skip() {
        return;
    }
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::process::CommandExt as _;
    let s3 = s3::S3::start(&[BUCKET]);
    let data = bytes((6 << 20) + 77, 7);
    s3.put(BUCKET, "engine/shard-0.tar", &data);
    // The kubelet's directories are root's alone; the node engine's cache
    // is its user's, 0700, on a disk others may search (a hostPath the init
    // container gave it); the program is where any user may run it.
    let tmp = tempfile::tempdir().unwrap();
    let node = tempfile::tempdir().unwrap();
    std::fs::set_permissions(node.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = node.path().join("ringfeed");
    std::fs::copy(BIN, &bin).unwrap();
    let cache = node.path().join("cache");
    let _cache_fs = CacheFs::mount(
        &cache,
        &format!("mode=0700,uid={ENGINE_UID},gid={ENGINE_UID}"),
    );

    // The control: a mount of root's refuses the engine's cache (it trusts
    // a directory of its own user only), so a driver that ran its mounts as
    // itself could not share it.
    let mut root_mount = Command::new(&bin);
    root_mount
        .arg("mount")
        .arg(format!("s3://{BUCKET}/engine/"))
        .arg(tmp.path())
        .arg("--cache-dir")
        .arg(&cache)
        .args(["--endpoint-url", &s3.endpoint, "--s3-path-style"]);
    let refused = s3::with_credentials(&mut root_mount).output().unwrap();
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{why}");
    assert!(
        why.contains(&format!(
            "belongs to uid {ENGINE_UID}, not to this user (uid 0)"
        )),
        "{why}"
    );

    let driver = Driver::start_from(&bin, tmp.path(), Some(&cache));
    let mut k = Kubelet::connect(&driver.socket);
    let t = target(tmp.path(), "pod-1", "pv-engine");
    let mut url = String::new();
    let ctx = source(&s3, "engine/", &mut url);
    ok(k.publish(publish(
        "vol-engine",
        &t,
        capability(Mode::MultiNodeReaderOnly, &[]),
        true,
        &ctx,
    )));
    assert_eq!(mounted(&t).as_deref(), Some("fuse.ringfeed"));
    let pid = mount_pid(&t);
    assert_eq!(uid_of(pid), ENGINE_UID);
    driver.wait_log(&[&format!(
        "is served by uid {ENGINE_UID}:{ENGINE_UID}, the owner of the node's cache"
    )]);
    // Read through the mount by a pod of another user (any may: the
    // volume's modes), byte for byte.
    let read = Command::new("sha256sum")
        .arg(t.join("shard-0.tar"))
        .uid(1234)
        .gid(1234)
        .output()
        .unwrap();
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    assert_eq!(
        std::fs::read(t.join("shard-0.tar")).unwrap(),
        data,
        "the bytes through the mount"
    );
    // Unpublished, the mount writes out its fill and ends.
    ok(k.unpublish("vol-engine", &t.to_string_lossy()));
    assert_eq!(mounted(&t), None);
    // The entry is the engine user's: its loaders read it as their own.
    let listed = Command::new(&bin)
        .args(["cache", "ls"])
        .arg(&cache)
        .uid(ENGINE_UID)
        .gid(ENGINE_UID)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let entries: Vec<&str> = text.lines().filter(|l| l.starts_with("s3://")).collect();
    assert_eq!(entries.len(), 1, "{text}");
    assert!(
        entries[0].starts_with(&format!("s3://{BUCKET}/engine/shard-0.tar\t{}", data.len())),
        "{text}"
    );
    for e in std::fs::read_dir(&cache).unwrap().flatten() {
        let m = e.metadata().unwrap();
        assert_eq!(
            m.uid(),
            ENGINE_UID,
            "{} is not the engine user's",
            e.path().display()
        );
    }
}

/// A mount namespace of the test's own, held by a sleeping process, in
/// which `dir` is a shared mount: the driver's pod and the trainer's pod
/// of one node see the same mounts below it (the kubelet's folder).
struct Holder(Child);

impl Holder {
    fn start(dir: &Path) -> Holder {
        let mut child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(r#"mount --bind "$0" "$0" && mount --make-shared "$0" && echo ready && exec sleep 3600"#)
            .arg(dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n", "the test's mount namespace was not made");
        Holder(child)
    }

    /// `nsenter` into the namespace, then `args`.
    fn enter(&self, args: &[&str]) -> Vec<String> {
        let mut v = vec![
            "nsenter".to_string(),
            format!("--mount=/proc/{}/ns/mnt", self.0.id()),
            "--".to_string(),
        ];
        v.extend(args.iter().map(|a| a.to_string()));
        v
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A writer of 12 MiB through the volume: `kill` SIGKILLs itself after 6;
/// `fsync` fsyncs, then closes; `close` closes with no fsync.
const WRITER: &str = r#"
import os, signal, sys
path, how = sys.argv[1], sys.argv[2]
block = bytes(range(256)) * 4096
f = open(path, "wb")
for _ in range(6):
    f.write(block)
f.flush()
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
for _ in range(6):
    f.write(block)
f.flush()
if how == "fsync":
    os.fsync(f.fileno())
try:
    f.close()
except OSError as e:
    print("close:", os.strerror(e.errno))
    sys.exit(5)
print("closed")
"#;

#[test]
fn a_writer_in_another_pid_namespace_than_the_driver_leaves_an_object_only_when_whole() {
    if !root_or_skip() {
        return;
    }
    if Command::new("unshare")
        .args(["--mount", "--pid", "--fork", "true"])
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        crate::skip!(
            "`unshare --mount --pid` is refused here: the pods' namespaces cannot be made"
        );
        return;
    }
    let s3 = s3::S3::start(&[BUCKET]);
    let tmp = tempfile::tempdir().unwrap();
    let ns = Holder::start(tmp.path());
    // The driver in a pid namespace of its own (its pod's), its mounts
    // reaching the namespace the writers run in (the trainer's pod): the
    // kernel names a writer's requests to the mount by pid 0.
    let wrap = ns.enter(&[
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "--propagation",
        "unchanged",
        "--",
    ]);
    let driver = Driver::start_under(&wrap, Path::new(BIN), tmp.path(), None);
    let mut k = Kubelet::connect(&driver.socket);
    let t = target(tmp.path(), "pod-1", "pv-ckpt");
    let mut url = String::new();
    let mut ctx = source(&s3, "ckpt/", &mut url);
    ctx.extend([("access", "write-once"), ("cache", "none")]);
    ok(k.publish(publish(
        "vol-ckpt",
        &t,
        capability(Mode::MultiNodeMultiWriter, &[PART]),
        false,
        &ctx,
    )));
    let write = |name: &str, how: &str| {
        let path = t.join(name).to_string_lossy().into_owned();
        let argv = ns.enter(&["python3", "-c", WRITER, &path, how]);
        let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        eprintln!("writer {name} {how}: {:?} {text:?}", out.status);
        (out.status, text)
    };
    let whole: Vec<u8> = (0..12)
        .flat_map(|_| (0..=255u8).cycle().take(256 * 4096))
        .collect();

    let (status, _) = write("killed.bin", "kill");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    let (status, text) = write("closed.bin", "close");
    assert_eq!(
        (status.code(), text.as_str()),
        (Some(5), "close: Input/output error")
    );
    // The control: the same writer, fsync'd, then closed: the whole file.
    let (status, text) = write("synced.bin", "fsync");
    assert!(status.success() && text == "closed", "{status:?} {text}");
    assert_eq!(
        s3.stored(BUCKET, "ckpt/synced.bin").as_deref(),
        Some(&whole[..])
    );

    // Unpublished (the mount ends, every upload settled): the killed
    // writer's file and the one closed unsynced never became objects, and
    // no multipart upload is left open.
    ok(k.unpublish("vol-ckpt", &t.to_string_lossy()));
    assert_eq!(s3.stored(BUCKET, "ckpt/killed.bin"), None);
    assert_eq!(s3.stored(BUCKET, "ckpt/closed.bin"), None);
    let uploads: Vec<_> = std::fs::read_dir(s3.root.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".upload-"))
        .collect();
    assert!(uploads.is_empty(), "{uploads:?}");
    drop(driver);
}

/// The pid of the `ringfeed mount` process serving `target`.
fn mount_pid(target: &Path) -> u32 {
    let want = target.to_string_lossy().into_owned();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.get(1).map(String::as_str) == Some("mount") && args.get(3) == Some(&want) {
            return pid;
        }
    }
    panic!("no mount process serves {want}");
}

#[test]
fn garbage_in_every_field_a_kubelet_fills_gives_a_named_error() {
    if !root_or_skip() {
        return;
    }
    let s3 = s3::S3::start(&[BUCKET]);
    s3.put(BUCKET, "data/f", b"f");
    let tmp = tempfile::tempdir().unwrap();
    let driver = Driver::start(tmp.path(), None);
    let mut k = Kubelet::connect(&driver.socket);
    let t = target(tmp.path(), "pod", "pv");
    let mut url = String::new();
    let ctx = source(&s3, "data/", &mut url);
    let good = || {
        publish(
            "vol",
            &t,
            capability(Mode::SingleNodeWriter, &[]),
            false,
            &ctx,
        )
    };
    let with = |f: &dyn Fn(&mut NodePublishVolumeRequest)| {
        let mut r = good();
        f(&mut r);
        r
    };

    let cases: Vec<(NodePublishVolumeRequest, Code, &str)> = vec![
        (
            with(&|r| r.volume_id.clear()),
            Code::InvalidArgument,
            "`volume_id` is required",
        ),
        (
            with(&|r| r.volume_id = "v".repeat(300)),
            Code::InvalidArgument,
            "`volume_id` is 300 bytes",
        ),
        (
            with(&|r| r.volume_id = "v\u{1}".into()),
            Code::InvalidArgument,
            "control character",
        ),
        (
            with(&|r| r.target_path.clear()),
            Code::InvalidArgument,
            "`target_path` is required",
        ),
        (
            with(&|r| r.target_path = "pods/x/mount".into()),
            Code::InvalidArgument,
            "not an absolute path",
        ),
        (
            with(&|r| r.target_path = format!("{}/../../etc", t.display())),
            Code::InvalidArgument,
            "`..`",
        ),
        (
            with(&|r| r.target_path = "/nonexistent/parent/mount".into()),
            Code::FailedPrecondition,
            "the parent of target_path",
        ),
        (
            with(&|r| r.volume_capability = None),
            Code::InvalidArgument,
            "`volume_capability` is required",
        ),
        (
            with(&|r| {
                r.volume_capability.as_mut().unwrap().access_type =
                    Some(AccessType::Block(BlockVolume {}))
            }),
            Code::FailedPrecondition,
            "block access",
        ),
        (
            with(&|r| {
                r.volume_capability.as_mut().unwrap().access_mode = Some(AccessMode { mode: 42 })
            }),
            Code::InvalidArgument,
            "`volume_capability.access_mode` 42",
        ),
        (
            with(&|r| r.volume_capability.as_mut().unwrap().access_mode = None),
            Code::InvalidArgument,
            "access_mode` is required",
        ),
        (
            with(&|r| {
                r.volume_context.remove("source");
            }),
            Code::InvalidArgument,
            "`source` is required",
        ),
        (
            with(&|r| {
                r.volume_context.insert("source".into(), "/etc".into());
            }),
            Code::InvalidArgument,
            "volume attribute `source` `/etc`",
        ),
        (
            with(&|r| {
                r.volume_context.insert("bucketName".into(), "x".into());
            }),
            Code::InvalidArgument,
            "unknown volume attribute `bucketName`",
        ),
        (
            with(&|r| {
                r.volume_context.insert("uid".into(), "root".into());
            }),
            Code::InvalidArgument,
            "volume attribute `uid`: `root`",
        ),
        (
            with(&|r| {
                r.volume_context.insert("cache".into(), "node".into());
            }),
            Code::FailedPrecondition,
            "without --cache-dir",
        ),
        (
            with(&|r| {
                r.volume_context.insert("k".repeat(5000), "v".into());
            }),
            Code::InvalidArgument,
            "past the CSI bound of 4096",
        ),
        (
            with(&|r| {
                r.volume_capability = Some(capability(Mode::SingleNodeWriter, &["cache-dir=/tmp"]))
            }),
            Code::InvalidArgument,
            "mount option `cache-dir` is not allowed",
        ),
        (
            with(&|r| {
                r.volume_capability = Some(capability(Mode::SingleNodeWriter, &["part-size=huge"]))
            }),
            Code::InvalidArgument,
            "mount option `part-size=huge`",
        ),
        (
            with(&|r| {
                r.volume_context
                    .insert("source".into(), "s3://no-such-bucket/data/".into());
            }),
            Code::NotFound,
            "`s3://no-such-bucket/data/` cannot be listed",
        ),
    ];
    for (req, code, want) in cases {
        refused(k.publish(req), code, want);
        assert_eq!(mounted(&t), None);
    }
    for (vol, target, want) in [
        (
            "",
            t.to_string_lossy().into_owned(),
            "`volume_id` is required",
        ),
        ("vol", String::new(), "`target_path` is required"),
        ("vol", "relative".to_string(), "not an absolute path"),
        (
            "vol",
            format!("{}/x\u{0}y", t.display()),
            "control character",
        ),
    ] {
        refused(k.unpublish(vol, &target), Code::InvalidArgument, want);
    }
    // Another volume's target is not unpublished by a wrong id.
    ok(k.publish(good()));
    refused(
        k.unpublish("vol-b", &t.to_string_lossy()),
        Code::NotFound,
        "volume `vol` is",
    );
    assert!(mounted(&t).is_some_and(|t| t.starts_with("fuse")));
    ok(k.unpublish("vol", &t.to_string_lossy()));

    // A target holding a mount that is not the driver's is left alone.
    let foreign = target(tmp.path(), "pod-f", "pv");
    std::fs::create_dir(&foreign).unwrap();
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&foreign)
        .status()
        .unwrap();
    assert!(status.success());
    let req = publish(
        "vol",
        &foreign,
        capability(Mode::SingleNodeWriter, &[]),
        false,
        &ctx,
    );
    refused(
        k.publish(req),
        Code::FailedPrecondition,
        "holds a `tmpfs` mount",
    );
    refused(
        k.unpublish("vol", &foreign.to_string_lossy()),
        Code::FailedPrecondition,
        "left alone",
    );
    assert_eq!(mounted(&foreign).as_deref(), Some("tmpfs"));
    assert!(
        Command::new("umount")
            .arg(&foreign)
            .status()
            .unwrap()
            .success()
    );

    // Bytes that are no gRPC at all, then a client gone mid-request: the
    // driver answers the next caller.
    let mut raw = std::os::unix::net::UnixStream::connect(&driver.socket).unwrap();
    raw.set_read_timeout(Some(CALL_LIMIT)).unwrap();
    raw.write_all(&bytes(64 << 10, 9)).unwrap();
    let mut sink = Vec::new();
    let _ = raw.read_to_end(&mut sink);
    drop(raw);
    let mut half = std::os::unix::net::UnixStream::connect(&driver.socket).unwrap();
    half.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04")
        .unwrap();
    drop(half);
    assert_eq!(ok(k.probe()).ready, Some(true));
    let log = driver.log();
    assert!(!log.contains("panicked"), "{log}");
}
