//! What the credential-refresh tests share (`tests/s3_refresh*.rs`): a
//! dataset of four shards in the S3 test server's bucket, a loader whose
//! small memory budget keeps it reading for as long as the consumer takes,
//! and a consumer that reads it slowly (a minute), checking every byte.

use std::path::Path;
use std::time::Duration;

use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Loader};

use super::s3::S3Server;

pub const BUCKET: &str = "ringfeed-data";
pub const SEED: u64 = 61;
/// The consumer's pause per batch: ~80 batches take about a minute.
pub const PAUSE: Duration = Duration::from_millis(700);

/// The AWS variables of the machine running the tests, cleared so only
/// the source a test sets is found.
pub const AWS_VARS: [&str; 12] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
];

/// Four shards of about 2 MiB, samples of about 20 KB; returns the samples.
pub fn dataset(root: &Path) -> usize {
    let o = GenOptions {
        shards: 4,
        shard_bytes: 2 << 20,
        sample_bytes: 20_000,
        spread: 0.5,
        fields: vec!["bin".into(), "cls".into()],
        seed: SEED,
    };
    synth::generate(&root.join(BUCKET), &o, |_| {})
        .unwrap()
        .samples as usize
}

pub fn config(s3: &S3Server, extra: serde_json::Value) -> Config {
    // A budget of 2 MiB for 8 MiB of shards: reads go on for as long as
    // the consumer takes, not all at open.
    let mut m = serde_json::json!({
        "urls": [format!("s3://{BUCKET}/shard-{{000000..000003}}.tar")],
        "memory_budget": "2MiB",
        "chunk_size": "64KiB",
        "reads_in_flight": 2,
        "prefetch_batches": 2,
        "batch_size": 5,
        "workers": 2,
        "s3_endpoint": s3.endpoint(),
    });
    if let (Some(m), serde_json::Value::Object(e)) = (m.as_object_mut(), extra) {
        m.extend(e);
    }
    Config::from_map(m.as_object().unwrap()).unwrap()
}

/// Reads the whole dataset, pausing [`PAUSE`] after each batch; every
/// byte checked against the generator, no sample twice. Returns the
/// samples seen.
pub fn stream_slowly(loader: &Loader) -> usize {
    super::stream_paced(loader, SEED, PAUSE)
}
