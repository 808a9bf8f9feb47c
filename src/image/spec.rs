//! The image pipeline declared as configuration: what a field's bytes
//! become (decode, crop, resize, flip, layout, type, normalization) and
//! what a label field becomes, parsed from JSON into plain values (pure).
//!
//! ```json
//! {"jpg": {"decode": "rgb",
//!          "random_resized_crop": {"size": 224, "scale": [0.08, 1.0]},
//!          "flip": 0.5, "dtype": "float16",
//!          "normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}},
//!  "cls": "int64"}
//! ```
//!
//! The names follow torchvision's transforms (`RandomResizedCrop`,
//! `Resize`, `CenterCrop`, `RandomHorizontalFlip`, `ToDtype` with
//! `scale=True`, `Normalize`) and mean what they mean there, so a pipeline
//! ports by name. An image's output size is fixed by its spec (a batch is
//! one tensor): a random-resized crop, a center crop, or a resize to both
//! sides. Every error names the field and the option.

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Output height and width, in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub h: u32,
    pub w: u32,
}

/// The colour an image is decoded to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Color {
    /// Three channels, R G B (grayscale images are spread to three, alpha
    /// dropped, CMYK converted, as Pillow's `convert("RGB")`).
    Rgb,
    /// One channel, luma (as Pillow's `convert("L")`).
    Gray,
}

impl Color {
    pub fn channels(self) -> usize {
        match self {
            Color::Rgb => 3,
            Color::Gray => 1,
        }
    }
}

/// Where the crop comes from, before the resize to the output size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Crop {
    /// torchvision's `RandomResizedCrop(size, scale, ratio)`: a box of a
    /// random share of the area (`scale`) and aspect ratio (`ratio`,
    /// drawn log-uniform), resized to `size`.
    RandomResized {
        size: Size,
        scale: [f64; 2],
        ratio: [f64; 2],
    },
    /// `Resize(resize)` (when given) then `CenterCrop(size)`.
    Center { resize: Option<Resize>, size: Size },
    /// `Resize((h, w))`: the whole image to both sides.
    Whole { size: Size },
}

/// torchvision's `Resize`: an int is the shorter side (aspect kept), a
/// pair is both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resize {
    Shorter(u32),
    Exact(Size),
}

/// Element type of the output tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    U8,
    F16,
    F32,
}

impl Dtype {
    pub fn bytes(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::F16 => 2,
            Dtype::F32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::U8 => "uint8",
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
        }
    }
}

/// Axis order of one image in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// channels, height, width (torch's).
    Chw,
    /// height, width, channels (numpy's, PIL's).
    Hwc,
}

/// What an image field becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageSpec {
    pub field: String,
    pub color: Color,
    pub crop: Crop,
    /// Chance of a horizontal flip (`RandomHorizontalFlip(p)`).
    pub flip: f64,
    pub dtype: Dtype,
    pub layout: Layout,
    /// Per-channel mean and std of `Normalize`, applied to values scaled
    /// to [0, 1]; float dtypes only.
    pub normalize: Option<(Vec<f32>, Vec<f32>)>,
    /// Decode at a reduced size in the DCT domain where the output is
    /// smaller than the crop (JPEG), and decode only the rows and blocks a
    /// crop covers. On by default; off gives the pixels of a full decode
    /// cropped and resized, as Pillow and torchvision compute them.
    pub reduce: bool,
}

impl ImageSpec {
    pub fn size(&self) -> Size {
        match self.crop {
            Crop::RandomResized { size, .. } | Crop::Center { size, .. } | Crop::Whole { size } => {
                size
            }
        }
    }

    /// Bytes of one output image.
    pub fn out_bytes(&self) -> usize {
        let s = self.size();
        s.h as usize * s.w as usize * self.color.channels() * self.dtype.bytes()
    }

    /// The output shape of one image, in its layout's order.
    pub fn shape(&self) -> [usize; 3] {
        let s = self.size();
        let c = self.color.channels();
        match self.layout {
            Layout::Chw => [c, s.h as usize, s.w as usize],
            Layout::Hwc => [s.h as usize, s.w as usize, c],
        }
    }
}

/// Element type of a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelType {
    I64,
    I32,
    F32,
}

/// What a label field becomes: one number per sample, parsed from the
/// field's text (`.cls`: `"7"`), or taken from a JSON field of it.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelSpec {
    pub field: String,
    pub ty: LabelType,
    /// For a JSON field: the key whose number is the label.
    pub key: Option<String>,
}

/// A whole transform: the image fields and the label fields, in the order
/// the spec names them.
#[derive(Debug, Clone, PartialEq)]
pub struct Transform {
    pub images: Vec<ImageSpec>,
    pub labels: Vec<LabelSpec>,
}

/// What a sample whose image or label cannot be made does to its batch
/// (the `image_errors` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// The loader fails, naming the field, the sample and its shard.
    Fail,
    /// The sample is left out of its batch, counted (`images_skipped`)
    /// and logged with its shard, key and field.
    Skip,
}

/// torchvision's defaults for `RandomResizedCrop`.
const DEFAULT_SCALE: [f64; 2] = [0.08, 1.0];
const DEFAULT_RATIO: [f64; 2] = [3.0 / 4.0, 4.0 / 3.0];

/// The largest side accepted for an output image: past it a batch of 128
/// would be tens of GB, which is a mistake in the spec, not a plan.
const MAX_SIDE: u64 = 16384;

impl Transform {
    /// Parses a transform from its JSON text.
    pub fn parse(text: &str) -> Result<Transform> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::Config(format!("`transform`: not JSON: {e}")))?;
        Transform::from_value(&v)
    }

    /// Parses a transform from a JSON value (an object of field → spec).
    pub fn from_value(v: &Value) -> Result<Transform> {
        let Some(fields) = v.as_object() else {
            return Err(Error::Config(
                "`transform`: expected an object of field name -> spec".into(),
            ));
        };
        let mut images = Vec::new();
        let mut labels = Vec::new();
        for (field, spec) in fields {
            if field.is_empty() {
                return Err(Error::Config("`transform`: an empty field name".into()));
            }
            match spec {
                Value::String(_) => labels.push(label(field, spec)?),
                Value::Object(o) if o.contains_key("label") => labels.push(label(field, spec)?),
                Value::Object(o) => images.push(image(field, o)?),
                other => {
                    return Err(bad(
                        field,
                        "",
                        &format!("expected an object or a label type, got {other}"),
                    ));
                }
            }
        }
        if images.is_empty() && labels.is_empty() {
            return Err(Error::Config("`transform`: names no field".into()));
        }
        Ok(Transform { images, labels })
    }
}

fn bad(field: &str, option: &str, why: &str) -> Error {
    match option {
        "" => Error::Config(format!("`transform` field `{field}`: {why}")),
        o => Error::Config(format!("`transform` field `{field}` option `{o}`: {why}")),
    }
}

const IMAGE_OPTIONS: &[&str] = &[
    "decode",
    "random_resized_crop",
    "center_crop",
    "resize",
    "flip",
    "dtype",
    "layout",
    "normalize",
    "reduce",
];

fn image(field: &str, o: &Map<String, Value>) -> Result<ImageSpec> {
    for k in o.keys() {
        if !IMAGE_OPTIONS.contains(&k.as_str()) {
            return Err(bad(
                field,
                k,
                &format!("unknown option (known: {})", IMAGE_OPTIONS.join(", ")),
            ));
        }
    }
    let color = match o.get("decode") {
        None => Color::Rgb,
        Some(Value::String(s)) if s == "rgb" => Color::Rgb,
        Some(Value::String(s)) if s == "gray" || s == "l" => Color::Gray,
        Some(v) => {
            return Err(bad(
                field,
                "decode",
                &format!("expected \"rgb\" or \"gray\", got {v}"),
            ));
        }
    };
    let resize = o.get("resize").map(|v| resize_of(field, v)).transpose()?;
    let center = o
        .get("center_crop")
        .map(|v| size_of(field, "center_crop", v))
        .transpose()?;
    let crop = match (o.get("random_resized_crop"), center, resize) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err(bad(
                field,
                "random_resized_crop",
                "cannot be combined with `center_crop` or `resize` (it crops and resizes itself)",
            ));
        }
        (Some(v), None, None) => random_resized(field, v)?,
        (None, Some(size), resize) => Crop::Center { resize, size },
        (None, None, Some(Resize::Exact(size))) => Crop::Whole { size },
        (None, None, Some(Resize::Shorter(_))) => {
            return Err(bad(
                field,
                "resize",
                "a single size keeps the aspect ratio, so images would differ in size: give \
                 `center_crop` too, or `resize` as [height, width]",
            ));
        }
        (None, None, None) => {
            return Err(bad(
                field,
                "",
                "no output size: give `random_resized_crop`, `center_crop` or `resize` as [height, width] \
                 (a batch is one tensor of images of one size)",
            ));
        }
    };
    let flip = match o.get("flip") {
        None => 0.0,
        Some(Value::Bool(b)) => f64::from(u8::from(*b)) * 0.5,
        Some(v) => match v.as_f64() {
            Some(p) if (0.0..=1.0).contains(&p) => p,
            _ => {
                return Err(bad(
                    field,
                    "flip",
                    &format!("expected a chance in [0, 1], got {v}"),
                ));
            }
        },
    };
    let normalize = o
        .get("normalize")
        .map(|v| normalize_of(field, v, color))
        .transpose()?;
    let dtype = match o.get("dtype") {
        None if normalize.is_some() => Dtype::F32,
        None => Dtype::U8,
        Some(Value::String(s)) => match s.as_str() {
            "uint8" => Dtype::U8,
            "float16" => Dtype::F16,
            "float32" => Dtype::F32,
            _ => {
                return Err(bad(
                    field,
                    "dtype",
                    &format!("expected uint8, float16 or float32, got \"{s}\""),
                ));
            }
        },
        Some(v) => return Err(bad(field, "dtype", &format!("expected a string, got {v}"))),
    };
    if normalize.is_some() && dtype == Dtype::U8 {
        return Err(bad(
            field,
            "normalize",
            "needs a float dtype (float16 or float32)",
        ));
    }
    let layout = match o.get("layout") {
        None => Layout::Chw,
        Some(Value::String(s)) if s == "chw" => Layout::Chw,
        Some(Value::String(s)) if s == "hwc" => Layout::Hwc,
        Some(v) => {
            return Err(bad(
                field,
                "layout",
                &format!("expected \"chw\" or \"hwc\", got {v}"),
            ));
        }
    };
    let reduce = match o.get("reduce") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(bad(
                field,
                "reduce",
                &format!("expected true or false, got {v}"),
            ));
        }
    };
    Ok(ImageSpec {
        field: field.to_string(),
        color,
        crop,
        flip,
        dtype,
        layout,
        normalize,
        reduce,
    })
}

fn side(field: &str, option: &str, v: &Value) -> Result<u32> {
    match v.as_u64() {
        Some(n) if (1..=MAX_SIDE).contains(&n) => Ok(n as u32),
        _ => Err(bad(
            field,
            option,
            &format!("a side must be a whole number of pixels from 1 to {MAX_SIDE}, got {v}"),
        )),
    }
}

/// An int (square) or [height, width].
fn size_of(field: &str, option: &str, v: &Value) -> Result<Size> {
    match v {
        Value::Array(a) if a.len() == 2 => Ok(Size {
            h: side(field, option, &a[0])?,
            w: side(field, option, &a[1])?,
        }),
        Value::Array(_) => Err(bad(field, option, "expected a size or [height, width]")),
        v => {
            let s = side(field, option, v)?;
            Ok(Size { h: s, w: s })
        }
    }
}

fn resize_of(field: &str, v: &Value) -> Result<Resize> {
    match v {
        Value::Array(_) => Ok(Resize::Exact(size_of(field, "resize", v)?)),
        v => Ok(Resize::Shorter(side(field, "resize", v)?)),
    }
}

fn pair(field: &str, option: &str, v: Option<&Value>, default: [f64; 2]) -> Result<[f64; 2]> {
    let Some(v) = v else {
        return Ok(default);
    };
    let a = v.as_array().filter(|a| a.len() == 2);
    let p = a.and_then(|a| Some([a[0].as_f64()?, a[1].as_f64()?]));
    match p {
        Some([lo, hi]) if lo > 0.0 && lo <= hi && hi.is_finite() => Ok([lo, hi]),
        _ => Err(bad(
            field,
            option,
            &format!("expected [low, high] with 0 < low <= high, got {v}"),
        )),
    }
}

fn random_resized(field: &str, v: &Value) -> Result<Crop> {
    let (size, scale, ratio) = match v {
        Value::Object(o) => {
            for k in o.keys() {
                if !["size", "scale", "ratio"].contains(&k.as_str()) {
                    return Err(bad(
                        field,
                        "random_resized_crop",
                        &format!("unknown key `{k}` (known: size, scale, ratio)"),
                    ));
                }
            }
            let Some(size) = o.get("size") else {
                return Err(bad(field, "random_resized_crop", "needs `size`"));
            };
            (
                size_of(field, "random_resized_crop.size", size)?,
                pair(
                    field,
                    "random_resized_crop.scale",
                    o.get("scale"),
                    DEFAULT_SCALE,
                )?,
                pair(
                    field,
                    "random_resized_crop.ratio",
                    o.get("ratio"),
                    DEFAULT_RATIO,
                )?,
            )
        }
        v => (
            size_of(field, "random_resized_crop", v)?,
            DEFAULT_SCALE,
            DEFAULT_RATIO,
        ),
    };
    if scale[1] > 1.0 {
        return Err(bad(
            field,
            "random_resized_crop.scale",
            "a share of the area is at most 1",
        ));
    }
    Ok(Crop::RandomResized { size, scale, ratio })
}

fn floats(field: &str, option: &str, v: Option<&Value>, n: usize) -> Result<Vec<f32>> {
    let Some(a) = v.and_then(Value::as_array) else {
        return Err(bad(
            field,
            option,
            &format!("expected a list of {n} numbers"),
        ));
    };
    let xs: Option<Vec<f32>> = a.iter().map(|x| x.as_f64().map(|f| f as f32)).collect();
    match xs {
        Some(xs) if xs.len() == n && xs.iter().all(|x| x.is_finite()) => Ok(xs),
        _ => Err(bad(
            field,
            option,
            &format!(
                "expected a list of {n} finite numbers, got {}",
                Value::Array(a.clone())
            ),
        )),
    }
}

fn normalize_of(field: &str, v: &Value, color: Color) -> Result<(Vec<f32>, Vec<f32>)> {
    let Some(o) = v.as_object() else {
        return Err(bad(
            field,
            "normalize",
            "expected {\"mean\": [...], \"std\": [...]}",
        ));
    };
    let n = color.channels();
    let mean = floats(field, "normalize.mean", o.get("mean"), n)?;
    let std = floats(field, "normalize.std", o.get("std"), n)?;
    if std.iter().any(|s| *s <= 0.0) {
        return Err(bad(field, "normalize.std", "every std must be above 0"));
    }
    Ok((mean, std))
}

fn label(field: &str, v: &Value) -> Result<LabelSpec> {
    let ty_of = |s: &str| match s {
        "int64" => Ok(LabelType::I64),
        "int32" => Ok(LabelType::I32),
        "float32" => Ok(LabelType::F32),
        s => Err(bad(
            field,
            "label",
            &format!("expected int64, int32 or float32, got \"{s}\""),
        )),
    };
    match v {
        Value::String(s) => Ok(LabelSpec {
            field: field.to_string(),
            ty: ty_of(s)?,
            key: None,
        }),
        Value::Object(o) => {
            for k in o.keys() {
                if !["label", "key"].contains(&k.as_str()) {
                    return Err(bad(
                        field,
                        k,
                        "unknown option of a label (known: label, key)",
                    ));
                }
            }
            let ty = match o.get("label") {
                Some(Value::String(s)) => ty_of(s)?,
                v => {
                    return Err(bad(
                        field,
                        "label",
                        &format!("expected a type name, got {v:?}"),
                    ));
                }
            };
            let key = match o.get("key") {
                None => None,
                Some(Value::String(k)) if !k.is_empty() => Some(k.clone()),
                Some(v) => {
                    return Err(bad(
                        field,
                        "key",
                        &format!("expected a JSON key name, got {v}"),
                    ));
                }
            };
            Ok(LabelSpec {
                field: field.to_string(),
                ty,
                key,
            })
        }
        v => Err(bad(
            field,
            "label",
            &format!("expected a type name, got {v}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Transform::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn a_training_spec_parses_with_torchvisions_defaults() {
        let t = Transform::parse(
            r#"{"jpg": {"random_resized_crop": 224, "flip": 0.5, "dtype": "float16",
                 "normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}},
                "cls": "int64"}"#,
        )
        .unwrap();
        let i = &t.images[0];
        assert_eq!(i.field, "jpg");
        assert_eq!(
            i.crop,
            Crop::RandomResized {
                size: Size { h: 224, w: 224 },
                scale: DEFAULT_SCALE,
                ratio: DEFAULT_RATIO
            }
        );
        assert_eq!(
            (i.flip, i.dtype, i.layout, i.color),
            (0.5, Dtype::F16, Layout::Chw, Color::Rgb)
        );
        assert_eq!(i.shape(), [3, 224, 224]);
        assert_eq!(i.out_bytes(), 3 * 224 * 224 * 2);
        assert_eq!(
            t.labels,
            vec![LabelSpec {
                field: "cls".into(),
                ty: LabelType::I64,
                key: None
            }]
        );
    }

    #[test]
    fn a_validation_spec_resizes_then_crops() {
        let t =
            Transform::parse(r#"{"jpg": {"resize": 256, "center_crop": 224, "layout": "hwc"}}"#)
                .unwrap();
        assert_eq!(
            t.images[0].crop,
            Crop::Center {
                resize: Some(Resize::Shorter(256)),
                size: Size { h: 224, w: 224 }
            }
        );
        assert_eq!(t.images[0].shape(), [224, 224, 3]);
        let t = Transform::parse(r#"{"png": {"resize": [32, 48], "decode": "gray"}}"#).unwrap();
        assert_eq!(
            t.images[0].crop,
            Crop::Whole {
                size: Size { h: 32, w: 48 }
            }
        );
        assert_eq!(t.images[0].shape(), [1, 32, 48]);
    }

    #[test]
    fn every_bad_spec_names_its_field_and_option() {
        let cases = [
            ("[1]", "an object of field name"),
            ("{nope", "not JSON"),
            ("{}", "names no field"),
            (r#"{"jpg": {"flip": 0.5}}"#, "field `jpg`: no output size"),
            (
                r#"{"jpg": {"resize": 256}}"#,
                "option `resize`: a single size",
            ),
            (
                r#"{"jpg": {"center_crop": 0}}"#,
                "option `center_crop`: a side",
            ),
            (
                r#"{"jpg": {"center_crop": 99999}}"#,
                "option `center_crop`: a side",
            ),
            (
                r#"{"jpg": {"center_crop": [1, 2, 3]}}"#,
                "option `center_crop`",
            ),
            (r#"{"jpg": {"center_crop": 8, "flip": 2}}"#, "option `flip`"),
            (
                r#"{"jpg": {"center_crop": 8, "dtype": "int8"}}"#,
                "option `dtype`",
            ),
            (
                r#"{"jpg": {"center_crop": 8, "layout": "nchw"}}"#,
                "option `layout`",
            ),
            (
                r#"{"jpg": {"center_crop": 8, "decode": "cmyk"}}"#,
                "option `decode`",
            ),
            (
                r#"{"jpg": {"center_crop": 8, "rotate": 90}}"#,
                "option `rotate`: unknown option",
            ),
            (
                r#"{"jpg": {"center_crop": 8, "normalize": {"mean": [0.5], "std": [0.5]}}}"#,
                "option `normalize.mean`",
            ),
            (
                r#"{"jpg": {"center_crop": 8, "normalize": {"mean": [0,0,0], "std": [1,0,1]}}}"#,
                "option `normalize.std`",
            ),
            (
                r#"{"jpg": {"center_crop": 8, "dtype": "uint8", "normalize": {"mean": [0,0,0], "std": [1,1,1]}}}"#,
                "option `normalize`: needs a float dtype",
            ),
            (
                r#"{"jpg": {"random_resized_crop": {"scale": [0.1, 1]}}}"#,
                "needs `size`",
            ),
            (
                r#"{"jpg": {"random_resized_crop": {"size": 8, "scale": [0.5, 0.1]}}}"#,
                "random_resized_crop.scale",
            ),
            (
                r#"{"jpg": {"random_resized_crop": {"size": 8, "scale": [0.5, 2]}}}"#,
                "at most 1",
            ),
            (
                r#"{"jpg": {"random_resized_crop": {"size": 8, "ratio": [0, 1]}}}"#,
                "random_resized_crop.ratio",
            ),
            (
                r#"{"jpg": {"random_resized_crop": {"size": 8, "zoom": 1}}}"#,
                "unknown key `zoom`",
            ),
            (
                r#"{"jpg": {"random_resized_crop": 8, "center_crop": 8}}"#,
                "cannot be combined",
            ),
            (r#"{"cls": "int128"}"#, "field `cls` option `label`"),
            (r#"{"json": {"label": "int64", "key": 3}}"#, "option `key`"),
            (r#"{"cls": 7}"#, "field `cls`: expected an object"),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text}: {e} (wanted {want})");
            assert!(e.starts_with("configuration: "), "{e}");
        }
    }
}
