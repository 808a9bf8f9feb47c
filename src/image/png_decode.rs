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
use super::pixels::{DECODER_STATE, Pixels, Want, after_decode_bytes, check_pixels, gray_of};
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
    /// The window's part of a row in the output's colour, where the source
    /// has another (reused from row to row).
    converted: Vec<u8>,
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
            converted: Vec::new(),
            out: Vec::with_capacity(kw as usize * kh as usize * c),
        }
    }

    /// Source row `row` (the next of the window, all `w` pixels of it).
    fn row(&mut self, row: &[u8]) {
        let (x0, x1, k) = (self.win.x0 as usize, self.win.x1 as usize, self.win.k);
        let c = self.color.channels();
        let src = &row[x0 * self.step..x1 * self.step];
        // Pixels already in the output's colour and depth (RGB to RGB,
        // gray to gray) are taken as they are; others are converted first.
        let px = if self.step == c {
            src
        } else {
            convert(src, self.step, self.color, &mut self.converted);
            &self.converted[..]
        };
        if k == 1 {
            self.out.extend_from_slice(px);
            return;
        }
        add_blocks(px, c, k as usize, &mut self.sums);
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

/// `src`'s pixels of `step` bytes (gray, gray and alpha, RGB, RGBA) in
/// `color`, into `out`.
fn convert(src: &[u8], step: usize, color: Color, out: &mut Vec<u8>) {
    out.clear();
    let gray_in = step <= 2;
    match (color, gray_in) {
        (Color::Gray, true) => out.extend(src.iter().step_by(step)),
        (Color::Gray, false) => {
            out.extend(src.chunks_exact(step).map(|p| gray_of(p[0], p[1], p[2])))
        }
        (Color::Rgb, true) => {
            for &v in src.iter().step_by(step) {
                out.extend_from_slice(&[v; 3]);
            }
        }
        (Color::Rgb, false) => {
            for p in src.chunks_exact(step) {
                out.extend_from_slice(&p[..3]);
            }
        }
    }
}

/// Adds the pixels of one row, `c` channels each, to the sums of the
/// blocks of `k` pixels across that they fall in (the last block may be
/// narrower). Indexed loops with casts and no calls, the common channel
/// counts apart: this runs for every source pixel of a reduced image, and
/// the test build, at opt-level 0, makes a call of every `from` and `min`.
fn add_blocks(px: &[u8], c: usize, k: usize, sums: &mut [u32]) {
    let block = k * c;
    let mut at = 0;
    let mut i = 0;
    while i < px.len() {
        let end = if i + block < px.len() {
            i + block
        } else {
            px.len()
        };
        match c {
            1 => {
                let mut s = 0u32;
                let mut j = i;
                while j < end {
                    s += px[j] as u32;
                    j += 1;
                }
                sums[at] += s;
            }
            3 => {
                let (mut r, mut g, mut b) = (0u32, 0u32, 0u32);
                let mut j = i;
                while j + 3 <= end {
                    r += px[j] as u32;
                    g += px[j + 1] as u32;
                    b += px[j + 2] as u32;
                    j += 3;
                }
                sums[at] += r;
                sums[at + 1] += g;
                sums[at + 2] += b;
            }
            _ => {
                let mut j = i;
                while j < end {
                    sums[at + (j - i) % c] += px[j] as u32;
                    j += 1;
                }
            }
        }
        at += c;
        i = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sums as the loop over pixels had them: each pixel's channels
    /// added to its block's, the block found by division.
    fn sums_by_pixel(px: &[u8], c: usize, k: usize) -> Vec<u32> {
        let n = px.len() / c;
        let mut sums = vec![0u32; n.div_ceil(k) * c];
        for x in 0..n {
            for ch in 0..c {
                sums[x / k * c + ch] += u32::from(px[x * c + ch]);
            }
        }
        sums
    }

    #[test]
    fn blocks_add_as_pixel_by_pixel_whatever_the_width_and_channels() {
        let mut seed = 7u32;
        // 1 and 3 channels take their own loops; 2 and 4 the general one.
        for c in [1usize, 2, 3, 4] {
            for k in 2usize..7 {
                for n in [1, k - 1, k, k + 1, 5 * k + 3, 64] {
                    let px: Vec<u8> = (0..n * c)
                        .map(|_| {
                            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                            (seed >> 16) as u8
                        })
                        .collect();
                    let mut sums = vec![0u32; n.div_ceil(k) * c];
                    add_blocks(&px, c, k, &mut sums);
                    // Twice: a block row is the sum of k rows.
                    add_blocks(&px, c, k, &mut sums);
                    let want: Vec<u32> = sums_by_pixel(&px, c, k).iter().map(|s| 2 * s).collect();
                    assert_eq!(sums, want, "c {c}, k {k}, {n} pixels");
                }
            }
        }
    }

    #[test]
    fn rows_are_converted_to_the_outputs_colour() {
        let mut out = Vec::new();
        // Gray and alpha to gray, then to RGB: the alpha dropped.
        convert(&[10, 255, 20, 0], 2, Color::Gray, &mut out);
        assert_eq!(out, [10, 20]);
        convert(&[10, 255, 20, 0], 2, Color::Rgb, &mut out);
        assert_eq!(out, [10, 10, 10, 20, 20, 20]);
        // RGBA to RGB and to gray (the luma of pixels::rgb_to_gray).
        convert(&[10, 200, 30, 1, 0, 0, 0, 9], 4, Color::Rgb, &mut out);
        assert_eq!(out, [10, 200, 30, 0, 0, 0]);
        convert(&[10, 200, 30, 1, 0, 0, 0, 9], 4, Color::Gray, &mut out);
        assert_eq!(out, [124, 0]);
    }

    #[test]
    fn a_reduced_window_is_the_mean_of_each_block() {
        // 5 x 3 gray, window x 1..5, reduced by 2: blocks of 2 x 2 and the
        // last row's 2 x 1, rounded half up.
        let rows: [[u8; 5]; 3] = [[9, 1, 2, 3, 4], [9, 5, 6, 7, 8], [9, 10, 20, 30, 41]];
        let win = Window {
            x0: 1,
            y0: 0,
            x1: 5,
            y1: 3,
            k: 2,
        };
        let mut sink = Sink::new(win, 1, Color::Gray);
        for r in &rows {
            sink.row(r);
        }
        assert_eq!(sink.finish(), [4, 6, 15, 36]);
    }
}
