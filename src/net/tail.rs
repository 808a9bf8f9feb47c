//! Which ranges are late, pure: the caller supplies the measurements and
//! the clock, and sends the hedges.
//!
//! - [`TailWindow`]: the most recent samples of one quantity (a host's
//!   first-byte latency, its body time per byte), and their quantiles.
//! - [`Tail`]: one host's two windows, and the waits past which a range
//!   still waiting for its head, or whose body has not arrived, is
//!   re-requested on a fresh connection (hedged).
//! - [`HedgeBudget`]: hedges earned as a share of the requests sent (and
//!   one a second), so a slow server is never asked twice for everything.

use std::time::{Duration, Instant};

/// Samples a window keeps: enough that its p95 stands on six samples
/// above it, few enough that it follows a host whose latency changes
/// within a second or two at S3's request rates.
pub const WINDOW: usize = 128;
/// Below this many samples a window's p95 is little more than its maximum
/// (of 20 samples, the p95 is the second largest): the cold waits below
/// apply instead.
pub const MIN_SAMPLES: usize = 20;
/// A range is hedged at its host's p95 first-byte latency, but never
/// sooner than this: 50 ms is over twice S3's median first byte (20 ms,
/// which a fresh connection pays again: a hedge sooner than that cannot
/// come first), and far above the scheduling noise of a loaded machine on
/// loopback, where the p95 is well under a millisecond.
pub const HEAD_FLOOR: Duration = Duration::from_millis(50);
/// Before the window has [`MIN_SAMPLES`]: 1 s, some eight times S3's p99
/// first byte (120 ms), and a tenth of the default stall time-out, so a
/// held request is replaced long before that fires.
pub const COLD_HEAD: Duration = Duration::from_secs(1);
/// A body is hedged when it has taken this many times what its peers' p99
/// rate would take for its bytes: far past the tail, not at it (a body
/// hedge throws the connection away, keeping the bytes it received).
pub const BODY_FACTOR: f64 = 4.0;
/// ... and never sooner than this: a quarter second is some twenty
/// times a 1 MiB range's body on an S3 connection (85–90 MB/s), so only a
/// connection that has all but stopped is hedged.
pub const BODY_FLOOR: Duration = Duration::from_millis(250);
/// Before the body window has [`MIN_SAMPLES`]: 2 s (an 8 MiB range at 4
/// MB/s, a twentieth of an S3 connection's rate), a fifth of the default
/// stall time-out.
pub const COLD_BODY: Duration = Duration::from_secs(2);

/// The most recent [`WINDOW`] samples of a quantity (seconds, or seconds
/// per byte).
#[derive(Debug, Clone, Default)]
pub struct TailWindow {
    samples: Vec<f64>,
    /// Where the next sample goes once the window is full.
    next: usize,
}

impl TailWindow {
    pub fn push(&mut self, v: f64) {
        if !v.is_finite() || v < 0.0 {
            return;
        }
        if self.samples.len() < WINDOW {
            self.samples.push(v);
        } else {
            self.samples[self.next] = v;
            self.next = (self.next + 1) % WINDOW;
        }
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The `q` quantile (0 to 1) of the samples, by the nearest rank; `None`
    /// when there are fewer than [`MIN_SAMPLES`].
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.samples.len() < MIN_SAMPLES {
            return None;
        }
        let mut s = self.samples.clone();
        let rank = ((q.clamp(0.0, 1.0) * s.len() as f64).ceil() as usize).clamp(1, s.len());
        let (_, v, _) = s.select_nth_unstable_by(rank - 1, f64::total_cmp);
        Some(*v)
    }
}

/// One host's recent first-byte latencies and body times.
#[derive(Debug, Clone, Default)]
pub struct Tail {
    /// Request sent → response head, seconds.
    pub head: TailWindow,
    /// Body time per byte of ranges received whole, seconds per byte.
    pub body: TailWindow,
}

impl Tail {
    /// How long a request may wait for its head before it is hedged.
    pub fn head_wait(&self) -> Duration {
        match self.head.quantile(0.95) {
            Some(p95) => Duration::from_secs_f64(p95).max(HEAD_FLOOR),
            None => COLD_HEAD,
        }
    }

    /// How long the body of a range with `bytes` still to come may take
    /// before it is hedged.
    pub fn body_wait(&self, bytes: usize) -> Duration {
        match self.body.quantile(0.99) {
            Some(p99) => Duration::from_secs_f64(BODY_FACTOR * p99 * bytes as f64).max(BODY_FLOOR),
            None => COLD_BODY,
        }
    }
}

/// Hedges may be at most this share of the requests sent (plus the burst):
/// at a p95 trigger about 5 % of requests are late in a steady state, so
/// 10 % covers them, and a server slow for everything gets at most a
/// tenth more requests, not twice as many.
pub const HEDGE_SHARE: f64 = 0.1;
/// Hedges that may go at once before requests have earned them: a few,
/// so one stuck range at start-up is hedged, not a whole slow start.
pub const HEDGE_BURST: f64 = 4.0;

/// Time earns a hedge too, one per this many seconds: a link whose every
/// range waits behind a stalled one sends no requests, and would otherwise
/// never earn the hedge that frees it. One a second is nothing beside S3's
/// request rates.
pub const HEDGE_EVERY: f64 = 1.0;

/// A token budget for hedges: each request sent earns [`HEDGE_SHARE`] of
/// one, and each [`HEDGE_EVERY`] seconds one, up to [`HEDGE_BURST`]; each
/// hedge spends one.
#[derive(Debug, Clone)]
pub struct HedgeBudget {
    tokens: f64,
    /// When time last earned (the last `take`).
    since: Option<Instant>,
}

impl Default for HedgeBudget {
    fn default() -> Self {
        HedgeBudget {
            tokens: 1.0,
            since: None,
        }
    }
}

impl HedgeBudget {
    /// A request (not a hedge) was sent.
    pub fn earn(&mut self) {
        self.tokens = (self.tokens + HEDGE_SHARE).min(HEDGE_BURST);
    }

    /// Takes a hedge's token at `now`, if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        if let Some(at) = self.since {
            let secs = now.saturating_duration_since(at).as_secs_f64();
            self.tokens = (self.tokens + secs / HEDGE_EVERY).min(HEDGE_BURST);
        }
        self.since = Some(now);
        // Ten earnings of 0.1 sum to 0.999...: a token is whole within
        // rounding.
        if self.tokens >= 1.0 - 1e-9 {
            self.tokens = (self.tokens - 1.0).max(0.0);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The quantile is a sample at or above the share `q` of the most
        /// recent `WINDOW` samples, and below the rest.
        #[test]
        fn quantiles_are_of_the_recent_samples(
            xs in proptest::collection::vec(0u32..10_000, 0..400),
            q in 0.01f64..1.0,
        ) {
            let mut w = TailWindow::default();
            for &x in &xs {
                w.push(f64::from(x));
            }
            let recent: Vec<f64> = xs.iter().rev().take(WINDOW).map(|&x| f64::from(x)).collect();
            prop_assert_eq!(w.len(), recent.len());
            match w.quantile(q) {
                None => prop_assert!(recent.len() < MIN_SAMPLES),
                Some(v) => {
                    prop_assert!(recent.contains(&v));
                    let at_or_below = recent.iter().filter(|&&x| x <= v).count() as f64;
                    let below = recent.iter().filter(|&&x| x < v).count() as f64;
                    let n = recent.len() as f64;
                    prop_assert!(at_or_below >= q * n - 1e-9);
                    prop_assert!(below < q * n + 1e-9);
                }
            }
        }

        /// However requests and hedges interleave, hedges never exceed the
        /// burst plus the share of the requests.
        #[test]
        fn hedges_stay_within_their_share(asks in proptest::collection::vec(any::<bool>(), 0..2000)) {
            let mut b = HedgeBudget::default();
            // No time passes: requests alone earn.
            let now = Instant::now();
            let (mut requests, mut hedges) = (0u32, 0u32);
            for hedge in asks {
                if hedge {
                    hedges += u32::from(b.take(now));
                } else {
                    b.earn();
                    requests += 1;
                }
                prop_assert!(f64::from(hedges) <= 1.0 + HEDGE_SHARE * f64::from(requests) + 1e-9);
            }
        }
    }

    #[test]
    fn waits_follow_the_host_with_floors_and_cold_defaults() {
        let mut t = Tail::default();
        assert_eq!(t.head_wait(), COLD_HEAD);
        assert_eq!(t.body_wait(1 << 20), COLD_BODY);
        // Loopback: first bytes of 100 µs, bodies at 1 GB/s.
        for _ in 0..MIN_SAMPLES {
            t.head.push(100e-6);
            t.body.push(1e-9);
        }
        assert_eq!(t.head_wait(), HEAD_FLOOR);
        assert_eq!(t.body_wait(1 << 20), BODY_FLOOR);
        // S3-like: one first byte in twenty of 80 ms, the rest 20 ms; bodies at
        // 90 MB/s, an 8 MiB range.
        let mut t = Tail::default();
        for i in 0..100 {
            t.head.push(if i % 20 == 0 { 0.08 } else { 0.02 });
            t.body.push(1.0 / 90e6);
        }
        // (Five slow ones in a hundred are the tail beyond the p95.)
        assert_eq!(t.head_wait(), HEAD_FLOOR);
        let w = t.body_wait(8 << 20).as_secs_f64();
        assert!(
            (w - BODY_FACTOR * (8 << 20) as f64 / 90e6).abs() < 1e-6,
            "{w}"
        );
        // A slow first byte in every tenth request moves the p95 to it.
        for i in 0..WINDOW {
            t.head.push(if i % 10 == 0 { 0.3 } else { 0.02 });
        }
        assert!((t.head_wait().as_secs_f64() - 0.3).abs() < 1e-9);
    }

    #[test]
    fn the_budget_refills_with_requests() {
        let mut b = HedgeBudget::default();
        let now = Instant::now();
        assert!(b.take(now));
        assert!(!b.take(now));
        for _ in 0..10 {
            b.earn();
        }
        assert!(b.take(now));
        for _ in 0..1000 {
            b.earn();
        }
        let burst = (0..10).filter(|_| b.take(now)).count();
        assert_eq!(burst, HEDGE_BURST as usize);
    }

    #[test]
    fn the_budget_refills_with_time_when_no_request_goes() {
        let mut b = HedgeBudget::default();
        let t0 = Instant::now();
        assert!(b.take(t0));
        assert!(!b.take(t0), "spent, and no time passed");
        let half = t0 + Duration::from_secs_f64(HEDGE_EVERY / 2.0);
        assert!(!b.take(half), "half a token");
        let one = t0 + Duration::from_secs_f64(HEDGE_EVERY);
        assert!(b.take(one), "a token a second");
        // A long quiet earns the burst, not more.
        let later = one + Duration::from_secs(3600);
        let burst = (0..10).filter(|_| b.take(later)).count();
        assert_eq!(burst, HEDGE_BURST as usize);
    }
}
