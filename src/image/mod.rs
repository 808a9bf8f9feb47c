//! The image pipeline: a sample's image bytes to one output image of fixed
//! size (decode, crop, resize, flip, layout, type), and a label field to a
//! number, with no Python on the way.
//!
//! - `spec`: the pipeline declared as configuration (the `transform`
//!   JSON), parsed and checked, each error naming the field and option;
//! - `draw`: a sample's random choices, keyed by seed, epoch, position
//!   and field, and the crop boxes they give (torchvision's rules);
//! - `decode`: image bytes to 8-bit RGB or gray: PNG through
//!   `png_decode` (row by row, keeping the crop's window), and JPEG
//!   through `jpeg` (libjpeg-turbo's libjpeg API, reduced and windowed to
//!   the crop, its scans and memory limited);
//! - `budget`: the decode memory a loader's decodes share, which each
//!   decode reserves before it sizes a buffer (reduced or refused when
//!   over it);
//! - `output`: the resize, the flip, the write in the output's layout
//!   and type.
//!
//! `apply` runs them for one field of one sample into the caller's memory
//! (a slot of a batch's tensor); `label` reads a label field.

pub mod budget;
pub mod decode;
pub mod draw;
mod jpeg;
pub mod output;
mod pixels;
mod png_decode;
pub mod spec;

pub use spec::{
    Color, Crop, Dtype, ImageSpec, LabelSpec, LabelType, Layout, OnError, Size, Transform,
};

use std::sync::Arc;

use fast_image_resize::Resizer;

use budget::Budget;

use crate::error::{Error, Fault, Result};

/// What `apply` did to one image, for tests and logs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Applied {
    pub format: decode::ImageKind,
    /// The source image's width and height.
    pub source: (u32, u32),
    pub plan: draw::Plan,
    /// Source pixels per decoded pixel's inverse: 1 for a full-size
    /// decode, 1/8 to 7/8 for a reduced one.
    pub scale: f64,
}

/// A worker's reusable state for `apply` (the resizer's scratch buffers)
/// and the decode memory budget it shares with the loader's other
/// workers.
#[derive(Default)]
pub struct Scratch {
    resizer: Resizer,
    budget: Arc<Budget>,
}

impl Scratch {
    /// A worker's state drawing on `budget`.
    pub fn with_budget(budget: Arc<Budget>) -> Scratch {
        Scratch {
            resizer: Resizer::default(),
            budget,
        }
    }

    /// The budget this worker's decodes draw on.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }
}

/// Transforms the image `data` of field `spec.field` of the sample at
/// `position` of `epoch` into `out` (exactly `spec.out_bytes()` long).
pub fn apply(
    spec: &ImageSpec,
    data: &[u8],
    seed: u64,
    epoch: u64,
    position: u64,
    scratch: &mut Scratch,
    out: &mut [u8],
) -> Result<Applied> {
    let fail = |reason: String| Error::Image {
        field: spec.field.clone(),
        reason,
    };
    if out.len() != spec.out_bytes() {
        return Err(Error::internal(
            Fault::Invariant,
            format!(
                "image output of {} bytes for a {} byte image",
                out.len(),
                spec.out_bytes()
            ),
        ));
    }
    let Some(kind) = decode::ImageKind::sniff(data) else {
        let head: Vec<String> = data.iter().take(8).map(|b| format!("{b:02x}")).collect();
        return Err(fail(format!(
            "not a JPEG or PNG image ({} bytes, starting {})",
            data.len(),
            head.join(" ")
        )));
    };
    let (w, h) = decode::size(kind, data).map_err(fail)?;
    let mut draws = draw::Draws::new(seed, epoch, position, &spec.field);
    let plan = draw::plan(&spec.crop, spec.flip, &mut draws, w, h);
    let r = plan.region;
    // The filter of a resize that came before the crop reads past the
    // box's edges by its support (one output pixel, in source pixels);
    // a crop taken first reads nothing outside it.
    let (mx, my) = match plan.crop_first {
        true => (0.0, 0.0),
        false => (
            (r.w / f64::from(plan.out.w)).max(1.0) + 1.0,
            (r.h / f64::from(plan.out.h)).max(1.0) + 1.0,
        ),
    };
    let want = decode::Want {
        x0: r.left - mx,
        y0: r.top - my,
        x1: r.left + r.w + mx,
        y1: r.top + r.h + my,
        need: (f64::from(plan.out.w) / r.w, f64::from(plan.out.h) / r.h),
        reduce: spec.reduce && plan.crop_first,
        shrink: spec.reduce,
        out: (plan.out.w, plan.out.h),
        copies: plan.crop_first,
    };
    // Held until the output is written: the pixels and the resize's
    // scratch are what it counts.
    let (px, _held) =
        decode::decode(kind, data, spec.color, want, &scratch.budget).map_err(fail)?;
    output::write(&px, &plan, spec, &mut scratch.resizer, out).map_err(fail)?;
    Ok(Applied {
        format: kind,
        source: (w, h),
        plan,
        scale: px.scale,
    })
}

/// A label field's number: the field's text (`.cls`: `"7\n"`), or, with
/// `spec.key`, that key of the field's JSON object.
pub fn label(spec: &LabelSpec, data: &[u8]) -> Result<f64> {
    let fail = |reason: String| Error::Image {
        field: spec.field.clone(),
        reason,
    };
    let text =
        std::str::from_utf8(data).map_err(|_| fail("a label that is not UTF-8 text".into()))?;
    let v = match &spec.key {
        None => text
            .trim()
            .parse::<f64>()
            .map_err(|_| fail(format!("not a number: {:?}", truncated(text))))?,
        Some(k) => {
            let j: serde_json::Value =
                serde_json::from_str(text).map_err(|e| fail(format!("not JSON: {e}")))?;
            j.get(k)
                .and_then(serde_json::Value::as_f64)
                .ok_or_else(|| fail(format!("no number at key `{k}`")))?
        }
    };
    let whole = matches!(spec.ty, LabelType::I64 | LabelType::I32);
    let range = match spec.ty {
        LabelType::I32 => f64::from(i32::MIN)..=f64::from(i32::MAX),
        _ => f64::MIN..=f64::MAX,
    };
    if !v.is_finite() || (whole && v.fract() != 0.0) || !range.contains(&v) {
        return Err(fail(format!("{v} is not a {:?} label", spec.ty)));
    }
    Ok(v)
}

fn truncated(s: &str) -> &str {
    match s.char_indices().nth(32) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests;
