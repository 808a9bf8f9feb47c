//! How far ahead of a file handle's reads its blocks are fetched — pure.
//!
//! A handle that reads on from where its last read ended (or a little
//! back, or at most one block forward: the kernel's reads of one stream
//! arrive on several threads, not always in order) is a stream: its
//! window starts at one block and doubles with each read that keeps the
//! stream going, up to the most allowed, so a sequential reader soon has
//! many ranged reads in flight while one that reads a header and jumps
//! costs at most one block ahead. A read anywhere else is random: the
//! window falls back to nothing, and only the blocks the read covers are
//! fetched (a safetensors file's tensors, a checkpoint's parts).

/// A handle's read pattern.
#[derive(Debug, Clone, Default)]
pub struct Ahead {
    /// Where the last read ended; `None` before the first.
    end: Option<u64>,
    /// Bytes fetched beyond the read's end.
    window: u64,
}

impl Ahead {
    /// The blocks (`first..last`, of `block` bytes in a file of `size`)
    /// to have, for a read of `off..end`: those it covers and the window
    /// ahead of them, at most `max` bytes beyond `end`.
    pub fn on_read(&mut self, off: u64, end: u64, size: u64, block: u64, max: u64) -> (u64, u64) {
        let block = block.max(1);
        let stream = match self.end {
            None => off == 0,
            Some(e) => off + block >= e && off <= e + block,
        };
        self.window = if stream {
            (self.window * 2).clamp(block, max.max(block))
        } else {
            0
        };
        self.end = Some(end);
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

    #[test]
    fn a_stream_grows_its_window_to_the_most() {
        let mut a = Ahead::default();
        let (size, block, max) = (1 << 30, 8 * MB, 64 * MB);
        let mut windows = Vec::new();
        for i in 0..8 {
            let (first, last) = a.on_read(i * MB, (i + 1) * MB, size, block, max);
            assert_eq!(first, 0);
            windows.push(a.window());
            assert_eq!(last, ((i + 1) * MB + a.window()).div_ceil(block));
        }
        assert_eq!(windows, [8, 16, 32, 64, 64, 64, 64, 64].map(|w| w * MB));
    }

    #[test]
    fn reads_out_of_order_by_less_than_a_block_stay_a_stream() {
        let mut a = Ahead::default();
        a.on_read(0, MB, 1 << 30, 8 * MB, 64 * MB);
        a.on_read(2 * MB, 3 * MB, 1 << 30, 8 * MB, 64 * MB);
        a.on_read(MB, 2 * MB, 1 << 30, 8 * MB, 64 * MB);
        assert_eq!(a.window(), 32 * MB);
    }

    #[test]
    fn a_jump_is_random_and_fetches_only_what_it_reads() {
        let mut a = Ahead::default();
        // A header at the start, then a tensor far in.
        a.on_read(0, 8, 1 << 30, 8 * MB, 64 * MB);
        let (first, last) = a.on_read(700 * MB, 700 * MB + 4096, 1 << 30, 8 * MB, 64 * MB);
        assert_eq!((first, last), (87, 88));
        assert_eq!(a.window(), 0);
        // A first read that is not at the start is random too.
        let mut b = Ahead::default();
        assert_eq!(
            b.on_read(100 * MB, 101 * MB, 1 << 30, 8 * MB, 64 * MB),
            (12, 13)
        );
    }

    #[test]
    fn the_window_stops_at_the_end_of_the_file() {
        let mut a = Ahead::default();
        assert_eq!(a.on_read(0, 100, 1000, 8 * MB, 64 * MB), (0, 1));
        let mut b = Ahead::default();
        assert_eq!(b.on_read(0, 4096, 20 * MB, 8 * MB, 64 * MB), (0, 2));
    }
}
