//! The node engine's accept loop: a thread per connection (`session.rs`),
//! at most [`MAX_CONNECTIONS`] at once, and the engine's end: when it was
//! started on demand (`linger`), once no consumer or holder has been
//! attached, and no connection open, for that long; and, in a process
//! that asked for it ([`stop_on_signals`]), at SIGTERM or SIGINT. Either
//! way it removes its socket and returns. A lingered-out engine removes
//! the socket's name first and serves whatever connected before the name
//! went: a consumer that reached it is answered, never reset (it used to
//! be, when it connected as the engine ended).

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::engine::Engine;
use super::proto::{self, Reply};
use super::{metrics, session, sock};
use crate::config::Config;
use crate::error::{Error, NodeFailure, Result};

/// How the engine runs.
pub struct NodeOptions {
    /// Where it listens (already bound: see [`sock::listen`]).
    pub socket: PathBuf,
    /// The engine's configuration: the dataset and epoch keys every consumer
    /// must match, and the memory, thread and I/O keys of every loader.
    pub config: Config,
    /// Exit once no consumer has been attached for this long (`None`: run
    /// until killed).
    pub linger: Option<Duration>,
}

/// How long an engine with a linger waits for its first consumer.
const FIRST_WAIT: Duration = Duration::from_secs(60);

/// Connections served at once: each is a thread (and a consumer's, a
/// second one and its loader's); more are refused by name.
pub const MAX_CONNECTIONS: usize = 1024;

/// The engine's metrics in the Prometheus text format, made when asked.
pub type MetricsSource = Arc<dyn Fn() -> String + Send + Sync>;

/// The signal that asked the engine to stop (0: none yet), stored by the
/// handler [`stop_on_signals`] installs.
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop(sig: libc::c_int) {
    // Relaxed: a lone flag, read by the accept loop at its next turn; no
    // other memory is published with it.
    STOP.store(sig, Ordering::Relaxed);
}

/// Makes SIGTERM and SIGINT end [`serve`] in this process (the engine
/// removes its socket and returns), for a process whose body is the engine
/// (`ringfeed node`). Needed where it runs as a container's first process
/// (pid 1, as in a pod): there a signal without a handler is ignored, and
/// the kubelet's SIGTERM did nothing until its SIGKILL, a grace period
/// later, which leaves the socket behind.
pub fn stop_on_signals() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_stop as *const () as libc::sighandler_t) };
    }
}

/// The signal that ended [`serve`], if one did.
pub fn stopped_by() -> Option<i32> {
    // Relaxed: see `on_stop`.
    Some(STOP.load(Ordering::Relaxed)).filter(|&s| s != 0)
}

/// Takes one off a count when dropped (on unwinding too).
struct CountOut(Arc<AtomicUsize>);

impl Drop for CountOut {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves consumers on `listener` until the engine lingers out.
pub fn serve(listener: OwnedFd, opts: NodeOptions) -> Result<()> {
    serve_with_metrics(listener, opts, |_| {})
}

/// As [`serve`]; `metrics` is given, once the engine is set up, what makes
/// its metrics: every attached consumer's loader summed (counters, retries
/// by kind), the shared arena's chunks, and the consumers attached and the
/// batches they hold (`ringfeed_node_*`).
pub fn serve_with_metrics(
    listener: OwnedFd,
    opts: NodeOptions,
    metrics: impl FnOnce(MetricsSource),
) -> Result<()> {
    let engine = Engine::new(opts.config, opts.socket.clone())?;
    {
        let e = Arc::downgrade(&engine);
        metrics(Arc::new(move || match e.upgrade() {
            Some(engine) => metrics::text(&engine),
            None => String::new(),
        }));
    }
    let active = Arc::new(AtomicUsize::new(0));
    let mut idle_since = Instant::now();
    let mut ever = false;
    // Lingered out: the socket's name is gone, so no new consumer can
    // reach this engine; it serves what connected before and then ends.
    let mut closing = false;
    loop {
        let ready = sock::poll(&[(&listener, true)], Some(Duration::from_millis(200)))
            .map_err(|e| Error::node(NodeFailure::Local, format!("waiting for consumers: {e}")))?;
        if ready[0].readable {
            match sock::accept(&listener) {
                Ok(conn) => {
                    ever = true;
                    if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
                        let e = Error::node(
                            NodeFailure::Busy,
                            format!("the engine serves {MAX_CONNECTIONS} connections already"),
                        );
                        let reply = Reply::Refused {
                            status: e.status(),
                            message: e.to_string(),
                        };
                        let _ = sock::send(&conn, &proto::encode(&reply), &[]);
                    } else {
                        spawn_session(conn, &engine, &active);
                    }
                }
                Err(e) => crate::log::log(crate::log::Level::Error, || {
                    format!("ringfeed node: accept: {e}")
                }),
            }
        }
        // Before its first consumer, an engine waits at least FIRST_WAIT:
        // the consumers of a job may take seconds to start.
        let patience = match opts.linger {
            Some(l) if !ever => Some(l.max(FIRST_WAIT)),
            other => other,
        };
        if stopped_by().is_some() {
            let _ = std::fs::remove_file(&opts.socket);
            return Ok(());
        }
        // A connection not yet attached counts: a consumer that connected
        // is answered, never reset by an engine ending under it.
        let attached = engine.whole.consumers.load(Ordering::Acquire)
            + engine.whole.holders.load(Ordering::Acquire)
            + active.load(Ordering::Acquire);
        if attached > 0 {
            idle_since = Instant::now();
        } else if closing {
            // The poll above found nothing queued since the name went.
            // Batches some processes still hold stay valid: the memory file
            // lives as long as their mappings, and no engine reads into it
            // again.
            return Ok(());
        } else if patience.is_some_and(|l| idle_since.elapsed() >= l) {
            // The name goes first; what connected before it went is in the
            // listener's queue, and the next poll accepts it.
            let _ = std::fs::remove_file(&opts.socket);
            closing = true;
        }
    }
}

fn spawn_session(conn: OwnedFd, engine: &Arc<Engine>, active: &Arc<AtomicUsize>) {
    active.fetch_add(1, Ordering::AcqRel);
    let (e, a) = (engine.clone(), active.clone());
    let t = std::thread::Builder::new()
        .name("ringfeed-node-session".into())
        .spawn(move || {
            // Counted out however the session ends, a panic included.
            let _out = CountOut(a);
            session::serve(conn, &e);
        });
    if let Err(e) = t {
        active.fetch_sub(1, Ordering::AcqRel);
        crate::log::log(crate::log::Level::Error, || {
            format!("ringfeed node: cannot start a session thread: {e}")
        });
    }
}
