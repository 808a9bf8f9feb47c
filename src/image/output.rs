//! Decoded pixels to one output image: the resize of the plan's box to the
//! output size (bilinear with Pillow's antialiasing support, through
//! `fast_image_resize`, as torchvision's `antialias=True` and Pillow's
//! `resize(BILINEAR)` compute it), the flip, and the write in the output's
//! layout and type (uint8, or float scaled to [0, 1] and normalized).

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::decode::Pixels;
use super::draw::Plan;
use super::spec::{Dtype, ImageSpec, Layout};

/// Resizes `px` (a window of the source) per `plan` into `out`, laid out
/// and typed per `spec`. `out` is exactly `spec.out_bytes()` long.
pub fn write(
    px: &Pixels,
    plan: &Plan,
    spec: &ImageSpec,
    resizer: &mut Resizer,
    out: &mut [u8],
) -> Result<(), String> {
    let c = px.channels;
    let pt = match c {
        1 => PixelType::U8,
        3 => PixelType::U8x3,
        n => return Err(format!("{n} channels decoded")),
    };
    // The box in the window's pixels.
    let r = plan.region;
    let left = (r.left - px.origin.0) * px.scale;
    let top = (r.top - px.origin.1) * px.scale;
    let (bw, bh) = (r.w * px.scale, r.h * px.scale);
    let (ow, oh) = (plan.out.w, plan.out.h);
    let alg = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    let mut dst = Image::new(ow, oh, pt);
    if plan.crop_first && px.scale == 1.0 {
        // The crop is an image of its own before the resize: its edges
        // clamp the filter, as Pillow's `crop(...).resize(...)` does.
        // (A reduced decode's box is fractional in its pixels: rounding
        // it to whole ones moved the edges by up to half a reduced pixel,
        // 4 source pixels at 1/8, so it is resized as a fractional box
        // below instead.)
        let x0 = (left.round().max(0.0) as u32).min(px.w.saturating_sub(1));
        let y0 = (top.round().max(0.0) as u32).min(px.h.saturating_sub(1));
        let w = (bw.round().max(1.0) as u32).min(px.w - x0);
        let h = (bh.round().max(1.0) as u32).min(px.h - y0);
        let mut sub = Vec::with_capacity(w as usize * h as usize * c);
        for y in y0..y0 + h {
            let row = (y as usize * px.w as usize + x0 as usize) * c;
            sub.extend_from_slice(&px.buf[row..row + w as usize * c]);
        }
        let src = ImageRef::new(w, h, &sub, pt).map_err(|e| format!("resize: {e}"))?;
        resizer
            .resize(&src, &mut dst, &alg)
            .map_err(|e| format!("resize: {e}"))?;
    } else {
        if left < -0.5
            || top < -0.5
            || left + bw > f64::from(px.w) + 0.5
            || top + bh > f64::from(px.h) + 0.5
        {
            return Err(format!(
                "the crop ({ow}x{oh}) is larger than the resized image; torchvision would pad it, \
                 which this pipeline does not: resize to at least the crop's size"
            ));
        }
        let src = ImageRef::new(px.w, px.h, &px.buf, pt).map_err(|e| format!("resize: {e}"))?;
        // The box clamped to the window: its edges are products of
        // fractions and may pass the window's by a rounding error, which
        // the resizer refuses.
        let (l, t) = (left.max(0.0), top.max(0.0));
        let (w, h) = (bw.min(f64::from(px.w) - l), bh.min(f64::from(px.h) - t));
        let opts = alg.crop(l, t, w, h);
        resizer
            .resize(&src, &mut dst, &opts)
            .map_err(|e| format!("resize: {e}"))?;
    }
    store(
        dst.buffer(),
        ow as usize,
        oh as usize,
        c,
        plan.flip,
        spec,
        out,
    );
    Ok(())
}

/// Writes HWC `u8` pixels of `w` × `h` × `c` into `out` in the spec's
/// layout and type, mirrored when `flip`.
fn store(px: &[u8], w: usize, h: usize, c: usize, flip: bool, spec: &ImageSpec, out: &mut [u8]) {
    let (scale, bias) = factors(spec, c);
    let at = |y: usize, x: usize, ch: usize| {
        let sx = if flip { w - 1 - x } else { x };
        px[(y * w + sx) * c + ch]
    };
    let index = |y: usize, x: usize, ch: usize| match spec.layout {
        Layout::Hwc => (y * w + x) * c + ch,
        Layout::Chw => (ch * h + y) * w + x,
    };
    let n = spec.dtype.bytes();
    for y in 0..h {
        for x in 0..w {
            for ch in 0..c {
                let v = at(y, x, ch);
                let i = index(y, x, ch) * n;
                match spec.dtype {
                    Dtype::U8 => out[i] = v,
                    Dtype::F32 => {
                        let f = f32::from(v) * scale[ch] + bias[ch];
                        out[i..i + 4].copy_from_slice(&f.to_le_bytes());
                    }
                    Dtype::F16 => {
                        let f = half::f16::from_f32(f32::from(v) * scale[ch] + bias[ch]);
                        out[i..i + 2].copy_from_slice(&f.to_le_bytes());
                    }
                }
            }
        }
    }
}

/// Per channel, `v * scale + bias` is `(v / 255 - mean) / std`
/// (torchvision's `ToDtype(scale=True)` then `Normalize`), or `v / 255`.
fn factors(spec: &ImageSpec, c: usize) -> ([f32; 3], [f32; 3]) {
    let mut scale = [1.0 / 255.0; 3];
    let mut bias = [0.0; 3];
    if let Some((mean, std)) = &spec.normalize {
        for ch in 0..c {
            scale[ch] = 1.0 / (255.0 * std[ch]);
            bias[ch] = -mean[ch] / std[ch];
        }
    }
    (scale, bias)
}
