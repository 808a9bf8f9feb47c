//! A nominal epoch's length: how many samples every consumer yields when
//! the shards' sample counts are not known and the shards are split whole
//! among the consumers (`PlanOptions::nominal`). Pure: sizes and a sample
//! of the data's bytes in, a length out, the same on every consumer that
//! is given the same facts.
//!
//! The rule. Consumer `c` reads the epoch order's positions `c, c + C, ...`,
//! so every consumer holds `floor(n / C)` shards at least, whatever the
//! order: the smallest `floor(n / C)` shards' bytes are a bound below every
//! consumer's share in every epoch. Those bytes at the bytes per sample
//! measured in the shards' first bytes estimate the samples of the poorest
//! share; the length is [`MARGIN`] of that, in whole batches, so an
//! estimate that errs by less than the margin never leaves a consumer
//! short (the engine stops a short epoch with an error that says how to
//! give the counts).

use crate::error::{Error, Result};

/// The share of the estimated samples a nominal epoch takes: the estimate
/// comes from a few mebibytes of the data, and a sample mean of ~100
/// ImageNet-sized samples (their sizes vary by about half their mean) errs
/// by ~5%, the shares by a few % more; 10% below it, a consumer runs short
/// only when the data's samples grow across the shards.
pub const MARGIN: f64 = 0.9;

/// What the first bytes of a few shards showed: samples whole in them,
/// and the bytes those samples take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sampled {
    pub samples: u64,
    pub bytes: u64,
}

/// A nominal epoch's length and how it was reached, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nominal {
    /// Samples each consumer yields: a multiple of the batch size.
    pub samples: u64,
    pub why: String,
}

/// The length when every consumer is asked for `per_consumer` samples
/// (`samples_per_epoch / C`), rounded down to whole batches.
pub fn given_length(per_consumer: u64, batch_size: usize) -> Result<Nominal> {
    let bs = batch_size.max(1) as u64;
    let samples = per_consumer / bs * bs;
    if samples == 0 {
        return Err(Error::config(format!(
            "`samples_per_epoch` gives each consumer {per_consumer} samples, less than a batch \
             of {bs}: with no sample counts an epoch is whole batches"
        )));
    }
    Ok(Nominal {
        samples,
        why: format!("`samples_per_epoch`: {samples} per consumer, in whole batches"),
    })
}

/// The length for shards of `sizes` bytes split among `consumers`, from
/// what `sampled` shows of their samples.
pub fn estimated_length(
    sizes: &[u64],
    sampled: Sampled,
    consumers: u64,
    batch_size: usize,
) -> Result<Nominal> {
    let bs = batch_size.max(1) as u64;
    let fewest = sizes.len() as u64 / consumers.max(1);
    if fewest == 0 {
        return Err(Error::config(format!(
            "{} shards for {consumers} consumers, and no sample counts to split a shard by: \
             give the counts (a manifest from `ringfeed index`, or a `shardindex.json` beside \
             the shards), or use fewer ranks or DataLoader workers",
            sizes.len()
        )));
    }
    let mut sorted = sizes.to_vec();
    sorted.sort_unstable();
    let poorest: u64 = sorted[..fewest as usize].iter().sum();
    let estimate = match sampled.samples {
        // No sample ended in the bytes read (samples of several MiB):
        // a shard holds one at least.
        0 => fewest,
        n => (u128::from(poorest) * u128::from(n) / u128::from(sampled.bytes.max(1))) as u64,
    };
    let samples = ((estimate as f64 * MARGIN) as u64) / bs * bs;
    if samples == 0 {
        return Err(Error::config(format!(
            "each of the {consumers} consumers' shards hold about {estimate} samples (no sample \
             counts are known: estimated from the shards' sizes and first bytes), fewer than a \
             batch of {bs}: use a smaller `batch_size` or fewer consumers, or give the counts \
             (a manifest from `ringfeed index`, or a `shardindex.json` beside the shards)"
        )));
    }
    let per_sample = match sampled.samples {
        0 => "more than the bytes read".to_string(),
        n => format!("{} bytes", sampled.bytes / n),
    };
    Ok(Nominal {
        samples,
        why: format!(
            "{samples} per consumer: {:.0}% of the ~{estimate} that the smallest share \
             ({fewest} of {} shards, {poorest} bytes) holds at {per_sample} a sample",
            MARGIN * 100.0,
            sizes.len()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poorest_share_bounds_every_consumer() {
        // 10 shards for 4 consumers: each holds 2 at least; the 2 smallest
        // are 100 and 200 bytes; 10 bytes a sample: 30 samples, 90%: 27,
        // in batches of 4: 24.
        let sizes = [1000, 100, 200, 900, 800, 700, 600, 500, 400, 300];
        let s = Sampled {
            samples: 50,
            bytes: 500,
        };
        let n = estimated_length(&sizes, s, 4, 4).unwrap();
        assert_eq!(n.samples, 24);
        assert!(n.why.contains("~30"), "{}", n.why);
        // Every consumer of every epoch holds 2 shards at least, so 300
        // bytes: the length never passes that share's 30 samples.
        let e = estimated_length(&sizes[..3], s, 4, 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("3 shards for 4 consumers"), "{e}");
        let e = estimated_length(&sizes, s, 4, 64).unwrap_err().to_string();
        assert!(e.contains("fewer than a batch of 64"), "{e}");
    }

    #[test]
    fn samples_larger_than_the_bytes_read_count_one_a_shard() {
        let n = estimated_length(&[1 << 30; 8], Sampled::default(), 2, 1).unwrap();
        assert_eq!(n.samples, 3, "4 shards a consumer, 90% of 4");
    }

    #[test]
    fn a_given_length_is_whole_batches() {
        assert_eq!(given_length(130, 32).unwrap().samples, 128);
        assert!(given_length(31, 32).is_err());
    }
}
