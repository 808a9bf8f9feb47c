//! Hedging on the ring: the driver's timer that finds late ranges, the
//! twin request of a range whose head is late and the race between the
//! two, and the hand-over of a stalled body to a fresh connection. The
//! waits and the budget are the pure `crate::net::tail`.
//!
//! The rules that keep the destination safe: a twin is made only for a
//! range still waiting for its head, and the first head to arrive cancels
//! the other request before its own body bytes are written (the loser's
//! receives go to its own head buffer); a cancelled op stays in its slot,
//! its buffers its own, until its step's completion arrives. A stalled
//! body's receive is cancelled and its completion awaited (the bytes it
//! did receive kept) before the rest is asked for again.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, types};

use super::{HttpDriver, Op, SLOT_BITS, Step, push, user_data};
use crate::fetch::Completion;
use crate::net::retry::authority;
use crate::net::tail::{HEAD_FLOOR, Tail};

/// The slot a hedge timer's `user_data` names: no op's.
const TICK_SLOT: usize = (1 << SLOT_BITS) - 1;

/// What the timer decided for one op.
enum Late {
    Head,
    Body,
}

impl HttpDriver {
    /// Whether `op`'s late head may be raced by a twin: once a range.
    fn may_race(&self, op: &Op) -> bool {
        self.net.retry.hedge && !op.hedged && !op.is_hedge && op.twin.is_none()
    }

    /// Whether `op`'s late body may be handed to a fresh connection: once
    /// a range, a race's winner too.
    fn may_hand_over(&self, op: &Op) -> bool {
        self.net.retry.hedge && !op.handed && op.twin.is_none()
    }

    fn tail_mut(&mut self, url: &str) -> &mut Tail {
        let host = authority(url);
        if !self.tails.contains_key(host) {
            self.tails.insert(host.to_string(), Tail::default());
        }
        self.tails.get_mut(host).expect("inserted above")
    }

    /// The request of `slot` went out: the timer looks at it once its
    /// host's head wait has passed.
    pub(super) fn watch_head(&mut self, ring: &mut IoUring, slot: usize) {
        let op = self.slots[slot].as_deref().expect("live slot");
        if !self.may_race(op) {
            return;
        }
        let wait = self
            .tails
            .get(authority(&op.at.url))
            .map_or(crate::net::tail::COLD_HEAD, Tail::head_wait);
        self.arm_tick(ring, wait);
    }

    /// The body of `slot` began: likewise, after its body wait.
    pub(super) fn watch_body(&mut self, ring: &mut IoUring, slot: usize) {
        let op = self.slots[slot].as_deref().expect("live slot");
        if !self.may_hand_over(op) {
            return;
        }
        let rest = op.len - op.got;
        let wait = self
            .tails
            .get(authority(&op.at.url))
            .map_or(crate::net::tail::COLD_BODY, |t| t.body_wait(rest));
        self.arm_tick(ring, wait);
    }

    /// Arms a hedge timer `d` from now, unless one fires by then.
    fn arm_tick(&mut self, ring: &mut IoUring, d: Duration) {
        let due = Instant::now() + d;
        if self.ticks.iter().any(|(_, at, _)| *at <= due) {
            return;
        }
        self.tick_id = self.tick_id.wrapping_add(1) & ((1 << 31) - 1);
        let ts = Box::new(types::Timespec::from(d));
        let e = opcode::Timeout::new(&*ts).build().user_data(user_data(
            TICK_SLOT,
            self.tick_id,
            Step::Tick,
        ));
        // A timer that cannot be queued leaves the ranges to their stall
        // time-outs; the next request arms another.
        if push(ring, &e).is_ok() {
            self.ticks.push((self.tick_id, due, ts));
        }
    }

    /// A hedge timer fired: every range past its wait is hedged (while
    /// the budget lasts), and the timer is armed for the next one due.
    pub(super) fn tick(&mut self, ring: &mut IoUring, id: u32) {
        self.ticks.retain(|(i, _, _)| *i != id);
        if !self.net.retry.hedge {
            return;
        }
        let now = Instant::now();
        let mut next: Option<Duration> = None;
        let mut late = Vec::new();
        for (slot, op) in self.slots.iter().enumerate() {
            let Some(op) = op.as_deref() else { continue };
            if op.cancelled || op.replacing || op.paced {
                continue;
            }
            let tail = self.tails.get(authority(&op.at.url));
            let (kind, wait, since) = match (op.step, op.asked, op.body_at) {
                (Step::Body, _, Some((at, _))) if self.may_hand_over(op) => (
                    Late::Body,
                    tail.map_or(crate::net::tail::COLD_BODY, |t| {
                        t.body_wait(op.len - op.got)
                    }),
                    at,
                ),
                (
                    Step::Connect | Step::TlsSend | Step::TlsRecv | Step::Send | Step::Head,
                    Some(at),
                    None,
                ) if self.may_race(op) => (
                    Late::Head,
                    tail.map_or(crate::net::tail::COLD_HEAD, Tail::head_wait),
                    at,
                ),
                _ => continue,
            };
            let waited = now.saturating_duration_since(since);
            if waited < wait {
                next = Some(next.map_or(wait - waited, |n| n.min(wait - waited)));
                continue;
            }
            if !self.budget.take(now) {
                // Requests earn hedges as they go: look again soon.
                next = Some(next.map_or(HEAD_FLOOR, |n| n.min(HEAD_FLOOR)));
                continue;
            }
            late.push((slot, kind));
        }
        for (slot, kind) in late {
            match kind {
                Late::Head => self.hedge_head(ring, slot),
                Late::Body => self.replace(ring, slot),
            }
        }
        if let Some(d) = next {
            self.arm_tick(ring, d);
        }
    }

    /// `slot` is still waiting for its head: its twin asks for the same
    /// bytes on a fresh connection.
    fn hedge_head(&mut self, ring: &mut IoUring, slot: usize) {
        let t = self.alloc_slot();
        let generation = self.generations[t];
        let p = self.slots[slot].as_deref_mut().expect("live slot");
        p.hedged = true;
        p.twin = Some((t, generation));
        // SAFETY: sockaddr_storage is plain data; zeroed is valid.
        let addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let twin = Box::new(Op {
            req_id: p.req_id,
            obj: p.obj.clone(),
            at: p.at.clone(),
            route: p.route.clone(),
            resolver: false,
            start: p.start,
            buf: p.buf,
            len: p.len,
            got: p.got,
            open_end: p.open_end,
            total: p.total,
            pin: p.pin.clone(),
            copied: p.copied,
            tries: p.tries,
            first_failure: p.first_failure,
            first_byte: None,
            sent_at: 0.0,
            paced: false,
            step: Step::Backoff,
            conn: None,
            addr,
            addr_len: 0,
            request: Vec::new(),
            sent: 0,
            head: vec![0; p.head.len()],
            head_got: 0,
            keep_alive: false,
            pend: 0,
            small: false,
            backoff: types::Timespec::new(),
            generation,
            asked: None,
            body_at: None,
            twin: Some((slot, p.generation)),
            is_hedge: true,
            hedged: true,
            handed: p.handed,
            fresh: true,
            cancelled: false,
            replacing: false,
        });
        self.slots[t] = Some(twin);
        self.net.stats.hedges_sent.fetch_add(1, Ordering::Relaxed);
        // Started from the next completion round, on a zero timer: a
        // request that fails at once fails in `complete`, where its
        // twin's survival is decided.
        let op = self.slots[t].as_deref_mut().expect("just made");
        let e = opcode::Timeout::new(&op.backoff)
            .build()
            .user_data(user_data(t, generation, Step::Backoff));
        if push(ring, &e).is_err() {
            self.unlink(t);
            drop(self.free_slot(t));
        }
    }

    /// `slot`'s body has not arrived long past its peers: its receive is
    /// cancelled, and the rest goes to a fresh connection once that
    /// receive's completion says what did arrive (`replace_body`).
    fn replace(&mut self, ring: &mut IoUring, slot: usize) {
        let op = self.slots[slot].as_deref_mut().expect("live slot");
        op.handed = true;
        op.replacing = true;
        let target = user_data(slot, op.generation, Step::Body);
        let e = opcode::AsyncCancel::new(target)
            .build()
            .user_data(user_data(slot, op.generation, Step::Cancel));
        // Not queued: the receive ends at its stall time-out instead,
        // and is handed over then.
        let _ = push(ring, &e);
    }

    /// The cancelled body receive of `slot` completed with `res`.
    pub(super) fn replace_body(
        &mut self,
        ring: &mut IoUring,
        slot: usize,
        res: i32,
    ) -> Option<Completion> {
        let op = self.slots[slot].as_deref_mut().expect("live slot");
        op.replacing = false;
        // Plain bytes received are in place; a TLS connection's partial
        // record is not, and its records are asked for again.
        if res > 0 && op.conn.as_ref().is_some_and(|c| c.tls.is_none()) {
            op.got += res as usize;
        }
        if op.got == op.len {
            return self.finish(slot);
        }
        op.conn = None;
        op.fresh = true;
        op.is_hedge = true;
        self.net.stats.hedges_sent.fetch_add(1, Ordering::Relaxed);
        self.begin(ring, slot)
    }

    /// `slot`'s head arrived and was taken: if its range was raced, the
    /// other request is cancelled; `slot` carries the range on.
    pub(super) fn head_arrived(&mut self, ring: &mut IoUring, slot: usize) {
        let op = self.slots[slot].as_deref_mut().expect("live slot");
        if let Some(asked) = op.asked {
            let url = op.at.url.clone();
            self.tail_mut(&url).head.push(asked.elapsed().as_secs_f64());
        }
        let op = self.slots[slot].as_deref_mut().expect("live slot");
        let Some((other, generation)) = op.twin.take() else {
            return;
        };
        let mut resolver = false;
        match self.slots.get_mut(other).and_then(|o| o.as_deref_mut()) {
            Some(o) if o.generation == generation && !o.cancelled => {
                o.cancelled = true;
                o.twin = None;
                // The winner finds the object's target for the ranges
                // parked behind the loser.
                resolver = std::mem::take(&mut o.resolver);
                let target = user_data(other, o.generation, o.step);
                let e = opcode::AsyncCancel::new(target)
                    .build()
                    .user_data(user_data(other, o.generation, Step::Cancel));
                // Not queued: the loser's step ends at its stall time-out
                // at the latest, and the op goes then.
                let _ = push(ring, &e);
            }
            _ => {}
        }
        if resolver {
            self.slots[slot].as_deref_mut().expect("live slot").resolver = true;
        }
    }

    /// `slot` failed: if its twin is alive, `slot` goes (its step is over:
    /// a failure is decided on a completion) and the twin carries the
    /// range alone. Whether it did.
    pub(super) fn twin_carries_on(&mut self, slot: usize) -> bool {
        let op = self.slots[slot].as_deref().expect("live slot");
        let Some((other, generation)) = op.twin else {
            return false;
        };
        let alive = self
            .slots
            .get(other)
            .and_then(|o| o.as_deref())
            .is_some_and(|o| o.generation == generation && !o.cancelled);
        if !alive {
            return false;
        }
        self.unlink(slot);
        // The twin finds the object's target for the parked ranges now.
        let op = self.slots[slot].as_deref_mut().expect("live slot");
        if std::mem::take(&mut op.resolver) {
            self.slots[other].as_deref_mut().expect("alive").resolver = true;
        }
        drop(self.free_slot(slot));
        true
    }

    /// Clears the twin links of `slot` and of its twin.
    fn unlink(&mut self, slot: usize) {
        let op = self.slots[slot].as_deref_mut().expect("live slot");
        if let Some((other, generation)) = op.twin.take()
            && let Some(o) = self.slots.get_mut(other).and_then(|o| o.as_deref_mut())
            && o.generation == generation
        {
            o.twin = None;
        }
    }

    /// `op` finished its range: its body time joins its host's, and a
    /// hedge that finished a range counts as won.
    pub(super) fn body_done(&mut self, op: &Op) {
        if op.is_hedge {
            self.net.stats.hedges_won.fetch_add(1, Ordering::Relaxed);
        }
        if let Some((at, from)) = op.body_at
            && op.len > from
        {
            let per_byte = at.elapsed().as_secs_f64() / (op.len - from) as f64;
            self.tail_mut(&op.at.url).body.push(per_byte);
        }
    }
}
