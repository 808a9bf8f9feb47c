//! The plan's random numbers: xoshiro256** (Blackman and Vigna) seeded
//! through SplitMix64, our own so that a seed gives the same shard order and
//! shuffle on every build and machine (a crate's stream may change between
//! versions), and the tags that keep the generators of different purposes
//! apart.

/// A 64-bit generator: xoshiro256** (Blackman and Vigna), seeded by SplitMix64.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
    /// The next output, drawn ahead by `peek` (the sequence is unchanged).
    ahead: Option<u64>,
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator for one purpose: `seed` and a path of tags (epoch,
    /// consumer, stream, purpose) give independent streams.
    pub fn new(seed: u64, tags: &[u64]) -> Rng {
        let mut x = seed;
        for &t in tags {
            x = splitmix(&mut x) ^ t;
        }
        let mut s = [0; 4];
        for v in &mut s {
            *v = splitmix(&mut x);
        }
        Rng { s, ahead: None }
    }

    /// The next `next_u64` output, without consuming it.
    pub fn peek(&mut self) -> u64 {
        if let Some(v) = self.ahead {
            return v;
        }
        let v = self.step();
        self.ahead = Some(v);
        v
    }

    pub fn next_u64(&mut self) -> u64 {
        match self.ahead.take() {
            Some(v) => v,
            None => self.step(),
        }
    }

    fn step(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in `0..n` (`n > 0`), without bias (Lemire's method).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

/// Tags that keep the generators of different purposes apart.
pub(super) const TAG_SHARDS: u64 = 1;
pub(super) const TAG_SHUFFLE: u64 = 2;
pub(super) const TAG_RESAMPLE: u64 = 3;
