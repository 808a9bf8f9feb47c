//! The body of every answer: bytes already in memory (a slice of the
//! file's mapping, so serving is the kernel's copy from the page cache to
//! the socket and nothing per byte here), handed to hyper in frames paced
//! by the connection's and the object's token buckets, with a stall
//! partway when one is due. It holds the transfer's place in the
//! in-flight count until it is sent or dropped (a client gone mid-body).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, SizeHint};

use super::State;
use super::model::TokenBucket;

/// A paced frame: 64 KiB is 0.7 ms at 90 MB/s, so a connection's sends are
/// spread over its time slots finely enough that many connections
/// interleave, and few enough (14,000 a second at 1 GB/s) to cost little.
const PACED_FRAME: usize = 64 << 10;
/// Unpaced, the frames are large: hyper writes a frame from the mapping
/// without copying it, so their size only bounds what one poll hands over.
const UNPACED_FRAME: usize = 4 << 20;

/// Counts a transfer in flight from its creation to its drop.
pub struct Transfer(Arc<State>);

impl Transfer {
    pub fn begin(state: &Arc<State>) -> Transfer {
        state.counters.begin(state.now_ns());
        Transfer(state.clone())
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        self.0.counters.end(self.0.now_ns());
    }
}

/// The buckets a body's bytes are paced by (none: as fast as the socket).
#[derive(Clone, Default)]
pub struct Pace {
    pub connection: Option<Arc<Mutex<TokenBucket>>>,
    pub object: Option<Arc<Mutex<TokenBucket>>>,
}

impl Pace {
    fn is_paced(&self) -> bool {
        self.connection.is_some() || self.object.is_some()
    }

    /// Reserves `n` bytes in both buckets: the wait is the longer debt.
    fn reserve(&self, n: usize, now_ns: u64) -> Duration {
        [&self.connection, &self.object]
            .into_iter()
            .flatten()
            .map(|b| b.lock().unwrap().reserve(n as f64, now_ns))
            .max()
            .unwrap_or(Duration::ZERO)
    }
}

/// A stall: once no more than `at_remaining` bytes are left to send, the
/// body stops for `pause`.
pub struct Stall {
    pub at_remaining: usize,
    pub pause: Duration,
}

pub struct Reply {
    data: Bytes,
    pace: Pace,
    stall: Option<Stall>,
    /// A wait under way, and whether a frame goes out when it ends (a
    /// pacing wait) or not (a stall).
    sleep: Option<(Pin<Box<tokio::time::Sleep>>, bool)>,
    /// Counted in `bytes`: the object bodies, not error documents.
    counted: bool,
    state: Option<Arc<State>>,
    _transfer: Option<Transfer>,
}

impl Reply {
    /// A small body (an error, a listing, the stats), not counted.
    pub fn text(text: impl Into<Bytes>) -> Reply {
        Reply {
            data: text.into(),
            pace: Pace::default(),
            stall: None,
            sleep: None,
            counted: false,
            state: None,
            _transfer: None,
        }
    }

    pub fn empty() -> Reply {
        Reply::text(Bytes::new())
    }

    /// An object's bytes, paced, counted, perhaps stalled.
    pub fn object(
        data: Bytes,
        pace: Pace,
        stall: Option<Stall>,
        state: Arc<State>,
        transfer: Transfer,
    ) -> Reply {
        Reply {
            data,
            pace,
            stall,
            sleep: None,
            counted: true,
            state: Some(state),
            _transfer: Some(transfer),
        }
    }

    /// Keeps `transfer` counted until this body is done.
    pub fn holding(mut self, transfer: Transfer) -> Reply {
        self._transfer = Some(transfer);
        self
    }
}

impl Body for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        loop {
            if let Some((s, then_send)) = &mut this.sleep {
                if s.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let then_send = *then_send;
                this.sleep = None;
                if then_send {
                    // The bytes of the frame the pacing wait paid for.
                    return Poll::Ready(this.next_frame().map(Ok));
                }
            }
            if this.data.is_empty() {
                return Poll::Ready(None);
            }
            if let Some(stall) = this.stall.take_if(|s| this.data.len() <= s.at_remaining) {
                if let Some(st) = &this.state {
                    st.counters
                        .stalls
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                this.sleep = Some((Box::pin(tokio::time::sleep(stall.pause)), false));
                continue;
            }
            if !this.pace.is_paced() {
                return Poll::Ready(this.next_frame().map(Ok));
            }
            let n = this.frame_len();
            let now = this.state.as_ref().map_or(0, |s| s.now_ns());
            let wait = this.pace.reserve(n, now);
            if wait.is_zero() {
                return Poll::Ready(this.next_frame().map(Ok));
            }
            this.sleep = Some((Box::pin(tokio::time::sleep(wait)), true));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty() && self.sleep.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.len() as u64)
    }
}

impl Reply {
    /// The next frame's length: up to the frame size, and never past the
    /// point where a stall is due.
    fn frame_len(&self) -> usize {
        let frame = if self.pace.is_paced() {
            PACED_FRAME
        } else {
            UNPACED_FRAME
        };
        let mut n = frame.min(self.data.len());
        if let Some(s) = &self.stall {
            n = n.min(self.data.len() - s.at_remaining).max(1);
        }
        n
    }

    fn next_frame(&mut self) -> Option<Frame<Bytes>> {
        if self.data.is_empty() {
            return None;
        }
        let n = self.frame_len();
        if self.counted {
            if let Some(st) = &self.state {
                st.counters
                    .bytes
                    .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Some(Frame::data(self.data.split_to(n)))
    }
}
