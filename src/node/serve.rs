//! The node engine's accept loop: a thread per connection (`session.rs`),
//! at most [`MAX_CONNECTIONS`] at once, and the engine's end: when it was
//! started on demand (`linger`), once no consumer or holder has been
//! attached, and no connection open, for that long (counted from the
//! moment the last one left: a session's end wakes the loop, which then
//! waits for the linger's end, not for its next turn); and, in a process
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

/// The accept loop's longest wait: how soon it sees a stop signal.
const TURN: Duration = Duration::from_millis(200);

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

/// Takes one off a count when dropped (on unwinding too), and wakes the
/// accept loop through the eventfd.
struct CountOut(Arc<AtomicUsize>, Arc<OwnedFd>);

impl Drop for CountOut {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
        sock::notify(&self.1);
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
    // Written when a session ends: the loop then starts the linger from
    // that moment, not from its next turn.
    let ended = Arc::new(
        sock::eventfd().map_err(|e| Error::node(NodeFailure::Local, format!("an eventfd: {e}")))?,
    );
    let mut idle_since = Instant::now();
    let mut was_attached = false;
    let mut ever = false;
    // Lingered out: the socket's name is gone, so no new consumer can
    // reach this engine; it serves what connected before and then ends.
    let mut closing = false;
    let mut wait = TURN;
    loop {
        let ready = sock::poll(&[(&listener, true), (&ended, true)], Some(wait))
            .map_err(|e| Error::node(NodeFailure::Local, format!("waiting for consumers: {e}")))?;
        if ready[1].readable {
            sock::drain(&ended);
        }
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
                        spawn_session(conn, &engine, &active, &ended);
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
        if attached > 0 || was_attached || ready[1].readable {
            // Attached now, or the last one left since the previous turn
            // (a session's end wakes the loop at once; one that began and
            // ended within the turn, such as a probe's, too): the linger
            // counts from now.
            idle_since = Instant::now();
        }
        was_attached = attached > 0;
        match after_turn(was_attached, closing, patience, idle_since.elapsed()) {
            Turn::Serve(next) => wait = next,
            Turn::Close => {
                // The name goes first; what connected before it went is in
                // the listener's queue, and the next poll, which does not
                // wait, accepts it.
                let _ = std::fs::remove_file(&opts.socket);
                closing = true;
                wait = Duration::ZERO;
            }
            // The poll above found nothing queued since the name went.
            // Batches some processes still hold stay valid: the memory file
            // lives as long as their mappings, and no engine reads into it
            // again.
            Turn::End => return Ok(()),
        }
    }
}

/// `d` rounded up to a whole millisecond (`poll` waits in milliseconds and
/// would cut the rest off, waking the loop before the linger is over).
fn ceil_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_nanos().div_ceil(1_000_000) as u64)
}

/// What the accept loop does after a turn.
#[derive(Debug, PartialEq)]
enum Turn {
    /// Serve on, polling at most this long.
    Serve(Duration),
    /// Lingered out: remove the socket's name, then accept what came before.
    Close,
    /// Closed, and nothing connected before the name went: return.
    End,
}

/// The linger's decision after a turn: whether anything is attached
/// (a consumer, a holder, a connection), whether the name is gone, the
/// linger (`None`: serve until stopped) and how long nothing has been
/// attached. The next poll waits until the linger is over (rounded up to
/// the poll's millisecond), never longer than a [`TURN`].
fn after_turn(attached: bool, closing: bool, patience: Option<Duration>, idle: Duration) -> Turn {
    if attached {
        return Turn::Serve(TURN);
    }
    if closing {
        return Turn::End;
    }
    match patience {
        None => Turn::Serve(TURN),
        Some(l) if idle >= l => Turn::Close,
        Some(l) => Turn::Serve(ceil_ms(l - idle).min(TURN)),
    }
}

fn spawn_session(
    conn: OwnedFd,
    engine: &Arc<Engine>,
    active: &Arc<AtomicUsize>,
    ended: &Arc<OwnedFd>,
) {
    active.fetch_add(1, Ordering::AcqRel);
    let (e, a, w) = (engine.clone(), active.clone(), ended.clone());
    let t = std::thread::Builder::new()
        .name("ringfeed-node-session".into())
        .spawn(move || {
            // Counted out however the session ends, a panic included, and
            // the accept loop woken.
            let _out = CountOut(a, w);
            session::serve(conn, &e);
        });
    if let Err(e) = t {
        active.fetch_sub(1, Ordering::AcqRel);
        crate::log::log(crate::log::Level::Error, || {
            format!("ringfeed node: cannot start a session thread: {e}")
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_loop_wakes_when_the_linger_is_over_not_at_its_next_turn() {
        // The last one just left an engine of a 50 ms linger: the next poll
        // ends with the linger (the loop waited a whole turn, 200 ms, before).
        assert_eq!(
            after_turn(false, false, Some(50 * MS), Duration::ZERO),
            Turn::Serve(50 * MS)
        );
        assert_eq!(
            after_turn(false, false, Some(50 * MS), 30 * MS),
            Turn::Serve(20 * MS)
        );
        // What is left, rounded up to the poll's millisecond: never a wake
        // before the linger is over.
        for (idle, wait) in [
            (50 * MS - Duration::from_nanos(1), MS),
            (49 * MS - Duration::from_nanos(1), 2 * MS),
            (Duration::from_micros(29_500), 21 * MS),
        ] {
            assert_eq!(
                after_turn(false, false, Some(50 * MS), idle),
                Turn::Serve(wait),
                "{idle:?}"
            );
        }
        // A linger longer than a turn: a turn, to see a stop signal.
        assert_eq!(
            after_turn(false, false, Some(60_000 * MS), 10 * MS),
            Turn::Serve(TURN)
        );
    }

    #[test]
    fn lingered_out_it_closes_then_ends_unless_something_attached() {
        assert_eq!(
            after_turn(false, false, Some(50 * MS), 50 * MS),
            Turn::Close
        );
        assert_eq!(
            after_turn(false, false, Some(50 * MS), 900 * MS),
            Turn::Close
        );
        assert_eq!(after_turn(false, true, Some(50 * MS), 900 * MS), Turn::End);
        // What connected before the name went is served to its end.
        assert_eq!(
            after_turn(true, true, Some(50 * MS), 900 * MS),
            Turn::Serve(TURN)
        );
    }

    #[test]
    fn attached_or_without_a_linger_it_serves_on() {
        assert_eq!(
            after_turn(true, false, Some(50 * MS), 900 * MS),
            Turn::Serve(TURN)
        );
        assert_eq!(
            after_turn(false, false, None, 3_600_000 * MS),
            Turn::Serve(TURN)
        );
    }
}
