//! The local cache tier (issue: repeated epochs from local NVMe). So far
//! its on-disk entry ([`entry`]): the format, the identity that keys it,
//! the atomic store and the checked load. The directory's size limit,
//! eviction, sharing between processes and the engine's use of it come
//! next; nothing in the engine reads or writes the cache yet.

pub mod entry;
