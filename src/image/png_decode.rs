//! PNG bytes to pixels through the `png` crate, row by row and within the
//! decode memory budget: every row is inflated (PNG has no shortcut), but
//! only the window the crop needs is kept, so a 13000 x 13000 image costs
//! its window, not 507 MB plus a converted copy. When even the window is
//! over the budget and the spec lets the decode shrink, it is reduced by
//! a whole factor `k` as the rows stream past (each kept pixel the mean of
//! a `k` x `k` block, as Pillow's `reduce`), never below the output's
//! size; past that the image is refused with the numbers.
//!
//! An interlaced (Adam7) image comes in seven passes, so it is decoded
//! whole first (its full frame counted against the budget) and windowed
//! from there.

use std::io::Cursor;

use super::budget::{Budget, Reservation};
use super::pixels::{DECODER_STATE, Pixels, Want, after_decode_bytes, check_pixels, rgb_to_gray};
use super::spec::Color;

fn fail(e: impl std::fmt::Display) -> String {
    format!("PNG: {e}")
}

/// The kept window of the source, in source pixels, and its reduction.
#[derive(Debug, Clone, Copy)]
struct Window {
    x0: u32,
    y0: u32,
    x1: u32,
    y1: u32,
    /// Source pixels per kept pixel, across and down.
    k: u32,
}

impl Window {
    fn kept(&self) -> (u32, u32) {
        (
            (self.x1 - self.x0).div_ceil(self.k),
            (self.y1 - self.y0).div_ceil(self.k),
        )
    }
}

/// Decodes `want` of the PNG in `data` to `color` within `budget`.
pub(super) fn decode<'b>(
    data: &[u8],
    color: Color,
    want: Want,
    budget: &'b Budget,
) -> Result<(Pixels, Reservation<'b>), String> {
    let mut d = png::Decoder::new(Cursor::new(data));
    d.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut r = d.read_info().map_err(fail)?;
    let (w, h) = r.info().size();
    check_pixels(w, h).map_err(fail)?;
    let interlaced = r.info().interlaced;
    let step = match r.output_color_type().0 {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => return Err(fail("a palette left unexpanded")),
    };
    let c = color.channels();
    // The window: whole pixels around the fractional one asked for, and
    // one more (a crop's box is rounded to whole pixels by the output
    // step, which may reach half a pixel past it).
    let clamp = |v: f64, max: u32| (v.max(0.0) as u32).min(max);
    let (x0, y0) = (clamp(want.x0.floor(), w), clamp(want.y0.floor(), h));
    let (x1, y1) = (
        clamp(want.x1.ceil() + 1.0, w),
        clamp(want.y1.ceil() + 1.0, h),
    );
    let whole = Window {
        x0: 0,
        y0: 0,
        x1: w,
        y1: h,
        k: 1,
    };
    let window = match x1 > x0 && y1 > y0 {
        true => Window {
            x0,
            y0,
            x1,
            y1,
            k: 1,
        },
        false => whole,
    };
    // What the decoder holds whatever the window: its rows (the current
    // and the previous, raw and expanded), or the whole frame of an
    // interlaced image.
    let line = u64::from(w) * step as u64;
    let fixed = DECODER_STATE
        + match interlaced {
            true => line * u64::from(h),
            false => 4 * line,
        };
    let cost = |win: &Window| {
        let (kw, kh) = win.kept();
        let (kw, kh) = (u64::from(kw), u64::from(kh));
        let sums = match win.k {
            1 => 0,
            _ => kw * c as u64 * 4,
        };
        fixed + kw * kh * c as u64 + sums + after_decode_bytes(kw, kh, c as u64, &want, win.k == 1)
    };
    // The decodes to try, best first: the whole image where the spec
    // wants a full decode's pixels (as before any budget), the window
    // (the same pixels where the crop is taken first), then reduced by 2,
    // 3, ... down to the output's size, where the spec lets it shrink.
    // The largest factor keeps at least one kept pixel per output pixel.
    let most = (1.0 / want.need.0.max(want.need.1).max(1e-9)).floor() as u32;
    let mut tries = Vec::new();
    if !want.reduce {
        tries.push(whole);
    }
    if want.reduce || want.shrink {
        tries.push(window);
    }
    if want.shrink {
        tries.extend((2..=most).map(|k| Window { k, ..window }));
    }
    let Some(at) = tries.iter().position(|t| budget.fits(cost(t))) else {
        budget.note_refused();
        let least = tries.last().map_or(0, &cost);
        return Err(fail(format!(
            "image of {w}x{h} pixels: {}",
            budget.over(least)
        )));
    };
    let win = tries[at];
    if at > 0 {
        budget.note_reduced();
    }
    let held = budget.reserve(cost(&win)).map_err(fail)?;
    let mut sink = Sink::new(win, step, color);
    if interlaced {
        let len = r
            .output_buffer_size()
            .ok_or_else(|| fail(format!("image of {w}x{h} pixels too large to hold")))?;
        let mut buf = vec![0u8; len];
        let info = r.next_frame(&mut buf).map_err(fail)?;
        let line = info.line_size;
        for y in win.y0..win.y1 {
            let at = y as usize * line;
            let row = buf
                .get(at..at + line)
                .ok_or_else(|| fail(format!("{} bytes of pixels for {w}x{h}", buf.len())))?;
            sink.row(row);
        }
    } else {
        for y in 0..win.y1 {
            let row = r
                .next_row()
                .map_err(fail)?
                .ok_or_else(|| fail(format!("the image data ends at row {y} of {h}")))?;
            if y >= win.y0 {
                let data = row.data();
                if data.len() < w as usize * step {
                    return Err(fail(format!(
                        "a row of {} bytes for {w} pixels",
                        data.len()
                    )));
                }
                sink.row(data);
            }
        }
    }
    let (kw, kh) = win.kept();
    let buf = sink.finish();
    debug_assert_eq!(buf.len(), kw as usize * kh as usize * c);
    let s = 1.0 / f64::from(win.k);
    Ok((
        Pixels {
            buf,
            w: kw,
            h: kh,
            channels: c,
            origin: (f64::from(win.x0), f64::from(win.y0)),
            scale: s,
        },
        held,
    ))
}

/// Rows of the source in, the window's pixels (converted, reduced) out.
struct Sink {
    win: Window,
    step: usize,
    color: Color,
    /// Per kept pixel of the current block row: the sums of its channels.
    sums: Vec<u32>,
    /// Rows summed into `sums` so far.
    rows: u32,
    out: Vec<u8>,
}

impl Sink {
    fn new(win: Window, step: usize, color: Color) -> Sink {
        let (kw, kh) = win.kept();
        let c = color.channels();
        Sink {
            win,
            step,
            color,
            sums: match win.k {
                1 => Vec::new(),
                _ => vec![0; kw as usize * c],
            },
            rows: 0,
            out: Vec::with_capacity(kw as usize * kh as usize * c),
        }
    }

    /// One source pixel's channels in the output's colour.
    fn pixel(&self, p: &[u8], out: &mut [u8; 3]) {
        let gray_in = self.step <= 2;
        match (self.color, gray_in) {
            (Color::Gray, true) => out[0] = p[0],
            (Color::Gray, false) => out[0] = rgb_to_gray(&p[..3])[0],
            (Color::Rgb, true) => *out = [p[0]; 3],
            (Color::Rgb, false) => out.copy_from_slice(&p[..3]),
        }
    }

    /// Source row `row` (the next of the window, all `w` pixels of it).
    fn row(&mut self, row: &[u8]) {
        let (x0, x1, k) = (self.win.x0 as usize, self.win.x1 as usize, self.win.k);
        let c = self.color.channels();
        let mut px = [0u8; 3];
        if k == 1 && self.step == c {
            // Pixels already in the output's colour and depth (RGB to RGB,
            // gray to gray): the window's part of the row, as it is.
            self.out.extend_from_slice(&row[x0 * c..x1 * c]);
            return;
        }
        if k == 1 {
            for x in x0..x1 {
                self.pixel(&row[x * self.step..(x + 1) * self.step], &mut px);
                self.out.extend_from_slice(&px[..c]);
            }
            return;
        }
        for x in x0..x1 {
            self.pixel(&row[x * self.step..(x + 1) * self.step], &mut px);
            let at = (x - x0) / k as usize * c;
            for (sum, v) in self.sums[at..at + c].iter_mut().zip(px) {
                *sum += u32::from(v);
            }
        }
        self.rows += 1;
        if self.rows == k {
            self.flush();
        }
    }

    /// The block row summed so far, as means.
    fn flush(&mut self) {
        if self.rows == 0 {
            return;
        }
        let (k, c) = (self.win.k as usize, self.color.channels());
        let ww = (self.win.x1 - self.win.x0) as usize;
        for (i, px) in self.sums.chunks_exact_mut(c).enumerate() {
            // The last block of a row may be narrower than k.
            let across = (ww - i * k).min(k) as u32;
            let n = across * self.rows;
            for s in px.iter_mut() {
                self.out.push(((*s + n / 2) / n) as u8);
                *s = 0;
            }
        }
        self.rows = 0;
    }

    fn finish(mut self) -> Vec<u8> {
        self.flush();
        self.out
    }
}
