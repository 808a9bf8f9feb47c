//! The README's C example, as written: its program (the `c` block under
//! "Using it from C") built and run with the two commands of the `sh`
//! block after it, from a directory laid out as the repository's root
//! (its `include` and `target`), on shards the CLI generates. The
//! program's own count is checked against the shards'. Nothing links the
//! SONAME by hand: the build made `target/release/libringfeed.so.0`.

mod support;

use std::path::Path;
use std::process::Command;

/// The first fenced block of `lang` after `heading` in `text`.
fn block_after<'a>(text: &'a str, heading: &str, lang: &str, from: usize) -> (&'a str, usize) {
    let at = text[from..]
        .find(heading)
        .map(|i| from + i)
        .expect("heading in README");
    let fence = format!("```{lang}\n");
    let start = text[at..]
        .find(&fence)
        .map(|i| at + i + fence.len())
        .expect("code block");
    let end = text[start..]
        .find("\n```")
        .map(|i| start + i)
        .expect("closed block");
    (&text[start..end + 1], end)
}

#[test]
fn the_readme_c_example_builds_and_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = root.join("target/release/libringfeed.so");
    if !lib.exists() {
        support::skip::skip("target/release/libringfeed.so is not built (cargo build --release)");
        return;
    }
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let (program, end) = block_after(&readme, "## Using it from C", "c", 0);
    let (commands, _) = block_after(&readme, "Built against the build tree", "sh", end);
    let lines: Vec<&str> = commands.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 2, "{commands}");
    assert!(
        lines[0].starts_with("cc ") && lines[1].starts_with("./app "),
        "{commands}"
    );

    // A directory laid out as the repository's root.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("app.c"), program).unwrap();
    std::os::unix::fs::symlink(root.join("include"), d.join("include")).unwrap();
    std::os::unix::fs::symlink(root.join("target"), d.join("target")).unwrap();
    std::fs::create_dir(d.join("shards")).unwrap();
    let (mut samples, mut bytes) = (0u64, 0u64);
    for i in 0..4usize {
        let mut tar = Vec::new();
        for j in 0..(20 + i as u64) {
            let key = ringfeed::synth::sample_key(i, j);
            for (field, len) in [("bin", 1000 + 37 * j as usize), ("cls", 1)] {
                let data = vec![b'7'; len];
                ringfeed::synth::write_member(&mut tar, &format!("{key}.{field}"), &data).unwrap();
                bytes += len as u64;
            }
            samples += 1;
        }
        tar.extend_from_slice(&[0u8; 1024]);
        std::fs::write(d.join(format!("shards/train-{i:04}.tar")), tar).unwrap();
    }
    let sh = |line: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(line)
            .current_dir(d)
            .env_remove("LD_LIBRARY_PATH")
            .output()
            .unwrap()
    };
    let built = sh(lines[0]);
    assert!(
        built.status.success(),
        "{}: {}",
        lines[0],
        String::from_utf8_lossy(&built.stderr)
    );
    let ran = sh(lines[1]);
    let out = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "{}: {out} {}",
        lines[1],
        String::from_utf8_lossy(&ran.stderr)
    );
    assert_eq!(out.trim(), format!("{samples} samples, {bytes} bytes"));
}
