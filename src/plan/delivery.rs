//! Step 5 of the model: the round-robin `Delivery` of batches over a
//! consumer's streams, and the pure simulation of a plan on sample indices
//! (each stream through its shuffle buffer into batches, delivered round
//! robin, tails merged) that gives a consumer's order (`consumer_order`),
//! what a resume replays (`replayed`), and what a layout delivered before an
//! elastic cut (`delivered_by`).

use super::{ConsumerPlan, Delivered, PlanOptions, Segment, ShuffleBuffer, plan_epoch};
use crate::error::{Error, Result};

/// The round-robin delivery of one epoch over `streams` streams: tells the
/// caller which stream to take the next batch from, and collects the short
/// last batches for the end.
#[derive(Debug, Clone)]
pub struct Delivery {
    next: usize,
    done: Vec<bool>,
}

impl Delivery {
    pub fn new(streams: usize) -> Self {
        Delivery {
            next: 0,
            done: vec![false; streams],
        }
    }

    /// The stream whose item comes next, `None` once every stream ended.
    pub fn next_stream(&mut self) -> Option<usize> {
        let n = self.done.len();
        for k in 0..n {
            let s = (self.next + k) % n;
            if !self.done[s] {
                self.next = (s + 1) % n;
                return Some(s);
            }
        }
        None
    }

    /// Stream `s` gave its tail: it ends. The next stream to ask stays as
    /// `next_stream` left it.
    pub fn ended(&mut self, s: usize) {
        self.done[s] = true;
    }
}

/// A sample of the plan: shard, index in the shard, and whether it is a pad.
pub type SampleRef = (usize, u64, bool);

/// The batches consumer `opts.consumer` delivers in `epoch`, as sample
/// references, computed without I/O. Needs every count.
pub fn consumer_order(
    opts: &PlanOptions,
    counts: &[u64],
    epoch: u64,
    delivered: Option<&Delivered>,
) -> Result<Vec<Vec<SampleRef>>> {
    let known: Vec<Option<u64>> = counts.iter().map(|&c| Some(c)).collect();
    let plan = plan_epoch(opts, &known, epoch, delivered)?;
    order_of_plan(opts, counts, &plan)
}

/// [`consumer_order`] of a nominal epoch (`PlanOptions::nominal`): planned
/// without the counts, as the engine plans it, and run on them. A consumer
/// whose shards hold fewer than the nominal samples comes out short (the
/// engine's error).
pub fn nominal_order(
    opts: &PlanOptions,
    counts: &[u64],
    epoch: u64,
) -> Result<Vec<Vec<SampleRef>>> {
    let unknown = vec![None; counts.len()];
    let plan = plan_epoch(opts, &unknown, epoch, None)?;
    order_of_plan(opts, counts, &plan)
}

/// [`consumer_order`] of a plan already made.
pub fn order_of_plan(
    opts: &PlanOptions,
    counts: &[u64],
    plan: &ConsumerPlan,
) -> Result<Vec<Vec<SampleRef>>> {
    Ok(simulate(opts, counts, plan, |_, _, seg, i| {
        (seg.shard, i, seg.pad)
    }))
}

/// Per stream, per segment (by its place in the stream), the indices of the
/// samples delivered in the plan's first `batches` batches, sorted: what a
/// resume replays without reading their bytes.
pub fn replayed(
    opts: &PlanOptions,
    counts: &[u64],
    plan: &ConsumerPlan,
    batches: u64,
) -> Vec<Vec<Vec<u64>>> {
    let order = simulate(opts, counts, plan, |s, j, _, i| (s, j, i));
    let mut out: Vec<Vec<Vec<u64>>> = plan
        .streams
        .iter()
        .map(|segs| vec![Vec::new(); segs.len()])
        .collect();
    for b in order.iter().take(batches as usize) {
        for &(s, j, i) in b {
            out[s][j].push(i);
        }
    }
    for x in out.iter_mut().flatten() {
        x.sort_unstable();
    }
    out
}

/// Runs the plan's order on sample indices: each stream's samples through
/// its shuffle buffer into batches, round-robin delivery, tails merged.
/// `item(stream, segment place, segment, index)` names each sample.
fn simulate<T: Copy>(
    opts: &PlanOptions,
    counts: &[u64],
    plan: &ConsumerPlan,
    item: impl Fn(usize, usize, &Segment, u64) -> T,
) -> Vec<Vec<T>> {
    let bs = opts.batch_size.max(1);
    // Per stream: its batches and its tail, as the workers make them.
    let mut per_stream: Vec<(std::collections::VecDeque<Vec<T>>, Vec<T>)> = Vec::new();
    for (s, segs) in plan.streams.iter().enumerate() {
        let mut buf =
            (opts.shuffle_buffer > 0).then(|| ShuffleBuffer::for_stream(opts, plan.epoch, s));
        let mut batches = std::collections::VecDeque::new();
        let mut open = Vec::with_capacity(bs);
        let mut emit = |x: T, open: &mut Vec<T>| {
            open.push(x);
            if open.len() == bs {
                batches.push_back(std::mem::take(open));
            }
        };
        for (j, seg) in segs.iter().enumerate() {
            let to = seg.to.unwrap_or(counts[seg.shard]);
            for i in seg.from..to {
                if !seg.wants(i) {
                    continue;
                }
                let x = item(s, j, seg, i);
                match &mut buf {
                    None => emit(x, &mut open),
                    Some(b) => {
                        if let Some(y) = b.push(x) {
                            emit(y, &mut open)
                        }
                    }
                }
            }
        }
        if let Some(b) = &mut buf {
            while let Some(y) = b.drain_one() {
                emit(y, &mut open);
            }
        }
        per_stream.push((batches, open));
    }
    let mut out = Vec::new();
    let mut d = Delivery::new(per_stream.len());
    let mut tails: Vec<Vec<T>> = (0..per_stream.len()).map(|_| Vec::new()).collect();
    while let Some(s) = d.next_stream() {
        match per_stream[s].0.pop_front() {
            Some(b) => out.push(b),
            None => {
                tails[s] = std::mem::take(&mut per_stream[s].1);
                d.ended(s);
            }
        }
    }
    let mut carry: Vec<T> = Vec::with_capacity(bs);
    for t in tails {
        for x in t {
            carry.push(x);
            if carry.len() == bs {
                out.push(std::mem::take(&mut carry));
            }
        }
    }
    if !carry.is_empty() && !opts.drop_last {
        out.push(carry);
    }
    if plan.nominal {
        // A nominal epoch ends after its whole batches of `samples`; one
        // whose shards hold fewer is the engine's error.
        out.truncate((plan.samples.unwrap_or(0) / bs as u64) as usize);
    }
    out
}

/// The samples of `epoch` that the consumers of a layout delivered, given
/// how many batches each one handed out (`batches[c]`).
pub fn delivered_by(
    opts: &PlanOptions,
    counts: &[u64],
    epoch: u64,
    previous: Option<&Delivered>,
    batches: &[u64],
) -> Result<Delivered> {
    let mut d: Delivered = vec![Vec::new(); counts.len()];
    for (c, &n) in batches.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let o = PlanOptions {
            consumer: c as u64,
            consumers: batches.len() as u64,
            ..opts.clone()
        };
        let order = consumer_order(&o, counts, epoch, previous)?;
        if n as usize > order.len() {
            return Err(Error::State(format!(
                "consumer {c} delivered {n} batches but its epoch has {}",
                order.len()
            )));
        }
        for b in &order[..n as usize] {
            for &(shard, i, _) in b {
                d[shard].push(i);
            }
        }
    }
    if let Some(p) = previous {
        for (shard, x) in p.iter().enumerate() {
            d[shard].extend_from_slice(x);
        }
    }
    for x in &mut d {
        x.sort_unstable();
        x.dedup();
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Remainder;
    use crate::plan::fixtures::{all_orders, flat, layout, opts};
    use crate::plan::resume::{State, fingerprint, start_from};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn a_resume_replays_exactly_the_samples_before_the_cut(
            (counts, c, s, seed, buf, bs) in layout(), cut in any::<prop::sample::Index>()
        ) {
            // What the engine does at a resume: start_from says how many
            // batches to skip, `replayed` which samples of which segment
            // those batches held (they are passed on unread). They must be
            // exactly the samples of the uninterrupted run's first batches.
            let o = opts(c, s, seed, buf, bs, Remainder::Pad);
            let fp = fingerprint(&[("a", Some(1))], &o);
            for k in 0..c {
                let o = PlanOptions { consumer: k, ..o.clone() };
                let full = consumer_order(&o, &counts, 1, None).unwrap();
                let at = cut.index(full.len() + 1) as u64;
                let state = State {
                    fingerprint: fp, epoch: 1, consumers: c, consumer: k, streams: s as u64,
                    batches: at, samples: flat(&full[..at as usize]).len() as u64, history: vec![],
                };
                let state = State::decode(&state.encode()).unwrap();
                let start = start_from(&[state], fp, &o).unwrap();
                prop_assert_eq!((start.epoch, start.skip_batches), (1, at));
                prop_assert!(start.history.is_empty());
                let known: Vec<Option<u64>> = counts.iter().map(|&n| Some(n)).collect();
                let plan = plan_epoch(&o, &known, 1, None).unwrap();
                let replay = replayed(&o, &counts, &plan, start.skip_batches);
                let mut from_replay: Vec<SampleRef> = Vec::new();
                for (st, segs) in plan.streams.iter().enumerate() {
                    for (j, seg) in segs.iter().enumerate() {
                        for &i in &replay[st][j] {
                            prop_assert!(seg.wants(i));
                            from_replay.push((seg.shard, i, seg.pad));
                        }
                    }
                }
                let mut head = flat(&full[..at as usize]);
                head.sort_unstable();
                from_replay.sort_unstable();
                prop_assert_eq!(from_replay, head);
            }
        }
    }

    #[test]
    fn epochs_and_seeds_change_the_order() {
        let counts = vec![20; 10];
        let o = opts(1, 2, 7, 16, 4, Remainder::Pad);
        let a = all_orders(&o, &counts, 0);
        assert_ne!(a, all_orders(&o, &counts, 1));
        let o2 = PlanOptions {
            seed: 8,
            ..o.clone()
        };
        assert_ne!(a, all_orders(&o2, &counts, 0));
    }

    #[test]
    fn the_order_is_pinned() {
        // Any change to the split, the shuffle buffer or the delivery changes
        // the order, and with it what every saved resume state means: it
        // must be deliberate (and then this value changes with a note).
        let counts = vec![7, 0, 12, 5, 9, 3, 11];
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for c in 0..3 {
            let o = PlanOptions {
                consumer: c,
                ..opts(3, 2, 99, 10, 4, Remainder::Pad)
            };
            for b in consumer_order(&o, &counts, 2, None).unwrap() {
                for (s, i, pad) in b {
                    for v in [s as u64, i, u64::from(pad)] {
                        h = (h ^ v).wrapping_mul(0x0100_0000_01b3);
                    }
                }
                h = (h ^ 0xff).wrapping_mul(0x0100_0000_01b3);
            }
        }
        assert_eq!(h, PINNED_ORDER);
    }

    const PINNED_ORDER: u64 = 16484381260921920728;
}
