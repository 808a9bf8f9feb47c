//! The records a node engine writes into a consumer's ring, as bytes: a
//! batch descriptor (its number and capability, its samples' keys and
//! fields as offsets into the arena, and the resume state after it), an
//! epoch's end, the end of every epoch, or an error. Encoding is the engine's, decoding the consumer's; the
//! decoder checks every length and offset, so a broken record is an error
//! and never a pointer outside the consumer's mapping.

use std::ffi::c_char;

use crate::memory::{Batch, NO_SOURCE, RawField, RawSample};

const BATCH: u8 = 1;
const END_OF_EPOCH: u8 = 2;
const FINISHED: u8 = 3;
const FAILED: u8 = 4;

/// A record, decoded.
#[derive(Debug)]
pub enum Record {
    Batch(Decoded),
    /// Epoch `.0` ended; `.1` is the resume state after it.
    EndOfEpoch(u64, String),
    Finished,
    /// The engine's loader failed: status and message.
    Failed(i32, String),
}

/// A batch descriptor with offsets resolved against a mapping.
#[derive(Debug)]
pub struct Decoded {
    pub id: u64,
    /// The batch's capability (its key's: `super::Key`).
    pub cap: u64,
    pub epoch: u64,
    pub index: u64,
    pub bytes: u64,
    pub state: String,
    pub samples: Vec<RawSample>,
    pub fields: Vec<RawField>,
    /// Keys, each NUL-terminated, one after the other (the samples point in).
    pub _keys: Vec<u8>,
    /// Field names, each NUL-terminated (the fields point in).
    pub _names: Vec<u8>,
    pub sources: Vec<u32>,
}

// SAFETY: the raw pointers point into the decoded value's own vectors and
// into the consumer's read-only mapping of the arena.
unsafe impl Send for Decoded {}

struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
}

/// Encodes a batch whose data lies in the arena at `base .. base + len`.
/// `Err` names a field outside it (the engine's bug, reported, not sent).
pub fn encode_batch(
    b: &Batch,
    id: u64,
    cap: u64,
    state: &str,
    base: *const u8,
    len: usize,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    out.clear();
    let mut o = Out(std::mem::take(out));
    o.u8(BATCH);
    for v in [id, cap, b.epoch(), b.index(), b.bytes()] {
        o.u64(v);
    }
    o.bytes(state.as_bytes());
    // Field names: the batch shares one pointer per name.
    let mut names: Vec<*const c_char> = Vec::new();
    let mut name_of = Vec::with_capacity(b.raw_fields().len());
    for f in b.raw_fields() {
        let i = names.iter().position(|&n| n == f.name).unwrap_or_else(|| {
            names.push(f.name);
            names.len() - 1
        });
        name_of.push(i as u32);
    }
    o.u32(names.len() as u32);
    for &n in &names {
        // SAFETY: a sealed batch's names are NUL-terminated strings it owns.
        o.bytes(unsafe { std::ffi::CStr::from_ptr(n) }.to_bytes());
    }
    o.u32(b.len() as u32);
    let fields = b.raw_fields();
    let mut at = 0usize;
    for (i, s) in b.raw_samples().iter().enumerate() {
        // SAFETY: as for names: the batch's own NUL-terminated keys.
        o.bytes(unsafe { std::ffi::CStr::from_ptr(s.key) }.to_bytes());
        o.u32(b.source_index(i).unwrap_or(NO_SOURCE));
        o.u32(s.field_count as u32);
        for (f, &n) in fields[at..at + s.field_count]
            .iter()
            .zip(&name_of[at..at + s.field_count])
        {
            let off = (f.data as usize).wrapping_sub(base as usize);
            if f.len > 0 && (off > len || f.len > len - off) {
                return Err(format!("a field of {} bytes lies outside the arena", f.len));
            }
            o.u32(n);
            o.u64(if f.len == 0 { 0 } else { off as u64 });
            o.u64(f.len as u64);
        }
        at += s.field_count;
    }
    *out = o.0;
    Ok(())
}

pub fn encode_end_of_epoch(epoch: u64, state: &str) -> Vec<u8> {
    let mut o = Out(Vec::new());
    o.u8(END_OF_EPOCH);
    o.u64(epoch);
    o.bytes(state.as_bytes());
    o.0
}

pub fn encode_finished() -> Vec<u8> {
    vec![FINISHED]
}

pub fn encode_failed(status: i32, message: &str) -> Vec<u8> {
    let mut o = Out(Vec::new());
    o.u8(FAILED);
    o.u32(status as u32);
    o.bytes(message.as_bytes());
    o.0
}

struct In<'a>(&'a [u8]);

impl<'a> In<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err("a record ends early".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn text(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| "a record's text is not UTF-8".into())
    }
}

/// Decodes a record; batch data offsets become pointers from `base`, and
/// each must lie inside `len` bytes.
pub fn decode(rec: &[u8], base: *const u8, len: usize) -> Result<Record, String> {
    let mut r = In(rec);
    match r.u8()? {
        BATCH => {}
        END_OF_EPOCH => return Ok(Record::EndOfEpoch(r.u64()?, r.text()?)),
        FINISHED => return Ok(Record::Finished),
        FAILED => return Ok(Record::Failed(r.u32()? as i32, r.text()?)),
        t => return Err(format!("unknown record type {t}")),
    }
    let (id, cap) = (r.u64()?, r.u64()?);
    let (epoch, index, bytes) = (r.u64()?, r.u64()?, r.u64()?);
    let state = r.text()?;
    let name_count = r.u32()? as usize;
    let mut names = Vec::new();
    let mut name_at = Vec::with_capacity(name_count.min(1024));
    for _ in 0..name_count {
        let n = r.bytes()?;
        if n.contains(&0) {
            return Err("a field name holds a NUL".into());
        }
        name_at.push(names.len());
        names.extend_from_slice(n);
        names.push(0);
    }
    let count = r.u32()? as usize;
    // Each sample takes at least 12 bytes: a bound before allocating.
    if count > rec.len() / 12 {
        return Err("a batch claims more samples than its record holds".into());
    }
    let mut keys = Vec::new();
    let mut key_at = Vec::with_capacity(count);
    let mut sources = Vec::with_capacity(count);
    let mut counts = Vec::with_capacity(count);
    let mut raw: Vec<(usize, u64, u64)> = Vec::new();
    for _ in 0..count {
        let k = r.bytes()?;
        if k.contains(&0) {
            return Err("a sample key holds a NUL".into());
        }
        key_at.push(keys.len());
        keys.extend_from_slice(k);
        keys.push(0);
        sources.push(r.u32()?);
        let fc = r.u32()? as usize;
        if fc > r.0.len() / 20 {
            return Err("a sample claims more fields than its record holds".into());
        }
        counts.push(fc);
        for _ in 0..fc {
            let (n, off, flen) = (r.u32()? as usize, r.u64()?, r.u64()?);
            if n >= name_count {
                return Err(format!("field name {n} of {name_count}"));
            }
            if off > len as u64 || flen > len as u64 - off {
                return Err(format!(
                    "a field of {flen} bytes at {off} lies outside the {len}-byte arena"
                ));
            }
            raw.push((n, off, flen));
        }
    }
    if !r.0.is_empty() {
        return Err("a batch record has bytes after its last sample".into());
    }
    let fields: Vec<RawField> = raw
        .iter()
        .map(|&(n, off, flen)| {
            // The name's offset is inside `names` and the data's inside the
            // mapping (both checked above); `names` is not resized after
            // this. Offsets only: nothing is read through them here.
            let name = names.as_ptr().wrapping_add(name_at[n]);
            let data = base.wrapping_add(off as usize);
            RawField {
                name: name.cast(),
                data,
                len: flen as usize,
            }
        })
        .collect();
    let mut at = 0usize;
    let samples = counts
        .iter()
        .zip(&key_at)
        .map(|(&fc, &k)| {
            let s = RawSample {
                // SAFETY: inside `keys`, checked as built.
                key: unsafe { keys.as_ptr().add(k) }.cast(),
                // SAFETY: at + fc ≤ fields.len() (the fields were pushed in order).
                fields: unsafe { fields.as_ptr().add(at) },
                field_count: fc,
            };
            at += fc;
            s
        })
        .collect();
    Ok(Record::Batch(Decoded {
        id,
        cap,
        epoch,
        index,
        bytes,
        state,
        samples,
        fields,
        _keys: keys,
        _names: names,
        sources,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_records_are_errors_never_pointers_outside() {
        let base = [0u8; 64];
        for rec in [
            &[][..],
            &[9],
            &[BATCH, 1, 2],
            &[END_OF_EPOCH, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, b'a'],
            &[FAILED, 0, 0],
        ] {
            assert!(decode(rec, base.as_ptr(), base.len()).is_err(), "{rec:?}");
        }
        // A well-formed batch record whose field lies past the arena.
        let mut o = Out(Vec::new());
        o.u8(BATCH);
        for v in [1u64, 77, 0, 0, 10] {
            o.u64(v);
        }
        o.bytes(b"state");
        o.u32(1);
        o.bytes(b"jpg");
        o.u32(1);
        o.bytes(b"key0");
        o.u32(0);
        o.u32(1);
        o.u32(0);
        let good = o.0.clone();
        o.u64(60);
        o.u64(10);
        let e = decode(&o.0, base.as_ptr(), base.len()).unwrap_err();
        assert!(e.contains("outside"), "{e}");
        let mut ok = Out(good);
        ok.u64(50);
        ok.u64(10);
        let Record::Batch(d) = decode(&ok.0, base.as_ptr(), base.len()).unwrap() else {
            panic!("not a batch");
        };
        assert_eq!(d.fields[0].data, base[50..].as_ptr());
        assert_eq!((d.id, d.cap), (1, 77));
        assert_eq!(d.samples[0].field_count, 1);
        // Every truncation of a good record is an error, not a panic.
        for n in 0..ok.0.len() {
            assert!(decode(&ok.0[..n], base.as_ptr(), base.len()).is_err());
        }
    }
}
