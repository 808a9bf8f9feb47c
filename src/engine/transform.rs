//! The image pipeline on a batch (the `transform` key): the sequencer
//! runs it on each batch, in the plan's order, before the batch enters the
//! ring, so the consumer receives decoded images and parsed labels.
//!
//! Each image field of a batch becomes one contiguous tensor (the batch's
//! images one after another, each of the spec's shape and type), each
//! label field an array of numbers; the samples' fields are pointed at
//! their rows, so a consumer that reads fields (C, Python) sees one
//! decoded image per sample and can view the whole batch as one tensor
//! without a copy. The tensors live in slots of one arena made at open
//! and reused (a first touch of fresh memory is dear: ~2 ms a MB on this
//! project's VMs); the batch holds its slot until it is dropped. That
//! arena is made like the chunks' (`memory_kind`, `lock_memory`, on the
//! same NUMA node) and registered with CUDA like it (`cuda_register`; under
//! "auto" by the prefault thread once the first batch is out), so a copy
//! of a batch's tensor to a GPU is a DMA transfer from pinned pages.
//!
//! The samples are split among `transform_threads` threads, each writing
//! its own rows. Every sample's random choices are keyed by the loader's
//! seed, the epoch and the sample's position in the epoch's order
//! (`crate::image::draw`), so pixels do not depend on the threads, and a
//! resumed epoch (whose skipped batches the sequencer still counts) draws
//! what the uninterrupted one drew.

use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::{Config, Toggle};
use crate::error::{Error, Result};
use crate::image::budget::Budget;
use crate::image::{self, LabelType, OnError, Scratch, Transform};
use crate::memory::{Arena, ArenaOptions, Batch, RawField, cuda};
use crate::sync::Locked;

/// Slots beyond the ring's depth: batches the consumer holds (a training
/// step keeps one or two; a DataLoader's pin-memory thread one more).
/// A consumer that holds more gets slots of their own, made as needed and
/// freed with their batches: holding batches never stops the pipeline.
const HELD_SLOTS: usize = 6;

/// Bytes a slot's regions are aligned to (a cache line; numpy and torch
/// views need only the element's alignment).
const ALIGN: usize = 64;

/// The fixed slots the tensors are written into.
struct Slots {
    map: Arena,
    bytes: usize,
    free: Mutex<Vec<usize>>,
}

/// The memory one batch's tensors are written into.
enum Slot {
    /// One of the pool's, returned to its free list when the batch drops.
    Pooled { slots: Arc<Slots>, index: usize },
    /// A mapping of its own, made while every pooled slot was held (the
    /// consumer keeps more batches than the pool has room for), unmapped
    /// when the batch drops.
    Own(memmap2::MmapMut),
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Slot::Pooled { slots, index } = self {
            let mut f = slots.free.locked();
            f.push(*index);
        }
    }
}

impl Slot {
    fn base(&self) -> *mut u8 {
        match self {
            // SAFETY: index < the slot count, so the offset is inside the map.
            Slot::Pooled { slots, index } => unsafe { slots.map.base().add(index * slots.bytes) },
            Slot::Own(m) => m.as_ptr().cast_mut(),
        }
    }
}

impl Slots {
    /// A free slot of the pool, or, when the consumer holds them all, one
    /// of its own (the ring bounds how far the pipeline runs ahead, so
    /// only batches the consumer keeps make these).
    fn take(self: &Arc<Self>) -> Result<Slot> {
        let index = self.free.locked().pop();
        match index {
            Some(index) => Ok(Slot::Pooled {
                slots: Arc::clone(self),
                index,
            }),
            None => memmap2::MmapMut::map_anon(self.bytes)
                .map(Slot::Own)
                .map_err(|e| {
                    Error::Memory(format!(
                        "cannot map {} bytes for a batch's `transform` tensors (the consumer holds \
                     every pooled slot): {e}",
                        self.bytes
                    ))
                }),
        }
    }
}

/// Where each field's rows go in a slot.
#[derive(Debug, Clone)]
struct Region {
    offset: usize,
    /// Bytes of one sample's row.
    row: usize,
}

/// A batch's field array, read by the transform's threads.
struct Fields<'a>(&'a [RawField]);

// SAFETY: the fields' pointers point into chunks the batch holds and into
// its tables, read-only while the transform runs (the batch is borrowed
// for the whole `thread::scope`).
unsafe impl Sync for Fields<'_> {}

/// Registers an arena with CUDA as `cuda_register` asks, noting a refusal;
/// the runtime to register with later, under "auto".
pub(crate) type RegisterCuda<'a> =
    &'a dyn Fn(&Arena, &mut Vec<String>) -> Result<Option<&'static cuda::Runtime>>;

/// The `transform` of one loader.
pub(crate) struct Transformer {
    spec: Transform,
    on_error: OnError,
    /// The CPUs the threads run on (None: wherever the process may).
    cpus: Option<Vec<usize>>,

    seed: u64,
    threads: usize,
    images: Vec<Region>,
    labels: Vec<Region>,
    slots: Arc<Slots>,
    /// The CUDA runtime to register the slots with once the first batch is
    /// out (`cuda_register` "auto"), as the arena is.
    cuda_later: Option<&'static cuda::Runtime>,
    /// What the slots' memory did not get (huge pages, mlock, CUDA).
    notes: Vec<String>,
    /// The decode memory the threads share (`decode_memory`).
    budget: Arc<Budget>,
    /// Samples whose images and labels were made (kept or skipped).
    transformed: AtomicU64,
}

fn label_bytes(t: LabelType) -> usize {
    match t {
        LabelType::I64 => 8,
        LabelType::I32 | LabelType::F32 => 4,
    }
}

impl Transformer {
    /// The transformer of `cfg`'s `transform`, with its slots (None when
    /// there is no transform).
    /// `cpus`: the CPUs its threads run on (`topology::transform_cpus`;
    /// None: not pinned); `numa_node`: where the slots' pages go (the
    /// arena's node); `register_cuda`: registers the slots' arena as the
    /// chunks' arena is (`setup::register_cuda`), returning the runtime
    /// to register with later.
    pub(crate) fn new(
        cfg: &Config,
        cpus: Option<Vec<usize>>,
        numa_node: Option<usize>,
        register_cuda: RegisterCuda<'_>,
    ) -> Result<Option<Transformer>> {
        let Some(spec) = cfg.transform.clone() else {
            return Ok(None);
        };
        let bs = cfg.batch_size.max(1);
        let mut at = 0usize;
        let mut region = |row: usize| {
            let r = Region { offset: at, row };
            at = (at + row * bs).next_multiple_of(ALIGN);
            r
        };
        let images: Vec<Region> = spec.images.iter().map(|i| region(i.out_bytes())).collect();
        let labels: Vec<Region> = spec
            .labels
            .iter()
            .map(|l| region(label_bytes(l.ty)))
            .collect();
        let bytes = at.max(ALIGN);
        let count = cfg.prefetch_batches.max(2) + HELD_SLOTS;
        let opts = ArenaOptions {
            kind: cfg.memory_kind,
            lock: cfg.lock_memory.required(),
            // Registered with CUDA at open: every page in now.
            prefault: cfg.cuda_register == Toggle::On,
            shared: false,
        };
        let map = Arena::new_on_node(bytes * count, opts, numa_node).map_err(|e| {
            Error::Memory(format!(
                "cannot map {count} slots of {bytes} bytes for the `transform` tensors: {e}"
            ))
        })?;
        let mut notes: Vec<String> = map
            .report()
            .notes
            .iter()
            .map(|n| format!("`transform` tensors: {n}"))
            .collect();
        let cuda_later = register_cuda(&map, &mut notes)?;
        let threads = match (cfg.transform_threads, &cpus) {
            (0, Some(set)) => set.len(),
            (0, None) => std::thread::available_parallelism().map_or(1, |n| n.get()),
            (n, _) => n,
        };
        Ok(Some(Transformer {
            spec,
            on_error: cfg.image_errors,
            cpus,
            seed: cfg.seed,
            threads,
            images,
            labels,
            slots: Arc::new(Slots {
                map,
                bytes,
                free: Mutex::new((0..count).rev().collect()),
            }),
            cuda_later,
            notes,
            budget: Arc::new(Budget::new(cfg.decode_memory)),
            transformed: AtomicU64::new(0),
        }))
    }

    /// Transforms batch `b` of `epoch`, whose first sample is at
    /// `position` of the epoch's order.
    /// Samples whose image or label cannot be made fail the batch, or
    /// with `image_errors = "skip"` leave it (counted in `skipped`).
    pub(crate) fn run(
        &self,
        b: &mut Batch,
        epoch: u64,
        position: u64,
        skipped: &AtomicU64,
    ) -> Result<()> {
        let n = b.len();
        if n == 0 {
            return Ok(());
        }
        // Which field of the batch's field array each spec takes, sample by sample.
        let wanted: Vec<&str> = self
            .spec
            .images
            .iter()
            .map(|i| i.field.as_str())
            .chain(self.spec.labels.iter().map(|l| l.field.as_str()))
            .collect();
        let fields = b.raw_fields();
        let base_ptr = fields.as_ptr();
        let mut at: Vec<usize> = Vec::with_capacity(n * wanted.len());
        for (s, sample) in b.raw_samples().iter().enumerate() {
            for name in &wanted {
                let found = (0..sample.field_count).find(|j| {
                    // SAFETY: `fields` points at `field_count` entries of the
                    // batch's field array, whose names are NUL-terminated in
                    // the batch's name table.
                    let name_of = unsafe { CStr::from_ptr((*sample.fields.add(*j)).name) };
                    name_of.to_bytes() == name.as_bytes()
                });
                match found {
                    Some(j) => {
                        // SAFETY: both pointers are into the batch's field array.
                        let i = unsafe { sample.fields.add(j).offset_from(base_ptr) };
                        at.push(i as usize);
                    }
                    None => return Err(self.missing(b, s, name)),
                }
            }
        }
        let slot = self.slots.take()?;
        let base = slot.base() as usize;
        let per = wanted.len();
        let threads = self.threads.min(n).max(1);
        // The samples that failed, with their errors (all of them when
        // skipping; the first in the batch's order when failing).
        let failed: Mutex<Vec<(usize, Error)>> = Mutex::new(Vec::new());
        let skip = self.on_error == OnError::Skip;
        let fields = Fields(b.raw_fields());
        let cpus = self.cpus.as_deref();
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (lo, hi) = (n * t / threads, n * (t + 1) / threads);
                let at = &at;
                let failed = &failed;
                let fields = &fields;
                scope.spawn(move || {
                    if let Some(cpus) = cpus {
                        // Best effort: a refused mask leaves the thread
                        // where the process may run, which is correct.
                        let _ = crate::topology::pin_current_thread_to(cpus);
                    }
                    let mut scratch = Scratch::with_budget(Arc::clone(&self.budget));
                    for s in lo..hi {
                        let mine = &at[s * per..(s + 1) * per];
                        if let Err(e) =
                            self.sample(fields.0, mine, s, base, epoch, position, &mut scratch)
                        {
                            let mut f = failed.locked();
                            f.push((s, e));
                            if !skip {
                                return;
                            }
                        }
                    }
                });
            }
        });
        let mut failed = failed.into_inner().unwrap_or_else(|p| p.into_inner());
        failed.sort_by_key(|(s, _)| *s);
        if !skip && !failed.is_empty() {
            let (s, e) = failed.swap_remove(0);
            return Err(self.named(b, s, e));
        }
        // Relaxed: a statistic.
        self.transformed.fetch_add(n as u64, Ordering::Relaxed);
        let gone: Vec<usize> = failed.iter().map(|(s, _)| *s).collect();
        for (s, e) in failed {
            let e = self.named(b, s, e);
            crate::log::log(crate::log::Level::Warn, || {
                format!("image_errors = \"skip\": sample left out of its batch: {e}")
            });
        }
        // The kept samples' rows, moved up over the gaps so each tensor
        // stays one block of `len()` rows.
        let mut row = 0usize;
        let mut g = gone.iter().peekable();
        for s in 0..n {
            if g.peek() == Some(&&s) {
                g.next();
                continue;
            }
            for (k, r) in self.images.iter().chain(&self.labels).enumerate() {
                let from = base + r.offset + s * r.row;
                let to = base + r.offset + row * r.row;
                if to != from {
                    // SAFETY: both rows lie in the slot; `to` is an earlier
                    // row, written, whose sample was left out or moved.
                    unsafe { std::ptr::copy(from as *const u8, to as *mut u8, r.row) };
                }
                // SAFETY: the row lies in the slot, written above and not
                // written again while the batch (which keeps the slot) lives.
                unsafe { b.retarget(at[s * per + k], to as *const u8, r.row) };
            }
            row += 1;
        }
        if !gone.is_empty() {
            skipped.fetch_add(gone.len() as u64, Ordering::Relaxed);
            b.remove_samples(&gone);
        }
        b.keep(Box::new(slot));
        Ok(())
    }

    /// Registers the slots with CUDA when `cuda_register` "auto" left it
    /// for after the first batch (the prefault thread calls it, as for the
    /// arena); a refusal shows in [`Transformer::notes`].
    pub(crate) fn register_cuda_later(&self) {
        if let Some(rt) = self.cuda_later {
            let _ = self.slots.map.register_cuda(rt);
        }
    }

    /// Bytes of the slots registered with CUDA.
    pub(crate) fn cuda_registered(&self) -> usize {
        self.slots.map.cuda_registered()
    }

    /// What the slots' memory did not get, for the stats' notes.
    pub(crate) fn notes(&self) -> Vec<String> {
        let mut n = self.notes.clone();
        n.extend(
            self.slots
                .map
                .cuda_refused()
                .map(|e| format!("`transform` tensors: {}", cuda::not_registered(e))),
        );
        n
    }

    /// The decode memory budget the threads share, and what it saw.
    pub(crate) fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Samples transformed so far (the stats' `images_transformed`).
    pub(crate) fn transformed(&self) -> u64 {
        // Relaxed: a statistic.
        self.transformed.load(Ordering::Relaxed)
    }

    /// Threads a batch is split among.
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// The CPUs the threads run on (empty: not pinned).
    pub(crate) fn cpus(&self) -> &[usize] {
        self.cpus.as_deref().unwrap_or(&[])
    }

    /// Sample `s`'s images and labels into their rows of the slot at `base`.
    #[allow(clippy::too_many_arguments)]
    fn sample(
        &self,
        fields: &[RawField],
        at: &[usize],
        s: usize,
        base: usize,
        epoch: u64,
        position: u64,
        scratch: &mut Scratch,
    ) -> Result<()> {
        let data = |i: usize| {
            let f = &fields[at[i]];
            // SAFETY: a field's data is `len` bytes in a chunk the batch
            // holds, read-only while it lives.
            unsafe { std::slice::from_raw_parts(f.data, f.len) }
        };
        for (k, (spec, r)) in self.spec.images.iter().zip(&self.images).enumerate() {
            // SAFETY: sample `s`'s row of this region: in the slot, and
            // written by this thread alone (threads take disjoint samples).
            let out = unsafe {
                std::slice::from_raw_parts_mut((base + r.offset + s * r.row) as *mut u8, r.row)
            };
            image::apply(
                spec,
                data(k),
                self.seed,
                epoch,
                position + s as u64,
                scratch,
                out,
            )?;
        }
        let first = self.spec.images.len();
        for (k, (spec, r)) in self.spec.labels.iter().zip(&self.labels).enumerate() {
            let v = image::label(spec, data(first + k))?;
            // SAFETY: as for the images.
            let out = unsafe {
                std::slice::from_raw_parts_mut((base + r.offset + s * r.row) as *mut u8, r.row)
            };
            match spec.ty {
                LabelType::I64 => out.copy_from_slice(&(v as i64).to_le_bytes()),
                LabelType::I32 => out.copy_from_slice(&(v as i32).to_le_bytes()),
                LabelType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
            }
        }
        Ok(())
    }

    fn key(b: &Batch, s: usize) -> String {
        // SAFETY: a sample's key is NUL-terminated in the batch's key table.
        let key = unsafe { CStr::from_ptr(b.raw_samples()[s].key) };
        key.to_string_lossy().into_owned()
    }

    fn missing(&self, b: &Batch, s: usize, field: &str) -> Error {
        Error::Image {
            field: field.to_string(),
            reason: format!(
                "sample `{}` of shard `{}` has no such field",
                Self::key(b, s),
                crate::redact::url(b.source(s).unwrap_or("?"))
            ),
        }
    }

    /// `e`, from sample `s`, with the sample's key and shard.
    fn named(&self, b: &Batch, s: usize, e: Error) -> Error {
        match e {
            Error::Image { field, reason } => Error::Image {
                field,
                reason: format!(
                    "{reason} (sample `{}` of shard `{}`)",
                    Self::key(b, s),
                    crate::redact::url(b.source(s).unwrap_or("?"))
                ),
            },
            e => e,
        }
    }
}
