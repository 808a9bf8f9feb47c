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
//!
//! The files: this one (the checks, the hello, what every role uses),
//! `consumer.rs` (a consumer's session), `feed.rs` (its feeder thread),
//! `holder.rs` (a holder's session).

mod consumer;
mod feed;
mod holder;

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use super::engine::Engine;
use super::proto::{self, Reply, Request, Role};
use super::shm::Rings;
use super::sock;
use crate::error::{Error, NodeFailure};

/// How long a new connection may take to send its hello.
const HELLO_WAIT: Duration = Duration::from_secs(10);

/// Wake-ups in a row that bring nothing to do before the session slows
/// its polling: a consumer flooding its eventfd costs the engine little.
const IDLE_WAKES: u32 = 1000;

/// Takes every release a party's ring holds into `out`, after its wake-up
/// (`wake` drained). `Err` when the ring is broken (the party is then
/// treated as gone). A party that wakes the engine again and again with
/// nothing in its ring (a flood) gets its session slowed: real releases
/// then wait at most a millisecond.
pub(super) fn take_ring(
    wake: &OwnedFd,
    rings: &Rings,
    idle: &mut u32,
    out: &mut Vec<u64>,
) -> Result<(), ()> {
    sock::drain(wake);
    out.clear();
    rings.drain_releases(out).map_err(|_| ())?;
    if out.is_empty() {
        *idle += 1;
        if *idle >= IDLE_WAKES {
            std::thread::sleep(Duration::from_millis(1));
        }
    } else {
        *idle = 0;
    }
    Ok(())
}

pub(super) fn refuse(conn: &OwnedFd, e: &Error) {
    let reply = Reply::Refused {
        status: e.status(),
        message: e.to_string(),
    };
    let _ = sock::send(conn, &proto::encode(&reply), &[]);
}

pub(super) fn node(failure: NodeFailure, msg: impl Into<String>) -> Error {
    Error::node(failure, msg)
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
        return refuse(&conn, &node(NodeFailure::Refused, why));
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
                &node(
                    NodeFailure::Protocol,
                    format!("no hello within {} s", HELLO_WAIT.as_secs()),
                ),
            );
        }
    };
    let req = match hello {
        Ok(Some(_)) => proto::decode::<Request>(&buf, "the first message"),
        Ok(None) => return,
        Err(e) => {
            return refuse(
                &conn,
                &node(NodeFailure::Gone, format!("the first message: {e}")),
            );
        }
    };
    let role = match req {
        Ok(Request::Hello {
            protocol,
            library,
            role,
        }) => match proto::check_versions(protocol, &library) {
            Ok(()) => role,
            Err(why) => return refuse(&conn, &node(NodeFailure::Refused, why)),
        },
        Ok(other) => {
            return refuse(
                &conn,
                &node(
                    NodeFailure::Protocol,
                    format!(
                        "the first message must be a hello, not {}",
                        request_name(&other)
                    ),
                ),
            );
        }
        Err(e) => return refuse(&conn, &node(NodeFailure::Protocol, e.0)),
    };
    match role {
        Role::Consumer { config } => consumer::serve(conn, pidfd, engine, &config, buf),
        Role::Holder => holder::serve(conn, pidfd, engine, buf),
    }
}

pub(super) fn request_name(r: &Request) -> &'static str {
    match r {
        Request::Hello { .. } => "a hello",
        Request::Stats => "a stats request",
        Request::Source { .. } => "a source request",
        Request::Claim { .. } => "a claim",
    }
}

pub(super) fn refused(e: Error) -> Reply {
    Reply::Refused {
        status: e.status(),
        message: e.to_string(),
    }
}

/// The consumer's memory files and eventfds.
pub(super) struct Transport {
    pub rings: Rings,
    pub rings_file: std::fs::File,
    pub ready: OwnedFd,
    pub wake: OwnedFd,
    pub arena_ro: std::fs::File,
}

pub(super) fn transport(engine: &Engine) -> std::io::Result<Transport> {
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
