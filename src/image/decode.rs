//! Image bytes to pixels: JPEG through libjpeg-turbo's TurboJPEG API
//! (`turbojpeg-sys`, built from its vendored source), PNG through the `png`
//! crate. A JPEG is decoded only as far as its crop needs: at a reduced
//! size in the DCT domain (1/8 to 8/8) when the output is smaller than the
//! crop, and only the rows and the iMCU columns the crop covers. PNG has no
//! such shortcut: every row is inflated.
//!
//! The output is 8-bit RGB or gray, as Pillow's `convert("RGB")` and
//! `convert("L")` give it: gray spread to three channels, alpha dropped
//! (not composited), CMYK JPEGs (Adobe's inverted convention) converted,
//! 16-bit PNG samples reduced to their high byte. EXIF orientation is not
//! applied, as neither Pillow's `Image.open` nor torchvision's
//! `decode_jpeg` applies it by default.
//!
//! Every failure is a reason (a string) the caller wraps with the field
//! and the sample; nothing the bytes hold can make this panic or read out
//! of bounds (the JPEG header's sizes are checked against a pixel limit
//! before any buffer is sized from them).

use std::ffi::CStr;
use std::io::Cursor;

use turbojpeg_sys as tj;

use super::spec::Color;

/// The most pixels an image may have: Pillow's `MAX_IMAGE_PIXELS` error
/// threshold (twice its warning one of 89,478,485), past which an image
/// is taken for a decompression bomb.
pub const MAX_PIXELS: u64 = 2 * 89_478_485;

/// The iMCU width of each TurboJPEG subsampling (`TJSAMP_444` to
/// `TJSAMP_441`), as `turbojpeg.h`'s `tjMCUWidth` gives it (static in the
/// header, so not linkable). A cropped decode's left edge must fall on
/// one; its top may be any row.
const MCU_W: [u32; 7] = [8, 16, 16, 8, 8, 32, 8];

/// The formats this decodes, told by their first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Jpeg,
    Png,
}

impl Kind {
    pub fn sniff(data: &[u8]) -> Option<Kind> {
        if data.starts_with(&[0xff, 0xd8, 0xff]) {
            Some(Kind::Jpeg)
        } else if data.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Kind::Png)
        } else {
            None
        }
    }
}

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
}

/// A JPEG or PNG's size, read from its header.
pub fn size(kind: Kind, data: &[u8]) -> Result<(u32, u32), String> {
    match kind {
        Kind::Jpeg => Jpeg::new()?.header(data).map(|h| (h.w, h.h)),
        Kind::Png => {
            let d = png::Decoder::new(Cursor::new(data));
            let r = d.read_info().map_err(|e| format!("PNG: {e}"))?;
            let (w, h) = r.info().size();
            check_pixels(w, h).map_err(|e| format!("PNG: {e}"))?;
            Ok((w, h))
        }
    }
}

fn check_pixels(w: u32, h: u32) -> Result<(), String> {
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

/// Decodes `want` of the image in `data` to `color`.
pub fn decode(kind: Kind, data: &[u8], color: Color, want: Want) -> Result<Pixels, String> {
    match kind {
        Kind::Jpeg => Jpeg::new()?.decode(data, color, want),
        Kind::Png => png_decode(data, color),
    }
}

struct Header {
    w: u32,
    h: u32,
    /// TurboJPEG's subsampling (`TJSAMP_*`), -1 when unusual.
    subsamp: i32,
    colorspace: i32,
}

/// One TurboJPEG decompressor (a handle of a few KB; made per image is
/// cheap next to a decode, and keeps no state between samples).
struct Jpeg(tj::tjhandle);

impl Drop for Jpeg {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { tj::tj3Destroy(self.0) }
    }
}

impl Jpeg {
    fn new() -> Result<Jpeg, String> {
        // SAFETY: tj3Init takes no pointers; a null return is checked.
        let h = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as i32) };
        if h.is_null() {
            return Err("JPEG: cannot make a decompressor".into());
        }
        let j = Jpeg(h);
        j.set(
            tj::TJPARAM_TJPARAM_MAXPIXELS,
            MAX_PIXELS.min(i32::MAX as u64) as i32,
        )?;
        Ok(j)
    }

    fn why(&self) -> String {
        // SAFETY: the handle is live; tj3GetErrorStr returns a NUL-terminated
        // string owned by the handle (or a static one), copied out here.
        let s = unsafe { CStr::from_ptr(tj::tj3GetErrorStr(self.0)) };
        format!("JPEG: {}", s.to_string_lossy())
    }

    fn set(&self, param: tj::TJPARAM, value: i32) -> Result<(), String> {
        // SAFETY: the handle is live; tj3Set takes plain integers.
        match unsafe { tj::tj3Set(self.0, param as i32, value) } {
            0 => Ok(()),
            _ => Err(self.why()),
        }
    }

    fn get(&self, param: tj::TJPARAM) -> i32 {
        // SAFETY: as `set`.
        unsafe { tj::tj3Get(self.0, param as i32) }
    }

    fn header(&mut self, data: &[u8]) -> Result<Header, String> {
        // SAFETY: the handle is live and `data` is valid for its length,
        // which TurboJPEG reads no further than.
        let rc = unsafe { tj::tj3DecompressHeader(self.0, data.as_ptr(), data.len() as u64) };
        if rc != 0 {
            return Err(self.why());
        }
        let (w, h) = (
            self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH),
            self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT),
        );
        let (w, h) = (u32::try_from(w).unwrap_or(0), u32::try_from(h).unwrap_or(0));
        check_pixels(w, h).map_err(|e| format!("JPEG: {e}"))?;
        Ok(Header {
            w,
            h,
            subsamp: self.get(tj::TJPARAM_TJPARAM_SUBSAMP),
            colorspace: self.get(tj::TJPARAM_TJPARAM_COLORSPACE),
        })
    }

    fn decode(mut self, data: &[u8], color: Color, want: Want) -> Result<Pixels, String> {
        let hd = self.header(data)?;
        // The reduced size: the least eighth whose window still gives the
        // resize at least one window pixel per output pixel.
        let num = match want.reduce {
            true => (1..=8u32)
                .find(|n| {
                    let s = f64::from(*n) / 8.0;
                    s >= want.need.0 && s >= want.need.1
                })
                .unwrap_or(8),
            false => 8,
        };
        // In lowest terms, as TurboJPEG lists its factors (4/8 is 1/2).
        let g = [8, 4, 2, 1].into_iter().find(|g| num % g == 0).unwrap_or(1);
        let sf = tj::tjscalingfactor {
            num: (num / g) as i32,
            denom: (8 / g) as i32,
        };
        let scaled = |v: u32| (u64::from(v) * u64::from(num)).div_ceil(8) as u32;
        let (sw, sh) = (scaled(hd.w), scaled(hd.h));
        let s = f64::from(num) / 8.0;
        // The window in scaled pixels, its left edge on an iMCU column.
        let clamp = |v: f64, max: u32| (v.max(0.0) as u32).min(max);
        let (mut x0, y0) = (
            clamp((want.x0 * s).floor(), sw),
            clamp((want.y0 * s).floor(), sh),
        );
        let (x1, y1) = (
            clamp((want.x1 * s).ceil(), sw),
            clamp((want.y1 * s).ceil(), sh),
        );
        let windowed = want.reduce && (0..7).contains(&hd.subsamp);
        let (x0, y0, x1, y1) = if windowed && x1 > x0 && y1 > y0 {
            let mcu = scaled(MCU_W[hd.subsamp as usize]).max(1);
            x0 -= x0 % mcu;
            // The right edge past the next iMCU column: the upsampling of
            // subsampled chroma reads the column beyond a pixel's, and a
            // window that ends at the pixel treats it as the image's edge
            // (the last column then differs from a full decode's by up to
            // 9 levels).
            let x1 = (x1 + 1).next_multiple_of(mcu).min(sw);
            (x0, y0, x1, y1)
        } else {
            (0, 0, sw, sh)
        };
        let (ww, wh) = (x1 - x0, y1 - y0);
        let cmyk = hd.colorspace == tj::TJCS_TJCS_CMYK as i32
            || hd.colorspace == tj::TJCS_TJCS_YCCK as i32;
        let (pf, channels) = match (cmyk, color) {
            (true, _) => (tj::TJPF_TJPF_CMYK, 4),
            (false, Color::Rgb) => (tj::TJPF_TJPF_RGB, 3),
            (false, Color::Gray) => (tj::TJPF_TJPF_GRAY, 1),
        };
        // SAFETY: the handle is live and its header was read just above.
        if unsafe { tj::tj3SetScalingFactor(self.0, sf) } != 0 {
            return Err(self.why());
        }
        let region = tj::tjregion {
            x: x0 as i32,
            y: y0 as i32,
            w: ww as i32,
            h: wh as i32,
        };
        let cropped = (x0, y0, x1, y1) != (0, 0, sw, sh);
        // SAFETY: as above; the region lies inside the scaled image.
        if cropped && unsafe { tj::tj3SetCroppingRegion(self.0, region) } != 0 {
            return Err(self.why());
        }
        let pitch = ww as usize * channels;
        let mut buf = vec![0u8; pitch * wh as usize];
        // SAFETY: `buf` holds `wh` rows of `pitch` bytes, exactly the
        // cropped, scaled image TurboJPEG writes at that pitch.
        let rc = unsafe {
            tj::tj3Decompress8(
                self.0,
                data.as_ptr(),
                data.len() as u64,
                buf.as_mut_ptr(),
                pitch as i32,
                pf,
            )
        };
        if rc != 0 {
            // SAFETY: the handle is live.
            let code = unsafe { tj::tj3GetErrorCode(self.0) };
            let why = self.why();
            // A warning leaves a whole image; libjpeg warns of recoverable
            // oddities (extraneous bytes before a marker) that Pillow
            // accepts too. A file cut short is not one of them.
            if code != tj::TJERR_TJERR_WARNING as i32 || why.contains("Premature end") {
                return Err(why);
            }
        }
        let (buf, channels) = match (cmyk, color) {
            (false, _) => (buf, channels),
            (true, Color::Rgb) => (cmyk_to_rgb(&buf), 3),
            (true, Color::Gray) => (rgb_to_gray(&cmyk_to_rgb(&buf)), 1),
        };
        Ok(Pixels {
            buf,
            w: ww,
            h: wh,
            channels,
            origin: (f64::from(x0) / s, f64::from(y0) / s),
            scale: s,
        })
    }
}

/// Pillow's `MULDIV255`: `a * b / 255`, rounded its way.
fn muldiv255(a: u32, b: u32) -> u32 {
    let t = a * b + 128;
    ((t >> 8) + t) >> 8
}

/// Adobe's inverted CMYK (as Photoshop writes it, and Pillow reads every
/// CMYK JPEG as `CMYK;I`) to RGB, Pillow's `cmyk2rgb`.
fn cmyk_to_rgb(cmyk: &[u8]) -> Vec<u8> {
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
fn rgb_to_gray(rgb: &[u8]) -> Vec<u8> {
    rgb.chunks_exact(3)
        .map(|p| {
            let l =
                u32::from(p[0]) * 19595 + u32::from(p[1]) * 38470 + u32::from(p[2]) * 7471 + 0x8000;
            (l >> 16) as u8
        })
        .collect()
}

fn png_decode(data: &[u8], color: Color) -> Result<Pixels, String> {
    let mut d = png::Decoder::new(Cursor::new(data));
    d.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut r = d.read_info().map_err(|e| format!("PNG: {e}"))?;
    let (w, h) = r.info().size();
    check_pixels(w, h).map_err(|e| format!("PNG: {e}"))?;
    let len = r
        .output_buffer_size()
        .ok_or_else(|| format!("PNG: image of {w}x{h} pixels too large to hold"))?;
    let mut buf = vec![0u8; len];
    let info = r.next_frame(&mut buf).map_err(|e| format!("PNG: {e}"))?;
    buf.truncate(info.buffer_size());
    let n = (w * h) as usize;
    let rgb = |buf: &[u8], step: usize, gray: bool| -> Vec<u8> {
        let mut out = Vec::with_capacity(n * 3);
        for p in buf.chunks_exact(step) {
            match gray {
                true => out.extend_from_slice(&[p[0], p[0], p[0]]),
                false => out.extend_from_slice(&p[..3]),
            }
        }
        out
    };
    let step = match info.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => return Err("PNG: a palette left unexpanded".into()),
    };
    let gray_in = step <= 2;
    if buf.len() != n * step {
        return Err(format!("PNG: {} bytes of pixels for {w}x{h}", buf.len()));
    }
    let (buf, channels) = match (color, gray_in) {
        (Color::Gray, true) if step == 1 => (buf, 1),
        (Color::Gray, true) => (buf.chunks_exact(2).map(|p| p[0]).collect(), 1),
        (Color::Gray, false) => (rgb_to_gray(&rgb(&buf, step, false)), 1),
        (Color::Rgb, g) => (rgb(&buf, step, g), 3),
    };
    Ok(Pixels {
        buf,
        w,
        h,
        channels,
        origin: (0.0, 0.0),
        scale: 1.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_told_by_their_first_bytes() {
        assert_eq!(Kind::sniff(&[0xff, 0xd8, 0xff, 0xe0]), Some(Kind::Jpeg));
        assert_eq!(Kind::sniff(b"\x89PNG\r\n\x1a\n...."), Some(Kind::Png));
        assert_eq!(Kind::sniff(b"GIF89a"), None);
        assert_eq!(Kind::sniff(b""), None);
    }

    #[test]
    fn garbage_is_a_reason_not_a_crash() {
        let want = Want {
            x0: 0.0,
            y0: 0.0,
            x1: 8.0,
            y1: 8.0,
            need: (1.0, 1.0),
            reduce: true,
        };
        for data in [
            &b"\xff\xd8\xff"[..],
            b"\xff\xd8\xff\xe0\x00\x10JFIF\x00garbage",
            b"\x89PNG\r\n\x1a\nxx",
        ] {
            let kind = Kind::sniff(data).unwrap();
            assert!(decode(kind, data, Color::Rgb, want).is_err());
            assert!(size(kind, data).is_err());
        }
    }

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
