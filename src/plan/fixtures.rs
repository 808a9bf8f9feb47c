//! Test fixtures shared by the plan's tests: options for a layout, every
//! consumer's order, and the strategy of arbitrary layouts.

use std::collections::HashMap;

use proptest::prelude::*;

use crate::plan::{PlanOptions, Remainder, SampleRef, consumer_order};

pub(super) fn opts(
    c: u64,
    s: usize,
    seed: u64,
    buf: usize,
    bs: usize,
    rem: Remainder,
) -> PlanOptions {
    PlanOptions {
        seed,
        shuffle: true,
        shuffle_buffer: buf,
        shuffle_initial: buf / 2,
        remainder: rem,
        batch_size: bs,
        consumers: c,
        streams: s,
        ..PlanOptions::default()
    }
}

pub(super) fn all_orders(o: &PlanOptions, counts: &[u64], epoch: u64) -> Vec<Vec<Vec<SampleRef>>> {
    (0..o.consumers)
        .map(|c| {
            let o = PlanOptions {
                consumer: c,
                ..o.clone()
            };
            consumer_order(&o, counts, epoch, None).unwrap()
        })
        .collect()
}

pub(super) fn flat(b: &[Vec<SampleRef>]) -> Vec<SampleRef> {
    b.iter().flatten().copied().collect()
}

/// Occurrences of each sample, and the pad entries among them.
pub(super) fn tally<'a>(
    it: impl Iterator<Item = &'a SampleRef>,
) -> (HashMap<(usize, u64), u64>, u64) {
    let mut m = HashMap::new();
    let mut pads = 0;
    for &(s, i, pad) in it {
        *m.entry((s, i)).or_insert(0) += 1;
        pads += u64::from(pad);
    }
    (m, pads)
}

pub(super) fn layout() -> impl Strategy<Value = (Vec<u64>, u64, usize, u64, usize, usize)> {
    (
        prop::collection::vec(0u64..40, 1..24),
        1u64..7,
        1usize..4,
        any::<u64>(),
        0usize..30,
        1usize..8,
    )
}
