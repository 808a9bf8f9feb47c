//! The pipeline on JPEGs and PNGs made here: a reduced or windowed decode
//! against the full one, draws that depend on the key alone, layouts,
//! types and flips against each other. Pixels against Pillow and
//! torchvision are checked from Python (`bindings/python/tests/test_image.py`).

use mozjpeg_sys as lj;

use super::*;

/// A smooth test picture (gradients and a disc), `w` × `h` RGB.
fn picture(w: u32, h: u32) -> Vec<u8> {
    let mut px = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let (fx, fy) = (f64::from(x) / f64::from(w), f64::from(y) / f64::from(h));
            let d = ((fx - 0.6).powi(2) + (fy - 0.4).powi(2)).sqrt();
            let disc = if d < 0.25 { 90.0 } else { 0.0 };
            px.push((255.0 * fx) as u8);
            px.push((200.0 * fy + disc * 0.5) as u8);
            px.push(
                (128.0 + 100.0 * (fx * 9.0).sin() * (fy * 7.0).cos() - disc).clamp(0.0, 255.0)
                    as u8,
            );
        }
    }
    px
}

/// The test encoder's `error_exit`: a failure here is the test's.
unsafe extern "C-unwind" fn encoder_failed(_: &mut lj::jpeg_common_struct) {
    panic!("libjpeg could not encode the test picture");
}

/// `px` (RGB, `w` × `h`) as a JPEG of quality 90, 4:2:0, written as
/// libjpeg-turbo writes it: mozjpeg's fastest profile is libjpeg-turbo's
/// defaults (baseline, the standard tables, no trellis quantization), and
/// `progressive` adds libjpeg's standard progression.
fn jpeg(px: &[u8], w: u32, h: u32, progressive: bool) -> Vec<u8> {
    assert_eq!(px.len(), (w * h * 3) as usize);
    // SAFETY: a compressor made, used and destroyed here, zeroed first as
    // libjpeg's examples start (its fields are integers, raw pointers,
    // function pointers and C enums whose 0 is a value); its errors panic;
    // each row written is `w * 3` bytes of `px`; libjpeg allocates the
    // output with malloc, copied out and freed here.
    unsafe {
        let mut err: lj::jpeg_error_mgr = std::mem::zeroed();
        let mut c: lj::jpeg_compress_struct = std::mem::zeroed();
        c.common.err = lj::jpeg_std_error(&mut err);
        (*c.common.err).error_exit = Some(encoder_failed);
        lj::jpeg_create_compress(&mut c);
        let mut out: *mut u8 = std::ptr::null_mut();
        let mut len: std::ffi::c_ulong = 0;
        lj::jpeg_mem_dest(&mut c, &mut out, &mut len);
        c.image_width = w;
        c.image_height = h;
        c.input_components = 3;
        c.in_color_space = lj::J_COLOR_SPACE::JCS_EXT_RGB;
        // Before the defaults, which follow the profile.
        lj::jpeg_c_set_int_param(
            &mut c,
            lj::J_INT_PARAM::JINT_COMPRESS_PROFILE,
            lj::JINT_COMPRESS_PROFILE_VALUE::JCP_FASTEST as std::ffi::c_int,
        );
        // YCbCr with luma sampled 2x2 and chroma 1x1: 4:2:0.
        lj::jpeg_set_defaults(&mut c);
        lj::jpeg_set_quality(&mut c, 90, 1);
        if progressive {
            lj::jpeg_simple_progression(&mut c);
        }
        lj::jpeg_start_compress(&mut c, 1);
        for row in px.chunks_exact(w as usize * 3) {
            let rows = [row.as_ptr()];
            assert_eq!(lj::jpeg_write_scanlines(&mut c, rows.as_ptr(), 1), 1);
        }
        lj::jpeg_finish_compress(&mut c);
        let v = std::slice::from_raw_parts(out, len as usize).to_vec();
        libc::free(out.cast());
        lj::jpeg_destroy_compress(&mut c);
        v
    }
}

fn png_of(px: &[u8], w: u32, h: u32, color: png::ColorType, depth: png::BitDepth) -> Vec<u8> {
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, w, h);
    e.set_color(color);
    e.set_depth(depth);
    e.write_header().unwrap().write_image_data(px).unwrap();
    out
}

fn spec(text: &str) -> ImageSpec {
    Transform::parse(text).unwrap().images.remove(0)
}

fn run(s: &ImageSpec, data: &[u8], position: u64) -> (Vec<u8>, Applied) {
    let mut out = vec![0u8; s.out_bytes()];
    let a = apply(s, data, 42, 0, position, &mut Scratch::default(), &mut out).unwrap();
    (out, a)
}

fn mean_abs(a: &[u8], b: &[u8]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from(x.abs_diff(*y)))
        .sum::<f64>()
        / a.len() as f64
}

#[test]
fn a_reduced_windowed_decode_gives_nearly_the_full_decodes_pixels() {
    let (w, h) = (640, 480);
    let data = jpeg(&picture(w, h), w, h, false);
    let fast = spec(r#"{"jpg": {"random_resized_crop": 64, "layout": "hwc"}}"#);
    let full = spec(r#"{"jpg": {"random_resized_crop": 64, "layout": "hwc", "reduce": false}}"#);
    let mut reduced = 0;
    for p in 0..40 {
        let (a, aa) = run(&fast, &data, p);
        let (b, ab) = run(&full, &data, p);
        assert_eq!(aa.plan, ab.plan, "the same draws whatever the decode");
        assert_eq!(ab.scale, 1.0);
        reduced += usize::from(aa.scale < 1.0);
        let d = mean_abs(&a, &b);
        assert!(
            d < 3.0,
            "position {p}: mean difference {d} at scale {}",
            aa.scale
        );
    }
    assert!(
        reduced > 10,
        "crops of 640x480 to 64 mostly decode reduced: {reduced} of 40"
    );
}

#[test]
fn a_windowed_decode_at_full_size_is_the_full_decode_cropped() {
    // A crop of the whole output size needs no reduction, so the decode
    // is windowed only: the pixels must be those of the full decode.
    let (w, h) = (256, 200);
    for progressive in [false, true] {
        let data = jpeg(&picture(w, h), w, h, progressive);
        let win = spec(r#"{"jpg": {"center_crop": [100, 120], "layout": "hwc"}}"#);
        let full =
            spec(r#"{"jpg": {"center_crop": [100, 120], "layout": "hwc", "reduce": false}}"#);
        let (a, aa) = run(&win, &data, 0);
        let (b, _) = run(&full, &data, 0);
        assert_eq!(aa.scale, 1.0);
        assert_eq!(a, b, "progressive {progressive}");
    }
}

#[test]
fn layouts_types_and_flips_are_the_same_pixels() {
    let (w, h) = (96, 80);
    let data = jpeg(&picture(w, h), w, h, false);
    let hwc = spec(r#"{"jpg": {"resize": [40, 50], "layout": "hwc"}}"#);
    let chw = spec(r#"{"jpg": {"resize": [40, 50]}}"#);
    let flip = spec(r#"{"jpg": {"resize": [40, 50], "layout": "hwc", "flip": 1.0}}"#);
    let f32s = spec(r#"{"jpg": {"resize": [40, 50], "layout": "hwc", "dtype": "float32"}}"#);
    let norm = spec(
        r#"{"jpg": {"resize": [40, 50], "layout": "hwc", "dtype": "float16",
             "normalize": {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]}}}"#,
    );
    let (a, _) = run(&hwc, &data, 0);
    let (b, _) = run(&chw, &data, 0);
    let (c, _) = run(&flip, &data, 0);
    let (d, _) = run(&f32s, &data, 0);
    let (e, _) = run(&norm, &data, 0);
    let (mean, std) = ([0.5f32, 0.4, 0.3], [0.2f32, 0.25, 0.3]);
    for y in 0..40 {
        for x in 0..50 {
            for ch in 0..3 {
                let v = a[(y * 50 + x) * 3 + ch];
                assert_eq!(b[(ch * 40 + y) * 50 + x], v);
                assert_eq!(c[(y * 50 + (49 - x)) * 3 + ch], v);
                let i = ((y * 50 + x) * 3 + ch) * 4;
                let f = f32::from_le_bytes(d[i..i + 4].try_into().unwrap());
                assert!((f - f32::from(v) / 255.0).abs() < 1e-6);
                let i = ((y * 50 + x) * 3 + ch) * 2;
                let g = half::f16::from_le_bytes(e[i..i + 2].try_into().unwrap()).to_f32();
                let want = (f32::from(v) / 255.0 - mean[ch]) / std[ch];
                assert!((g - want).abs() < 4e-3, "{g} {want}");
            }
        }
    }
}

#[test]
fn the_same_key_draws_the_same_crop_and_another_position_another() {
    let (w, h) = (320, 240);
    let data = jpeg(&picture(w, h), w, h, false);
    let s = spec(r#"{"jpg": {"random_resized_crop": 32, "flip": 0.5}}"#);
    let (a, pa) = run(&s, &data, 5);
    let (b, pb) = run(&s, &data, 5);
    assert_eq!((a, pa), (b, pb));
    let others = (0..20)
        .filter(|p| run(&s, &data, *p).1.plan != pa.plan)
        .count();
    assert!(others >= 18, "{others}");
}

#[test]
fn pngs_of_every_kind_decode_to_rgb_and_gray() {
    let (w, h) = (24, 16);
    let rgb = picture(w, h);
    let gray: Vec<u8> = rgb.chunks(3).map(|p| p[1]).collect();
    let rgba: Vec<u8> = rgb.chunks(3).flat_map(|p| [p[0], p[1], p[2], 7]).collect();
    let rgb16: Vec<u8> = rgb.iter().flat_map(|v| [*v, 0x55]).collect();
    let gray_a16: Vec<u8> = gray.iter().flat_map(|v| [*v, 0x11, 0x80, 0x00]).collect();
    let whole = spec(r#"{"png": {"resize": [16, 24], "layout": "hwc"}}"#);
    let whole_gray = spec(r#"{"png": {"resize": [16, 24], "layout": "hwc", "decode": "gray"}}"#);
    use png::{BitDepth as D, ColorType as C};
    // Same size: the resize is the identity, so the pixels are exact.
    for (data, want) in [
        (png_of(&rgb, w, h, C::Rgb, D::Eight), rgb.clone()),
        (png_of(&rgba, w, h, C::Rgba, D::Eight), rgb.clone()),
        (png_of(&rgb16, w, h, C::Rgb, D::Sixteen), rgb.clone()),
        (
            png_of(&gray, w, h, C::Grayscale, D::Eight),
            gray.iter().flat_map(|g| [*g; 3]).collect(),
        ),
        (
            png_of(&gray_a16, w, h, C::GrayscaleAlpha, D::Sixteen),
            gray.iter().flat_map(|g| [*g; 3]).collect(),
        ),
    ] {
        let (out, a) = run(&whole, &data, 0);
        assert_eq!(a.format, decode::ImageKind::Png);
        assert_eq!(out, want);
    }
    let (out, _) = run(&whole_gray, &png_of(&gray, w, h, C::Grayscale, D::Eight), 0);
    assert_eq!(out, gray);
}

#[test]
fn broken_images_are_named_errors() {
    let (w, h) = (64, 48);
    let data = jpeg(&picture(w, h), w, h, false);
    let s = spec(r#"{"jpg": {"center_crop": 16}}"#);
    let mut out = vec![0u8; s.out_bytes()];
    let mut scratch = Scratch::default();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (data[..data.len() / 2].to_vec(), "JPEG"),
        (data[..20].to_vec(), "JPEG"),
        (
            b"GIF89a......".to_vec(),
            "not a JPEG or PNG image (12 bytes, starting 47 49 46 38",
        ),
        (Vec::new(), "not a JPEG or PNG image (0 bytes"),
        (
            png_of(
                &picture(8, 8),
                8,
                8,
                png::ColorType::Rgb,
                png::BitDepth::Eight,
            )[..40]
                .to_vec(),
            "PNG",
        ),
    ];
    for (bad, want) in cases {
        let e = apply(&s, &bad, 0, 0, 0, &mut scratch, &mut out).unwrap_err();
        let m = e.to_string();
        assert!(m.starts_with("field `jpg`: ") && m.contains(want), "{m}");
        assert_eq!(e.status(), crate::error::status::RINGFEED_ERR_FORMAT);
    }
    // A crop larger than its resized image is refused, not padded.
    let big = spec(r#"{"jpg": {"resize": 8, "center_crop": 16}}"#);
    let mut out = vec![0u8; big.out_bytes()];
    let e = apply(&big, &data, 0, 0, 0, &mut scratch, &mut out).unwrap_err();
    assert!(
        e.to_string().contains("larger than the resized image"),
        "{e}"
    );
}

#[test]
fn labels_are_numbers_of_their_type() {
    let t = Transform::parse(
        r#"{"cls": "int64", "json": {"label": "int32", "key": "y"}, "w": "float32"}"#,
    )
    .unwrap();
    let (cls, json, w) = (&t.labels[0], &t.labels[1], &t.labels[2]);
    assert_eq!(label(cls, b"7\n").unwrap(), 7.0);
    assert_eq!(label(json, br#"{"y": -3}"#).unwrap(), -3.0);
    assert_eq!(label(w, b"0.25").unwrap(), 0.25);
    for (s, data, want) in [
        (cls, &b"seven"[..], "not a number: \"seven\""),
        (cls, b"1.5", "is not a I64 label"),
        (cls, b"\xff", "not UTF-8"),
        (json, b"{", "not JSON"),
        (json, br#"{"z": 1}"#, "no number at key `y`"),
        (json, br#"{"y": 3000000000}"#, "is not a I32 label"),
    ] {
        let e = label(s, data).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn reduced_decodes_never_put_the_box_outside_their_window() {
    // Odd sizes, many draws, outputs small and large: the box of a reduced
    // decode, in its fractional pixels, must stay inside the window it was
    // decoded to (the benchmark's 1,888th photo once fell 1e-13 outside).
    let mut reduced = 0;
    for (w, h) in [(661, 497), (803, 611), (333, 1001), (719, 720)] {
        let data = jpeg(&picture(w, h), w, h, false);
        for size in [48, 224] {
            let s = spec(&format!(
                r#"{{"jpg": {{"random_resized_crop": {size}, "flip": 0.5}}}}"#
            ));
            let mut out = vec![0u8; s.out_bytes()];
            let mut scratch = Scratch::default();
            for p in 0..150 {
                let a = apply(&s, &data, 3, 1, p, &mut scratch, &mut out)
                    .unwrap_or_else(|e| panic!("{w}x{h} to {size} at {p}: {e}"));
                reduced += usize::from(a.scale < 1.0);
            }
        }
    }
    assert!(reduced > 100, "{reduced}");
}

#[test]
fn a_file_cut_short_fails_where_the_window_needs_the_missing_rows() {
    let (w, h) = (96, 320);
    let data = jpeg(&picture(w, h), w, h, false);
    let cut = &data[..data.len() * 2 / 3];
    let color = spec::Color::Rgb;
    let budget = budget::Budget::default();
    let window = |y0: f64, y1: f64| decode::Want {
        x0: 0.0,
        y0,
        x1: 40.0,
        y1,
        need: (1.0, 1.0),
        reduce: true,
        shrink: true,
        out: (40, 40),
        copies: true,
    };
    // The bottom rows are in the part cut off: libjpeg warns that the
    // file ended early and fills them with gray; that is an error.
    let bottom = window(280.0, 320.0);
    let whole = decode::decode(decode::ImageKind::Jpeg, &data, color, bottom, &budget)
        .unwrap()
        .0;
    assert_eq!((whole.w, whole.h), (48, 40), "windowed to the bottom rows");
    let e = decode::decode(decode::ImageKind::Jpeg, cut, color, bottom, &budget).unwrap_err();
    assert_eq!(e, "JPEG: Premature end of JPEG file");
    // The top rows are whole: the rows below a window are skipped without
    // being read (as TurboJPEG's cropped decode does), so the window's
    // pixels, which are right, come back.
    let top = window(0.0, 24.0);
    let a = decode::decode(decode::ImageKind::Jpeg, cut, color, top, &budget)
        .unwrap()
        .0;
    let b = decode::decode(decode::ImageKind::Jpeg, &data, color, top, &budget)
        .unwrap()
        .0;
    assert_eq!((a.w, a.h, &a.buf), (48, 24, &b.buf));
    // The whole image of the cut file is refused.
    let full = decode::Want {
        reduce: false,
        ..top
    };
    let e = decode::decode(decode::ImageKind::Jpeg, cut, color, full, &budget).unwrap_err();
    assert_eq!(e, "JPEG: Premature end of JPEG file");
}

#[test]
fn extraneous_bytes_between_segments_are_skipped_as_pillow_skips_them() {
    let (w, h) = (64, 48);
    let data = jpeg(&picture(w, h), w, h, false);
    // Bytes that are no marker between two segments: libjpeg skips them
    // with a warning, and the image is whole.
    assert_eq!(&data[2..4], &[0xff, 0xe0], "the JFIF segment first");
    let after_jfif = 4 + usize::from(u16::from_be_bytes([data[4], data[5]]));
    let mut junk = data[..after_jfif].to_vec();
    junk.extend_from_slice(b"junk");
    junk.extend_from_slice(&data[after_jfif..]);
    let budget = budget::Budget::default();
    let full = decode::Want {
        x0: 0.0,
        y0: 0.0,
        x1: f64::from(w),
        y1: f64::from(h),
        need: (1.0, 1.0),
        reduce: false,
        shrink: false,
        out: (w, h),
        copies: false,
    };
    let a = decode::decode(
        decode::ImageKind::Jpeg,
        &junk,
        spec::Color::Rgb,
        full,
        &budget,
    )
    .unwrap()
    .0;
    let b = decode::decode(
        decode::ImageKind::Jpeg,
        &data,
        spec::Color::Rgb,
        full,
        &budget,
    )
    .unwrap()
    .0;
    assert_eq!((a.w, a.h), (w, h));
    assert_eq!(a.buf, b.buf);
}
