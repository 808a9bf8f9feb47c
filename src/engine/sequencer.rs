//! The sequencer: one thread that takes the streams' batches round-robin
//! (the plan's delivery order, `crate::plan::Delivery`), merges the streams'
//! short last batches at the end of each epoch, skips what a resume state
//! says was delivered, and feeds the ring that `Loader::next` pops.

use std::sync::atomic::Ordering;

use crate::engine::shared::{Item, Shared};
use crate::error::{Error, Result};
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
                return Err(Error::Internal(
                    "a replayed placeholder came after the resume point".into(),
                ));
            }
            let mut b = b;
            if let Some(t) = &sh.transform {
                // Its first sample's place in the epoch: the samples
                // before it, skipped ones included (counted above).
                let position = *samples - b.len() as u64;
                t.run(&mut b, epoch, position, &sh.counters.images_skipped)?;
            }
            sh.push(Item::Batch(b))
        };
        let mut order = Delivery::new(sh.streams.len());
        let mut tails: Vec<Option<BatchBuilder>> = (0..sh.streams.len()).map(|_| None).collect();
        while let Some(s) = order.next_stream() {
            match sh.streams[s].pop_until(None) {
                Ok(Item::Batch(b)) => deliver(b, &mut samples)?,
                Ok(Item::Tail(t)) => {
                    tails[s] = Some(t);
                    order.ended(s);
                }
                Ok(Item::EndOfEpoch(_)) => {
                    return Err(Error::Internal(
                        "a worker sent an end-of-epoch marker".into(),
                    ));
                }
                Err(_) => return Err(Error::Closed),
            }
        }
        let mut carry = BatchBuilder::new(bs);
        let mut full = Vec::new();
        for t in tails.into_iter().flatten() {
            carry.absorb(t, |b| full.push(sh.seal(b, epoch, NO_OWNER)));
        }
        for b in full {
            deliver(b, &mut samples)?;
        }
        if !carry.is_empty() {
            if sh.cfg.drop_last {
                samples += carry.len() as u64;
                sh.counters
                    .samples_dropped
                    .fetch_add(carry.len() as u64, Ordering::Relaxed);
            } else {
                let b = sh.seal(&mut carry, epoch, NO_OWNER);
                deliver(b, &mut samples)?;
            }
        }
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
