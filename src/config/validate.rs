//! The checks of a configuration as a whole, after each key's value was
//! checked alone (`values.rs`): limits that depend on other keys, keys that
//! go together, and the bounds the engine and the resume format can hold.

use super::Config;
use crate::error::{Error, Result};

impl Config {
    /// The S3 keys that go together.
    pub(super) fn validate_s3(&self) -> Result<()> {
        let s3 = &self.s3;
        if s3.access_key_id.is_some() != s3.secret_access_key.is_some() {
            return Err(Error::config(
                "`aws_access_key_id` and `aws_secret_access_key` must be given together",
            ));
        }
        if s3.session_token.is_some() && s3.access_key_id.is_none() {
            return Err(Error::config(
                "`aws_session_token` needs `aws_access_key_id` and `aws_secret_access_key`",
            ));
        }
        if s3.unsigned && (s3.access_key_id.is_some() || s3.profile.is_some()) {
            return Err(Error::config(
                "`s3_unsigned` is true but credentials or a profile are given; choose one",
            ));
        }
        Ok(())
    }

    /// The whole-object keys' bounds. S3's own (a part of at least 5 MiB,
    /// 10,000 parts) are checked by the writer, which knows the target.
    pub(super) fn validate_objects(&self) -> Result<()> {
        const MIN_PART: u64 = 64 << 10;
        const MAX_PART: u64 = 5 << 30;
        if !(MIN_PART..=MAX_PART).contains(&self.part_size) {
            return Err(Error::config(format!(
                "`part_size` must be from 64 KiB to 5 GiB, got {}",
                self.part_size
            )));
        }
        if self.parts_in_flight > 256 {
            return Err(Error::config(format!(
                "`parts_in_flight` must be at most 256, got {}",
                self.parts_in_flight
            )));
        }
        Ok(())
    }

    /// Checks the values together (each was checked alone when parsed).
    pub fn validate(&self) -> Result<()> {
        if self.urls.is_empty() && self.manifest.is_none() {
            return Err(Error::config(
                "`urls` is required: give one or more dataset URLs or paths (or a `manifest`)",
            ));
        }
        self.validate_s3()?;
        self.validate_objects()?;
        if self.batch_size == 0 {
            return Err(Error::config("`batch_size` must be at least 1"));
        }
        const MIN_CHUNK: u64 = 64 << 10;
        if self.chunk_size != 0 && (self.chunk_size < MIN_CHUNK || self.chunk_size % 4096 != 0) {
            return Err(Error::config(format!(
                "`chunk_size` must be a multiple of 4096 and at least {MIN_CHUNK} bytes, got {}",
                self.chunk_size
            )));
        }
        if self.chunk_size > (1 << 30) {
            return Err(Error::config(format!(
                "`chunk_size` must be at most 1 GiB (the io_uring fixed-buffer limit), got {}",
                self.chunk_size
            )));
        }
        // Auto is checked here against the least chunk it picks, and once
        // picked against the workers' need (`engine::start_plan`).
        let (chunk, which) = match self.chunk_size {
            0 => (1 << 20, " (the least `chunk_size` auto picks)"),
            n => (n, ""),
        };
        let chunks = self.memory_budget / chunk;
        if self.memory_budget != 0 && chunks < 4 {
            return Err(Error::config(format!(
                "`memory_budget` of {} bytes holds {chunks} chunks of {chunk} bytes{which}; \
                 at least 4 are needed",
                self.memory_budget
            )));
        }
        if self.prefetch_batches == 0 {
            return Err(Error::config("`prefetch_batches` must be at least 1"));
        }
        if self.reads_in_flight > 256 {
            return Err(Error::config(format!(
                "`reads_in_flight` must be at most 256, got {}",
                self.reads_in_flight
            )));
        }
        if self.consumers() > crate::plan::resume::MAX_CONSUMERS {
            return Err(Error::config(format!(
                "`world_size` × `loader_workers` is {}; at most {} consumers are supported",
                self.consumers(),
                crate::plan::resume::MAX_CONSUMERS
            )));
        }
        if self.prefetch_batches > 4096 {
            return Err(Error::config(format!(
                "`prefetch_batches` must be at most 4096, got {}",
                self.prefetch_batches
            )));
        }
        if self.batch_size > 1 << 20 {
            return Err(Error::config(format!(
                "`batch_size` must be at most 1048576, got {}",
                self.batch_size
            )));
        }
        if self.samples_per_epoch > 1 << 40 {
            return Err(Error::config(format!(
                "`samples_per_epoch` must be at most 2^40, got {}",
                self.samples_per_epoch
            )));
        }
        if self.epoch > crate::plan::resume::MAX_EPOCH {
            return Err(Error::config(format!(
                "`epoch` must be at most 2^48, got {}",
                self.epoch
            )));
        }
        if self.rank >= self.world_size {
            return Err(Error::config(format!(
                "`rank` {} must be below `world_size` {}",
                self.rank, self.world_size
            )));
        }
        if self.loader_worker >= self.loader_workers {
            return Err(Error::config(format!(
                "`loader_worker` {} must be below `loader_workers` {}",
                self.loader_worker, self.loader_workers
            )));
        }
        if self
            .shuffle_initial
            .is_some_and(|i| i > self.shuffle_buffer)
        {
            return Err(Error::config(format!(
                "`shuffle_initial` {} must be at most `shuffle_buffer` {}",
                self.shuffle_initial.unwrap_or(0),
                self.shuffle_buffer
            )));
        }
        if self.shuffle_buffer > 1 << 24 {
            return Err(Error::config(format!(
                "`shuffle_buffer` must be at most {} samples, got {}",
                1 << 24,
                self.shuffle_buffer
            )));
        }
        if self.resampled && self.samples_per_epoch == 0 {
            return Err(Error::config(
                "`resampled` draws shards for ever: set `samples_per_epoch` to give epochs a length",
            ));
        }
        if self.workers > 1024 {
            return Err(Error::config(format!(
                "`workers` must be at most 1024, got {}",
                self.workers
            )));
        }
        if self.net_threads > 1024 {
            return Err(Error::config(format!(
                "`net_threads` must be at most 1024, got {}",
                self.net_threads
            )));
        }
        Ok(())
    }
}
