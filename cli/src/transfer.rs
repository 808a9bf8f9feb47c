//! What `get` and `put` share: the progress bars (bytes, rate, per object
//! and in total, drawn on stderr when it is a terminal) fed from the
//! library's `Progress` counters by a thread of their own, the summary line,
//! and Ctrl-C, which must not leave a temporary file or an S3 upload behind.
//!
//! Ctrl-C: while no write is open the process exits at once (a read leaves
//! nothing). While one is open, the first Ctrl-C only raises a flag: the
//! command checks it between pieces, drops its writer (which aborts the
//! write) and exits with 130; a second one exits at once.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use ringfeed::object::Progress;

use crate::AnyResult;

/// Set by the first Ctrl-C while a write is open.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// A write is open: Ctrl-C must let the command abort it.
static WRITING: AtomicBool = AtomicBool::new(false);

/// The exit status of a command stopped by SIGINT (128 + 2), as shells give.
pub(crate) const INTERRUPTED_EXIT: u8 = 130;

extern "C" fn on_sigint(_: libc::c_int) {
    // SeqCst: the handler and the command's thread see one order of the
    // two flags (set by `WritingGuard`, read here; set here, read by
    // `check_interrupt`).
    if !WRITING.load(Ordering::SeqCst) || INTERRUPTED.swap(true, Ordering::SeqCst) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(i32::from(INTERRUPTED_EXIT)) };
    }
}

/// Installs the Ctrl-C handler, without `SA_RESTART`: a read of stdin
/// waiting for input returns `Interrupted`, so `put -` sees the flag.
pub(crate) fn install_interrupt_handler() {
    // SAFETY: a zeroed sigaction is a valid value to fill in; the handler
    // only touches atomics and calls _exit, both async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

/// While alive, a Ctrl-C raises the flag instead of exiting.
pub(crate) struct WritingGuard;

impl WritingGuard {
    pub(crate) fn new() -> WritingGuard {
        // SeqCst: see `on_sigint`.
        WRITING.store(true, Ordering::SeqCst);
        WritingGuard
    }
}

impl Drop for WritingGuard {
    fn drop(&mut self) {
        // SeqCst: see `on_sigint`.
        WRITING.store(false, Ordering::SeqCst);
    }
}

/// The error a command returns when Ctrl-C came during a write.
#[derive(Debug)]
pub(crate) struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted; nothing was written")
    }
}

impl std::error::Error for Interrupted {}

pub(crate) fn check_interrupt() -> AnyResult<()> {
    // SeqCst: see `on_sigint`.
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err(Box::new(Interrupted));
    }
    Ok(())
}

/// How often the bars are redrawn from the counters: smooth to the eye,
/// nothing to the CPU.
const TICK: Duration = Duration::from_millis(100);

/// Progress bars of a transfer: one for the total and one for the object
/// in progress, fed from that object's counter. Hidden when stderr is not a
/// terminal.
pub(crate) struct Bars {
    multi: MultiProgress,
    total: ProgressBar,
    /// Bytes of the objects done before the current one.
    done: u64,
    current: Option<Current>,
    pub(crate) started: Instant,
}

struct Current {
    bar: ProgressBar,
    /// Dropped to stop the ticker at once.
    stop: mpsc::Sender<()>,
    ticker: JoinHandle<()>,
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

impl Bars {
    /// `total` bytes in `objects` objects, when known.
    pub(crate) fn new(total: Option<u64>, objects: usize) -> Bars {
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let multi = MultiProgress::with_draw_target(target);
        let total_bar = match total {
            Some(n) => multi.add(ProgressBar::new(n)).with_style(style(
                "total {bar:30} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
            )),
            None => multi.add(ProgressBar::no_length()).with_style(style(
                "total {spinner} {binary_bytes} {binary_bytes_per_sec} {msg}",
            )),
        };
        if objects > 1 {
            total_bar.set_message(format!("0/{objects} objects"));
        }
        Bars {
            multi,
            total: total_bar,
            done: 0,
            current: None,
            started: Instant::now(),
        }
    }

    /// Starts the bar of one object of `size` bytes (when known), fed from
    /// `progress` until [`Bars::finish_object`].
    pub(crate) fn start_object(&mut self, name: &str, size: Option<u64>, progress: Arc<Progress>) {
        self.finish_object(0);
        let bar = match size {
            Some(n) => self.multi.add(ProgressBar::new(n)).with_style(style(
                "{bar:30} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {msg}",
            )),
            None => self.multi.add(ProgressBar::no_length()).with_style(style(
                "{spinner} {binary_bytes} {binary_bytes_per_sec} {msg}",
            )),
        };
        bar.set_message(name.to_string());
        let (stop, stopped) = mpsc::channel::<()>();
        let ticker = {
            let (bar, total) = (bar.clone(), self.total.clone());
            let done = self.done;
            std::thread::spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(TICK) {
                    let n = progress.bytes();
                    bar.set_position(n);
                    total.set_position(done + n);
                }
            })
        };
        self.current = Some(Current { bar, stop, ticker });
    }

    /// Ends the current object's bar, which moved `bytes`.
    pub(crate) fn finish_object(&mut self, bytes: u64) {
        if let Some(c) = self.current.take() {
            drop(c.stop);
            let _ = c.ticker.join();
            c.bar.finish_and_clear();
            self.done += bytes;
            self.total.set_position(self.done);
        }
    }

    /// Counts one object done of `objects`.
    pub(crate) fn object_done(&self, done: usize, objects: usize) {
        if objects > 1 {
            self.total.set_message(format!("{done}/{objects} objects"));
        }
    }

    pub(crate) fn clear(mut self) {
        self.finish_object(0);
        self.total.finish_and_clear();
    }
}

impl Drop for Bars {
    fn drop(&mut self) {
        self.finish_object(0);
    }
}

/// The summary line: `VERB N object(s), BYTES bytes in S s, R GB/s (HOW)`.
pub(crate) fn summary(verb: &str, objects: usize, bytes: u64, seconds: f64, how: &str) -> String {
    format!(
        "{verb} {objects} object{}, {bytes} bytes in {seconds:.3} s, {:.3} GB/s ({how})",
        if objects == 1 { "" } else { "s" },
        bytes as f64 / seconds.max(1e-9) / 1e9
    )
}

/// The library's message, with the command's flag for `overwrite`.
pub(crate) fn explain(e: ringfeed::Error) -> Box<dyn std::error::Error> {
    match e {
        ringfeed::Error::Exists { .. } => format!("{e} (--overwrite replaces it)").into(),
        e => Box::new(e),
    }
}
