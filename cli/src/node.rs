//! `ringfeed node`: a node engine on a Unix socket. Consumers on this node
//! attach with `"node": "auto"` (the socket is then derived from the job's
//! keys, so this command and the consumers meet without being told where)
//! or `"node": "/path/to/socket"`. With `--daemon` it returns once the
//! socket listens: that is how a consumer starts one on demand (with
//! `--config-stdin --linger-ms`). The engine's body is the library's
//! (`ringfeed::node::daemon::run`); this parses the flags.

use std::io::Read;

use serde_json::{Map, Value};

use ringfeed::Config;
use ringfeed::node::{self, NodeRun};

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
    let config = Config::from_map(&config)?;
    node::daemon::run(NodeRun {
        config,
        socket: a.socket,
        linger: a.linger_ms.map(std::time::Duration::from_millis),
        daemon: a.daemon,
        metrics_port: a.metrics_port,
        metrics_addr: a.metrics_addr,
    })?;
    Ok(())
}
