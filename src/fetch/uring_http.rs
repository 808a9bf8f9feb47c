//! Ranged HTTP GETs driven by a worker's io_uring: connect, send the request,
//! receive the response head into a small buffer, then receive the body
//! straight into the destination chunk. Every receive carries a linked
//! time-out (the stall time-out); a failed range is retried from the first
//! byte not yet received, after a backoff that is itself an io_uring timer,
//! so one slow range never blocks the others in flight.
//!
//! https runs on the same steps: a connection carries its transport, plain
//! or TLS ([`TlsConn`], `uring_tls.rs`); a fresh TLS connection goes through
//! the handshake steps before the request, and its records are opened where
//! io_uring received them (the body's in the destination chunk).
//!
//! A range far behind its peers is hedged (`hedge.rs`): one still waiting
//! for its head past its host's recent p95 first byte gets a twin request
//! on a fresh connection, the first head to arrive wins and receives the
//! body, the other is cancelled; a body that has not arrived long past its
//! peers' p99 rate is cancelled (its bytes received kept) and the rest
//! re-requested on a fresh connection. A cancelled op keeps its buffers
//! until its step's completion arrives, and never writes into the
//! destination: only the winner of a head race reaches its body.
//!
//! The parts, one a step of the machine: this file holds the slab and the
//! routing of completions to the steps; `io.rs` the send and receive steps
//! on the ring, each with its linked stall time-out, and the request's
//! send; `connect.rs` a fresh connection's socket and connect, and the
//! quick ACKs each request asks for; `head.rs` the response head's step;
//! `body.rs` the body's receives and the range's end; `redirect.rs` the redirects followed, and the
//! ranges that wait for one of their object's to find its target;
//! `tls.rs` the handshake and the records of https; `failure.rs` retries
//! and failures; `hedge.rs` the hedges.
//!
//! Each range in flight is an [`Op`] in a slab. Completions are routed by
//! `user_data` = `TAG | generation | slot | step`; a completion whose
//! generation does not match the slot (a linked time-out arriving after its
//! range finished) is ignored. An op's buffers are its own until the
//! completion of its current step arrives; only then does it move on or free.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use io_uring::{IoUring, squeue, types};

use super::ktls::KernelSession;
use super::uring_tls::{self, TlsConn};
use super::{Completion, NetOptions, ReadRequest};
use crate::net::hop::Route;
use crate::net::http::{self, FailKind, HttpFail};
use crate::net::object::HttpObject;
use crate::net::rate::Admit;
use crate::net::retry::{Jitter, Tries};
use crate::net::tail::{HedgeBudget, Tail};
use crate::net::version::VersionPin;

mod body;
mod connect;
mod failure;
mod head;
mod hedge;
mod io;
mod redirect;
mod tls;

/// Marks a `user_data` as belonging to the HTTP path (file reads use the
/// worker's read ids, which are small).
pub const TAG: u64 = 1 << 63;
const STEP_BITS: u32 = 8;
const SLOT_BITS: u32 = 24;

/// How many bytes of the response head are received per `recv`. Body bytes
/// that arrive in it are copied; 4 KiB holds an S3 head and bounds the copy
/// to 0.05 % of an 8 MiB range.
const HEAD_RECV: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Step {
    Connect = 1,
    Send = 2,
    Head = 3,
    Body = 4,
    Backoff = 5,
    /// The linked time-out of a step; only its `-ETIME` matters, and that
    /// shows as `-ECANCELED` on the step itself.
    Timer = 6,
    /// Sending TLS handshake records.
    TlsSend = 7,
    /// Receiving TLS handshake records.
    TlsRecv = 8,
    /// The driver's hedge timer (`hedge.rs`), on no slot.
    Tick = 9,
    /// The cancel of a hedged range's other request; only the cancelled
    /// step's own completion matters.
    Cancel = 10,
    /// Waiting, with nothing on the ring, for another range of its object
    /// to find where the object's redirect leads (`redirect.rs`).
    Parked = 11,
}

struct Conn {
    fd: OwnedFd,
    /// Came from the idle pool: a failure before any response byte is a
    /// stale keep-alive, retried at once on a fresh connection.
    reused: bool,
    /// The TLS session of an https connection whose records are opened
    /// here; it stays with the socket in the idle pool.
    tls: Option<Box<TlsConn>>,
    /// An https session the kernel's TLS took over (`ktls.rs`): the steps
    /// are plain HTTP's, but for the records that are not data.
    kernel: Option<Box<KernelSession>>,
}

impl Conn {
    /// Whether the connection may serve another range once its answer
    /// was read whole: a TLS session with nothing left over and keys with
    /// life in them (`finish`, and a redirect's hop).
    fn reusable(&self) -> bool {
        self.tls
            .as_ref()
            .is_none_or(|t| t.pending() == 0 && !t.worn())
            && self.kernel.as_ref().is_none_or(|k| !k.worn())
    }
}

/// Idle connections are kept per host, port and transport.
type PoolKey = (String, u16, bool);

/// The idle pool's key of `obj`'s connections.
fn pool_key(obj: &HttpObject) -> PoolKey {
    (obj.host.clone(), obj.port, obj.tls)
}

/// One range in flight.
struct Op {
    req_id: u64,
    /// The object read, as the reader named it: what messages name.
    obj: Arc<HttpObject>,
    /// Where the request goes (`route`'s object): `obj`, or the target a
    /// redirect led to. Connections, pacing and tails are this host's.
    at: Arc<HttpObject>,
    route: Route,
    /// This range is the one finding where `obj` redirects to: ranges of
    /// the object parked behind it start once it knows (`redirect.rs`).
    resolver: bool,
    start: u64,
    buf: *mut u8,
    len: usize,
    /// Bytes of the body already in `buf`.
    got: usize,
    /// The object's size is not known yet (`ReadRequest::open_end`): `len`
    /// shrinks to the object's end when the response says it comes first.
    open_end: bool,
    /// The object's size, once a response said it.
    total: Option<u64>,
    /// The version the read is pinned to (`ReadRequest::pin`).
    pin: Option<Arc<VersionPin>>,
    copied: usize,
    /// The failures so far, and when the first came (the deadline's start).
    tries: Tries,
    first_failure: Option<Instant>,
    /// The first answer's first-byte latency (`Completion::first_byte`).
    first_byte: Option<std::time::Duration>,
    /// When the current attempt was sent, on the host's pacer's clock.
    sent_at: f64,
    /// The backoff timer running is the wait for the host's rate: the
    /// attempt has its token and goes when it fires.
    paced: bool,
    step: Step,
    conn: Option<Conn>,
    addr: libc::sockaddr_storage,
    addr_len: libc::socklen_t,
    request: Vec<u8>,
    sent: usize,
    head: Vec<u8>,
    head_got: usize,
    /// The current response allows reusing the connection.
    keep_alive: bool,
    /// https: bytes of a partial record received at `buf[got..got + pend]`.
    pend: usize,
    /// https: the receive in flight goes to the connection's small buffer.
    small: bool,
    backoff: types::Timespec,
    generation: u32,
    /// When the current attempt's request went out (after its host's
    /// rate), and when its body began with how much of it was in then:
    /// what a late range is told by (`hedge.rs`).
    asked: Option<Instant>,
    body_at: Option<(Instant, usize)>,
    /// The other request of a range whose head is being raced (its slot
    /// and generation), until one head arrives.
    twin: Option<(usize, u32)>,
    /// This op is a hedge: a twin, or a range whose stalled body was
    /// handed to a fresh connection.
    is_hedge: bool,
    /// The range's head was raced once (as the original or as the twin):
    /// never again.
    hedged: bool,
    /// The range's stalled body was handed to a fresh connection once:
    /// never again. Apart from `hedged`, so a range that won a head race
    /// and then stalls in its body is still handed over, not left to the
    /// stall time-out.
    handed: bool,
    /// The next request goes on a new connection, not an idle one.
    fresh: bool,
    /// Lost its race: its step is being cancelled, and the op goes when
    /// that step's completion arrives.
    cancelled: bool,
    /// Its body's receive is being cancelled to hand the rest to a fresh
    /// connection.
    replacing: bool,
}

impl Op {
    /// The TLS session of an https op's connection.
    fn tls_mut(&mut self) -> &mut TlsConn {
        self.conn
            .as_mut()
            .and_then(|c| c.tls.as_deref_mut())
            .expect("an https connection")
    }
}

/// The HTTP side of a `UringReader`.
pub struct HttpDriver {
    slots: Vec<Option<Box<Op>>>,
    free: Vec<usize>,
    generations: Vec<u32>,
    idle: HashMap<PoolKey, Vec<Conn>>,
    net: NetOptions,
    jitter: Jitter,
    /// The stall time-out; boxed so its address is stable for the kernel.
    stall: Box<types::Timespec>,
    /// Recent first-byte latencies and body times, per host (authority).
    tails: HashMap<String, Tail>,
    /// What hedges may still be sent.
    budget: HedgeBudget,
    /// Hedge timers armed: id, when due, and their time (boxed, stable
    /// until the timer's completion).
    ticks: Vec<(u32, Instant, Box<types::Timespec>)>,
    tick_id: u32,
    /// Objects a range is finding the redirect target of (by address),
    /// with the ranges parked behind it (`redirect.rs`).
    resolving: HashMap<usize, Vec<usize>>,
    /// Parked ranges to start: their resolver is done.
    woken: Vec<usize>,
}

fn user_data(slot: usize, generation: u32, step: Step) -> u64 {
    TAG | (u64::from(generation) << (SLOT_BITS + STEP_BITS))
        | ((slot as u64) << STEP_BITS)
        | step as u64
}

fn decode(ud: u64) -> (usize, u32, u8) {
    let step = (ud & ((1 << STEP_BITS) - 1)) as u8;
    let slot = ((ud >> STEP_BITS) & ((1 << SLOT_BITS) - 1)) as usize;
    let generation = ((ud & !TAG) >> (SLOT_BITS + STEP_BITS)) as u32;
    (slot, generation, step)
}

/// A receive or send that failed with `res` (a negated errno; ECANCELED:
/// its linked stall time-out fired), for `what`.
fn io_fail(res: i32, what: &str) -> HttpFail {
    if res == -libc::ECANCELED {
        HttpFail::new(
            FailKind::Stalled,
            format!("{what}: nothing for the stall time-out"),
        )
    } else {
        let e = std::io::Error::from_raw_os_error(-res);
        HttpFail::new(FailKind::of_io(&e), format!("{what}: {e}"))
    }
}

/// Pushes `e`, submitting first when the queue is full.
fn push(ring: &mut IoUring, e: &squeue::Entry) -> Result<(), HttpFail> {
    loop {
        // SAFETY: every pointer in `e` refers to memory owned by an `Op` (or
        // the driver) that stays put until the entry's completion arrives.
        if unsafe { ring.submission().push(e) }.is_ok() {
            return Ok(());
        }
        ring.submit()
            .map_err(|e| HttpFail::new(FailKind::Reset, format!("io_uring submit: {e}")))?;
    }
}

impl HttpDriver {
    pub fn new(net: NetOptions, seed: u64) -> HttpDriver {
        let stall = Box::new(types::Timespec::from(net.stall));
        HttpDriver {
            slots: Vec::new(),
            free: Vec::new(),
            generations: Vec::new(),
            idle: HashMap::new(),
            net,
            jitter: Jitter::new(seed),
            stall,
            tails: HashMap::new(),
            budget: HedgeBudget::default(),
            ticks: Vec::new(),
            tick_id: 0,
            resolving: HashMap::new(),
            woken: Vec::new(),
        }
    }

    /// A free slot, with its generation advanced.
    fn alloc_slot(&mut self) -> usize {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.generations.push(0);
            self.slots.len() - 1
        });
        self.generations[slot] = self.generations[slot].wrapping_add(1) & ((1 << 31) - 1);
        slot
    }

    /// Starts a ranged read.
    pub fn start(
        &mut self,
        ring: &mut IoUring,
        req: &ReadRequest,
        obj: Arc<HttpObject>,
    ) -> Option<Completion> {
        let c = self.start_op(ring, req, obj);
        self.start_woken(ring);
        c
    }

    fn start_op(
        &mut self,
        ring: &mut IoUring,
        req: &ReadRequest,
        obj: Arc<HttpObject>,
    ) -> Option<Completion> {
        let route = Route::new(&obj);
        let at = route.target(&obj);
        // The head buffer's size is the transport's: a redirect to another
        // scheme makes a new one (`redirect.rs`).
        let obj_tls = at.tls;
        let slot = self.alloc_slot();
        // SAFETY: sockaddr_storage is plain data; zeroed is valid.
        let addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let op = Box::new(Op {
            req_id: req.id,
            obj,
            at,
            route,
            resolver: false,
            start: req.offset,
            buf: req.buf,
            len: req.len,
            got: 0,
            open_end: req.open_end,
            total: None,
            pin: req.pin.clone(),
            copied: 0,
            tries: Tries::default(),
            first_failure: None,
            first_byte: None,
            sent_at: 0.0,
            paced: false,
            step: Step::Connect,
            conn: None,
            addr,
            addr_len: 0,
            request: Vec::new(),
            sent: 0,
            // https opens a whole record into the head buffer at a time.
            head: vec![0; http::MAX_HEAD + if obj_tls { uring_tls::MAX_RECORD } else { 0 }],
            head_got: 0,
            keep_alive: false,
            pend: 0,
            small: false,
            backoff: types::Timespec::new(),
            generation: self.generations[slot],
            asked: None,
            body_at: None,
            twin: None,
            is_hedge: false,
            hedged: false,
            handed: false,
            fresh: false,
            cancelled: false,
            replacing: false,
        });
        self.slots[slot] = Some(op);
        self.go(ring, slot)
    }

    /// (Re)starts the request of `slot` for the bytes not yet received,
    /// once the host's rate admits it.
    fn begin(&mut self, ring: &mut IoUring, slot: usize) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        if !op.paced {
            match self.net.pace.admit(&op.at.url) {
                (sent, Admit::Go(wait)) => {
                    op.sent_at = sent;
                    if !wait.is_zero() {
                        op.paced = true;
                        return self.sleep_then_begin(ring, slot, wait);
                    }
                }
                (_, Admit::Later(wait)) => return self.sleep_then_begin(ring, slot, wait),
            }
        }
        op.paced = false;
        op.head_got = 0;
        op.sent = 0;
        op.pend = 0;
        op.small = false;
        op.asked = Some(Instant::now());
        op.body_at = None;
        self.net.stats.requests.fetch_add(1, Ordering::Relaxed);
        if !op.is_hedge {
            self.budget.earn();
        }
        self.watch_head(ring, slot);
        let op = self.slots[slot].as_mut().expect("live slot");
        let if_match = op.route.if_match(&op.obj, op.pin.as_deref());
        let (at, rest) = (op.start + op.got as u64, (op.len - op.got) as u64);
        match op.at.range_request(at, rest, if_match) {
            Ok(r) => op.request = r,
            Err(f) => return self.fail(ring, slot, f),
        }
        let key = pool_key(&op.at);
        // A hedge goes on a connection of its own: an idle one may be the
        // slow one's peer on the same overloaded path, and a stale one
        // would cost it a round trip.
        if !std::mem::take(&mut op.fresh)
            && let Some(mut c) = self.idle.get_mut(&key).and_then(Vec::pop)
        {
            c.reused = true;
            op.conn = Some(c);
            return self.ready(ring, slot);
        }
        self.connect(ring, slot)
    }

    /// The connection is up: an https one shakes hands first (when fresh)
    /// and sends its request sealed.
    fn ready(&mut self, ring: &mut IoUring, slot: usize) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        let Some(tls) = op.conn.as_mut().and_then(|c| c.tls.as_mut()) else {
            return self.send(ring, slot);
        };
        if !tls.is_open() {
            return self.handshake(ring, slot);
        }
        match tls.seal(&op.request) {
            Ok(sealed) => op.request = sealed,
            Err(f) => return self.fail(ring, slot, f),
        }
        self.send(ring, slot)
    }

    /// Routes one completion; may finish a range.
    pub fn complete(&mut self, ring: &mut IoUring, ud: u64, res: i32) -> Option<Completion> {
        let c = self.complete_step(ring, ud, res);
        self.start_woken(ring);
        c
    }

    fn complete_step(&mut self, ring: &mut IoUring, ud: u64, res: i32) -> Option<Completion> {
        let (slot, generation, step) = decode(ud);
        if step == Step::Timer as u8 || step == Step::Cancel as u8 {
            return None;
        }
        if step == Step::Tick as u8 {
            self.tick(ring, generation);
            return None;
        }
        match self.slots.get(slot) {
            Some(Some(op)) if op.generation == generation && op.step as u8 == step => {}
            _ => return None,
        }
        let op = self.slots[slot].as_mut().expect("checked above");
        if op.cancelled {
            // The loser of a race: its step is over, its buffers are free.
            drop(self.free_slot(slot));
            return None;
        }
        if op.replacing && op.step == Step::Body {
            return self.replace_body(ring, slot, res);
        }
        if res == -libc::EIO
            && matches!(op.step, Step::Head | Step::Body)
            && op.conn.as_ref().is_some_and(|c| c.kernel.is_some())
        {
            return self.kernel_record(ring, slot, ud);
        }
        match op.step {
            Step::Backoff => self.begin(ring, slot),
            Step::Connect => self.on_connected(ring, slot, res),
            Step::TlsSend => self.on_tls_sent(ring, slot, res),
            Step::TlsRecv => self.on_tls_received(ring, slot, res),
            Step::Send => self.on_sent(ring, slot, res),
            Step::Head => self.on_head(ring, slot, res),
            Step::Body => self.on_body(ring, slot, res),
            Step::Timer | Step::Tick | Step::Cancel | Step::Parked => None,
        }
    }

    fn free_slot(&mut self, slot: usize) -> Box<Op> {
        let op = self.slots[slot].take().expect("live slot");
        self.free.push(slot);
        if op.resolver {
            self.unpark(&op.obj);
        }
        op
    }

    /// Ranges in flight (and the losers of races, until their cancels
    /// complete).
    pub fn in_flight(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }
}

impl Drop for HttpDriver {
    fn drop(&mut self) {
        // An op still here has a step on a ring that may outlive the
        // driver (a network thread's ring is torn down after it): its
        // buffers are left to that step rather than freed under it.
        for mut op in self.slots.drain(..).flatten() {
            // A parked range has nothing on the ring.
            if op.step == Step::Parked {
                drop(op);
                continue;
            }
            // A plain socket may close (the ring holds its own reference
            // to the file); a TLS one's buffers go with the op.
            if op.conn.as_ref().is_some_and(|c| c.tls.is_none()) {
                op.conn = None;
            }
            std::mem::forget(op);
        }
        // The hedge timers' timespecs are freed: the kernel copies a
        // timeout's timespec when it takes the entry (`io_timeout_prep`),
        // and no entry is taken after the driver is gone (no SQPOLL; a
        // network thread's ring is not submitted after its driver drops,
        // a worker's ring drops before its driver).
        self.ticks.clear();
    }
}
