//! Resume states: the few bytes a consumer saves to continue an epoch later,
//! and the rule that turns the states given at open into where to start.
//!
//! A state says: this dataset and these epoch settings (a fingerprint), this
//! epoch, this layout (consumers, this consumer, streams), and how many
//! batches this consumer handed out. The plan is deterministic, so that is
//! enough to know exactly which samples were delivered.
//!
//! The rule at open:
//! - no state: epoch 0 from the start;
//! - states at an epoch boundary (0 batches into it): that epoch, any layout;
//! - the same layout: this consumer's own state among those given; the
//!   epoch continues exactly where the uninterrupted run would have been
//!   (its batches before the cut are replayed and skipped);
//! - another layout (elastic): the states of *every* consumer of the old
//!   layout; the samples they delivered are left out and the rest of the
//!   epoch is split over the new layout. The history of such cuts within the
//!   epoch travels in every later state, so a resumed run can be cut again.

use crate::error::{Error, Result};
use crate::plan::{Delivered, PlanOptions, delivered_by};

const MAGIC: &[u8; 4] = b"RFST";
const VERSION: u32 = 1;

/// Bounds on what a state may say, so that one from outside cannot make the
/// loader allocate or compute without end: consumers per layout, workers
/// (the `workers` key's own bound), elastic cuts per epoch, and the epoch.
pub const MAX_CONSUMERS: u64 = 1 << 16;
const MAX_STREAMS: u64 = 1024;
const MAX_ROUNDS: u64 = 64;
pub const MAX_EPOCH: u64 = 1 << 48;

/// An elastic cut earlier in the epoch: the old layout and each of its
/// consumers' batch counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    pub streams: u64,
    pub batches: Vec<u64>,
}

/// A consumer's position, as saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub fingerprint: u64,
    pub epoch: u64,
    pub consumers: u64,
    pub consumer: u64,
    pub streams: u64,
    /// Batches this consumer handed out in `epoch` (skipped ones included).
    pub batches: u64,
    /// Samples in those batches.
    pub samples: u64,
    pub history: Vec<Round>,
}

impl State {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(80);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        for v in [
            self.fingerprint,
            self.epoch,
            self.consumers,
            self.consumer,
            self.streams,
            self.batches,
            self.samples,
            self.history.len() as u64,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for r in &self.history {
            out.extend_from_slice(&r.streams.to_le_bytes());
            out.extend_from_slice(&(r.batches.len() as u64).to_le_bytes());
            for b in &r.batches {
                out.extend_from_slice(&b.to_le_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<State> {
        let bad = |why: &str| Error::State(format!("not a ringfeed resume state ({why})"));
        if bytes.len() < 8 || &bytes[..4] != MAGIC {
            return Err(bad("no RFST header"));
        }
        let version = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(Error::State(format!(
                "version {version}; this build reads version {VERSION}"
            )));
        }
        let mut rest = &bytes[8..];
        let mut word = || -> Result<u64> {
            if rest.len() < 8 {
                return Err(bad("truncated"));
            }
            let (w, r) = rest.split_at(8);
            rest = r;
            Ok(u64::from_le_bytes(w.try_into().expect("8 bytes")))
        };
        let mut s = State {
            fingerprint: word()?,
            epoch: word()?,
            consumers: word()?,
            consumer: word()?,
            streams: word()?,
            batches: word()?,
            samples: word()?,
            history: Vec::new(),
        };
        let rounds = word()?;
        if rounds > MAX_ROUNDS {
            return Err(bad("too many elastic cuts"));
        }
        // The consumers of all earlier layouts: each is simulated at open.
        let mut total = 0u64;
        for _ in 0..rounds {
            let streams = word()?;
            let n = word()?;
            if n == 0 || n > MAX_CONSUMERS || streams == 0 || streams > MAX_STREAMS {
                return Err(bad("bad layout of an earlier cut"));
            }
            total += n;
            if total > MAX_CONSUMERS {
                return Err(bad("too many earlier consumers"));
            }
            let batches = (0..n).map(|_| word()).collect::<Result<Vec<_>>>()?;
            s.history.push(Round { streams, batches });
        }
        if !rest.is_empty() {
            return Err(bad("trailing bytes"));
        }
        if s.consumers == 0
            || s.consumers > MAX_CONSUMERS
            || s.consumer >= s.consumers
            || s.streams == 0
            || s.streams > MAX_STREAMS
        {
            return Err(bad("bad layout"));
        }
        if s.epoch > MAX_EPOCH || s.samples < s.batches {
            return Err(bad("bad position"));
        }
        Ok(s)
    }

    /// Hex, for JSON configurations.
    pub fn to_hex(&self) -> String {
        self.encode().iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(text: &str) -> Result<State> {
        if text.len() % 2 != 0 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::State(
                "expected the hex string a loader's state gave".into(),
            ));
        }
        let bytes: Vec<u8> = (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digits"))
            .collect();
        State::decode(&bytes)
    }
}

/// FNV-1a over the values that decide the order, layout aside: each shard's
/// name, and its size where it is known at open (local files, manifests,
/// listings; a remote shard named one by one is sized only when it is read).
pub fn fingerprint(shards: &[(&str, Option<u64>)], opts: &PlanOptions) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (name, size) in shards {
        eat(name.as_bytes());
        eat(&[0]);
        // Known sizes hash as they always did, so states saved before
        // sizes could be unknown still match.
        if let Some(size) = size {
            eat(&size.to_le_bytes());
        }
    }
    for v in [
        opts.seed,
        u64::from(opts.shuffle),
        opts.shuffle_buffer as u64,
        opts.shuffle_initial as u64,
        u64::from(opts.resampled),
        opts.samples_per_epoch,
        u64::from(opts.remainder == crate::plan::Remainder::Drop),
        opts.batch_size as u64,
        u64::from(opts.drop_last),
    ] {
        eat(&v.to_le_bytes());
    }
    // A nominal epoch's length: states of exact epochs hash as before.
    if let Some(l) = opts.nominal {
        eat(b"nominal");
        eat(&l.to_le_bytes());
    }
    h
}

/// Where a loader starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Start {
    pub epoch: u64,
    /// Elastic cuts within `epoch` (their delivered samples are left out).
    pub history: Vec<Round>,
    /// Batches (and their samples) of `epoch` to replay and skip.
    pub skip_batches: u64,
    pub skip_samples: u64,
}

impl Start {
    /// True when the plan needs every shard's sample count to start here.
    pub fn needs_counts(&self) -> bool {
        !self.history.is_empty()
    }

    /// The samples of the epoch delivered before the cuts in `history`.
    pub fn delivered(&self, opts: &PlanOptions, counts: &[u64]) -> Result<Option<Delivered>> {
        let mut d: Option<Delivered> = None;
        for r in &self.history {
            let o = PlanOptions {
                streams: r.streams as usize,
                ..opts.clone()
            };
            d = Some(delivered_by(
                &o,
                counts,
                self.epoch,
                d.as_ref(),
                &r.batches,
            )?);
        }
        Ok(d)
    }
}

/// Applies the rule of this module's comment.
pub fn start_from(states: &[State], fingerprint: u64, opts: &PlanOptions) -> Result<Start> {
    let Some(first) = states.first() else {
        return Ok(Start::default());
    };
    for s in states {
        if s.fingerprint != fingerprint {
            return Err(Error::State(
                "taken with another dataset or other epoch settings (the shard list, `seed`, \
                 `shuffle`, `shuffle_buffer`, `shuffle_initial`, `resampled`, `samples_per_epoch`, \
                 `remainder`, `batch_size` and `drop_last` must be the same)"
                    .into(),
            ));
        }
        if (s.epoch, &s.history, s.consumers, s.streams)
            != (first.epoch, &first.history, first.consumers, first.streams)
        {
            return Err(Error::State(format!(
                "the states given are from different points (epoch {} with {} consumers of {} \
                 streams, and epoch {} with {} of {}): give states saved at the same step",
                first.epoch, first.consumers, first.streams, s.epoch, s.consumers, s.streams
            )));
        }
    }
    let boundary = states.iter().all(|s| s.batches == 0) && first.history.is_empty();
    if boundary {
        return Ok(Start {
            epoch: first.epoch,
            ..Start::default()
        });
    }
    if first.consumers == opts.consumers && first.streams == opts.streams as u64 {
        let own = states
            .iter()
            .find(|s| s.consumer == opts.consumer)
            .ok_or_else(|| {
                Error::State(format!(
                    "no state of consumer {} among the {} given (same layout: each consumer \
                     resumes from its own)",
                    opts.consumer,
                    states.len()
                ))
            })?;
        if !own.history.is_empty() && (opts.samples_per_epoch > 0 || opts.resampled) {
            return Err(Error::State(
                "the state carries elastic cuts, which `samples_per_epoch` and `resampled` \
                 epochs cannot have"
                    .into(),
            ));
        }
        return Ok(Start {
            epoch: own.epoch,
            history: own.history.clone(),
            skip_batches: own.batches,
            skip_samples: own.samples,
        });
    }
    if opts.samples_per_epoch > 0 || opts.resampled {
        return Err(Error::State(
            "an epoch of `samples_per_epoch` or `resampled` draws cannot be resumed on another \
             layout mid-epoch; resume it on the same layout, or from a state taken at an epoch \
             boundary"
                .into(),
        ));
    }
    if first.history.len() as u64 >= MAX_ROUNDS {
        return Err(Error::State(format!(
            "the epoch was already resumed on {MAX_ROUNDS} layouts; resume it on the same layout \
             or from an epoch boundary"
        )));
    }
    let mut batches = vec![None; first.consumers as usize];
    for s in states {
        match &mut batches[s.consumer as usize] {
            Some(b) if *b != s.batches => {
                return Err(Error::State(format!(
                    "two different states of consumer {}",
                    s.consumer
                )));
            }
            slot => *slot = Some(s.batches),
        }
    }
    let missing: Vec<usize> = batches
        .iter()
        .enumerate()
        .filter(|(_, b)| b.is_none())
        .map(|(c, _)| c)
        .collect();
    if !missing.is_empty() {
        let mut named: Vec<String> = missing.iter().take(10).map(|c| c.to_string()).collect();
        if missing.len() > 10 {
            named.push(format!("and {} more", missing.len() - 10));
        }
        return Err(Error::State(format!(
            "resuming {} consumers of {} streams as {} of {} needs the state of every old \
             consumer; missing: {}",
            first.consumers,
            first.streams,
            opts.consumers,
            opts.streams,
            named.join(", ")
        )));
    }
    let mut history = first.history.clone();
    history.push(Round {
        streams: first.streams,
        batches: batches.into_iter().map(|b| b.expect("checked")).collect(),
    });
    Ok(Start {
        epoch: first.epoch,
        history,
        skip_batches: 0,
        skip_samples: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::{all_orders, flat, layout, opts, tally};
    use crate::plan::{Remainder, SampleRef, consumer_order};
    use proptest::prelude::*;

    fn sample() -> State {
        State {
            fingerprint: 7,
            epoch: 3,
            consumers: 4,
            consumer: 2,
            streams: 2,
            batches: 5,
            samples: 40,
            history: vec![Round {
                streams: 3,
                batches: vec![1, 2, 3],
            }],
        }
    }

    #[test]
    fn states_round_trip_and_bad_ones_are_named() {
        let s = sample();
        assert_eq!(State::decode(&s.encode()).unwrap(), s);
        assert_eq!(State::from_hex(&s.to_hex()).unwrap(), s);
        let huge = State {
            consumers: 1 << 40,
            consumer: 0,
            ..sample()
        };
        assert!(
            State::decode(&huge.encode()).is_err(),
            "a layout past the bound"
        );
        let streams = State {
            streams: 1 << 20,
            ..sample()
        };
        assert!(State::decode(&streams.encode()).is_err());
        let mut trailing = s.encode();
        trailing.push(0);
        assert!(
            State::decode(&trailing)
                .unwrap_err()
                .to_string()
                .contains("trailing")
        );
        assert!(State::from_hex("zz").is_err());
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = State::decode(&bytes);
        }

        #[test]
        fn damaged_states_never_panic(at in any::<prop::sample::Index>(), v in any::<u8>(), cut in any::<prop::sample::Index>()) {
            let mut b = sample().encode();
            let i = at.index(b.len());
            b[i] = v;
            let _ = State::decode(&b);
            let _ = State::decode(&b[..cut.index(b.len())]);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn an_elastic_resume_loses_and_repeats_nothing(
            (counts, c, s, seed, buf, bs) in layout(),
            c2 in 1u64..7, s2 in 1usize..4,
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 6),
            lockstep in any::<bool>(),
        ) {
            let o = opts(c, s, seed, buf, bs, Remainder::Pad);
            let fp = fingerprint(&[("a", Some(1))], &o);
            let n: u64 = counts.iter().sum();
            let orders = all_orders(&o, &counts, 0);
            let states: Vec<State> = (0..c).map(|k| {
                let len = orders[k as usize].len();
                let at = if lockstep { cuts[0].index(len + 1) } else { cuts[k as usize].index(len + 1) };
                State { fingerprint: fp, epoch: 0, consumers: c, consumer: k, streams: s as u64,
                        batches: at as u64, samples: 0, history: vec![] }
            }).collect();
            let before: Vec<SampleRef> = states.iter()
                .flat_map(|st| flat(&orders[st.consumer as usize][..st.batches as usize]))
                .collect();
            // Another layout (the same one resumes each consumer from its own state).
            let c2 = if (c2, s2) == (c, s) { c2 + 1 } else { c2 };
            let o2 = PlanOptions { consumers: c2, streams: s2, ..o.clone() };
            let mut after = Vec::new();
            let mut lens = Vec::new();
            for k in 0..c2 {
                let o2 = PlanOptions { consumer: k, ..o2.clone() };
                let start = start_from(&states, fp, &o2).unwrap();
                prop_assert_eq!(start.skip_batches, 0);
                let d = start.delivered(&o2, &counts).unwrap();
                let ord = consumer_order(&o2, &counts, 0, d.as_ref()).unwrap();
                lens.push(ord.len());
                after.extend(flat(&ord));
            }
            prop_assert!(lens.iter().all(|&l| l == lens[0]), "equal lengths after the cut: {:?}", lens);
            let (m, pads) = tally(before.iter().chain(after.iter()));
            prop_assert_eq!(m.len() as u64, n, "every sample of the epoch delivered");
            let extra: u64 = m.values().map(|&k| k - 1).sum();
            prop_assert!(extra <= pads, "{} repeats but {} pads", extra, pads);

            // Cut the new layout too, and resume it elastically once more
            // (back to the first layout): the states now carry the first cut.
            let round1 = Round { streams: s as u64, batches: states.iter().map(|st| st.batches).collect() };
            let mut before2 = before.clone();
            let mut states2 = Vec::new();
            for k in 0..c2 {
                let o2k = PlanOptions { consumer: k, ..o2.clone() };
                let start = start_from(&states, fp, &o2k).unwrap();
                let d = start.delivered(&o2k, &counts).unwrap();
                let ord = consumer_order(&o2k, &counts, 0, d.as_ref()).unwrap();
                let at = cuts[(k as usize + 3) % 6].index(ord.len() + 1);
                before2.extend(flat(&ord[..at]));
                // The history a resumed loader saves is its start's: the
                // first cut, or none when every old consumer was at 0
                // batches (an epoch boundary, not an elastic cut).
                let want = if states.iter().all(|st| st.batches == 0) { vec![] } else { vec![round1.clone()] };
                prop_assert_eq!(&start.history, &want);
                states2.push(State { fingerprint: fp, epoch: 0, consumers: c2, consumer: k,
                    streams: s2 as u64, batches: at as u64, samples: 0, history: start.history.clone() });
            }
            let mut after2 = Vec::new();
            for k in 0..c {
                let ok = PlanOptions { consumer: k, ..o.clone() };
                let start = start_from(&states2, fp, &ok).unwrap();
                let boundary = states2[0].history.is_empty() && states2.iter().all(|st| st.batches == 0);
                let rounds = if boundary { 0 } else { states2[0].history.len() + 1 };
                prop_assert_eq!(start.history.len(), rounds);
                let d = start.delivered(&ok, &counts).unwrap();
                after2.extend(flat(&consumer_order(&ok, &counts, 0, d.as_ref()).unwrap()));
            }
            let (m2, pads2) = tally(before2.iter().chain(after2.iter()));
            prop_assert_eq!(m2.len() as u64, n, "every sample after two cuts");
            let extra2: u64 = m2.values().map(|&k| k - 1).sum();
            prop_assert!(extra2 <= pads2, "{} repeats but {} pads after two cuts", extra2, pads2);
        }
    }
}
