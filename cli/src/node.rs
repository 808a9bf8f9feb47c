//! `ringfeed node`: a node engine on a Unix socket. Consumers on this node
//! attach with `"node": "auto"` (the socket is then derived from the
//! dataset and epoch keys, so this command and the consumers meet without
//! being told where) or `"node": "/path/to/socket"`. With `--daemon` it
//! returns once the socket listens: that is how a consumer starts one on
//! demand (with `--config-stdin --linger-ms`).

use std::io::Read;
use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value};

use ringfeed::Config;
use ringfeed::node::{self, NodeOptions};

use crate::AnyResult;
use crate::args::{NodeArgs, config_map_for};

pub(crate) fn node_cmd(a: NodeArgs) -> AnyResult<()> {
    let config: Map<String, Value> = if a.config_stdin {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        match serde_json::from_str(&text)? {
            Value::Object(m) => m,
            _ => return Err("the configuration on standard input must be a JSON object".into()),
        }
    } else {
        if a.urls.is_empty() {
            return Err("give the dataset URLs (or --config-stdin)".into());
        }
        config_map_for(a.urls.clone(), &a.opts)?
    };
    // Checked before the socket exists, so a bad configuration is an error
    // here, not for each consumer.
    let cfg = Config::from_map(&config)?;
    let socket = match &a.socket {
        Some(s) => s.clone(),
        None => node::auto_socket(&cfg)?,
    };
    let listener = node::sock::listen(&socket)
        .map_err(|e| format!("cannot listen on `{}`: {e}", socket.display()))?;
    eprintln!(
        "ringfeed node: listening on {} (pid {})",
        socket.display(),
        std::process::id()
    );
    if a.daemon {
        // No thread runs yet: forking here is safe. The parent returns once
        // the socket listens (it already does); the child serves.
        // SAFETY: a single-threaded process; the child only continues Rust
        // code that starts threads after the fork.
        match unsafe { libc::fork() } {
            -1 => return Err(std::io::Error::last_os_error().into()),
            0 => {
                // SAFETY: plain call; a new session leaves the consumer's
                // terminal and process group.
                unsafe { libc::setsid() };
            }
            _ => return Ok(()),
        }
    }
    let opts = NodeOptions {
        socket: socket.clone(),
        config,
        linger: a.linger_ms.map(std::time::Duration::from_millis),
    };
    // The endpoint listens before the engine starts (a taken port is an
    // error now), and answers once the engine gives its metrics. After the
    // fork above: a daemon's threads start in the child.
    let source: Arc<OnceLock<node::MetricsSource>> = Arc::default();
    let _metrics = match a.metrics_port {
        Some(port) => {
            let s = Arc::clone(&source);
            Some(crate::metrics::serve(port, move || {
                s.get().map(|f| f()).unwrap_or_default()
            })?)
        }
        None => None,
    };
    node::serve_with_metrics(listener, opts, |m| {
        let _ = source.set(m);
    })?;
    eprintln!("ringfeed node: no consumer for a while; exiting");
    Ok(())
}
