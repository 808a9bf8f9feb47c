//! `ringfeed gen`: a synthetic WebDataset shard set (the library's
//! generator), with a progress bar; `demo` generates its data here too.

use indicatif::{ProgressBar, ProgressStyle};

use ringfeed::synth::{self, GenOptions};

use crate::AnyResult;
use crate::args::GenArgs;

pub(crate) fn gen_cmd(a: GenArgs) -> AnyResult<()> {
    let o = GenOptions {
        shards: a.shards,
        shard_bytes: a.shard_size,
        sample_bytes: a.sample_size,
        spread: a.spread,
        fields: a.fields,
        seed: a.seed,
    };
    let r = generate(&a.dir, &o)?;
    println!(
        "wrote {} shards, {} samples, {:.2} GB: {}",
        r.paths.len(),
        r.samples,
        r.file_bytes as f64 / 1e9,
        r.pattern
    );
    Ok(())
}

pub(crate) fn generate(dir: &std::path::Path, o: &GenOptions) -> AnyResult<synth::GenReport> {
    let bar = ProgressBar::new(o.shards as u64 * o.shard_bytes);
    bar.set_style(ProgressStyle::with_template(
        "gen {bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec}",
    )?);
    let r = synth::generate(dir, o, |n| bar.inc(n))?;
    bar.finish_and_clear();
    Ok(r)
}
