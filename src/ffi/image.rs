//! The image pipeline on one image: what a `transform` spec makes of one
//! sample's field, for a program that checks its spec, or its pixels
//! against another library's (the loader runs the same code per sample).

use std::ffi::c_char;

use super::boundary::{Fail, boundary, check, invalid, text};
use super::status::{RINGFEED_ERR_BUFFER_TOO_SMALL, RINGFEED_OK};
use crate::image::{self, Scratch, Transform};

/// What `ringfeed_image_transform` did to one image.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ringfeed_image_info {
    /// Bytes of the output image, its shape in its layout's order (C, H,
    /// W or H, W, C) and the bytes of one element (1: uint8, 2: float16,
    /// 4: float32): written also when `out` is too small.
    pub out_bytes: u64,
    pub dim0: u32,
    pub dim1: u32,
    pub dim2: u32,
    pub elem_bytes: u32,
    /// The source image's width and height, in pixels.
    pub source_width: u32,
    pub source_height: u32,
    /// The box of the source that became the output, in source pixels
    /// (fractional where a resize came before a center crop).
    pub crop_top: f64,
    pub crop_left: f64,
    pub crop_height: f64,
    pub crop_width: f64,
    /// 1 when the image was mirrored.
    pub flipped: u32,
    /// The decode's size against the source's: 1, or 1/8 to 7/8 for a
    /// JPEG decoded reduced.
    pub decode_scale: f64,
}

/// Transforms one image, `data` (`len` bytes), as the field `field` of
/// the transform `spec_json` would for the sample at `position` of
/// `epoch` under `seed` (the loader's keys of its random choices), into
/// `out` (`out_len` bytes; its size and shape follow from the spec: see
/// docs/images.md). `info` (NULL, or written) says what was done;
/// its `out_bytes` is written also when `out` is too small
/// (`RINGFEED_ERR_BUFFER_TOO_SMALL`). A spec that is not valid is
/// `RINGFEED_ERR_CONFIG`; an image that cannot be decoded is
/// `RINGFEED_ERR_FORMAT`, the message naming the field.
///
/// # Safety
/// `spec_json` and `field` must be NUL-terminated; `data` readable for
/// `len` bytes (or NULL with `len` 0); `out` writable for `out_len` bytes
/// (or NULL with `out_len` 0); `info` NULL or writable.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ringfeed_image_transform(
    spec_json: *const c_char,
    field: *const c_char,
    data: *const u8,
    len: u64,
    seed: u64,
    epoch: u64,
    position: u64,
    out: *mut u8,
    out_len: u64,
    info: *mut ringfeed_image_info,
) -> i32 {
    boundary(|| {
        if !info.is_null() {
            check(info, "info")?;
        }
        // SAFETY: the caller passes NUL-terminated strings.
        let (spec, name) = unsafe { (text(spec_json, "spec_json")?, text(field, "field")?) };
        let t = Transform::parse(spec)?;
        let Some(spec) = t.images.iter().find(|i| i.field == name) else {
            let names: Vec<&str> = t.images.iter().map(|i| i.field.as_str()).collect();
            return Err(invalid(format!(
                "the transform has no image field `{name}` (its image fields: {})",
                names.join(", ")
            )));
        };
        let need = spec.out_bytes() as u64;
        let [d0, d1, d2] = spec.shape();
        let mut done = ringfeed_image_info {
            out_bytes: need,
            dim0: d0 as u32,
            dim1: d1 as u32,
            dim2: d2 as u32,
            elem_bytes: spec.dtype.bytes() as u32,
            ..Default::default()
        };
        if !info.is_null() {
            // SAFETY: checked above.
            unsafe { info.write(done) };
        }
        if out_len < need {
            return Err(Fail(
                RINGFEED_ERR_BUFFER_TOO_SMALL,
                format!("field `{name}`'s image is {need} bytes, the buffer has {out_len}"),
            ));
        }
        let input: &[u8] = match len {
            0 => &[],
            n => {
                check(data, "data")?;
                let n =
                    usize::try_from(n).map_err(|_| invalid("`len` exceeds the address space"))?;
                // SAFETY: the caller says `data` is readable for `len` bytes.
                unsafe { std::slice::from_raw_parts(data, n) }
            }
        };
        check(out, "out")?;
        // SAFETY: the caller says `out` is writable for `out_len` >= `need`
        // bytes; only the first `need` are written.
        let dst = unsafe { std::slice::from_raw_parts_mut(out, need as usize) };
        let a = image::apply(
            spec,
            input,
            seed,
            epoch,
            position,
            &mut Scratch::default(),
            dst,
        )?;
        done.source_width = a.source.0;
        done.source_height = a.source.1;
        done.crop_top = a.plan.region.top;
        done.crop_left = a.plan.region.left;
        done.crop_height = a.plan.region.h;
        done.crop_width = a.plan.region.w;
        done.flipped = u32::from(a.plan.flip);
        done.decode_scale = a.scale;
        if !info.is_null() {
            // SAFETY: checked above.
            unsafe { info.write(done) };
        }
        Ok(RINGFEED_OK)
    })
}
