//! Image bytes to pixels: the formats told apart and each one's decoder
//! called, JPEG through `jpeg` (libjpeg-turbo, decoded only as far as the
//! crop needs: reduced in the DCT domain and windowed to its rows and iMCU
//! columns), PNG through the `png` crate (no such shortcut: every row is
//! inflated); the window to decode, what comes back and the conversions
//! both decoders share are in `pixels.rs`.
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

use std::io::Cursor;

use super::budget::{Budget, Reservation};
use super::jpeg;
use super::pixels::check_pixels;
pub use super::pixels::{MAX_PIXELS, Pixels, Want};
use super::png_decode;
use super::spec::Color;

/// The formats this decodes, told by their first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    Jpeg,
    Png,
}

impl ImageKind {
    pub fn sniff(data: &[u8]) -> Option<ImageKind> {
        if data.starts_with(&[0xff, 0xd8, 0xff]) {
            Some(ImageKind::Jpeg)
        } else if data.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(ImageKind::Png)
        } else {
            None
        }
    }
}

/// A JPEG or PNG's size, read from its header.
pub fn size(kind: ImageKind, data: &[u8]) -> Result<(u32, u32), String> {
    match kind {
        ImageKind::Jpeg => jpeg::size(data),
        ImageKind::Png => {
            let d = png::Decoder::new(Cursor::new(data));
            let r = d.read_info().map_err(|e| format!("PNG: {e}"))?;
            let (w, h) = r.info().size();
            check_pixels(w, h).map_err(|e| format!("PNG: {e}"))?;
            Ok((w, h))
        }
    }
}

/// Decodes `want` of the image in `data` to `color`, holding what the
/// decode and the steps after it need of `budget` (given back when the
/// reservation returned with the pixels drops).
pub fn decode<'b>(
    kind: ImageKind,
    data: &[u8],
    color: Color,
    want: Want,
    budget: &'b Budget,
) -> Result<(Pixels, Reservation<'b>), String> {
    match kind {
        ImageKind::Jpeg => jpeg::decode(data, color, want, budget),
        ImageKind::Png => png_decode::decode(data, color, want, budget),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_told_by_their_first_bytes() {
        assert_eq!(
            ImageKind::sniff(&[0xff, 0xd8, 0xff, 0xe0]),
            Some(ImageKind::Jpeg)
        );
        assert_eq!(
            ImageKind::sniff(b"\x89PNG\r\n\x1a\n...."),
            Some(ImageKind::Png)
        );
        assert_eq!(ImageKind::sniff(b"GIF89a"), None);
        assert_eq!(ImageKind::sniff(b""), None);
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
            shrink: true,
            out: (8, 8),
            copies: true,
        };
        for data in [
            &b"\xff\xd8\xff"[..],
            b"\xff\xd8\xff\xe0\x00\x10JFIF\x00garbage",
            b"\x89PNG\r\n\x1a\nxx",
        ] {
            let kind = ImageKind::sniff(data).unwrap();
            assert!(decode(kind, data, Color::Rgb, want, &Budget::default()).is_err());
            assert!(size(kind, data).is_err());
        }
    }
}
