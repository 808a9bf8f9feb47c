//! The tar walk: a pure state machine that turns the bytes of one shard, fed
//! as a sequence of segments (the chunks a worker filled, in file order), into
//! member events, without copying member data.
//!
//! It understands ustar (with the `prefix` field, read only under the POSIX
//! magic: old GNU headers keep atime and ctime there), GNU long names and
//! long links (`L`/`K`), and pax extended headers (`x` and Solaris `X`:
//! `path`, `size`; `g` is skipped). Only regular files become members; every
//! other entry type (hard links included, as WebDataset skips them) is
//! skipped and counted. GNU sparse members and compressed shards are
//! refused with an error that says how to rewrite the shard. The rules, and
//! how they match WebDataset's, are in docs/webdataset-compat.md. A member that lies whole inside one segment is
//! reported by its range in that segment; a member that crosses a segment end
//! is reported in pieces (`split_begin`, then `split_more` until `last`), and
//! the shell decides where its bytes come together (see `engine::worker`:
//! `ShardSink::split_more` and its spill runs).
//!
//! Metadata that crosses a segment end (a 512-byte header, a long name, a pax
//! record block) is buffered here: it is small and bounded by `META_LIMIT`.
//!
//! `count_samples` drives the same walk over a shard read at random offsets,
//! reading only headers and extended-header records and passing over member
//! data unread, so the loader learns a shard's sample count at open without
//! reading the shard; sharing the walk keeps its verdicts (counts, errors and
//! their offsets) those of the worker's streaming walk.
//!
//! One file per concern:
//! - `header.rs`: the 512-byte header: numbers, checksum, names, pax records;
//! - `walk.rs`: [`TarWalk`] and [`MemberSink`], the streaming walk over
//!   arbitrary segment splits;
//! - `count.rs`: [`count_samples`] and [`count_file_samples`], the
//!   header-only counter;
//! - `prefix.rs`: [`count_prefix`], the samples a shard's first bytes hold
//!   whole (the estimate behind a nominal epoch);
//! - `sample.rs`: [`split_name`] and [`lowercase_field`], a member's sample
//!   key and field as WebDataset names them.

pub(crate) mod count;
#[cfg(test)]
mod fixtures;
mod header;
pub(crate) mod prefix;
pub(crate) mod sample;
pub(crate) mod walk;

pub use count::count_file_samples;
pub(crate) use prefix::count_prefix;

#[cfg(test)]
pub(crate) use header::{BLOCK, parse_number};
pub(crate) use sample::{lowercase_field, split_name};
pub(crate) use walk::{MemberSink, TarWalk};
