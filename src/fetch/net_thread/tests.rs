use super::*;
use crate::config::Config;
use crate::fetch::direct::LocalFd;

const CHUNK: usize = 1 << 20;

/// Four chunks of a sealed shared memory file, as a node engine's arena
/// (mapped writable before the seals), the first two faulted in.
struct Shared {
    base: *mut u8,
    _file: OwnedFd,
}

impl Shared {
    fn new() -> Shared {
        // SAFETY: a fresh memory file, owned below.
        let fd = unsafe { libc::memfd_create(c"rf-test".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: `fd` is ours.
        let file = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a valid descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd, 4 * CHUNK as i64) }, 0);
        // SAFETY: a shared mapping of the whole file, unmapped in `drop`.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 * CHUNK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let seals =
            libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: a valid descriptor.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) }, 0);
        let base = base.cast::<u8>();
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_bytes(base, 1, 2 * CHUNK) };
        Shared { base, _file: file }
    }

    fn chunk(&self, i: usize) -> *mut u8 {
        // SAFETY: callers ask for one of the four chunks.
        unsafe { self.base.add(i * CHUNK) }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no ring refers to it any more.
        unsafe { libc::munmap(self.base.cast(), 4 * CHUNK) };
    }
}

/// A network thread whose link registers the first two chunks once they
/// are ready (`ready`: at once, or never) reads a file into chunk 0 (a
/// registered one) and into chunk 3 (past them); gives how many rings
/// registered them, after checking both reads' bytes.
fn read_through_thread(ready: usize) -> usize {
    let mem = Shared::new();
    let iovecs = (0..2)
        .map(|i| libc::iovec {
            iov_base: mem.chunk(i).cast(),
            iov_len: CHUNK,
        })
        .collect();
    // SAFETY: the mapping outlives the thread's ring (joined below).
    let fixed = Arc::new(unsafe { FixedBuffers::new(iovecs) });
    fixed.set_ready(ready);
    let link = NetLink::with_fixed(Some(Arc::clone(&fixed))).unwrap();
    let l = Arc::clone(&link);
    let net = NetOptions::for_config(&Config::default());
    let thread = std::thread::spawn(move || l.run(net, 0, 8));
    let data: Vec<u8> = (0..200 * 1024).map(|i| (i * 7 + 3) as u8).collect();
    let mut f = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut f, &data).unwrap();
    let inbox = Inbox::new().unwrap();
    for (id, chunk) in [(1u64, 0usize), (2, 3)] {
        let req = ReadRequest {
            id,
            target: Target::File(LocalFd {
                fd: f.as_raw_fd(),
                align: 0,
            }),
            offset: 0,
            buf: mem.chunk(chunk),
            len: data.len(),
            buf_index: chunk as u32,
            open_end: false,
            pin: None,
        };
        link.hand_file(req, &inbox);
        let mut out = Vec::new();
        while inbox.take(&mut out) == 0 {
            let mut n = 0u64;
            // SAFETY: an 8-byte read of the inbox's eventfd into `n`.
            let r = unsafe { libc::read(inbox.fd(), (&mut n as *mut u64).cast(), 8) };
            if r < 0 {
                let e = io::Error::last_os_error();
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
                std::thread::yield_now();
            }
        }
        assert_eq!(out[0].id, id);
        assert_eq!(out[0].result.as_ref().ok(), Some(&data.len()));
        // SAFETY: the read completed into the mapping.
        let got = unsafe { std::slice::from_raw_parts(mem.chunk(chunk), data.len()) };
        assert!(got == &data[..], "chunk {chunk}'s bytes");
    }
    link.stop();
    thread.join().unwrap();
    assert_eq!(fixed.refused(), None);
    fixed.rings()
}

#[test]
fn a_node_engine_s_io_thread_reads_files_into_its_sealed_shared_chunks_as_fixed_buffers() {
    // Ready: the thread's ring registers them, and the bytes are right
    // through both kinds of read.
    assert_eq!(read_through_thread(2), 1);
    // Control: never ready, never registered; the same reads, plain.
    assert_eq!(read_through_thread(0), 0);
}
