//! The engine in a container's restrictions, really applied: each case runs
//! this test binary again in a child process (its `restricted_child` test)
//! after the restriction is installed between fork and exec, where the
//! engine cannot undo it.
//!
//! - Docker's default seccomp profile (moby 25 and later) answers
//!   `io_uring_setup`, `io_uring_enter` and `io_uring_register` with EPERM;
//!   the child's filter does the same. The engine must fall back to its
//!   thread backend, stream every sample of local shards and of shards over
//!   http://, say so in the stats (`io_backend`, and a note naming the
//!   refusal), and fail with `RINGFEED_ERR_IO_URING` where the configuration
//!   requires io_uring.
//! - Without `CAP_IPC_LOCK` (dropped from the bounding set, so the exec'd
//!   child, though uid 0, does not get it back) and with `RLIMIT_MEMLOCK` at
//!   8 MiB under a 64 MiB budget: nothing locked, every sample streamed, the
//!   stats say why; `lock_memory: "on"` fails with `RINGFEED_ERR_MEMORY`
//!   naming mlock.
//!
//! The child first checks that its restriction is in force (io_uring_setup
//! gives EPERM; `CAP_IPC_LOCK` is not effective and mlock of the budget is
//! refused) and reports it, so a case cannot pass by not restricting
//! anything. It verifies every sample's bytes against the generator and
//! reports the count, bytes and stats as one JSON line; the parent compares
//! them with what the generator wrote and with an unrestricted run.
//!
//! The filter is a small classic-BPF program built here with the `libc`
//! crate (see docs/decisions.md).

use ringfeed_test_support as support;

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use ringfeed::synth::{self, GenOptions};
use serde_json::{Value, json};
use support::Server;

/// The case the child runs, as JSON; set only in the child.
const CASE_ENV: &str = "RINGFEED_RESTRICTED_CASE";

/// The line that carries the child's report on its stdout.
const REPORT: &str = "restricted-child-report: ";

/// Seed of the test shards' content; not 0, so a reader ignoring it fails.
const SEED: u64 = 11;

/// The budget the cases stream under, and the lock limit below it.
const BUDGET: &str = "64MiB";
const MEMLOCK_LIMIT: u64 = 8 << 20;

/// `CAP_IPC_LOCK` (linux/capability.h): mlock beyond `RLIMIT_MEMLOCK`.
const CAP_IPC_LOCK: u32 = 14;

struct Data {
    dir: tempfile::TempDir,
    paths: Vec<PathBuf>,
    samples: u64,
    bytes: u64,
}

/// Three shards of about 2 MiB: a few hundred samples, several batches per
/// worker, seconds to stream in a debug build.
fn data() -> Data {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let opts = GenOptions {
        shards: 3,
        shard_bytes: 2 << 20,
        sample_bytes: 20_000,
        spread: 0.5,
        fields: vec!["jpg".into(), "cls".into()],
        seed: SEED,
    };
    let report = synth::generate(dir.path(), &opts, |_| {}).expect("generate test shards");
    Data {
        paths: report.paths,
        samples: report.samples,
        bytes: report.payload_bytes,
        dir,
    }
}

impl Data {
    fn local_urls(&self) -> Vec<String> {
        self.paths.iter().map(|p| p.display().to_string()).collect()
    }

    fn http_urls(&self, server: &Server) -> Vec<String> {
        self.paths
            .iter()
            .map(|p| server.url(p.file_name().unwrap().to_str().unwrap()))
            .collect()
    }
}

fn config(urls: &[String], extra: Value) -> Value {
    let mut cfg = json!({
        "urls": urls,
        "memory_budget": BUDGET,
        "chunk_size": "1MiB",
        "batch_size": 8,
    });
    for (k, v) in extra.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    cfg
}

// ---- the restrictions, installed in the child between fork and exec ----

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64

/// What Docker's default profile does to io_uring: each of `syscalls`
/// returns EPERM; every other call, and every call of another
/// architecture, is allowed.
fn deny_with_eperm(syscalls: &[libc::c_long]) -> Vec<libc::sock_filter> {
    // Offsets in `struct seccomp_data`: `int nr; __u32 arch; ...`.
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump_eq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    let mut prog = vec![
        stmt(load, ARCH),
        jump_eq(AUDIT_ARCH, 1, 0),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
        stmt(load, NR),
    ];
    let n = syscalls.len();
    for (i, &nr) in syscalls.iter().enumerate() {
        // Equal: jump over the remaining tests and the ALLOW to the ERRNO.
        let to_deny = u8::try_from(n - i).unwrap();
        prog.push(jump_eq(u32::try_from(nr).unwrap(), to_deny, 0));
    }
    prog.push(stmt(ret, libc::SECCOMP_RET_ALLOW));
    prog.push(stmt(
        ret,
        libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA),
    ));
    prog
}

/// Docker's answer to io_uring.
fn docker_io_uring_filter() -> Vec<libc::sock_filter> {
    deny_with_eperm(&[
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ])
}

enum Restriction {
    /// A seccomp filter (NO_NEW_PRIVS first, as an unprivileged process
    /// must; Docker sets it too unless told otherwise).
    Seccomp(Vec<libc::sock_filter>),
    /// `CAP_IPC_LOCK` out of the bounding set, `RLIMIT_MEMLOCK` lowered.
    NoMlock,
}

/// Runs the `restricted_child` test of this binary under `restriction`,
/// with `case`; returns its report.
fn run_restricted(restriction: Restriction, case: Value) -> Value {
    let exe = std::env::current_exe().expect("path of the test binary");
    let mut cmd = Command::new(exe);
    cmd.args([
        "restricted_child",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CASE_ENV, case.to_string());
    match restriction {
        Restriction::Seccomp(filter) => {
            // SAFETY: the closure runs in the forked child before exec and
            // calls only prctl and seccomp (async-signal-safe system calls)
            // on memory that was allocated before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    let prog = libc::sock_fprog {
                        len: u16::try_from(filter.len()).unwrap_or(u16::MAX),
                        filter: filter.as_ptr().cast_mut(),
                    };
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                        || libc::syscall(
                            libc::SYS_seccomp,
                            libc::SECCOMP_SET_MODE_FILTER,
                            0,
                            &prog as *const libc::sock_fprog,
                        ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
            };
        }
        Restriction::NoMlock => {
            // SAFETY: as above; prctl, getrlimit and setrlimit only.
            unsafe {
                cmd.pre_exec(|| {
                    // Needs CAP_SETPCAP: refused to a process that is not
                    // root, which has no CAP_IPC_LOCK after exec anyway
                    // (the child checks).
                    libc::prctl(
                        libc::PR_CAPBSET_DROP,
                        libc::c_ulong::from(CAP_IPC_LOCK),
                        0,
                        0,
                        0,
                    );
                    let mut lim = libc::rlimit {
                        rlim_cur: 0,
                        rlim_max: 0,
                    };
                    if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let want = MEMLOCK_LIMIT.min(lim.rlim_max);
                    lim.rlim_cur = want;
                    lim.rlim_max = want;
                    if libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
            };
        }
    }
    let out = cmd.output().expect("run the restricted child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the restricted child failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once(REPORT).map(|(_, r)| r))
        .unwrap_or_else(|| panic!("the child sent no report:\n{stdout}\n{stderr}"));
    serde_json::from_str(line).expect("the child's report is JSON")
}

/// Streams `cfg` in this process, unrestricted, and returns the report a
/// child would give: the control each restricted run is compared with.
fn unrestricted(cfg: &Value) -> Value {
    stream_report(cfg, 0)
}

// ---- the child's side ----

/// The child: checks its restriction, runs its case, prints the report.
/// Ignored in a normal run; `run_restricted` runs it by name.
#[test]
#[ignore = "the restricted side of the container tests: they run it in a child process"]
fn restricted_child() {
    let case: Value = serde_json::from_str(
        &std::env::var(CASE_ENV).expect("run by the container tests, which set the case"),
    )
    .unwrap();
    let mut report = json!({ "restriction": restriction_in_force() });
    match case["action"].as_str().unwrap() {
        "stream" => {
            let pause = case["pause_ms"].as_u64().unwrap_or(0);
            report["stream"] = stream_report(&case["config"], pause)
        }
        "open" => report["open"] = open_report(&case["config"]),
        other => panic!("unknown case action {other}"),
    }
    // On a line of its own: the harness has printed "test ... " before it.
    println!("\n{REPORT}{report}");
}

/// What this process may do: io_uring (each of its three calls), mlock of
/// the budget, and `CAP_IPC_LOCK`.
fn restriction_in_force() -> Value {
    let errno = |rc: libc::c_long| match rc {
        -1 => std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        _ => 0,
    };
    let mut params = [0u8; 120]; // struct io_uring_params
    // SAFETY: io_uring_setup(entries, params) with a zeroed params struct of
    // its size; a descriptor it returns is closed below.
    let rc = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4, params.as_mut_ptr()) };
    let setup = errno(rc);
    if rc >= 0 {
        // SAFETY: a descriptor this function owns.
        unsafe { libc::close(rc as i32) };
    }
    // On descriptor -1: EBADF when the call is allowed, EPERM when filtered.
    // SAFETY: no pointer is passed; the kernel rejects the descriptor.
    let enter = errno(unsafe { libc::syscall(libc::SYS_io_uring_enter, -1, 0, 0, 0, 0, 0) });
    // SAFETY: as above.
    let register = errno(unsafe { libc::syscall(libc::SYS_io_uring_register, -1, 0, 0, 0) });

    let len = 64 << 20;
    // SAFETY: a fresh private anonymous mapping, unmapped below.
    let probe = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(probe, libc::MAP_FAILED);
    // SAFETY: the mapping above, `len` bytes.
    let mlock_ok = unsafe { libc::mlock(probe, len) } == 0;
    // SAFETY: as above.
    unsafe { libc::munmap(probe, len) };

    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    json!({
        "io_uring_setup_errno": setup,
        "io_uring_enter_errno": enter,
        "io_uring_register_errno": register,
        "mlock_budget_ok": mlock_ok,
        "cap_ipc_lock": cap_eff & (1 << CAP_IPC_LOCK) != 0,
    })
}

/// Streams `cfg` to its end, every sample's bytes checked against the
/// generator; reports each epoch's samples (each once) and bytes, the stats
/// and this process's locked memory. With `pause_ms`, holds the first batch
/// that long before going on (the arena is faulted in and the buffers made
/// ready for registering after the first batch).
fn stream_report(cfg: &Value, pause_ms: u64) -> Value {
    let loader = ringfeed::Loader::open_json(&cfg.to_string()).expect("open the loader");
    let (mut samples, mut bytes) = (Vec::new(), Vec::new());
    let mut keys = BTreeSet::new();
    let mut epoch_bytes = 0u64;
    let mut first = true;
    loop {
        match loader.next(Some(Duration::from_secs(60))).unwrap() {
            ringfeed::Next::Batch(b) => {
                for s in b.samples() {
                    for (name, data) in s.fields() {
                        assert!(
                            synth::verify(SEED, s.key(), name, data),
                            "sample {:?} field {name:?}: not the generator's bytes",
                            String::from_utf8_lossy(s.key())
                        );
                        epoch_bytes += data.len() as u64;
                    }
                    assert!(
                        keys.insert(s.key().to_vec()),
                        "sample {:?} delivered twice in epoch {}",
                        String::from_utf8_lossy(s.key()),
                        samples.len()
                    );
                }
                if first {
                    first = false;
                    std::thread::sleep(Duration::from_millis(pause_ms));
                }
            }
            ringfeed::Next::EndOfEpoch(_) => {
                samples.push(std::mem::take(&mut keys).len());
                bytes.push(std::mem::take(&mut epoch_bytes));
            }
            ringfeed::Next::Finished => break,
            ringfeed::Next::Timeout => panic!("no batch in 60 s"),
        }
    }
    assert!(keys.is_empty(), "samples after the last end of epoch");
    let stats = serde_json::to_value(loader.stats()).unwrap();
    let locked_kib = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap();
    loader.close();
    json!({
        "samples": samples,
        "bytes": bytes,
        "stats": stats,
        "locked_kib": locked_kib,
    })
}

/// Opens `cfg`, expecting an error; reports its status name and message.
fn open_report(cfg: &Value) -> Value {
    match ringfeed::Loader::open_json(&cfg.to_string()) {
        Ok(l) => {
            l.close();
            json!({ "status": "RINGFEED_OK", "message": "" })
        }
        Err(e) => {
            let code = e.status();
            let name = ringfeed::ffi::ringfeed_status_name(code);
            // SAFETY: status names are static NUL-terminated strings.
            let name = unsafe { std::ffi::CStr::from_ptr(name) };
            json!({ "status": name.to_str().unwrap(), "message": e.to_string() })
        }
    }
}

// ---- the cases ----

fn notes(report: &Value) -> String {
    report["stats"]["notes"].to_string()
}

/// Whether io_uring works in this (unrestricted) process.
fn io_uring_works_here() -> bool {
    restriction_in_force()["io_uring_setup_errno"] == 0
}

/// Checks that a child's stream delivered every generated sample with the
/// generator's bytes, in each of `epochs` epochs.
fn assert_every_sample(report: &Value, data: &Data, epochs: u64, what: &str) {
    let want = |n: u64| json!(vec![n; epochs as usize]);
    assert_eq!(
        report["samples"],
        want(data.samples),
        "{what}: samples streamed per epoch, of the {} generated: {report}",
        data.samples
    );
    assert_eq!(
        report["bytes"],
        want(data.bytes),
        "{what}: payload bytes streamed per epoch, of the {} generated: {report}",
        data.bytes
    );
    assert_eq!(
        report["stats"]["samples_delivered"],
        epochs * data.samples,
        "{what}: the stats' count: {report}"
    );
}

/// The io_uring half of the Docker profile case, on `urls`.
fn docker_profile_falls_back(urls: &[String], data: &Data, what: &str) {
    let cfg = config(urls, json!({}));
    let report = run_restricted(
        Restriction::Seccomp(docker_io_uring_filter()),
        json!({ "action": "stream", "config": cfg }),
    );
    let r = &report["restriction"];
    for call in ["setup", "enter", "register"] {
        assert_eq!(
            r[format!("io_uring_{call}_errno")],
            libc::EPERM,
            "{what}: the filter does not refuse io_uring_{call} with EPERM: {r}"
        );
    }
    let s = &report["stream"];
    println!(
        "{what} under the Docker profile: {} samples, {} bytes, io_backend {}, notes {}",
        s["samples"],
        s["bytes"],
        s["stats"]["io_backend"],
        notes(s)
    );
    assert_every_sample(s, data, 1, what);
    assert_eq!(s["stats"]["io_backend"], "threads", "{what}: {s}");
    assert_eq!(s["stats"]["io_uring_flags"], "", "{what}: {s}");
    assert_eq!(s["stats"]["buffers_registered"], false, "{what}: {s}");
    assert_eq!(s["stats"]["net_threads"], 0, "{what}: {s}");
    let n = notes(s);
    assert!(
        n.contains("io_uring unavailable") && n.contains("Operation not permitted"),
        "{what}: the notes do not say that io_uring was refused: {n}"
    );

    // The control: the same configuration with nothing refused.
    let control = unrestricted(&cfg);
    assert_every_sample(&control, data, 1, &format!("{what}, unrestricted"));
    if io_uring_works_here() {
        assert_eq!(control["stats"]["io_backend"], "io_uring", "{control}");
        assert!(
            !notes(&control).contains("io_uring unavailable"),
            "{control}"
        );
    } else {
        support::skip!(
            "io_uring is unavailable here even unrestricted: the control runs on threads",
        );
    }

    // Requiring io_uring: its own status, naming it.
    let report = run_restricted(
        Restriction::Seccomp(docker_io_uring_filter()),
        json!({ "action": "open", "config": config(urls, json!({"io_backend": "io_uring"})) }),
    );
    let o = &report["open"];
    assert_eq!(o["status"], "RINGFEED_ERR_IO_URING", "{what}: {o}");
    let msg = o["message"].as_str().unwrap();
    assert!(
        msg.contains("io_uring") && msg.contains("Operation not permitted"),
        "{what}: {msg}"
    );
}

#[test]
fn docker_seccomp_profile_local_shards_stream_on_threads() {
    let data = data();
    docker_profile_falls_back(&data.local_urls(), &data, "local shards");
}

#[test]
fn docker_seccomp_profile_http_shards_stream_on_threads() {
    let data = data();
    let server = Server::start(data.dir.path().to_path_buf());
    docker_profile_falls_back(&data.http_urls(&server), &data, "http:// shards");
}

/// The mlock half, on `urls`.
fn mlock_refused_degrades(urls: &[String], data: &Data, what: &str) {
    let cfg = config(urls, json!({}));
    let report = run_restricted(
        Restriction::NoMlock,
        json!({ "action": "stream", "config": cfg }),
    );
    let r = &report["restriction"];
    assert_eq!(
        r["cap_ipc_lock"], false,
        "{what}: CAP_IPC_LOCK is still effective in the child: {r}"
    );
    assert_eq!(
        r["mlock_budget_ok"], false,
        "{what}: the child may lock {BUDGET}: {r}"
    );
    let s = &report["stream"];
    println!(
        "{what} without mlock: {} samples, {} bytes, memory_locked {}, {} KiB locked, notes {}",
        s["samples"],
        s["bytes"],
        s["stats"]["memory_locked"],
        s["locked_kib"],
        notes(s)
    );
    assert_every_sample(s, data, 1, what);
    assert_eq!(s["stats"]["memory_locked"], false, "{what}: {s}");
    assert_eq!(
        s["locked_kib"], 0,
        "{what}: memory is locked, yet the stats say it is not: {s}"
    );
    assert!(
        notes(s).contains("mlock"),
        "{what}: the notes do not say why memory is not locked: {}",
        notes(s)
    );

    // The control: where this process may lock the budget, it is locked.
    let control = unrestricted(&cfg);
    assert_every_sample(&control, data, 1, &format!("{what}, unrestricted"));
    if restriction_in_force()["mlock_budget_ok"] == true {
        assert_eq!(control["stats"]["memory_locked"], true, "{control}");
    } else {
        support::skip!(&format!(
            "this process may not lock {BUDGET} even unrestricted: locking not compared"
        ));
    }

    let report = run_restricted(
        Restriction::NoMlock,
        json!({ "action": "open", "config": config(urls, json!({"lock_memory": "on"})) }),
    );
    let o = &report["open"];
    assert_eq!(o["status"], "RINGFEED_ERR_MEMORY", "{what}: {o}");
    assert!(
        o["message"].as_str().unwrap().contains("mlock"),
        "{what}: {o}"
    );
}

#[test]
fn mlock_refused_local_shards_stream_unlocked() {
    let data = data();
    mlock_refused_degrades(&data.local_urls(), &data, "local shards");
}

#[test]
fn mlock_refused_http_shards_stream_unlocked() {
    let data = data();
    let server = Server::start(data.dir.path().to_path_buf());
    mlock_refused_degrades(&data.http_urls(&server), &data, "http:// shards");
}

/// A filter narrower than Docker's: `io_uring_setup` allowed,
/// `io_uring_enter` refused. A ring that is set up but cannot be entered is
/// no ring: the engine must see that at open (it once chose io_uring and
/// failed at the first read with EPERM).
#[test]
fn io_uring_enter_refused_alone_falls_back_to_threads() {
    if !io_uring_works_here() {
        support::skip!("io_uring is unavailable here even unrestricted: nothing to refuse");
        return;
    }
    let data = data();
    let cfg = config(&data.local_urls(), json!({}));
    let report = run_restricted(
        Restriction::Seccomp(deny_with_eperm(&[libc::SYS_io_uring_enter])),
        json!({ "action": "stream", "config": cfg }),
    );
    assert_eq!(report["restriction"]["io_uring_setup_errno"], 0, "{report}");
    assert_eq!(
        report["restriction"]["io_uring_enter_errno"],
        libc::EPERM,
        "{report}"
    );
    let s = &report["stream"];
    assert_every_sample(s, &data, 1, "io_uring_enter refused");
    assert_eq!(s["stats"]["io_backend"], "threads", "{s}");
    assert!(
        notes(s).contains("io_uring unavailable (io_uring_enter: Operation not permitted"),
        "the notes do not say that io_uring_enter was refused: {}",
        notes(s)
    );
}

/// `io_uring_register` refused alone: io_uring runs, the fixed buffers are
/// refused when a ring first tries them (after the first batch, so three
/// epochs and a pause make sure one does), and the stats must then say
/// they are not registered (they once said registered, beside the note of
/// the refusal).
#[test]
fn io_uring_register_refused_alone_reads_into_unregistered_chunks() {
    let data = data();
    let cfg = config(&data.local_urls(), json!({"epochs": 3}));
    let report = run_restricted(
        Restriction::Seccomp(deny_with_eperm(&[libc::SYS_io_uring_register])),
        json!({ "action": "stream", "config": cfg, "pause_ms": 500 }),
    );
    assert_eq!(
        report["restriction"]["io_uring_register_errno"],
        libc::EPERM,
        "{report}"
    );
    let s = &report["stream"];
    assert_every_sample(s, &data, 3, "io_uring_register refused");
    if s["stats"]["io_backend"] != "io_uring" {
        support::skip!("io_uring is unavailable here: the refusal of registering not reached");
        return;
    }
    if s["stats"]["memory_locked"] != true {
        // Without the right to pin the arena the engine does not plan fixed
        // buffers at all: nothing to refuse.
        support::skip!("this process may not pin the arena: fixed buffers not planned");
        return;
    }
    assert!(
        notes(s).contains("register_buffers refused (Operation not permitted"),
        "no ring tried to register the buffers in three epochs: {}",
        notes(s)
    );
    assert_eq!(
        s["stats"]["buffers_registered"], false,
        "the stats say the buffers are registered beside the note of the refusal: {s}"
    );
}
