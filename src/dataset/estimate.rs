//! What a nominal epoch is planned from when the shards' sample counts are
//! unknown (`crate::plan::nominal`): every shard's size (`HEAD`s in
//! parallel, for the ones no listing sized) and the samples in the first
//! bytes of a few shards spread over the list. Every consumer of a job reads
//! the same shards' same bytes, so every consumer plans the same length.
//! The answer is kept for the process (a node engine plans for every
//! consumer it serves).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::resolve::{head_sizes, parallel_sizes};
use super::{Shard, Source};
use crate::error::{Error, Result};
use crate::fetch::{NetOptions, fetch_retrying};
use crate::plan::Sampled;
use crate::sync::Locked;
use crate::tar::count_prefix;

/// Shards whose first bytes are read: a few, spread over the list, so a
/// dataset whose samples change along its shards is sampled along them.
const SAMPLED_SHARDS: usize = 8;

/// Bytes read from the start of each: about ten ImageNet-sized samples, a
/// few hundred of small ones; 8 MiB over the eight, read in parallel at
/// open (a few round trips).
const SAMPLED_BYTES: u64 = 1 << 20;

/// Sizes every shard (those no listing or manifest sized) and reads the
/// first bytes of up to `SAMPLED_SHARDS` of them: the samples whole in
/// those bytes and the bytes they take. A shard read whole is counted
/// exactly. Errors are the shard's (a missing shard, a corrupt one).
pub fn sample_shards(shards: &mut [Shard], net: &NetOptions) -> Result<Sampled> {
    head_sizes(shards, net)?;
    let key = memo_key(shards);
    if let Some(s) = memo().locked().get(&key) {
        return Ok(*s);
    }
    let n = shards.len();
    let mut picked: Vec<usize> = (0..SAMPLED_SHARDS.min(n))
        .map(|i| i * n / SAMPLED_SHARDS.min(n))
        .filter(|&i| shards[i].size.is_some_and(|s| s > 0))
        .collect();
    picked.dedup();
    let shards: &[Shard] = shards;
    let counts = parallel_sizes(&picked, net, |i, pool, jitter| {
        let s = &shards[i];
        let size = s.size.unwrap_or(0);
        let mut buf = vec![0u8; size.min(SAMPLED_BYTES) as usize];
        match &s.source {
            Source::Http(obj) => {
                fetch_retrying(pool, obj, 0, &mut buf, false, None, net, jitter)?;
            }
            Source::File(path) => {
                use std::os::unix::fs::FileExt;
                let f = std::fs::File::open(path)
                    .map_err(|e| Error::io(crate::error::IoOp::Open, path, &e))?;
                f.read_exact_at(&mut buf, 0)
                    .map_err(|e| Error::io(crate::error::IoOp::Read, path, &e))?;
            }
        }
        count_prefix(&buf, size).map_err(|source| Error::Tar {
            shard: s.name.clone(),
            source,
        })
    })?;
    let mut sampled = Sampled::default();
    for c in counts {
        sampled.samples += c.samples;
        sampled.bytes += c.bytes;
    }
    memo().locked().insert(key, sampled);
    Ok(sampled)
}

/// What was sampled, by the shards' names and sizes: a node engine's
/// consumers plan from one reading.
fn memo() -> &'static Mutex<HashMap<u64, Sampled>> {
    static MEMO: OnceLock<Mutex<HashMap<u64, Sampled>>> = OnceLock::new();
    MEMO.get_or_init(Default::default)
}

fn memo_key(shards: &[Shard]) -> u64 {
    let ids: Vec<(&str, Option<u64>)> = shards.iter().map(|s| (s.name.as_str(), s.size)).collect();
    crate::plan::resume::fingerprint(&ids, &crate::plan::PlanOptions::default())
}
