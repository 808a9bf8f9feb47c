//! `ringfeed bench`: stream a dataset through the loader and report GB/s,
//! samples/s, CPU time per GB, copies and memory, optionally checking every
//! field against the generator's pattern. The loader is opened as the C ABI
//! and Python open theirs ([`Attached`]), so `--config '{"node": ...}'`
//! benches a consumer attached to a node engine.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

use ringfeed::Config;
use ringfeed::consumer::{AnyBatch, AnyNext, Attached};
use ringfeed::synth;

use crate::AnyResult;
use crate::args::{LoaderArgs, ReportArgs, config_map_for};
use crate::tally::{Expected, SampleTally};

/// CLOCK_MONOTONIC now, in ns: the clock another process can read too, so a
/// benchmark can time from before it spawned this one to the first batch.
fn monotonic_ns() -> u64 {
    // SAFETY: timespec is plain data; clock_gettime fills it.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// User plus system CPU time of the whole process, and its peak RSS in bytes.
fn rusage() -> (Duration, u64) {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(u.ru_utime) + tv(u.ru_stime), u.ru_maxrss as u64 * 1024)
}

/// Calls `f` with each sample of `b`: its key and its fields (name, bytes).
fn for_each_sample(b: &AnyBatch, mut f: impl FnMut(&[u8], &[(&[u8], &[u8])])) {
    let fields = b.raw_fields();
    let mut named = Vec::new();
    for s in b.raw_samples() {
        named.clear();
        // SAFETY: the batch is alive: its key, names and data are valid, and
        // its samples' fields lie in its field array.
        unsafe {
            let key = std::ffi::CStr::from_ptr(s.key).to_bytes();
            let start = s.fields.offset_from(fields.as_ptr()) as usize;
            for fd in &fields[start..start + s.field_count] {
                let name = std::ffi::CStr::from_ptr(fd.name).to_bytes();
                named.push((name, std::slice::from_raw_parts(fd.data, fd.len)));
            }
            f(key, &named);
        }
    }
}

/// Fields of `b` whose bytes differ from the generator's for `seed`.
fn verify_failures(b: &AnyBatch, seed: u64) -> u64 {
    let mut bad = 0;
    for_each_sample(b, |key, fields| {
        for (name, data) in fields {
            if !synth::verify(seed, key, name, data) {
                bad += 1;
            }
        }
    });
    bad
}

/// Adds the samples of `b` to `tally`.
fn count_samples(b: &AnyBatch, tally: &mut SampleTally) {
    for_each_sample(b, |key, fields| {
        let names: Vec<&str> = fields
            .iter()
            .map(|(n, _)| std::str::from_utf8(n).unwrap_or("<not UTF-8>"))
            .collect();
        tally.sample(&String::from_utf8_lossy(key), &names);
    });
}

/// Streams `urls` and reports. With `expect` (the dataset was generated
/// here, as `demo` does), the samples delivered are counted against it too:
/// each generated sample exactly once per epoch.
pub(crate) fn bench(
    urls: Vec<String>,
    a: &LoaderArgs,
    out: &ReportArgs,
    expect: Option<&Expected>,
) -> AnyResult<()> {
    let source = urls.join(" ");
    let map = config_map_for(urls, a)?;
    let epochs = Config::from_map(&map)?.epochs.max(1);
    let loader = std::sync::Arc::new(Attached::open_json(&Value::Object(map).to_string())?);
    let budget = loader.stats()?.1.arena_bytes;
    let _metrics = match out.metrics_port {
        Some(port) => {
            let l = std::sync::Arc::clone(&loader);
            let m = ringfeed::serve::metrics::serve(port, move || {
                l.stats()
                    .and_then(|(json, _)| ringfeed::engine::prometheus(&json))
                    .unwrap_or_else(|e| format!("# stats unavailable: {e}\n"))
            })?;
            eprintln!("metrics: http://{}/metrics", m.addr());
            Some(m)
        }
        None => None,
    };
    // Remote shards are sized as they are read: with any unsized, or
    // attached to a node engine (whose shards are its own), the bar shows
    // bytes and rate without a total.
    let sizes: Option<u64> = match &*loader {
        Attached::Local(l) => l.shards().iter().map(|s| s.size).sum(),
        Attached::Node(_) => None,
    };
    let bar = ProgressBar::new(sizes.unwrap_or_default() * epochs);
    bar.set_style(ProgressStyle::with_template(if sizes.is_some() {
        "{spinner} {bytes}/{total_bytes} {binary_bytes_per_sec} {msg}"
    } else {
        "{spinner} {bytes} {binary_bytes_per_sec} {msg}"
    })?);
    let (cpu0, _) = rusage();
    let t0 = Instant::now();
    let mut bad = 0u64;
    let mut tally = expect.map(|e| SampleTally::new(&e.fields));
    let mut first_batch_at = None;
    loop {
        match loader.next(Some(Duration::from_secs(60)))? {
            AnyNext::Batch(b) => {
                first_batch_at.get_or_insert_with(monotonic_ns);
                if let Some(seed) = out.verify {
                    bad += verify_failures(&b, seed);
                }
                if let Some(t) = &mut tally {
                    count_samples(&b, t);
                }
                bar.inc(b.bytes());
            }
            AnyNext::EndOfEpoch(e) => {
                if let Some(t) = &mut tally {
                    t.end_of_epoch();
                }
                bar.set_message(format!("epoch {e} done"));
            }
            AnyNext::Timeout => bar.set_message("waiting for data"),
            AnyNext::Finished => break,
        }
    }
    let wall = t0.elapsed();
    let (cpu1, rss) = rusage();
    bar.finish_and_clear();
    // A loader in this process is closed first, so its stats include the
    // cache writes its close waited for; a node engine's consumer asks the
    // engine before it detaches.
    if let Attached::Local(l) = &*loader {
        l.close();
    }
    let (stats_text, s) = loader.stats()?;
    loader.close();
    let stats: Value = serde_json::from_str(&stats_text)?;
    let counted = tally.as_ref().zip(expect).map(|(t, e)| t.check(e));
    // The setup the counters do not hold, as the stats JSON gives it.
    let text = |k: &str| stats[k].as_str().unwrap_or("-").to_string();
    let flag = |k: &str| stats[k].as_bool().unwrap_or(false);
    let secs = wall.as_secs_f64();
    let gbs = s.bytes_delivered as f64 / secs / 1e9;
    let cpu = (cpu1 - cpu0).as_secs_f64();
    let report = json!({
        "bytes": s.bytes_delivered,
        "samples": s.samples_delivered,
        "batches": s.batches_delivered,
        "seconds": secs,
        "gb_per_s": gbs,
        "samples_per_s": s.samples_delivered as f64 / secs,
        "cpu_seconds": cpu,
        "cpu_s_per_gb": cpu / (s.bytes_delivered as f64 / 1e9),
        "copied_per_delivered": s.bytes_copied as f64 / s.bytes_delivered.max(1) as f64,
        "peak_rss_bytes": rss,
        "memory_budget": budget,
        "verify_failures": out.verify.map(|_| bad),
        "samples_counted": counted.as_ref().and_then(|c| c.as_ref().ok()),
        "count_failure": counted.as_ref().and_then(|c| c.as_ref().err()),
        "first_batch_monotonic_ns": first_batch_at,
        "source": source,
        "stats": stats,
    });
    if out.json {
        println!("{report}");
    } else {
        println!("source        {source} ({} shards)", s.shards_total);
        println!(
            "delivered     {:.3} GB in {:.2} s: {:.2} GB/s, {:.0} samples/s",
            s.bytes_delivered as f64 / 1e9,
            secs,
            gbs,
            s.samples_delivered as f64 / secs
        );
        println!(
            "cpu           {:.3} s, {:.3} CPU-s per GB",
            cpu,
            cpu / (s.bytes_delivered as f64 / 1e9)
        );
        println!(
            "copied        {:.4} bytes per byte delivered",
            s.bytes_copied as f64 / s.bytes_delivered.max(1) as f64
        );
        println!(
            "memory        {} ({} MiB arena, locked: {}), peak RSS {} MiB",
            text("memory_kind"),
            s.arena_bytes >> 20,
            flag("memory_locked"),
            rss >> 20
        );
        let flags = text("io_uring_flags");
        println!(
            "io backend    {} (flags: {}, registered buffers: {}), {} workers",
            text("io_backend"),
            if flags.is_empty() { "-" } else { &flags },
            flag("buffers_registered"),
            s.workers
        );
        println!(
            "samples       {} in {} batches; {} entries skipped, {} samples dropped, {} padded",
            s.samples_delivered,
            s.batches_delivered,
            s.entries_skipped,
            s.samples_dropped,
            s.samples_padded
        );
        if s.consumers > 1 || s.batches_skipped > 0 || s.shuffle_copied > 0 {
            println!(
                "epochs        consumer {} of {}; {} batches replayed to resume; shuffle copied {} bytes",
                s.consumer, s.consumers, s.batches_skipped, s.shuffle_copied
            );
        }
        if let Some(seed) = out.verify {
            println!("verified      every field against seed {seed}: {bad} mismatches");
        }
        match &counted {
            Some(Ok(n)) => {
                println!("counted       every generated sample exactly once per epoch: {n} samples")
            }
            Some(Err(e)) => println!("counted       FAILED: {e}"),
            None => {}
        }
        let node = &stats["node"];
        if node.is_object() {
            // The engine's CPU and memory are its own process's: not in the
            // `cpu` and `peak RSS` above.
            println!(
                "node engine   process {} at {} ({} consumers attached); its CPU is not in `cpu`",
                node["pid"],
                node["socket"].as_str().unwrap_or("?"),
                node["consumers"]
            );
        }
        for n in stats["notes"].as_array().into_iter().flatten() {
            println!("note          {}", n.as_str().unwrap_or_default());
        }
    }
    if bad > 0 {
        return Err(format!("{bad} fields did not match the generator's content").into());
    }
    if let Some(Err(e)) = counted {
        return Err(format!("the samples delivered are not the samples generated: {e}").into());
    }
    Ok(())
}
