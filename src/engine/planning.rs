//! The dataset and the plan at start-up: each shard's sample count where
//! the plan needs it (counted from local headers, or learned from the
//! cache), the streams' number, and where the epoch starts from the resume
//! states (the plan's options, the fingerprint states are checked against,
//! what an elastic resume delivered already, the batches a resume replays).

use crate::cache::Cache;
use crate::config::{AUTO_WORKERS, Config};
use crate::dataset::{self, Shard, Source};
use crate::error::{Error, Result};
use crate::fetch::NetOptions;
use crate::log::Level;
use crate::plan::resume::{self, Start, State};
use crate::plan::{Delivered, Nominal, PlanOptions, estimated_length, given_length, plan_epoch};

/// The dataset of `cfg`, each shard's samples counted or found where the
/// plan's split needs them: what a node engine resolves once for all its
/// consumers' loaders (each would count every shard again).
pub(crate) fn resolve_counted(cfg: &Config) -> Result<Vec<Shard>> {
    let net = NetOptions::for_config(cfg);
    let mut shards = dataset::resolve_config(cfg, &net)?;
    let workers = worker_count(cfg, &shards);
    counts_or_nominal(cfg, &mut shards, &net, workers)?;
    Ok(shards)
}

/// What one consumer's epoch holds, worked out without reading it (the
/// dataset resolved, the counts found or the nominal length estimated, as
/// a loader's open does): what a caller asks ahead, such as Python's
/// `len()` of a dataset.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PlanSummary {
    /// How the epoch is split: `"samples"` (every count known: by sample
    /// index, exact), `"shards"` (a nominal epoch, split by shard), or
    /// `"none"` (one consumer reading every shard).
    pub split: &'static str,
    /// Consumers of the layout: ranks × loader workers.
    pub consumers: u64,
    /// Samples this consumer yields in the epoch, where known.
    pub samples: Option<u64>,
    /// Batches it yields, where known: the same on every consumer.
    pub batches: Option<u64>,
    pub shards: usize,
    /// How a nominal length was reached.
    pub nominal: Option<String>,
}

/// The [`PlanSummary`] of `cfg`'s consumer in its epoch `cfg.epoch`.
pub fn plan_summary(cfg: &Config) -> Result<PlanSummary> {
    cfg.validate()?;
    let net = NetOptions::for_config(cfg);
    let mut shards = dataset::resolve_config(cfg, &net)?;
    if shards.is_empty() {
        return Err(Error::config("`urls` names no shard"));
    }
    let workers = worker_count(cfg, &shards);
    let mut opts = cfg.plan_options(workers);
    // The length is asked even where the plan needs no counts: look for
    // them all the same.
    find_counts(cfg, &mut shards, &net, &opts)?;
    let nominal = nominal_where_unknown(&mut shards, &net, &opts)?;
    opts.nominal = nominal.as_ref().map(|n| n.samples);
    let counts: Vec<Option<u64>> = shards.iter().map(counted).collect::<Result<Vec<_>>>()?;
    let plan = plan_epoch(&opts, &counts, cfg.epoch, None)?;
    let bs = cfg.batch_size.max(1) as u64;
    let batches = plan.samples.map(|l| match plan.nominal || cfg.drop_last {
        true => l / bs,
        false => l.div_ceil(bs),
    });
    let split = match (plan.nominal, opts.consumers > 1) {
        (true, _) => "shards",
        (false, true) => "samples",
        (false, false) => "none",
    };
    Ok(PlanSummary {
        split,
        consumers: opts.consumers,
        samples: plan.samples,
        batches,
        shards: shards.len(),
        nominal: nominal.map(|n| n.why),
    })
}

/// Each shard's sample count where the plan needs them (a split among
/// consumers, `samples_per_epoch`, `resampled`), from what every consumer
/// of the job sees the same: a manifest or shard index (given, or found
/// beside the shards), local shards' headers; for a single consumer, the
/// cache's counts too. Where some remain unknown, the nominal epoch the
/// plan then splits by shard (`plan::PlanOptions::nominal`), said once.
pub(super) fn counts_or_nominal(
    cfg: &Config,
    shards: &mut [Shard],
    net: &NetOptions,
    workers: usize,
) -> Result<Option<Nominal>> {
    let opts = cfg.plan_options(workers);
    if !opts.needs_counts() {
        return Ok(None);
    }
    find_counts(cfg, shards, net, &opts)?;
    nominal_where_unknown(shards, net, &opts)
}

/// The nominal epoch of a plan that needs counts some shards lack.
fn nominal_where_unknown(
    shards: &mut [Shard],
    net: &NetOptions,
    opts: &PlanOptions,
) -> Result<Option<Nominal>> {
    if !opts.needs_counts() {
        return Ok(None);
    }
    let unknown = shards.iter().filter(|s| s.samples.is_none()).count();
    if unknown == 0 || opts.resampled {
        // `resampled` without counts is the plan's error, named there.
        return Ok(None);
    }
    let nominal = if opts.samples_per_epoch > 0 {
        given_length(opts.samples_per_epoch / opts.consumers, opts.batch_size)?
    } else {
        let sampled = dataset::sample_shards(shards, net)?;
        let sizes: Vec<u64> = shards.iter().map(|s| s.size.unwrap_or(0)).collect();
        estimated_length(&sizes, sampled, opts.consumers, opts.batch_size)?
    };
    let n = shards.len();
    crate::log::once(
        &format!("nominal {n} {} {}", opts.consumers, nominal.samples),
        Level::Info,
        || {
            format!(
                "{unknown} of {n} shards have no known sample count (no manifest or \
                 `shardindex.json` beside them): the {} consumers split the shards whole, each \
                 yielding a nominal epoch of {}; the rest of each one's shards is left out and \
                 counted (`samples_dropped`). Sample counts make the split exact: `ringfeed \
                 index URL... -o shardindex.json`, put beside the shards",
                opts.consumers, nominal.why
            )
        },
    );
    Ok(Some(nominal))
}

/// Every shard's count that can be had without reading the data: local
/// headers, a manifest or index beside the shards, and for a single
/// consumer the cache's.
fn find_counts(
    cfg: &Config,
    shards: &mut [Shard],
    net: &NetOptions,
    opts: &PlanOptions,
) -> Result<()> {
    for s in shards.iter_mut() {
        s.samples = counted(s)?;
    }
    if opts.consumers == 1 {
        learn_cached_counts(cfg, shards, net)?;
    }
    if shards.iter().any(|s| s.samples.is_none()) {
        let found = dataset::counts_beside(shards, net)?;
        if !found.is_empty() {
            crate::log::once(&format!("counts {}", found.join(" ")), Level::Info, || {
                format!("sample counts from {}", found.join(", "))
            });
        }
    }
    Ok(())
}

/// Remote shards' sample counts from the cache, when a cache is
/// configured: what an earlier run learned reading them whole, for the
/// current versions of the objects. Only a single consumer's plan uses
/// them: a cache is one node's and fills while consumers open, so two
/// consumers could plan one epoch from different counts.
fn learn_cached_counts(cfg: &Config, shards: &mut [Shard], net: &NetOptions) -> Result<()> {
    let Some(o) = cfg.cache_options() else {
        return Ok(());
    };
    if shards.iter().all(|s| s.samples.is_some()) {
        return Ok(());
    }
    dataset::learn_counts(shards, &Cache::open(o)?, net)
}

/// A shard's sample count: known, or counted from a local file's headers
/// (`None` for a remote shard without one).
pub(super) fn counted(s: &Shard) -> Result<Option<u64>> {
    match (&s.source, s.samples) {
        (_, Some(n)) => Ok(Some(n)),
        (Source::File(path), None) => crate::tar::count_file_samples(path).map(Some),
        _ => Ok(None),
    }
}

/// Streams of a loader: `workers`, or, auto, one per shard of this
/// consumer's part up to `AUTO_WORKERS`. Split among several consumers
/// (by shard, or by sample index into consecutive runs), a part spans at
/// most `ceil(shards / consumers) + 1` shards; a stream past those would
/// be planned nothing and hold its share of the memory idle while the
/// others ran short (a node engine's consumer of one shard of 256-sample
/// batches waited for ever at a quarter of its part). `resampled` draws
/// shards with replacement: any number of them.
pub(super) fn worker_count(cfg: &Config, shards: &[Shard]) -> usize {
    match cfg.workers {
        0 => auto_workers(shards.len(), cfg.consumers(), cfg.resampled),
        n => n,
    }
}

/// Auto's streams for `shards` split among `consumers` (see
/// [`worker_count`]).
fn auto_workers(shards: usize, consumers: u64, resampled: bool) -> usize {
    let part = match consumers {
        _ if resampled => shards,
        0 | 1 => shards,
        c => shards.div_ceil(c as usize) + 1,
    };
    AUTO_WORKERS.min(part).min(shards)
}

/// The fingerprint to check `states` against: the dataset's, or, for
/// states that do not match it while some shards are unsized, the one with
/// every size (states saved when open sized each remote shard with a `HEAD`
/// carry their sizes): then the sizes are asked for, in parallel, so those
/// states still resume. The loader's own states carry the dataset's.
fn sized_fingerprint(
    states: &[State],
    fingerprint: u64,
    shards: &[Shard],
    net: &NetOptions,
    opts: &PlanOptions,
) -> Result<u64> {
    if states.iter().all(|s| s.fingerprint == fingerprint)
        || shards.iter().all(|s| s.size.is_some())
    {
        return Ok(fingerprint);
    }
    let mut sized = shards.to_vec();
    dataset::head_sizes(&mut sized, net)?;
    let ids: Vec<(&str, Option<u64>)> = sized.iter().map(|s| (s.name.as_str(), s.size)).collect();
    let full = resume::fingerprint(&ids, opts);
    Ok(if states.iter().all(|s| s.fingerprint == full) {
        full
    } else {
        fingerprint
    })
}

pub(super) type Replay = Vec<Vec<Vec<u64>>>;
pub(super) type PlanSetup = (
    PlanOptions,
    Vec<Option<u64>>,
    Start,
    Option<Delivered>,
    Option<Replay>,
    u64,
);

/// The plan's options, each shard's count where known (local shards are
/// counted from their headers when the plan needs counts), where to start
/// (from the resume states), and the dataset's fingerprint.
pub(super) fn plan_setup(
    cfg: &Config,
    net: &NetOptions,
    shards: &[Shard],
    workers: usize,
    nominal: Option<&Nominal>,
) -> Result<PlanSetup> {
    let mut opts = cfg.plan_options(workers);
    opts.nominal = nominal.map(|n| n.samples);
    let ids: Vec<(&str, Option<u64>)> = shards.iter().map(|s| (s.name.as_str(), s.size)).collect();
    let fingerprint = resume::fingerprint(&ids, &opts);
    let states = cfg
        .resume
        .iter()
        .map(|h| State::from_hex(h))
        .collect::<Result<Vec<_>>>()?;
    let checked = sized_fingerprint(&states, fingerprint, shards, net, &opts)?;
    let mut start = resume::start_from(&states, checked, &opts)?;
    if states.is_empty() {
        start.epoch = cfg.epoch;
    }
    let counts = if opts.needs_counts() || start.needs_counts() || start.skip_batches > 0 {
        shards.iter().map(counted).collect::<Result<Vec<_>>>()?
    } else {
        shards.iter().map(|s| s.samples).collect()
    };
    let base = if start.needs_counts() {
        let known: Option<Vec<u64>> = counts.iter().copied().collect();
        match known {
            Some(k) => start.delivered(&opts, &k)?,
            None => {
                let missing = counts.iter().filter(|c| c.is_none()).count();
                return Err(Error::config(format!(
                    "resuming on another layout needs every shard's sample count and {missing} \
                     of {} shards have none: list them in a manifest with their counts \
                     (`ringfeed index URL... -o set.manifest`), or read them whole once with a \
                     `cache_dir`, which keeps the counts",
                    counts.len()
                )));
            }
        }
    } else {
        None
    };
    // Surface plan errors (missing counts, bad layout) at open.
    let plan = plan_epoch(&opts, &counts, start.epoch, base.as_ref())?;
    // A resume with every count known replays the cut's batches without
    // reading them; with unknown counts it reads and skips them.
    let known: Option<Vec<u64>> = counts.iter().copied().collect();
    let replay = match known {
        Some(k) if start.skip_batches > 0 => {
            Some(crate::plan::replayed(&opts, &k, &plan, start.skip_batches))
        }
        _ => None,
    };
    Ok((opts, counts, start, base, replay, fingerprint))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_runs_one_stream_per_shard_of_the_consumers_part() {
        // One consumer reads every shard: one stream each, up to the most.
        assert_eq!(auto_workers(1, 1, false), 1);
        assert_eq!(auto_workers(3, 1, false), 3);
        assert_eq!(auto_workers(64, 1, false), AUTO_WORKERS);
        // 4 shards among 4 consumers: a part is one shard, or the end of
        // one and the start of the next; never four (two would hold their
        // share of memory with nothing planned).
        assert_eq!(auto_workers(4, 4, false), 2);
        assert_eq!(auto_workers(8, 4, false), 3);
        assert_eq!(auto_workers(1, 8, false), 1);
        assert_eq!(auto_workers(1024, 8, false), AUTO_WORKERS);
        // Shards drawn with replacement: any of them, any number of times.
        assert_eq!(auto_workers(4, 4, true), 4);
        assert_eq!(auto_workers(0, 1, false), 0);
    }

    #[test]
    fn auto_leaves_at_most_one_stream_of_a_part_with_nothing_planned() {
        // Against the plan itself: split by sample index (shards of equal
        // counts, shuffled), a consumer's part fills all but at most one of
        // auto's streams (a part inside one shard leaves the second idle),
        // and one consumer's, all of them. (Uneven shards can leave more
        // idle: a part inside one large shard.)
        use crate::config::Config;
        use crate::plan::plan_epoch;
        for shards in 1..12usize {
            for consumers in 1..9u64 {
                let counts: Vec<Option<u64>> = vec![Some(100); shards];
                let streams = auto_workers(shards, consumers, false);
                let cfg = Config {
                    world_size: consumers,
                    shuffle: true,
                    ..Config::default()
                };
                for consumer in 0..consumers {
                    let cfg = Config {
                        rank: consumer,
                        ..cfg.clone()
                    };
                    let plan = plan_epoch(&cfg.plan_options(streams), &counts, 3, None).unwrap();
                    let idle = plan.streams.iter().filter(|s| s.is_empty()).count();
                    let most = if consumers == 1 { 0 } else { 1 };
                    assert!(
                        idle <= most,
                        "{shards} shards, consumer {consumer} of {consumers}: {idle} of \
                         {streams} streams planned nothing"
                    );
                }
            }
        }
    }
}
