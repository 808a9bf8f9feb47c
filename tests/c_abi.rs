//! The C ABI from C and C++: builds the consumers in `tests/c/` and
//! `bindings/cpp/` against the crate's cdylib with `-Werror` and ASan/UBSan,
//! runs them on shards from `ringfeed::synth`, and checks that each public
//! header compiles alone.
//!
//! - `abi_stream.c`: every sample once per epoch with the generator's bytes,
//!   batch descriptors, stats and stats JSON.
//! - `abi_layout.c`: the batch layout rules, sample sources, a shared arena
//!   mapped twice, `ringfeed_gather`, and their misuse.
//! - `abi_misuse.c`: each documented misuse gives its status and a message.
//! - `abi_old_layout.c`: built against the previous header of the ABI
//!   (`tests/c/abi1_previous/`), run against this library: the stats it
//!   knows are filled, nothing past its struct is written.
//! - `abi_races.c`: `next`, `release`, `close` and the stats racing from
//!   several threads, double releases at once, two loaders' batches mixed,
//!   and fork in the middle of a stream: statuses and clean wake-ups only.
//! - `abi_epochs.c`: consumers split an epoch exactly once with equal
//!   lengths; a resume state continues it exactly; elastic resume.
//! - `abi_fallbacks.c`: without `CAP_IPC_LOCK` and with `io_uring` denied by
//!   seccomp, the loader still streams and says what it fell back from.
//! - `abi_node.c`: a consumer attached to a node engine (served from a
//!   thread of the test) streams every sample with its bytes; one that
//!   crashes holding batches gets them taken back by the engine.
//! - `abi_objects.c`: whole objects read (into the library's memory and a
//!   caller's buffer), listed and written, locally and on the S3 server of
//!   `support::s3`; their misuse; a fork child refused the parent's writer.
//! - `object_wrapper_test.cpp`: the C++ wrapper's `Object`, `read_into`,
//!   `write_object` and `ObjectWriter`, locally and on the S3 server.
//! - `wrapper_test.cpp` and the example `trainer.cpp`: the C++ wrapper,
//!   alone and (`--node`) as a consumer of a node engine.
//!
//!
//! `abi_misuse.c`, `abi_races.c` and `abi_objects.c` run a second time built without
//! sanitizers under valgrind's memcheck, which sees what ASan cannot: reads
//! of uninitialised memory, and the Rust library's own heap (ASan instruments
//! only the C program).
//!
//! Needs a C and a C++ compiler (`cc`, `c++`, or `$CC`, `$CXX`) with the
//! sanitizer runtimes, and valgrind; a missing one fails the test, it is
//! never skipped (`scripts/test.sh` installs them).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ringfeed_test_support as support;

use ringfeed::consumer::{AnyNext, Attached};
use ringfeed::node::{self, NodeOptions};
use ringfeed::synth::{self, GenOptions};
use serde_json::{Value, json};
use support::s3::{ACCESS_KEY, S3Server, SECRET_KEY};

const LIB: &str = "libringfeed.so";

/// Flags every C program is built with.
const C_FLAGS: &[&str] = &["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"];

/// ... and, except for valgrind's runs, these.
const SANITIZE: &[&str] = &["-fsanitize=address,undefined", "-fno-sanitize-recover=all"];

/// Flags every C++ program is built with.
const CXX_FLAGS: &[&str] = &["-std=c++17", "-Wall", "-Wextra", "-Werror", "-g"];

/// Seed of the test shards' content; not 0, so a consumer ignoring it fails.
const SEED: u64 = 7;

/// Longest a test program may run. Not a performance bound: each finishes
/// in seconds; this only turns a hang into a failure with its output.
const RUN_LIMIT: Duration = Duration::from_secs(300);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Three shards of about 2 MiB, ~300 samples of a `jpg` (10-30 KB) and a
/// `cls` (8-64 bytes): small enough to stream under `ASan` in well under a
/// second, large enough for several batches per worker. `tests/c/common.h`
/// checks the field sizes against these numbers.
struct Shards {
    _dir: tempfile::TempDir,
    paths: Vec<PathBuf>,
    samples: u64,
    bytes: u64,
}

fn shards() -> Shards {
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
    Shards {
        paths: report.paths,
        samples: report.samples,
        bytes: report.payload_bytes,
        _dir: dir,
    }
}

impl Shards {
    /// `SEED SAMPLES BYTES SHARD...`, the arguments the stream tests take.
    fn args(&self) -> Vec<String> {
        let mut a = vec![
            SEED.to_string(),
            self.samples.to_string(),
            self.bytes.to_string(),
        ];
        a.extend(self.paths.iter().map(|p| p.display().to_string()));
        a
    }
}

/// The directory holding a fresh `libringfeed.so`.
///
/// `cargo test` and `cargo nextest run` build the library's cdylib next to
/// the test binary (`target/<profile>/deps/`), from the same sources as the
/// test, so that copy is current. Only when it is missing (a test binary run
/// from elsewhere) is the library built with `cargo build --lib`; the copy
/// uplifted to `target/<profile>/` may be stale, so it is never used as is.
fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("path of the test binary");
        let deps = exe.parent().expect("the test binary's directory");
        if deps.join(LIB).is_file() {
            return deps.to_path_buf();
        }
        let profile_dir = if deps.ends_with("deps") {
            deps.parent().expect("target/<profile>")
        } else {
            deps
        };
        let profile = profile_dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("profile directory name");
        let mut target_dir = profile_dir.parent().expect("target directory");
        // The compiler beside this cargo, none of this run's variables.
        let mut cmd = support::cargo::command();
        cmd.args(["build", "--lib", "--manifest-path"])
            .arg(root().join("Cargo.toml"))
            .args([
                "--profile",
                if profile == "debug" { "dev" } else { profile },
            ]);
        // target/<triple>/<profile> when built for an explicit target.
        if !target_dir.join("CACHEDIR.TAG").is_file()
            && let (Some(triple), Some(up)) = (target_dir.file_name(), target_dir.parent())
            && up.join("CACHEDIR.TAG").is_file()
        {
            cmd.arg("--target").arg(triple);
            target_dir = up;
        }
        cmd.arg("--target-dir").arg(target_dir);
        let status = cmd.status().expect("run cargo build --lib");
        assert!(status.success(), "cargo build --lib failed: {status}");
        assert!(
            profile_dir.join(LIB).is_file(),
            "cargo build --lib did not produce {}",
            profile_dir.join(LIB).display()
        );
        profile_dir.to_path_buf()
    })
}

/// A directory holding the library under the two names a program linked
/// with `-lringfeed` needs: `libringfeed.so` to link, and the SONAME that
/// build.rs gives it, `libringfeed.so.<MAJOR>`, to run (build.rs links
/// that name in the profile directory too). Both are links to this
/// process's copy of the library of
/// [`lib_dir`], made in the test's temporary directory under target/, not
/// in cargo's own directories. A copy, not the file cargo made: a test
/// binary running at the same time that builds an example
/// (cli/tests/objects.rs) relinks that file, and a program started in
/// the moment it is gone found no `libringfeed.so.0` to load.
fn link_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let built = lib_dir().join(LIB);
        // One directory per profile: `cargo test` and `cargo test --release`
        // share CARGO_TARGET_TMPDIR.
        let profile = lib_dir()
            .components()
            .rev()
            .map(|c| c.as_os_str().to_string_lossy())
            .find(|c| c != "deps")
            .expect("profile directory name");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c_abi-lib-{profile}"));
        std::fs::create_dir_all(&dir).expect("create the library link directory");
        // Copies of test processes gone are removed (a running one's
        // programs may still load its own).
        let prefix = format!("{LIB}.copy.");
        for e in std::fs::read_dir(&dir)
            .expect("list the library link directory")
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix(&prefix)
                && !Path::new("/proc").join(pid).exists()
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let lib = dir.join(format!("{prefix}{}", std::process::id()));
        std::fs::copy(&built, &lib).expect("copy the library");
        let soname = format!("{LIB}.{}", env!("CARGO_PKG_VERSION_MAJOR"));
        for name in [LIB, soname.as_str()] {
            // Made aside and renamed over the old link: test processes
            // running at once (nextest) each replace it atomically.
            let tmp = dir.join(format!("{name}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&lib, &tmp).expect("link the library");
            std::fs::rename(&tmp, dir.join(name)).expect("put the library link in place");
        }
        dir
    })
}

fn compiler(env_var: &str, default: &str) -> String {
    std::env::var(env_var).unwrap_or_else(|_| default.to_string())
}

/// Runs a compiler command; a missing compiler or any diagnostic fails.
fn compile(mut cmd: Command, what: &str) {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run `{program}` to build {what} ({e}): the C ABI tests need a C and a C++ \
             compiler with ASan/UBSan (gcc/g++ or clang); set CC/CXX to choose them"
        )
    });
    assert!(
        out.status.success(),
        "building {what} failed ({}):\n{cmd:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles and links one C or C++ test program against the cdylib, with
/// ASan and UBSan.
fn build(src: &str, out_dir: &Path, cxx: bool) -> PathBuf {
    build_with(src, out_dir, cxx, true)
}

/// As [`build`]; `sanitize` false leaves the sanitizers out (for valgrind,
/// which cannot run an ASan program). The executable is named after the
/// source, with `-plain` for a build without sanitizers.
fn build_with(src: &str, out_dir: &Path, cxx: bool, sanitize: bool) -> PathBuf {
    let src = root().join(src);
    let stem = src.file_stem().expect("source file name").to_string_lossy();
    let exe = out_dir.join(if sanitize {
        stem.into_owned()
    } else {
        format!("{stem}-plain")
    });
    let lib = link_dir();
    let mut cmd = if cxx {
        let mut c = Command::new(compiler("CXX", "c++"));
        c.args(CXX_FLAGS);
        c
    } else {
        let mut c = Command::new(compiler("CC", "cc"));
        c.args(C_FLAGS);
        c
    };
    if sanitize {
        cmd.args(SANITIZE);
    }
    cmd.arg(format!(
        "-DRINGFEED_EXPECTED_VERSION=\"{}\"",
        env!("CARGO_PKG_VERSION")
    ))
    .arg("-I")
    .arg(root().join("include"))
    .arg("-I")
    .arg(root().join("bindings/cpp"))
    .arg("-I")
    .arg(root().join("tests/c"))
    .arg("-o")
    .arg(&exe)
    .arg(&src)
    .arg("-L")
    .arg(lib)
    .arg(format!("-Wl,-rpath,{}", lib.display()))
    .arg("-lringfeed")
    .arg("-pthread");
    compile(cmd, &src.display().to_string());
    exe
}

/// Runs a test program to completion (or `RUN_LIMIT`) and returns its output.
fn run(exe: &Path, args: &[String]) -> Output {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    run_command(cmd, exe)
}

/// Runs `cmd` (a test program, or a tool running `exe`) as [`run`] does.
fn run_command(mut cmd: Command, exe: &Path) -> Output {
    // The rpath names the library to test; cargo's LD_LIBRARY_PATH must
    // not swap in another copy.
    cmd.env_remove("LD_LIBRARY_PATH")
        .env("UBSAN_OPTIONS", "print_stacktrace=1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| {
        panic!(
            "cannot run {:?} for {}: {e}",
            cmd.get_program(),
            exe.display()
        )
    });
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = pipe(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let stderr = pipe(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the test program") {
            break status;
        }
        if start.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} ran past {RUN_LIMIT:?}: hung\nstdout:\n{}\nstderr:\n{}",
                exe.display(),
                String::from_utf8_lossy(&stdout.join().unwrap_or_default()),
                String::from_utf8_lossy(&stderr.join().unwrap_or_default())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

/// Runs a test program and fails, with its output, unless it exits 0.
fn run_ok(exe: &Path, args: &[String]) -> String {
    output_ok(run(exe, args), exe, args)
}

/// The program's stdout, or a failure with its output unless it exited 0.
fn output_ok(out: Output, exe: &Path, args: &[String]) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Shown by `cargo test -- --nocapture`, and on failure.
    println!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "{} {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        exe.display(),
        out.status
    );
    stdout
}

#[test]
fn c_stream_delivers_every_sample_once_with_its_bytes() {
    let data = shards();
    let tmp = tempfile::tempdir().unwrap();
    let exe = build("tests/c/abi_stream.c", tmp.path(), false);
    let out = run_ok(&exe, &data.args());
    assert!(out.contains("abi_stream: all checks passed"), "{out}");
}

#[test]
fn c_epochs_split_resume_and_resume_elastically() {
    let data = shards();
    let tmp = tempfile::tempdir().unwrap();
    let exe = build("tests/c/abi_epochs.c", tmp.path(), false);
    let out = run_ok(&exe, &data.args());
    assert!(out.contains("abi_epochs: all checks passed"), "{out}");
}

#[test]
fn c_layout_sources_shared_arena_and_gather() {
    let data = shards();
    let tmp = tempfile::tempdir().unwrap();
    let exe = build("tests/c/abi_layout.c", tmp.path(), false);
    let out = run_ok(&exe, &data.args());
    assert!(out.contains("abi_layout: all checks passed"), "{out}");
}

/// Shards of small PNGs (one truncated: `s1/0002`) and labels, for the
/// image pipeline's C test.
fn png_shards(dir: &Path) -> Vec<String> {
    let mut urls = Vec::new();
    for s in 0..2u32 {
        let mut tar = Vec::new();
        for i in 0..9u32 {
            let (w, h) = (11 + i, 7 + (i * 3) % 5);
            let px: Vec<u8> = (0..w * h * 3)
                .map(|k| (k * 13 + i * 29 + s * 7) as u8)
                .collect();
            let mut png = Vec::new();
            let mut e = png::Encoder::new(&mut png, w, h);
            e.set_color(png::ColorType::Rgb);
            e.write_header().unwrap().write_image_data(&px).unwrap();
            if (s, i) == (1, 2) {
                png.truncate(png.len() / 2);
            }
            let key = format!("s{s}/{i:04}");
            synth::write_member(&mut tar, &format!("{key}.png"), &png).unwrap();
            let label = (s * 9 + i).to_string();
            synth::write_member(&mut tar, &format!("{key}.cls"), label.as_bytes()).unwrap();
        }
        tar.extend_from_slice(&[0u8; 1024]);
        let path = dir.join(format!("images-{s}.tar"));
        std::fs::write(&path, tar).unwrap();
        urls.push(path.display().to_string());
    }
    urls
}

#[test]
fn c_reads_the_image_pipelines_tensors_as_rust_does() {
    let tmp = tempfile::tempdir().unwrap();
    let urls = png_shards(tmp.path());
    let exe = build("tests/c/abi_transform.c", tmp.path(), false);
    let mut args = vec!["1".to_string()];
    args.extend(urls.iter().cloned());
    let out = run_ok(&exe, &args);
    assert!(out.contains("abi_transform: all checks passed"), "{out}");
    let from_c: Vec<&str> = out.lines().filter(|l| l.starts_with('s')).collect();
    // The same configuration in Rust: the same samples, pixels and labels.
    let cfg = ringfeed::Config::from_json(
        &json!({"urls": urls, "batch_size": 5, "seed": 3, "shuffle": true, "workers": 2,
                "memory_budget": "64MiB", "chunk_size": "1MiB", "pin_cpus": false,
                "image_errors": "skip",
                "transform": {"png": {"resize": [8, 6], "flip": 0.5, "layout": "hwc"},
                              "cls": "int64"}})
        .to_string(),
    )
    .unwrap();
    let loader = ringfeed::Loader::open(cfg).unwrap();
    let mut from_rust = Vec::new();
    loop {
        match loader.next(Some(Duration::from_secs(60))).unwrap() {
            ringfeed::Next::Batch(b) => {
                for s in b.samples() {
                    let f: std::collections::BTreeMap<&[u8], &[u8]> = s.fields().collect();
                    let hash = f[&b"png"[..]].iter().fold(1469598103934665603u64, |h, &x| {
                        (h ^ u64::from(x)).wrapping_mul(1099511628211)
                    });
                    let label = i64::from_le_bytes(f[&b"cls"[..]].try_into().unwrap());
                    from_rust.push(format!(
                        "{} {hash:016x} {label}",
                        String::from_utf8_lossy(s.key())
                    ));
                }
            }
            ringfeed::Next::EndOfEpoch(_) => {}
            ringfeed::Next::Finished => break,
            ringfeed::Next::Timeout => panic!("stalled"),
        }
    }
    assert_eq!(from_rust.len(), 17, "18 samples, one broken");
    assert_eq!(from_c, from_rust);
}

#[test]
fn a_program_built_against_the_previous_header_runs_on_this_library() {
    let data = shards();
    let tmp = tempfile::tempdir().unwrap();
    // Its own include line names the frozen header (tests/c/abi1_previous).
    let exe = build("tests/c/abi_old_layout.c", tmp.path(), false);
    let out = run_ok(&exe, &data.args());
    assert!(out.contains("abi_old_layout: all checks passed"), "{out}");
}

#[test]
fn c_misuse_returns_documented_errors_and_never_crashes() {
    let data = shards();
    let tmp = tempfile::tempdir().unwrap();
    let exe = build("tests/c/abi_misuse.c", tmp.path(), false);
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let mut args = vec![scratch.display().to_string()];
    args.extend(data.args());
    let out = run_ok(&exe, &args);
    assert!(out.contains("abi_misuse: all checks passed"), "{out}");
}

#[test]
fn c_races_of_threads_and_fork_give_statuses_only() {
    let data = shards();
    let tmp = tempfile::tempdir().unwrap();
    let exe = build("tests/c/abi_races.c", tmp.path(), false);
    let out = run_ok(&exe, &data.args());
    assert!(out.contains("abi_races: all checks passed"), "{out}");
    // Forks in the middle, at full speed: the build without sanitizers
    // (ASan's allocator is not fork-safe; abi_races.c says why).
    let dir = tmp.path().join("plain");
    std::fs::create_dir(&dir).unwrap();
    let plain = build_with("tests/c/abi_races.c", &dir, false, false);
    let out = run_ok(&plain, &data.args());
    assert!(out.contains("the first streamed its own epoch"), "{out}");
    assert!(out.contains("abi_races: all checks passed"), "{out}");
}

/// Runs `exe` under valgrind's memcheck: any memory error it reports fails
/// the run (`--error-exitcode`), in the program or in a child it forks.
/// Leaks are not errors here: LeakSanitizer checks them in the ASan builds,
/// and a child of fork() (`abi_races.c`) ends holding a copy of heap whose
/// owners, the parent's threads, it does not have.
fn run_valgrind(exe: &Path, args: &[String]) -> String {
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--error-exitcode=1",
        "--quiet",
        // Threads take turns round-robin, so racing calls interleave.
        "--fair-sched=yes",
    ])
    .arg(exe)
    .args(args);
    if let Err(e) = Command::new("valgrind")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
    {
        panic!(
            "cannot run valgrind ({e}): the C ABI tests run abi_misuse.c and abi_races.c under \
             valgrind's memcheck; install it (apt-get install valgrind; scripts/test.sh does)"
        );
    }
    output_ok(run_command(cmd, exe), exe, args)
}

#[test]
fn c_misuse_and_races_are_clean_under_valgrind() {
    let data = shards();
    let tmp = tempfile::tempdir().unwrap();
    let misuse = build_with("tests/c/abi_misuse.c", tmp.path(), false, false);
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let mut args = vec![scratch.display().to_string()];
    args.extend(data.args());
    let out = run_valgrind(&misuse, &args);
    assert!(out.contains("abi_misuse: all checks passed"), "{out}");

    let races = build_with("tests/c/abi_races.c", tmp.path(), false, false);
    let out = run_valgrind(&races, &data.args());
    assert!(out.contains("the first streamed its own epoch"), "{out}");
    assert!(out.contains("abi_races: all checks passed"), "{out}");
}

/// The S3 server of `support::s3` with one bucket, and `abi_objects.c`'s
/// arguments: a scratch directory, then the endpoint, the keys and the
/// bucket.
fn objects_setup(tmp: &Path) -> (S3Server, Vec<String>) {
    let scratch = tmp.join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let root = tmp.join("s3");
    std::fs::create_dir_all(root.join("ckpt")).unwrap();
    let s3 = S3Server::start(&root);
    let args = vec![
        scratch.display().to_string(),
        s3.endpoint(),
        ACCESS_KEY.to_string(),
        SECRET_KEY.to_string(),
        "ckpt".to_string(),
    ];
    (s3, args)
}

#[test]
fn c_objects_read_list_write_and_refuse_misuse() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = build("tests/c/abi_objects.c", tmp.path(), false);
    let (s3, args) = objects_setup(tmp.path());
    let out = run_ok(&exe, &args);
    assert!(out.contains("s3: ok"), "{out}");
    assert!(out.contains("abi_objects: all checks passed"), "{out}");
    s3.assert_no_uploads_left();
}

#[test]
fn cpp_objects_read_write_move_and_abort_by_raii() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = build("tests/c/object_wrapper_test.cpp", tmp.path(), true);
    let (s3, args) = objects_setup(tmp.path());
    let out = run_ok(&exe, &args);
    assert!(out.contains("s3: ok"), "{out}");
    assert!(
        out.contains("object_wrapper_test: all checks passed"),
        "{out}"
    );
    s3.assert_no_uploads_left();
}

#[test]
fn c_objects_are_clean_under_valgrind() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = build_with("tests/c/abi_objects.c", tmp.path(), false, false);
    let (s3, args) = objects_setup(tmp.path());
    let out = run_valgrind(&exe, &args);
    assert!(out.contains("abi_objects: all checks passed"), "{out}");
    s3.assert_no_uploads_left();
}

#[test]
fn c_fallbacks_stream_without_mlock_or_io_uring() {
    let data = shards();
    let tmp = tempfile::tempdir().unwrap();
    let exe = build("tests/c/abi_fallbacks.c", tmp.path(), false);
    let out = run_ok(&exe, &data.args());
    assert!(out.contains("abi_fallbacks: all checks passed"), "{out}");
}

#[test]
fn cpp_wrapper_releases_moves_iterates_and_throws() {
    let data = shards();
    let tmp = tempfile::tempdir().unwrap();
    let exe = build("tests/c/wrapper_test.cpp", tmp.path(), true);
    let out = run_ok(&exe, &data.args());
    assert!(out.contains("wrapper_test: all checks passed"), "{out}");
}

/// A node engine served from a thread on a socket in a new directory, with
/// the keys `abi_node.c` gives its consumers (the dataset and layout keys
/// must agree).
fn node_engine(data: &Shards) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("node.sock");
    let listener = node::sock::listen(&socket).unwrap();
    let config = json!({
        "urls": data.paths,
        "batch_size": 7,
        "memory_budget": "64MiB",
        "chunk_size": "1MiB",
    });
    let opts = NodeOptions {
        socket: socket.clone(),
        config: ringfeed::Config::from_map(config.as_object().unwrap()).unwrap(),
        linger: None,
    };
    std::thread::spawn(move || node::serve(listener, opts).unwrap());
    (dir, socket)
}

/// `SOCKET MODE SEED SAMPLES BYTES SHARD...`, what `abi_node.c` takes.
fn node_args(socket: &Path, mode: &str, data: &Shards) -> Vec<String> {
    let mut args = vec![socket.display().to_string(), mode.to_string()];
    args.extend(data.args());
    args
}

#[test]
fn cpp_wrapper_consumer_attached_to_a_node_engine_gets_every_sample() {
    let data = shards();
    let (_engine_dir, socket) = node_engine(&data);
    let tmp = tempfile::tempdir().unwrap();
    let exe = build("tests/c/wrapper_test.cpp", tmp.path(), true);
    let mut args = vec!["--node".to_string(), socket.display().to_string()];
    args.extend(data.args());
    let out = run_ok(&exe, &args);
    assert!(out.contains("through the node engine"), "{out}");
    assert!(out.contains("wrapper_test: all checks passed"), "{out}");
}

#[test]
fn c_consumer_attached_to_a_node_engine_gets_every_sample() {
    let data = shards();
    let (_engine_dir, socket) = node_engine(&data);
    let tmp = tempfile::tempdir().unwrap();
    let exe = build("tests/c/abi_node.c", tmp.path(), false);
    let out = run_ok(&exe, &node_args(&socket, "stream", &data));
    assert!(out.contains("abi_node: all checks passed"), "{out}");
}

#[test]
fn node_engine_takes_back_the_batches_of_a_c_consumer_that_crashed() {
    use std::os::unix::process::ExitStatusExt;
    let data = shards();
    let (_engine_dir, socket) = node_engine(&data);
    let tmp = tempfile::tempdir().unwrap();
    let exe = build("tests/c/abi_node.c", tmp.path(), false);
    // A consumer in this process, attached throughout: its stats show the
    // engine's view of every consumer.
    let cfg = json!({
        "urls": data.paths,
        "batch_size": 7,
        "memory_budget": "64MiB",
        "chunk_size": "1MiB",
        "node": socket,
    });
    let watcher = Attached::open_json(&cfg.to_string()).unwrap();
    let AnyNext::Batch(mine) = watcher.next(Some(Duration::from_secs(60))).unwrap() else {
        panic!("no batch for the watcher");
    };
    let out = run(&exe, &node_args(&socket, "crash", &data));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "the crash mode did not die of SIGKILL ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("crashing with 3 batches held"),
        "{stdout}{stderr}"
    );
    // The engine sees the hang-up and drops what the crashed consumer held:
    // what remains held is the watcher's alone (its one batch, and records
    // waiting in its ring).
    let node_stats = || -> Value {
        let (text, _) = watcher.stats().unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        v["node"].clone()
    };
    let start = Instant::now();
    loop {
        let n = node_stats();
        let (consumers, all, own) = (
            n["consumers"].as_u64().unwrap(),
            n["batches_held"].as_u64().unwrap(),
            n["batches_held_by_this_consumer"].as_u64().unwrap(),
        );
        if consumers == 1 && all == own {
            assert!(own >= 1, "the watcher holds a batch: {n}");
            assert_eq!(n["consumers_attached"], 2, "{n}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the crashed consumer's batches were not taken back: {n}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(mine);
    watcher.close();
}

/// Sum of every payload byte of the shards, read with the `tar` crate: what
/// the trainer's per-epoch byte sum must equal.
fn payload_byte_sum(paths: &[PathBuf]) -> (u64, u64) {
    let (mut sum, mut bytes) = (0u64, 0u64);
    for p in paths {
        let mut archive = tar::Archive::new(std::fs::File::open(p).unwrap());
        for entry in archive.entries().unwrap() {
            let mut data = Vec::new();
            entry.unwrap().read_to_end(&mut data).unwrap();
            bytes += data.len() as u64;
            sum = data.iter().fold(sum, |s, &b| s.wrapping_add(u64::from(b)));
        }
    }
    (sum, bytes)
}

#[test]
fn cpp_trainer_example_reads_every_byte_each_epoch() {
    let data = shards();
    let tmp = tempfile::tempdir().unwrap();
    let exe = build("bindings/cpp/examples/trainer.cpp", tmp.path(), true);
    let (sum, bytes) = payload_byte_sum(&data.paths);
    assert_eq!(
        bytes, data.bytes,
        "the tar crate and synth disagree on the payload"
    );
    let mut args: Vec<String> = [
        "--epochs",
        "2",
        "--batch-size",
        "16",
        "--memory-budget",
        "64MiB",
        "--chunk-size",
        "1MiB",
    ]
    .map(String::from)
    .to_vec();
    args.extend(data.paths.iter().map(|p| p.display().to_string()));
    let out = run_ok(&exe, &args);
    for epoch in 0..2 {
        let want = format!(
            "epoch {epoch}: samples={} bytes={} byte_sum={sum}",
            data.samples, data.bytes
        );
        assert!(out.contains(&want), "trainer output lacks `{want}`:\n{out}");
    }
    let total = format!(
        "stats: samples_delivered={} bytes_delivered={}",
        2 * data.samples,
        2 * data.bytes
    );
    assert!(
        out.contains(&total),
        "trainer output lacks `{total}`:\n{out}"
    );

    // A dataset that does not exist: the wrapper's exception, reported.
    let missing = tmp.path().join("no-such-shard.tar").display().to_string();
    let out = run(&exe, std::slice::from_ref(&missing));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "trainer on a missing shard: {stderr}"
    );
    assert!(
        stderr.contains("RINGFEED_ERR_DATASET") && stderr.contains(&missing),
        "trainer's error does not name the status and the path: {stderr}"
    );
}

/// Each public header compiles on its own, in every language it serves, with
/// warnings as errors, and survives being included twice.
#[test]
fn headers_compile_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &[&str])] = &[
        ("CC", "c", &["-std=c11", "-Wpedantic"]),
        ("CC", "c", &["-std=c99", "-Wpedantic"]),
        ("CXX", "c++", &["-std=c++11", "-Wpedantic"]),
        ("CXX", "c++", &["-std=c++17", "-Wpedantic"]),
    ];
    for (var, lang, flags) in cases {
        let tu = tmp.path().join(format!("h.{lang}"));
        std::fs::write(&tu, "#include \"ringfeed.h\"\n#include \"ringfeed.h\"\n").unwrap();
        let mut cmd = Command::new(compiler(var, if *lang == "c" { "cc" } else { "c++" }));
        cmd.args(["-x", lang, "-fsyntax-only", "-Wall", "-Wextra", "-Werror"])
            .args(*flags)
            .arg("-I")
            .arg(root().join("include"))
            .arg(&tu);
        compile(cmd, &format!("include/ringfeed.h as {lang} {flags:?}"));
    }
    let tu = tmp.path().join("hpp.cpp");
    std::fs::write(
        &tu,
        "#include \"ringfeed.hpp\"\n#include \"ringfeed.hpp\"\nint main() { return 0; }\n",
    )
    .unwrap();
    let mut cmd = Command::new(compiler("CXX", "c++"));
    cmd.args([
        "-fsyntax-only",
        "-std=c++17",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wpedantic",
    ])
    .args([
        "-Wshadow",
        "-Wconversion",
        "-Wsign-conversion",
        "-Wold-style-cast",
    ])
    .arg("-I")
    .arg(root().join("include"))
    .arg("-I")
    .arg(root().join("bindings/cpp"))
    .arg(&tu);
    compile(cmd, "bindings/cpp/ringfeed.hpp");
}
