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

use super::decode::{Pixels, Want, check_pixels, cmyk_to_rgb, rgb_to_gray};
use super::spec::Color;
use crate::log::Level;

/// Whether libjpeg-turbo was built with its SIMD code (build.rs reads the
/// configuration the `mozjpeg-sys` build exports). Without it (no `nasm`
/// on PATH when an x86 build ran) a whole JPEG decodes 1.6x slower, a
/// random-resized crop to 224 1.07x (docs/decisions.md, "Image decoding").
pub const SIMD: bool = cfg!(ringfeed_jpeg_simd);

/// libjpeg's `JMSG_LENGTH_MAX`: the buffer `format_message` writes its
/// message into (the crate's binding types it as 80 bytes, the C writes
/// up to this many).
const MSG_LEN: usize = 200;

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
        });
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

    fn decode(mut self, color: Color, want: Want) -> Result<Pixels, String> {
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
        let windowed = want.reduce && self.usual_sampling();
        let cmyk = matches!(self.s.cinfo.jpeg_color_space, JCS_CMYK | JCS_YCCK);
        let one_component = self.s.cinfo.num_components == 1;
        let max_h = u32::try_from(self.s.cinfo.max_h_samp_factor.max(1)).unwrap_or(1);
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
        // SAFETY: the header was read and the parameters are set.
        unsafe { lj::jpeg_start_decompress(cinfo) };
        let (sw, sh) = (cinfo.output_width, cinfo.output_height);
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
        let (x0, y0, x1, y1) = if windowed && x1 > x0 && y1 > y0 {
            // libjpeg's iMCU column in scaled pixels (jpeg_crop_scanline's
            // `align`): the scaled block times luma's horizontal factor.
            let mcu = match one_component {
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
            (x0, y0, x1, y1)
        } else {
            (0, 0, sw, sh)
        };
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
        Ok(Pixels {
            buf,
            w: cw,
            h: wh,
            channels,
            origin: (f64::from(cx) / s, f64::from(y0) / s),
            scale: s,
        })
    }
}

/// A JPEG's width and height, read from its header.
pub(super) fn size(data: &[u8]) -> Result<(u32, u32), String> {
    guarded(|| Decompressor::open(data).map(|(_, w, h)| (w, h)))
}

/// Decodes `want` of the JPEG in `data` to `color`.
pub(super) fn decode(data: &[u8], color: Color, want: Want) -> Result<Pixels, String> {
    say_without_simd();
    guarded(|| Decompressor::open(data).and_then(|(d, _, _)| d.decode(color, want)))
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
