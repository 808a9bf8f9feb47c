//! A loader's image decodes within `decode_memory`: a shard of huge
//! images (13000 x 13000 PNGs, a baseline and a progressive JPEG of that
//! size) between small JPEGs, through `Resize(256)` + `CenterCrop(224)`,
//! in a child process whose peak resident memory (VmHWM, reset once the
//! images are made) is checked against the budget; each with its control,
//! a budget large enough for a full decode, whose peak shows the decode
//! the budget prevents. Images over the budget even at their least decode
//! are skipped (or fail the loader) with a reason naming the budget; a
//! progressive JPEG of thousands of scans is refused by the scan limit.

use std::io::Write;
use std::process::Command;
use std::time::Duration;

use ringfeed::image::{Scratch, Transform};
use ringfeed::{Config, Loader, Next};
use serde_json::{Value, json};

/// The side of the huge images: 169 M pixels, under the pixel limit (179 M).
const HUGE: u32 = 13000;

const CASE: &str = "RINGFEED_DECODE_BUDGET_CASE";

/// An all-black RGB PNG of `side` x `side`, written a row at a time (the
/// child's memory stays small while it is made).
fn black_png(side: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, side, side);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    e.set_compression(png::Compression::Fast);
    let mut header = e.write_header().unwrap();
    let mut w = header.stream_writer().unwrap();
    let row = vec![0u8; side as usize * 3];
    for _ in 0..side {
        w.write_all(&row).unwrap();
    }
    w.finish().unwrap();
    header.finish().unwrap();
    out
}

/// A uniform gray JPEG of `w` x `h` (every coefficient 0: level 128),
/// written by hand: Huffman tables of
/// one 1-bit code each (DC difference 0, AC end-of-block), so each 8x8
/// block is 2 bits (1 in a DC-only progressive scan). Progressive files
/// have `scans` DC scans (one makes the image; libjpeg takes repeats as
/// more scans of the same coefficients).
fn gray_jpeg(w: u16, h: u16, progressive: bool, scans: usize) -> Vec<u8> {
    let mut j = vec![0xff, 0xd8];
    let segment = |j: &mut Vec<u8>, marker: u8, body: &[u8]| {
        j.extend_from_slice(&[0xff, marker]);
        j.extend_from_slice(&((body.len() + 2) as u16).to_be_bytes());
        j.extend_from_slice(body);
    };
    let mut dqt = vec![0u8];
    dqt.extend_from_slice(&[1u8; 64]);
    segment(&mut j, 0xdb, &dqt);
    let mut sof = vec![8];
    sof.extend_from_slice(&h.to_be_bytes());
    sof.extend_from_slice(&w.to_be_bytes());
    sof.extend_from_slice(&[1, 1, 0x11, 0]);
    segment(&mut j, if progressive { 0xc2 } else { 0xc0 }, &sof);
    for class in [0x00u8, 0x10] {
        let mut dht = vec![class, 1];
        dht.extend_from_slice(&[0u8; 15]);
        dht.push(0);
        segment(&mut j, 0xc4, &dht);
    }
    let blocks = usize::from(w).div_ceil(8) * usize::from(h).div_ceil(8);
    // All codes are 0 bits; the last byte is padded with 1s.
    let data = |bits_per_block: usize| {
        let bits = blocks * bits_per_block;
        let mut d = vec![0u8; bits.div_ceil(8)];
        if bits % 8 != 0 {
            *d.last_mut().unwrap() = 0xff >> (bits % 8);
        }
        d
    };
    match progressive {
        false => {
            segment(&mut j, 0xda, &[1, 1, 0x00, 0, 63, 0]);
            j.extend_from_slice(&data(2));
        }
        true => {
            let d = data(1);
            for _ in 0..scans {
                segment(&mut j, 0xda, &[1, 1, 0x00, 0, 0, 0]);
                j.extend_from_slice(&d);
            }
        }
    }
    j.extend_from_slice(&[0xff, 0xd9]);
    j
}

/// A shard of samples with one field `img` each; returns its path.
fn shard(dir: &std::path::Path, images: &[Vec<u8>]) -> String {
    let mut b = tar::Builder::new(Vec::new());
    for (i, data) in images.iter().enumerate() {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, format!("{i:04}.img"), data.as_slice())
            .unwrap();
    }
    let path = dir.join("huge.tar");
    std::fs::write(&path, b.into_inner().unwrap()).unwrap();
    path.display().to_string()
}

/// `Resize(256)` then `CenterCrop(224)`, as torchvision's evaluation
/// transform, with `extra` options.
fn spec(extra: Value) -> Value {
    let mut s = json!({"resize": 256, "center_crop": 224});
    s.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({ "img": s })
}

/// What a child saw.
#[derive(Debug)]
struct Seen {
    delivered: u64,
    skipped: u64,
    reduced: u64,
    over: u64,
    budget_peak: u64,
    /// Growth of the peak resident memory over the resident memory when
    /// the loader was opened, in bytes.
    grew: u64,
    error: Option<String>,
}

fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// In the child: makes the images the case names, resets the peak, runs
/// the loader to its end and prints what it saw.
fn child(case: &Value) {
    let t = tempfile::tempdir().unwrap();
    let small = gray_jpeg(64, 48, false, 1);
    let mut images = Vec::new();
    // Each kind made once (a huge PNG is seconds of deflating at the test
    // build's opt-level 0), its bytes repeated.
    let mut made: Vec<(&str, Vec<u8>)> = Vec::new();
    for kind in case["huge"].as_array().unwrap() {
        let kind = kind.as_str().unwrap();
        let huge = match made.iter().find(|(k, _)| *k == kind) {
            Some((_, bytes)) => bytes.clone(),
            None => {
                let bytes = match kind {
                    "png" => black_png(HUGE),
                    "jpeg" => gray_jpeg(HUGE as u16, HUGE as u16, false, 1),
                    "progressive" => gray_jpeg(HUGE as u16, HUGE as u16, true, 1),
                    k => panic!("{k}"),
                };
                made.push((kind, bytes.clone()));
                bytes
            }
        };
        images.push(small.clone());
        images.push(huge);
    }
    let url = shard(t.path(), &images);
    let cfg = Config::from_map(
        json!({
            "urls": [url], "batch_size": 8, "workers": 1, "epochs": 1,
            "transform": case["spec"], "image_errors": case["errors"],
            "decode_memory": case["budget"], "transform_threads": 2,
            // A small arena (the default is sized for read-ahead, and
            // prefaulted once the first batch is out, which would count).
            "memory_budget": "32MiB",
        })
        .as_object()
        .unwrap(),
    )
    .unwrap();
    // The peak from here: "5" resets VmHWM to the current resident size.
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let l = Loader::open(cfg).unwrap();
    let base = status_kb("VmRSS:");
    let (mut delivered, mut error) = (0, None);
    loop {
        match l.next(Some(Duration::from_secs(300))) {
            Ok(Next::Batch(b)) => delivered += b.len() as u64,
            Ok(Next::EndOfEpoch(_)) => {}
            Ok(Next::Finished) => break,
            Ok(Next::Timeout) => panic!("stalled"),
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    let hwm = status_kb("VmHWM:");
    let st = l.stats();
    println!(
        "SEEN {}",
        json!({
            "delivered": delivered, "skipped": st.counts.images_skipped,
            "reduced": st.images_reduced_for_budget, "over": st.images_over_budget,
            "budget_peak": st.decode_memory_peak, "grew": hwm.saturating_sub(base) * 1024,
            "error": error, "limit": st.decode_memory,
        })
    );
}

/// Runs `test` (this file's test of that name) in a child process for
/// `case`; returns what it saw.
fn measure(test: &str, case: Value) -> Seen {
    if let Ok(c) = std::env::var(CASE) {
        child(&serde_json::from_str(&c).unwrap());
        std::process::exit(0);
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CASE, case.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("SEEN ").map(|(_, v)| v))
        .unwrap_or_else(|| {
            panic!(
                "the child said nothing: {}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let v: Value = serde_json::from_str(line).unwrap();
    eprintln!("{test}: {v}");
    assert_eq!(v["limit"], case["budget"]);
    let n = |k: &str| v[k].as_u64().unwrap();
    Seen {
        delivered: n("delivered"),
        skipped: n("skipped"),
        reduced: n("reduced"),
        over: n("over"),
        budget_peak: n("budget_peak"),
        grew: n("grew"),
        error: v["error"].as_str().map(str::to_string),
    }
}

const MIB: u64 = 1 << 20;

/// What the process holds besides the decodes while a batch is made: the
/// shard's chunks, the tensors' slots, the threads; 48 MiB covers them
/// (the controls' peaks are ten times that).
const SLACK: u64 = 48 * MIB;

#[test]
fn huge_pngs_are_decoded_reduced_within_the_budget() {
    let budget = 64 * MIB;
    let s = measure(
        "huge_pngs_are_decoded_reduced_within_the_budget",
        json!({"huge": ["png", "png", "png", "png"], "spec": spec(json!({})),
               "errors": "skip", "budget": budget}),
    );
    assert_eq!(s.error, None);
    assert_eq!((s.delivered, s.skipped), (8, 0), "{s:?}");
    assert_eq!((s.reduced, s.over), (4, 0), "{s:?}");
    assert!(s.budget_peak <= budget, "{s:?}");
    assert!(
        s.grew <= budget + SLACK,
        "peak grew {} MiB: {s:?}",
        s.grew / MIB
    );
}

#[test]
fn control_huge_pngs_under_a_budget_that_holds_them_are_decoded_whole() {
    // 600 MiB holds one full decode (13000 x 13000 x 3 = 507 MB and the
    // resize's scratch), not two: the two threads take turns.
    let budget = 600 * MIB;
    let s = measure(
        "control_huge_pngs_under_a_budget_that_holds_them_are_decoded_whole",
        json!({"huge": ["png", "png"], "spec": spec(json!({})),
               "errors": "skip", "budget": budget}),
    );
    assert_eq!(s.error, None);
    assert_eq!((s.delivered, s.reduced, s.over), (4, 0, 0), "{s:?}");
    assert!(
        s.grew > 400 * MIB,
        "a full decode, {} MiB: {s:?}",
        s.grew / MIB
    );
    assert!(
        s.grew <= budget + SLACK,
        "peak grew {} MiB: {s:?}",
        s.grew / MIB
    );
}

#[test]
fn huge_jpegs_are_reduced_and_a_huge_progressive_one_refused_within_the_budget() {
    // The baseline JPEG decodes at 1/8 in the DCT domain; the progressive
    // one keeps every coefficient whatever the scale (13000^2 / 64 blocks
    // of 128 bytes: 323 MiB), over the budget: skipped, named.
    let budget = 64 * MIB;
    let s = measure(
        "huge_jpegs_are_reduced_and_a_huge_progressive_one_refused_within_the_budget",
        json!({"huge": ["jpeg", "progressive"], "spec": spec(json!({})),
               "errors": "skip", "budget": budget}),
    );
    assert_eq!(s.error, None);
    assert_eq!((s.delivered, s.skipped), (3, 1), "{s:?}");
    assert_eq!((s.reduced, s.over), (1, 1), "{s:?}");
    assert!(
        s.grew <= budget + SLACK,
        "peak grew {} MiB: {s:?}",
        s.grew / MIB
    );
}

#[test]
fn control_huge_jpegs_under_a_budget_that_holds_them_are_decoded() {
    let budget = 900 * MIB;
    let s = measure(
        "control_huge_jpegs_under_a_budget_that_holds_them_are_decoded",
        json!({"huge": ["jpeg", "progressive"], "spec": spec(json!({})),
               "errors": "skip", "budget": budget}),
    );
    assert_eq!(s.error, None);
    assert_eq!((s.delivered, s.reduced, s.over), (4, 0, 0), "{s:?}");
    assert!(
        s.grew > 300 * MIB,
        "full decodes, {} MiB: {s:?}",
        s.grew / MIB
    );
    assert!(
        s.grew <= budget + SLACK,
        "peak grew {} MiB: {s:?}",
        s.grew / MIB
    );
}

#[test]
fn an_image_the_spec_will_not_let_shrink_fails_or_is_skipped_naming_the_budget() {
    // `"reduce": false` asks for a full decode's pixels: over the budget,
    // the PNGs are refused, not reduced.
    let budget = 64 * MIB;
    let case = |errors: &str| {
        json!({"huge": ["png", "png"], "spec": spec(json!({"reduce": false})),
               "errors": errors, "budget": budget})
    };
    let s = measure(
        "an_image_the_spec_will_not_let_shrink_fails_or_is_skipped_naming_the_budget",
        case("skip"),
    );
    assert_eq!(s.error, None);
    assert_eq!((s.delivered, s.skipped, s.over), (2, 2, 2), "{s:?}");
    assert!(
        s.grew <= budget + SLACK,
        "peak grew {} MiB: {s:?}",
        s.grew / MIB
    );
    let s = measure(
        "an_image_the_spec_will_not_let_shrink_fails_or_is_skipped_naming_the_budget",
        case("fail"),
    );
    let e = s.error.expect("the loader fails");
    assert!(
        e.contains("over the decode memory budget of 64 MiB (`decode_memory`)")
            && e.contains("image of 13000x13000 pixels")
            && e.contains("sample `0001`"),
        "{e}"
    );
}

#[test]
fn a_progressive_jpeg_of_thousands_of_scans_is_refused_by_the_scan_limit() {
    let t = Transform::from_value(&spec(json!({"dtype": "uint8"}))).unwrap();
    let s = &t.images[0];
    let mut out = vec![0u8; s.out_bytes()];
    let run = |data: &[u8], out: &mut [u8]| {
        ringfeed::image::apply(s, data, 1, 0, 0, &mut Scratch::default(), out)
    };
    // Control: 400 scans (under the limit of 500) decode.
    let fine = gray_jpeg(512, 512, true, 400);
    let a = run(&fine, &mut out).unwrap();
    assert_eq!(a.source, (512, 512));
    assert!(out.iter().all(|&b| b == 128));
    let bomb = gray_jpeg(512, 512, true, 5000);
    let e = run(&bomb, &mut out).unwrap_err().to_string();
    assert!(e.contains("JPEG: 501 scans, past the limit of 500"), "{e}");
}

#[test]
fn the_budget_key_is_checked() {
    for bad in [json!(0), json!("lots"), json!(-1)] {
        let e = Config::from_map(
            json!({"urls": ["x.tar"], "decode_memory": bad})
                .as_object()
                .unwrap(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("decode_memory"), "{e}");
    }
    let c = Config::from_map(
        json!({"urls": ["x.tar"], "decode_memory": "256MiB"})
            .as_object()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(c.decode_memory, 256 << 20);
}
