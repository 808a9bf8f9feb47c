//! The configuration JSON (`Config::from_json`, what
//! `ringfeed_loader_open` is given).
//!
//! Asserts: an error is `Error::Config`; it never shows the value of
//! `aws_secret_access_key` or `aws_session_token` (unless the error of the
//! same configuration with another value there shows that text too); a
//! configuration accepted validates again, its derived sizes and layout
//! compute without overflow, its CPU list can be pinned to, and its resume
//! states decode.

use ringfeed::plan::resume::State;
use ringfeed::{Config, Error};
use serde_json::Value;

const SECRET_KEYS: [&str; 2] = ["aws_secret_access_key", "aws_session_token"];

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_json(text) {
        Ok(c) => accepted(&c),
        Err(e) => {
            let Error::Config(msg) = &e else {
                panic!("a configuration error that is not Error::Config: {e:?}");
            };
            if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text) {
                no_secret_in(msg, &map);
            }
        }
    }
}

fn accepted(c: &Config) {
    c.validate()
        .expect("an accepted configuration validates again");
    for workers in [1, c.workers_or_auto()] {
        let _ = c.effective_budget(workers, None);
        let _ = c.effective_budget(workers, Some(ringfeed::config::REMOTE_BUDGET_MAX));
        let _ = c.plan_options(workers);
    }
    let _ = (c.node_budget(), c.node_streams(), c.consumers());
    if let Some(cpus) = &c.cpus {
        assert!(!cpus.is_empty());
        assert!(
            cpus.iter().all(|&cpu| cpu < libc::CPU_SETSIZE as usize),
            "`cpus` accepted CPUs that cannot be pinned to: {cpus:?}"
        );
    }
    for s in &c.resume {
        State::from_hex(s).expect("an accepted resume state decodes");
    }
}

fn no_secret_in(msg: &str, map: &serde_json::Map<String, Value>) {
    for key in SECRET_KEYS {
        let Some(Value::String(secret)) = map.get(key) else {
            continue;
        };
        let secret = secret.trim();
        // Short values are found in any message by chance.
        if secret.len() < 6 || !msg.contains(secret) {
            continue;
        }
        // The same configuration with another value there: when its error
        // holds the text too, the text is the message's own (a key name,
        // another key's value), not the secret shown.
        let mut other = map.clone();
        other.insert(key.into(), Value::String("#".repeat(secret.len())));
        let again = match Config::from_map(&other) {
            Err(Error::Config(m)) => m,
            _ => String::new(),
        };
        assert!(
            again.contains(secret),
            "the value of `{key}` is in the error: {msg}"
        );
    }
}
