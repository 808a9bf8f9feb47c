//! Making an io_uring: a ring with the best setup flags the kernel takes
//! ([`new_ring`]: SINGLE_ISSUER and DEFER_TASKRUN where it has them), and
//! whether io_uring works here at all ([`probe`]). The workers' rings
//! (`uring.rs`) and the network threads' (`net_thread.rs`) are made here.

use std::io;

use io_uring::{IoUring, opcode};

/// How a ring was set up, for the stats.
#[derive(Debug, Clone)]
pub struct UringSetup {
    /// Setup flags that the kernel accepted.
    pub flags: &'static str,
}

/// Creates a ring with `entries` slots, with the best flags the kernel takes.
pub fn new_ring(entries: u32) -> io::Result<(IoUring, UringSetup)> {
    // SINGLE_ISSUER + DEFER_TASKRUN (6.1+): completions run when this thread
    // asks for them, not as interrupts to it. Fall back to plain rings.
    if let Ok(r) = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries)
    {
        return Ok((
            r,
            UringSetup {
                flags: "single_issuer,defer_taskrun",
            },
        ));
    }
    if let Ok(r) = IoUring::builder().setup_coop_taskrun().build(entries) {
        return Ok((
            r,
            UringSetup {
                flags: "coop_taskrun",
            },
        ));
    }
    IoUring::new(entries).map(|r| (r, UringSetup { flags: "none" }))
}

/// Whether io_uring can be used here; the error says why not.
///
/// A ring that is set up is not yet a ring that works: a seccomp filter may
/// refuse `io_uring_enter` alone (allowing `io_uring_setup`), and then every
/// read would fail. So the probe also runs one no-op through the ring.
pub fn probe() -> io::Result<UringSetup> {
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        && s.trim() == "2"
    {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "io_uring is disabled (/proc/sys/kernel/io_uring_disabled = 2)",
        ));
    }
    let (mut ring, setup) = new_ring(8)?;
    let nop = opcode::Nop::new().build().user_data(0);
    // SAFETY: a no-op refers to no memory.
    unsafe { ring.submission().push(&nop) }
        .map_err(|_| io::Error::other("a new ring's submission queue is full"))?;
    ring.submit_and_wait(1)
        .map_err(|e| io::Error::new(e.kind(), format!("io_uring_enter: {e}")))?;
    match ring.completion().next() {
        Some(c) if c.result() >= 0 => Ok(setup),
        Some(c) => Err(io::Error::from_raw_os_error(-c.result())),
        None => Err(io::Error::other("a no-op on a new ring did not complete")),
    }
}
