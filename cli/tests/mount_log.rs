//! `ringfeed mount --daemon`'s log: by default in this user's private
//! directory (`$XDG_RUNTIME_DIR/ringfeed`), never in the shared temporary
//! directory; mode 0600; and a symbolic link planted at the name given
//! with `--log-file` is refused, not followed to the file it names. The
//! mounts here fail (their mount point does not exist) once the log is
//! open, which is all these tests need: no FUSE.

use std::os::unix::fs::{MetadataExt, symlink};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ringfeed");

/// `ringfeed mount SRC MISSING --daemon [args]` with `XDG_RUNTIME_DIR`
/// and `TMPDIR` set; returns its pid and what it said.
fn mount_daemon(
    xdg: &std::path::Path,
    tmp: &std::path::Path,
    args: &[&str],
) -> (u32, std::process::Output) {
    let src = tempfile::tempdir().unwrap();
    let missing = src.path().join("no-such-mount-point");
    let child = Command::new(BIN)
        .arg("mount")
        .arg(src.path())
        .arg(&missing)
        .arg("--daemon")
        .args(args)
        .env("XDG_RUNTIME_DIR", xdg)
        .env("TMPDIR", tmp)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    (pid, child.wait_with_output().unwrap())
}

#[test]
fn the_daemons_log_is_private_and_not_in_the_shared_temporary_directory() {
    let (xdg, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (pid, out) = mount_daemon(xdg.path(), tmp.path(), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the mount point is missing: {err}");
    let log = xdg.path().join(format!("ringfeed/mount-{pid}.log"));
    let m =
        std::fs::symlink_metadata(&log).unwrap_or_else(|e| panic!("{}: {e}; {err}", log.display()));
    assert!(m.is_file());
    assert_eq!(m.mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("no-such-mount-point"),
        "the child's error is in its log: {text}"
    );
    let dir = std::fs::metadata(xdg.path().join("ringfeed")).unwrap();
    assert_eq!(dir.mode() & 0o777, 0o700);
    let in_tmp: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(in_tmp.is_empty(), "nothing in TMPDIR: {in_tmp:?}");
}

#[test]
fn a_link_planted_at_the_log_file_is_refused_not_followed() {
    let (xdg, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, b"the user's own file\n").unwrap();
    let planted = tmp.path().join("mount.log");
    symlink(&victim, &planted).unwrap();
    let (_, out) = mount_daemon(
        xdg.path(),
        tmp.path(),
        &["--log-file", planted.to_str().unwrap()],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("a symbolic link: refused, not followed"),
        "{err}"
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"the user's own file\n");
    // Control: a plain create, as the log was made before, follows the
    // link and empties the file it names.
    std::fs::File::create(&planted).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"");
    // A --log-file that is no link is made, 0600, and holds the log.
    let named = tmp.path().join("named.log");
    let (_, out) = mount_daemon(
        xdg.path(),
        tmp.path(),
        &["--log-file", named.to_str().unwrap()],
    );
    assert!(!out.status.success());
    assert_eq!(std::fs::metadata(&named).unwrap().mode() & 0o777, 0o600);
    assert!(
        std::fs::read_to_string(&named)
            .unwrap()
            .contains("no-such-mount-point")
    );
}
