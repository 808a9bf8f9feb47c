//! What a mount is told beyond the engine's configuration
//! ([`MountOptions`]: time-to-live, overwrites, read-ahead, memory, owner
//! and modes) and what it counts ([`MountCounts`], its Prometheus metrics).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How the mount behaves beyond the engine's configuration.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// How long a directory's listing (and what the kernel caches of
    /// names and attributes) is trusted before it is taken again.
    pub ttl: Duration,
    /// Opening an existing file with `O_TRUNC` replaces its object.
    pub allow_overwrite: bool,
    /// The most bytes a stream reads ahead.
    pub readahead: u64,
    /// The kernel's read-ahead on the mount: how far out of order one
    /// stream's reads may come (what is in force once mounted is told by
    /// [`Fs::set_kernel_readahead`]).
    pub kernel_readahead: u64,
    /// The memory the blocks of remote files may hold.
    pub memory: u64,
    /// Network threads receiving the blocks.
    pub net_threads: usize,
    /// The owner every file and directory shows.
    pub uid: u32,
    pub gid: u32,
    /// The permission bits files and directories show (the kernel checks
    /// them: the CLI mounts with `default_permissions`); the write bits
    /// are taken off where no write is taken.
    pub file_mode: u16,
    pub dir_mode: u16,
    /// Mounted read-only (the CLI mounts with the kernel's `ro`, which
    /// answers every write `EROFS`): no write bits shown.
    pub read_only: bool,
}

/// The write bits of a mode.
pub(super) const WRITE_BITS: u16 = 0o222;

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            ttl: Duration::from_secs(60),
            allow_overwrite: false,
            readahead: 256 << 20,
            kernel_readahead: 16 << 20,
            memory: 1 << 30,
            net_threads: 1,
            // SAFETY: plain getters.
            uid: unsafe { libc::getuid() },
            // SAFETY: as above.
            gid: unsafe { libc::getgid() },
            // A local file system's defaults for a umask of 022.
            file_mode: 0o644,
            dir_mode: 0o755,
            read_only: false,
        }
    }
}

macro_rules! mount_counts {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// What a mount counts, served as Prometheus metrics
        /// (`ringfeed_mount_<name>_total`).
        #[derive(Debug, Default)]
        pub struct MountCounts {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        impl MountCounts {
            /// Every counter, by name.
            pub fn all(&self) -> Vec<(&'static str, u64)> {
                // Relaxed: statistics.
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }
        }
    };
}

mount_counts! {
    /// Directory listings taken from the source.
    listings,
    /// Ranged GETs of blocks started.
    gets,
    /// Bytes received from the store for blocks.
    bytes_fetched,
    /// Reads answered (the kernel's requests: `bytes_read / reads` is
    /// the size it asks in).
    reads,
    /// Bytes answered to readers' reads.
    bytes_read,
    /// Bytes answered from the node's cache entries.
    cache_hit_bytes,
    /// Cache entries this mount filled.
    cache_filled,
    /// Blocks dropped for the memory budget.
    evicted,
    /// Small files fetched ahead of a walk of their directory.
    prefetched,
    /// Block reads that failed for good.
    read_errors,
    /// Files written and completed as objects.
    uploads,
    /// Uploads aborted (writer killed, error): no object left.
    uploads_aborted,
    /// Bytes taken from writers.
    bytes_written,
    /// Operations refused (overwrite, rename, truncate, links, locks, ...).
    refused,
}

impl MountCounts {
    pub fn add(&self, a: &AtomicU64, n: u64) {
        // Relaxed: statistics.
        a.fetch_add(n, Ordering::Relaxed);
    }

    /// The counters as Prometheus text.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        for (name, v) in self.all() {
            out.push_str(&format!(
                "# TYPE ringfeed_mount_{name}_total counter\nringfeed_mount_{name}_total {v}\n"
            ));
        }
        out
    }
}
