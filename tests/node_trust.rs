//! What a node engine promises whoever attaches to it, tested against the
//! ways it is broken: a consumer that scribbles on, truncates and floods
//! everything it was handed hurts only itself; garbage on the socket gets
//! a named refusal while the others go on; a batch is kept only with its
//! key, only by the process that reads it, and a kept batch's bytes stay
//! while the arena is read through again (with a control: the same batch
//! not kept is read into); a consumer speaks only to a socket of its own
//! user, and never sends it credentials. The engine runs on a thread of
//! this process (`support::node::engine`); the hostile peers are raw
//! connections speaking the protocol's types (`ringfeed::node::proto`).

use ringfeed_test_support as support;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use ringfeed::consumer::{AnyNext, Attached};
use ringfeed::node::proto::{self, Cap, EngineId, Key, Reply, Request, Role};
use ringfeed::node::{self, sock};
use serde_json::{Map, Value, json};
use support::node::*;

/// Sends each of `msgs` on a new raw connection and returns the engine's
/// reply to each (`None`: none came, the connection was closed).
fn raw(socket: &Path, msgs: &[Vec<u8>]) -> Vec<Option<Reply>> {
    let conn = sock::connect(socket).unwrap();
    let mut out = Vec::new();
    let mut buf = Vec::new();
    for m in msgs {
        if sock::send(&conn, m, &[]).is_err() {
            out.push(None);
            continue;
        }
        let got = match sock::poll(&[(&conn, true)], Some(Duration::from_secs(30))) {
            Ok(r) if r[0].readable => sock::recv(&conn, &mut buf).ok().flatten(),
            _ => None,
        };
        out.push(got.map(|_| proto::decode::<Reply>(&buf, "a reply").unwrap()));
    }
    out
}

fn refused_with(r: &Option<Reply>, needle: &str) {
    match r {
        Some(Reply::Refused { status, message }) => {
            assert_eq!(
                *status,
                ringfeed::ffi::status::RINGFEED_ERR_NODE,
                "{message}"
            );
            assert!(message.contains(needle), "{needle:?} not in {message:?}");
        }
        other => panic!("expected a refusal saying {needle:?}, got {other:?}"),
    }
}

fn consumer_hello(c: &Map<String, Value>) -> Vec<u8> {
    proto::encode(&Request::hello(Role::Consumer {
        config: ringfeed::Config::for_node_engine(c),
    }))
}

#[test]
fn garbage_on_the_socket_gets_a_named_refusal_and_the_engine_serves_the_others() {
    let (_dir, socket) = engine(job());
    let good = open(consumer(1, 1), Some(&socket)).unwrap();
    let stats = proto::encode(&Request::Stats);
    // Not a message of the protocol at all, and cut short.
    refused_with(&raw(&socket, &[b"hello".to_vec()])[0], "is not one");
    refused_with(
        &raw(&socket, &[b"{\"type\":\"hel".to_vec()])[0],
        "is not one",
    );
    refused_with(
        &raw(&socket, &[b"{\"type\":\"launch\"}".to_vec()])[0],
        "is not one",
    );
    // Longer than the protocol allows.
    let huge = vec![b'{'; proto::MAX_MESSAGE + 10];
    refused_with(&raw(&socket, &[huge])[0], "longer than");
    // Out of order: a request before the hello.
    refused_with(
        &raw(&socket, std::slice::from_ref(&stats))[0],
        "must be a hello",
    );
    // Another protocol, another release.
    let other = |protocol: u32, library: &str| {
        proto::encode(&Request::Hello {
            protocol,
            library: library.into(),
            role: Role::Holder,
        })
    };
    refused_with(&raw(&socket, &[other(1, proto::LIBRARY)])[0], "protocol 1");
    refused_with(
        &raw(&socket, &[other(proto::PROTOCOL, "0.0.0")])[0],
        "\"0.0.0\"",
    );
    // A consumer whose requests are out of its role, then garbage.
    let replies = raw(
        &socket,
        &[
            consumer_hello(&consumer(0, 0)),
            consumer_hello(&consumer(0, 0)),
            proto::encode(&Request::Claim {
                engine: EngineId(1),
                batch: 1,
                cap: Cap(1),
            }),
            stats.clone(),
            b"\x00\x01\x02".to_vec(),
            stats.clone(),
        ],
    );
    assert!(
        matches!(replies[0], Some(Reply::Attached { .. })),
        "{replies:?}"
    );
    refused_with(&replies[1], "a hello on a consumer's connection");
    refused_with(&replies[2], "a claim on a consumer's connection");
    assert!(
        matches!(replies[3], Some(Reply::Stats { .. })),
        "{:?}",
        replies[3]
    );
    refused_with(&replies[4], "is not one");
    assert!(
        replies[5].is_none(),
        "served after garbage: {:?}",
        replies[5]
    );
    // A holder asking for sources.
    let replies = raw(
        &socket,
        &[
            proto::encode(&Request::hello(Role::Holder)),
            proto::encode(&Request::Source { shard: 0 }),
        ],
    );
    assert!(
        matches!(replies[0], Some(Reply::Linked { .. })),
        "{replies:?}"
    );
    refused_with(&replies[1], "a source request on a holder's link");
    // The consumer attached throughout got its batches, all of them.
    let alone = drain(&open(consumer(1, 1), None).unwrap());
    assert_eq!(drain(&good), alone);
    // And the engine takes new consumers.
    let late = open(consumer(0, 1), Some(&socket)).unwrap();
    assert_eq!(drain(&late), drain(&open(consumer(0, 1), None).unwrap()));
}

/// The errno of the last failed call.
fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[test]
fn a_consumer_that_truncates_scribbles_on_and_floods_what_it_holds_hurts_only_itself() {
    let (_dir, socket) = engine(job());
    // Two consumers that stream every batch while the third attacks.
    let good: Vec<_> = [(0, 1), (1, 0)]
        .into_iter()
        .map(|(r, w)| {
            let s = socket.clone();
            std::thread::spawn(move || {
                let l = open(consumer(r, w), Some(&s)).unwrap();
                drain(&l)
            })
        })
        .collect();
    let conn = sock::connect(&socket).unwrap();
    sock::send(&conn, &consumer_hello(&consumer(0, 0)), &[]).unwrap();
    let mut buf = Vec::new();
    let fds = sock::recv(&conn, &mut buf).unwrap().unwrap();
    let Ok(Reply::Attached { arena_len, .. }) = proto::decode::<Reply>(&buf, "attach") else {
        panic!("not attached: {}", String::from_utf8_lossy(&buf));
    };
    let [arena, rings, ready, wake]: [OwnedFd; 4] = fds.try_into().unwrap();
    let arena_len = arena_len as usize;
    // The arena, reopened for writing through /proc (a memory file's
    // permissions let its owner do that): no resize, no write, no hole, no
    // writable mapping.
    let rw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{}", arena.as_raw_fd()))
        .unwrap();
    let fd = rw.as_raw_fd();
    // SAFETY: plain calls on a descriptor this test owns; each must fail.
    unsafe {
        assert_eq!(libc::ftruncate(fd, 4096), -1);
        assert_eq!(errno(), libc::EPERM, "shrinking the arena");
        assert_eq!(libc::ftruncate(fd, (arena_len * 2) as i64), -1);
        assert_eq!(errno(), libc::EPERM, "growing the arena");
        assert_eq!(libc::pwrite(fd, b"x".as_ptr().cast(), 1, 0), -1);
        assert_eq!(errno(), libc::EPERM, "writing the arena");
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        assert_eq!(libc::fallocate(fd, punch, 0, 1 << 20), -1);
        assert_eq!(errno(), libc::EPERM, "punching a hole in the arena");
        let p = libc::mmap(
            std::ptr::null_mut(),
            arena_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert_eq!(p, libc::MAP_FAILED, "a writable mapping of the arena");
        assert_eq!(
            libc::fcntl(fd, libc::F_ADD_SEALS, 0),
            -1,
            "the seals are sealed"
        );
    }
    // Control: the same calls on a memory file without the seals succeed —
    // it is the seals that stop them.
    // SAFETY: a new memory file of this test's; plain calls.
    unsafe {
        let free = libc::memfd_create(c"control".as_ptr(), libc::MFD_CLOEXEC);
        assert!(free >= 0);
        let free = OwnedFd::from_raw_fd(free);
        assert_eq!(libc::ftruncate(free.as_raw_fd(), 1 << 20), 0);
        assert_eq!(libc::ftruncate(free.as_raw_fd(), 4096), 0);
        assert_eq!(
            libc::pwrite(free.as_raw_fd(), b"x".as_ptr().cast(), 1, 0),
            1
        );
    }
    // The rings: no resize either; every byte of them scribbled over, again
    // and again, while both eventfds are flooded and drained.
    let rings = std::fs::File::from(rings);
    let len = rings.metadata().unwrap().len() as usize;
    assert!(rings.set_len(4096).is_err(), "shrinking the rings");
    assert!(rings.set_len(len as u64 * 2).is_err(), "growing the rings");
    // SAFETY: a shared mapping of the rings, which this peer may write.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            rings.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..200 {
        // SAFETY: the mapping is `len` bytes, 8-aligned; garbage is the point.
        let words = unsafe { std::slice::from_raw_parts_mut(map.cast::<u64>(), len / 8) };
        for (i, w) in words
            .iter_mut()
            .enumerate()
            .step_by(if round % 2 == 0 { 1 } else { 61 })
        {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *w = x ^ i as u64;
        }
        for fd in [&wake, &ready] {
            let v = if round % 3 == 0 { u64::MAX - 1 } else { 1 };
            // SAFETY: 8 readable bytes; a full counter refuses, which is fine.
            unsafe { libc::write(fd.as_raw_fd(), (&raw const v).cast(), 8) };
        }
        sock::drain(&ready);
        let _ = sock::send(&conn, &[0xff; 64], &[]);
    }
    // SAFETY: unmapped once.
    unsafe { libc::munmap(map, len) };
    // The others got every batch of theirs.
    for (t, (r, w)) in good.into_iter().zip([(0, 1), (1, 0)]) {
        let got = t.join().expect("a good consumer panicked");
        assert_eq!(
            got,
            drain(&open(consumer(r, w), None).unwrap()),
            "consumer {r}/{w}"
        );
    }
    drop(conn);
    // The engine goes on.
    let late = open(consumer(0, 0), Some(&socket)).unwrap();
    assert_eq!(drain(&late), drain(&open(consumer(0, 0), None).unwrap()));
}

/// The bytes of batch `b`'s fields read through `base`, a mapping of the
/// arena that the consumer maps at `mine`.
fn bytes_through(
    b: &ringfeed::consumer::AnyBatch,
    mine: *const u8,
    base: *const u8,
) -> Vec<Vec<u8>> {
    b.raw_fields()
        .iter()
        .map(|f| {
            let at = f.data as usize - mine as usize;
            // SAFETY: the field lies in the arena, which both map whole.
            unsafe { std::slice::from_raw_parts(base.add(at), f.len) }.to_vec()
        })
        .collect()
}

fn node_stats(l: &Attached) -> Value {
    let (json, _) = l.stats().unwrap();
    serde_json::from_str::<Value>(&json).unwrap()["node"].clone()
}

#[test]
fn a_batch_is_kept_with_its_key_by_the_process_that_reads_it_and_outlives_its_consumer() {
    let mut own = small(job());
    own.insert("memory_budget".into(), json!("8MiB"));
    let (_dir, socket) = engine(own);
    let worker = open(small(consumer(0, 0)), Some(&socket)).unwrap();
    let mut batches = Vec::new();
    while batches.len() < 2 {
        if let AnyNext::Batch(b) = worker.next(Some(Duration::from_secs(60))).unwrap() {
            batches.push(b);
        }
    }
    let (_, mine, _) = worker.arena().unwrap();
    let kept = batches[0].ship().unwrap();
    // The control: a batch of the same consumer, whose key no one keeps.
    let control = batches[1].node_key().unwrap();
    // Keys that are not the batch's, or a keep for another process.
    let key = Key::parse(&kept).unwrap();
    let forged = Key {
        cap: Cap(key.cap.0 ^ 1),
        ..key.clone()
    };
    let msg = node::claim(&forged.to_text()).unwrap_err().to_string();
    assert!(msg.contains("capability"), "{msg}");
    let stale = Key {
        engine: EngineId(key.engine.0 ^ 1),
        ..key.clone()
    };
    let msg = node::claim(&stale.to_text()).unwrap_err().to_string();
    assert!(msg.contains("not of the one at"), "{msg}");
    let never = Key {
        batch: 1 << 40,
        ..key.clone()
    };
    let msg = node::claim(&never.to_text()).unwrap_err().to_string();
    assert!(msg.contains("no longer held"), "{msg}");
    let msg = node::keep(&kept, 1).unwrap_err().to_string();
    assert!(msg.contains("kept by the process that reads it"), "{msg}");
    let msg = node::release(&kept).unwrap_err().to_string();
    assert!(msg.contains("keeps no batch"), "{msg}");
    // Kept: the holder's own mapping shows the consumer's bytes.
    let (base, len) = node::claim(&kept).unwrap();
    assert!(len > 0);
    let kept_bytes = bytes_through(&batches[0], mine, base);
    assert_eq!(kept_bytes, bytes_through(&batches[0], mine, mine));
    let spans: Vec<(usize, usize)> = batches[0]
        .raw_fields()
        .iter()
        .map(|f| (f.data as usize - mine as usize, f.len))
        .collect();
    // The consumer lets go of both and leaves.
    drop(batches);
    worker.close();
    drop(worker);
    // Two consumers read the whole job through the small arena again.
    let a = open(small(consumer(0, 0)), Some(&socket)).unwrap();
    let b = open(small(consumer(0, 1)), Some(&socket)).unwrap();
    drain(&a);
    drain(&b);
    let n = node_stats(&b);
    assert_eq!(n["batches_kept"], json!(1), "{n}");
    let now: Vec<Vec<u8>> = spans
        .iter()
        // SAFETY: each span lies in the arena, which the holder maps whole.
        .map(|&(at, n)| unsafe { std::slice::from_raw_parts(base.add(at), n) }.to_vec())
        .collect();
    assert_eq!(now, kept_bytes, "a kept batch was read into");
    // Control: the batch no one kept was freed when its consumer let go:
    // its memory went back to the pool, and a keep now comes too late.
    let msg = node::claim(&control).unwrap_err().to_string();
    assert!(msg.contains("no longer held"), "{msg}");
    // Released: freed; a second release is refused by name.
    node::release(&kept).unwrap();
    let msg = node::release(&kept).unwrap_err().to_string();
    assert!(msg.contains("keeps no batch"), "{msg}");
    let start = std::time::Instant::now();
    while node_stats(&b)["batches_kept"] != json!(0) {
        assert!(start.elapsed() < Duration::from_secs(60), "not freed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_consumer_speaks_only_to_a_socket_of_its_own_user_and_sends_no_credentials() {
    use std::os::unix::fs::PermissionsExt;
    // A listener of the test's that records what a consumer sends.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.sock");
    let listener = sock::listen(&path).unwrap();
    let mut cfg = consumer(0, 1);
    cfg.insert("aws_access_key_id".into(), json!("AKIDEXAMPLE"));
    cfg.insert("aws_secret_access_key".into(), json!("SECRETVALUE1234"));
    cfg.insert("aws_session_token".into(), json!("TOKENVALUE1234"));
    cfg.insert("memory_budget".into(), json!("99MiB"));
    cfg.insert("node".into(), json!(path));
    let seen = std::thread::spawn(move || {
        let conn = sock::accept(&listener).unwrap();
        let mut buf = Vec::new();
        sock::recv(&conn, &mut buf).unwrap();
        buf
    });
    let _ = Attached::open_json(&Value::Object(cfg.clone()).to_string());
    let sent = String::from_utf8(seen.join().unwrap()).unwrap();
    for secret in ["AKIDEXAMPLE", "SECRETVALUE1234", "TOKENVALUE1234", "99MiB"] {
        assert!(!sent.contains(secret), "{secret} was sent: {sent}");
    }
    let Request::Hello {
        role: Role::Consumer { config },
        ..
    } = proto::decode::<Request>(sent.as_bytes(), "hello").unwrap()
    else {
        panic!("not a consumer's hello: {sent}");
    };
    for key in config.keys() {
        let scope = ringfeed::config::KEY_SCOPES
            .iter()
            .find(|(k, _)| k == key)
            .unwrap()
            .1;
        assert!(
            matches!(
                scope,
                ringfeed::config::Scope::Job | ringfeed::config::Scope::Consumer
            ),
            "`{key}` ({scope:?}) was sent"
        );
    }
    assert_eq!(config["loader_worker"], json!(1));
    // A socket others may open, or in a folder others may write: refused
    // before a byte is sent (the listener accepts nothing).
    let listener = sock::listen(&path.with_extension("2")).unwrap();
    let open_to_all = path.with_extension("2");
    std::fs::set_permissions(&open_to_all, std::fs::Permissions::from_mode(0o666)).unwrap();
    cfg.insert("node".into(), json!(open_to_all));
    let e = Attached::open_json(&Value::Object(cfg.clone()).to_string())
        .err()
        .expect("refused");
    assert!(
        e.to_string().contains("may be opened by other users"),
        "{e}"
    );
    std::fs::set_permissions(&open_to_all, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = Attached::open_json(&Value::Object(cfg.clone()).to_string())
        .err()
        .expect("refused");
    assert!(
        e.to_string().contains("may be written by other users"),
        "{e}"
    );
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        // Another user's socket (root may make one): refused by its owner.
        std::os::unix::fs::lchown(&open_to_all, Some(65534), Some(65534)).unwrap();
        let e = Attached::open_json(&Value::Object(cfg.clone()).to_string())
            .err()
            .expect("refused");
        assert!(e.to_string().contains("belongs to user 65534"), "{e}");
    }
    // Nothing reached the listener.
    assert!(
        !sock::poll(&[(&listener, true)], Some(Duration::ZERO)).unwrap()[0].readable,
        "a connection was made to a socket that failed its checks"
    );
    // Control: the same socket, as made, is spoken to.
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    std::os::unix::fs::lchown(&open_to_all, Some(me), None).ok();
    let accepted = std::thread::spawn(move || sock::accept(&listener).is_ok());
    let _ = Attached::open_json(&Value::Object(cfg).to_string());
    assert!(accepted.join().unwrap());
}

/// What `open_json` says of an engine at `path` that `serve` answers a
/// consumer's attach with (a listener of the test's, no engine).
fn attach_against(path: &Path, serve: impl FnOnce(OwnedFd) + Send + 'static) -> ringfeed::Error {
    let listener = sock::listen(path).unwrap();
    let server = std::thread::spawn(move || serve(sock::accept(&listener).unwrap()));
    let mut cfg = consumer(0, 1);
    cfg.insert("node".into(), json!(path));
    let e = Attached::open_json(&Value::Object(cfg).to_string())
        .err()
        .expect("no engine answered");
    server.join().unwrap();
    e
}

#[test]
fn an_attach_whose_reply_never_comes_is_told_from_an_engine_that_closed() {
    let dir = tempfile::tempdir().unwrap();
    // The hello arrives and is never read: closing the connection then
    // resets it, as an engine killed between the connect and its reply
    // does. This kind alone is retried (with an engine started again) for
    // `node: "auto"`.
    let e = attach_against(&dir.path().join("a.sock"), |conn| {
        sock::poll(&[(&conn, true)], Some(Duration::from_secs(30))).unwrap();
        drop(conn);
    });
    assert_eq!(
        e.node_failure(),
        Some(ringfeed::NodeFailure::NoReply),
        "{e:?}"
    );
    // Control: an engine that reads the hello and closes is gone, not
    // retried.
    let e = attach_against(&dir.path().join("b.sock"), |conn| {
        let mut buf = Vec::new();
        sock::recv(&conn, &mut buf).unwrap();
        drop(conn);
    });
    assert_eq!(e.node_failure(), Some(ringfeed::NodeFailure::Gone), "{e:?}");
    assert!(
        e.to_string().contains("closed the connection at attach"),
        "{e}"
    );
}
