//! What the decoders (`jpeg.rs`, `png_decode.rs`) share with their caller
//! (`decode.rs`) and each other: the window of the source to decode and
//! the pixels that come back, the pixel limit, the memory a decode and the
//! steps after it hold, and Pillow's conversions (CMYK to RGB, RGB to
//! gray).

/// The most pixels an image may have: Pillow's `MAX_IMAGE_PIXELS` error
/// threshold (twice its warning one of 89,478,485), past which an image
/// is taken for a decompression bomb.
pub const MAX_PIXELS: u64 = 2 * 89_478_485;

/// Decoded pixels of a window of the source image, possibly scaled.
#[derive(Debug)]
pub struct Pixels {
    pub buf: Vec<u8>,
    pub w: u32,
    pub h: u32,
    pub channels: usize,
    /// The source pixel (x, y) of this window's top-left corner.
    pub origin: (f64, f64),
    /// Window pixels per source pixel (1 unless decoded reduced).
    pub scale: f64,
}

/// A window of the source image to decode, in source pixels, and the
/// least output pixels per window pixel the caller needs (the resize's
/// target over the window's size: a reduced decode never goes below it).
#[derive(Debug, Clone, Copy)]
pub struct Want {
    pub x0: f64,
    pub y0: f64,
    pub x1: f64,
    pub y1: f64,
    /// Output pixels per source pixel, across and down.
    pub need: (f64, f64),
    /// Whether a reduced or windowed decode is allowed.
    pub reduce: bool,
    /// Whether a decode over the memory budget may be made smaller (never
    /// below `need`) or windowed to fit, though `reduce` is false (a
    /// resize before the crop): its pixels then differ a little from a
    /// full decode's, which could not be held.
    pub shrink: bool,
    /// The output's width and height, for the resize's scratch.
    pub out: (u32, u32),
    /// Whether the output step copies the box out of a full-scale window
    /// (a crop taken first: `output::write`).
    pub copies: bool,
}

/// Bytes a decoder's own state may hold besides the buffers counted
/// (libjpeg's pools and row buffers, the PNG decoder's inflate window and
/// rows): 1 MiB, some four times what either was seen to take for a
/// 13000-pixel-wide image.
pub(super) const DECODER_STATE: u64 = 1 << 20;

/// Bytes the steps after a decode hold while its window of `w` x `h`
/// pixels of `c` channels (at `scale` 1 or not) lives: the box copied out
/// of it (a crop taken first, at full scale), and the resize's scratch
/// (`fast_image_resize`'s two passes: an image of the output's width by
/// the window's height, or the reverse, and the output; its filter
/// weights, some 16 bytes per source pixel of a side).
pub(super) fn after_decode_bytes(w: u64, h: u64, c: u64, want: &Want, full_scale: bool) -> u64 {
    let (ow, oh) = (u64::from(want.out.0), u64::from(want.out.1));
    let copy = match want.copies && full_scale {
        true => w * h * c,
        false => 0,
    };
    copy + ((ow * h).max(w * oh) + ow * oh) * c + (w + h) * 16
}

/// The least eighth (1 to 8) whose decode still gives the resize at least
/// one decoded pixel per output pixel.
pub(super) fn least_eighth(need: (f64, f64)) -> u32 {
    (1..=8u32)
        .find(|n| {
            let s = f64::from(*n) / 8.0;
            s >= need.0 && s >= need.1
        })
        .unwrap_or(8)
}

pub(super) fn check_pixels(w: u32, h: u32) -> Result<(), String> {
    if w == 0 || h == 0 {
        return Err(format!("image of {w}x{h} pixels"));
    }
    if u64::from(w) * u64::from(h) > MAX_PIXELS {
        return Err(format!(
            "image of {w}x{h} pixels is past the limit of {MAX_PIXELS} (a decompression bomb?)"
        ));
    }
    Ok(())
}

/// Pillow's `MULDIV255`: `a * b / 255`, rounded its way.
fn muldiv255(a: u32, b: u32) -> u32 {
    let t = a * b + 128;
    ((t >> 8) + t) >> 8
}

/// Adobe's inverted CMYK (as Photoshop writes it, and Pillow reads every
/// CMYK JPEG as `CMYK;I`) to RGB, Pillow's `cmyk2rgb`.
pub(super) fn cmyk_to_rgb(cmyk: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(cmyk.len() / 4 * 3);
    for p in cmyk.chunks_exact(4) {
        let nk = u32::from(p[3]);
        for &c in &p[..3] {
            let c = 255 - u32::from(c);
            out.push((nk - muldiv255(c, nk)) as u8);
        }
    }
    out
}

/// Pillow's `convert("L")`: ITU-R 601-2 luma, in 16-bit fixed point.
pub(super) fn rgb_to_gray(rgb: &[u8]) -> Vec<u8> {
    rgb.chunks_exact(3)
        .map(|p| gray_of(p[0], p[1], p[2]))
        .collect()
}

/// One pixel's luma, as `rgb_to_gray`.
pub(super) fn gray_of(r: u8, g: u8, b: u8) -> u8 {
    let l = u32::from(r) * 19595 + u32::from(g) * 38470 + u32::from(b) * 7471 + 0x8000;
    (l >> 16) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pillows_conversions() {
        // Pillow: Image.new("RGB", (1, 1), (10, 200, 30)).convert("L") -> 124.
        assert_eq!(rgb_to_gray(&[10, 200, 30]), vec![124]);
        // CMYK;I: stored (255, 255, 255, 255) is no ink: white.
        assert_eq!(cmyk_to_rgb(&[255, 255, 255, 255]), vec![255, 255, 255]);
        // Full black ink (stored K = 0) is black whatever the rest.
        assert_eq!(cmyk_to_rgb(&[255, 0, 128, 0]), vec![0, 0, 0]);
    }
}
