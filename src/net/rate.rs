//! The request rate of one host under throttling, pure: the caller
//! supplies the clock readings and does the waiting.
//!
//! [`RateLimiter`]: a token bucket, off until the first throttled answer,
//! whose fill rate is cut by [`BETA`] (once per round of requests) at a
//! throttled answer and grows back additively after successes (AIMD), so
//! that under a server's rate limit it rides just under the limit; its
//! floor is a share of the rate the host was taking, not an absolute one,
//! and after a storm (nothing taken) it grows back by doubling, as TCP's
//! slow start. The retry policy that sends throttled requests again is
//! `crate::net::retry`; the bucket of every host a loader reads from is
//! `crate::net::Pacer`.

use std::time::Duration;

/// The factor a throttled answer multiplies the rate the host was taking
/// by: it began to refuse past that rate, so the rate falls to just under
/// it and rides there (a sawtooth between 0.9 and 1 of the limit averages
/// 0.95 of it, which leaves room for the retries of the few 503s each
/// probe costs within the ≥ 0.9 N a limit of N/s must give).
pub const BETA: f64 = 0.9;
/// Additive increase: per second without throttling the rate grows by this
/// share of the good rate (answers taken without throttling), so it climbs
/// from a cut back to the rate that was throttled in (1 − β) / 0.05 = 2 s —
/// a probe every few seconds, each costing a handful of 503s.
const INCREASE: f64 = 0.05;
/// The lowest fill rate, requests per second (the SDKs' minimum): what a
/// host that takes nothing at all is still asked.
pub const MIN_RATE: f64 = 0.5;
/// After a cut where the host took almost nothing (fewer good answers than
/// this share of those sent: a storm, not a limit), and after the first cut
/// (the good rate then is counted over the first half second, however
/// little of it has passed: an underestimate), the rate grows
/// multiplicatively, doubling every [`DOUBLING`] seconds, as TCP's slow
/// start, until the next cut: additive growth from 0.5 req/s would take
/// minutes to reach the rate the host takes again.
const STORM_SHARE: f64 = 0.1;
const DOUBLING: f64 = 0.5;
/// Rates are measured per half second, smoothed by 0.8 (the SDKs' rate
/// clock).
const MEASURE_BUCKET: f64 = 0.5;
const SMOOTHING: f64 = 0.8;
/// A success may raise the rate to at most twice what was measured (the
/// SDKs' cap): the bucket never runs far ahead of what the host took.
const MAX_OVER_MEASURED: f64 = 2.0;
/// Longest wait a `Retry-After` imposes on a host: the retry policy's cap
/// (20 s); a server asking for longer is asked again then.
const MAX_RETRY_AFTER: f64 = 20.0;

/// The least an `Admit::Later` asks a request to wait: a debt short by a
/// rounding error would otherwise give a wait of 0 ns, and the request
/// would ask again at once, for ever on a clock that does not move (a
/// simulation's) and spinning a CPU on one that does. 1 ms is a tenth of
/// `RESERVE` of a second.
const LATER_AT_LEAST: f64 = 0.001;

/// How far ahead a request may take a token: a tenth of a second of the
/// rate, so that the waits taken are short and a rate that grows is seen
/// by the next asks.
const RESERVE: f64 = 0.1;

/// What [`RateLimiter::admit`] says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Admit {
    /// The token is taken: send after this wait.
    Go(Duration),
    /// No token near: ask again after this wait.
    Later(Duration),
}

/// The adaptive request rate of one host: additive increase,
/// multiplicative decrease (AIMD), a token bucket. Times are seconds from
/// any fixed origin the caller keeps; they must not go backwards.
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
    /// When the last cut was, and when the rate last grew.
    last_cut: f64,
    last_grow: f64,
    /// The last cut was the first, or in a storm: grow back by doubling.
    slow_start: bool,
    /// No request goes before this (a `Retry-After`).
    hold_until: f64,
    /// Answers per second (all), and answers taken (not throttled),
    /// smoothed; the counts of the current measuring bucket.
    measured: f64,
    good: f64,
    measure_start: f64,
    measure_count: u64,
    good_count: u64,
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
            last_cut: f64::NEG_INFINITY,
            last_grow: 0.0,
            slow_start: false,
            hold_until: f64::NEG_INFINITY,
            measured: 0.0,
            good: 0.0,
            measure_start: 0.0,
            measure_count: 0,
            good_count: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Requests per second the bucket admits (0 while off).
    pub fn rate(&self) -> f64 {
        if self.enabled { self.fill_rate } else { 0.0 }
    }

    /// Answers per second the host took without throttling, smoothed.
    pub fn good_rate(&self) -> f64 {
        self.good
    }

    /// All answers per second, smoothed.
    pub fn measured_rate(&self) -> f64 {
        self.measured
    }

    /// A bucket holds a tenth of a second's worth of tokens, at least one:
    /// a burst after a pause stays short, so the rate a limit sees is the
    /// fill rate (a second's worth, the SDKs' capacity, is a burst of a
    /// whole second's limit at once).
    fn capacity(&self) -> f64 {
        (self.fill_rate * 0.1).max(1.0)
    }

    fn refill(&mut self, now: f64) {
        let dt = (now - self.last_refill).max(0.0);
        self.tokens = (self.tokens + dt * self.fill_rate).min(self.capacity());
        self.last_refill = self.last_refill.max(now);
    }

    /// A request is about to be sent at `now`: takes its token when it is
    /// near ([`Admit::Go`], with the wait for it: zero while the limiter
    /// is off, unless a `Retry-After` holds the host), or says when to ask
    /// again ([`Admit::Later`]). A token is owed ahead by at most
    /// [`RESERVE`] seconds of the rate (one token at least): requests
    /// queued behind a low rate ask again as it grows, instead of keeping
    /// the places they took at it (after a storm at 0.5/s, eight queued
    /// requests would still wait 16 s).
    pub fn admit(&mut self, now: f64) -> Admit {
        let held = (self.hold_until - now).max(0.0);
        if !self.enabled {
            return Admit::Go(Duration::from_secs_f64(held));
        }
        if held > 0.0 {
            return Admit::Later(Duration::from_secs_f64(held.max(LATER_AT_LEAST)));
        }
        self.refill(now);
        let owed = (self.fill_rate * RESERVE).max(1.0);
        if self.tokens - 1.0 < -owed {
            // Until the debt is back within reach.
            let short = -owed - (self.tokens - 1.0);
            let wait = (short / self.fill_rate).max(LATER_AT_LEAST);
            return Admit::Later(Duration::from_secs_f64(wait));
        }
        self.tokens -= 1.0;
        let wait = if self.tokens >= 0.0 {
            0.0
        } else {
            -self.tokens / self.fill_rate
        };
        Admit::Go(Duration::from_secs_f64(wait))
    }

    /// The rates measured (all answers, answers taken) as of `now`: the
    /// smoothed ones once a bucket has closed, before that the counts so
    /// far over at least a bucket's span (the first throttled answers come
    /// long before the first bucket closes).
    fn rates_now(&self, now: f64) -> (f64, f64) {
        if self.measure_start > 0.0 {
            (self.measured, self.good)
        } else {
            let span = now.max(MEASURE_BUCKET);
            (
                self.measure_count as f64 / span,
                self.good_count as f64 / span,
            )
        }
    }

    fn measure(&mut self, now: f64, good: bool) {
        self.measure_count += 1;
        self.good_count += u64::from(good);
        let bucket = (now / MEASURE_BUCKET).floor() * MEASURE_BUCKET;
        if bucket > self.measure_start {
            let span = bucket - self.measure_start;
            let current = self.measure_count as f64 / span;
            let good = self.good_count as f64 / span;
            self.measured = current * SMOOTHING + self.measured * (1.0 - SMOOTHING);
            self.good = good * SMOOTHING + self.good * (1.0 - SMOOTHING);
            self.measure_count = 0;
            self.good_count = 0;
            self.measure_start = bucket;
        }
    }

    /// A request sent at `sent` was answered with throttling at `now`,
    /// asking to wait `retry_after` seconds if the answer said so: the rate
    /// is cut to [`BETA`] times the good rate (what the host was taking
    /// without throttling: a floor relative to it, not an absolute one,
    /// [`MIN_RATE`] only when it takes nothing), and never raised. An answer to
    /// a request sent before the last cut does not cut again: the requests
    /// in flight when the host began to throttle were sent at the old
    /// rate, and each of their answers cutting would collapse the rate at
    /// once (TCP's one decrease per window).
    pub fn throttled(&mut self, sent: f64, now: f64, retry_after: Option<f64>) {
        self.measure(now, false);
        if let Some(s) = retry_after.filter(|s| s.is_finite() && *s > 0.0) {
            self.hold_until = self.hold_until.max(now + s.min(MAX_RETRY_AFTER));
        }
        if self.enabled && sent < self.last_cut {
            return;
        }
        let (measured, good) = self.rates_now(now);
        self.refill(now);
        self.slow_start = !self.enabled || good <= STORM_SHARE * measured;
        self.last_cut = now;
        self.last_grow = now;
        // Just under the rate the host was taking when it began to refuse:
        // a cut does not compound with the ones before it (the requests
        // of a round sent before the host's answer reached us would each
        // cut again), only a host taking less lowers it further.
        let cut = (good * BETA).max(MIN_RATE);
        self.fill_rate = if self.enabled {
            self.fill_rate.min(cut)
        } else {
            cut
        };
        if !self.enabled {
            // From an empty bucket: the next request waits for its token.
            self.tokens = 0.0;
            self.last_refill = now;
        }
        self.tokens = self.tokens.min(self.capacity());
        self.enabled = true;
    }

    /// A request was answered without throttling at `now`: the rate grows
    /// by [`INCREASE`] of the good rate per second (doubling per
    /// [`DOUBLING`] after the first cut or a storm), to at most twice the
    /// measured rate; it never falls here.
    pub fn succeeded(&mut self, now: f64) {
        self.measure(now, true);
        if !self.enabled {
            return;
        }
        self.refill(now);
        // A pause of the reader is not time the host spent taking requests.
        let dt = (now - self.last_grow).clamp(0.0, 1.0);
        self.last_grow = now.max(self.last_grow);
        let (measured, good) = self.rates_now(now);
        let grown = if self.slow_start {
            self.fill_rate * (dt * std::f64::consts::LN_2 / DOUBLING).exp()
        } else {
            self.fill_rate + INCREASE * good.max(self.fill_rate) * dt
        };
        let grown = grown.min(MAX_OVER_MEASURED * measured.max(MIN_RATE));
        if grown > self.fill_rate {
            self.fill_rate = grown;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever answers come when, the fill rate stays between the
        /// floor and what was measured (twice it at most), a throttled
        /// answer to a request sent after the last cut takes it to β times
        /// the good rate at most (never raising it), and a success never
        /// lowers it.
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
                    r.throttled(sent, now, None);
                    prop_assert!(r.enabled());
                    if cuts {
                        let (_, g) = r.rates_now(now);
                        prop_assert!(r.rate() <= (g * BETA).max(MIN_RATE) + 1e-9);
                        prop_assert!(!was_enabled || r.rate() <= before + 1e-9);
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
                    let (m, g) = r.rates_now(now);
                    prop_assert!(r.rate() <= (MAX_OVER_MEASURED * m.max(MIN_RATE)).max(before).max(g * BETA) + 1e-9);
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
            r.throttled(0.0, 0.0, None);
            let rate = r.rate();
            let mut now = 0.0f64;
            let mut sends = Vec::new();
            for gap_ms in asks {
                now += f64::from(gap_ms) / 1000.0;
                loop {
                    match r.admit(now) {
                        Admit::Go(w) => {
                            sends.push(now + w.as_secs_f64());
                            break;
                        }
                        Admit::Later(w) => now += w.as_secs_f64(),
                    }
                }
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
    }

    /// A host that takes `limit` requests a second and answers the rest
    /// 503 (a token bucket holding a tenth of a second's worth, as the test
    /// server's limit), `in_flight` requests kept going by a
    /// client that retries a throttled one as soon as its token allows,
    /// answers after `latency` s: the good requests per second over the
    /// last `span` s of `until`, and the share of answers throttled then.
    fn ride(limit: usize, in_flight: usize, latency: f64, until: f64, span: f64) -> (f64, f64) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        #[derive(PartialEq, Eq, PartialOrd, Ord)]
        enum Ev {
            Free,
            Send,
            Answer { sent_ns: u64, ok: bool },
        }
        let ns = |t: f64| (t * 1e9) as u64;
        let mut r = RateLimiter::new();
        let mut heap = BinaryHeap::new();
        for _ in 0..in_flight {
            heap.push(Reverse((0u64, Ev::Free)));
        }
        let cap = (limit as f64 / 10.0).max(1.0);
        let (mut tokens, mut last) = (cap, 0.0f64);
        let (mut good, mut bad) = (0u64, 0u64);
        while let Some(Reverse((t_ns, ev))) = heap.pop() {
            let t = t_ns as f64 / 1e9;
            if t > until {
                break;
            }
            match ev {
                Ev::Free => match r.admit(t) {
                    Admit::Go(w) => heap.push(Reverse((ns(t + w.as_secs_f64()), Ev::Send))),
                    Admit::Later(w) => heap.push(Reverse((ns(t + w.as_secs_f64()), Ev::Free))),
                },
                Ev::Send => {
                    tokens = (tokens + (t - last) * limit as f64).min(cap);
                    last = t;
                    let ok = tokens >= 1.0;
                    if ok {
                        tokens -= 1.0;
                    }
                    let at = ns(t + latency);
                    heap.push(Reverse((at, Ev::Answer { sent_ns: t_ns, ok })));
                }
                Ev::Answer { sent_ns, ok } => {
                    if ok {
                        r.succeeded(t);
                    } else {
                        r.throttled(sent_ns as f64 / 1e9, t, None);
                    }
                    if t > until - span {
                        if ok { good += 1 } else { bad += 1 }
                    }
                    heap.push(Reverse((t_ns, Ev::Free)));
                }
            }
        }
        (good as f64 / span, bad as f64 / (good + bad).max(1) as f64)
    }

    /// Under a limit of N/s the client gets at least 0.9 N through, over
    /// a minute after the first throttling, at a few 503s per hundred
    /// answers: the rate rides just under the limit instead of
    /// collapsing. Limits from 20 to 5,500 (S3's per prefix) per second.
    #[test]
    fn the_rate_rides_just_under_a_request_limit() {
        for (limit, in_flight, latency) in [(20, 4, 0.002), (200, 16, 0.005), (5500, 64, 0.002)] {
            let (rate, throttled) = ride(limit, in_flight, latency, 70.0, 60.0);
            eprintln!("{limit}/s: {rate:.1}/s taken, {throttled:.3} throttled");
            let n = limit as f64;
            // At most the limit, and the server's burst (a tenth of a
            // second's worth) spread over the span.
            assert!(
                rate >= 0.9 * n && rate <= n * 1.01 + 1.0,
                "{limit}/s limit: {rate}/s taken"
            );
            assert!(
                throttled < 0.1,
                "{limit}/s: {throttled} of answers throttled"
            );
        }
    }

    /// The control of the test above: with the SDKs' constants (a cut to
    /// 0.7 of the rate in use per round, compounding, and an absolute floor
    /// of 0.5/s) a burst of 503s collapsed the rate to the floor; here a
    /// cut is relative to the good rate: however many rounds are throttled
    /// while the host still takes requests, the rate stays near β of it.
    #[test]
    fn a_burst_of_throttling_stops_at_half_the_good_rate() {
        let mut r = RateLimiter::new();
        let mut now = 0.0;
        // 100 answers a second taken for 10 s.
        for _ in 0..1000 {
            now += 0.01;
            r.succeeded(now);
        }
        assert!(!r.enabled());
        // Then every other answer throttled, each one sent after the last
        // cut, for 2 s: 100 cuts, which at β alone would end at 0.5/s.
        for i in 0..200 {
            now += 0.01;
            if i % 2 == 0 {
                r.throttled(now, now, None);
            } else {
                r.succeeded(now);
            }
        }
        assert!(
            r.rate() >= 0.8 * 50.0 * BETA,
            "{} after the burst",
            r.rate()
        );
    }

    /// A storm (every answer throttled) drives the rate to the floor of
    /// 0.5/s; once the host takes requests again, the rate doubles back
    /// within seconds rather than climbing for minutes.
    #[test]
    fn after_a_storm_the_rate_doubles_back() {
        let mut r = RateLimiter::new();
        let mut now = 0.0;
        while now < 30.0 {
            now += 0.05;
            r.throttled(now, now, None);
        }
        assert!((r.rate() - MIN_RATE).abs() < 1e-9, "{}", r.rate());
        // The storm is over: answers at the pace the bucket gives, to a
        // reader wanting 200/s.
        let start = now;
        while r.rate() < 50.0 && now < start + 60.0 {
            now += (1.0 / r.rate()).min(0.005);
            r.succeeded(now);
        }
        assert!(now - start < 10.0, "back to 50/s after {} s", now - start);
    }

    /// `Retry-After` holds the host's requests for that long (capped),
    /// whether or not the bucket was on.
    #[test]
    fn retry_after_holds_the_host() {
        let wait = |a: Admit| match a {
            Admit::Go(w) | Admit::Later(w) => w.as_secs_f64(),
        };
        let mut r = RateLimiter::new();
        r.throttled(0.0, 1.0, Some(3.0));
        let w = wait(r.admit(1.0));
        assert!((w - 3.0).abs() < 1e-9, "{w}");
        assert!(wait(r.admit(4.5)) < 3.0);
        let mut r = RateLimiter::new();
        r.throttled(0.0, 0.0, Some(3600.0));
        assert!(wait(r.admit(0.0)) <= MAX_RETRY_AFTER + 1e-9);
    }
}
