//! Local shards read with O_DIRECT (`direct_io`): every byte arrives, on
//! both backends and across chunk sizes, from shards whose sizes are not
//! whole blocks (a last read widened past the end of the file), shorter
//! than one block, without a sample, and many of them; the reads leave the
//! page cache alone; files on memory file systems (tmpfs, ramfs) are read
//! buffered and the stats say so; a bad value is a named configuration
//! error.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ringfeed_test_support as support;

use ringfeed::{Config, Error, Loader, Next};
use support::pattern;

/// Sample key → sorted (field, bytes).
type Samples = BTreeMap<String, Vec<(String, Vec<u8>)>>;

fn config(paths: &[PathBuf], extra: serde_json::Value) -> Config {
    let urls: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let mut m = serde_json::Map::new();
    m.insert("urls".into(), serde_json::json!(urls));
    m.insert("memory_budget".into(), serde_json::json!("16MiB"));
    m.insert("batch_size".into(), serde_json::json!(5));
    m.insert("chunk_size".into(), serde_json::json!("256KiB"));
    if let serde_json::Value::Object(e) = extra {
        m.extend(e);
    }
    Config::from_map(&m).unwrap()
}

/// Writes a tar of samples (a payload of each of the given sizes and a
/// small `cls`) and gives its expected samples. After the archive's end
/// come 1 to 509 bytes of junk, which the walk ignores: tar files are
/// whole 512-byte blocks, and so is the direct I/O alignment of many
/// disks, so without them no last read would need widening.
fn write_shard(path: &Path, name: &str, sizes: &[usize]) -> Samples {
    let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
    let mut want = Samples::new();
    for (i, &size) in sizes.iter().enumerate() {
        let key = format!("{name}/{i:05}");
        let fields = [
            (
                "bin".to_string(),
                pattern((i as u64) << 8 | size as u64, size),
            ),
            ("cls".to_string(), format!("{i}").into_bytes()),
        ];
        for (field, data) in &fields {
            let mut h = tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, format!("{key}.{field}"), data.as_slice())
                .unwrap();
        }
        let mut f = fields.to_vec();
        f.sort();
        want.insert(key, f);
    }
    let mut f = b.into_inner().unwrap();
    let junk = pattern(!0, name.len() * 37 % 509 + 1);
    std::io::Write::write_all(&mut f, &junk).unwrap();
    f.sync_all().unwrap();
    want
}

/// Streams one epoch; panics if a key arrives twice.
fn epoch(loader: &Loader) -> Samples {
    let mut got = Samples::new();
    loop {
        match loader.next(Some(Duration::from_secs(30))).unwrap() {
            Next::Batch(b) => {
                for s in b.samples() {
                    let key = String::from_utf8(s.key().to_vec()).unwrap();
                    let mut fields: Vec<(String, Vec<u8>)> = s
                        .fields()
                        .map(|(n, d)| (String::from_utf8(n.to_vec()).unwrap(), d.to_vec()))
                        .collect();
                    fields.sort();
                    assert!(got.insert(key.clone(), fields).is_none(), "{key} twice");
                }
            }
            Next::EndOfEpoch(_) | Next::Finished => return got,
            Next::Timeout => panic!("no batch within 30 s"),
        }
    }
}

/// The shards of the tests: sizes off whole blocks, one shorter than a
/// page, one without a sample, and many besides.
fn shards(dir: &Path) -> (Vec<PathBuf>, Samples) {
    let mut paths = Vec::new();
    let mut want = Samples::new();
    let mut add = |name: &str, sizes: &[usize]| {
        let p = dir.join(format!("{name}.tar"));
        want.extend(write_shard(&p, name, sizes));
        paths.push(p);
    };
    // 100 bytes: under 3,000 bytes in all, less than a page.
    add("tiny", &[100]);
    // No sample: the two zero blocks of an empty archive.
    add("empty", &[]);
    // Payloads around chunk and block sizes, and odd ones.
    add("odd", &[1, 4095, 4097, 70_001, 200_003, 57_343, 12_345]);
    add("big", &[300_000, 511, 65_536, 130_000, 9_999, 250_001]);
    for i in 0..24 {
        let sizes: Vec<usize> = (0..(i % 5 + 1)).map(|j| 777 * (i + 1) + 4001 * j).collect();
        add(&format!("many{i:02}"), &sizes);
    }
    for p in &paths {
        let len = std::fs::metadata(p).unwrap().len();
        assert!(len % 512 != 0, "{}: {len} bytes, whole blocks", p.display());
    }
    (paths, want)
}

/// Whether files in `dir` can be opened with O_DIRECT (the disk the tests
/// build on may be a file system without it).
fn takes_direct(dir: &Path) -> bool {
    let p = dir.join("probe");
    std::fs::write(&p, [0u8; 4096]).unwrap();
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; the descriptor is closed below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECT) };
    std::fs::remove_file(&p).unwrap();
    if fd < 0 {
        return false;
    }
    // SAFETY: `fd` is ours.
    unsafe { libc::close(fd) };
    // SAFETY: all-zero is a valid statfs; `c` names a directory entry's
    // parent, which exists.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    let d = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
    // SAFETY: valid path and out-pointer.
    unsafe { libc::statfs(d.as_ptr(), &mut fs) };
    // tmpfs takes O_DIRECT on recent kernels, but the engine reads it buffered.
    fs.f_type as i64 != 0x0102_1994
}

/// A directory on the disk the tests build on (not /tmp, which may be
/// tmpfs).
fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

#[test]
fn every_byte_arrives_with_direct_reads_on_both_backends() {
    let dir = disk_dir();
    let (paths, want) = shards(dir.path());
    let direct = takes_direct(dir.path());
    if !direct {
        support::skip!(&format!(
            "{} does not take O_DIRECT: the direct reads are not checked, the buffered fallback only",
            dir.path().display()
        ));
    }
    let file_bytes: u64 = paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    for (chunk, backend, workers, registered) in [
        ("64KiB", "io_uring", 1, "auto"),
        ("64KiB", "threads", 3, "off"),
        ("256KiB", "io_uring", 2, "on"),
        ("256KiB", "threads", 1, "off"),
        ("1MiB", "io_uring", 4, "off"),
    ] {
        let what = format!("{chunk} {backend} {workers} workers, registered {registered}");
        let loader = Loader::open(config(
            &paths,
            serde_json::json!({"chunk_size": chunk, "io_backend": backend, "workers": workers,
                               "register_buffers": registered, "direct_io": "on", "epochs": 2}),
        ))
        .unwrap();
        for e in 0..2 {
            let got = epoch(&loader);
            assert!(got == want, "{what}: epoch {e} differs");
        }
        let s = loader.stats();
        // Every byte of every file and not one past their ends.
        assert_eq!(s.bytes_read, 2 * file_bytes, "{what}");
        assert_eq!(
            s.local_files_direct + s.local_files_buffered,
            2 * paths.len() as u64,
            "{what}"
        );
        if direct {
            assert_eq!(s.local_reads, "direct", "{what}: {:?}", s.notes);
            assert_eq!(s.local_files_buffered, 0, "{what}");
            assert!(!s.notes.iter().any(|n| n.contains("direct_io")), "{what}");
        } else {
            assert!(s.notes.iter().any(|n| n.contains("direct_io")), "{what}");
        }
    }
}

#[test]
fn off_and_auto_read_buffered_when_the_shards_fit_in_memory() {
    let dir = disk_dir();
    let (paths, want) = shards(dir.path());
    for mode in ["off", "auto"] {
        let loader = Loader::open(config(&paths, serde_json::json!({"direct_io": mode}))).unwrap();
        assert!(epoch(&loader) == want, "{mode}");
        let s = loader.stats();
        assert_eq!(s.local_reads, "buffered", "{mode}");
        assert_eq!(s.local_files_direct, 0, "{mode}");
        assert!(!s.notes.iter().any(|n| n.contains("direct_io")), "{mode}");
    }
}

/// Fraction of `path`'s pages in the page cache (mincore).
fn resident(path: &Path) -> f64 {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    // SAFETY: a shared read-only mapping of an open file, unmapped below.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(m, libc::MAP_FAILED);
    let pages = len.div_ceil(4096);
    let mut vec = vec![0u8; pages];
    // SAFETY: `vec` has one byte per page of the mapping.
    assert_eq!(unsafe { libc::mincore(m, len, vec.as_mut_ptr()) }, 0);
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(m, len) };
    vec.iter().filter(|&&v| v & 1 != 0).count() as f64 / pages as f64
}

/// Drops `path`'s clean pages from the page cache.
fn evict(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    // SAFETY: advice on an open descriptor.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0);
}

#[test]
fn direct_reads_leave_the_page_cache_alone() {
    let dir = disk_dir();
    if !takes_direct(dir.path()) {
        support::skip!(&format!("{} does not take O_DIRECT", dir.path().display()));
        return;
    }
    let path = dir.path().join("one.tar");
    let sizes: Vec<usize> = (0..40).map(|i| 50_000 + 333 * i).collect();
    let want = write_shard(&path, "one", &sizes);
    for (mode, backend) in [("on", "io_uring"), ("on", "threads"), ("off", "io_uring")] {
        evict(&path);
        let before = resident(&path);
        assert!(before < 0.05, "not evicted: {before}");
        let loader = Loader::open(config(
            std::slice::from_ref(&path),
            serde_json::json!({"direct_io": mode, "io_backend": backend}),
        ))
        .unwrap();
        assert!(epoch(&loader) == want, "{mode} {backend}");
        drop(loader);
        let after = resident(&path);
        if mode == "on" {
            assert!(after < 0.05, "{backend}: direct reads cached {after}");
        } else {
            assert!(after > 0.9, "buffered reads cached only {after}");
        }
    }
}

/// A ramfs mounted for the test (root only), unmounted when dropped.
struct Ramfs(tempfile::TempDir);

impl Ramfs {
    fn mount() -> Option<Ramfs> {
        let dir = disk_dir();
        let ok = std::process::Command::new("mount")
            .args(["-t", "ramfs", "ramfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Ramfs(dir))
    }
}

impl Drop for Ramfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn memory_file_systems_are_read_buffered_and_the_notes_say_so() {
    // (file system, directory, why its files are read buffered); the
    // directories live as long as these. tmpfs is recognized; ramfs
    // refuses O_DIRECT when asked.
    let mut dirs: Vec<(&str, PathBuf, &str)> = Vec::new();
    let shm = Path::new("/dev/shm");
    let tmpfs = shm.is_dir().then(|| tempfile::tempdir_in(shm).unwrap());
    if let Some(d) = &tmpfs {
        dirs.push(("tmpfs", d.path().to_path_buf(), "on tmpfs"));
    }
    let ramfs = Ramfs::mount();
    match &ramfs {
        Some(r) => dirs.push(("ramfs", r.0.path().to_path_buf(), "refused O_DIRECT")),
        None => support::skip!("no ramfs (its mount needs root): tmpfs only"),
    }
    assert!(!dirs.is_empty(), "neither /dev/shm nor a ramfs to test on");
    for (fs, dir, why) in &dirs {
        let (paths, want) = shards(dir);
        for backend in ["io_uring", "threads"] {
            let loader = Loader::open(config(
                &paths,
                serde_json::json!({"direct_io": "on", "io_backend": backend}),
            ))
            .unwrap();
            assert!(epoch(&loader) == want, "{fs} {backend}");
            let s = loader.stats();
            assert_eq!(s.local_reads, "buffered", "{fs} {backend}");
            let notes: Vec<&String> = s.notes.iter().filter(|n| n.contains("direct_io")).collect();
            assert_eq!(notes.len(), 1, "{fs}: said once: {:?}", s.notes);
            assert!(
                notes[0].contains(&format!("{} local file(s) read buffered", paths.len()))
                    && notes[0].contains(why),
                "{fs}: {}",
                notes[0]
            );
        }
    }
    // One directory on a memory file system and one on disk: both paths ran.
    let disk = disk_dir();
    if let Some((_, mem, _)) = dirs.first()
        && takes_direct(disk.path())
    {
        let a = disk.path().join("a.tar");
        let b = mem.join("b.tar");
        let mut want = write_shard(&a, "a", &[5000, 7]);
        want.extend(write_shard(&b, "b", &[9000]));
        let loader = Loader::open(config(&[a, b], serde_json::json!({"direct_io": "on"}))).unwrap();
        assert!(epoch(&loader) == want);
        let s = loader.stats();
        assert_eq!(s.local_reads, "direct+buffered");
        assert_eq!((s.local_files_direct, s.local_files_buffered), (1, 1));
    }
}

#[test]
fn a_bad_direct_io_value_is_a_named_configuration_error() {
    for bad in [r#""always""#, "1", r#""""#] {
        let e = Loader::open_json(&format!(r#"{{"urls": "a.tar", "direct_io": {bad}}}"#))
            .err()
            .expect("an error");
        assert!(matches!(e, Error::Config(_)), "{bad}: {e:?}");
        assert!(e.to_string().contains("`direct_io`"), "{bad}: {e}");
    }
}
