//! A consumer's session: its loader opened over the engine's parts, the
//! transport handed over, requests and releases until it leaves, then the
//! releases of what it still holds until it released them or its process
//! exited (see the module's doc).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use serde_json::{Map, Value};

use super::feed::{Feed, run_feed};
use super::{node, refuse, refused, request_name, take_ring, transport};
use crate::config::Config;
use crate::engine::Loader;
use crate::error::{NodeFailure, Result};
use crate::node::engine::Engine;
use crate::node::proto::{self, Reply, Request, SHIPPED};
use crate::node::shm::Rings;
use crate::node::sock;
use crate::sync::Locked;

/// The consumer's loader configuration: the engine's, with the consumer's
/// own keys; checked to agree on the job's.
fn consumer_config(attach: &Map<String, Value>, base: &Config) -> Result<Config> {
    let theirs = Config::from_map(attach)?;
    if let Some((key, ours, theirs)) = base.disagreement(&theirs) {
        return Err(node(
            NodeFailure::Refused,
            format!(
                "the consumer's `{key}` ({theirs}) differs from the node engine's ({ours}): every \
             consumer of one engine must give the same dataset, epoch and layout keys"
            ),
        ));
    }
    let mut cfg = base.clone();
    cfg.take_consumer_keys(&theirs);
    if cfg.transform.is_some() {
        // Batches go to the consumer as places in this engine's arena; a
        // transform's tensors are not there (the client refuses it first).
        return Err(node(
            NodeFailure::Refused,
            "`transform` does not work with a node engine yet",
        ));
    }
    cfg.node = crate::config::NodeMode::Off;
    cfg.shared_arena = true;
    // The consumer registers its own mapping with CUDA (it is the process
    // that copies to the GPU); the engine's would pin for nothing.
    cfg.cuda_register = crate::config::Toggle::Off;
    cfg.validate()?;
    Ok(cfg)
}

pub(super) fn serve(
    conn: OwnedFd,
    pidfd: Option<OwnedFd>,
    engine: &Arc<Engine>,
    config: &Map<String, Value>,
    mut buf: Vec<u8>,
) {
    let opened = consumer_config(config, &engine.base)
        .and_then(|c| Ok((c, engine.dataset()?)))
        .and_then(|(c, ds)| Loader::open_in(c, &engine.pool, ds.shards.clone(), ds.net.as_ref()));
    let loader = match opened {
        Ok(l) => l,
        Err(e) => return refuse(&conn, &e),
    };
    let t = match transport(engine) {
        Ok(t) => t,
        Err(e) => {
            return refuse(
                &conn,
                &node(NodeFailure::Local, format!("setting up the transport: {e}")),
            );
        }
    };
    let party = engine.party();
    let reply = Reply::Attached {
        session: party,
        engine: engine.id,
        arena_len: engine.pool.arena().len() as u64,
        // The part of the arena in use unless more consumers attach than
        // expected: what a consumer registers with CUDA (pinning the rest
        // would allocate it).
        budget_len: (engine.pool.preferred_chunks() * engine.pool.chunk_size()) as u64,
        state: loader.state().to_hex(),
        pid: std::process::id(),
    };
    let fds = [
        t.arena_ro.as_raw_fd(),
        t.rings_file.as_raw_fd(),
        t.ready.as_raw_fd(),
        t.wake.as_raw_fd(),
    ];
    if sock::send(&conn, &proto::encode(&reply), &fds).is_err() {
        return;
    }
    drop((t.arena_ro, t.rings_file));
    let wake = t.wake;
    let feed = Arc::new(Feed {
        loader: Arc::new(loader),
        rings: t.rings,
        ready: t.ready,
        party,
        stop: AtomicBool::new(false),
        room: (Mutex::new(()), Condvar::new()),
        unread: Mutex::new(std::collections::VecDeque::new()),
    });
    let feeder = {
        let (feed, engine) = (feed.clone(), engine.clone());
        std::thread::Builder::new()
            .name("ringfeed-node-feed".into())
            .spawn(move || run_feed(&feed, &engine))
    };
    engine
        .loaders
        .locked()
        .insert(party, Arc::downgrade(&feed.loader));
    engine.whole.consumers.fetch_add(1, Ordering::AcqRel);
    engine.whole.attached.fetch_add(1, Ordering::AcqRel);
    let mut exited = false;
    if let Ok(feeder) = feeder {
        exited = consumer_loop(&conn, &wake, pidfd.as_ref(), &feed, engine, &mut buf);
        feed.stop.store(true, Ordering::Release);
        feed.room.1.notify_all();
        feed.loader.close();
        let _ = feeder.join();
    }
    // The batches whose records the consumer never read were never its:
    // they go back now (the consumer checks, after each record it takes,
    // that it has not closed: see `NodeLoader::close`). A consumer that lies
    // about what it read only frees batches it holds itself.
    if !exited {
        feed.prune_unread();
        let untaken: Vec<u64> = feed.unread.locked().drain(..).map(|(_, id)| id).collect();
        engine.release(|holds| {
            untaken
                .into_iter()
                .filter_map(|id| holds.consumer_release(party, id, false))
                .collect::<Vec<_>>()
        });
    }
    // The consumer sees its end now, whether it hung up or was refused.
    // SAFETY: shuts down a socket this function owns.
    unsafe { libc::shutdown(conn.as_raw_fd(), libc::SHUT_RDWR) };
    engine.loaders.locked().remove(&party);
    engine.whole.consumers.fetch_sub(1, Ordering::AcqRel);
    // The consumer left; its batches stay held until it releases them or
    // its process exits. Without a pidfd, its leaving is all there is.
    if !exited && let Some(pidfd) = &pidfd {
        let mut idle = 0;
        while engine.holds.locked().pending_for(party) > 0 {
            let Ok(ready) = sock::poll(&[(&wake, true), (pidfd, true)], None) else {
                break;
            };
            if ready[1].readable || ready[1].hangup {
                break;
            }
            if ready[0].readable && !take_releases(&wake, &feed.rings, party, engine, &mut idle) {
                break;
            }
        }
    }
    engine.release(|holds| holds.consumer_exited(party));
}

/// Takes what the consumer's ring holds; false when the ring is broken
/// (the consumer is then treated as gone).
fn take_releases(
    wake: &OwnedFd,
    rings: &Rings,
    party: u64,
    engine: &Engine,
    idle: &mut u32,
) -> bool {
    let mut released = Vec::new();
    if take_ring(wake, rings, idle, &mut released).is_err() {
        return false;
    }
    engine.release(|holds| {
        released
            .into_iter()
            .filter_map(|r| holds.consumer_release(party, r & !SHIPPED, r & SHIPPED != 0))
            .collect::<Vec<_>>()
    });
    true
}

/// The consumer's requests and releases until it hangs up (false) or its
/// process exits (true).
fn consumer_loop(
    conn: &OwnedFd,
    wake: &OwnedFd,
    pidfd: Option<&OwnedFd>,
    feed: &Feed,
    engine: &Engine,
    buf: &mut Vec<u8>,
) -> bool {
    let mut idle = 0;
    loop {
        let mut fds = vec![(conn, true), (wake, true)];
        if let Some(p) = pidfd {
            fds.push((p, true));
        }
        let Ok(ready) = sock::poll(&fds, None) else {
            return false;
        };
        if ready.get(2).is_some_and(|r| r.readable || r.hangup) {
            return true;
        }
        if ready[1].readable {
            if !take_releases(wake, &feed.rings, feed.party, engine, &mut idle) {
                return false;
            }
            feed.prune_unread();
            feed.room.1.notify_all();
        }
        if ready[0].readable {
            let reply = match sock::recv(conn, buf) {
                Ok(Some(_)) => match proto::decode::<Request>(buf, "a request") {
                    Ok(req) => answer_consumer(&req, feed, engine),
                    Err(e) => {
                        // Garbage from a consumer: say so, and treat it as gone.
                        refuse(conn, &node(NodeFailure::Protocol, e.0));
                        return false;
                    }
                },
                Ok(None) => return false,
                Err(e) => {
                    refuse(conn, &node(NodeFailure::Gone, format!("a request: {e}")));
                    return false;
                }
            };
            if sock::send(conn, &proto::encode(&reply), &[]).is_err() {
                return false;
            }
        } else if ready[0].hangup {
            return false;
        }
    }
}

fn answer_consumer(req: &Request, feed: &Feed, engine: &Engine) -> Reply {
    match req {
        Request::Stats => {
            let s = feed.loader.stats();
            let counts = &s.counts;
            // SAFETY: Counts is repr(C) plain integers; its bytes are read.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    (counts as *const crate::engine::Counts).cast::<u8>(),
                    std::mem::size_of::<crate::engine::Counts>(),
                )
            };
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            Reply::Stats {
                stats: serde_json::to_value(&s).unwrap_or(Value::Null),
                counts: Some(hex),
                node: engine.node_stats(Some(feed.party)),
            }
        }
        Request::Source { shard } => Reply::Source {
            name: feed
                .loader
                .shards()
                .get(*shard as usize)
                .map(|s| s.name.clone()),
        },
        other => refused(node(
            NodeFailure::Protocol,
            format!(
                "{} on a consumer's connection: a consumer asks for stats and sources; keeps go \
             through a holder's link",
                request_name(other)
            ),
        )),
    }
}
