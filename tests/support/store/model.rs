//! The emulator's pure cores: the first-byte latency distribution, the
//! token bucket that paces bodies and limits request rates, and the parsers
//! of the command line's quantities. No I/O and no clock of their own: time
//! comes in as nanoseconds from the caller, randomness as uniforms, so each
//! is tested exactly.

use std::time::Duration;

/// The 0.99 quantile of the standard normal distribution.
const Z_P99: f64 = 2.326_347_874_040_841;

/// First-byte latency, lognormal: `ln(latency)` is normal with mean
/// `ln(median)` and the spread that puts the 99th percentile at `p99`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lognormal {
    mu: f64,
    sigma: f64,
}

impl Lognormal {
    /// `median` and `p99` as the command line gives them (`20ms:120ms`);
    /// `p99` must not be below `median`, and `median` must be positive.
    pub fn from_median_p99(median: Duration, p99: Duration) -> Result<Lognormal, String> {
        if median.is_zero() {
            return Err("the median latency must be above zero".into());
        }
        if p99 < median {
            return Err(format!("p99 {p99:?} is below the median {median:?}"));
        }
        let mu = median.as_secs_f64().ln();
        let sigma = (p99.as_secs_f64().ln() - mu) / Z_P99;
        Ok(Lognormal { mu, sigma })
    }

    pub fn median(&self) -> Duration {
        Duration::from_secs_f64(self.mu.exp())
    }

    pub fn p99(&self) -> Duration {
        Duration::from_secs_f64((self.mu + self.sigma * Z_P99).exp())
    }

    /// One latency from two independent uniforms in [0, 1) (Box-Muller:
    /// `sqrt(-2 ln(1 - u1)) cos(2 pi u2)` is standard normal; `1 - u1` so
    /// the logarithm never sees zero).
    pub fn sample(&self, u1: f64, u2: f64) -> Duration {
        let z = (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        Duration::from_secs_f64((self.mu + self.sigma * z).exp())
    }
}

/// A token bucket over an injected clock: `rate` tokens a second, at most
/// `burst` saved up. Bytes for pacing, requests for rate limits.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    /// May go below zero: `reserve` takes what it is asked for and says how
    /// long the debt takes to repay.
    tokens: f64,
    last_ns: u64,
}

impl TokenBucket {
    /// Full at `now_ns`.
    pub fn new(rate: f64, burst: f64, now_ns: u64) -> TokenBucket {
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            last_ns: now_ns,
        }
    }

    fn refill(&mut self, now_ns: u64) {
        let dt = now_ns.saturating_sub(self.last_ns) as f64 / 1e9;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        self.last_ns = self.last_ns.max(now_ns);
    }

    /// Takes `n` tokens if there are that many (a request admitted), or
    /// none (refused).
    pub fn try_take(&mut self, n: f64, now_ns: u64) -> bool {
        self.refill(now_ns);
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }

    /// Takes `n` tokens, going into debt if need be, and returns how long
    /// until the debt is repaid: the time a paced sender waits before it
    /// sends the `n` bytes. Senders that share a bucket queue behind each
    /// other's debt, so they split its rate.
    pub fn reserve(&mut self, n: f64, now_ns: u64) -> Duration {
        self.refill(now_ns);
        self.tokens -= n;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }

    pub fn tokens(&self) -> f64 {
        self.tokens
    }
}

/// `20ms`, `1.5s`, `250us`, `0` (zero).
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let v = v.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("{v}: not a duration (e.g. 20ms, 5s)"))?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "" if num == 0.0 => 1.0,
        "m" | "min" => 60.0,
        _ => return Err(format!("{v}: the unit must be ns, us, ms, s or min")),
    };
    let secs = num * scale;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{v}: not a duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Bytes a second: `90MB/s`, `1250MB/s`, `10GB/s`, `64MiB/s`, `1e6/s`.
pub fn parse_bytes_rate(v: &str) -> Result<f64, String> {
    let body = v
        .trim()
        .strip_suffix("/s")
        .ok_or_else(|| format!("{v}: a rate ends in /s (e.g. 90MB/s)"))?;
    parse_size(body).map(|n| n as f64)
}

/// `8MiB`, `256MB`, `1GiB`, `4096`.
pub fn parse_size(v: &str) -> Result<u64, String> {
    let t = v.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num.parse().map_err(|_| format!("{v}: not a size"))?;
    let scale: f64 = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KIB" => 1024.0,
        "MIB" => 1024.0 * 1024.0,
        "GIB" => 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(format!(
                "{v}: the unit must be B, KB, MB, GB, KiB, MiB or GiB"
            ));
        }
    };
    let n = num * scale;
    if !n.is_finite() || n < 0.0 {
        return Err(format!("{v}: not a size"));
    }
    Ok(n as u64)
}

/// `5500/s` (burst: a tenth of a second's worth, at least one) or
/// `5500/s:200` (burst given): requests a second and the burst.
pub fn parse_request_rate(v: &str) -> Result<(f64, f64), String> {
    let (rate, burst) = match v.split_once(':') {
        Some((r, b)) => (r, Some(b)),
        None => (v, None),
    };
    let rate: f64 = rate
        .trim()
        .strip_suffix("/s")
        .and_then(|r| r.parse().ok())
        .filter(|r: &f64| r.is_finite() && *r > 0.0)
        .ok_or_else(|| format!("{v}: not a request rate (e.g. 5500/s or 5500/s:500)"))?;
    let burst = match burst {
        Some(b) => b
            .parse::<f64>()
            .ok()
            .filter(|b| b.is_finite() && *b >= 1.0)
            .ok_or_else(|| format!("{v}: the burst must be a number of requests, at least 1"))?,
        // A tenth of a second's requests: S3 absorbs short bursts above its
        // rate, but not whole seconds of them.
        None => (rate / 10.0).max(1.0),
    };
    Ok((rate, burst))
}

/// Days since 1970-01-01 as (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `2026-12-02T02:43:29.000Z`, as S3's listings give `LastModified`.
pub fn iso8601(unix_s: i64) -> String {
    let (y, m, d) = civil_from_days(unix_s.div_euclid(86_400));
    let s = unix_s.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.000Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// `Wed, 02 Dec 2026 02:43:29 GMT`, the HTTP date of `Last-Modified`.
pub fn http_date(unix_s: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = unix_s.div_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let s = unix_s.rem_euclid(86_400);
    format!(
        "{}, {d:02} {} {y:04} {:02}:{:02}:{:02} GMT",
        DAYS[days.rem_euclid(7) as usize],
        MONTHS[m as usize - 1],
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn quantile(sorted: &[Duration], q: f64) -> f64 {
        sorted[((sorted.len() - 1) as f64 * q) as usize].as_secs_f64()
    }

    #[test]
    fn lognormal_samples_have_the_median_and_p99_asked_for() {
        let m = Lognormal::from_median_p99(Duration::from_millis(20), Duration::from_millis(120))
            .unwrap();
        assert!((m.median().as_secs_f64() - 0.020).abs() < 1e-9);
        assert!((m.p99().as_secs_f64() - 0.120).abs() < 1e-9);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut xs: Vec<Duration> = (0..200_000)
            .map(|_| m.sample(rng.random(), rng.random()))
            .collect();
        xs.sort();
        let (med, p99) = (quantile(&xs, 0.5), quantile(&xs, 0.99));
        // 200,000 samples: the empirical quantiles are within a percent or
        // two of the true ones; 3 % and 6 % leave room for the seed.
        assert!((med / 0.020 - 1.0).abs() < 0.03, "median {med}");
        assert!((p99 / 0.120 - 1.0).abs() < 0.06, "p99 {p99}");
    }

    #[test]
    fn lognormal_with_p99_equal_to_median_is_constant() {
        let d = Duration::from_millis(5);
        let m = Lognormal::from_median_p99(d, d).unwrap();
        for (u1, u2) in [(0.0, 0.0), (0.5, 0.3), (0.999, 0.9)] {
            assert!((m.sample(u1, u2).as_secs_f64() - 0.005).abs() < 1e-12);
        }
    }

    #[test]
    fn lognormal_refuses_a_p99_below_the_median_and_a_zero_median() {
        let ms = Duration::from_millis;
        assert!(Lognormal::from_median_p99(ms(20), ms(10)).is_err());
        assert!(Lognormal::from_median_p99(ms(0), ms(10)).is_err());
    }

    #[test]
    fn try_take_admits_the_burst_then_the_rate() {
        let mut b = TokenBucket::new(10.0, 3.0, 0);
        assert!((0..3).all(|_| b.try_take(1.0, 0)));
        assert!(
            !b.try_take(1.0, 0),
            "a fourth request at once is past the burst"
        );
        // 10 a second: one more after 100 ms, not before.
        assert!(!b.try_take(1.0, 99_000_000));
        assert!(b.try_take(1.0, 100_000_000));
        // A long idle refills only up to the burst.
        assert!((0..3).all(|_| b.try_take(1.0, 60_000_000_000)));
        assert!(!b.try_take(1.0, 60_000_000_000));
    }

    #[test]
    fn reserve_makes_debt_that_takes_its_size_over_the_rate() {
        // 1 MB/s, a 64 KB burst.
        let mut b = TokenBucket::new(1e6, 64e3, 0);
        assert_eq!(b.reserve(64e3, 0), Duration::ZERO);
        // The next 100 KB: 100 ms of debt.
        let w = b.reserve(100e3, 0);
        assert!((w.as_secs_f64() - 0.1).abs() < 1e-9, "{w:?}");
        // A second sender behind it waits for both.
        let w = b.reserve(100e3, 0);
        assert!((w.as_secs_f64() - 0.2).abs() < 1e-9, "{w:?}");
        // 200 ms later the debt is repaid and nothing is saved up.
        assert_eq!(b.reserve(0.0, 200_000_000), Duration::ZERO);
        assert!(b.tokens().abs() < 1e-6);
    }

    #[test]
    fn a_clock_going_backwards_refills_nothing() {
        let mut b = TokenBucket::new(1.0, 1.0, 1_000);
        assert!(b.try_take(1.0, 1_000));
        assert!(!b.try_take(1.0, 0));
    }

    #[test]
    fn quantities_parse_and_bad_ones_are_named() {
        assert_eq!(parse_duration("20ms").unwrap(), Duration::from_millis(20));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("20").is_err(), "a unit is needed");
        assert!(parse_duration("fast").is_err());
        assert_eq!(parse_bytes_rate("90MB/s").unwrap(), 90e6);
        assert_eq!(parse_bytes_rate("64MiB/s").unwrap(), 64.0 * 1048576.0);
        assert!(parse_bytes_rate("90MB").is_err());
        assert_eq!(parse_size("8MiB").unwrap(), 8 << 20);
        assert_eq!(parse_request_rate("5500/s").unwrap(), (5500.0, 550.0));
        assert_eq!(parse_request_rate("5/s:2").unwrap(), (5.0, 2.0));
        assert_eq!(parse_request_rate("2/s").unwrap(), (2.0, 1.0));
        assert!(parse_request_rate("0/s").is_err());
        assert!(parse_request_rate("5/s:0").is_err());
    }

    #[test]
    fn dates_are_the_calendar_s() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(1_796_179_409), "2026-12-02T02:43:29.000Z");
        assert_eq!(http_date(1_796_179_409), "Wed, 02 Dec 2026 02:43:29 GMT");
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
    }
}
