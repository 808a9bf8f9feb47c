//! The seeded shuffle buffer: pure, generic over what it holds, so the
//! plan's simulation (`delivery.rs`) shuffles sample indices with the very
//! code the engine's shuffler runs on real samples.

use super::PlanOptions;
use super::rng::{Rng, TAG_SHUFFLE};

/// A seeded shuffle buffer. Output starts once it holds `initial` items;
/// from then on every item in takes one random item out, except that while
/// it is below `cap` every other item in grows it by one instead.
#[derive(Debug)]
pub struct ShuffleBuffer<T> {
    items: Vec<T>,
    cap: usize,
    level: usize,
    started: bool,
    grow: bool,
    rng: Rng,
    /// Where the last item taken out was (it was swap-removed from there),
    /// so a caller can mirror the buffer in arrays of its own.
    taken: usize,
}

impl<T> ShuffleBuffer<T> {
    pub fn new(cap: usize, initial: usize, rng: Rng) -> Self {
        let cap = cap.max(1);
        ShuffleBuffer {
            items: Vec::with_capacity(cap.min(1 << 16) + 1),
            cap,
            level: initial.clamp(1, cap),
            started: false,
            grow: false,
            rng,
            taken: 0,
        }
    }

    /// A generator for stream `stream` of `opts`'s consumer in `epoch`.
    pub fn for_stream(opts: &PlanOptions, epoch: u64, stream: usize) -> Self {
        let (cap, initial) = opts.stream_buffer(stream);
        let rng = Rng::new(
            opts.seed,
            &[TAG_SHUFFLE, epoch, opts.consumer, stream as u64],
        );
        ShuffleBuffer::new(cap, initial, rng)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn items(&self) -> &[T] {
        &self.items
    }

    pub fn items_mut(&mut self) -> &mut [T] {
        &mut self.items
    }

    fn take_random(&mut self) -> T {
        let k = self.rng.below(self.items.len() as u64) as usize;
        let out = self.items.swap_remove(k);
        self.taken = k;
        self.prefetch_next();
        out
    }

    /// Starts loading the item the next take will most likely pick (in the
    /// steady state the buffer holds one more then): the buffer is far
    /// larger than the caches, and its items are taken at random, so
    /// without this every take waits on memory. A hint only: the order is
    /// the generator's either way.
    fn prefetch_next(&mut self) {
        let len = self.items.len() as u64 + 1;
        let k = ((u128::from(self.rng.peek()) * u128::from(len)) >> 64) as usize;
        if let Some(item) = self.items.get(k) {
            let p = (item as *const T).cast::<u8>();
            let size = std::mem::size_of::<T>();
            let mut off = 0;
            while off < size {
                // SAFETY: a prefetch never faults and reads nothing; the
                // address is inside `item`.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        p.add(off).cast(),
                    );
                }
                off += 64;
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = p;
        }
    }

    /// Puts an item in; may give one out.
    pub fn push(&mut self, item: T) -> Option<T> {
        self.items.push(item);
        if !self.started {
            if self.items.len() < self.level {
                return None;
            }
            self.started = true;
            return None;
        }
        if self.items.len() <= self.level {
            return None;
        }
        if self.level < self.cap && !self.grow {
            self.level += 1;
            self.grow = true;
            return None;
        }
        self.grow = false;
        Some(self.take_random())
    }

    /// The index the last item given out was swap-removed from.
    pub fn last_taken(&self) -> usize {
        self.taken
    }

    /// The next item of the end-of-stream drain.
    pub fn drain_one(&mut self) -> Option<T> {
        (!self.items.is_empty()).then(|| self.take_random())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffle_buffer_is_a_permutation() {
        let mut b = ShuffleBuffer::new(10, 3, super::Rng::new(1, &[]));
        let mut out: Vec<u32> = (0..100).filter_map(|i| b.push(i)).collect();
        while let Some(x) = b.drain_one() {
            out.push(x);
        }
        assert_ne!(out, (0..100).collect::<Vec<_>>());
        out.sort();
        assert_eq!(out, (0..100).collect::<Vec<_>>());
    }
}
