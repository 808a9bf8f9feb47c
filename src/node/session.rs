//! One connection of a node engine, on a thread of its own: checked (same
//! user, a pidfd of its process), its hello read, then served in its role.
//!
//! A **consumer** gets its loader (the engine's configuration with its own
//! keys: rank, loader worker, resume state, start epoch), opened over the
//! engine's pool and dataset, and is handed the arena's memory file
//! (read-only, sealed), its rings' memory file (`shm.rs`, sealed against
//! resizing) and two eventfds (records ready; records read or batches
//! released). A feeder thread takes the loader's batches, enters each in
//! the table of holds with a fresh capability and writes its record; this
//! thread answers requests, takes releases, and when the consumer hangs up
//! closes the loader, then goes on taking releases of the batches it still
//! holds until it released them all or its process exited.
//!
//! A **holder** gets the arena's memory file and a release ring: it keeps
//! batches by their keys (a request and its answer, so a keep is known to
//! have happened before the holder reads a byte) and releases them through
//! the ring; what it keeps is freed when it releases it or its process
//! exits.
//!
//! Whatever a connection sends — garbage, messages out of order, a ring
//! scribbled over, a flood of wake-ups — it gets a named refusal, or is
//! treated as gone, and only its own batches are touched: numbers it does
//! not hold are ignored.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::engine::{Engine, lock};
use super::proto::record;
use super::proto::{self, Cap, Reply, Request, Role, SHIPPED};
use super::shm::Rings;
use super::sock;
use crate::config::Config;
use crate::engine::{Loader, Next};
use crate::error::{Error, Result};

/// How long a new connection may take to send its hello.
const HELLO_WAIT: Duration = Duration::from_secs(10);

/// Wake-ups in a row that bring nothing to do before the session slows
/// its polling: a consumer flooding its eventfd costs the engine little.
const IDLE_WAKES: u32 = 1000;

/// What the feeder and the session share for one consumer.
pub(super) struct Feed {
    pub loader: Loader,
    rings: Rings,
    ready: OwnedFd,
    party: u64,
    stop: AtomicBool,
    /// The consumer read records (room in the ring) or released batches.
    room: (Mutex<()>, Condvar),
    /// The batches written into the ring and not yet read, each with the
    /// ring position its record ends at: what the consumer never took when
    /// it leaves.
    unread: Mutex<std::collections::VecDeque<(u64, u64)>>,
}

impl Feed {
    /// Forgets the records the consumer has read.
    fn prune_unread(&self) {
        let tail = self.rings.consumed();
        let mut u = lock(&self.unread);
        while u.front().is_some_and(|&(end, _)| end <= tail) {
            u.pop_front();
        }
    }
}

fn refuse(conn: &OwnedFd, e: &Error) {
    let reply = Reply::Refused {
        status: e.status(),
        message: e.to_string(),
    };
    let _ = sock::send(conn, &proto::encode(&reply), &[]);
}

fn node(msg: impl Into<String>) -> Error {
    Error::Node(msg.into())
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Serves one accepted connection to its end.
pub(super) fn serve(conn: OwnedFd, engine: &Arc<Engine>) {
    let me = effective_uid();
    let peer = sock::peer(&conn);
    let mut buf = Vec::new();
    if !matches!(peer, Ok((uid, _)) if uid == me) {
        let why = match peer {
            Ok((uid, pid)) => {
                format!("process {pid} of user {uid} may not attach to the engine of user {me}")
            }
            Err(e) => format!("the peer's credentials cannot be read ({e})"),
        };
        // The request is read first: closing a SOCK_SEQPACKET socket with a
        // message unread resets it, and the peer would never see why.
        if sock::poll(&[(&conn, true)], Some(Duration::from_secs(2))).is_ok() {
            let _ = sock::recv(&conn, &mut buf);
        }
        return refuse(&conn, &node(why));
    }
    let pidfd = sock::peer_pidfd(&conn).ok();
    if pidfd.is_none() {
        crate::log::once("node-no-pidfd", crate::log::Level::Warn, || {
            "ringfeed node: no pidfd for a consumer's process (kernel before 5.3?): its \
             batches are freed when its connection closes, not when it exits"
                .to_string()
        });
    }
    let hello = match sock::poll(&[(&conn, true)], Some(HELLO_WAIT)) {
        Ok(r) if r[0].readable => sock::recv(&conn, &mut buf),
        _ => {
            return refuse(
                &conn,
                &node(format!("no hello within {} s", HELLO_WAIT.as_secs())),
            );
        }
    };
    let req = match hello {
        Ok(Some(_)) => proto::decode::<Request>(&buf, "the first message"),
        Ok(None) => return,
        Err(e) => return refuse(&conn, &node(format!("the first message: {e}"))),
    };
    let role = match req {
        Ok(Request::Hello {
            protocol,
            library,
            role,
        }) => match proto::check_versions(protocol, &library) {
            Ok(()) => role,
            Err(why) => return refuse(&conn, &node(why)),
        },
        Ok(other) => {
            return refuse(
                &conn,
                &node(format!(
                    "the first message must be a hello, not {}",
                    request_name(&other)
                )),
            );
        }
        Err(e) => return refuse(&conn, &node(e.0)),
    };
    match role {
        Role::Consumer { config } => consumer(conn, pidfd, engine, &config, buf),
        Role::Holder => holder(conn, pidfd, engine, buf),
    }
}

fn request_name(r: &Request) -> &'static str {
    match r {
        Request::Hello { .. } => "a hello",
        Request::Stats => "a stats request",
        Request::Source { .. } => "a source request",
        Request::Claim { .. } => "a claim",
    }
}

/// The consumer's loader configuration: the engine's, with the consumer's
/// own keys; checked to agree on the job's.
fn consumer_config(attach: &Map<String, Value>, base: &Config) -> Result<Config> {
    let theirs = Config::from_map(attach)?;
    if let Some((key, ours, theirs)) = base.disagreement(&theirs) {
        return Err(node(format!(
            "the consumer's `{key}` ({theirs}) differs from the node engine's ({ours}): every \
             consumer of one engine must give the same dataset, epoch and layout keys"
        )));
    }
    let mut cfg = base.clone();
    cfg.take_consumer_keys(&theirs);
    cfg.node = crate::config::NodeMode::Off;
    cfg.shared_arena = true;
    // The consumer registers its own mapping with CUDA (it is the process
    // that copies to the GPU); the engine's would pin for nothing.
    cfg.cuda_register = crate::config::Toggle::Off;
    cfg.validate()?;
    Ok(cfg)
}

/// The consumer's memory files and eventfds.
struct Transport {
    rings: Rings,
    rings_file: std::fs::File,
    ready: OwnedFd,
    wake: OwnedFd,
    arena_ro: std::fs::File,
}

fn transport(engine: &Engine) -> std::io::Result<Transport> {
    let (rings, rings_file) = Rings::create()?;
    let ready = sock::eventfd()?;
    let wake = sock::eventfd()?;
    let fd = engine
        .pool
        .arena()
        .shared_fd()
        .ok_or_else(|| std::io::Error::other("the engine's arena is not in a memory file"))?;
    // Sealed (`engine_pool`): the descriptor reopened through /proc with
    // write access still maps no page writable, nor resizes the file.
    let arena_ro = sock::reopen_read_only(fd)?;
    Ok(Transport {
        rings,
        rings_file,
        ready,
        wake,
        arena_ro,
    })
}

fn consumer(
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
        Err(e) => return refuse(&conn, &node(format!("setting up the transport: {e}"))),
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
        loader,
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
    lock(&engine.feeds).insert(party, Arc::downgrade(&feed));
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
        let untaken: Vec<u64> = lock(&feed.unread).drain(..).map(|(_, id)| id).collect();
        let mut freed = Vec::new();
        {
            let mut holds = lock(&engine.holds);
            for id in untaken {
                freed.extend(holds.consumer_release(party, id, false));
            }
        }
        engine.free(freed);
    }
    // The consumer sees its end now, whether it hung up or was refused.
    // SAFETY: shuts down a socket this function owns.
    unsafe { libc::shutdown(conn.as_raw_fd(), libc::SHUT_RDWR) };
    lock(&engine.feeds).remove(&party);
    engine.whole.consumers.fetch_sub(1, Ordering::AcqRel);
    // The consumer left; its batches stay held until it releases them or
    // its process exits. Without a pidfd, its leaving is all there is.
    if !exited && let Some(pidfd) = &pidfd {
        let mut idle = 0;
        while lock(&engine.holds).pending_for(party) > 0 {
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
    let freed = lock(&engine.holds).consumer_exited(party);
    engine.free(freed);
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
    sock::drain(wake);
    let mut released = Vec::new();
    if rings.drain_releases(&mut released).is_err() {
        return false;
    }
    if released.is_empty() {
        *idle += 1;
        if *idle >= IDLE_WAKES {
            // Woken for nothing, again and again: a flood. Slow down; real
            // releases wait at most this long.
            std::thread::sleep(Duration::from_millis(1));
        }
        return true;
    }
    *idle = 0;
    let mut freed = Vec::new();
    {
        let mut holds = lock(&engine.holds);
        for r in released {
            if let Some(b) = holds.consumer_release(party, r & !SHIPPED, r & SHIPPED != 0) {
                freed.push(b);
            }
        }
    }
    engine.free(freed);
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
                        refuse(conn, &node(e.0));
                        return false;
                    }
                },
                Ok(None) => return false,
                Err(e) => {
                    refuse(conn, &node(format!("a request: {e}")));
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

fn refused(e: Error) -> Reply {
    Reply::Refused {
        status: e.status(),
        message: e.to_string(),
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
        other => refused(node(format!(
            "{} on a consumer's connection: a consumer asks for stats and sources; keeps go \
             through a holder's link",
            request_name(other)
        ))),
    }
}

/// Pushes one record (of batch `id`, if it is one), waiting while the ring
/// is full; `false` once stopped.
fn push(feed: &Feed, rec: &[u8], id: Option<u64>) -> bool {
    loop {
        if feed.rings.push_record(rec) {
            if let Some(id) = id {
                lock(&feed.unread).push_back((feed.rings.written(), id));
            }
            sock::notify(&feed.ready);
            return true;
        }
        if feed.stop.load(Ordering::Acquire) {
            return false;
        }
        let g = lock(&feed.room.0);
        let _ = feed.room.1.wait_timeout(g, Duration::from_millis(50));
    }
}

fn failed(feed: &Feed, e: &Error) {
    push(
        feed,
        &record::encode_failed(e.status(), &e.to_string()),
        None,
    );
}

fn run_feed(feed: &Feed, engine: &Engine) {
    let arena = feed.loader.arena();
    let (base, len) = (arena.base().cast_const(), arena.len());
    let mut buf = Vec::new();
    loop {
        if feed.stop.load(Ordering::Acquire) {
            return;
        }
        let rec = match feed.loader.next(Some(Duration::from_millis(200))) {
            Ok(Next::Batch(b)) => {
                let cap = match Cap::random() {
                    Ok(c) => c,
                    Err(e) => return failed(feed, &node(format!("a batch's capability: {e}"))),
                };
                let state = feed.loader.state().to_hex();
                // The number is the table's; the record is written with it
                // once the batch is in, so a release can never precede it.
                let id = lock(&engine.holds).insert(feed.party, cap.0, b);
                let encoded = encode_held(engine, id, cap.0, &state, base, len, &mut buf);
                let fits = || buf.len() <= feed.rings.max_record();
                if encoded.is_err() || !fits() {
                    let freed = lock(&engine.holds).consumer_release(feed.party, id, false);
                    engine.free(freed.into_iter().collect());
                }
                if let Err(e) = encoded {
                    return failed(feed, &e);
                }
                if !fits() {
                    let e = node(format!(
                        "a batch's descriptor takes {} bytes, over the ring's {}: lower \
                         `batch_size`",
                        buf.len(),
                        feed.rings.max_record()
                    ));
                    return failed(feed, &e);
                }
                engine.whole.first_out.store(true, Ordering::Release);
                if !push(feed, &buf, Some(id)) {
                    // Stopped before its record went out: never the
                    // consumer's.
                    let freed = lock(&engine.holds).consumer_release(feed.party, id, false);
                    engine.free(freed.into_iter().collect());
                    return;
                }
                continue;
            }
            Ok(Next::EndOfEpoch(e)) => {
                record::encode_end_of_epoch(e, &feed.loader.state().to_hex())
            }
            Ok(Next::Timeout) => continue,
            Ok(Next::Finished) => {
                push(feed, &record::encode_finished(), None);
                return;
            }
            Err(Error::Closed) if feed.stop.load(Ordering::Acquire) => return,
            Err(e) => return failed(feed, &e),
        };
        if !push(feed, &rec, None) {
            return;
        }
    }
}

/// Encodes batch `id` of the table into `out`.
fn encode_held(
    engine: &Engine,
    id: u64,
    cap: u64,
    state: &str,
    base: *const u8,
    len: usize,
    out: &mut Vec<u8>,
) -> Result<()> {
    let holds = lock(&engine.holds);
    let b = holds
        .get(id)
        .ok_or_else(|| Error::Internal(format!("batch {id} left the table before it was sent")))?;
    record::encode_batch(b, id, cap, state, base, len, out).map_err(Error::Internal)
}

fn holder(conn: OwnedFd, pidfd: Option<OwnedFd>, engine: &Arc<Engine>, mut buf: Vec<u8>) {
    let pid = sock::peer(&conn).map(|(_, p)| p).unwrap_or(0);
    let owner = match engine.pool.join_holder(format!("process {pid}")) {
        Ok(o) => o,
        Err(e) => return refuse(&conn, &e),
    };
    let t = match transport(engine) {
        Ok(t) => t,
        Err(e) => {
            engine.pool.leave(owner, 1);
            return refuse(&conn, &node(format!("setting up the transport: {e}")));
        }
    };
    let party = engine.party();
    let reply = Reply::Linked {
        engine: engine.id,
        arena_len: engine.pool.arena().len() as u64,
        pid: std::process::id(),
    };
    let fds = [
        t.arena_ro.as_raw_fd(),
        t.rings_file.as_raw_fd(),
        t.wake.as_raw_fd(),
    ];
    if sock::send(&conn, &proto::encode(&reply), &fds).is_ok() {
        drop((t.arena_ro, t.rings_file));
        engine.whole.holders.fetch_add(1, Ordering::AcqRel);
        holder_loop(
            &conn,
            &t.wake,
            pidfd.as_ref(),
            &t.rings,
            party,
            owner,
            engine,
            &mut buf,
        );
        engine.whole.holders.fetch_sub(1, Ordering::AcqRel);
    }
    let freed = lock(&engine.holds).holder_exited(party);
    engine.free(freed);
    engine.pool.leave(owner, 1);
}

/// A holder's keeps and releases, until its process exits (or, without a
/// pidfd, it hangs up). After a hang-up it keeps what it kept until then.
#[allow(clippy::too_many_arguments)]
fn holder_loop(
    conn: &OwnedFd,
    wake: &OwnedFd,
    pidfd: Option<&OwnedFd>,
    rings: &Rings,
    party: u64,
    owner: usize,
    engine: &Engine,
    buf: &mut Vec<u8>,
) {
    let mut open = true;
    let mut idle = 0u32;
    let mut released = Vec::new();
    loop {
        if !open && (pidfd.is_none() || lock(&engine.holds).kept_by(party) == 0) {
            return;
        }
        let mut fds = vec![(wake, true)];
        if let Some(p) = pidfd {
            fds.push((p, true));
        }
        if open {
            fds.push((conn, true));
        }
        let Ok(ready) = sock::poll(&fds, None) else {
            return;
        };
        if pidfd.is_some() && (ready[1].readable || ready[1].hangup) {
            return;
        }
        if ready[0].readable {
            sock::drain(wake);
            released.clear();
            if rings.drain_releases(&mut released).is_err() {
                open = false;
                continue;
            }
            if released.is_empty() {
                idle += 1;
                if idle >= IDLE_WAKES {
                    std::thread::sleep(Duration::from_millis(1));
                }
            } else {
                idle = 0;
                let mut freed = Vec::new();
                {
                    let mut holds = lock(&engine.holds);
                    for &id in &released {
                        if let Ok(Some(b)) = holds.holder_release(party, id) {
                            freed.push(b);
                        }
                    }
                }
                engine.free(freed);
            }
        }
        if !open {
            continue;
        }
        let c = ready[ready.len() - 1];
        if c.readable {
            let reply = match sock::recv(conn, buf) {
                Ok(Some(_)) => match proto::decode::<Request>(buf, "a request") {
                    Ok(req) => answer_holder(&req, party, owner, engine),
                    Err(e) => {
                        refuse(conn, &node(e.0));
                        open = false;
                        continue;
                    }
                },
                Ok(None) => {
                    open = false;
                    continue;
                }
                Err(e) => {
                    refuse(conn, &node(format!("a request: {e}")));
                    open = false;
                    continue;
                }
            };
            if sock::send(conn, &proto::encode(&reply), &[]).is_err() {
                open = false;
            }
        } else if c.hangup {
            open = false;
        }
    }
}

fn answer_holder(req: &Request, party: u64, owner: usize, engine: &Engine) -> Reply {
    match req {
        Request::Claim {
            engine: id,
            batch,
            cap,
        } => {
            if *id != engine.id {
                return refused(node(format!(
                    "the key is of engine {id}, not of the one at `{}` now ({}): an earlier \
                     engine's batches are gone with it",
                    engine.socket.display(),
                    engine.id
                )));
            }
            match lock(&engine.holds).claim(party, owner, *batch, cap.0) {
                Ok(()) => Reply::Claimed,
                Err(r) => refused(node(r.explain(*batch))),
            }
        }
        Request::Stats => Reply::Stats {
            stats: json!({}),
            counts: None,
            node: engine.node_stats(None),
        },
        other => refused(node(format!(
            "{} on a holder's link: a holder keeps batches (claim) and asks for stats",
            request_name(other)
        ))),
    }
}
