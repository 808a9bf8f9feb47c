//! How many ranged reads a loader keeps in flight over the network, found
//! as it goes (pure: the caller gives the clock and the read times).
//!
//! A read of `len` bytes takes `T` = first-byte latency + `len` / the
//! connection's bandwidth. By Little's law, `n` reads in flight carry
//! `n * len / T` bytes per second: the in-flight count a throughput needs
//! is its bandwidth-delay product in reads. Loopback answers at once
//! (`T` ~ 2 ms for 8 MiB), so a few reads fill it; S3 answers after
//! ~20 ms and sends ~90 MB/s per connection (`T` ~ 115 ms), so 3 GB/s
//! needs ~40 reads in flight and 12.5 GB/s ~180.
//!
//! Neither the latency nor the link's capacity is known in advance, so the
//! count is found by climbing: in windows of completed reads, the engine
//! measures their median time. It raises the count (by half until the
//! first raise that did not pay, by a quarter after) and keeps the raise
//! only when the reads did not slow down as much as they became more
//! (Little's law: the rate rose with it); a raise that bought nothing is
//! undone, and the count
//! holds for a while before it tries again. Reads that take far longer
//! than the best median seen (`base`: a read that waits on nothing but
//! the server's latency and one connection's bandwidth) may be queueing
//! behind one another (the link, the server or the CPU is full): the count
//! tries a quarter fewer, and keeps them only when the fewer carried about
//! as much (by Little's law again, against the better of the slow window
//! and the one before it). Slow windows also come from stalls that fewer
//! reads do not cure — on a VM a first touch of fresh memory can cost a
//! read's time, a server's latency has tails — and a shrink kept on them
//! would cost the rate until the count climbed back: that shrink is
//! undone. A far store (the first window's median first-byte latency past
//! `FAR_FIRST_BYTE` and none under `NEAR_FLOOR`, where the reads said it)
//! skips the climb: the count
//! goes to the most at once, with the first window of reads whether its
//! times are judged or not, and is judged later as any raise. Windows whose reads
//! landed in memory used for the first time are not judged (nor the one
//! after): a first write's faults are paid once a chunk, and the most
//! reads touch the most new memory. A throughput target
//! (`target_throughput`) caps the count at
//! what it needs by Little's law; memory (the caller's `max`) caps it too;
//! a host that throttles caps it at what its paced request rate keeps
//! busy.
//! The order of samples never depends on any of this: only how far ahead
//! the reads go.

/// A raise is kept when it bought at least this much more rate (by
/// Little's law, the count's rise over the read time's): a raise of a
/// quarter into a link with room gives +25 %, one into a full link
/// nothing (the reads take as much longer as they are more).
const PAID: f64 = 1.08;

/// Reads slower than `base` by more than this are queueing: the count
/// shrinks by `SHRINK`. The median of a window of S3-like reads
/// (lognormal first byte, median 20 ms, p99 120 ms, plus 93 ms for 8 MiB
/// at 90 MB/s) varies by about 10 % between windows; 2x is queueing.
const SHRINK_ABOVE: f64 = 2.0;

/// Shrink step: a quarter off, so one noisy window costs little.
const SHRINK: f64 = 0.75;

/// A change of the count being tried: judged by the next window measured.
#[derive(Debug, Clone, Copy)]
enum Trial {
    /// Raised from `was`, whose window's median read time was `median`.
    Raise { was: usize, median: f64 },
    /// Shrunk from `was`, whose reads carried `rate` reads a second (the
    /// better of the slow window's and the one's before it).
    Shrink { was: usize, rate: f64 },
}

impl Trial {
    fn was(self) -> usize {
        match self {
            Trial::Raise { was, .. } | Trial::Shrink { was, .. } => was,
        }
    }
}

/// Windows the count holds after a raise that did not pay, before it
/// tries again (a link's room changes with other tenants).
const HOLD: u32 = 8;

/// `base` rises by this factor per window, so that a link that became
/// slower for good is not compared with a past it cannot return to.
const BASE_DRIFT: f64 = 1.02;

/// The reported rate spans at least this many read times: completions
/// come in bursts, and over less the rate is mostly their noise.
const RATE_SPAN: f64 = 4.0;

/// A first window's median first-byte latency past this is a far
/// store's (S3: ~15-30 ms; loopback or a store on the same switch: well
/// under a millisecond to a few): its bandwidth-delay product is likely
/// many reads, and the count goes straight to the most memory allows,
/// judged as any raise by what it carried (and undone when it bought
/// nothing), rather than climbing there by halves over a run's first
/// seconds. The whole read's time is no such sign: a near link shared by
/// many reads makes them slow too, and more would only queue.
const FAR_FIRST_BYTE: f64 = 0.01;

/// ...and every first byte of that window later than this: a far store's
/// latency has a floor (S3's first bytes come after ~10 ms at the least;
/// of 8 draws of the emulator's S3 model, median 20 ms and p99 120 ms, the
/// least is under 2 ms one time in 90), where a server on the same host
/// answers its first requests at once and only later ones late, behind
/// the bodies it sends and the receiving thread's own copies: the
/// emulator on 127.0.0.1 with no model gave a first window of
/// [0, 1, 6, 8, 16, 17, 18, 23] ms, a median that said far, and the count
/// went to its most, faulting in all of the arena.
const NEAR_FLOOR: f64 = 0.002;

/// A window more than this share of whose reads landed in memory used for
/// the first time is not measured, nor the one after it (its reads were
/// asked for meanwhile): a first write faults its pages in, which on this
/// project's VMs costs 1.5-3 ms a MB (the host backs a page only at its
/// first touch), as long as the read itself, and stalls the reads beside
/// it for the CPU. That cost is paid once a chunk: judged on it, the jump
/// to a far store's count (whose reads touch the most memory) was at
/// times undone within its first second on a loaded machine, and the
/// count climbed back by halves. Each chunk is new once, so few windows
/// are left out.
const FRESH_SHARE: f64 = 0.125;

/// While the reads' host throttles (it answered 503 SlowDown and its
/// requests are paced, `crate::net::Pacer`), the count is what the paced
/// rate keeps busy by Little's law (rate × a read's time on the wire),
/// times this: more reads would only wait for their turn at the pacer,
/// each holding a chunk (on this project's VMs a chunk's first touch
/// costs ~20 ms of CPU: 92 reads held under a limit of 200 GETs/s took
/// 3 s of system time in a run of 5), and fewer would leave tokens
/// unused when reads' times vary (a lognormal first byte, completions
/// seen in clumps): the count's own search, misled by the pacer's waits,
/// fell to 9 and took 124 GETs/s of the 200 the host allowed.
const PACED_SPARE: f64 = 2.0;

/// Fewest reads in a window: a median of fewer is mostly noise.
const MIN_WINDOW: usize = 8;

/// Why the count is where it is, for the stats (`limited_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Not measured yet (fewer than a window of reads).
    Probing,
    /// Reads still take their base time: more would go faster, and the
    /// count is growing.
    Growing,
    /// At the caller's most (the memory the reads may take).
    Memory,
    /// At what `target_throughput` needs.
    Target,
    /// Reads take far longer than their base time: the link, the server
    /// or the CPU is full.
    Saturated,
    /// The host throttles: the count is what its paced request rate
    /// keeps busy.
    Throttled,
}

impl Limit {
    pub fn name(self) -> &'static str {
        match self {
            Limit::Probing => "probing",
            Limit::Growing => "latency",
            Limit::Memory => "memory",
            Limit::Target => "target",
            Limit::Saturated => "server",
            Limit::Throttled => "throttled",
        }
    }
}

/// A network read that got all its bytes, for [`InFlight::record`];
/// times in seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Read {
    pub bytes: u64,
    /// From its first ask to its last byte: pacing waits, backoffs and
    /// retries included.
    pub secs: f64,
    /// From the request of its answer going out to the answer's head, and
    /// to its last byte, when known (an HTTP read on io_uring).
    pub first_byte: Option<f64>,
    pub on_wire: Option<f64>,
    /// The requests a second its host was paced at, when it throttled.
    pub paced: Option<f64>,
    /// It landed in memory used for the first time (`FRESH_SHARE`).
    pub fresh: bool,
}

/// The in-flight count of one loader's network reads.
#[derive(Debug, Clone)]
pub struct InFlight {
    min: usize,
    max: usize,
    /// Bytes per second wanted; `None`: as fast as the link allows.
    target: Option<f64>,
    total: usize,
    /// Read times of the window being gathered, seconds.
    window: Vec<f64>,
    /// First-byte latencies of the window's reads that had one, seconds.
    window_first: Vec<f64>,
    /// The median first-byte latency of the last window that had any.
    last_first_byte: Option<f64>,
    /// Its least first-byte latency.
    last_first_floor: Option<f64>,
    window_bytes: u64,
    /// Reads of the window that landed in memory used for the first time.
    window_fresh: usize,
    /// Times on the wire of the window's reads whose host was paced, and
    /// the rate it was paced at, as of the latest such read.
    window_wire: Vec<f64>,
    paced: Option<f64>,
    /// The window after a change is not measured: its reads were asked
    /// for under the old count.
    settling: bool,
    /// The first window with first bytes was seen: whether the store is
    /// far was decided (once).
    jumped: bool,
    base: Option<f64>,
    /// The change being tried.
    trying: Option<Trial>,
    /// Reads a second the last measured window carried (its count over
    /// its median read time).
    last_carried: Option<f64>,
    /// A raise has not paid yet: raises are by half until one does not.
    doubling: bool,
    hold: u32,
    last_median: Option<f64>,
    last_rate: Option<f64>,
    /// Bytes completed since `rate_start`, for `last_rate`.
    rate_bytes: u64,
    rate_start: Option<f64>,
    limit: Limit,
}

impl InFlight {
    /// Starts at `start` reads in flight, never fewer than `min` nor more
    /// than `max` (all at least 1).
    pub fn new(start: usize, min: usize, max: usize, target: Option<f64>) -> InFlight {
        let min = min.max(1);
        let max = max.max(min);
        InFlight {
            min,
            max,
            target: target.filter(|t| *t > 0.0),
            total: start.clamp(min, max),
            window: Vec::new(),
            window_first: Vec::new(),
            last_first_byte: None,
            last_first_floor: None,
            window_bytes: 0,
            window_fresh: 0,
            window_wire: Vec::new(),
            paced: None,
            // The first window begins at its first read's request, not
            // at a window's end: its rate is not comparable.
            settling: true,
            jumped: false,
            base: None,
            trying: None,
            last_carried: None,
            doubling: true,
            hold: 0,
            last_median: None,
            last_rate: None,
            rate_bytes: 0,
            rate_start: None,
            limit: Limit::Probing,
        }
    }

    /// The reads to keep in flight now.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The most reads in flight (what memory allows).
    pub fn max(&self) -> usize {
        self.max
    }

    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// The median read time of the last window, seconds.
    pub fn read_time(&self) -> Option<f64> {
        self.last_median
    }

    /// The median first-byte latency of the last window whose reads said
    /// it, seconds.
    pub fn first_byte(&self) -> Option<f64> {
        self.last_first_byte
    }

    /// Bytes per second the reads completed at, over the last span of at
    /// least `RATE_SPAN` read times.
    pub fn rate(&self) -> Option<f64> {
        self.last_rate
    }

    /// The bandwidth-delay product measured, bytes: what the last window's
    /// rate keeps in flight for a read's time.
    pub fn bdp(&self) -> Option<f64> {
        Some(self.last_rate? * self.last_median?)
    }

    /// `read` completed at `now` (seconds on the caller's clock). A read
    /// of a paced host is judged by its time on the wire: its wait at the
    /// pacer says nothing of the link. Returns whether the count changed.
    pub fn record(&mut self, now: f64, read: Read) -> bool {
        let secs = match (read.paced, read.on_wire) {
            (Some(_), Some(wire)) => {
                self.window_wire.push(wire.max(1e-6));
                self.paced = read.paced;
                wire
            }
            _ => read.secs,
        };
        let rate_start = *self.rate_start.get_or_insert(now - read.secs);
        self.window.push(secs.max(1e-6));
        self.window_fresh += usize::from(read.fresh);
        if let Some(f) = read.first_byte {
            self.window_first.push(f.max(0.0));
        }
        self.window_bytes += read.bytes;
        self.rate_bytes += read.bytes;
        if self.window.len() < MIN_WINDOW.max(self.total / 2) {
            return false;
        }
        let mut w = std::mem::take(&mut self.window);
        w.sort_by(f64::total_cmp);
        let median = w[w.len() / 2];
        let mean_len = self.window_bytes as f64 / w.len() as f64;
        self.window_bytes = 0;
        let mut f = std::mem::take(&mut self.window_first);
        if !f.is_empty() {
            f.sort_by(f64::total_cmp);
            self.last_first_byte = Some(f[f.len() / 2]);
            self.last_first_floor = Some(f[0]);
        }
        if now - rate_start >= RATE_SPAN * median {
            self.last_rate = Some(self.rate_bytes as f64 / (now - rate_start).max(1e-6));
            self.rate_bytes = 0;
            self.rate_start = Some(now);
        }
        let fresh = std::mem::take(&mut self.window_fresh) as f64 > FRESH_SHARE * w.len() as f64;
        let paced = self
            .paced_need(w.len())
            .map(|n| n.clamp(self.min, self.max));
        if paced.is_some() {
            // A paced host is no far store to jump for: its rate decides.
            self.jumped |= !f.is_empty();
        }
        if let Some(needed) = paced
            && self.total > needed
        {
            // At once, settling or not: every read past it holds a chunk
            // to wait at the pacer.
            self.total = needed;
            self.trying = None;
            self.limit = Limit::Throttled;
            self.settling = true;
            return true;
        }
        // A far store is seen by the first window's first bytes, whether
        // or not its read times are judged (a first window settles, and a
        // loader's first windows land in fresh memory): the count goes to
        // its most at once, judged later as any raise, against this
        // window's median, which is the base too (the reads at the most
        // are compared with it to see them queue). (Waiting for a judged
        // window kept a whole object's read at 8 parts for its first 0.3 s
        // of 1.2.) The first window only: its requests went out together
        // to a server not yet busy, and a near one answered some at once;
        // later windows' first bytes wait behind the bodies a loaded host
        // sends (on 127.0.0.1, a second window of 7 to 139 ms).
        if !self.jumped && !f.is_empty() {
            self.jumped = true;
            if self.far() && self.target.is_none() && paced.is_none() && self.max > self.total {
                self.base = Some(median);
                self.trying = Some(Trial::Raise {
                    was: self.total,
                    median,
                });
                self.total = self.max;
                self.limit = Limit::Memory;
                self.settling = true;
                return true;
            }
        }
        if std::mem::take(&mut self.settling) || fresh {
            self.settling = fresh;
            return false;
        }
        self.last_median = Some(median);
        let base = match self.base {
            Some(b) => (b * BASE_DRIFT).min(median),
            None => median,
        };
        self.base = Some(base);
        let before = self.total;
        let mut next = self.total;
        // What the window carried by Little's law: `n` reads of time `T`
        // carry `n / T` reads a second. A window's own rate is no judge:
        // completions come in bursts (a shard's reads end together), and
        // a window of 8-64 of them spans anything from a millisecond to a
        // read's time.
        let carried = self.total as f64 / median;
        let carried_before = self.last_carried.replace(carried);
        let queueing = median / base > SHRINK_ABOVE;
        match self.trying.take() {
            Some(Trial::Raise {
                was,
                median: was_median,
            }) => {
                let gain = (self.total as f64 / was as f64) * (was_median / median);
                if gain >= PAID {
                    self.limit = Limit::Growing;
                    next = self.raised();
                    self.trying = Some(Trial::Raise {
                        was: self.total,
                        median,
                    });
                } else {
                    // Bought nothing: the reads were already as many as
                    // the link carries.
                    self.limit = Limit::Saturated;
                    self.doubling = false;
                    self.hold = HOLD;
                    next = was;
                }
            }
            Some(Trial::Shrink { was, rate }) => {
                self.limit = Limit::Saturated;
                if carried * PAID >= rate {
                    // The fewer carried about as much: the reads were
                    // queueing. Fewer still while they queue.
                    if queueing {
                        next = self.shrunk(carried);
                    }
                } else {
                    // The fewer carried less: what slowed the reads was
                    // not their number.
                    self.hold = HOLD;
                    next = was;
                }
            }
            None if queueing => {
                self.limit = Limit::Saturated;
                self.doubling = false;
                next = self.shrunk(carried.max(carried_before.unwrap_or(0.0)));
            }
            None if self.hold > 0 => self.hold -= 1,
            None => {
                self.limit = Limit::Growing;
                next = self.raised();
                self.trying = Some(Trial::Raise {
                    was: self.total,
                    median,
                });
            }
        }
        // A paced host's: what its rate keeps busy, and no more.
        if let Some(needed) = paced
            && next >= needed
        {
            next = needed;
            self.trying = None;
            self.limit = Limit::Throttled;
        }
        // What the target needs by Little's law, with a tenth spare.
        if let Some(t) = self.target {
            let needed = ((t * median / mean_len.max(1.0)) * 1.1).ceil() as usize;
            if next >= needed {
                next = needed;
                self.trying = None;
                self.limit = Limit::Target;
            }
        }
        if next >= self.max {
            next = self.max;
            if self.limit == Limit::Growing {
                // A raise to the most is still judged (below): one that
                // bought nothing is undone.
                self.limit = Limit::Memory;
            }
        }
        self.total = next.clamp(self.min, self.max);
        if self.trying.is_some_and(|t| t.was() == self.total) {
            // The change could not happen (at the most or the fewest):
            // nothing to try.
            self.trying = None;
        }
        self.settling = self.total != before;
        self.total != before
    }

    /// The count the window's `reads` keep busy when all of them were a
    /// paced host's: its rate × their median time on the wire, with
    /// `PACED_SPARE`.
    fn paced_need(&mut self, reads: usize) -> Option<usize> {
        let mut wire = std::mem::take(&mut self.window_wire);
        let rate = self.paced.take()?;
        // Only where every read of the window was a paced host's: one
        // throttling host's rate says nothing of another's reads.
        if wire.len() < reads {
            return None;
        }
        wire.sort_by(f64::total_cmp);
        Some((rate * wire[wire.len() / 2] * PACED_SPARE).ceil() as usize)
    }

    /// Whether the last window's first bytes say a far store: late in the
    /// median, and none early.
    fn far(&self) -> bool {
        self.last_first_byte.is_some_and(|f| f > FAR_FIRST_BYTE)
            && self.last_first_floor.is_some_and(|f| f > NEAR_FLOOR)
    }

    /// A quarter fewer, tried against `rate` (reads a second).
    fn shrunk(&mut self, rate: f64) -> usize {
        self.trying = Some(Trial::Shrink {
            was: self.total,
            rate,
        });
        ((self.total as f64 * SHRINK) as usize).max(1)
    }

    fn raised(&self) -> usize {
        let step = if self.doubling {
            self.total / 2
        } else {
            self.total / 4
        };
        self.total + step.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: u64 = 8 << 20;

    /// A link of `conns_cap` connections' worth of capacity: a read takes
    /// `latency + len / per_conn` while at most `cap` are in flight, and
    /// proportionally longer past it (the reads share the link).
    fn run(
        c: &mut InFlight,
        latency: f64,
        per_conn: f64,
        cap_bytes_per_s: f64,
        windows: usize,
    ) -> Vec<usize> {
        run_with(c, latency, per_conn, cap_bytes_per_s, windows, false)
    }

    /// `bursts`: the reads complete in bursts of 1 to `n` at once (a
    /// shard's reads, asked together, end together), at the mean rate.
    fn run_with(
        c: &mut InFlight,
        latency: f64,
        per_conn: f64,
        cap_bytes_per_s: f64,
        windows: usize,
        bursts: bool,
    ) -> Vec<usize> {
        let mut now = 0.0;
        let mut seen = Vec::new();
        // A burst's size, drawn by a fixed LCG; reads left in it.
        let mut lcg = 12345u64;
        let mut left = 0usize;
        for _ in 0..windows {
            let n = c.total();
            // n reads share the link: each gets min(per_conn, cap / n).
            let each = per_conn.min(cap_bytes_per_s / n as f64);
            let t = latency + LEN as f64 / each;
            let reads = MIN_WINDOW.max(n / 2);
            for i in 0..reads {
                // Completions spread over the read time, or n at once.
                if !bursts {
                    now += t / n as f64;
                } else if left == 0 {
                    lcg = lcg
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    left = 1 + (lcg >> 33) as usize % n;
                    now += t * left as f64 / n as f64;
                }
                left = left.saturating_sub(1);
                let jitter = 1.0 + 0.05 * ((i % 3) as f64 - 1.0);
                c.record(
                    now,
                    Read {
                        bytes: LEN,
                        secs: t * jitter,
                        first_byte: Some(latency),
                        ..Read::default()
                    },
                );
            }
            seen.push(c.total());
        }
        seen
    }

    #[test]
    fn grows_to_the_bandwidth_delay_product() {
        // S3-like: 115 ms per read alone, a 3 GB/s link. The knee is at
        // 3e9 * 0.115 / 8 MiB = 41 reads.
        let mut c = InFlight::new(16, 4, 256, None);
        let seen = run(&mut c, 0.022, 90e6, 3e9, 40);
        let last = *seen.last().unwrap();
        assert!(
            (35..=90).contains(&last),
            "settled at {last} reads in flight: {seen:?}"
        );
        assert_ne!(c.limit(), Limit::Growing, "{seen:?}");
    }

    #[test]
    fn completions_in_bursts_still_grow_it() {
        // The same link, its reads completing together: a window's own
        // rate swings from a burst's instant to a read's time, the medians
        // do not.
        let mut c = InFlight::new(16, 4, 256, None);
        let seen = run_with(&mut c, 0.022, 90e6, 3e9, 40, true);
        let last = *seen.last().unwrap();
        assert!(
            (35..=90).contains(&last),
            "settled at {last} reads in flight: {seen:?}"
        );
    }

    #[test]
    fn stays_low_where_the_link_answers_at_once() {
        // Loopback-like: no latency, one connection nearly fills the link.
        let mut c = InFlight::new(16, 4, 256, None);
        let seen = run(&mut c, 0.0001, 3e9, 4e9, 60);
        // Raises are tried now and then and undone: most of the time the
        // count is where it started.
        let mut tail = seen[20..].to_vec();
        tail.sort();
        assert_eq!(tail[tail.len() / 2], 16, "{seen:?}");
        assert!(seen.iter().all(|&n| n <= 24), "{seen:?}");
    }

    #[test]
    fn memory_caps_it_and_says_so() {
        let mut c = InFlight::new(16, 4, 24, None);
        let seen = run(&mut c, 0.022, 90e6, 12.5e9, 30);
        assert_eq!(*seen.last().unwrap(), 24);
        assert_eq!(c.limit(), Limit::Memory);
        assert_eq!(c.limit().name(), "memory");
    }

    #[test]
    fn a_target_caps_it_at_what_it_needs() {
        // 1 GB/s at ~115 ms per 8 MiB read: 1e9 * 0.115 / 8 MiB = 13.7,
        // 15 with the tenth spare.
        let mut c = InFlight::new(4, 2, 256, Some(1e9));
        let seen = run(&mut c, 0.022, 90e6, 12.5e9, 30);
        let last = *seen.last().unwrap();
        assert!((13..=17).contains(&last), "{seen:?}");
        assert_eq!(c.limit(), Limit::Target);
    }

    #[test]
    fn shrinks_when_reads_queue() {
        // Far past the knee (a 1 GB/s link, 200 in flight): reads take
        // ~13x their base once the base is learned at a small count.
        let mut c = InFlight::new(8, 4, 256, None);
        run(&mut c, 0.022, 90e6, 1e9, 3);
        c.total = 200;
        let seen = run(&mut c, 0.022, 90e6, 1e9, 20);
        assert!(*seen.last().unwrap() < 60, "{seen:?}");
    }

    /// Windows of reads whose time `time(window, count)` gives, each
    /// with `first_byte` as its first-byte latency; returns the count
    /// after each window.
    fn run_model(
        c: &mut InFlight,
        windows: usize,
        first_byte: Option<f64>,
        time: impl Fn(usize, usize) -> f64,
    ) -> Vec<usize> {
        run_fresh(c, windows, first_byte, time, |_| false)
    }

    /// `run_model` where the reads of the windows `fresh(window)` says
    /// landed in memory used for the first time.
    fn run_fresh(
        c: &mut InFlight,
        windows: usize,
        first_byte: Option<f64>,
        time: impl Fn(usize, usize) -> f64,
        fresh: impl Fn(usize) -> bool,
    ) -> Vec<usize> {
        let mut now = 0.0;
        let mut seen = Vec::new();
        for w in 0..windows {
            let n = c.total();
            let t = time(w, n);
            for _ in 0..MIN_WINDOW.max(n / 2) {
                now += t / n as f64;
                c.record(
                    now,
                    Read {
                        bytes: LEN,
                        secs: t,
                        first_byte,
                        fresh: fresh(w),
                        ..Read::default()
                    },
                );
            }
            seen.push(c.total());
        }
        seen
    }

    /// S3-like reads (22 ms to the first byte, 90 MB/s a connection) on
    /// a link of `cap` bytes a second.
    fn s3_on(cap: f64) -> impl Fn(usize, usize) -> f64 {
        move |_, n| 0.022 + LEN as f64 / 90e6f64.min(cap / n as f64)
    }

    #[test]
    fn a_stall_that_fewer_reads_do_not_cure_leaves_the_count_where_it_was() {
        // Windows 30 to 35 take 3x (a first touch of fresh memory, a
        // server's tail): a quarter fewer reads then carry less than the
        // count did before, and the shrink is undone. Without first-byte
        // times (the thread backend's reads) the count climbs to the knee.
        let mut c = InFlight::new(16, 4, 256, None);
        let s3 = s3_on(3e9);
        let seen = run_model(&mut c, 60, None, |w, n| {
            let t = s3(w, n);
            if (30..36).contains(&w) { 3.0 * t } else { t }
        });
        // The count probes a quarter more now and then: its usual level
        // is the least over a span.
        let before = *seen[15..30].iter().min().unwrap();
        assert!(before >= 30, "{seen:?}");
        let after = *seen[36..].iter().min().unwrap();
        assert!(after >= before, "fell to {after} from {before}: {seen:?}");
        // Control: the same count on a link that became a third as fast
        // for good (another tenant; its reads too take ~3x): fewer reads
        // carry as much, and the count shrinks.
        let mut c = InFlight::new(16, 4, 256, None);
        let slower = s3_on(1e9);
        let seen = run_model(&mut c, 60, None, |w, n| {
            if w < 30 { s3(w, n) } else { slower(w, n) }
        });
        assert!(*seen.last().unwrap() < before, "{seen:?}");
    }

    #[test]
    fn a_far_stores_first_byte_sends_the_count_to_the_most_at_once() {
        // 3 GB/s: the knee at 41 reads. The first-byte latency says far
        // after the first window: the count goes to the most and, judged
        // as a raise, is kept (it carried more), then shrinks towards the
        // knee.
        let mut c = InFlight::new(16, 4, 256, None);
        let seen = run_model(&mut c, 40, Some(0.022), s3_on(3e9));
        assert_eq!(seen[0], 256, "{seen:?}");
        assert!(seen[2..].iter().all(|&n| n >= 41), "{seen:?}");
        let last = *seen.last().unwrap();
        assert!((41..=120).contains(&last), "{seen:?}");
        // Control: the same link, reads without first-byte times, climbs
        // by halves: later past the knee.
        let mut c = InFlight::new(16, 4, 256, None);
        let seen = run_model(&mut c, 40, None, s3_on(3e9));
        assert!(seen[..4].iter().all(|&n| n < 41), "{seen:?}");
    }

    #[test]
    fn a_jump_is_not_judged_while_its_reads_touch_fresh_memory() {
        // 3 GB/s: the jump to the most (after window 1) pays. Its first
        // three windows' reads land in chunks never used before and take
        // 6x (a VM's first touch at 2 ms a MB): left out, the jump is
        // judged after them and kept.
        let s3 = s3_on(3e9);
        let touching = |w: usize| (2..5).contains(&w);
        let slow = |w, n| {
            if touching(w) {
                6.0 * s3(w, n)
            } else {
                s3(w, n)
            }
        };
        let mut c = InFlight::new(16, 4, 256, None);
        let seen = run_fresh(&mut c, 12, Some(0.022), slow, touching);
        assert_eq!(seen[1], 256, "{seen:?}");
        assert!(seen[1..].iter().all(|&n| n >= 41), "{seen:?}");
        // Control: the same windows, not said to be fresh: the jump is
        // judged on them, bought nothing, and is undone.
        let mut c = InFlight::new(16, 4, 256, None);
        let seen = run_model(&mut c, 12, Some(0.022), slow);
        assert_eq!(seen[1], 256, "{seen:?}");
        assert!(seen[2..].iter().any(|&n| n <= 24), "{seen:?}");
    }

    #[test]
    fn fresh_memory_holds_judgement_only_while_it_lasts() {
        // Every window's reads fresh for the first 10, then none: the
        // count changes only after. A near store (no jump).
        let mut c = InFlight::new(16, 4, 256, None);
        let seen = run_fresh(&mut c, 20, Some(0.0002), s3_on(3e9), |w| w < 10);
        assert!(seen[..10].iter().all(|&n| n == 16), "{seen:?}");
        assert!(seen[10..].iter().any(|&n| n > 16), "{seen:?}");
        // A far store's jump is no judgement: it comes with the first
        // window, fresh or not, and is judged once the windows are not.
        let mut c = InFlight::new(16, 4, 256, None);
        let seen = run_fresh(&mut c, 20, Some(0.022), s3_on(3e9), |w| w < 10);
        assert!(seen[..10].iter().all(|&n| n == 256), "{seen:?}");
        assert!(seen[10..].iter().any(|&n| n < 256), "{seen:?}");
    }

    #[test]
    fn a_far_store_on_a_full_link_undoes_the_jump() {
        // 22 ms to the first byte but a 200 MB/s link, full at 16 reads:
        // the reads at the most took as much longer as they were more.
        let mut c = InFlight::new(16, 4, 256, None);
        let seen = run_model(&mut c, 12, Some(0.022), s3_on(200e6));
        assert_eq!(seen[1], 256, "{seen:?}");
        assert!(seen[3..].iter().all(|&n| n <= 20), "{seen:?}");
    }

    /// The first window's reads, each with its first-byte latency (ms).
    fn first_window(c: &mut InFlight, first_bytes_ms: &[f64]) {
        for (i, &f) in first_bytes_ms.iter().enumerate() {
            let read = Read {
                bytes: LEN,
                secs: 0.1,
                first_byte: Some(f / 1000.0),
                ..Read::default()
            };
            c.record(i as f64 * 0.01, read);
        }
    }

    #[test]
    fn a_near_server_under_load_is_not_taken_for_a_far_store() {
        // The emulator on 127.0.0.1 with no model: its first answers at
        // once, the later ones behind the bodies it sends. The median says
        // far; the floor does not.
        let mut c = InFlight::new(16, 4, 256, None);
        first_window(&mut c, &[0.3, 1.0, 6.0, 8.0, 16.0, 17.0, 18.0, 23.0]);
        assert_eq!(c.total(), 16);
        // Control: the same latencies 3 ms later, none early: far.
        let mut c = InFlight::new(16, 4, 256, None);
        first_window(&mut c, &[3.3, 4.0, 9.0, 11.0, 19.0, 20.0, 21.0, 26.0]);
        assert_eq!(c.total(), 256);
    }

    #[test]
    fn a_near_store_never_jumps() {
        // Reads as slow as a far store's (a shared 1 GB/s link: 16 reads
        // of 8 MiB take 134 ms) but their first byte at 0.2 ms.
        let mut c = InFlight::new(16, 4, 256, None);
        let seen = run_model(&mut c, 20, Some(0.0002), |_, n| {
            0.0002 + LEN as f64 / (1e9 / n as f64)
        });
        assert!(seen.iter().all(|&n| n <= 24), "{seen:?}");
    }

    /// Windows of reads from a host that takes `rate` requests a second:
    /// each spends `wire` s on the wire, and `n` reads in flight take
    /// n / rate each when that is longer (they wait at the pacer for their
    /// turn); `paced`: the reads say so. The count after each window.
    fn run_paced(
        c: &mut InFlight,
        windows: usize,
        rate: f64,
        wire: f64,
        paced: bool,
    ) -> Vec<usize> {
        let mut now = 0.0;
        let mut seen = Vec::new();
        for _ in 0..windows {
            let n = c.total();
            let t = wire.max(n as f64 / rate);
            for i in 0..MIN_WINDOW.max(n / 2) {
                now += 1.0 / rate.min(n as f64 / wire);
                let jitter = 1.0 + 0.3 * ((i % 3) as f64 - 1.0);
                let read = Read {
                    bytes: LEN,
                    secs: t * jitter,
                    first_byte: Some(0.022),
                    on_wire: Some(wire * jitter),
                    paced: paced.then_some(rate),
                    fresh: false,
                };
                c.record(now, read);
            }
            seen.push(c.total());
        }
        seen
    }

    #[test]
    fn a_paced_host_gets_what_its_rate_keeps_busy() {
        // 200 GETs/s, 35 ms on the wire: 7 reads carry the rate, 14 with
        // the spare, from the far store's most at once.
        let mut c = InFlight::new(92, 4, 92, None);
        let seen = run_paced(&mut c, 20, 200.0, 0.035, true);
        assert!(seen.iter().all(|&n| (14..=15).contains(&n)), "{seen:?}");
        assert_eq!(c.limit(), Limit::Throttled);
        assert_eq!(c.limit().name(), "throttled");
        // Control: the same reads not said to be paced are judged by their
        // whole time, the pacer's wait in it: the count stays far above
        // what the rate needs, each read past it holding a chunk.
        let mut c = InFlight::new(92, 4, 92, None);
        let seen = run_paced(&mut c, 20, 200.0, 0.035, false);
        assert!(seen[..6].iter().all(|&n| n > 20), "{seen:?}");
    }

    #[test]
    fn nothing_changes_before_a_window_is_in() {
        let mut c = InFlight::new(16, 4, 64, None);
        for i in 0..7 {
            let read = Read {
                bytes: LEN,
                secs: 0.1,
                first_byte: Some(0.02),
                ..Read::default()
            };
            assert!(!c.record(i as f64, read));
        }
        assert_eq!(c.total(), 16);
        assert_eq!(c.limit(), Limit::Probing);
        assert!(c.read_time().is_none() && c.bdp().is_none());
    }
}
