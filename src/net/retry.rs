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
    /// Re-request a range far behind its peers (its head, or its body) on
    /// a fresh connection, the first answer winning (`crate::net::tail`).
    pub hedge: bool,
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
            // The tail of S3's first bytes is where the time goes.
            hedge: true,
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
}
