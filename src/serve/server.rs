//! The server's shell: binding, the accept thread, one thread per
//! connection in a bounded set of slots, and stopping (shut every
//! connection down, join every thread) when the [`Server`] is dropped. Each
//! connection is served by `connection.rs`.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::connection::{ServeCounters, ServeShared, refuse_busy, serve_connection};
use super::{ServeError, ServeOptions, ServeStats};
use crate::sync::Locked;

/// A running file server. Dropping it stops it and joins its threads.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<ServeShared>,
    /// Dropping this end wakes the accept thread (its poll sees the hang-up).
    wake: Option<UnixStream>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    /// Serves the files under `root` on `addr` (`127.0.0.1:8080`,
    /// `[::1]:0`, `localhost:0`; port 0: any free port).
    pub fn bind(
        addr: &str,
        root: impl AsRef<Path>,
        opts: ServeOptions,
    ) -> Result<Server, ServeError> {
        let root = root.as_ref();
        let root_err = |message: String| ServeError::Root {
            root: root.to_path_buf(),
            message,
        };
        let root = std::fs::canonicalize(root).map_err(|e| root_err(e.to_string()))?;
        std::fs::read_dir(&root).map_err(|e| root_err(e.to_string()))?;
        let bind_err = |e: io::Error| ServeError::Bind {
            addr: addr.to_string(),
            message: e.to_string(),
        };
        let listener = TcpListener::bind(addr).map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        // Non-blocking: a connection reset between poll and accept must not
        // block the accept thread.
        listener.set_nonblocking(true).map_err(bind_err)?;
        let (wake, wake_rx) = UnixStream::pair().map_err(bind_err)?;
        let shared = Arc::new(ServeShared {
            root,
            opts: ServeOptions {
                max_connections: opts.max_connections.max(1),
                max_head: opts.max_head.max(64),
                ..opts
            },
            stop: AtomicBool::new(false),
            live: Mutex::new(HashMap::new()),
            counters: ServeCounters::default(),
        });
        let s = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("ringfeed-serve".into())
            .spawn(move || accept_loop(listener, wake_rx, s))
            .map_err(bind_err)?;
        Ok(Server {
            addr: local,
            shared,
            wake: Some(wake),
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL, ending in `/`: `http://127.0.0.1:8080/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// The canonical root directory being served.
    pub fn root(&self) -> &Path {
        &self.shared.root
    }

    pub fn stats(&self) -> ServeStats {
        let c = &self.shared.counters;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServeStats {
            connections: r(&c.connections),
            requests: r(&c.requests),
            body_bytes: r(&c.body_bytes),
            refused_busy: r(&c.refused_busy),
            cpu_ns: r(&c.cpu_ns),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Release: pairs with the Acquire loads in `serve_connection`.
        self.shared.stop.store(true, Ordering::Release);
        drop(self.wake.take());
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn lock_live(shared: &ServeShared) -> std::sync::MutexGuard<'_, HashMap<u64, TcpStream>> {
    // A panicking connection thread cannot leave the map inconsistent.
    shared.live.locked()
}

/// Waits until the listener has a connection (true) or the wake socket
/// hangs up (false).
fn wait_for_connection(listener: &TcpListener, wake: &UnixStream) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfd for the length given,
        // and both descriptors stay open (borrowed) during the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // poll itself failed (ENOMEM): back off rather than spin.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        if fds[1].revents != 0 {
            return false;
        }
        if fds[0].revents != 0 {
            return true;
        }
    }
}

fn accept_loop(listener: TcpListener, wake: UnixStream, shared: Arc<ServeShared>) {
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id = 0u64;
    while wait_for_connection(&listener, &wake) {
        let conn = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                // EMFILE and friends: the condition persists, so poll would
                // report the same connection at once; wait for fds to free.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        threads.retain(|t| !t.is_finished());
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_nodelay(true);
        let _ = conn.set_write_timeout(Some(shared.opts.write_timeout));
        let id = next_id;
        next_id += 1;
        {
            let mut live = lock_live(&shared);
            if live.len() >= shared.opts.max_connections {
                drop(live);
                refuse_busy(conn, &shared);
                continue;
            }
            match conn.try_clone() {
                Ok(c) => live.insert(id, c),
                Err(_) => continue,
            };
        }
        shared.counters.connections.fetch_add(1, Ordering::Relaxed);
        let s = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("ringfeed-conn".into())
            // The connection loop holds a few small buffers on the stack.
            .stack_size(256 << 10)
            .spawn(move || {
                let _slot = Slot { shared: &s, id };
                serve_connection(conn, &s);
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(_) => {
                // The closure (and its socket) is dropped with the error;
                // the client sees a closed connection and may retry.
                lock_live(&shared).remove(&id);
            }
        }
    }
    // Stopping: wake every connection thread out of its read or write, then
    // wait for them, so `Drop for Server` returns with nothing left running.
    for c in lock_live(&shared).values() {
        let _ = c.shutdown(Shutdown::Both);
    }
    for t in threads {
        let _ = t.join();
    }
}

/// Frees a connection slot when its thread ends, even by panic.
struct Slot<'a> {
    shared: &'a ServeShared,
    id: u64,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        lock_live(self.shared).remove(&self.id);
    }
}
