//! How far ahead of a file handle's reads its blocks are fetched — pure.
//!
//! A handle whose reads fall in its stream (from where the stream began
//! to the furthest read's end, give or take the kernel's read-ahead: the
//! kernel's reads of one stream arrive on several threads in any order
//! within it) is a stream: its window is twice what the stream spans so
//! far, at least one block and at most the most allowed, so a sequential
//! reader soon has many ranged reads in flight while one that reads a
//! header and jumps costs at most one block ahead. The window grows with
//! the bytes read, not the number of reads: the kernel asks in 128 KiB or
//! 1 MiB requests as it is set, and a page fault of a mapping brings a run
//! of them (its read-around, the kernel's read-ahead size) that must not
//! look like a long stream. A read anywhere else is random: the window
//! falls back to nothing, a new stream may begin there, and only the
//! blocks the read covers are fetched (a safetensors file's tensors, a
//! checkpoint's parts).

/// The sizes a handle's window is reckoned in.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The block, the unit fetched.
    pub block: u64,
    /// The most the window grows to.
    pub max: u64,
    /// How far a stream's reads may arrive out of order: the kernel's
    /// read-ahead (its requests are answered by several threads).
    pub slack: u64,
}

/// A handle's read pattern.
#[derive(Debug, Clone, Default)]
pub struct ReadAhead {
    /// The furthest end of the stream's reads; `None` before the first.
    front: Option<u64>,
    /// Where the current stream began.
    start: u64,
    /// Bytes fetched beyond the read's end.
    window: u64,
}

impl ReadAhead {
    /// The blocks (`first..last`, of `lim.block` bytes in a file of
    /// `size`) to have, for a read of `off..end`: those it covers and the
    /// window ahead of them, at most `lim.max` bytes beyond `end`.
    pub fn on_read(&mut self, off: u64, end: u64, size: u64, lim: Limits) -> (u64, u64) {
        let block = lim.block.max(1);
        let slack = lim.slack.max(block);
        let stream = match self.front {
            None => off == 0,
            Some(front) => off + slack >= self.start && off <= front + slack,
        };
        match self.front {
            Some(front) if stream => {
                self.start = self.start.min(off);
                self.front = Some(front.max(end));
            }
            _ => {
                self.start = off;
                self.front = Some(end);
            }
        }
        let span = self.front.unwrap_or(end) - self.start;
        self.window = if stream {
            (2 * span).clamp(block, lim.max.max(block))
        } else {
            0
        };
        let upto = end.saturating_add(self.window).min(size);
        (off / block, upto.max(end).div_ceil(block))
    }

    /// The bytes fetched ahead now.
    pub fn window(&self) -> u64 {
        self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;
    const LIM: Limits = Limits {
        block: 8 * MB,
        max: 64 * MB,
        slack: 8 * MB,
    };
    /// The mount's defaults: 8 MiB blocks, 256 MiB window, the kernel
    /// reading 16 MiB ahead.
    const KERNEL_16M: Limits = Limits {
        block: 8 * MB,
        max: 256 * MB,
        slack: 16 * MB,
    };

    #[test]
    fn a_stream_grows_its_window_to_the_most() {
        let mut a = ReadAhead::default();
        let (size, block) = (1 << 30, 8 * MB);
        let lim = Limits {
            block,
            max: 64 * MB,
            slack: block,
        };
        let mut windows = Vec::new();
        for i in 0..6 {
            let (first, last) = a.on_read(i * 8 * MB, (i + 1) * 8 * MB, size, lim);
            assert_eq!(first, i);
            windows.push(a.window());
            assert_eq!(last, ((i + 1) * 8 * MB + a.window()).div_ceil(block));
        }
        assert_eq!(windows, [16, 32, 48, 64, 64, 64].map(|w| w * MB));
    }

    #[test]
    fn the_window_grows_with_bytes_read_not_with_the_number_of_reads() {
        // A page fault's read-around: 16 MiB asked in 1 MiB requests from
        // a point inside the file. Counted by reads, sixteen doublings
        // would take the window to the most; counted by bytes it is twice
        // the run's 16 MiB.
        let mut a = ReadAhead::default();
        let (size, lim) = (1 << 30, KERNEL_16M);
        a.on_read(0, 4096, size, lim);
        for i in 0..16 {
            a.on_read(500 * MB + i * MB, 501 * MB + i * MB, size, lim);
        }
        assert_eq!(a.window(), 32 * MB);
        // The same requests of 128 KiB: the same bytes, the same window.
        let mut b = ReadAhead::default();
        b.on_read(0, 4096, size, lim);
        for i in 0..128 {
            let off = 500 * MB + i * (MB / 8);
            b.on_read(off, off + MB / 8, size, lim);
        }
        assert_eq!(b.window(), 32 * MB);
    }

    #[test]
    fn reads_out_of_order_by_less_than_a_block_stay_a_stream() {
        let mut a = ReadAhead::default();
        a.on_read(0, 4 * MB, 1 << 30, LIM);
        a.on_read(8 * MB, 12 * MB, 1 << 30, LIM);
        a.on_read(4 * MB, 8 * MB, 1 << 30, LIM);
        // 12 MiB read as one stream (its front kept): twice that.
        assert_eq!(a.window(), 24 * MB);
    }

    #[test]
    fn the_kernels_read_ahead_arriving_in_any_order_stays_a_stream() {
        // 32 MiB read, then the kernel's next 16 MiB asked as sixteen
        // 1 MiB requests answered by as many threads: the last first.
        let mut a = ReadAhead::default();
        let (size, lim) = (1 << 30, KERNEL_16M);
        for i in 0..32 {
            a.on_read(i * MB, (i + 1) * MB, size, lim);
        }
        for i in [
            47, 40, 33, 32, 46, 35, 34, 39, 36, 45, 37, 38, 41, 44, 42, 43,
        ] {
            a.on_read(i * MB, (i + 1) * MB, size, lim);
            assert!(a.window() >= 64 * MB, "{i}: {}", a.window());
        }
        assert_eq!(a.window(), 96 * MB);
    }

    #[test]
    fn a_new_stream_after_a_jump_does_not_keep_the_old_ones_front() {
        let mut a = ReadAhead::default();
        let (size, lim) = (1 << 30, KERNEL_16M);
        // A tensor at the end, then one far before it.
        a.on_read(900 * MB, 901 * MB, size, lim);
        a.on_read(901 * MB, 902 * MB, size, lim);
        let (first, last) = a.on_read(100 * MB, 101 * MB, size, lim);
        assert_eq!((first, last, a.window()), (12, 13, 0));
        a.on_read(101 * MB, 102 * MB, size, lim);
        // Its own 2 MiB span, not the 802 MiB to the old front.
        assert_eq!(a.window(), lim.block);
    }

    #[test]
    fn a_jump_is_random_and_fetches_only_what_it_reads() {
        let mut a = ReadAhead::default();
        // A header at the start, then a tensor far in.
        a.on_read(0, 8, 1 << 30, LIM);
        let (first, last) = a.on_read(700 * MB, 700 * MB + 4096, 1 << 30, LIM);
        assert_eq!((first, last), (87, 88));
        assert_eq!(a.window(), 0);
        // A first read that is not at the start is random too.
        let mut b = ReadAhead::default();
        assert_eq!(b.on_read(100 * MB, 101 * MB, 1 << 30, LIM), (12, 13));
    }

    #[test]
    fn the_window_stops_at_the_end_of_the_file() {
        let mut a = ReadAhead::default();
        assert_eq!(a.on_read(0, 100, 1000, LIM), (0, 1));
        let mut b = ReadAhead::default();
        assert_eq!(b.on_read(0, 4096, 20 * MB, LIM), (0, 2));
    }
}
