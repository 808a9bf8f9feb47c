//! A loader with a `transform`: batches arrive decoded, cropped, resized
//! and flipped, each image field one contiguous tensor and each label
//! field an array, with the pixels `ringfeed::image::apply` gives for the
//! sample's seed, epoch and position; a resumed epoch gives the pixels of
//! the uninterrupted one; a broken image fails the loader naming its
//! shard, sample and field, or with `image_errors = "skip"` leaves its
//! batch, counted and logged, the others keeping their pixels and a
//! resume its place; a bad spec is refused at open.

use ringfeed_test_support as support;

use std::collections::BTreeMap;
use std::time::Duration;

use ringfeed::image::{Scratch, Transform};
use ringfeed::{Config, Loader, Next};
use serde_json::json;

/// A smooth picture `w` × `h` (gradients varying with `k`), as PNG.
fn picture(w: u32, h: u32, k: u32) -> Vec<u8> {
    let mut px = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            px.push(((x * 255) / w) as u8 ^ (k as u8));
            px.push(((y * 255) / h) as u8);
            px.push(((x + y + k * 13) % 256) as u8);
        }
    }
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, w, h);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    e.write_header().unwrap().write_image_data(&px).unwrap();
    out
}

/// Each key's PNG and label.
type Samples = BTreeMap<String, (Vec<u8>, i64)>;

/// Shards of `per` samples each: a PNG of varying size and a class label.
/// Returns the URLs and each key's (png, label).
fn shards(dir: &std::path::Path, n: usize, per: usize, broken: &[&str]) -> (Vec<String>, Samples) {
    let mut urls = Vec::new();
    let mut samples = BTreeMap::new();
    for s in 0..n {
        let mut b = tar::Builder::new(Vec::new());
        for i in 0..per {
            let k = (s * per + i) as u32;
            let key = format!("s{s}/{i:04}");
            let mut img = picture(40 + k % 23, 30 + (k * 7) % 19, k);
            if broken.contains(&key.as_str()) {
                img.truncate(img.len() / 2);
            }
            let label = i64::from(k % 10);
            for (field, data) in [
                ("png", img.clone()),
                ("cls", label.to_string().into_bytes()),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                b.append_data(&mut h, format!("{key}.{field}"), data.as_slice())
                    .unwrap();
            }
            samples.insert(key, (img, label));
        }
        let path = dir.join(format!("shard-{s}.tar"));
        std::fs::write(&path, b.into_inner().unwrap()).unwrap();
        urls.push(path.display().to_string());
    }
    (urls, samples)
}

fn spec() -> serde_json::Value {
    json!({"png": {"random_resized_crop": {"size": [12, 16], "scale": [0.3, 1.0]}, "flip": 0.5},
           "cls": "int64"})
}

fn config(urls: Vec<String>, extra: serde_json::Value) -> Config {
    let mut e =
        json!({"batch_size": 5, "seed": 11, "shuffle": true, "epochs": 2, "transform": spec()});
    e.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    support::two_workers(urls, e)
}

/// Every batch: (epoch, keys, the image tensor's bytes, the labels).
type Seen = Vec<(u64, Vec<String>, Vec<u8>, Vec<i64>)>;

fn drain(l: &Loader, limit: Option<usize>) -> Seen {
    let mut out = Vec::new();
    let mut epoch = 0;
    loop {
        if limit.is_some_and(|n| out.len() == n) {
            return out;
        }
        match l.next(Some(Duration::from_secs(60))).unwrap() {
            Next::Batch(b) => {
                let image = 3 * 12 * 16;
                let mut keys = Vec::new();
                let mut labels = Vec::new();
                let mut first: Option<*const u8> = None;
                for (i, s) in b.samples().enumerate() {
                    keys.push(String::from_utf8(s.key().to_vec()).unwrap());
                    let f: BTreeMap<&[u8], &[u8]> = s.fields().collect();
                    let img = f[&b"png"[..]];
                    assert_eq!(img.len(), image);
                    // One tensor: sample i's image right after sample i-1's.
                    let start = *first.get_or_insert(img.as_ptr());
                    assert_eq!(img.as_ptr(), start.wrapping_add(i * image));
                    let cls = f[&b"cls"[..]];
                    labels.push(i64::from_le_bytes(cls.try_into().unwrap()));
                }
                let n = b.len();
                let start = first.unwrap();
                let tensor =
                    // SAFETY: the rows were checked contiguous above, and the
                    // batch keeps them alive until it drops at the loop's end.
                    unsafe { std::slice::from_raw_parts(start, n * image) }.to_vec();
                out.push((b.epoch(), keys, tensor, labels));
                epoch = b.epoch();
            }
            Next::EndOfEpoch(_) => {}
            Next::Finished => return out,
            Next::Timeout => panic!("stalled in epoch {epoch}"),
        }
    }
}

#[test]
fn batches_arrive_as_tensors_with_the_pipelines_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let (urls, samples) = shards(dir.path(), 3, 7, &[]);
    let l = Loader::open(config(urls, json!({}))).unwrap();
    let seen = drain(&l, None);
    let t = Transform::from_value(&spec()).unwrap();
    let img = &t.images[0];
    let mut position = BTreeMap::new();
    let mut keys_by_epoch: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut flips = 0;
    for (epoch, keys, tensor, labels) in &seen {
        for (i, key) in keys.iter().enumerate() {
            let pos = position.entry(*epoch).or_insert(0u64);
            let (png, label) = &samples[key];
            let mut want = vec![0u8; img.out_bytes()];
            let a = ringfeed::image::apply(
                img,
                png,
                11,
                *epoch,
                *pos,
                &mut Scratch::default(),
                &mut want,
            )
            .unwrap();
            flips += usize::from(a.plan.flip);
            assert_eq!(
                &tensor[i * want.len()..(i + 1) * want.len()],
                want.as_slice(),
                "{key} at {pos} of epoch {epoch}"
            );
            assert_eq!(labels[i], *label);
            *pos += 1;
            keys_by_epoch.entry(*epoch).or_default().push(key.clone());
        }
    }
    assert_eq!(keys_by_epoch.len(), 2);
    for keys in keys_by_epoch.values() {
        let mut k = keys.clone();
        k.sort();
        assert_eq!(k, samples.keys().cloned().collect::<Vec<_>>());
    }
    assert!(flips > 5 && flips < 37, "{flips} flips of 42");
    let st = l.stats();
    assert_eq!(st.samples_delivered, 42);
}

#[test]
fn a_resumed_epoch_gives_the_uninterrupted_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let (urls, _) = shards(dir.path(), 3, 7, &[]);
    let whole = drain(
        &Loader::open(config(urls.clone(), json!({}))).unwrap(),
        None,
    );
    let first = Loader::open(config(urls.clone(), json!({}))).unwrap();
    let head = drain(&first, Some(6));
    let state = first.state().to_hex();
    first.close();
    let rest = drain(
        &Loader::open(config(urls, json!({"resume": [state]}))).unwrap(),
        None,
    );
    assert_eq!(head.len() + rest.len(), whole.len());
    let joined: Seen = head.into_iter().chain(rest).collect();
    assert_eq!(joined, whole);
}

#[test]
fn pixels_do_not_depend_on_the_threads() {
    let dir = tempfile::tempdir().unwrap();
    let (urls, _) = shards(dir.path(), 2, 9, &[]);
    let one = drain(
        &Loader::open(config(urls.clone(), json!({"transform_threads": 1}))).unwrap(),
        None,
    );
    let three = drain(
        &Loader::open(config(urls, json!({"transform_threads": 3}))).unwrap(),
        None,
    );
    assert_eq!(one, three);
}

#[test]
fn a_broken_image_fails_naming_its_shard_sample_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let (urls, _) = shards(dir.path(), 2, 6, &["s1/0003"]);
    let e = support::first_error(config(urls, json!({"epochs": 1})));
    let m = e.to_string();
    assert!(
        m.contains("field `png`")
            && m.contains("PNG")
            && m.contains("sample `s1/0003`")
            && m.contains("shard-1.tar"),
        "{m}"
    );
    assert_eq!(e.status(), ringfeed::error::status::RINGFEED_ERR_FORMAT);
}

#[test]
fn bad_specs_and_missing_fields_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let (urls, _) = shards(dir.path(), 1, 4, &[]);
    let mut m = serde_json::Map::new();
    m.insert("urls".into(), json!(urls));
    m.insert(
        "transform".into(),
        json!({"png": {"center_crop": 8, "dtype": "int4"}}),
    );
    let e = Config::from_map(&m).unwrap_err().to_string();
    assert!(e.contains("field `png` option `dtype`"), "{e}");
    m.insert("transform".into(), json!(7));
    assert!(
        Config::from_map(&m)
            .unwrap_err()
            .to_string()
            .contains("`transform`")
    );
    // A policy that is not one.
    m.insert("transform".into(), spec());
    m.insert("image_errors".into(), json!("ignore"));
    let e = Config::from_map(&m).unwrap_err().to_string();
    assert!(e.contains("image_errors") && e.contains("skip"), "{e}");
    m.remove("image_errors");
    // A field the samples lack.
    let cfg = config(
        urls,
        json!({"transform": {"jpg": {"center_crop": 8}}, "epochs": 1}),
    );
    let e = support::first_error(cfg);
    assert!(e.to_string().contains("field `jpg`: sample `s0/"), "{e}");
    assert!(e.to_string().contains("has no such field"), "{e}");
}

#[test]
fn a_consumer_that_keeps_every_batch_is_never_stopped() {
    // More batches (12) than the pooled slots (prefetch 2 + 6): the consumer
    // keeps them all, and each keeps its pixels.
    let dir = tempfile::tempdir().unwrap();
    let (urls, _) = shards(dir.path(), 6, 10, &[]);
    let l = Loader::open(config(urls, json!({"prefetch_batches": 2, "epochs": 1}))).unwrap();
    let mut kept = Vec::new();
    loop {
        match l.next(Some(Duration::from_secs(60))).unwrap() {
            Next::Batch(b) => {
                let first: Vec<u8> = b
                    .samples()
                    .next()
                    .unwrap()
                    .fields()
                    .find(|f| f.0 == b"png")
                    .unwrap()
                    .1
                    .to_vec();
                kept.push((b, first));
            }
            Next::EndOfEpoch(_) => {}
            Next::Finished => break,
            Next::Timeout => panic!("stalled with {} batches held", kept.len()),
        }
    }
    assert_eq!(kept.len(), 12);
    for (b, first) in &kept {
        let now = b
            .samples()
            .next()
            .unwrap()
            .fields()
            .find(|f| f.0 == b"png")
            .unwrap()
            .1;
        assert_eq!(
            now,
            first.as_slice(),
            "a kept batch's pixels were overwritten"
        );
    }
}

/// The samples of `seen`, epoch by epoch, in delivery order.
fn order(seen: &Seen) -> BTreeMap<u64, Vec<String>> {
    let mut o: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (epoch, keys, _, _) in seen {
        o.entry(*epoch).or_default().extend(keys.iter().cloned());
    }
    o
}

const BROKEN: [&str; 3] = ["s0/0002", "s1/0003", "s1/0004"];

#[test]
fn with_skip_a_broken_image_leaves_its_batch_counted_and_logged() {
    let dir = tempfile::tempdir().unwrap();
    let clean_dir = tempfile::tempdir().unwrap();
    let (urls, samples) = shards(dir.path(), 2, 6, &BROKEN);
    let (clean_urls, _) = shards(clean_dir.path(), 2, 6, &[]);
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = std::sync::Arc::clone(&log);
    // The log is the process's: other tests' loaders skip too.
    let ours = dir.path().display().to_string();
    ringfeed::log::set(
        Some(Box::new(move |_, m: &str| {
            if m.contains("image_errors") && m.contains(&ours) {
                sink.lock().unwrap().push(m.to_string());
            }
        })),
        ringfeed::log::Level::Warn,
    );
    // The order every sample has in the plan: that of the same shards
    // with nothing broken.
    let planned = order(&drain(
        &Loader::open(config(clean_urls, json!({}))).unwrap(),
        None,
    ));
    let l = Loader::open(config(urls, json!({"image_errors": "skip"}))).unwrap();
    let seen = drain(&l, None);
    ringfeed::log::set(None, ringfeed::log::Level::Error);
    let got = order(&seen);
    for (epoch, keys) in &planned {
        let kept: Vec<String> = keys
            .iter()
            .filter(|k| !BROKEN.contains(&k.as_str()))
            .cloned()
            .collect();
        assert_eq!(got[epoch], kept, "epoch {epoch}");
    }
    // The kept samples' pixels are those of their place in the plan.
    let t = Transform::from_value(&spec()).unwrap();
    let img = &t.images[0];
    let mut shorter = 0;
    for (epoch, keys, tensor, labels) in &seen {
        shorter += usize::from(keys.len() < 5);
        for (i, key) in keys.iter().enumerate() {
            let pos = planned[epoch].iter().position(|k| k == key).unwrap() as u64;
            let mut want = vec![0u8; img.out_bytes()];
            ringfeed::image::apply(
                img,
                &samples[key].0,
                11,
                *epoch,
                pos,
                &mut Scratch::default(),
                &mut want,
            )
            .unwrap();
            assert_eq!(&tensor[i * want.len()..(i + 1) * want.len()], &want[..]);
            assert_eq!(labels[i], samples[key].1);
        }
    }
    assert!(shorter >= 2, "no batch lost a sample: {seen:?}");
    let st = l.stats();
    assert_eq!(st.images_skipped, 6);
    assert_eq!(st.samples_delivered, 18);
    // One line a skipped sample, naming its field, key and shard.
    let lines = log.lock().unwrap().clone();
    for key in BROKEN {
        let shard = format!("shard-{}.tar", &key[1..2]);
        let n = lines
            .iter()
            .filter(|m| {
                m.contains(&format!("sample `{key}`"))
                    && m.contains(&shard)
                    && m.contains("field `png`")
            })
            .count();
        assert_eq!(n, 2, "{key} in {lines:#?}");
    }
}

#[test]
fn with_skip_a_resume_continues_where_the_uninterrupted_run_was() {
    let dir = tempfile::tempdir().unwrap();
    let (urls, _) = shards(dir.path(), 2, 6, &BROKEN);
    let skip = || json!({"image_errors": "skip"});
    let whole = drain(&Loader::open(config(urls.clone(), skip())).unwrap(), None);
    for cut in 1..whole.len() {
        let first = Loader::open(config(urls.clone(), skip())).unwrap();
        let head = drain(&first, Some(cut));
        let state = first.state().to_hex();
        first.close();
        let mut extra = skip();
        extra["resume"] = json!([state]);
        let rest = drain(&Loader::open(config(urls.clone(), extra)).unwrap(), None);
        let joined: Seen = head.into_iter().chain(rest).collect();
        assert_eq!(joined, whole, "cut after {cut} batches");
    }
}

#[test]
fn a_closed_loader_transforms_nothing_more() {
    // Photos large enough that a batch takes milliseconds to transform:
    // the engine runs ahead into the next epoch (`epochs` 0, a ring of 8
    // batches) while the consumer has its first batch. Closing then ends
    // the batch under way and transforms none of those the streams queued
    // (before, the sequencer went on transforming them until the ring was
    // full, which held up `close()`: 0.9 s on ImageNet-size photos).
    let dir = tempfile::tempdir().unwrap();
    let mut urls = Vec::new();
    for s in 0..4 {
        let mut b = tar::Builder::new(Vec::new());
        for i in 0..6 {
            let k = s * 6 + i;
            for (field, data) in [
                ("png", picture(1600, 1200, k)),
                ("cls", k.to_string().into_bytes()),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                b.append_data(&mut h, format!("s{s}/{i:04}.{field}"), data.as_slice())
                    .unwrap();
            }
        }
        let path = dir.path().join(format!("shard-{s}.tar"));
        std::fs::write(&path, b.into_inner().unwrap()).unwrap();
        urls.push(path.display().to_string());
    }
    let batch = 2;
    let cfg = config(
        urls,
        json!({"batch_size": batch, "epochs": 0, "prefetch_batches": 8}),
    );
    let l = Loader::open(cfg).unwrap();
    match l.next(Some(Duration::from_secs(60))).unwrap() {
        Next::Batch(b) => assert_eq!(b.len(), batch),
        _ => panic!("no first batch"),
    }
    let before = l.stats().images_transformed;
    l.close();
    let after = l.stats().images_transformed;
    // The batch under way when the count was read, and at most one more
    // begun before the close reached the sequencer.
    assert!(
        after - before <= 2 * batch as u64,
        "{} samples transformed after the close began ({before} before it)",
        after - before
    );
}
