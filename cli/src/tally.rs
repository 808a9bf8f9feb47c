//! Counting the samples a run delivers against the ones the generator
//! wrote, for `demo`. Checking each field's bytes (`synth::verify`) says
//! that what arrived is right; it cannot see a sample that never arrived or
//! one that arrived twice. This does: every generated sample, with every
//! generated field, exactly once in each epoch, and nothing else.

use std::collections::HashMap;

use ringfeed::Config;
use ringfeed::synth::{self, GenReport};

/// What a whole run over a generated dataset must deliver.
pub(crate) struct Expected {
    /// Samples in each shard (the generator's `shard_samples`).
    pub(crate) shard_samples: Vec<u64>,
    /// Every sample's field names.
    pub(crate) fields: Vec<String>,
    pub(crate) epochs: u64,
}

impl Expected {
    pub(crate) fn of(report: &GenReport, fields: &[String], epochs: u64) -> Expected {
        Expected {
            shard_samples: report.shard_samples.clone(),
            fields: fields.to_vec(),
            epochs,
        }
    }

    fn samples(&self) -> u64 {
        self.shard_samples.iter().sum()
    }
}

/// Why a run configured as `cfg` need not deliver each sample of the data
/// exactly once per epoch, if it need not; else its number of epochs.
pub(crate) fn whole_run_epochs(cfg: &Config) -> Result<u64, &'static str> {
    if cfg.world_size > 1 || cfg.loader_workers > 1 {
        return Err("the data is split among consumers");
    }
    if cfg.drop_last {
        return Err("drop_last drops a short last batch");
    }
    if cfg.resampled || cfg.samples_per_epoch > 0 {
        return Err("epochs are drawn, not the data's");
    }
    if cfg.epoch > 0 || !cfg.resume.is_empty() {
        return Err("the run starts past the beginning");
    }
    if cfg.epochs == 0 {
        return Err("the run has no end");
    }
    Ok(cfg.epochs)
}

/// At most this many keys are named in a failure: enough to find the
/// pattern (one shard, the end of each shard), short enough to read.
const NAMED: usize = 5;

/// The samples seen so far, by epoch.
pub(crate) struct SampleTally {
    fields: Vec<String>,
    /// Times each key arrived, one map per epoch (the last is the current).
    epochs: Vec<HashMap<String, u32>>,
    /// Samples whose field names were not the generated ones: (key, names).
    wrong_fields: Vec<(String, Vec<String>)>,
    wrong_field_count: u64,
}

impl SampleTally {
    pub(crate) fn new(fields: &[String]) -> SampleTally {
        let mut fields = fields.to_vec();
        fields.sort();
        SampleTally {
            fields,
            epochs: vec![HashMap::new()],
            wrong_fields: Vec::new(),
            wrong_field_count: 0,
        }
    }

    /// One delivered sample with its field names.
    pub(crate) fn sample(&mut self, key: &str, fields: &[&str]) {
        let mut names: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
        names.sort();
        if names != self.fields {
            self.wrong_field_count += 1;
            if self.wrong_fields.len() < NAMED {
                self.wrong_fields.push((key.to_string(), names));
            }
        }
        let epoch = self.epochs.last_mut().expect("never empty");
        *epoch.entry(key.to_string()).or_default() += 1;
    }

    pub(crate) fn end_of_epoch(&mut self) {
        self.epochs.push(HashMap::new());
    }

    /// The samples checked (`expected.samples() × epochs`), or what is
    /// missing, repeated or unexpected.
    pub(crate) fn check(&self, expected: &Expected) -> Result<u64, String> {
        let mut problems = Vec::new();
        // An epoch's end may be signalled after the last epoch too.
        let mut epochs: &[HashMap<String, u32>] = &self.epochs;
        while epochs.len() as u64 > expected.epochs && epochs.last().is_some_and(|e| e.is_empty()) {
            epochs = &epochs[..epochs.len() - 1];
        }
        if epochs.len() as u64 != expected.epochs {
            problems.push(format!(
                "{} epochs delivered, {} expected",
                epochs.len(),
                expected.epochs
            ));
        }
        for (e, seen) in epochs.iter().enumerate() {
            let mut missing = Vec::new();
            let mut repeated = Vec::new();
            for (i, &n) in expected.shard_samples.iter().enumerate() {
                for j in 0..n {
                    let key = synth::sample_key(i, j);
                    match seen.get(&key).copied().unwrap_or(0) {
                        1 => {}
                        0 => missing.push(key),
                        times => repeated.push(format!("{key} ({times} times)")),
                    }
                }
            }
            let mut unexpected: Vec<&String> = seen
                .keys()
                .filter(|k| !is_generated(k, &expected.shard_samples))
                .collect();
            unexpected.sort();
            for (what, keys) in [
                ("missing", missing.iter().collect::<Vec<_>>()),
                ("delivered more than once", repeated.iter().collect()),
                ("never generated", unexpected),
            ] {
                if !keys.is_empty() {
                    problems.push(format!(
                        "epoch {e}: {} samples {what}: {}{}",
                        keys.len(),
                        keys.iter()
                            .take(NAMED)
                            .map(|k| k.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        if keys.len() > NAMED { ", …" } else { "" }
                    ));
                }
            }
        }
        if self.wrong_field_count > 0 {
            problems.push(format!(
                "{} samples without exactly the fields {:?}, e.g. {:?}",
                self.wrong_field_count, self.fields, self.wrong_fields
            ));
        }
        if problems.is_empty() {
            Ok(expected.samples() * expected.epochs)
        } else {
            Err(problems.join("; "))
        }
    }
}

/// Whether `key` is `sample_key(i, j)` of a generated sample.
fn is_generated(key: &str, shard_samples: &[u64]) -> bool {
    let Some((i, j)) = key.split_once('-') else {
        return false;
    };
    match (i.parse::<usize>(), j.parse::<u64>()) {
        (Ok(i), Ok(j)) => {
            synth::sample_key(i, j) == key && shard_samples.get(i).is_some_and(|&n| j < n)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> Vec<String> {
        vec!["jpg".into(), "cls".into()]
    }

    fn expected(epochs: u64) -> Expected {
        Expected {
            shard_samples: vec![3, 2],
            fields: fields(),
            epochs,
        }
    }

    /// Every generated key once, in the generator's order.
    fn all_keys() -> Vec<String> {
        [(0, 3), (1, 2)]
            .into_iter()
            .flat_map(|(i, n)| (0..n).map(move |j| synth::sample_key(i, j)))
            .collect()
    }

    fn tally_of(keys: &[String]) -> SampleTally {
        let mut t = SampleTally::new(&fields());
        for k in keys {
            t.sample(k, &["cls", "jpg"]);
        }
        t
    }

    #[test]
    fn every_sample_once_passes() {
        assert_eq!(tally_of(&all_keys()).check(&expected(1)), Ok(5));
        // The end of the last epoch may come before the stream finishes.
        let mut t = tally_of(&all_keys());
        t.end_of_epoch();
        assert_eq!(t.check(&expected(1)), Ok(5));
    }

    #[test]
    fn a_dropped_sample_fails() {
        let mut keys = all_keys();
        let gone = keys.remove(3);
        let e = tally_of(&keys).check(&expected(1)).unwrap_err();
        assert!(e.contains("1 samples missing") && e.contains(&gone), "{e}");
        // The last sample of the last shard too: no gap shows it.
        let mut keys = all_keys();
        let gone = keys.pop().unwrap();
        let e = tally_of(&keys).check(&expected(1)).unwrap_err();
        assert!(e.contains(&gone), "{e}");
    }

    #[test]
    fn a_duplicated_sample_fails_even_with_the_count_right() {
        // One delivered twice in place of another: the total is unchanged.
        let mut keys = all_keys();
        keys[4] = keys[0].clone();
        let e = tally_of(&keys).check(&expected(1)).unwrap_err();
        assert!(
            e.contains("more than once: 000000-0000000 (2 times)"),
            "{e}"
        );
        assert!(e.contains("missing: 000001-0000001"), "{e}");
    }

    #[test]
    fn a_sample_never_generated_fails() {
        let mut keys = all_keys();
        keys.push(synth::sample_key(1, 2));
        keys.push("stray".into());
        let e = tally_of(&keys).check(&expected(1)).unwrap_err();
        assert!(
            e.contains("2 samples never generated: 000001-0000002, stray"),
            "{e}"
        );
    }

    #[test]
    fn a_sample_missing_a_field_fails() {
        let mut t = tally_of(&all_keys()[1..]);
        t.sample(&all_keys()[0], &["jpg"]);
        let e = t.check(&expected(1)).unwrap_err();
        assert!(e.contains("1 samples without exactly the fields"), "{e}");
        assert!(e.contains("000000-0000000"), "{e}");
    }

    #[test]
    fn each_epoch_is_counted_on_its_own() {
        let mut t = tally_of(&all_keys());
        t.end_of_epoch();
        for k in all_keys() {
            t.sample(&k, &["jpg", "cls"]);
        }
        assert_eq!(t.check(&expected(2)), Ok(10));
        // A sample moved from the second epoch into the first: right in
        // total over the run, wrong in both epochs.
        let mut keys = all_keys();
        keys.push(keys[2].clone());
        let mut t = tally_of(&keys);
        t.end_of_epoch();
        for k in all_keys().iter().filter(|k| **k != all_keys()[2]) {
            t.sample(k, &["jpg", "cls"]);
        }
        let e = t.check(&expected(2)).unwrap_err();
        assert!(
            e.contains("epoch 0: 1 samples delivered more than once"),
            "{e}"
        );
        assert!(e.contains("epoch 1: 1 samples missing"), "{e}");
        // One epoch short.
        let e = tally_of(&all_keys()).check(&expected(2)).unwrap_err();
        assert!(e.contains("1 epochs delivered, 2 expected"), "{e}");
    }
}
