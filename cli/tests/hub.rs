//! `ringfeed ls`, `cat`, `get` and `bench` over `hf://` URLs, against the Hub
//! emulator (tests/support/hub) run in this process, its endpoint given to
//! each command in its own environment (`HF_ENDPOINT`, `HF_TOKEN`, an
//! empty `HF_HOME`): the listing shows the tree's sizes, `cat`'s bytes are
//! the generator's, `get` writes the file as it is, `bench` reads every
//! sample, and a private dataset without the token fails naming it, never
//! the token; `mount` shows a dataset's files read-only, byte for byte.

use std::path::Path;
use std::process::{Command, Output};

use ringfeed::synth::{self, GenOptions};

// Shared with the root crate, whose rust-version (1.85) has no `if let`
// chains: clippy's suggestion of them (for this crate's 1.88) is not taken.
#[allow(clippy::collapsible_if)]
#[path = "../../tests/support/store/mod.rs"]
mod store;

#[allow(clippy::collapsible_if)]
#[path = "../../tests/support/hub/mod.rs"]
mod hub;

#[path = "../../tests/support/skip.rs"]
mod skip;

const BIN: &str = env!("CARGO_BIN_EXE_ringfeed");
const SEED: u64 = 9;
const TOKEN: &str = "hf_CliEmulatorToken0123456789abcdefXYZ";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `ringfeed ARGS` with the Hub's variables for `hub`.
fn run(hub: &hub::HubEmulator, home: &Path, token: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("HF_ENDPOINT", hub.endpoint())
        .env("HF_HOME", home)
        .env_remove("HF_TOKEN")
        .env_remove("HUGGING_FACE_HUB_TOKEN")
        .env_remove("HF_TOKEN_PATH")
        .env_remove("HF_HUB_OFFLINE");
    if let Some(t) = token {
        c.env("HF_TOKEN", t);
    }
    c.output().unwrap()
}

fn ok(o: Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what}: {}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stdout)
}

#[test]
fn ls_cat_and_bench_read_hub_datasets() {
    let root = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let o = GenOptions {
        shards: 3,
        shard_bytes: 1 << 20,
        sample_bytes: 40_000,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed: SEED,
    };
    let made = synth::generate(&root.path().join("org/private/data"), &o, |_| {}).unwrap();
    let hub = hub::HubEmulator::start(
        root.path(),
        hub::Options {
            token: Some(TOKEN.into()),
            private: vec!["org/private".into()],
            ..hub::Options::default()
        },
    )
    .unwrap();
    let h = home.path();
    let url = "hf://datasets/org/private/data";

    let out = ok(run(&hub, h, Some(TOKEN), &["ls", url]), "ls");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let mut total = 0;
    for (i, line) in lines[..3].iter().enumerate() {
        let size = made.paths[i].metadata().unwrap().len();
        total += size;
        let cols: Vec<&str> = line.split_whitespace().collect();
        let name = format!("{url}/shard-{i:06}.tar");
        assert_eq!(cols, [size.to_string(), name], "{out}");
    }
    assert!(
        lines[3].starts_with(&format!("3 shards, {total} bytes")),
        "{out}"
    );
    assert_eq!(
        hub.stats()
            .resolves
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the sizes are the tree's: no HEAD"
    );

    let key = synth::sample_key(1, 3);
    let shard = format!("{url}/shard-000001.tar");
    for field in ["jpg", "cls"] {
        let o = run(
            &hub,
            h,
            Some(TOKEN),
            &["cat", &shard, "--key", &key, "--field", field],
        );
        let bytes = o.stdout.clone();
        ok(o, "cat");
        assert!(!bytes.is_empty());
        assert!(
            synth::verify(SEED, key.as_bytes(), field.as_bytes(), &bytes),
            "{field}"
        );
    }
    let all = ok(run(&hub, h, Some(TOKEN), &["cat", url]), "cat all");
    assert_eq!(all.lines().count() as u64, made.samples);

    // A whole object: the file's bytes, as they are on the Hub.
    let got = root.path().join("got.tar");
    let g = got.to_str().unwrap();
    ok(run(&hub, h, Some(TOKEN), &["get", &shard, "-o", g]), "get");
    assert_eq!(
        std::fs::read(&got).unwrap(),
        std::fs::read(&made.paths[1]).unwrap()
    );

    let out = run(&hub, h, Some(TOKEN), &["bench", url, "--epochs", "1"]);
    let report = format!("{}{}", text(&out.stdout), text(&out.stderr));
    ok(out, "bench");
    // "samples       78 in 3 batches; ..."
    let read = report
        .lines()
        .find_map(|l| l.strip_prefix("samples"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok());
    assert_eq!(read, Some(made.samples), "{report}");

    // Without the token: named, at once, and never a token in it.
    let o = run(&hub, h, None, &["ls", url]);
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{}", text(&o.stdout));
    assert!(
        err.contains("org/private") && err.contains("RepoNotFound"),
        "{err}"
    );
    assert!(err.contains("no token was sent"), "{err}");
    let o = run(
        &hub,
        h,
        Some("hf_AnotherTokenThatIsWrong0123456789"),
        &["ls", url],
    );
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert!(
        !err.contains("hf_AnotherToken") && !err.contains(TOKEN),
        "{err}"
    );
    assert!(err.contains("Invalid credentials"), "{err}");
}

#[test]
fn a_hub_dataset_mounts_read_only_at_its_commit() {
    if !Path::new("/dev/fuse").exists() {
        crate::skip!("no /dev/fuse: FUSE mounts cannot be made here");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let o = GenOptions {
        shards: 2,
        shard_bytes: 3 << 20,
        sample_bytes: 60_000,
        spread: 0.5,
        fields: vec!["jpg".into(), "cls".into()],
        seed: SEED,
    };
    let made = synth::generate(&root.path().join("org/private/data"), &o, |_| {}).unwrap();
    let hub = hub::HubEmulator::start(
        root.path(),
        hub::Options {
            token: Some(TOKEN.into()),
            private: vec!["org/private".into()],
            ..hub::Options::default()
        },
    )
    .unwrap();
    let (h, mnt, log) = (
        home.path(),
        home.path().join("mnt"),
        home.path().join("mount.log"),
    );
    std::fs::create_dir(&mnt).unwrap();
    let (m, l) = (mnt.to_str().unwrap(), log.to_str().unwrap());
    let url = "hf://datasets/org/private/data";

    // Without the token: refused, naming the dataset, before mounting.
    let o = run(
        &hub,
        h,
        None,
        &["mount", url, m, "--daemon", "--log-file", l],
    );
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("org/private"), "{err}");
    assert!(!err.contains(TOKEN), "{err}");

    ok(
        run(
            &hub,
            h,
            Some(TOKEN),
            &["mount", url, m, "--daemon", "--log-file", l],
        ),
        "mount",
    );
    let read = || -> Vec<(String, Vec<u8>)> {
        let mut names: Vec<String> = std::fs::read_dir(&mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
            .into_iter()
            .map(|n| {
                let b = std::fs::read(mnt.join(&n)).unwrap();
                (n, b)
            })
            .collect()
    };
    let got = read();
    let write = std::fs::write(mnt.join("new.txt"), b"x");
    let unmount = Command::new("fusermount3").arg("-u").arg(&mnt).status();
    let want: Vec<(String, Vec<u8>)> = made
        .paths
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(p).unwrap())
        })
        .collect();
    assert_eq!(got.len(), 2);
    assert!(got == want, "the mounted files differ from the dataset's");
    // The Hub takes no writes through the mount.
    let err = write.unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    assert!(unmount.unwrap().success());
}
