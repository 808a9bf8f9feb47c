//! The node engine's metrics, in the Prometheus text format: every attached
//! consumer's loader summed (counters, retries by kind), the shared
//! arena's chunks, and the engine's own gauges (`ringfeed_node_*`).

use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use super::engine::Engine;
use crate::engine::Loader;
use crate::sync::Locked;

pub(super) fn text(engine: &Engine) -> String {
    let loaders: Vec<Arc<Loader>> = engine
        .loaders
        .locked()
        .values()
        .filter_map(Weak::upgrade)
        .collect();
    // Counters and retries summed over the consumers' loaders; the setup
    // (backend, memory) is the first one's, the same for all.
    let mut sum = serde_json::Map::new();
    for l in &loaders {
        let Ok(Value::Object(one)) = serde_json::to_value(l.stats()) else {
            continue;
        };
        for (k, v) in one {
            match (sum.get_mut(&k), &v) {
                (Some(Value::Number(a)), Value::Number(b)) => {
                    let total = a.as_f64().unwrap_or(0.0) + b.as_f64().unwrap_or(0.0);
                    if let Some(n) = serde_json::Number::from_f64(total) {
                        *a = n;
                    }
                }
                (Some(Value::Object(a)), Value::Object(b)) if k == "retries" => {
                    for (kind, n) in b {
                        let total = a.get(kind).and_then(Value::as_f64).unwrap_or(0.0)
                            + n.as_f64().unwrap_or(0.0);
                        a.insert(kind.clone(), json!(total));
                    }
                }
                (None, _) => {
                    sum.insert(k, v);
                }
                _ => {}
            }
        }
    }
    // The arena is the engine's, not each loader's.
    let usage = engine.pool.usage();
    sum.insert("chunk_count".into(), json!(engine.pool.chunk_count()));
    sum.insert("chunks_in_use".into(), json!(usage.in_use));
    sum.insert("chunks_peak".into(), json!(usage.peak));
    sum.insert("chunk_size".into(), json!(engine.pool.chunk_size()));
    sum.insert("arena_bytes".into(), json!(engine.pool.arena().len()));
    for k in [
        "epoch",
        "workers",
        "shards_total",
        "time_to_first_batch_ns",
        "elapsed_ns",
    ] {
        sum.remove(k);
    }
    let mut text = crate::engine::prometheus(&Value::Object(sum).to_string()).unwrap_or_default();
    let n = engine.node_stats(None);
    for (name, help, v) in [
        (
            "ringfeed_node_consumers",
            "Consumers attached now.",
            n.consumers,
        ),
        (
            "ringfeed_node_holders",
            "Processes linked to keep batches they did not read.",
            engine.whole.holders.load(Ordering::Relaxed) as u64,
        ),
        (
            "ringfeed_node_batches_held",
            "Batches handed to consumers and not yet freed.",
            n.batches_held,
        ),
        (
            "ringfeed_node_batches_kept",
            "Batches kept by processes other than the consumer that took them.",
            n.batches_kept,
        ),
        (
            "ringfeed_node_batches_in_transit",
            "Batches shipped by their consumer and not yet kept by a receiver.",
            n.batches_in_transit,
        ),
    ] {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}\n"
        ));
    }
    let name = "ringfeed_node_attached_total";
    text.push_str(&format!(
        "# HELP {name} Consumers attached since the engine started.\n# TYPE {name} counter\n{name} {}\n",
        n.consumers_attached
    ));
    text
}
