//! The log callback and the metrics, as a program embedding the library
//! meets them: a fallback (direct reads refused on tmpfs) reaches the C log
//! callback once, at warning level, with the path; retries of a faulty
//! server reach it too; and the metrics text is well formed Prometheus
//! (`# HELP`/`# TYPE` before each family, names `ringfeed_*`, counters
//! ending in `_total`) with the figures the stats give.
//!
//! One test in its own binary: the log sink is process-wide.

use ringfeed_test_support as support;

use std::ffi::{CStr, c_char, c_void};
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Loader};

static LOGGED: Mutex<Vec<(i32, String)>> = Mutex::new(Vec::new());

unsafe extern "C" fn collect(user: *mut c_void, level: i32, message: *const c_char) {
    assert_eq!(user as usize, 0x5eed, "the user pointer comes back");
    // SAFETY: the library passes a NUL-terminated message for the call.
    let text = unsafe { CStr::from_ptr(message) }
        .to_string_lossy()
        .into_owned();
    LOGGED.lock().unwrap().push((level, text));
}

/// Two shards in `dir`: their paths, and the samples the generator wrote.
fn generate(dir: &std::path::Path, seed: u64) -> (Vec<String>, usize) {
    let o = GenOptions {
        shards: 2,
        shard_bytes: 1 << 20,
        sample_bytes: 50_000,
        spread: 0.5,
        fields: vec!["jpg".into(), "cls".into()],
        seed,
    };
    let made = synth::generate(dir, &o, |_| {}).unwrap();
    let paths = made.paths.iter().map(|p| p.display().to_string()).collect();
    (paths, made.samples as usize)
}

fn config(urls: serde_json::Value, extra: serde_json::Value) -> Config {
    let mut m = serde_json::Map::new();
    m.insert("urls".into(), urls);
    m.insert("memory_budget".into(), serde_json::json!("16MiB"));
    m.insert("chunk_size".into(), serde_json::json!("1MiB"));
    if let serde_json::Value::Object(e) = extra {
        m.extend(e);
    }
    Config::from_map(&m).unwrap()
}

/// Checks the text format: families announced before their samples, names
/// by the conventions; gives each sample's name (with labels) and value.
fn parse_metrics(text: &str) -> Vec<(String, f64)> {
    let mut typed = std::collections::HashMap::new();
    let mut helped = std::collections::HashSet::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(helped.insert(name.to_string()), "HELP twice for {name}");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut f = rest.split(' ');
            let (name, kind) = (f.next().unwrap(), f.next().unwrap());
            assert!(helped.contains(name), "TYPE before HELP: {name}");
            assert!(["counter", "gauge"].contains(&kind), "{line}");
            if kind == "counter" {
                assert!(name.ends_with("_total"), "a counter without _total: {name}");
            }
            typed.insert(name.to_string(), kind.to_string());
        } else {
            let (series, value) = line.rsplit_once(' ').expect("`name value`");
            let name = series.split('{').next().unwrap();
            assert!(
                name.starts_with("ringfeed_")
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "metric name {name}"
            );
            assert!(typed.contains_key(name), "a sample before its TYPE: {line}");
            samples.push((series.to_string(), value.parse::<f64>().expect(line)));
        }
    }
    samples
}

#[test]
fn fallbacks_and_retries_reach_the_log_callback_and_metrics_are_prometheus_text() {
    // SAFETY: `collect` may be called from any thread for the process's life.
    let st = unsafe {
        ringfeed::ffi::ringfeed_set_log_callback(
            Some(collect),
            0x5eed as *mut c_void,
            ringfeed::ffi::RINGFEED_LOG_DEBUG,
        )
    };
    assert_eq!(st, 0);
    // A level outside the four is refused.
    // SAFETY: as above.
    let bad =
        unsafe { ringfeed::ffi::ringfeed_set_log_callback(Some(collect), std::ptr::null_mut(), 9) };
    assert_eq!(bad, ringfeed::ffi::RINGFEED_ERR_INVALID_ARGUMENT);

    // Direct reads asked for shards on tmpfs: refused, read buffered.
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let (urls, samples) = generate(shm.path(), 3);
    for _ in 0..2 {
        let loader = Loader::open(config(
            serde_json::json!(urls),
            serde_json::json!({"direct_io": "on"}),
        ))
        .unwrap();
        assert_eq!(support::stream(&loader, 3), samples);
    }
    let logged = LOGGED.lock().unwrap().clone();
    let direct: Vec<_> = logged
        .iter()
        .filter(|(_, m)| m.contains("read buffered, not direct"))
        .collect();
    assert_eq!(direct.len(), 1, "once per process: {logged:#?}");
    assert_eq!(direct[0].0, ringfeed::ffi::RINGFEED_LOG_WARN);
    assert!(
        direct[0].1.contains(shm.path().to_str().unwrap()),
        "{}",
        direct[0].1
    );

    // Retries: a server that throttles twice.
    let data = tempfile::tempdir().unwrap();
    let (_, samples) = generate(data.path(), 4);
    let server = support::Server::start(data.path().to_path_buf());
    server.faults.throttle.store(2, Ordering::SeqCst);
    let loader = Loader::open(config(
        serde_json::json!([server.url("shard-{000000..000001}.tar")]),
        serde_json::json!({}),
    ))
    .unwrap();
    assert_eq!(support::stream(&loader, 4), samples);
    let logged = LOGGED.lock().unwrap().clone();
    let retries: Vec<_> = logged
        .iter()
        .filter(|(_, m)| m.contains("retrying"))
        .collect();
    assert_eq!(retries.len(), 2, "{logged:#?}");
    assert_eq!(retries[0].0, ringfeed::ffi::RINGFEED_LOG_WARN);
    assert_eq!(retries[1].0, ringfeed::ffi::RINGFEED_LOG_DEBUG);
    assert!(retries[0].1.contains("throttled"), "{}", retries[0].1);

    // The metrics of that loader.
    let stats = loader.stats();
    let text = ringfeed::engine::prometheus(&serde_json::to_string(&stats).unwrap()).unwrap();
    let samples = parse_metrics(&text);
    let get = |series: &str| {
        samples
            .iter()
            .find(|(s, _)| s == series)
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
            .1
    };
    assert_eq!(
        get("ringfeed_delivered_samples_total"),
        stats.samples_delivered as f64
    );
    assert_eq!(
        get("ringfeed_delivered_bytes_total"),
        stats.bytes_delivered as f64
    );
    assert_eq!(get("ringfeed_retries_total{kind=\"throttled\"}"), 2.0);
    assert_eq!(get("ringfeed_arena_bytes"), stats.arena_bytes as f64);
    assert!(text.contains("ringfeed_info{version=\""), "{text}");

    // Unset: nothing more is called.
    // SAFETY: NULL stops the log.
    unsafe {
        ringfeed::ffi::ringfeed_set_log_callback(None, std::ptr::null_mut(), 0);
    }
    let before = LOGGED.lock().unwrap().len();
    server.faults.throttle.store(1, Ordering::SeqCst);
    let again = Loader::open(config(
        serde_json::json!([server.url("shard-000000.tar")]),
        serde_json::json!({}),
    ))
    .unwrap();
    support::stream(&again, 4);
    assert_eq!(LOGGED.lock().unwrap().len(), before);
}
