//! A holder's session: the arena's memory file and a release ring handed
//! over, then its keeps (each answered) and releases until its process
//! exits (see the module's doc).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::json;

use super::{node, refuse, refused, request_name, take_ring, transport};
use crate::error::NodeFailure;
use crate::node::engine::Engine;
use crate::node::proto::{self, Reply, Request};
use crate::node::shm::Rings;
use crate::node::sock;
use crate::sync::Locked;

pub(super) fn serve(conn: OwnedFd, pidfd: Option<OwnedFd>, engine: &Arc<Engine>, mut buf: Vec<u8>) {
    let pid = sock::peer(&conn).map(|(_, p)| p).unwrap_or(0);
    let owner = match engine.pool.join_holder(format!("process {pid}")) {
        Ok(o) => o,
        Err(e) => return refuse(&conn, &e),
    };
    let t = match transport(engine) {
        Ok(t) => t,
        Err(e) => {
            engine.pool.leave(owner, 1);
            return refuse(
                &conn,
                &node(NodeFailure::Local, format!("setting up the transport: {e}")),
            );
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
    engine.release(|holds| holds.holder_exited(party));
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
    // A ring the holder broke is read no more: what it keeps stays kept
    // until its process exits.
    let mut ring_ok = true;
    let mut idle = 0u32;
    let mut released = Vec::new();
    loop {
        if !open && (pidfd.is_none() || engine.holds.locked().kept_by(party) == 0) {
            return;
        }
        let mut fds = vec![(wake, ring_ok)];
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
            if take_ring(wake, rings, &mut idle, &mut released).is_err() {
                ring_ok = false;
            } else if !released.is_empty() {
                engine.release(|holds| {
                    released
                        .iter()
                        .filter_map(|&id| holds.holder_release(party, id).ok().flatten())
                        .collect::<Vec<_>>()
                });
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
                        refuse(conn, &node(NodeFailure::Protocol, e.0));
                        open = false;
                        continue;
                    }
                },
                Ok(None) => {
                    open = false;
                    continue;
                }
                Err(e) => {
                    refuse(conn, &node(NodeFailure::Gone, format!("a request: {e}")));
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
                return refused(node(
                    NodeFailure::Refused,
                    format!(
                        "the key is of engine {id}, not of the one at `{}` now ({}): an earlier \
                     engine's batches are gone with it",
                        engine.socket.display(),
                        engine.id
                    ),
                ));
            }
            match engine.holds.locked().claim(party, owner, *batch, cap.0) {
                Ok(()) => Reply::Claimed,
                Err(r) => refused(node(NodeFailure::Refused, r.explain(*batch))),
            }
        }
        Request::Stats => Reply::Stats {
            stats: json!({}),
            counts: None,
            node: engine.node_stats(None),
        },
        other => refused(node(
            NodeFailure::Protocol,
            format!(
                "{} on a holder's link: a holder keeps batches (claim) and asks for stats",
                request_name(other)
            ),
        )),
    }
}
