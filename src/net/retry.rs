//! The retry policy for ranged reads: which failures are retried, how many
//! times, and how long to wait — exponential backoff with full jitter, as the
//! AWS SDKs do, longer after throttling. Pure: the caller supplies the
//! randomness and does the sleeping.

use std::time::Duration;

use crate::net::http::FailKind;

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts per range, the first included.
    pub max_attempts: u32,
    /// Backoff of the first retry (before jitter).
    pub base: Duration,
    /// Longest backoff.
    pub cap: Duration,
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
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `attempt + 1` after a failure of `kind`, or
    /// `None` when the range must fail now. `rand` is any random u64.
    pub fn next_delay(&self, attempt: u32, kind: FailKind, rand: u64) -> Option<Duration> {
        if !kind.retryable() || attempt + 1 >= self.max_attempts {
            return None;
        }
        // Throttling asks us to slow down: start four times higher.
        let base = if kind == FailKind::Throttled {
            self.base * 4
        } else {
            self.base
        };
        let ceiling = base
            .checked_mul(1u32 << attempt.min(16))
            .unwrap_or(self.cap)
            .min(self.cap);
        // Full jitter: uniform in [0, ceiling].
        let nanos = ceiling.as_nanos() as u64;
        Some(Duration::from_nanos(if nanos == 0 {
            0
        } else {
            rand % (nanos + 1)
        }))
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

    proptest! {
        #[test]
        fn delays_stay_under_the_growing_ceiling(attempt in 0u32..10, rand: u64) {
            let p = RetryPolicy::default();
            match p.next_delay(attempt, FailKind::Reset, rand) {
                None => prop_assert!(attempt + 1 >= p.max_attempts),
                Some(d) => {
                    let ceiling = (p.base * (1 << attempt)).min(p.cap);
                    prop_assert!(d <= ceiling);
                }
            }
        }
    }

    #[test]
    fn client_errors_are_not_retried_and_attempts_are_bounded() {
        let p = RetryPolicy::default();
        assert_eq!(p.next_delay(0, FailKind::Client, 7), None);
        assert!(p.next_delay(0, FailKind::Dns, 7).is_some());
        assert_eq!(p.next_delay(0, FailKind::Tls, 7), None);
        assert!(p.next_delay(0, FailKind::Throttled, 7).is_some());
        assert_eq!(p.next_delay(4, FailKind::ServerError, 7), None);
        assert!(p.next_delay(3, FailKind::ServerError, 7).is_some());
    }
}
