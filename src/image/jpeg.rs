//! JPEG bytes to pixels through libjpeg-turbo's libjpeg API: the decoder
//! of `mozjpeg-sys` (mozjpeg changes only the encoder), built from the
//! crate's vendored source by the `cc` crate, with the x86-64 SIMD code
//! where the build found `nasm` ([`SIMD`]). A JPEG is decoded only as far
//! as its crop needs: at a reduced size in the DCT domain
//! (`scale_num / scale_denom`, 1/8 to 8/8) when the output is smaller
//! than the crop, and only the rows (`jpeg_skip_scanlines`) and the iMCU
//! columns (`jpeg_crop_scanline`) the crop covers. These are the steps of
//! TurboJPEG's `tj3Decompress8` with a scaling factor and a cropping
//! region, taken one by one.
//!
//! libjpeg reports a fatal error by calling the error manager's
//! `error_exit`, which must not return. Here it unwinds (the crate's
//! `unwinding` feature: its C is compiled with `-fexceptions` and its
//! functions are declared `C-unwind`) with a [`Failure`] payload, by
//! `resume_unwind`, which runs no panic hook; [`guarded`] catches it
//! around each decode, so it never goes further, and never across the C
//! ABI. The decompressor is then only destroyed, which frees everything
//! libjpeg allocated. Warnings (corrupt data libjpeg recovers from, such
//! as extraneous bytes before a marker, which Pillow accepts too) leave
//! a whole image and are accepted, except a file cut short.
//!
//! A fatal error can only unwind in a build with `panic = "unwind"` (the
//! profiles' default, and Cargo.toml's release profile says so too); with
//! `panic = "abort"` it would end the process, and build.rs warns.

use std::ffi::c_ulong;
use std::marker::PhantomData;
use std::os::raw::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

use mozjpeg_sys as lj;
use mozjpeg_sys::J_COLOR_SPACE::{JCS_CMYK, JCS_EXT_RGB, JCS_GRAYSCALE, JCS_YCCK};

use super::budget::{Budget, Reservation};
use super::pixels::{
    DECODER_STATE, Pixels, Want, after_decode_bytes, check_pixels, cmyk_to_rgb, least_eighth,
    rgb_to_gray,
};
use super::spec::Color;
use crate::log::Level;

/// Whether libjpeg-turbo was built with its SIMD code (build.rs reads the
/// configuration the `mozjpeg-sys` build exports). Without it (no `nasm`
/// on PATH when an x86 build ran) it decodes slower (by how much:
/// docs/decisions.md, "Image decoding").
pub const SIMD: bool = cfg!(ringfeed_jpeg_simd);

/// libjpeg's `JMSG_LENGTH_MAX`: the buffer `format_message` writes its
/// message into (the crate's binding types it as 80 bytes, the C writes
/// up to this many).
const MSG_LEN: usize = 200;

/// The most scans a JPEG may have: 500, the limit libjpeg-turbo's own
/// fuzz targets set (`TJPARAM_SCANLIMIT`). Encoders write 1 (baseline) or
/// about 10 (progressive); a file of thousands of tiny scans makes the
/// decoder pass over its whole coefficient buffer once per scan, a CPU
/// bomb of a few KB.
pub(super) const MAX_SCANS: i32 = 500;

/// The payload of a fatal libjpeg error on its way to [`guarded`]: the
/// library's message.
struct Failure(String);

/// Runs `f`, which calls into libjpeg; a fatal libjpeg error in it comes
/// back as `Err("JPEG: <message>")`. A panic of anything else goes on.
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    // AssertUnwindSafe: after a failure, the only state the closure
    // touched that outlives it is the decompressor, which is only
    // destroyed then (`Decompressor::drop`).
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => match payload.downcast::<Failure>() {
            Ok(failure) => Err(format!("JPEG: {}", failure.0)),
            Err(other) => resume_unwind(other),
        },
    }
}

/// libjpeg's `format_message` as C declares it: it writes into a
/// caller's buffer of `MSG_LEN` bytes (the binding's type says a shared
/// reference to 80).
type FormatMessage = unsafe extern "C-unwind" fn(&mut lj::jpeg_common_struct, *mut u8);

/// The message of the error or warning `cinfo`'s error manager holds.
fn message(cinfo: &mut lj::jpeg_common_struct) -> String {
    // SAFETY: `err` is the error manager `Decompressor::open` set, whose
    // `format_message` jpeg_std_error filled in.
    let format = unsafe { (*cinfo.err).format_message };
    let Some(format) = format else {
        return "unknown error".into();
    };
    // SAFETY: the same function with its buffer argument typed as the
    // pointer it is; a reference and a pointer pass alike.
    let format: FormatMessage = unsafe { std::mem::transmute(format) };
    let mut buf = [0u8; MSG_LEN];
    // SAFETY: `buf` holds JMSG_LENGTH_MAX bytes, as many as format_message
    // writes (snprintf-bounded, NUL-terminated).
    unsafe { format(cinfo, buf.as_mut_ptr()) };
    let len = buf.iter().position(|&b| b == 0).unwrap_or(MSG_LEN);
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

/// `error_exit`: never returns to libjpeg; unwinds to [`guarded`].
unsafe extern "C-unwind" fn error_exit(cinfo: &mut lj::jpeg_common_struct) {
    resume_unwind(Box::new(Failure(message(cinfo))))
}

/// The progress monitor: a file past [`MAX_SCANS`] scans is a fatal error
/// (TurboJPEG's scan limit, done the same way). libjpeg calls it as each
/// scan's input is consumed.
unsafe extern "C-unwind" fn scan_limit(cinfo: &mut lj::jpeg_common_struct) {
    if cinfo.is_decompressor == 0 {
        return;
    }
    let d = (cinfo as *mut lj::jpeg_common_struct).cast::<lj::jpeg_decompress_struct>();
    // SAFETY: a decompressor's common part is the first member of its
    // `jpeg_decompress_struct` (as libjpeg itself casts it), which lives
    // in the decompressor's box while libjpeg runs.
    let scans = unsafe { (*d).input_scan_number };
    if scans > MAX_SCANS {
        resume_unwind(Box::new(Failure(format!(
            "{scans} scans, past the limit of {MAX_SCANS} (a progressive file of many \
             tiny scans is a decoding bomb)"
        ))))
    }
}

/// `emit_message`: trace messages (level >= 0) are dropped; a warning
/// (level -1) is counted, and a file cut short remembered.
unsafe extern "C-unwind" fn emit_message(cinfo: &mut lj::jpeg_common_struct, level: c_int) {
    if level >= 0 {
        return;
    }
    // `err` was made from a pointer to the whole `ErrorMgr` (repr(C), its
    // `public` first), so it reaches `truncated` too.
    let err = cinfo.err.cast::<ErrorMgr>();
    // SAFETY: `err` points at the live `ErrorMgr` of this decompressor,
    // which nothing else reads or writes while libjpeg runs.
    let code = unsafe {
        (*err).public.num_warnings += 1;
        (*err).public.msg_code
    };
    if code == lj::JWRN_JPEG_EOF {
        let why = message(cinfo);
        // SAFETY: as above.
        unsafe { (*err).truncated = Some(why) };
    }
}

/// libjpeg's error manager and what the warnings told.
#[repr(C)]
struct ErrorMgr {
    /// First, so libjpeg's pointer to it is a pointer to the whole.
    public: lj::jpeg_error_mgr,
    /// The message of a "Premature end of JPEG file" warning: libjpeg
    /// filled the rest of the image with gray.
    truncated: Option<String>,
}

struct State {
    cinfo: lj::jpeg_decompress_struct,
    err: ErrorMgr,
    /// Checks the scan count ([`scan_limit`]).
    progress: lj::jpeg_progress_mgr,
}

/// One libjpeg decompressor reading bytes that live for `'a` (its source
/// manager points into them). Made per image: a few KB, cheap next to a
/// decode, and no state is kept between samples.
struct Decompressor<'a> {
    /// Boxed: libjpeg keeps pointers to the error manager and the struct.
    s: Box<State>,
    data: PhantomData<&'a [u8]>,
}

impl Drop for Decompressor<'_> {
    fn drop(&mut self) {
        // SAFETY: the struct was zeroed and given its error manager before
        // anything else, so whatever point a create or a decode reached
        // (mem NULL if the create failed), destroying frees exactly what
        // libjpeg allocated; it reports no errors.
        unsafe { lj::jpeg_destroy_decompress(&mut self.s.cinfo) }
    }
}

impl<'a> Decompressor<'a> {
    /// A decompressor with its header read and its size checked against
    /// the pixel limit. Call inside [`guarded`].
    fn open(data: &'a [u8]) -> Result<(Decompressor<'a>, u32, u32), String> {
        let mut s = Box::new(State {
            // SAFETY: every field of libjpeg's structs is an integer, a
            // raw pointer, an Option of a function pointer or a C enum
            // whose 0 is a value: all zeroes is the state libjpeg's
            // examples start from.
            cinfo: unsafe { std::mem::zeroed() },
            err: ErrorMgr {
                // SAFETY: as `cinfo`.
                public: unsafe { std::mem::zeroed() },
                truncated: None,
            },
            // SAFETY: as `cinfo`.
            progress: unsafe { std::mem::zeroed() },
        });
        s.progress.progress_monitor = Some(scan_limit);
        // SAFETY: jpeg_std_error fills the struct it is given and returns it.
        unsafe { lj::jpeg_std_error(&mut s.err.public) };
        s.err.public.error_exit = Some(error_exit);
        s.err.public.emit_message = Some(emit_message);
        // From the whole `ErrorMgr`: `emit_message` reaches past `public`.
        s.cinfo.common.err = (&raw mut s.err).cast();
        let mut d = Decompressor {
            s,
            data: PhantomData,
        };
        let cinfo = &mut d.s.cinfo;
        // SAFETY: the struct has its error manager (boxed, so it stays
        // where the pointer says); its errors unwind to `guarded`.
        unsafe { lj::jpeg_create_decompress(cinfo) };
        // After the create, which zeroes the rest of the struct; boxed with
        // it, so the pointer stays good.
        cinfo.common.progress = &raw mut d.s.progress;
        // SAFETY: `data` outlives the decompressor ('a); libjpeg reads no
        // further than its length. An empty one is an error.
        unsafe { lj::jpeg_mem_src(cinfo, data.as_ptr(), data.len() as c_ulong) };
        // SAFETY: created and given a source; `1`: an image is required.
        unsafe { lj::jpeg_read_header(cinfo, 1) };
        let (w, h) = (cinfo.image_width, cinfo.image_height);
        check_pixels(w, h).map_err(|e| format!("JPEG: {e}"))?;
        Ok((d, w, h))
    }

    /// The components' sampling factors (h, v), read from the header.
    fn sampling(&self) -> Vec<(c_int, c_int)> {
        let c = &self.s.cinfo;
        let n = usize::try_from(c.num_components).unwrap_or(0);
        if c.comp_info.is_null() {
            return Vec::new();
        }
        // SAFETY: after jpeg_read_header, comp_info holds num_components
        // entries (libjpeg checked the count against MAX_COMPONENTS).
        let comps = unsafe { std::slice::from_raw_parts(c.comp_info, n) };
        comps
            .iter()
            .map(|c| (c.h_samp_factor, c.v_samp_factor))
            .collect()
    }

    /// Whether the sampling is one of TurboJPEG's `TJSAMP_*` (gray, 4:4:4,
    /// 4:2:2, 4:2:0, 4:4:0, 4:1:1, 4:4:1: luma's factors and chroma's
    /// 1x1, CMYK's K as luma): the ones a windowed decode is used on,
    /// as before. Others are decoded whole.
    fn usual_sampling(&self) -> bool {
        let f = self.sampling();
        let cmyk = matches!(self.s.cinfo.jpeg_color_space, JCS_CMYK | JCS_YCCK);
        match f.as_slice() {
            [_] => true,
            [luma, rest @ ..] if f.len() == 3 || (cmyk && f.len() == 4) => {
                matches!(luma, (1, 1) | (2, 1) | (2, 2) | (1, 2) | (4, 1) | (1, 4))
                    && rest.iter().enumerate().all(|(i, c)| match cmyk && i == 2 {
                        true => c == luma,
                        false => *c == (1, 1),
                    })
            }
            _ => false,
        }
    }

    /// Bytes of the coefficient buffers libjpeg keeps for a file of
    /// several scans (progressive, or components in scans of their own):
    /// every block of every component at full size, whatever the scale or
    /// the window (jdcoefct.c's whole-image arrays, rounded up to whole
    /// iMCUs as it rounds them). 0 for a file of one scan.
    fn coefficient_bytes(&self) -> u64 {
        // SAFETY: the header was read (DSTATE_READY), as the call needs.
        if unsafe { lj::jpeg_has_multiple_scans(&self.s.cinfo) } == 0 {
            return 0;
        }
        let c = &self.s.cinfo;
        let n = usize::try_from(c.num_components).unwrap_or(0);
        if c.comp_info.is_null() {
            return 0;
        }
        // SAFETY: as in `sampling`.
        let comps = unsafe { std::slice::from_raw_parts(c.comp_info, n) };
        let round = |v: u32, m: c_int| u64::from(v).next_multiple_of(m.max(1) as u64);
        comps
            .iter()
            .map(|c| {
                // 64 coefficients of 2 bytes a block (JBLOCK).
                round(c.width_in_blocks, c.h_samp_factor)
                    * round(c.height_in_blocks, c.v_samp_factor)
                    * 128
            })
            .sum()
    }

    /// The window to decode at `num` / 8, in scaled pixels of an image of
    /// `sw` x `sh`: `want`'s box, its left edge on an iMCU column, when
    /// `windowed`; else the whole.
    fn window(&self, want: &Want, num: u32, windowed: bool, (sw, sh): (u32, u32)) -> [u32; 4] {
        let s = f64::from(num) / 8.0;
        let clamp = |v: f64, max: u32| (v.max(0.0) as u32).min(max);
        let (mut x0, y0) = (
            clamp((want.x0 * s).floor(), sw),
            clamp((want.y0 * s).floor(), sh),
        );
        let (x1, y1) = (
            clamp((want.x1 * s).ceil(), sw),
            clamp((want.y1 * s).ceil(), sh),
        );
        if !(windowed && x1 > x0 && y1 > y0) {
            return [0, 0, sw, sh];
        }
        // libjpeg's iMCU column in scaled pixels (jpeg_crop_scanline's
        // `align`): the scaled block times luma's horizontal factor.
        let max_h = u32::try_from(self.s.cinfo.max_h_samp_factor.max(1)).unwrap_or(1);
        let mcu = match self.s.cinfo.num_components == 1 {
            true => num,
            false => num * max_h,
        };
        x0 -= x0 % mcu;
        // The right edge past the next iMCU column: the upsampling of
        // subsampled chroma reads the column beyond a pixel's, and a
        // window that ends at the pixel treats it as the image's edge
        // (the last column then differs from a full decode's by up to
        // 9 levels).
        let x1 = (x1 + 1).next_multiple_of(mcu).min(sw);
        [x0, y0, x1, y1]
    }

    /// The scale (eighths), whether windowed, and the bytes the decode
    /// and the steps after it hold, chosen to fit `budget`: the decode
    /// `want` asks for when it fits, else (where `want.shrink` allows) a
    /// windowed one, then smaller eighths down to the output's size;
    /// refused with the numbers when none fits.
    fn plan(&self, color: Color, want: &Want, budget: &Budget) -> Result<Plan, String> {
        let (w, h) = (self.s.cinfo.image_width, self.s.cinfo.image_height);
        let cmyk = matches!(self.s.cinfo.jpeg_color_space, JCS_CMYK | JCS_YCCK);
        let usual = self.usual_sampling();
        let coef = self.coefficient_bytes();
        let components = u64::try_from(self.s.cinfo.num_components.max(1)).unwrap_or(4);
        let least = least_eighth(want.need);
        let mut tries = vec![match want.reduce {
            true => (least, usual),
            false => (8, false),
        }];
        if want.shrink && !want.reduce {
            tries.push((8, usual));
            tries.extend((least..8).rev().map(|n| (n, usual)));
        }
        let cost = |&(num, windowed): &(u32, bool)| {
            let scaled = |v: u32| (u64::from(v) * u64::from(num)).div_ceil(8) as u32;
            let (sw, sh) = (scaled(w), scaled(h));
            let [x0, y0, x1, y1] = self.window(want, num, windowed, (sw, sh));
            let (cw, ch) = (u64::from(x1 - x0), u64::from(y1 - y0));
            // libjpeg's own: the coefficients, its pools, and its row
            // buffers (the main controller's and the upsampler's, a few
            // iMCU rows of every component: 64 rows is a bound).
            let library = coef + DECODER_STATE + u64::from(sw) * 64 * components;
            let pixels = match cmyk {
                // The CMYK rows, then their RGB (and gray) conversion.
                true => cw * ch * 8,
                false => cw * ch * color.channels() as u64,
            };
            let after = after_decode_bytes(cw, ch, color.channels() as u64, want, num == 8);
            (library, library + pixels + after)
        };
        let Some(at) = tries.iter().position(|t| budget.fits(cost(t).1)) else {
            budget.note_refused();
            let least = tries.last().map_or(0, |t| cost(t).1);
            let what = match coef > 0 {
                true => format!(
                    " (a file of several scans keeps every coefficient, {} MiB, whatever \
                     the scale)",
                    coef.div_ceil(1 << 20)
                ),
                false => String::new(),
            };
            return Err(format!(
                "JPEG: image of {w}x{h} pixels: {}{what}",
                budget.over(least)
            ));
        };
        if at > 0 {
            budget.note_reduced();
        }
        let (library, bytes) = cost(&tries[at]);
        Ok(Plan {
            num: tries[at].0,
            windowed: tries[at].1,
            library,
            bytes,
        })
    }

    fn decode<'b>(
        mut self,
        color: Color,
        want: Want,
        budget: &'b Budget,
    ) -> Result<(Pixels, Reservation<'b>), String> {
        let plan = self.plan(color, &want, budget)?;
        let held = budget.reserve(plan.bytes)?;
        let (num, windowed) = (plan.num, plan.windowed);
        let cmyk = matches!(self.s.cinfo.jpeg_color_space, JCS_CMYK | JCS_YCCK);
        let cinfo = &mut self.s.cinfo;
        cinfo.out_color_space = match (cmyk, color) {
            (true, _) => JCS_CMYK,
            (false, Color::Rgb) => JCS_EXT_RGB,
            (false, Color::Gray) => JCS_GRAYSCALE,
        };
        cinfo.scale_num = num;
        cinfo.scale_denom = 8;
        // TurboJPEG's defaults (and libjpeg's): the accurate integer IDCT,
        // smooth chroma upsampling.
        cinfo.dct_method = lj::J_DCT_METHOD::JDCT_ISLOW;
        cinfo.do_fancy_upsampling = 1;
        // libjpeg's share of the reservation (TurboJPEG's
        // TJPARAM_MAXMEMORY, done the same way): coefficient buffers past
        // it would need a backing store, which this build has not, so
        // libjpeg fails ("Backing store not supported") instead of
        // allocating them.
        // SAFETY: `mem` is the memory manager jpeg_create_decompress made.
        unsafe {
            (*cinfo.common.mem).max_memory_to_use =
                std::ffi::c_long::try_from(plan.library).unwrap_or(std::ffi::c_long::MAX)
        };
        // SAFETY: the header was read and the parameters are set.
        unsafe { lj::jpeg_start_decompress(cinfo) };
        let (sw, sh) = (cinfo.output_width, cinfo.output_height);
        let s = f64::from(num) / 8.0;
        let [x0, y0, x1, y1] = self.window(&want, num, windowed, (sw, sh));
        let cinfo = &mut self.s.cinfo;
        let (mut cx, mut cw) = (x0, x1 - x0);
        if cw != sw {
            // SAFETY: decompression started, no row read yet; the window
            // lies inside the scaled image. libjpeg may move its left edge
            // to an iMCU column (it is on one) and says where it put it.
            unsafe { lj::jpeg_crop_scanline(cinfo, &mut cx, &mut cw) };
        }
        let channels = usize::try_from(cinfo.output_components).unwrap_or(0);
        let expected = match (cmyk, color) {
            (true, _) => 4,
            (false, Color::Rgb) => 3,
            (false, Color::Gray) => 1,
        };
        if channels != expected || cinfo.output_width != cw {
            return Err(format!(
                "JPEG: libjpeg gives {channels} channels of {} pixels for {expected} of {cw}",
                cinfo.output_width
            ));
        }
        let wh = y1 - y0;
        let pitch = cw as usize * channels;
        let mut buf = vec![0u8; pitch * wh as usize];
        let mut rows: Vec<*mut u8> = buf
            .chunks_exact_mut(pitch)
            .map(|r| r.as_mut_ptr())
            .collect();
        if y0 > 0 {
            // SAFETY: decompression started; y0 < the scaled height.
            let skipped = unsafe { lj::jpeg_skip_scanlines(cinfo, y0) };
            if skipped != y0 {
                return Err(format!("JPEG: skipped {skipped} of the first {y0} rows"));
            }
        }
        while cinfo.output_scanline < y1 {
            let at = (cinfo.output_scanline - y0) as usize;
            // SAFETY: rows[at..] are pointers to rows of `pitch` bytes, the
            // cropped width times the output's channels (checked above),
            // and at most y1 - output_scanline of them are asked for.
            let n = unsafe {
                lj::jpeg_read_scanlines(cinfo, rows[at..].as_mut_ptr(), y1 - cinfo.output_scanline)
            };
            if n == 0 {
                // Only a suspending source returns no row; a memory one
                // never suspends. Not looping forever all the same.
                return Err("JPEG: no rows decoded".into());
            }
        }
        if y1 < sh {
            // SAFETY: as above. Skipping to the last row reads nothing
            // more (libjpeg marks the input ended), as in TurboJPEG: a
            // file cut short below the window gives the window's pixels,
            // which are whole.
            unsafe { lj::jpeg_skip_scanlines(cinfo, sh - y1) };
        }
        // SAFETY: every row was read or skipped.
        unsafe { lj::jpeg_finish_decompress(cinfo) };
        if let Some(why) = self.s.err.truncated.take() {
            return Err(format!("JPEG: {why}"));
        }
        let (buf, channels) = match (cmyk, color) {
            (false, _) => (buf, channels),
            (true, Color::Rgb) => (cmyk_to_rgb(&buf), 3),
            (true, Color::Gray) => (rgb_to_gray(&cmyk_to_rgb(&buf)), 1),
        };
        Ok((
            Pixels {
                buf,
                w: cw,
                h: wh,
                channels,
                origin: (f64::from(cx) / s, f64::from(y0) / s),
                scale: s,
            },
            held,
        ))
    }
}

/// What a decode will be: its scale in eighths, whether windowed, and
/// the bytes libjpeg and the whole decode may hold.
struct Plan {
    num: u32,
    windowed: bool,
    library: u64,
    bytes: u64,
}

/// A JPEG's width and height, read from its header.
pub(super) fn size(data: &[u8]) -> Result<(u32, u32), String> {
    guarded(|| Decompressor::open(data).map(|(_, w, h)| (w, h)))
}

/// Decodes `want` of the JPEG in `data` to `color` within `budget`.
pub(super) fn decode<'b>(
    data: &[u8],
    color: Color,
    want: Want,
    budget: &'b Budget,
) -> Result<(Pixels, Reservation<'b>), String> {
    say_without_simd();
    guarded(|| Decompressor::open(data).and_then(|(d, _, _)| d.decode(color, want, budget)))
        .map_err(|e| match e.contains("Backing store") {
            true => format!(
                "{e}: its coefficient buffers need more than its share of the decode memory \
                 budget (`decode_memory`)"
            ),
            false => e,
        })
}

/// Without SIMD on x86 (no `nasm` when the library was built), decoding
/// is slower than it should be: said once per process, at the first JPEG
/// decoded while someone listens.
fn say_without_simd() {
    static SAID: AtomicBool = AtomicBool::new(false);
    if SIMD || !cfg!(any(target_arch = "x86_64", target_arch = "x86")) {
        return;
    }
    // Relaxed: a flag that only saves the log's lookup; two threads that
    // both pass it are sorted out by `log::once`.
    if SAID.load(Ordering::Relaxed) || !crate::log::enabled(Level::Warn) {
        return;
    }
    SAID.store(true, Ordering::Relaxed);
    crate::log::once("jpeg-no-simd", Level::Warn, || {
        "JPEG decoding without SIMD: this build of the library found no nasm \
         (libjpeg-turbo's x86 SIMD code is assembled with it), so a whole JPEG \
         decodes about 1.6x slower; install nasm and rebuild"
            .into()
    });
}
