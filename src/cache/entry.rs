//! One cache entry on disk: a header that names exactly what the bytes are
//! (the object's identity: endpoint, object, ETag or Last-Modified, and the
//! byte range) and how many samples they hold once counted, then the data
//! at a block boundary (so a later read may be O_DIRECT), then a table of
//! one CRC32C per block of the data. Written to a temporary file and
//! renamed into place, so a reader sees a whole entry or none; a reader
//! checks the header, the identity, the file's length and the table's own
//! checksum when it opens an entry, and each block against the table before
//! its bytes are used, so a torn, truncated, corrupt or stale entry is a
//! miss, never wrong bytes. Per-block checksums let a reader that reads the
//! data in pieces (a loader, a chunk at a time) check each piece as it
//! lands, before any of it is parsed.
//!
//! Files are made 0600 without following a link (`super::private`); an
//! entry is opened only when it is this user's regular file.
//!
//! Layout (little-endian):
//!
//! ```text
//! 0   magic  b"RFCACHE2"
//! 8   u32    identity length I
//! 12  u32    block size B
//! 16  u64    data length N
//! 24  u64    samples in the data + 1 (0: not counted)
//! 32  u32    CRC32C of the block table
//! 36  u32    CRC32C of bytes 0..36 and the identity
//! 40  I      identity (UTF-8)
//! ..  pad to DATA_ALIGN
//! D   N      data
//! D+N 4*ceil(N/B)  the block table: the CRC32C of each block of B bytes
//! ```

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crc_fast::{CrcAlgorithm, Digest, checksum};

const MAGIC: &[u8; 8] = b"RFCACHE2";
const FIXED: usize = 40;
/// Where the data starts: a multiple of every block size O_DIRECT needs.
pub const DATA_ALIGN: usize = 4096;
/// Identities are URLs and tags; anything longer is not one of ours.
pub const MAX_IDENTITY: usize = 3072;
/// Bytes per checksum block: a reader checks the data in whole blocks, so
/// it reads at offsets that are multiples of this (a loader's chunk data
/// lengths are). 64 KiB keeps the table at 1/16384 of the data.
pub const BLOCK: usize = 64 << 10;
/// A file name of the entries.
pub const SUFFIX: &str = ".rfc";

/// What a cached range is: the same bytes of the same version of the
/// same object. Two ranges are the same entry only if every field agrees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `scheme://host:port` of the server, or `file` for local data.
    pub endpoint: String,
    /// The object as the dataset names it (`s3://bucket/key`, a URL).
    pub object: String,
    /// The version the server gave: its ETag, else its Last-Modified.
    pub version: String,
    pub offset: u64,
    pub len: u64,
}

impl Identity {
    /// The identity as stored in the header: fields joined by a byte no
    /// field holds (`\n`; URLs and tags never do).
    pub fn text(&self) -> Result<String, String> {
        for (name, f) in [
            ("endpoint", &self.endpoint),
            ("object", &self.object),
            ("version", &self.version),
        ] {
            if f.contains('\n') {
                return Err(format!("a cache identity's {name} holds a line break"));
            }
        }
        let t = format!(
            "{}\n{}\n{}\n{}\n{}",
            self.endpoint, self.object, self.version, self.offset, self.len
        );
        if t.len() > MAX_IDENTITY {
            return Err(format!(
                "a cache identity of {} bytes is over {MAX_IDENTITY}",
                t.len()
            ));
        }
        Ok(t)
    }

    /// The entry's file name: a hash of where the bytes are (endpoint,
    /// object, offset) but not of their version or length, so a new
    /// version of an object replaces the old one's entry instead of
    /// leaving it to age out; the header's identity decides whether an
    /// entry holds the version asked for (and settles a hash collision).
    pub fn file_name(&self) -> String {
        let t = format!("{}\n{}\n{}", self.endpoint, self.object, self.offset);
        let h = checksum(CrcAlgorithm::Crc64Nvme, t.as_bytes());
        format!("{h:016x}{SUFFIX}")
    }

    /// The identity back from its header text.
    pub fn parse(text: &str) -> Option<Identity> {
        let mut f = text.split('\n');
        let id = Identity {
            endpoint: f.next()?.into(),
            object: f.next()?.into(),
            version: f.next()?.into(),
            offset: f.next()?.parse().ok()?,
            len: f.next()?.parse().ok()?,
        };
        f.next().is_none().then_some(id)
    }
}

/// Where the data starts for an identity of `i` bytes.
pub fn data_offset(i: usize) -> usize {
    (FIXED + i).next_multiple_of(DATA_ALIGN)
}

fn blocks(len: u64) -> usize {
    len.div_ceil(BLOCK as u64) as usize
}

fn crc32c(bytes: &[u8]) -> u32 {
    checksum(CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

fn table_bytes(table: &[u32]) -> Vec<u8> {
    table.iter().flat_map(|c| c.to_le_bytes()).collect()
}

/// The header of an entry, padded to [`data_offset`].
fn header(identity: &str, data_len: u64, samples: Option<u64>, table: &[u32]) -> Vec<u8> {
    let mut h = Vec::with_capacity(data_offset(identity.len()));
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&(identity.len() as u32).to_le_bytes());
    h.extend_from_slice(&(BLOCK as u32).to_le_bytes());
    h.extend_from_slice(&data_len.to_le_bytes());
    h.extend_from_slice(&samples.map_or(0, |n| n + 1).to_le_bytes());
    h.extend_from_slice(&crc32c(&table_bytes(table)).to_le_bytes());
    let mut covered = h.clone();
    covered.extend_from_slice(identity.as_bytes());
    h.extend_from_slice(&crc32c(&covered).to_le_bytes());
    h.extend_from_slice(identity.as_bytes());
    h.resize(data_offset(identity.len()), 0);
    h
}

/// A parsed header: what the data is, where it is, and what it must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub identity: String,
    pub data_len: u64,
    pub data_offset: usize,
    /// Samples the data holds, when the loader that wrote it counted them.
    pub samples: Option<u64>,
    block: usize,
    table_crc: u32,
}

/// The largest data an entry may hold: 2^62 bytes, far past any file
/// system's file size limit, and small enough that the data offset plus the
/// data plus its block table never wraps a `u64`.
const MAX_DATA_LEN: u64 = 1 << 62;

impl Header {
    /// Where the block table starts, and the length of the whole file.
    fn table_at(&self) -> u64 {
        self.data_offset as u64 + self.data_len
    }
    fn file_len(&self) -> u64 {
        self.table_at() + 4 * blocks(self.data_len) as u64
    }
}

/// Why an entry was not used. Every one is a miss; the caller drops the
/// file (and counts it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bad {
    /// Not an entry of this format (or torn inside the header).
    NotAnEntry(String),
    /// A whole entry of another identity: a changed object (another
    /// version) under the same name, or a hash collision.
    OtherIdentity,
    /// The file is shorter or longer than the header says, or the table
    /// or a block fails its checksum.
    Corrupt(String),
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bad::NotAnEntry(why) => write!(f, "not a cache entry ({why})"),
            Bad::OtherIdentity => write!(f, "holds another version or object"),
            Bad::Corrupt(why) => write!(f, "corrupt ({why})"),
        }
    }
}

/// Parses the fixed header and the identity from the start of a file.
pub fn parse_header(bytes: &[u8]) -> Result<Header, Bad> {
    if bytes.len() < FIXED {
        return Err(Bad::NotAnEntry(format!("{} bytes, no header", bytes.len())));
    }
    if &bytes[..8] != MAGIC {
        return Err(Bad::NotAnEntry("no magic".into()));
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap_or([0; 8]));
    let ilen = u32_at(8) as usize;
    if ilen > MAX_IDENTITY {
        return Err(Bad::NotAnEntry(format!("identity of {ilen} bytes")));
    }
    let Some(identity) = bytes.get(FIXED..FIXED + ilen) else {
        return Err(Bad::NotAnEntry("torn identity".into()));
    };
    let mut covered = bytes[..36].to_vec();
    covered.extend_from_slice(identity);
    if crc32c(&covered) != u32_at(36) {
        return Err(Bad::NotAnEntry("header checksum".into()));
    }
    if u32_at(12) as usize != BLOCK {
        return Err(Bad::NotAnEntry(format!("blocks of {} bytes", u32_at(12))));
    }
    let identity = String::from_utf8(identity.to_vec())
        .map_err(|_| Bad::NotAnEntry("identity not UTF-8".into()))?;
    // The padding up to the data is zeros: the format writes each entry
    // one way, so no byte of a file that opens goes unchecked.
    let padding = bytes.get(FIXED + ilen..data_offset(ilen)).unwrap_or(&[]);
    if padding.iter().any(|&b| b != 0) {
        return Err(Bad::NotAnEntry("bytes in the header's padding".into()));
    }
    // The file's length is computed from this one (data, then 4 bytes of
    // table per block): a length no file can have would wrap that sum.
    let data_len = u64_at(16);
    if data_len > MAX_DATA_LEN {
        return Err(Bad::NotAnEntry(format!("data of {data_len} bytes")));
    }
    Ok(Header {
        identity,
        data_len,
        data_offset: data_offset(ilen),
        samples: u64_at(24).checked_sub(1),
        block: BLOCK,
        table_crc: u32_at(32),
    })
}

/// An entry opened for reading: its header (checked), its block table
/// (checked against the header) and the file, whose data the caller reads
/// at `header.data_offset` and checks with [`Entry::check`].
#[derive(Debug)]
pub struct Entry {
    pub file: File,
    pub header: Header,
    table: Vec<u32>,
}

impl Entry {
    /// Opens the entry at `path`: `Ok(Err(bad))` when the file is not a
    /// whole entry (the caller drops it), `Err` when it cannot be read.
    pub fn open(path: &Path) -> std::io::Result<Result<Entry, Bad>> {
        let file = super::private::open_owned(path)?;
        let mut head = vec![0u8; DATA_ALIGN];
        let n = read_full_at(&file, &mut head, 0)?;
        head.truncate(n);
        let header = match parse_header(&head) {
            Ok(h) => h,
            Err(b) => return Ok(Err(b)),
        };
        let len = file.metadata()?.len();
        if len != header.file_len() {
            return Ok(Err(Bad::Corrupt(format!(
                "{len} bytes on disk, the header says {}",
                header.file_len()
            ))));
        }
        let mut raw = vec![0u8; 4 * blocks(header.data_len)];
        if read_full_at(&file, &mut raw, header.table_at())? != raw.len() {
            return Ok(Err(Bad::Corrupt("torn block table".into())));
        }
        if crc32c(&raw) != header.table_crc {
            return Ok(Err(Bad::Corrupt("block table checksum".into())));
        }
        let table = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
            .collect();
        Ok(Ok(Entry {
            file,
            header,
            table,
        }))
    }

    /// Checks `bytes`, the data from `offset` on: `offset` is a multiple of
    /// [`BLOCK`], and `bytes` ends at a block boundary or at the data's end.
    pub fn check(&self, offset: u64, bytes: &[u8]) -> Result<(), Bad> {
        let block = self.header.block;
        let end = offset + bytes.len() as u64;
        if offset % block as u64 != 0
            || end > self.header.data_len
            || !(end % block as u64 == 0 || end == self.header.data_len)
        {
            return Err(Bad::Corrupt(format!(
                "a check of {} bytes at {offset} is not in whole blocks of the {} bytes",
                bytes.len(),
                self.header.data_len
            )));
        }
        let first = (offset / block as u64) as usize;
        for (i, piece) in bytes.chunks(block).enumerate() {
            if crc32c(piece) != self.table[first + i] {
                return Err(Bad::Corrupt(format!(
                    "block {} (bytes {}..) fails its checksum",
                    first + i,
                    (first + i) * block
                )));
            }
        }
        Ok(())
    }

    /// The whole data, checked.
    pub fn read_all(&self) -> std::io::Result<Result<Vec<u8>, Bad>> {
        let mut data = vec![0u8; self.header.data_len as usize];
        if read_full_at(&self.file, &mut data, self.header.data_offset as u64)? != data.len() {
            return Ok(Err(Bad::Corrupt("torn data".into())));
        }
        Ok(self.check(0, &data).map(|()| data))
    }
}

fn read_full_at(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// An entry being written: the data is appended in order (checksummed a
/// block at a time on the way) into a temporary file, which [`finish`]
/// completes and renames over the entry's name. Dropped unfinished, the
/// temporary file is removed.
///
/// [`finish`]: EntryWriter::finish
pub struct EntryWriter {
    file: File,
    /// The same file opened with O_DIRECT, where the file system takes
    /// it: whole aligned pieces go there, from the caller's memory to the
    /// disk without a copy into the page cache (which would cost the CPU
    /// what receiving the bytes did, and evict what others cache).
    direct: Option<File>,
    tmp: PathBuf,
    path: PathBuf,
    text: String,
    data_offset: u64,
    len: u64,
    written: u64,
    /// The sums of the bytes as written; `None` where the caller gives
    /// them at the end ([`EntryWriter::sums_given`]).
    sums: Option<BlockSums>,
    done: bool,
}

/// The CRC32C of each [`BLOCK`] of a data stream fed in pieces of any
/// size: an entry's checksum table.
pub struct BlockSums {
    fed: u64,
    block: Digest,
    table: Vec<u32>,
}

impl BlockSums {
    /// The sums of a stream of `len` bytes.
    pub fn new(len: u64) -> BlockSums {
        BlockSums {
            fed: 0,
            block: Digest::new(CrcAlgorithm::Crc32Iscsi),
            table: Vec::with_capacity(blocks(len)),
        }
    }

    /// Takes the next bytes of the stream into the sums.
    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let in_block = (self.fed % BLOCK as u64) as usize;
            let take = (BLOCK - in_block).min(bytes.len());
            self.block.update(&bytes[..take]);
            self.fed += take as u64;
            if self.fed % BLOCK as u64 == 0 {
                self.table.push(self.block.finalize_reset() as u32);
            }
            bytes = &bytes[take..];
        }
    }

    /// The table, the last partial block's sum included.
    pub fn finish(mut self) -> Vec<u32> {
        if self.fed % BLOCK as u64 != 0 {
            self.table.push(self.block.finalize_reset() as u32);
        }
        self.table
    }
}

impl EntryWriter {
    /// Starts the entry for `id` in `dir`, through the temporary file
    /// `tmp` (in `dir`; the caller makes sure no one else writes it, so a
    /// file found there is a dead fill's, and is replaced). The file is
    /// made anew, 0600, never through a link planted at its name.
    pub fn create(dir: &Path, id: &Identity, tmp: &str) -> std::io::Result<EntryWriter> {
        let text = id.text().map_err(std::io::Error::other)?;
        let tmp = dir.join(tmp);
        let file = match super::private::create_new(&tmp) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // Removes a link itself, not what it points to.
                std::fs::remove_file(&tmp)?;
                super::private::create_new(&tmp)?
            }
            made => made?,
        };
        // The same file, by its name again: only if the name still is it.
        let direct = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_NOFOLLOW)
            .open(&tmp)
            .ok()
            .filter(|d| super::private::same_inode(d, &file));
        Ok(EntryWriter {
            file,
            direct,
            tmp,
            path: dir.join(id.file_name()),
            data_offset: data_offset(text.len()) as u64,
            text,
            len: id.len,
            written: 0,
            sums: Some(BlockSums::new(id.len)),
            done: false,
        })
    }

    /// The checksums will come with [`finish_as`], taken when the bytes
    /// were read: the writer takes none of its own (one pass over the
    /// bytes, not two). Bytes that change in memory between their read and
    /// their write are then stored under the sums of what was read, so the
    /// entry's first read finds the block that differs ([`Entry::check`])
    /// and drops it: never served.
    ///
    /// [`finish_as`]: EntryWriter::finish_as
    pub fn sums_given(&mut self) {
        self.sums = None;
    }

    /// Bytes appended so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Appends the next bytes of the data.
    pub fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.written + bytes.len() as u64 > self.len {
            return Err(std::io::Error::other(format!(
                "{} bytes appended to a cache entry of {}",
                self.written + bytes.len() as u64,
                self.len
            )));
        }
        let at = self.data_offset + self.written;
        let aligned = |n: u64| n % DATA_ALIGN as u64 == 0;
        match &self.direct {
            Some(d)
                if aligned(at) && aligned(bytes.len() as u64) && aligned(bytes.as_ptr() as u64) =>
            {
                if let Err(e) = d.write_all_at(bytes, at) {
                    // Refused after all (an alignment past 4096): buffered
                    // from here on.
                    if e.raw_os_error() != Some(libc::EINVAL) {
                        return Err(e);
                    }
                    self.direct = None;
                    self.file.write_all_at(bytes, at)?;
                }
            }
            _ => self.file.write_all_at(bytes, at)?,
        }
        if let Some(sums) = self.sums.as_mut() {
            sums.update(bytes);
        }
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Completes the entry (every byte of the data appended) with its
    /// sample count, and renames it into place. Returns its path and its
    /// size on disk.
    pub fn finish(self, samples: Option<u64>) -> std::io::Result<(PathBuf, u64)> {
        self.complete(samples, None)
    }

    /// [`finish`](EntryWriter::finish) with the checksum table `taken` when
    /// the data was read, before anyone else could write its memory: the
    /// entry's table, so bytes changed in memory between their read and
    /// their write fail the entry's first read
    /// ([`EntryWriter::sums_given`]).
    pub fn finish_as(
        self,
        samples: Option<u64>,
        taken: Vec<u32>,
    ) -> std::io::Result<(PathBuf, u64)> {
        self.complete(samples, Some(taken))
    }

    fn complete(
        mut self,
        samples: Option<u64>,
        taken: Option<Vec<u32>>,
    ) -> std::io::Result<(PathBuf, u64)> {
        if self.written != self.len {
            return Err(std::io::Error::other(format!(
                "a cache entry of {} bytes finished after {}",
                self.len, self.written
            )));
        }
        let table = match (taken, self.sums.take()) {
            (Some(t), _) => t,
            (None, Some(sums)) => sums.finish(),
            (None, None) => {
                return Err(std::io::Error::other(
                    "a cache entry whose checksums were to be given was finished without them",
                ));
            }
        };
        let table_raw = table_bytes(&table);
        let end = self.data_offset + self.len;
        self.file.write_all_at(&table_raw, end)?;
        self.file
            .write_all_at(&header(&self.text, self.len, samples, &table), 0)?;
        std::fs::rename(&self.tmp, &self.path)?;
        self.done = true;
        Ok((self.path.clone(), end + table_raw.len() as u64))
    }
}

impl Drop for EntryWriter {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes an entry for `id` holding `data` into `dir` in one call.
pub fn store(
    dir: &Path,
    id: &Identity,
    data: &[u8],
    samples: Option<u64>,
) -> std::io::Result<PathBuf> {
    let mut w = EntryWriter::create(dir, id, &format!(".{}.tmp", id.file_name()))?;
    w.append(data)?;
    Ok(w.finish(samples)?.0)
}

/// Reads the entry for `id` from `dir`: `Ok(Some(data))` on a hit,
/// `Ok(None)` when there is none, `Err(bad)` when the file there is not a
/// good entry for `id`.
pub fn load(dir: &Path, id: &Identity) -> std::io::Result<Result<Option<Vec<u8>>, Bad>> {
    let text = id.text().map_err(std::io::Error::other)?;
    let e = match Entry::open(&dir.join(id.file_name())) {
        Ok(Ok(e)) => e,
        Ok(Err(b)) => return Ok(Err(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Ok(None)),
        Err(e) => return Err(e),
    };
    if e.header.identity != text {
        return Ok(Err(Bad::OtherIdentity));
    }
    Ok(e.read_all()?.map(Some))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(version: &str, offset: u64, len: u64) -> Identity {
        Identity {
            endpoint: "http://127.0.0.1:9000".into(),
            object: "s3://bucket/train/shard-000001.tar".into(),
            version: version.into(),
            offset,
            len,
        }
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 + 7) as u8).collect()
    }

    #[test]
    fn entries_round_trip_at_an_aligned_offset() {
        let dir = tempfile::tempdir().unwrap();
        for n in [
            0,
            1,
            4095,
            4096,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            3 * BLOCK + 100,
        ] {
            let k = id("\"etag-1\"", 0, n as u64);
            let path = store(dir.path(), &k, &data(n), Some(n as u64 / 7)).unwrap();
            let raw = std::fs::read(&path).unwrap();
            let h = parse_header(&raw).unwrap();
            assert_eq!(h.data_offset % DATA_ALIGN, 0);
            assert_eq!(h.samples, Some(n as u64 / 7));
            assert_eq!(raw.len(), h.data_offset + n + 4 * n.div_ceil(BLOCK));
            assert_eq!(load(dir.path(), &k).unwrap(), Ok(Some(data(n))));
            assert_eq!(Identity::parse(&h.identity), Some(k));
        }
        // No temporary file is left.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert!(names.iter().all(|n| n.ends_with(SUFFIX)), "{names:?}");
        // Uncounted data says so.
        let k = id("\"u\"", 0, 10);
        let raw = std::fs::read(store(dir.path(), &k, &data(10), None).unwrap()).unwrap();
        assert_eq!(parse_header(&raw).unwrap().samples, None);
    }

    #[test]
    fn appends_in_any_pieces_give_the_same_entry() {
        let dir = tempfile::tempdir().unwrap();
        let n = 5 * BLOCK + 333;
        let whole =
            std::fs::read(store(dir.path(), &id("v", 0, n as u64), &data(n), Some(3)).unwrap())
                .unwrap();
        for piece in [1, 4096, BLOCK - 1, BLOCK, 7 << 20] {
            let k = id("v", 0, n as u64);
            let mut w = EntryWriter::create(dir.path(), &k, "t").unwrap();
            for p in data(n).chunks(piece) {
                w.append(p).unwrap();
            }
            assert_eq!(w.written(), n as u64);
            let (path, size) = w.finish(Some(3)).unwrap();
            let raw = std::fs::read(&path).unwrap();
            assert_eq!(raw.len() as u64, size);
            assert!(raw == whole, "pieces of {piece} wrote another entry");
        }
    }

    #[test]
    fn an_unfinished_or_overlong_writer_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let k = id("v", 0, 100);
        let mut w = EntryWriter::create(dir.path(), &k, "t").unwrap();
        w.append(&data(50)).unwrap();
        assert!(
            w.append(&data(51)).is_err(),
            "more than the length was taken"
        );
        assert!(w.finish(None).unwrap_err().to_string().contains("after 50"));
        let mut w = EntryWriter::create(dir.path(), &k, "t2").unwrap();
        w.append(&data(10)).unwrap();
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn another_version_or_range_is_never_served() {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), &id("\"v1\"", 0, 10), &data(10), None).unwrap();
        // A new version has the same name: the old entry is found, and
        // refused by its identity.
        assert_eq!(
            load(dir.path(), &id("\"v2\"", 0, 10)).unwrap(),
            Err(Bad::OtherIdentity)
        );
        assert_eq!(
            load(dir.path(), &id("\"v1\"", 0, 11)).unwrap(),
            Err(Bad::OtherIdentity)
        );
        assert_eq!(load(dir.path(), &id("\"v1\"", 10, 10)).unwrap(), Ok(None));
    }

    #[test]
    fn blocks_are_checked_one_piece_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let n = 4 * BLOCK + 10;
        let k = id("v", 0, n as u64);
        let path = store(dir.path(), &k, &data(n), None).unwrap();
        let e = Entry::open(&path).unwrap().unwrap();
        let d = data(n);
        assert_eq!(e.check(0, &d[..BLOCK]), Ok(()));
        assert_eq!(e.check(2 * BLOCK as u64, &d[2 * BLOCK..]), Ok(()));
        let mut bad = d[BLOCK..3 * BLOCK].to_vec();
        bad[BLOCK + 5] ^= 1;
        let err = e.check(BLOCK as u64, &bad).unwrap_err();
        assert!(format!("{err}").contains("block 2"), "{err}");
        // Not in whole blocks: refused, not half checked.
        assert!(e.check(1, &d[1..BLOCK]).is_err());
        assert!(e.check(0, &d[..BLOCK - 1]).is_err());
    }

    #[test]
    fn torn_truncated_and_flipped_entries_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let n = 2 * BLOCK + 9000;
        let k = id("\"e\"", 0, n as u64);
        let path = store(dir.path(), &k, &data(n), Some(4)).unwrap();
        let good = std::fs::read(&path).unwrap();
        let h = parse_header(&good).unwrap();
        // Every cut and a flip at every region of the file: a miss, never data.
        let mut cuts: Vec<usize> = (0..48).collect();
        cuts.extend([
            h.data_offset - 1,
            h.data_offset,
            h.data_offset + 1,
            h.data_offset + n,
            good.len() - 1,
        ]);
        for cut in cuts {
            std::fs::write(&path, &good[..cut]).unwrap();
            assert!(
                load(dir.path(), &k).unwrap().is_err(),
                "a file cut at {cut} was used"
            );
        }
        let table = h.data_offset + n;
        for at in [
            0,
            9,
            13,
            17,
            25,
            33,
            37,
            45,
            h.data_offset,
            h.data_offset + BLOCK + 1,
            table - 1,
            table,
            good.len() - 1,
        ] {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            std::fs::write(&path, &bad).unwrap();
            assert!(
                load(dir.path(), &k).unwrap().is_err(),
                "a flip at byte {at} was used"
            );
        }
        // Appended bytes are refused too.
        let mut long = good.clone();
        long.push(0);
        std::fs::write(&path, &long).unwrap();
        assert!(matches!(
            load(dir.path(), &k).unwrap(),
            Err(Bad::Corrupt(_))
        ));
    }

    #[test]
    fn a_byte_in_the_header_padding_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let k = id("v", 0, 10);
        let path = store(dir.path(), &k, &data(10), None).unwrap();
        let mut raw = std::fs::read(&path).unwrap();
        let end_of_identity = FIXED + k.text().unwrap().len();
        raw[end_of_identity + 3] = b'A';
        std::fs::write(&path, &raw).unwrap();
        assert!(matches!(
            load(dir.path(), &k).unwrap(),
            Err(Bad::NotAnEntry(_))
        ));
    }

    #[test]
    fn identities_that_cannot_be_stored_are_named() {
        let mut k = id("a\nb", 0, 1);
        assert!(k.text().unwrap_err().contains("version"));
        k.version = "x".repeat(MAX_IDENTITY);
        assert!(k.text().unwrap_err().contains("over"));
        for garbage in [
            &b""[..],
            b"RFCACHE2",
            b"not an entry at all, not at all, no",
        ] {
            assert!(matches!(parse_header(garbage), Err(Bad::NotAnEntry(_))));
        }
        assert_eq!(Identity::parse("a\nb\nc\n1"), None);
        assert_eq!(Identity::parse("a\nb\nc\n1\nx"), None);
        assert_eq!(Identity::parse("a\nb\nc\n1\n2\n3"), None);
    }
}
