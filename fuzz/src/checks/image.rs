//! Image bytes through the pipeline (`image::apply`, `image::label`): what
//! a `transform` meets in a shard. The input is `SPEC DATA`: the first
//! byte picks one of the specs below (JPEG and PNG, reduced and whole
//! decodes, every layout and type), the rest is the image.
//!
//! Asserts: nothing panics; an error is `Error::Image` naming the spec's
//! field; an image that decodes fills exactly the output's bytes, the same
//! ones when decoded again into a buffer of other bytes (none is left
//! unwritten), and a random crop's box lies inside the source; a label is
//! a number or an `Error::Image`.

use ringfeed::Error;
use ringfeed::image::{self, LabelSpec, Scratch, Transform};

const SPECS: [&str; 6] = [
    r#"{"img": {"random_resized_crop": 24, "flip": 0.5}}"#,
    r#"{"img": {"resize": 20, "center_crop": [16, 12], "decode": "gray", "layout": "hwc"}}"#,
    r#"{"img": {"random_resized_crop": {"size": [9, 31], "scale": [0.01, 1.0]}, "reduce": false}}"#,
    r#"{"img": {"resize": [7, 5], "dtype": "float16", "normalize": {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.2]}}}"#,
    r#"{"img": {"center_crop": 64, "dtype": "float32"}}"#,
    r#"{"img": {"random_resized_crop": 3, "decode": "gray", "flip": 1.0}}"#,
];

/// Which of `SPECS` take a random crop (whose box torchvision keeps
/// inside the image; a center crop larger than the image pads instead).
const RANDOM_CROP: [bool; 6] = [true, false, true, false, false, true];

pub fn check(data: &[u8]) {
    let (which, bytes) = data.split_first().unwrap_or((&0, &[]));
    let which = *which as usize % SPECS.len();
    let t = Transform::parse(SPECS[which]).expect("a valid spec");
    let spec = &t.images[0];
    let mut scratch = Scratch::default();
    let mut first = vec![0u8; spec.out_bytes()];
    match image::apply(spec, bytes, 7, 1, 3, &mut scratch, &mut first) {
        Ok(a) => {
            let r = a.plan.region;
            if RANDOM_CROP[which] {
                assert!(
                    r.left >= 0.0
                        && r.top >= 0.0
                        && r.left + r.w <= f64::from(a.source.0) + 1e-6
                        && r.top + r.h <= f64::from(a.source.1) + 1e-6,
                    "{r:?} outside {:?}",
                    a.source
                );
            }
            let mut again = vec![0xa5u8; spec.out_bytes()];
            let b = image::apply(spec, bytes, 7, 1, 3, &mut scratch, &mut again)
                .expect("decodes again");
            assert_eq!(a, b);
            assert!(first == again, "pixels differ between two decodes");
        }
        Err(Error::Image { field, .. }) => assert_eq!(field, "img"),
        Err(e) => panic!("not an image error: {e:?}"),
    }
    for ty in ["int64", "float32"] {
        let l = Transform::parse(&format!(r#"{{"cls": "{ty}"}}"#)).unwrap();
        let spec: &LabelSpec = &l.labels[0];
        match image::label(spec, bytes) {
            Ok(_) => {}
            Err(Error::Image { field, .. }) => assert_eq!(field, "cls"),
            Err(e) => panic!("not an image error: {e:?}"),
        }
    }
}
