//! A sample's random choices and the boxes they give (pure).
//!
//! Every choice comes from a counter-based generator keyed by the loader's
//! seed, the epoch, the sample's position in the epoch's order and the
//! field: the same seed gives the same crops and flips on any machine, any
//! number of threads and any split of the work, and a resumed epoch
//! draws for a sample what the uninterrupted one drew. The boxes follow
//! torchvision's `RandomResizedCrop.get_params`, `Resize` and `CenterCrop`
//! to the pixel, so a pipeline moved from torchvision crops the same way
//! (given the same draws).

use super::spec::{Crop, Resize, Size};

/// SplitMix64's finalizer: a bijection of 64 bits with full avalanche,
/// so nearby keys (positions n and n + 1) give unrelated streams.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a of a field name: part of the key, so two image fields of one
/// sample draw independently.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The draws of one field of one sample.
#[derive(Debug, Clone)]
pub struct Draws {
    state: u64,
}

impl Draws {
    pub fn new(seed: u64, epoch: u64, position: u64, field: &str) -> Draws {
        let key = mix(seed ^ 0x5bd1_e995)
            ^ mix(epoch.wrapping_add(0x9e37_79b9_7f4a_7c15))
            ^ mix(position.wrapping_mul(0xd6e8_feb8_6659_fd93) ^ 0x3c6e_f372)
            ^ mix(name_hash(field));
        Draws { state: key }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state)
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform over `0..=max`.
    fn upto(&mut self, max: u32) -> u32 {
        ((self.unit() * (f64::from(max) + 1.0)) as u32).min(max)
    }
}

/// A box in source pixels: `top`, `left`, `h`, `w` (fractional where a
/// resize came first: the box is then in the source's own pixels).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Region {
    pub top: f64,
    pub left: f64,
    pub h: f64,
    pub w: f64,
}

/// What one sample's field becomes: the source box to resize to the
/// output size, whether the resize may read pixels outside the box (a
/// resize of the whole image came first), and the flip.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    pub region: Region,
    /// The box's edges are the image's as torchvision sees them: true for
    /// a crop taken before the resize (`RandomResizedCrop`, whose resize
    /// sees only the crop), false where the whole image was resized first
    /// (`Resize` then `CenterCrop`: the filter near the box's edge reads
    /// the pixels beyond it).
    pub crop_first: bool,
    pub out: Size,
    pub flip: bool,
}

/// torchvision's `RandomResizedCrop.get_params` on an image of `width` ×
/// `height`: up to ten tries of a random area share and log-uniform
/// aspect ratio, then the central crop of the nearest ratio allowed.
pub fn random_resized(
    d: &mut Draws,
    width: u32,
    height: u32,
    scale: [f64; 2],
    ratio: [f64; 2],
) -> (u32, u32, u32, u32) {
    let area = f64::from(width) * f64::from(height);
    let (lr0, lr1) = (ratio[0].ln(), ratio[1].ln());
    for _ in 0..10 {
        let target = area * d.uniform(scale[0], scale[1]);
        let aspect = d.uniform(lr0, lr1).exp();
        // Python's `round`, which torchvision calls: ties to even.
        let w = (target * aspect).sqrt().round_ties_even();
        let h = (target / aspect).sqrt().round_ties_even();
        if w > 0.0 && w <= f64::from(width) && h > 0.0 && h <= f64::from(height) {
            let (w, h) = (w as u32, h as u32);
            let top = d.upto(height - h);
            let left = d.upto(width - w);
            return (top, left, h, w);
        }
    }
    let in_ratio = f64::from(width) / f64::from(height);
    let (w, h) = if in_ratio < ratio[0] {
        (
            width,
            ((f64::from(width) / ratio[0]).round_ties_even() as u32).max(1),
        )
    } else if in_ratio > ratio[1] {
        (
            ((f64::from(height) * ratio[1]).round_ties_even() as u32).max(1),
            height,
        )
    } else {
        (width, height)
    };
    (
        (height - h.min(height)) / 2,
        (width - w.min(width)) / 2,
        h.min(height),
        w.min(width),
    )
}

/// torchvision's `Resize(size)` output size for an image of `width` ×
/// `height` (an int is the shorter side; the longer is truncated, as
/// `_compute_resized_output_size` does).
pub fn resized(width: u32, height: u32, r: Resize) -> Size {
    match r {
        Resize::Exact(s) => s,
        Resize::Shorter(s) => {
            let (short, long) = if width <= height {
                (width, height)
            } else {
                (height, width)
            };
            let new_long =
                ((u64::from(s) * u64::from(long)) / u64::from(short.max(1))).max(1) as u32;
            if width <= height {
                Size { h: new_long, w: s }
            } else {
                Size { h: s, w: new_long }
            }
        }
    }
}

/// The plan for one field of one sample of an image of `width` × `height`.
pub fn plan(crop: &Crop, flip: f64, d: &mut Draws, width: u32, height: u32) -> Plan {
    let (region, crop_first, out) = match *crop {
        Crop::RandomResized { size, scale, ratio } => {
            let (top, left, h, w) = random_resized(d, width, height, scale, ratio);
            let region = Region {
                top: f64::from(top),
                left: f64::from(left),
                h: f64::from(h),
                w: f64::from(w),
            };
            (region, true, size)
        }
        Crop::Center { resize, size } => {
            let mid = resize.map_or(
                Size {
                    h: height,
                    w: width,
                },
                |r| resized(width, height, r),
            );
            // CenterCrop's corner, in the resized image's pixels (its
            // `int(round((h - th) / 2.0))`, negative where it pads).
            let top = ((f64::from(mid.h) - f64::from(size.h)) / 2.0).round_ties_even();
            let left = ((f64::from(mid.w) - f64::from(size.w)) / 2.0).round_ties_even();
            let (sy, sx) = (
                f64::from(height) / f64::from(mid.h),
                f64::from(width) / f64::from(mid.w),
            );
            let region = Region {
                top: top * sy,
                left: left * sx,
                h: f64::from(size.h) * sy,
                w: f64::from(size.w) * sx,
            };
            (region, resize.is_none(), size)
        }
        Crop::Whole { size } => {
            let region = Region {
                top: 0.0,
                left: 0.0,
                h: f64::from(height),
                w: f64::from(width),
            };
            (region, true, size)
        }
    };
    // Drawn last, and always, so a flip's chance never moves the crop.
    let flip = d.unit() < flip;
    Plan {
        region,
        crop_first,
        out,
        flip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_depend_on_every_part_of_the_key_and_on_nothing_else() {
        let a = |s, e, p, f: &str| Draws::new(s, e, p, f).next_u64();
        assert_eq!(a(1, 2, 3, "jpg"), a(1, 2, 3, "jpg"));
        for other in [
            a(2, 2, 3, "jpg"),
            a(1, 3, 3, "jpg"),
            a(1, 2, 4, "jpg"),
            a(1, 2, 3, "png"),
        ] {
            assert_ne!(a(1, 2, 3, "jpg"), other);
        }
        // Uniform enough: the mean of many first draws of neighbouring
        // positions is near a half.
        let mean = (0..10_000)
            .map(|p| Draws::new(0, 0, p, "jpg").unit())
            .sum::<f64>()
            / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }

    #[test]
    fn random_resized_boxes_stay_inside_and_follow_the_scale() {
        for p in 0..2000 {
            let mut d = Draws::new(7, 0, p, "jpg");
            let (w, h) = (300 + (p as u32 % 200), 200 + (p as u32 % 333));
            let (top, left, bh, bw) = random_resized(&mut d, w, h, [0.08, 1.0], [0.75, 4.0 / 3.0]);
            assert!(bh >= 1 && bw >= 1 && top + bh <= h && left + bw <= w, "{p}");
            let share = f64::from(bh * bw) / f64::from(w * h);
            assert!((0.07..=1.0 + 1e-9).contains(&share), "{p}: {share}");
        }
    }

    #[test]
    fn random_resized_falls_back_to_the_central_crop_of_the_nearest_ratio() {
        // A scale no try can meet on a strip 1000 x 10.
        let mut d = Draws::new(0, 0, 0, "jpg");
        let b = random_resized(&mut d, 1000, 10, [0.9, 1.0], [0.75, 4.0 / 3.0]);
        assert_eq!(b, (0, 493, 10, 13));
    }

    #[test]
    fn resize_then_center_crop_matches_torchvision() {
        // Resize(256) of 500 x 375 (w x h) is 341 x 256; CenterCrop(224)
        // starts at (16, 58) there: int(round(32 / 2)), int(round(117 / 2)).
        assert_eq!(
            resized(500, 375, Resize::Shorter(256)),
            Size { h: 256, w: 341 }
        );
        let crop = Crop::Center {
            resize: Some(Resize::Shorter(256)),
            size: Size { h: 224, w: 224 },
        };
        let p = plan(&crop, 0.0, &mut Draws::new(0, 0, 0, "jpg"), 500, 375);
        assert!(!p.crop_first && !p.flip);
        let (sy, sx) = (375.0 / 256.0, 500.0 / 341.0);
        assert!((p.region.top - 16.0 * sy).abs() < 1e-9);
        assert!((p.region.left - 58.0 * sx).abs() < 1e-9);
        assert!((p.region.h - 224.0 * sy).abs() < 1e-9);
    }

    #[test]
    fn flips_come_at_their_chance_and_never_move_the_crop() {
        let crop = Crop::RandomResized {
            size: Size { h: 8, w: 8 },
            scale: [0.08, 1.0],
            ratio: [0.75, 4.0 / 3.0],
        };
        let mut flips = 0;
        for p in 0..4000 {
            let never = plan(&crop, 0.0, &mut Draws::new(1, 1, p, "jpg"), 640, 480);
            let half = plan(&crop, 0.5, &mut Draws::new(1, 1, p, "jpg"), 640, 480);
            assert_eq!(never.region, half.region);
            assert!(!never.flip);
            flips += usize::from(half.flip);
        }
        assert!((1800..2200).contains(&flips), "{flips}");
    }
}
