//! How many reads a worker keeps in flight: `reads_in_flight`'s default
//! worked out in one place, for every part that needs it (the default
//! memory budget, the rings' sizes, the workers' read-ahead on files and
//! on the network, the shuffle buffer's room, the count found as network
//! reads go).

use super::{AUTO_READS_MAX, Config, LOCAL_READS};

/// A worker's reads in flight, from `reads_in_flight`: a fixed count
/// (every kind of read), or auto.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadDepth {
    /// Reads on local files and cache entries: the fixed count, or
    /// [`LOCAL_READS`].
    pub local: usize,
    /// Network reads: `Some(n)` fixed at n; `None`, found as the reads go
    /// (`crate::net::inflight`), from [`ReadDepth::net_start`] up to
    /// [`ReadDepth::net_most`].
    pub net_fixed: Option<usize>,
    /// What a ring is sized for, the most any read kind keeps in flight:
    /// the fixed count, or [`AUTO_READS_MAX`].
    pub ring: usize,
}

impl ReadDepth {
    /// Where an auto count of network reads starts, per worker: where a
    /// fixed count started before (enough for loopback; the first raise
    /// comes after one window of reads).
    pub fn net_start(&self) -> usize {
        self.net_fixed.unwrap_or(LOCAL_READS)
    }

    /// The most network reads one worker keeps in flight when it holds
    /// `quota` chunks: the fixed count, or a third of them (at least 1, at
    /// most [`AUTO_READS_MAX`]). The rest of a stream's chunks are for the
    /// reads done and waiting behind a slower one (up to the count again),
    /// the chunk being walked, the batches queued towards the consumer and
    /// a shuffle buffer, so ready batches never starve the reads (nor the
    /// reads the batches). Three quarters let a worker's reads and its open
    /// batch hold all its chunks (`tests/throttle.rs`, a 64-chunk share,
    /// failed with `BudgetTooSmall` one run in three); half sent a far store's jump to reads
    /// whose waiting neighbours took every chunk of the default budget
    /// (docs/remote-sources.md, "Reads in flight").
    pub fn net_most(&self, quota: usize) -> usize {
        match self.net_fixed {
            Some(n) => n,
            None => (quota / 3).clamp(1, AUTO_READS_MAX),
        }
    }
}

impl Config {
    /// This configuration's reads in flight ([`ReadDepth`]).
    pub fn read_depth(&self) -> ReadDepth {
        match self.reads_in_flight {
            0 => ReadDepth {
                local: LOCAL_READS,
                net_fixed: None,
                ring: AUTO_READS_MAX,
            },
            n => ReadDepth {
                local: n,
                net_fixed: Some(n),
                ring: n,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(json: &str) -> ReadDepth {
        Config::from_json(json).unwrap().read_depth()
    }

    #[test]
    fn auto_reads_local_files_at_the_default_and_the_network_by_the_quota() {
        let d = depth(r#"{"urls":"a"}"#);
        assert_eq!((d.local, d.net_fixed, d.ring), (4, None, 64));
        assert_eq!(d.net_start(), 4);
        // A third of the stream's chunks, between 1 and the rings' most.
        assert_eq!(d.net_most(30), 10);
        assert_eq!(d.net_most(2), 1);
        assert_eq!(d.net_most(1000), 64);
    }

    #[test]
    fn a_fixed_count_holds_for_every_kind_of_read() {
        let d = depth(r#"{"urls":"a","reads_in_flight":12}"#);
        assert_eq!((d.local, d.net_fixed, d.ring), (12, Some(12), 12));
        assert_eq!(
            (d.net_start(), d.net_most(3), d.net_most(3000)),
            (12, 12, 12)
        );
    }
}
