//! The retry policy of network requests, pure: the caller supplies the
//! clock readings and the randomness, and does the sleeping.
//!
//! - [`RetryPolicy`]: which failures are retried, how long to wait —
//!   exponential backoff with full jitter, as the AWS SDKs do, longer after
//!   throttling — and when to give up. Throttling (503 SlowDown, 429, S3's
//!   throttling codes) is retried until the request has been failing for
//!   the retry deadline, never after a count of attempts: S3 answers
//!   SlowDown while it repartitions a prefix, which takes minutes. Other
//!   retryable failures (resets, time-outs, 5xx) stop at `max_attempts` or
//!   at the deadline, whichever comes first.
//! - [`RateLimiter`]: the request rate of one host, adapted as the SDKs'
//!   adaptive retry mode does: a token bucket, off until the first
//!   throttled answer, whose fill rate is cut by [`BETA`] at each throttled
//!   answer and grows back along a cubic curve (CUBIC, RFC 8312) after
//!   successes — multiplicative decrease, fast increase back to the rate
//!   that was throttled, then slower past it.
//! - [`Backoff`]: the capped exponential schedule of a failing refresh
//!   (credentials).

use std::time::Duration;

use crate::net::http::FailKind;

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts per request, the first included, for failures other than
    /// throttling.
    pub max_attempts: u32,
    /// Backoff of the first retry (before jitter).
    pub base: Duration,
    /// Longest backoff.
    pub cap: Duration,
    /// How long a request may keep failing, from its first failure, before
    /// it fails for good (throttled or not).
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            // The SDKs' standard mode makes 3 attempts; a training job would
            // rather wait out a longer brown-out than die, so 5.
            max_attempts: 5,
            // The SDKs' base delay (100 ms) and cap (20 s).
            base: Duration::from_millis(100),
            cap: Duration::from_secs(20),
            // S3 scales a prefix under load over minutes, answering
            // SlowDown meanwhile; ten minutes outlasts that, and still ends
            // a job whose endpoint never recovers within a bounded time.
            deadline: DEFAULT_DEADLINE,
        }
    }
}

/// The default of `retry_deadline_s`; see [`RetryPolicy::deadline`].
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);

/// What one request's failures have been so far; the shell keeps one per
/// request and records each failure before asking the policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tries {
    /// Failed attempts of every kind (the backoff's exponent, the count an
    /// error reports).
    pub failures: u32,
    /// Failed attempts other than throttling (bounded by `max_attempts`).
    pub faults: u32,
}

impl Tries {
    pub fn record(&mut self, kind: FailKind) {
        self.failures = self.failures.saturating_add(1);
        if kind != FailKind::Throttled {
            self.faults = self.faults.saturating_add(1);
        }
    }
}

/// Why a request fails now instead of being retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// Retrying cannot help (a 4xx, a TLS failure, a protocol violation).
    Final,
    /// `max_attempts` failures other than throttling.
    Attempts,
    /// The request has been failing for the whole deadline.
    Deadline,
}

impl RetryPolicy {
    /// After a failure of `kind`, recorded in `tries`, with the request
    /// failing for `failing_for` since its first failure: the wait before
    /// the next attempt, or why it must fail now. The wait never runs past
    /// the deadline: the last attempt is made at it. `rand` is any random
    /// u64.
    pub fn decide(
        &self,
        tries: &Tries,
        kind: FailKind,
        failing_for: Duration,
        rand: u64,
    ) -> Result<Duration, GiveUp> {
        if !kind.retryable() {
            return Err(GiveUp::Final);
        }
        if kind != FailKind::Throttled && tries.faults >= self.max_attempts {
            return Err(GiveUp::Attempts);
        }
        if failing_for >= self.deadline {
            return Err(GiveUp::Deadline);
        }
        // Throttling asks us to slow down: start four times higher.
        let base = if kind == FailKind::Throttled {
            self.base * 4
        } else {
            self.base
        };
        let exponent = tries.failures.saturating_sub(1).min(16);
        let ceiling = base
            .checked_mul(1u32 << exponent)
            .unwrap_or(self.cap)
            .min(self.cap);
        // Full jitter: uniform in [0, ceiling].
        let nanos = ceiling.as_nanos() as u64;
        let wait = Duration::from_nanos(if nanos == 0 { 0 } else { rand % (nanos + 1) });
        Ok(wait.min(self.deadline - failing_for))
    }
}

/// S3's error codes that mean "slow down", whatever the HTTP status: the
/// list the AWS SDKs treat as throttling (botocore's and smithy-rs's
/// `THROTTLING_ERRORS`).
pub fn is_throttling_code(code: &str) -> bool {
    matches!(
        code,
        "SlowDown"
            | "Throttling"
            | "ThrottlingException"
            | "ThrottledException"
            | "RequestThrottledException"
            | "TooManyRequestsException"
            | "ProvisionedThroughputExceededException"
            | "TransactionInProgressException"
            | "RequestLimitExceeded"
            | "BandwidthLimitExceeded"
            | "LimitExceededException"
            | "RequestThrottled"
            | "PriorRequestNotComplete"
            | "EC2ThrottledException"
    )
}

/// The host part of a URL (`http://host:port/path` → `host:port`,
/// `s3://bucket/key` → `bucket`): what a [`RateLimiter`] is kept per.
pub fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest)
}

/// The factor a throttled answer multiplies the rate by (the SDKs' β).
pub const BETA: f64 = 0.7;
/// CUBIC's scale (the SDKs' C): the rate grows back to the throttled one
/// in `cbrt(w_max (1 - β) / C)` seconds.
const SCALE: f64 = 0.4;
/// The lowest fill rate, requests per second (the SDKs' minimum).
pub const MIN_RATE: f64 = 0.5;
/// The measured rate is updated per half second, smoothed by 0.8 (the
/// SDKs' rate clock).
const MEASURE_BUCKET: f64 = 0.5;
const SMOOTHING: f64 = 0.8;
/// A success may raise the rate to at most twice what was measured (the
/// SDKs' cap): the bucket never runs far ahead of what the host took.
const MAX_OVER_MEASURED: f64 = 2.0;

/// The adaptive request rate of one host. Times are seconds from any
/// fixed origin the caller keeps; they must not go backwards.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    /// Off until the first throttled answer: until then requests go at
    /// once.
    enabled: bool,
    /// Tokens per second.
    fill_rate: f64,
    /// Tokens now (negative: requests admitted ahead, waiting for them).
    tokens: f64,
    last_refill: f64,
    /// The rate at the last cut, and when it was.
    w_max: f64,
    last_cut: f64,
    /// Answers per second, smoothed.
    measured: f64,
    measure_start: f64,
    measure_count: u64,
}

impl Default for RateLimiter {
    fn default() -> Self {
        RateLimiter::new()
    }
}

impl RateLimiter {
    pub fn new() -> RateLimiter {
        RateLimiter {
            enabled: false,
            fill_rate: 0.0,
            tokens: 0.0,
            last_refill: 0.0,
            w_max: 0.0,
            last_cut: f64::NEG_INFINITY,
            measured: 0.0,
            measure_start: 0.0,
            measure_count: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Requests per second the bucket admits (0 while off).
    pub fn rate(&self) -> f64 {
        if self.enabled { self.fill_rate } else { 0.0 }
    }

    /// A bucket holds a second's worth of tokens, at least one (the SDKs'
    /// capacity): a burst after a pause is one second long.
    fn capacity(&self) -> f64 {
        self.fill_rate.max(1.0)
    }

    fn refill(&mut self, now: f64) {
        let dt = (now - self.last_refill).max(0.0);
        self.tokens = (self.tokens + dt * self.fill_rate).min(self.capacity());
        self.last_refill = self.last_refill.max(now);
    }

    /// A request is about to be sent at `now`: takes its token and returns
    /// how long it must wait for it first (zero while the limiter is off).
    pub fn admit(&mut self, now: f64) -> Duration {
        if !self.enabled {
            return Duration::ZERO;
        }
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.fill_rate)
        }
    }

    fn measure(&mut self, now: f64) {
        self.measure_count += 1;
        let bucket = (now / MEASURE_BUCKET).floor() * MEASURE_BUCKET;
        if bucket > self.measure_start {
            let current = self.measure_count as f64 / (bucket - self.measure_start);
            self.measured = current * SMOOTHING + self.measured * (1.0 - SMOOTHING);
            self.measure_count = 0;
            self.measure_start = bucket;
        }
    }

    /// A request sent at `sent` was answered with throttling at `now`:
    /// the rate is cut by [`BETA`] from the rate in use (the measured one,
    /// when the limiter was off). An answer to a request sent before the
    /// last cut does not cut again: the requests in flight when the host
    /// began to throttle were sent at the old rate, and each of their
    /// answers cutting would collapse the rate at once (TCP's one decrease
    /// per window).
    pub fn throttled(&mut self, sent: f64, now: f64) {
        self.measure(now);
        if self.enabled && sent < self.last_cut {
            return;
        }
        let in_use = if self.enabled {
            self.measured.min(self.fill_rate)
        } else {
            self.measured
        };
        self.refill(now);
        self.w_max = in_use.max(MIN_RATE);
        self.last_cut = now;
        self.fill_rate = (in_use * BETA).max(MIN_RATE);
        if !self.enabled {
            // From an empty bucket: the next request waits for its token.
            self.tokens = 0.0;
            self.last_refill = now;
        }
        self.tokens = self.tokens.min(self.capacity());
        self.enabled = true;
    }

    /// A request was answered without throttling at `now`: the rate grows
    /// along the cubic curve from the last cut, to at most twice the
    /// measured rate; it never falls here.
    pub fn succeeded(&mut self, now: f64) {
        self.measure(now);
        if !self.enabled {
            return;
        }
        self.refill(now);
        let k = (self.w_max * (1.0 - BETA) / SCALE).cbrt();
        let dt = now - self.last_cut;
        let cubic = SCALE * (dt - k).powi(3) + self.w_max;
        let grown = cubic.min(MAX_OVER_MEASURED * self.measured);
        if grown > self.fill_rate {
            self.fill_rate = grown;
        }
    }
}

/// A capped exponential backoff: `base`, doubling per failure, at most
/// `cap` (no jitter: one refresher at a time waits on it).
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
}

impl Backoff {
    /// The wait after the `failures`-th failure in a row (1 for the first).
    pub fn after(&self, failures: u32) -> Duration {
        let exponent = failures.saturating_sub(1).min(30);
        self.base
            .checked_mul(1u32 << exponent)
            .unwrap_or(self.cap)
            .min(self.cap)
    }
}

/// A small xorshift generator for jitter, seeded per reader.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    pub fn new(seed: u64) -> Jitter {
        Jitter(seed | 1)
    }
    pub fn draw(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tries(kinds: &[FailKind]) -> Tries {
        let mut t = Tries::default();
        for &k in kinds {
            t.record(k);
        }
        t
    }

    proptest! {
        #[test]
        fn delays_stay_under_the_growing_ceiling_and_inside_the_deadline(
            failures in 1u32..40,
            throttled in any::<bool>(),
            failing_ms in 0u64..700_000,
            rand: u64,
        ) {
            let p = RetryPolicy::default();
            let kind = if throttled { FailKind::Throttled } else { FailKind::Reset };
            let t = tries(&vec![kind; failures as usize]);
            let failing_for = Duration::from_millis(failing_ms);
            match p.decide(&t, kind, failing_for, rand) {
                Err(GiveUp::Attempts) => {
                    prop_assert!(!throttled && failures >= p.max_attempts);
                }
                Err(GiveUp::Deadline) => prop_assert!(failing_for >= p.deadline),
                Err(GiveUp::Final) => prop_assert!(false, "a retryable kind"),
                Ok(d) => {
                    prop_assert!(failing_for < p.deadline);
                    prop_assert!(throttled || failures < p.max_attempts);
                    let base = if throttled { p.base * 4 } else { p.base };
                    let ceiling = base
                        .checked_mul(1 << (failures - 1).min(16))
                        .unwrap_or(p.cap)
                        .min(p.cap);
                    prop_assert!(d <= ceiling);
                    prop_assert!(failing_for + d <= p.deadline);
                }
            }
        }

        /// Throttling alone never runs out of attempts: only the deadline
        /// ends it, however many throttled answers came first.
        #[test]
        fn throttling_ends_only_at_the_deadline(
            failures in 1u32..100_000,
            deadline_s in 1u64..3600,
            failing_ms in 0u64..4_000_000,
            rand: u64,
        ) {
            let p = RetryPolicy { deadline: Duration::from_secs(deadline_s), ..Default::default() };
            let t = Tries { failures, faults: 0 };
            let failing_for = Duration::from_millis(failing_ms);
            let r = p.decide(&t, FailKind::Throttled, failing_for, rand);
            prop_assert_eq!(r.is_err(), failing_for >= p.deadline);
            if let Err(why) = r {
                prop_assert_eq!(why, GiveUp::Deadline);
            }
        }

        /// Whatever answers come when, the fill rate stays between the
        /// floor and what was measured (twice it at most), a throttled
        /// answer to a request sent after the last cut lowers it by β at
        /// least, and a success never lowers it.
        #[test]
        fn the_rate_falls_by_beta_and_never_falls_on_success(
            events in proptest::collection::vec((0u32..400, any::<bool>(), 0u32..2000), 1..300),
        ) {
            let mut r = RateLimiter::new();
            let mut now = 0.0f64;
            for (gap_ms, throttled, age_ms) in events {
                now += f64::from(gap_ms) / 1000.0;
                let before = r.rate();
                let was_enabled = r.enabled();
                let sent = (now - f64::from(age_ms) / 1000.0).max(0.0);
                let cuts = !was_enabled || sent >= r.last_cut;
                if throttled {
                    r.throttled(sent, now);
                    prop_assert!(r.enabled());
                    if cuts {
                        prop_assert!(r.rate() <= (before.max(r.measured) * BETA).max(MIN_RATE) + 1e-9);
                    } else {
                        prop_assert!((r.rate() - before).abs() < 1e-9);
                    }
                } else {
                    r.succeeded(now);
                    prop_assert!(r.rate() >= before - 1e-9);
                    prop_assert_eq!(r.enabled(), was_enabled);
                }
                if r.enabled() {
                    prop_assert!(r.rate() >= MIN_RATE - 1e-9);
                    prop_assert!(r.rate() <= (MAX_OVER_MEASURED * r.measured).max(before).max(MIN_RATE) + 1e-9);
                }
            }
        }

        /// The bucket admits no more than a burst plus the fill rate over
        /// any span: requests asking at any times are sent (asked + wait)
        /// no faster than that.
        #[test]
        fn the_bucket_paces_requests_at_its_rate(
            asks in proptest::collection::vec(0u32..500, 1..200),
        ) {
            let mut r = RateLimiter::new();
            r.throttled(0.0, 0.0);
            let rate = r.rate();
            let mut now = 0.0f64;
            let mut sends = Vec::new();
            for gap_ms in asks {
                now += f64::from(gap_ms) / 1000.0;
                sends.push(now + r.admit(now).as_secs_f64());
            }
            sends.sort_by(f64::total_cmp);
            let first = sends[0];
            for (i, &t) in sends.iter().enumerate() {
                // i + 1 requests sent by t: at most the capacity plus what
                // filled since the bucket started (empty, at 0).
                prop_assert!((i + 1) as f64 <= rate.max(1.0) + rate * t + 1e-6,
                    "{} requests by {t} s at {rate}/s (first at {first})", i + 1);
            }
        }

        #[test]
        fn backoff_doubles_to_its_cap(failures in 1u32..1000) {
            let b = Backoff { base: Duration::from_secs(1), cap: Duration::from_secs(60) };
            let d = b.after(failures);
            prop_assert!(d <= b.cap && d >= b.base);
            prop_assert!(b.after(failures + 1) >= d);
            if failures <= 6 {
                prop_assert_eq!(d, b.base * (1 << (failures - 1)));
            }
        }
    }

    #[test]
    fn client_errors_are_not_retried_and_faults_are_bounded() {
        let p = RetryPolicy::default();
        let zero = Duration::ZERO;
        let one = |k| tries(&[k]);
        assert_eq!(
            p.decide(&one(FailKind::Client), FailKind::Client, zero, 7),
            Err(GiveUp::Final)
        );
        assert!(
            p.decide(&one(FailKind::Dns), FailKind::Dns, zero, 7)
                .is_ok()
        );
        assert_eq!(
            p.decide(&one(FailKind::Tls), FailKind::Tls, zero, 7),
            Err(GiveUp::Final)
        );
        let five = tries(&[FailKind::ServerError; 5]);
        assert_eq!(
            p.decide(&five, FailKind::ServerError, zero, 7),
            Err(GiveUp::Attempts)
        );
        let four = tries(&[FailKind::ServerError; 4]);
        assert!(p.decide(&four, FailKind::ServerError, zero, 7).is_ok());
        // Throttled answers do not use up the attempts of other failures.
        let mut mixed = tries(&[FailKind::Throttled; 50]);
        mixed.record(FailKind::Reset);
        assert!(p.decide(&mixed, FailKind::Reset, zero, 7).is_ok());
        // The deadline ends other failures too.
        assert_eq!(
            p.decide(&one(FailKind::Reset), FailKind::Reset, p.deadline, 7),
            Err(GiveUp::Deadline)
        );
    }

    #[test]
    fn throttling_codes_and_authorities() {
        assert!(is_throttling_code("SlowDown") && is_throttling_code("RequestLimitExceeded"));
        assert!(!is_throttling_code("NoSuchKey") && !is_throttling_code("InternalError"));
        assert_eq!(authority("http://127.0.0.1:9000/b/k?x=1"), "127.0.0.1:9000");
        assert_eq!(authority("s3://bucket/key"), "bucket");
        assert_eq!(authority("https://h?q"), "h");
    }

    #[test]
    fn the_rate_recovers_to_the_throttled_one_after_the_cubic_zero() {
        // 100 answers a second for 10 s, then one throttled answer.
        let mut r = RateLimiter::new();
        let mut now = 0.0;
        for _ in 0..1000 {
            now += 0.01;
            r.succeeded(now);
        }
        assert!(!r.enabled());
        r.throttled(now, now);
        let cut = r.rate();
        assert!((60.0..80.0).contains(&cut), "{cut}");
        // Answers keep coming at the cut rate; k = cbrt(w_max 0.3 / 0.4)
        // ≈ 4.2 s later the rate is back near w_max.
        let w_max = cut / BETA;
        let k = (w_max * (1.0 - BETA) / SCALE).cbrt();
        let until = now + k + 0.5;
        while now < until {
            now += 1.0 / r.rate();
            r.succeeded(now);
        }
        assert!(r.rate() >= w_max * 0.95, "{} vs {w_max}", r.rate());
    }
}
