//! Kernel TLS for the io_uring https path: once rustls's handshake is done
//! (`uring_tls.rs`), the session's keys go to the socket and the kernel
//! opens the records, so a range's body lands as plaintext in its
//! destination chunk exactly as plain HTTP's does: no copy, no cipher on
//! the receiving thread (the kernel's AES-GCM runs in the softirq or the
//! `recv`, with the CPU's vector instructions).
//!
//! - The probe: the first hand-over attaches the TLS upper layer to the
//!   connected socket (`TCP_ULP "tls"`). A kernel built without it
//!   (`CONFIG_TLS`) answers `ENOENT`, a seccomp profile `EPERM`: the
//!   refusal is kept for the process (no later connection asks again),
//!   the session goes on in user space, and the stats say why
//!   (`tls_records`, the notes).
//! - The hand-over: the receiving key, then the sending key, each with its
//!   record sequence number (`SOL_TLS`, `TLS_RX` / `TLS_TX`, the
//!   `tls12_crypto_info_*` layouts for AES-GCM and ChaCha20-Poly1305, TLS
//!   1.2 and 1.3). Only a session with nothing received past its handshake
//!   is handed over (the kernel must see every record from the first
//!   after the keys).
//! - Records other than data: a plain receive fails with `EIO` when the
//!   next record is not application data; [`KernelSession::control`] then
//!   reads it with its record type (`recvmsg`, `TLS_GET_RECORD_TYPE`): a
//!   session ticket is dropped, `close_notify` ends the body as a FIN
//!   would, another alert fails the range by name, a key update renews the
//!   receiving key in the kernel (and, when asked, sends ours and renews
//!   the sending key). A kernel that cannot renew keys (before Linux 6.14)
//!   fails the range as a reset, retried on a fresh connection, and the
//!   loader's later sessions stay in user space.

use std::os::fd::RawFd;
use std::sync::OnceLock;

use rustls::client::ClientConnectionData;
use rustls::kernel::KernelConnection;
use rustls::{ConnectionTrafficSecrets, ContentType, ProtocolVersion, SupportedCipherSuite};

use super::tls_control::{self, KEY_UPDATE, TlsRecord};
use crate::net::http::{FailKind, HttpFail};

/// The kernel's refusal of `TCP_ULP "tls"`, once seen: the same for every
/// socket of the process.
static REFUSED: OnceLock<String> = OnceLock::new();

/// Why the kernel refused kernel TLS in this process, once it has.
pub fn refused() -> Option<&'static str> {
    REFUSED.get().map(String::as_str)
}

/// A direction's key as the kernel takes it (`struct tls12_crypto_info_*`).
pub enum CryptoInfo {
    Gcm128(libc::tls12_crypto_info_aes_gcm_128),
    Gcm256(libc::tls12_crypto_info_aes_gcm_256),
    Chacha(libc::tls12_crypto_info_chacha20_poly1305),
}

impl CryptoInfo {
    /// The key of `secret` at record sequence number `seq` on a `version`
    /// session, for `sending` or receiving. rustls gives AES-GCM's 12-byte
    /// nonce base as the 4-byte salt followed by 8 bytes E, the split the
    /// kernel takes; ChaCha20's as 12 bytes of iv and no salt.
    ///
    /// TLS 1.2 AES-GCM sends an explicit nonce with each record: rustls's
    /// for sequence number s is E XOR s, the kernel's is its `iv` plus one
    /// per record. A session handed over after sealing only its Finished
    /// (s = 0, nonce E) goes on from E + 1, a nonce never used under the
    /// key; one that sealed more is refused (its nonces could meet). A
    /// receiver reads the explicit nonce off each record, so receiving
    /// needs no such care.
    pub fn new(
        version: ProtocolVersion,
        seq: u64,
        secret: &ConnectionTrafficSecrets,
        sending: bool,
    ) -> Result<CryptoInfo, String> {
        let tls12 = match version {
            ProtocolVersion::TLSv1_3 => false,
            ProtocolVersion::TLSv1_2 => true,
            v => return Err(format!("no kernel TLS for {v:?}")),
        };
        let version = if tls12 {
            libc::TLS_1_2_VERSION
        } else {
            libc::TLS_1_3_VERSION
        };
        let rec_seq = seq.to_be_bytes();
        // The 8 bytes after the salt, as the kernel takes them.
        let gcm_iv = |rest: &[u8]| -> Result<[u8; 8], String> {
            let e: [u8; 8] = rest
                .try_into()
                .map_err(|_| "an AES-GCM iv not of 12 bytes")?;
            if !(tls12 && sending) {
                return Ok(e);
            }
            if seq != 1 {
                return Err(format!(
                    "a TLS 1.2 AES-GCM sending key that sealed {seq} records: the kernel's explicit nonces could meet rustls's"
                ));
            }
            Ok(u64::from_be_bytes(e).wrapping_add(1).to_be_bytes())
        };
        let info = |cipher_type| libc::tls_crypto_info {
            version,
            cipher_type,
        };
        Ok(match secret {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
                let (salt, rest) = iv.as_ref().split_at(4);
                CryptoInfo::Gcm128(libc::tls12_crypto_info_aes_gcm_128 {
                    info: info(libc::TLS_CIPHER_AES_GCM_128),
                    iv: gcm_iv(rest)?,
                    key: key
                        .as_ref()
                        .try_into()
                        .map_err(|_| "an AES-128 key not of 16 bytes")?,
                    salt: salt.try_into().expect("4 bytes"),
                    rec_seq,
                })
            }
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
                let (salt, rest) = iv.as_ref().split_at(4);
                CryptoInfo::Gcm256(libc::tls12_crypto_info_aes_gcm_256 {
                    info: info(libc::TLS_CIPHER_AES_GCM_256),
                    iv: gcm_iv(rest)?,
                    key: key
                        .as_ref()
                        .try_into()
                        .map_err(|_| "an AES-256 key not of 32 bytes")?,
                    salt: salt.try_into().expect("4 bytes"),
                    rec_seq,
                })
            }
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                CryptoInfo::Chacha(libc::tls12_crypto_info_chacha20_poly1305 {
                    info: info(libc::TLS_CIPHER_CHACHA20_POLY1305),
                    iv: iv
                        .as_ref()
                        .try_into()
                        .map_err(|_| "a ChaCha20 iv not of 12 bytes")?,
                    key: key
                        .as_ref()
                        .try_into()
                        .map_err(|_| "a ChaCha20 key not of 32 bytes")?,
                    salt: [],
                    rec_seq,
                })
            }
            _ => return Err("no kernel TLS for this cipher suite".into()),
        })
    }

    /// The bytes `setsockopt` takes.
    fn bytes(&self) -> (*const libc::c_void, usize) {
        fn raw<T>(t: &T) -> (*const libc::c_void, usize) {
            ((t as *const T).cast(), std::mem::size_of::<T>())
        }
        match self {
            CryptoInfo::Gcm128(i) => raw(i),
            CryptoInfo::Gcm256(i) => raw(i),
            CryptoInfo::Chacha(i) => raw(i),
        }
    }

    /// Gives the key to the socket's kernel TLS, `dir` `TLS_RX` or `TLS_TX`.
    fn install(&self, fd: RawFd, dir: libc::c_int) -> std::io::Result<()> {
        let (ptr, len) = self.bytes();
        // SAFETY: `ptr` points at a plain struct of `len` bytes that lives
        // through the call; the kernel copies it.
        let r = unsafe { libc::setsockopt(fd, libc::SOL_TLS, dir, ptr, len as libc::socklen_t) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for CryptoInfo {
    fn drop(&mut self) {
        // The key is not left in this value's memory once the kernel has
        // it (moves of the value may have left copies on the stack).
        fn wipe<T>(t: &mut T) {
            let p = (t as *mut T).cast::<u8>();
            for i in 0..std::mem::size_of::<T>() {
                // SAFETY: within `*t`, which is plain bytes and borrowed
                // mutably; volatile, so the write is kept although the
                // value is dropped right after.
                unsafe { std::ptr::write_volatile(p.add(i), 0) };
            }
        }
        match self {
            CryptoInfo::Gcm128(i) => wipe(i),
            CryptoInfo::Gcm256(i) => wipe(i),
            CryptoInfo::Chacha(i) => wipe(i),
        }
    }
}

/// An https session whose records the kernel opens and seals.
pub struct KernelSession {
    kernel: KernelConnection<ClientConnectionData>,
    limit: u64,
    /// Body bytes received and requests sent on the current keys: what
    /// the suite's limit on records is counted against (a full record is
    /// 16 KiB; a server that sends shorter ones renews its own key).
    received: u64,
    sent: u64,
    /// The kernel refused a renewed key: the session is over, and the
    /// loader's next ones stay in user space.
    broken: bool,
}

/// What [`KernelSession::control`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// A record with nothing for the range (a session ticket, a key
    /// update now taken): receive again.
    Again,
    /// The server's `close_notify`: nothing more will come.
    Closed,
}

/// Why the attach or the keys failed: `Off` (the kernel has no TLS for
/// this process) and `Key` (it refused this session's receiving key) leave
/// the session usable in user space, `Broken` does not (a key is in the
/// kernel already).
#[derive(Debug)]
pub enum KtlsRefusal {
    Off(String),
    Key(String),
    Broken(HttpFail),
}

/// Gives the keys `rx` and `tx` of a session to the kernel for the
/// connected socket `fd`.
pub fn hand_over(fd: RawFd, rx: &CryptoInfo, tx: &CryptoInfo) -> Result<(), KtlsRefusal> {
    if let Some(r) = REFUSED.get() {
        return Err(KtlsRefusal::Off(r.clone()));
    }
    // SAFETY: a NUL-free name of the given length; the kernel copies it.
    let r =
        unsafe { libc::setsockopt(fd, libc::SOL_TCP, libc::TCP_ULP, b"tls".as_ptr().cast(), 3) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        let why = match e.raw_os_error() {
            Some(libc::ENOENT) => {
                "the kernel has no TLS module (built without CONFIG_TLS, or `tls` not loadable)"
            }
            Some(libc::EPERM | libc::EACCES) => "refused by the container's seccomp profile",
            _ => "",
        };
        let msg = format!(
            "kernel TLS: TCP_ULP \"tls\" refused ({e}){}{why}; https records are opened in user space",
            if why.is_empty() { "" } else { ": " }
        );
        // What the kernel answers one connected socket for want of the
        // module or the right, it answers all; anything else (memory) may
        // pass.
        if matches!(
            e.raw_os_error(),
            Some(libc::ENOENT | libc::EPERM | libc::EACCES | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
        ) {
            let _ = REFUSED.set(msg.clone());
        }
        return Err(KtlsRefusal::Off(msg));
    }
    // The receiving key first: refused, nothing is in the kernel yet and
    // the session goes on in user space (an upper layer with no key
    // passes bytes through).
    if let Err(e) = rx.install(fd, libc::TLS_RX) {
        return Err(KtlsRefusal::Key(format!(
            "the kernel refused a receiving key ({e})"
        )));
    }
    if let Err(e) = tx.install(fd, libc::TLS_TX) {
        return Err(KtlsRefusal::Broken(HttpFail::new(
            FailKind::Reset,
            format!("the kernel refused a sending key ({e}) after taking the receiving key"),
        )));
    }
    Ok(())
}

impl KernelSession {
    /// rustls's side of a session whose keys the kernel took, with its
    /// suite's limit of records per key.
    pub fn new(kernel: KernelConnection<ClientConnectionData>) -> KernelSession {
        KernelSession {
            limit: limit(kernel.negotiated_cipher_suite()),
            kernel,
            received: 0,
            sent: 0,
            broken: false,
        }
    }

    /// Whether the kernel refused a renewed key of this session.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// A range's request went out and `bytes` of its answer came in.
    pub fn used(&mut self, bytes: u64) {
        self.received += bytes;
        self.sent += 1;
    }

    /// Whether the keys have carried half the records their suite allows
    /// (counted as full records): such a connection is not kept.
    pub fn worn(&self) -> bool {
        (self.received / (1 << 14)).max(self.sent) >= self.limit / 2
    }

    /// Reads the record that made a receive fail with `EIO` (not
    /// application data) and does what it says.
    pub fn control(&mut self, fd: RawFd, server: &str) -> Result<Control, HttpFail> {
        let mut buf = vec![0u8; tls_control::MAX_PLAIN + 256];
        let (n, typ) = recv_record(fd, &mut buf).map_err(|e| {
            HttpFail::new(FailKind::of_io(&e), format!("{server}: a TLS record: {e}"))
        })?;
        match tls_control::classify(ContentType::from(typ), &buf[..n], server)? {
            TlsRecord::Ignored => Ok(Control::Again),
            TlsRecord::Closed => Ok(Control::Closed),
            TlsRecord::KeyUpdate { reply } => {
                let version = self.kernel.protocol_version();
                let (seq, secret) = self
                    .kernel
                    .update_rx_secret()
                    .map_err(|e| HttpFail::new(FailKind::Tls, format!("TLS key update: {e}")))?;
                let info = CryptoInfo::new(version, seq, &secret, false)
                    .map_err(|e| HttpFail::new(FailKind::Tls, e))?;
                if let Err(e) = info.install(fd, libc::TLS_RX) {
                    self.broken = true;
                    return Err(renew_refused(server, e));
                }
                self.received = 0;
                if reply {
                    // RFC 8446 §4.6.3: ours (update_not_requested) under the
                    // old key, then the new key from sequence number 0.
                    send_record(fd, ContentType::Handshake, &[KEY_UPDATE, 0, 0, 1, 0]).map_err(
                        |e| {
                            HttpFail::new(
                                FailKind::of_io(&e),
                                format!("{server}: our TLS key update: {e}"),
                            )
                        },
                    )?;
                    let (seq, secret) = self.kernel.update_tx_secret().map_err(|e| {
                        HttpFail::new(FailKind::Tls, format!("TLS key update: {e}"))
                    })?;
                    let info = CryptoInfo::new(version, seq, &secret, true)
                        .map_err(|e| HttpFail::new(FailKind::Tls, e))?;
                    if let Err(e) = info.install(fd, libc::TLS_TX) {
                        self.broken = true;
                        return Err(renew_refused(server, e));
                    }
                    self.sent = 0;
                }
                Ok(Control::Again)
            }
        }
    }
}

/// The message of a kernel that would not take a renewed key: a reset, so
/// the range is retried on a fresh connection.
fn renew_refused(server: &str, e: std::io::Error) -> HttpFail {
    HttpFail::new(
        FailKind::Reset,
        format!(
            "{server} renewed its TLS keys and the kernel refused the new key ({e}; kernel TLS \
             renews keys from Linux 6.14): the rest is asked on a fresh connection, opened in user space"
        ),
    )
}

/// One record with its type (`recvmsg` with room for `TLS_GET_RECORD_TYPE`).
fn recv_record(fd: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, u8)> {
    // Room for one cmsg of one byte, aligned as cmsghdr is.
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: plain data; zeroed is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: `msg` points at the live `iov`, `buf` and `control` above.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel filled `msg`'s control buffer; the macros walk it
    // within `msg_controllen`.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        // SAFETY: `c` is a header within the control buffer.
        let h = unsafe { &*c };
        // SAFETY: CMSG_LEN is a pure size computation.
        let one = unsafe { libc::CMSG_LEN(1) } as usize;
        if h.cmsg_level == libc::SOL_TLS
            && h.cmsg_type == libc::TLS_GET_RECORD_TYPE
            && h.cmsg_len >= one
        {
            // SAFETY: a TLS_GET_RECORD_TYPE cmsg carries one byte.
            return Ok((n as usize, unsafe { *libc::CMSG_DATA(c) }));
        }
        // SAFETY: as above.
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "the kernel gave no record type",
    ))
}

/// Sends `payload` as one record of `typ` (`TLS_SET_RECORD_TYPE`).
fn send_record(fd: RawFd, typ: ContentType, payload: &[u8]) -> std::io::Result<()> {
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: plain data; zeroed is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure size computation.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(1) } as usize;
    // SAFETY: the control buffer is larger than one cmsg of one byte.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_TLS;
        (*c).cmsg_type = libc::TLS_SET_RECORD_TYPE;
        (*c).cmsg_len = libc::CMSG_LEN(1) as usize;
        *libc::CMSG_DATA(c) = u8::from(typ);
    }
    // SAFETY: `msg` points at the live `iov`, `payload` and `control`.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if n as usize != payload.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            "a TLS record sent in part",
        ));
    }
    Ok(())
}

/// The record-count limit of a suite (AES-GCM: 2^24.5 in TLS 1.3).
pub fn limit(suite: SupportedCipherSuite) -> u64 {
    match suite {
        SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
        SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::cipher::{AeadKey, Iv};

    fn aes256(key: u8, iv: u8) -> ConnectionTrafficSecrets {
        ConnectionTrafficSecrets::Aes256Gcm {
            key: AeadKey::from([key; 32]),
            iv: Iv::from([iv; 12]),
        }
    }

    #[test]
    fn aes_gcm_keys_take_the_kernels_layout_with_the_sequence_number_big_endian() {
        let iv: [u8; 12] = std::array::from_fn(|i| i as u8);
        let s = ConnectionTrafficSecrets::Aes256Gcm {
            key: AeadKey::from([7; 32]),
            iv: Iv::from(iv),
        };
        let CryptoInfo::Gcm256(i) =
            CryptoInfo::new(ProtocolVersion::TLSv1_3, 0x0102, &s, true).unwrap()
        else {
            panic!("not AES-GCM-256");
        };
        assert_eq!(i.info.version, libc::TLS_1_3_VERSION);
        assert_eq!(i.info.cipher_type, libc::TLS_CIPHER_AES_GCM_256);
        assert_eq!(i.salt, [0, 1, 2, 3]);
        assert_eq!(i.iv, [4, 5, 6, 7, 8, 9, 10, 11]);
        assert_eq!(i.key, [7; 32]);
        assert_eq!(i.rec_seq, [0, 0, 0, 0, 0, 0, 1, 2]);
        // TLS 1.2, receiving: the record's own explicit nonce is read, the
        // iv is E as given, at any sequence number.
        let CryptoInfo::Gcm256(i) =
            CryptoInfo::new(ProtocolVersion::TLSv1_2, u64::MAX, &aes256(9, 5), false).unwrap()
        else {
            panic!("not AES-GCM-256");
        };
        assert_eq!(i.info.version, libc::TLS_1_2_VERSION);
        assert_eq!(
            (i.key, i.salt, i.iv, i.rec_seq),
            ([9; 32], [5; 4], [5; 8], [0xff; 8])
        );
        // TLS 1.2, sending after the Finished (rustls's nonce E for
        // sequence number 0): the kernel's explicit nonces go on from E + 1,
        // big-endian with its carry, never E again in 2^64 records.
        let CryptoInfo::Gcm256(i) =
            CryptoInfo::new(ProtocolVersion::TLSv1_2, 1, &aes256(9, 5), true).unwrap()
        else {
            panic!("not AES-GCM-256");
        };
        assert_eq!(
            (i.salt, i.iv, i.rec_seq),
            ([5; 4], [5, 5, 5, 5, 5, 5, 5, 6], 1u64.to_be_bytes())
        );
        let CryptoInfo::Gcm256(i) =
            CryptoInfo::new(ProtocolVersion::TLSv1_2, 1, &aes256(9, 0xff), true).unwrap()
        else {
            panic!("not AES-GCM-256");
        };
        assert_eq!(i.iv, [0; 8], "E + 1 wraps");
        // More sealed than the Finished: refused, the session stays in user
        // space.
        let e = CryptoInfo::new(ProtocolVersion::TLSv1_2, 2, &aes256(9, 5), true)
            .err()
            .unwrap();
        assert!(e.contains("sealed 2 records"), "{e}");
        // An AES-128 secret whose key is not 16 bytes is refused by name
        // (rustls's keys from a handshake always are).
        let s = ConnectionTrafficSecrets::Aes128Gcm {
            key: AeadKey::from([7; 32]),
            iv: Iv::from(iv),
        };
        let e = CryptoInfo::new(ProtocolVersion::TLSv1_3, 0, &s, false)
            .err()
            .unwrap();
        assert!(e.contains("AES-128 key not of 16 bytes"), "{e}");
    }

    #[test]
    fn chacha_keys_have_the_whole_iv_and_no_salt_and_other_versions_are_refused() {
        let s = ConnectionTrafficSecrets::Chacha20Poly1305 {
            key: AeadKey::from([3; 32]),
            iv: Iv::from([4; 12]),
        };
        let CryptoInfo::Chacha(i) = CryptoInfo::new(ProtocolVersion::TLSv1_3, 1, &s, true).unwrap()
        else {
            panic!("not ChaCha20");
        };
        assert_eq!(i.info.cipher_type, libc::TLS_CIPHER_CHACHA20_POLY1305);
        assert_eq!(
            (i.key, i.iv, i.rec_seq),
            ([3; 32], [4; 12], [0, 0, 0, 0, 0, 0, 0, 1])
        );
        let e = CryptoInfo::new(ProtocolVersion::TLSv1_1, 0, &s, false)
            .err()
            .unwrap();
        assert!(e.contains("TLSv1_1"), "{e}");
    }
}
