//! The emulator's counters: requests by kind, the answers that are not a
//! plain success, body bytes sent, stalls injected, and the transfers in
//! flight (a request from its arrival until its body is sent or dropped),
//! whose time-weighted mean is taken over the window from the first
//! request after a reset to now (idle time before the first request, while
//! a benchmark starts its next contender, does not dilute it).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The counters one reset zeroes. Atomics: Relaxed, plain counts read
/// after the requests they count (no other memory hangs on them).
#[derive(Default)]
pub struct Counters {
    pub requests: AtomicU64,
    /// GETs answered with data (a GET answered 503 is `slow_down` only).
    pub gets: AtomicU64,
    pub heads: AtomicU64,
    pub lists: AtomicU64,
    pub slow_down: AtomicU64,
    pub precondition_failed: AtomicU64,
    pub range_not_satisfiable: AtomicU64,
    pub not_found: AtomicU64,
    pub bytes: AtomicU64,
    pub stalls: AtomicU64,
    flight: Mutex<Flight>,
}

/// Transfers in flight and their integral over time.
#[derive(Default)]
struct Flight {
    now: u64,
    max: u64,
    /// Sum of `now` x nanoseconds since `first_ns`.
    area: f64,
    first_ns: Option<u64>,
    last_ns: u64,
}

impl Flight {
    fn advance(&mut self, now_ns: u64) {
        let t = now_ns.max(self.last_ns);
        if self.first_ns.is_some() {
            self.area += self.now as f64 * (t - self.last_ns) as f64;
        }
        self.last_ns = t;
    }
}

/// The counters as served at `/_emulator/stats` and printed at exit.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub requests: u64,
    pub gets: u64,
    pub heads: u64,
    pub lists: u64,
    /// 503 SlowDown answers (request-rate limit).
    pub slow_down: u64,
    pub precondition_failed: u64,
    pub range_not_satisfiable: u64,
    pub not_found: u64,
    /// Body bytes handed to the connections.
    pub bytes: u64,
    pub stalls: u64,
    /// Time-weighted mean of the transfers in flight over `window_s`.
    pub transfers_mean: f64,
    pub transfers_max: u64,
    /// Transfers in flight now.
    pub transfers_now: u64,
    /// From the first request after the reset to now.
    pub window_s: f64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// A transfer begins at `now_ns`.
    pub fn begin(&self, now_ns: u64) {
        let mut f = self.flight.lock().unwrap();
        f.advance(now_ns);
        f.first_ns.get_or_insert(now_ns);
        f.now += 1;
        f.max = f.max.max(f.now);
    }

    /// A transfer ends at `now_ns`.
    pub fn end(&self, now_ns: u64) {
        let mut f = self.flight.lock().unwrap();
        f.advance(now_ns);
        f.now = f.now.saturating_sub(1);
    }

    pub fn snapshot(&self, now_ns: u64) -> Snapshot {
        let (mean, max, now, window) = {
            let mut f = self.flight.lock().unwrap();
            f.advance(now_ns);
            let window = f.first_ns.map_or(0, |s| f.last_ns - s);
            let mean = if window == 0 {
                f.now as f64
            } else {
                f.area / window as f64
            };
            (mean, f.max, f.now, window as f64 / 1e9)
        };
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            requests: g(&self.requests),
            gets: g(&self.gets),
            heads: g(&self.heads),
            lists: g(&self.lists),
            slow_down: g(&self.slow_down),
            precondition_failed: g(&self.precondition_failed),
            range_not_satisfiable: g(&self.range_not_satisfiable),
            not_found: g(&self.not_found),
            bytes: g(&self.bytes),
            stalls: g(&self.stalls),
            transfers_mean: mean,
            transfers_max: max,
            transfers_now: now,
            window_s: window,
        }
    }

    /// Zeroes every count; the transfers still in flight stay counted in
    /// flight (they end later), and the window starts again.
    pub fn reset(&self, now_ns: u64) {
        for c in [
            &self.requests,
            &self.gets,
            &self.heads,
            &self.lists,
            &self.slow_down,
            &self.precondition_failed,
            &self.range_not_satisfiable,
            &self.not_found,
            &self.bytes,
            &self.stalls,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        let mut f = self.flight.lock().unwrap();
        let now = f.now;
        *f = Flight {
            now,
            max: now,
            area: 0.0,
            first_ns: None,
            last_ns: now_ns,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_in_flight_is_weighted_by_time() {
        let c = Counters::default();
        // Idle before the first request: not in the window.
        c.begin(1_000);
        c.begin(1_000);
        // Two for 1 s, one for 1 s, none for 2 s: (2 + 1) / 4.
        c.end(1_000_001_000);
        c.end(2_000_001_000);
        let s = c.snapshot(4_000_001_000);
        assert!((s.transfers_mean - 0.75).abs() < 1e-9, "{s:?}");
        assert_eq!((s.transfers_max, s.transfers_now), (2, 0));
        assert!((s.window_s - 4.0).abs() < 1e-9);
        c.reset(5_000_000_000);
        let s = c.snapshot(6_000_000_000);
        assert_eq!(
            (s.transfers_max, s.window_s, s.transfers_mean),
            (0, 0.0, 0.0)
        );
    }
}
