//! Shards computed on the fly by a server (`VirtualShards`): tens of GB
//! stream without being stored.

use super::*;

/// Shards that exist only as a function: a server on 127.0.0.1 answers
/// HEAD and ranged GETs for `/shard-NNNNNN.tar` (`shards` of them) by
/// computing the bytes asked, so tens of GB stream without being stored.
/// Each sample is a `bin` member of `sample_bytes` (its first 8 bytes are
/// the sample's number over the dataset, little-endian; the rest a fixed
/// pattern) and a 16-byte `cls` member.
pub struct VirtualShards {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

/// The pattern of the `bin` members' bytes past their first 8: each sample
/// starts it at its own offset (`pattern_start`), so bytes of one sample
/// found in another's place, or a piece of a shard read at the wrong offset,
/// do not match.
static PATTERN: std::sync::LazyLock<Vec<u8>> =
    std::sync::LazyLock::new(|| (0..1u32 << 16).map(|i| (i * 131 + 7) as u8).collect());

/// Where sample `n`'s `bin` bytes past the first 8 start in `PATTERN`; 8191
/// is odd and prime to the pattern's length, so consecutive samples start
/// far apart and all 65,536 starts are used.
fn pattern_start(n: u64) -> usize {
    (n.wrapping_mul(8191) % PATTERN.len() as u64) as usize
}

/// Calls `f` with the pieces of `PATTERN` that make `len` bytes of sample
/// `n`'s `bin` past its first 8, in order.
fn pattern_pieces(n: u64, len: usize, mut f: impl FnMut(&[u8])) {
    let (mut p, mut left) = (pattern_start(n), len);
    while left > 0 {
        let m = left.min(PATTERN.len() - p);
        f(&PATTERN[p..p + m]);
        left -= m;
        p = 0;
    }
}

/// Whether `bin` is exactly the `bin` member of sample `n` of a
/// `VirtualLayout` with samples of `sample_bytes`: its number, then every
/// byte of its pattern.
pub fn virtual_bin_is(n: u64, sample_bytes: u64, bin: &[u8]) -> bool {
    if bin.len() as u64 != sample_bytes || bin[..8] != n.to_le_bytes() {
        return false;
    }
    let mut at = 8;
    let mut same = true;
    pattern_pieces(n, bin.len() - 8, |piece| {
        same &= bin[at..at + piece.len()] == *piece;
        at += piece.len();
    });
    same
}

#[derive(Clone, Copy)]
pub struct VirtualLayout {
    pub shards: u64,
    pub samples_per_shard: u64,
    pub sample_bytes: u64,
}

impl VirtualLayout {
    fn padded(n: u64) -> u64 {
        n.div_ceil(512) * 512
    }
    /// Bytes of one sample: two headers, the `bin` data and the `cls` data, padded.
    pub fn sample_stride(&self) -> u64 {
        512 + Self::padded(self.sample_bytes) + 512 + 512
    }
    pub fn shard_len(&self) -> u64 {
        self.samples_per_shard * self.sample_stride() + 1024
    }
    pub fn total_bytes(&self) -> u64 {
        self.shards * self.shard_len()
    }

    /// Writes bytes `from..to` of shard `shard` to `w`, a sample at a time
    /// (each made whole in a buffer, the part asked written).
    fn write_range(
        &self,
        w: &mut impl Write,
        shard: u64,
        from: u64,
        to: u64,
    ) -> std::io::Result<()> {
        let stride = self.sample_stride();
        let bin_pad = Self::padded(self.sample_bytes) as usize;
        let mut sample = Vec::with_capacity(stride as usize);
        let mut at = from;
        while at < to {
            let j = at / stride;
            let off = (at % stride) as usize;
            sample.clear();
            if j >= self.samples_per_shard {
                sample.resize(1024, 0); // the two zero blocks that end the archive
            } else {
                let n = self.samples_per_shard * shard + j; // the sample's number
                let key = format!("{shard:06}-{j:07}");
                sample.extend_from_slice(&ustar(&format!("{key}.bin"), self.sample_bytes));
                sample.extend_from_slice(&n.to_le_bytes());
                pattern_pieces(n, self.sample_bytes as usize - 8, |piece| {
                    sample.extend_from_slice(piece)
                });
                sample.resize(512 + bin_pad, 0);
                sample.extend_from_slice(&ustar(&format!("{key}.cls"), 16));
                sample.extend_from_slice(&n.to_le_bytes());
                sample.resize(stride as usize, 0);
            }
            let end = sample.len().min(off + (to - at) as usize);
            w.write_all(&sample[off..end])?;
            at += (end - off) as u64;
        }
        Ok(())
    }
}

fn ustar(name: &str, size: u64) -> [u8; 512] {
    ringfeed::synth::ustar_header(name, size, b'0')
}

impl VirtualShards {
    pub fn start(layout: VirtualLayout) -> VirtualShards {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                std::thread::spawn(move || {
                    let _ = serve_virtual(conn, layout);
                });
            }
        });
        VirtualShards { addr, stop }
    }

    /// The brace URL of every shard.
    pub fn url(&self, layout: &VirtualLayout) -> String {
        format!(
            "http://{}/shard-{{000000..{:06}}}.tar",
            self.addr,
            layout.shards - 1
        )
    }
}

impl Drop for VirtualShards {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve_virtual(mut conn: TcpStream, layout: VirtualLayout) -> std::io::Result<()> {
    let mut buf = Vec::new();
    loop {
        let Some(n) = read_head(&mut conn, &mut buf, false) else {
            return Ok(());
        };
        let head: Vec<u8> = buf.drain(..n).collect();
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        let _ = req.parse(&head);
        let shard = req
            .path
            .and_then(|p| {
                p.strip_prefix("/shard-")?
                    .strip_suffix(".tar")?
                    .parse::<u64>()
                    .ok()
            })
            .filter(|&s| s < layout.shards);
        let Some(shard) = shard else {
            conn.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")?;
            continue;
        };
        let len = layout.shard_len();
        if req.method == Some("HEAD") {
            write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nAccept-Ranges: bytes\r\n\r\n"
            )?;
            continue;
        }
        let range = req
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("range"))
            .and_then(|h| std::str::from_utf8(h.value).ok())
            .and_then(|v| v.strip_prefix("bytes="))
            .and_then(|v| v.split_once('-'))
            .and_then(|(a, b)| {
                let a = a.parse::<u64>().ok()?;
                let b = if b.is_empty() {
                    len - 1
                } else {
                    b.parse::<u64>().ok()?.min(len - 1)
                };
                (a <= b).then_some((a, b))
            });
        let (a, b) = range.unwrap_or((0, len - 1));
        if range.is_some() {
            write!(
                conn,
                "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {a}-{b}/{len}\r\n\r\n",
                b - a + 1
            )?;
        } else {
            write!(conn, "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n")?;
        }
        layout.write_range(&mut conn, shard, a, b + 1)?;
        let close = req.headers.iter().any(|h| {
            h.name.eq_ignore_ascii_case("connection") && h.value.eq_ignore_ascii_case(b"close")
        });
        if close {
            return Ok(());
        }
    }
}
