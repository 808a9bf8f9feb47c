//! The sequencer: one thread that takes the streams' batches round-robin
//! (the plan's delivery order, `crate::plan::Delivery`), merges the streams'
//! short last batches at the end of each epoch, skips what a resume state
//! says was delivered, ends a nominal epoch at its length (passing over
//! what the streams made past it), and feeds the ring that `Loader::next`
//! pops.

use std::sync::atomic::Ordering;

use crate::engine::shared::{Item, Shared};
use crate::error::{Error, Fault, Result};
use crate::memory::{Batch, BatchBuilder, NO_OWNER};
use crate::plan::Delivery;

/// The sequencer: stream batches round-robin into the ring, epoch by
/// epoch, as `crate::plan::order_of_plan` describes.
pub(super) fn sequence(sh: &Shared) -> Result<()> {
    let bs = sh.cfg.batch_size;
    let mut epoch = sh.start.epoch;
    let mut skip = sh.start.skip_batches;
    let mut skipped_samples = 0u64;
    while sh.cfg.epochs == 0 || epoch < sh.cfg.epochs {
        let plan = sh.plan(epoch)?;
        let mut samples = 0u64;
        let mut deliver = |b: Batch, samples: &mut u64| -> Result<()> {
            *samples += b.len() as u64;
            if skip > 0 {
                skip -= 1;
                skipped_samples += b.len() as u64;
                sh.counters.batches_skipped.fetch_add(1, Ordering::Relaxed);
                sh.counters
                    .samples_skipped
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
                if skip == 0 && skipped_samples != sh.start.skip_samples {
                    return Err(Error::State(format!(
                        "the state says its {} batches held {} samples, but they hold {}: \
                         it was not saved by this dataset and configuration",
                        sh.start.skip_batches, sh.start.skip_samples, skipped_samples
                    )));
                }
                return Ok(());
            }
            if sh.replay.is_some()
                && epoch == sh.start.epoch
                && b.raw_samples().iter().any(|s| s.field_count == 0)
            {
                return Err(Error::internal(
                    Fault::Invariant,
                    "a replayed placeholder came after the resume point",
                ));
            }
            let mut b = b;
            // Closed by the consumer: no one takes the batches the streams
            // still queue, and transforming them (a batch of photos is
            // tens of milliseconds of every transform thread) only held up
            // the close.
            if sh.channel.is_closed() {
                return Err(Error::Closed);
            }
            if let Some(t) = &sh.transform {
                // Its first sample's place in the epoch: the samples
                // before it, skipped ones included (counted above).
                let position = *samples - b.len() as u64;
                t.run(&mut b, epoch, position, &sh.counters.images_skipped)?;
            }
            sh.push(Item::Batch(b))
        };
        // A nominal epoch ends after its length, in whole batches.
        let cap = plan.nominal.then(|| plan.samples.unwrap_or(0));
        let full = |samples: u64| cap.is_some_and(|c| samples >= c);
        let mut order = Delivery::new(sh.streams.len());
        let mut ended = vec![false; sh.streams.len()];
        let mut tails: Vec<Option<BatchBuilder>> = (0..sh.streams.len()).map(|_| None).collect();
        while !full(samples)
            && let Some(s) = order.next_stream()
        {
            match sh.streams[s].pop_until(None) {
                Ok(Item::Batch(b)) => deliver(b, &mut samples)?,
                Ok(Item::Tail(t)) => {
                    tails[s] = Some(t);
                    order.ended(s);
                    ended[s] = true;
                }
                Ok(Item::EndOfEpoch(_)) => {
                    return Err(Error::internal(
                        Fault::Invariant,
                        "a worker sent an end-of-epoch marker",
                    ));
                }
                Err(_) => return Err(Error::Closed),
            }
        }
        let mut left_out = 0u64;
        if full(samples) {
            // The rest of the streams' epoch is left out: the workers stop
            // at their next shard, and what they made is passed over.
            sh.epoch_full(epoch);
            for (s, done) in ended.iter().enumerate() {
                if !done {
                    left_out += pass_over(sh, s)?;
                }
            }
        }
        let mut carry = BatchBuilder::new(bs);
        let mut whole = Vec::new();
        for t in tails.into_iter().flatten() {
            if full(samples) {
                left_out += t.len() as u64;
                continue;
            }
            carry.absorb(t, |b| whole.push(sh.seal(b, epoch, NO_OWNER)));
        }
        for b in whole {
            if full(samples) {
                left_out += b.len() as u64;
                continue;
            }
            deliver(b, &mut samples)?;
        }
        if !carry.is_empty() {
            if sh.cfg.drop_last || cap.is_some() {
                left_out += carry.len() as u64;
            } else {
                let b = sh.seal(&mut carry, epoch, NO_OWNER);
                deliver(b, &mut samples)?;
            }
        }
        if let Some(c) = cap
            && samples < c
        {
            return Err(Error::Plan {
                shard: "(epoch)".into(),
                message: format!(
                    "the nominal epoch {epoch} is {c} samples per consumer, but this \
                     consumer's shards held {samples} (the length was estimated from the \
                     shards' sizes and first bytes, which their samples do not follow): give \
                     the sample counts (`ringfeed index URL... -o set.manifest`, or a \
                     `shardindex.json` beside the shards), or a smaller `samples_per_epoch`"
                ),
            });
        }
        sh.counters
            .samples_dropped
            .fetch_add(left_out, Ordering::Relaxed);
        samples += if cap.is_some() { 0 } else { left_out };
        if skip > 0 {
            return Err(Error::State(format!(
                "the state is {} batches into epoch {epoch}, which has only {}",
                sh.start.skip_batches,
                sh.start.skip_batches - skip
            )));
        }
        if let Some(want) = plan.samples
            && want != samples
        {
            return Err(Error::Plan {
                shard: "(epoch)".into(),
                message: format!(
                    "epoch {epoch} gave {samples} samples where the plan expects {want}"
                ),
            });
        }
        sh.counters
            .samples_padded
            .fetch_add(plan.padded, Ordering::Relaxed);
        sh.counters
            .samples_dropped
            .fetch_add(plan.dropped, Ordering::Relaxed);
        sh.push(Item::EndOfEpoch(epoch))?;
        sh.counters.epochs_done.fetch_add(1, Ordering::Relaxed);
        epoch += 1;
    }
    Ok(())
}

/// Passes over what stream `s` made of the epoch after its nominal length,
/// up to its short last batch: the samples left out.
fn pass_over(sh: &Shared, s: usize) -> Result<u64> {
    let mut left_out = 0;
    loop {
        match sh.streams[s].pop_until(None) {
            Ok(Item::Batch(b)) => left_out += b.len() as u64,
            Ok(Item::Tail(t)) => return Ok(left_out + t.len() as u64),
            Ok(Item::EndOfEpoch(_)) => {
                return Err(Error::internal(
                    Fault::Invariant,
                    "a worker sent an end-of-epoch marker",
                ));
            }
            Err(_) => return Err(Error::Closed),
        }
    }
}
