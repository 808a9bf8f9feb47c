//! The engine's CUDA registration (`cuda_register`), with a fake runtime
//! (`memory::cuda::fake`) that records every call: the arena, and the
//! `transform` tensors' slots like it, registered at open ("on"), once the
//! first batch is out ("auto") or never ("off"); a refusal noted or fatal
//! as the toggle says.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Data, config, data, drain};
use crate::dataset::{Shard, Source};
use crate::engine::script::Script;
use crate::engine::{Loader, Next, Stats};
use crate::error::Error;
use crate::memory::cuda;
use crate::net::object::HttpObject;
use crate::synth;

/// Opens a loader over `d` (scripted reads, every read in order) with
/// `cuda_register` set to `toggle` and the CUDA runtime `runtime`.
fn open_with_cuda(
    d: &Data,
    toggle: &str,
    runtime: std::result::Result<&'static cuda::Runtime, String>,
) -> crate::error::Result<Loader> {
    let cfg = config(2, 2, 16, &format!(r#", "cuda_register": "{toggle}""#));
    let script = Arc::new(Script {
        objects: d.objects.clone(),
        ..Script::default()
    });
    cuda::test_override::with(runtime, || {
        Loader::open_with_readers(
            cfg,
            d.shards.clone(),
            Arc::new(move |stream, pool| script.reader(stream, pool)),
        )
    })
}

/// The loader's stats once the prefault thread has tried to register the
/// arena (`auto` registers after the first batch, or after a time-out).
fn stats_after_cuda(loader: &Loader) -> Stats {
    let begun = std::time::Instant::now();
    while loader.shared.pool.arena().cuda_registered() == 0
        && loader.shared.pool.arena().cuda_refused().is_none()
    {
        assert!(
            begun.elapsed() < Duration::from_secs(60),
            "never registered"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    loader.stats()
}

fn cuda_notes(stats: &Stats) -> Vec<&String> {
    stats.notes.iter().filter(|n| n.contains("CUDA")).collect()
}

#[test]
fn the_arena_is_registered_with_cuda_as_cuda_register_asks() {
    let dir = tempfile::tempdir().unwrap();
    let fake = cuda::fake::build(dir.path());
    let d = data(&[30, 20], 3000);

    // A runtime that registers: the whole arena, once its pages are in
    // (`auto`) or at open (`on`), until the arena drops.
    let loader = open_with_cuda(&d, "auto", Ok(fake.runtime)).unwrap();
    let base = loader.shared.pool.arena().base() as usize;
    let stats = stats_after_cuda(&loader);
    assert_eq!(stats.cuda_registered, stats.arena_bytes);
    assert!(cuda_notes(&stats).is_empty(), "{:?}", stats.notes);
    let c = fake.calls();
    assert_eq!((c.registers, c.unregisters), (1, 0));
    assert_eq!((c.ptr, c.len as u64, c.flags), (base, stats.arena_bytes, 1));
    let (batches, error) = drain(&loader);
    assert!(error.is_none() && !batches.is_empty(), "{error:?}");
    drop(loader);
    let c = fake.calls();
    assert_eq!((c.unregisters, c.unregistered), (1, base));
    let loader = open_with_cuda(&d, "on", Ok(fake.runtime)).unwrap();
    let base = loader.shared.pool.arena().base() as usize;
    assert_eq!(loader.stats().cuda_registered, loader.stats().arena_bytes);
    assert_eq!((fake.calls().registers, fake.calls().ptr), (2, base));
    drop(loader);
    assert_eq!(
        (fake.calls().unregisters, fake.calls().unregistered),
        (2, base)
    );

    // `off` never calls the runtime.
    let loader = open_with_cuda(&d, "off", Ok(fake.runtime)).unwrap();
    let stats = loader.stats();
    assert_eq!(stats.cuda_registered, 0);
    assert!(cuda_notes(&stats).is_empty(), "{:?}", stats.notes);
    drop(loader);
    assert_eq!(fake.calls().registers, 2);

    // A runtime that refuses: `auto` says why, `on` fails with CUDA's text.
    fake.fail_with(100);
    let loader = open_with_cuda(&d, "auto", Ok(fake.runtime)).unwrap();
    let stats = stats_after_cuda(&loader);
    assert_eq!(stats.cuda_registered, 0);
    let notes = cuda_notes(&stats);
    assert!(
        notes.len() == 1 && notes[0].contains("no CUDA-capable device is detected"),
        "{:?}",
        stats.notes
    );
    drain(&loader);
    drop(loader);
    match open_with_cuda(&d, "on", Ok(fake.runtime)).map(|_| ()) {
        Err(Error::Memory(m)) => {
            assert!(m.contains("no CUDA-capable device is detected"), "{m}");
            assert!(m.contains("`cuda_register` is \"on\""), "{m}");
        }
        other => panic!("expected a memory error, got {other:?}"),
    }
    let c = fake.calls();
    assert_eq!((c.registers, c.unregisters), (2, 2));

    // No runtime at all.
    let missing = || Err("libcudart.so: cannot open shared object file".to_string());
    let loader = open_with_cuda(&d, "auto", missing()).unwrap();
    let stats = loader.stats();
    let notes = cuda_notes(&stats);
    assert!(
        notes.len() == 1 && notes[0].starts_with("CUDA runtime not found: libcudart.so"),
        "{:?}",
        stats.notes
    );
    drop(loader);
    match open_with_cuda(&d, "on", missing()).map(|_| ()) {
        Err(Error::Memory(m)) => assert!(m.contains("CUDA runtime not found"), "{m}"),
        other => panic!("expected a memory error, got {other:?}"),
    }
}

/// Shards of small PNGs and their labels, for a loader with a `transform`.
fn image_data(samples: &[u64]) -> Data {
    let mut d = Data {
        shards: Vec::new(),
        objects: HashMap::new(),
        counts: samples.to_vec(),
    };
    for (i, &n) in samples.iter().enumerate() {
        let mut tar = Vec::new();
        for j in 0..n {
            let key = synth::sample_key(i, j);
            let px: Vec<u8> = (0..8 * 6 * 3).map(|k| (k as u64 * 7 + j) as u8).collect();
            let mut png = Vec::new();
            let mut e = ::png::Encoder::new(&mut png, 8, 6);
            e.set_color(::png::ColorType::Rgb);
            e.write_header().unwrap().write_image_data(&px).unwrap();
            synth::write_member(&mut tar, &format!("{key}.png"), &png).unwrap();
            synth::write_member(&mut tar, &format!("{key}.cls"), b"3").unwrap();
        }
        tar.extend_from_slice(&[0u8; 1024]);
        let url = format!("http://scripted.invalid/images-{i}.tar");
        d.shards.push(Shard {
            name: url.clone(),
            source: Source::Http(Arc::new(HttpObject::new(&url, Vec::new()).unwrap())),
            size: Some(tar.len() as u64),
            samples: None,
        });
        d.objects.insert(url, tar);
    }
    d
}

#[test]
fn the_transform_tensors_are_registered_with_cuda_like_the_arena() {
    let dir = tempfile::tempdir().unwrap();
    let fake = cuda::fake::build(dir.path());
    let d = image_data(&[12, 9]);
    let open = |toggle: &str| {
        let cfg = config(
            2,
            2,
            16,
            &format!(
                r#", "cuda_register": "{toggle}",
                   "transform": {{"png": {{"resize": [4, 4]}}, "cls": "int64"}}"#
            ),
        );
        let script = Arc::new(Script {
            objects: d.objects.clone(),
            ..Script::default()
        });
        cuda::test_override::with(Ok(fake.runtime), || {
            Loader::open_with_readers(
                cfg,
                d.shards.clone(),
                Arc::new(move |stream, pool| script.reader(stream, pool)),
            )
        })
    };
    let slots = |l: &Loader| l.shared.transform.as_ref().unwrap().cuda_registered() as u64;
    let mut samples = 0;
    // `auto`: the arena and the slots once the first batch is out.
    let loader = open("auto").unwrap();
    loop {
        match loader.next(Some(Duration::from_secs(60))).unwrap() {
            Next::Batch(b) => samples += b.len(),
            Next::EndOfEpoch(_) => {}
            Next::Finished => break,
            Next::Timeout => panic!("stalled"),
        }
    }
    assert_eq!(samples, 21);
    let begun = std::time::Instant::now();
    while slots(&loader) == 0 {
        assert!(
            begun.elapsed() < Duration::from_secs(60),
            "never registered"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = stats_after_cuda(&loader);
    assert!(slots(&loader) > 0);
    assert_eq!(stats.cuda_registered, stats.arena_bytes + slots(&loader));
    assert_eq!(fake.calls().registers, 2);
    assert!(cuda_notes(&stats).is_empty(), "{:?}", stats.notes);
    drop(loader);
    assert_eq!(fake.calls().unregisters, 2);
    // `on`: both at open. `off`: neither.
    let loader = open("on").unwrap();
    assert_eq!(
        loader.stats().cuda_registered,
        loader.stats().arena_bytes + slots(&loader)
    );
    drop(loader);
    assert_eq!(fake.calls().registers, 4);
    let loader = open("off").unwrap();
    assert_eq!(loader.stats().cuda_registered, 0);
    drop(loader);
    // A refusal: `auto` notes it for the slots as for the arena.
    fake.fail_with(100);
    let loader = open("auto").unwrap();
    while !matches!(
        loader.next(Some(Duration::from_secs(60))).unwrap(),
        Next::Finished
    ) {}
    let begun = std::time::Instant::now();
    while !loader
        .stats()
        .notes
        .iter()
        .any(|n| n.starts_with("`transform` tensors:"))
    {
        assert!(begun.elapsed() < Duration::from_secs(60), "never tried");
        std::thread::sleep(Duration::from_millis(5));
    }
    let notes = loader.stats().notes;
    assert!(
        notes.iter().any(|n| n.starts_with("`transform` tensors:")
            && n.contains("no CUDA-capable device is detected")),
        "{notes:?}"
    );
}
