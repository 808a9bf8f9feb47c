//! The tests' S3-compatible server (`examples/s3_server.rs`, run as a
//! program: this crate does not build the root crate's test support) on a
//! free port, and the environment a command needs to reach it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;

#[path = "../../../tests/support/cargo.rs"]
mod cargo;

pub const ACCESS_KEY: &str = "AKIARINGFEEDTEST";
pub const SECRET_KEY: &str = "ringfeed-test-secret-0123456789abcdef";

/// `examples/s3_server`, built by cargo next to this test's target
/// directory (a no-op when it is current).
fn s3_server_bin() -> &'static Path {
    static BIN_PATH: OnceLock<PathBuf> = OnceLock::new();
    BIN_PATH.get_or_init(|| example_bin("s3_server"))
}

/// The root crate's example `name`, built by cargo next to this test's
/// target directory: a no-op when it is current, as it is after the test
/// command's build. The command selects the workspace's default members
/// (no `-p`), as `cargo build --example NAME` in the repository does:
/// `-p ringfeed` alone resolves the dependencies' features without the
/// CLI's, so it compiled ring, rustls, reqwest and the library a second
/// time inside a test (3 CPU-minutes of CI), and the two builds replaced
/// each other's `libringfeed.so` at every run.
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/NAME-HASH
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let profile = profile_dir.file_name().unwrap().to_str().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    // The compiler beside this cargo, none of this run's variables.
    let mut cargo = cargo::command();
    let status = cargo
        .args(["build", "--example", name, "--manifest-path"])
        .arg(root.join("Cargo.toml"))
        .arg("--profile")
        .arg(if profile == "debug" { "dev" } else { profile })
        .arg("--target-dir")
        .arg(profile_dir.parent().unwrap())
        .status()
        .unwrap_or_else(|e| panic!("run cargo build --example {name}: {e}"));
    assert!(status.success(), "cargo build --example {name} failed");
    profile_dir.join("examples").join(name)
}

/// The server, serving a temporary directory whose folders are buckets;
/// it stops when dropped (its stdin closes) or killed.
pub struct S3 {
    child: Child,
    _stdin: ChildStdin,
    pub endpoint: String,
    pub root: tempfile::TempDir,
}

impl S3 {
    pub fn start(buckets: &[&str]) -> S3 {
        let root = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(s3_server_bin());
        cmd.arg(root.path());
        for b in buckets {
            cmd.args(["--bucket", b]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let endpoint = line.trim().to_string();
        assert!(endpoint.starts_with("http://127.0.0.1:"), "{line}");
        S3 {
            child,
            _stdin: stdin,
            endpoint,
            root,
        }
    }

    /// Where the server keeps `bucket/key` (s3s-fs keeps objects as files).
    pub fn path(&self, bucket: &str, key: &str) -> PathBuf {
        self.root.path().join(bucket).join(key)
    }

    /// Writes an object into the store directly.
    pub fn put(&self, bucket: &str, key: &str, data: &[u8]) {
        let p = self.path(bucket, key);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }

    /// The object's bytes, if it exists.
    pub fn stored(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        std::fs::read(self.path(bucket, key)).ok()
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `cmd` with the server's credentials in its environment (the way a user
/// gives them: never on the command line) and nothing of the caller's AWS
/// settings.
pub fn with_credentials(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        // No profile files of the machine's user.
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
}
