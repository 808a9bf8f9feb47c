//! Redirects on the ring. A range's request goes along its [`Route`]
//! (`crate::net::hop`): to the object's remembered target when it has
//! one, else to the object, and on each redirect answered to the next
//! hop, on a connection of that host (the redirect's own goes back to
//! the idle pool when its answer was read whole). The target its chain
//! ends at is remembered on the object (`head.rs`), so a shard's later
//! ranges pay no redirect.
//!
//! A shard's first ranges start together, before any of them knows the
//! target. For an object known to redirect (the Hub's `resolve/` URLs,
//! or one that redirected before) one range finds it (the resolver) and
//! the others are parked, with nothing on the ring, until it knows
//! (its answer taken, or it failed or went); they then start from the
//! next completion round, on a zero timer, towards the target remembered
//! by then. So a shard read in any number of ranges costs one redirect
//! per network thread. An object not known to redirect is never parked:
//! its first ranges go at once, and each follows a redirect of its own
//! if one comes.

use std::sync::Arc;

use io_uring::{IoUring, opcode, types};

use super::{HttpDriver, PoolKey, Step, push, user_data};
use crate::fetch::Completion;
use crate::fetch::uring_tls::MAX_RECORD;
use crate::net::hop::Route;
use crate::net::http::{MAX_HEAD, ResponseHead};
use crate::net::object::HttpObject;

/// The key of an object in `HttpDriver::resolving`: its address, stable
/// while a range holds it.
fn object_key(obj: &HttpObject) -> usize {
    obj as *const HttpObject as usize
}

impl HttpDriver {
    /// Sends the request of `slot`, or parks it behind the range finding
    /// its object's target.
    pub(super) fn go(&mut self, ring: &mut IoUring, slot: usize) -> Option<Completion> {
        let op = self.slots[slot].as_deref_mut().expect("live slot");
        if op.route.at_object() && op.obj.expects_redirect() && !op.resolver {
            match self.resolving.get_mut(&object_key(&op.obj)) {
                Some(parked) => {
                    parked.push(slot);
                    op.step = Step::Parked;
                    return None;
                }
                None => {
                    self.resolving.insert(object_key(&op.obj), Vec::new());
                    op.resolver = true;
                }
            }
        }
        self.begin(ring, slot)
    }

    /// The answer `h` of `slot` redirected (or its remembered target
    /// expired): its route was advanced; the request goes again, to the
    /// route's next object. `key` is the pool of the connection answered
    /// on.
    pub(super) fn hop(
        &mut self,
        ring: &mut IoUring,
        slot: usize,
        h: &ResponseHead,
        key: PoolKey,
    ) -> Option<Completion> {
        // A raced range: the first head carries the range on.
        self.head_arrived(ring, slot);
        let op = self.slots[slot].as_deref_mut().expect("live slot");
        let body_in = op.head_got - h.head_len;
        if let Some(mut c) = op.conn.take()
            && h.keep_alive
            && h.content_length == Some(body_in as u64)
            && c.reusable()
        {
            if let Some(k) = c.kernel.as_mut() {
                k.used(op.head_got as u64);
            }
            self.idle.entry(key).or_default().push(c);
        }
        let op = self.slots[slot].as_deref_mut().expect("live slot");
        op.at = op.route.target(&op.obj);
        fit_head(&mut op.head, &op.at);
        if op.route.at_object() {
            return self.go(ring, slot);
        }
        self.begin(ring, slot)
    }

    /// `slot`'s object knows its target now (or its resolver failed or
    /// went): the ranges parked behind it are started.
    pub(super) fn resolved(&mut self, slot: usize) {
        let op = self.slots[slot].as_deref_mut().expect("live slot");
        if std::mem::take(&mut op.resolver) {
            let obj = Arc::clone(&op.obj);
            self.unpark(&obj);
        }
    }

    /// The ranges parked behind `obj`'s resolver are to start.
    pub(super) fn unpark(&mut self, obj: &HttpObject) {
        if let Some(parked) = self.resolving.remove(&object_key(obj)) {
            self.woken.extend(parked);
        }
    }

    /// Starts the ranges woken, each towards its object's target as
    /// remembered now, from the next completion round (a zero timer), so
    /// that a request that fails at once fails in `complete`.
    pub(super) fn start_woken(&mut self, ring: &mut IoUring) {
        for slot in std::mem::take(&mut self.woken) {
            let Some(op) = self.slots[slot].as_deref_mut() else {
                continue;
            };
            if op.step != Step::Parked {
                continue;
            }
            op.route = Route::new(&op.obj);
            op.at = op.route.target(&op.obj);
            fit_head(&mut op.head, &op.at);
            op.step = Step::Backoff;
            op.backoff = types::Timespec::new();
            let e = opcode::Timeout::new(&op.backoff)
                .build()
                .user_data(user_data(slot, op.generation, Step::Backoff));
            if push(ring, &e).is_err() {
                // The ring refused it: parked still, tried again at the
                // next completion.
                op.step = Step::Parked;
                self.woken.push(slot);
            }
        }
    }
}

/// Makes `head` large enough for an answer from `at`: an https answer's
/// head is opened a whole record at a time.
fn fit_head(head: &mut Vec<u8>, at: &HttpObject) {
    let want = MAX_HEAD + if at.tls { MAX_RECORD } else { 0 };
    if head.len() < want {
        head.resize(want, 0);
    }
}
