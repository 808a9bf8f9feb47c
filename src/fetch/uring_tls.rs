//! TLS for the ranged GETs of `uring_http.rs`, on the same io_uring state
//! machine as plain HTTP: this file owns a connection's TLS state; the
//! socket operations stay in `uring_http.rs`.
//!
//! - The handshake runs through rustls's unbuffered client
//!   ([`UnbufferedClientConnection`]): io_uring receives the server's
//!   records into a small per-connection buffer, rustls processes them in
//!   place and hands back the records to send, which io_uring sends.
//! - Once the handshake is done the traffic keys are taken out of rustls with
//!   `dangerous_into_kernel_connection` (the hand-over kernel TLS uses) and
//!   the records are opened here, in place, with rustls's own AEAD code
//!   ([`MessageDecrypter`]), wherever io_uring received them. rustls 0.23's
//!   `ReadTraffic` would copy every record's plaintext into a `Vec` of its
//!   own (`received_plaintext`), a copy and an allocation per 16 KiB record;
//!   opening the records ourselves spares both.
//! - The response head is opened in the small buffer. The body's ciphertext
//!   is received straight into the destination chunk of the arena and
//!   decrypted there; a record's plaintext sits after its 5-byte header (and
//!   TLS 1.2's 8-byte explicit nonce), so right after each record is
//!   decrypted its plaintext is moved down over the gap the previous
//!   records' headers and tags left (a `memmove` of bytes still in cache).
//!   Those moved bytes are counted as copied. The last record of a range,
//!   whose ciphertext is longer than the room left in the destination,
//!   goes through the small buffer and is copied (counted too).
//!
//! Post-handshake messages: TLS 1.3 session tickets are dropped (each
//! connection does a full handshake), a key update from the server renews
//! the receiving key through rustls's [`KernelConnection`]; one that asks
//! us to renew ours too is answered with our own key update, sent before
//! the next request, and the sending key renewed; a renegotiation or any
//! alert other than `close_notify` fails the range with a named error.

use std::sync::Arc;

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::crypto::cipher::{
    AeadKey, InboundOpaqueMessage, Iv, MessageDecrypter, MessageEncrypter, OutboundChunks,
    OutboundPlainMessage,
};
use rustls::kernel::KernelConnection;
use rustls::pki_types::ServerName;
use rustls::unbuffered::{ConnectionState, EncodeError};
use rustls::{
    ClientConfig, ConnectionTrafficSecrets, ContentType, ProtocolVersion, SupportedCipherSuite,
};

use super::ktls::{self, CryptoInfo, KernelSession};
use super::tls_control::{self, KEY_UPDATE, MAX_PLAIN, TlsRecord};
use crate::net::http::{FailKind, HttpFail};

/// A record's header: content type, version, length.
pub const HEADER: usize = 5;
/// The longest record on the wire: a full plaintext plus the most expansion
/// TLS 1.2 allows (2048; TLS 1.3 allows 256).
pub const MAX_RECORD: usize = HEADER + MAX_PLAIN + 2048;
/// The small buffer's size at first: one whole record, which is what the
/// head and the end of a range need, and a server's first flight with a
/// certificate chain of common size (a few KiB).
const FIRST_BUF: usize = MAX_RECORD;
/// rustls joins a handshake message spread over records in the buffer, so a
/// whole flight must fit: the buffer grows up to this for long chains.
const MAX_BUF: usize = 256 << 10;

/// What the handshake needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsNext {
    /// Send `out[out_sent..]`, then call [`TlsConn::handshake`] again.
    Send,
    /// Receive into [`TlsConn::recv_room`], then call it again.
    Recv,
    /// The session is open: requests can be sealed and records opened.
    Open,
}

/// What one opened record held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// Application data at `start..start + len` of the buffer given.
    Data { start: usize, len: usize },
    /// A record with nothing for us (a session ticket, a key update).
    Nothing,
    /// The server's `close_notify`: nothing more will come.
    Closed,
}

/// A connection's TLS state and its small buffers.
pub struct TlsConn {
    state: State,
    /// `host:port`, for messages.
    server: String,
    /// Received bytes not yet processed are `inbuf[in_start..in_len]`.
    inbuf: Vec<u8>,
    in_start: usize,
    in_len: usize,
    /// Handshake records to send, and how many of them are sent.
    pub out: Vec<u8>,
    pub out_sent: usize,
    /// The session's keys are kept, as the kernel takes them, for a hand
    /// over to kernel TLS (`ktls.rs`).
    for_kernel: bool,
}

enum State {
    Handshake(Box<UnbufferedClientConnection>),
    Open(Box<Session>),
    /// The handshake failed half-way through the hand-over.
    Broken,
}

/// An open session: the traffic keys, out of rustls, and their sequence
/// numbers.
struct Session {
    dec: Box<dyn MessageDecrypter>,
    enc: Box<dyn MessageEncrypter>,
    rx_seq: u64,
    tx_seq: u64,
    /// rustls's side of the session after the hand-over: it derives the
    /// next receiving key on a key update.
    kernel: KernelConnection<ClientConnectionData>,
    /// Records per key the suite allows (AES-GCM: 2^24.5 in TLS 1.3).
    limit: u64,
    /// The server asked for a key update in both directions: ours is
    /// sent, and our sending key renewed, before the next request.
    update_owed: bool,
    /// The receiving and sending keys at the session's first records, as
    /// the kernel takes them, until the session is handed over or opens a
    /// record here.
    kernel_keys: Option<(CryptoInfo, CryptoInfo)>,
}

impl Session {
    /// Seals one record of `typ` holding `payload` with the sending key at
    /// the next sequence number, onto `out`.
    fn seal_record(
        &mut self,
        typ: ContentType,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), HttpFail> {
        let msg = OutboundPlainMessage {
            typ,
            version: ProtocolVersion::TLSv1_2,
            payload: OutboundChunks::Single(payload),
        };
        let rec = self
            .enc
            .encrypt(msg, self.tx_seq)
            .map_err(|e| tls_fail("TLS encrypt", e))?;
        self.tx_seq += 1;
        out.extend_from_slice(&rec.encode());
        Ok(())
    }
}

fn tls_fail(what: &str, e: impl std::fmt::Display) -> HttpFail {
    HttpFail::new(FailKind::Tls, format!("{what}: {e}"))
}

impl TlsConn {
    /// A client for `host`, before the handshake; `for_kernel`: its keys
    /// are kept for kernel TLS ([`TlsConn::kernel_keys`]).
    pub fn new(
        config: Arc<ClientConfig>,
        host: &str,
        port: u16,
        for_kernel: bool,
    ) -> Result<TlsConn, HttpFail> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| tls_fail(&format!("`{host}` as a TLS server name"), e))?;
        let conn =
            UnbufferedClientConnection::new(config, name).map_err(|e| tls_fail("TLS set-up", e))?;
        Ok(TlsConn {
            state: State::Handshake(Box::new(conn)),
            server: format!("{host}:{port}"),
            inbuf: vec![0; FIRST_BUF],
            in_start: 0,
            in_len: 0,
            out: Vec::new(),
            out_sent: 0,
            for_kernel,
        })
    }

    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open(_))
    }

    /// Drives the handshake with what was received so far.
    pub fn handshake(&mut self) -> Result<TlsNext, HttpFail> {
        loop {
            let State::Handshake(conn) = &mut self.state else {
                return Ok(TlsNext::Open);
            };
            // A server that answers a ClientHello in plain HTTP: said so,
            // rather than rustls's "corrupt message".
            let plain_http = self.inbuf[self.in_start..self.in_len].starts_with(b"HTTP/");
            let status = conn.process_tls_records(&mut self.inbuf[self.in_start..self.in_len]);
            let discard = status.discard;
            let state = match status.state {
                Ok(s) => s,
                Err(e) if plain_http => {
                    return Err(HttpFail::new(
                        FailKind::Tls,
                        format!(
                            "{} answered in plain HTTP, not TLS (is it an http:// server?): {e}",
                            self.server
                        ),
                    ));
                }
                Err(e) => return Err(tls_fail(&format!("TLS handshake with {}", self.server), e)),
            };
            let next = match state {
                ConnectionState::EncodeTlsData(mut enc) => {
                    let at = self.out.len();
                    self.out.resize(at + 4096, 0);
                    let n = match enc.encode(&mut self.out[at..]) {
                        Ok(n) => n,
                        Err(EncodeError::InsufficientSize(s)) => {
                            self.out.resize(at + s.required_size, 0);
                            enc.encode(&mut self.out[at..])
                                .map_err(|e| tls_fail("TLS handshake", e))?
                        }
                        Err(e) => return Err(tls_fail("TLS handshake", e)),
                    };
                    self.out.truncate(at + n);
                    None
                }
                ConnectionState::TransmitTlsData(t) => {
                    // The records are in `out` and go out before rustls is
                    // asked for anything else.
                    t.done();
                    Some(TlsNext::Send)
                }
                ConnectionState::BlockedHandshake => Some(TlsNext::Recv),
                ConnectionState::WriteTraffic(_) => Some(TlsNext::Open),
                ConnectionState::PeerClosed | ConnectionState::Closed => {
                    return Err(HttpFail::new(
                        FailKind::Reset,
                        format!("{} closed TLS during the handshake", self.server),
                    ));
                }
                other => {
                    return Err(HttpFail::new(
                        FailKind::Protocol,
                        format!("{} sent data before the request ({other:?})", self.server),
                    ));
                }
            };
            self.in_start += discard;
            match next {
                None => {}
                Some(TlsNext::Send) => return Ok(TlsNext::Send),
                Some(TlsNext::Recv) => {
                    self.make_room(1)?;
                    return Ok(TlsNext::Recv);
                }
                Some(TlsNext::Open) => {
                    self.open_session()?;
                    return Ok(TlsNext::Open);
                }
            }
        }
    }

    /// Takes the traffic keys out of rustls.
    fn open_session(&mut self) -> Result<(), HttpFail> {
        let State::Handshake(conn) = std::mem::replace(&mut self.state, State::Broken) else {
            return Ok(());
        };
        let (secrets, kernel) = conn
            .dangerous_into_kernel_connection()
            .map_err(|e| tls_fail("TLS session hand-over", e))?;
        let suite = kernel.negotiated_cipher_suite();
        let (rx_seq, rx) = secrets.rx;
        let (tx_seq, tx) = secrets.tx;
        let limit = ktls::limit(suite);
        // A suite or version the kernel has no layout for, or nonces it
        // could not go on from (`CryptoInfo::new`), stay here.
        let kernel_keys = self
            .for_kernel
            .then(|| {
                let v = kernel.protocol_version();
                Some((
                    CryptoInfo::new(v, rx_seq, &rx, false).ok()?,
                    CryptoInfo::new(v, tx_seq, &tx, true).ok()?,
                ))
            })
            .flatten();
        self.state = State::Open(Box::new(Session {
            dec: decrypter(suite, rx)?,
            enc: encrypter(suite, tx)?,
            rx_seq,
            tx_seq,
            kernel,
            limit,
            update_owed: false,
            kernel_keys,
        }));
        Ok(())
    }

    /// The session's keys as the kernel takes them, while it can still be
    /// handed over: kept for it, open, nothing received past the handshake
    /// and no record opened or sealed here yet.
    pub fn kernel_keys(&self) -> Option<&(CryptoInfo, CryptoInfo)> {
        match &self.state {
            State::Open(s) if self.pending() == 0 && !s.update_owed => s.kernel_keys.as_ref(),
            _ => None,
        }
    }

    /// rustls's side of the session, once the kernel has taken its keys
    /// ([`TlsConn::kernel_keys`]); the connection is spent here.
    pub fn into_kernel(self) -> Option<KernelSession> {
        match self.state {
            State::Open(s) => Some(KernelSession::new(s.kernel)),
            _ => None,
        }
    }

    /// Encrypts `plain` (a request) into records.
    pub fn seal(&mut self, plain: &[u8]) -> Result<Vec<u8>, HttpFail> {
        let State::Open(s) = &mut self.state else {
            return Err(HttpFail::new(
                FailKind::Tls,
                "TLS: a request before the handshake",
            ));
        };
        s.kernel_keys = None;
        let mut out = Vec::with_capacity(plain.len() + 64);
        if s.update_owed {
            // RFC 8446 §4.6.3: our KeyUpdate (update_not_requested), sealed
            // with the old key, before any more application data; then the
            // new key, from sequence number 0.
            s.seal_record(ContentType::Handshake, &[KEY_UPDATE, 0, 0, 1, 0], &mut out)?;
            let (seq, secret) = s
                .kernel
                .update_tx_secret()
                .map_err(|e| tls_fail("TLS key update", e))?;
            s.enc = encrypter(s.kernel.negotiated_cipher_suite(), secret)?;
            s.tx_seq = seq;
            s.update_owed = false;
        }
        for piece in plain.chunks(MAX_PLAIN) {
            s.seal_record(ContentType::ApplicationData, piece, &mut out)?;
        }
        Ok(out)
    }

    /// Whether the keys have carried half the records their suite allows:
    /// such a connection is not kept for another range.
    pub fn worn(&self) -> bool {
        match &self.state {
            State::Open(s) => s.rx_seq.max(s.tx_seq) >= s.limit / 2,
            _ => true,
        }
    }

    /// Opens the record at the start of `buf` in place, when it is whole;
    /// returns what it held and its length on the wire.
    pub fn open(&mut self, buf: &mut [u8]) -> Result<Option<(Opened, usize)>, HttpFail> {
        let Some(total) = record_len(buf)? else {
            return Ok(None);
        };
        if buf.len() < total {
            return Ok(None);
        }
        let State::Open(s) = &mut self.state else {
            return Err(HttpFail::new(
                FailKind::Tls,
                "TLS: a record before the handshake",
            ));
        };
        s.kernel_keys = None;
        let typ = ContentType::from(buf[0]);
        let version = ProtocolVersion::from(u16::from_be_bytes([buf[1], buf[2]]));
        let payload = &mut buf[HEADER..total];
        let base = payload.as_ptr() as usize;
        let plain = s
            .dec
            .decrypt(InboundOpaqueMessage::new(typ, version, payload), s.rx_seq)
            .map_err(|e| tls_fail(&format!("a TLS record from {}", self.server), e))?;
        s.rx_seq += 1;
        let start = HEADER + (plain.payload.as_ptr() as usize - base);
        let len = plain.payload.len();
        let opened = match plain.typ {
            ContentType::ApplicationData => Opened::Data { start, len },
            t => match tls_control::classify(t, plain.payload, &self.server)? {
                TlsRecord::Ignored => Opened::Nothing,
                TlsRecord::Closed => Opened::Closed,
                TlsRecord::KeyUpdate { reply } => {
                    s.update_owed |= reply;
                    let (seq, secret) = s
                        .kernel
                        .update_rx_secret()
                        .map_err(|e| tls_fail("TLS key update", e))?;
                    s.dec = decrypter(s.kernel.negotiated_cipher_suite(), secret)?;
                    s.rx_seq = seq;
                    Opened::Nothing
                }
            },
        };
        Ok(Some((opened, total)))
    }

    /// Opens the next whole record of the small buffer; its data, if any,
    /// is `self.buffered(start, len)`.
    pub fn open_buffered(&mut self) -> Result<Option<Opened>, HttpFail> {
        let mut buf = std::mem::take(&mut self.inbuf);
        let r = self.open(&mut buf[self.in_start..self.in_len]);
        self.inbuf = buf;
        let Some((opened, total)) = r? else {
            return Ok(None);
        };
        let at = self.in_start;
        self.in_start += total;
        Ok(Some(match opened {
            Opened::Data { start, len } => Opened::Data {
                start: at + start,
                len,
            },
            o => o,
        }))
    }

    /// Bytes of the small buffer (after `open_buffered`'s `Data`).
    pub fn buffered(&self, start: usize, len: usize) -> &[u8] {
        &self.inbuf[start..start + len]
    }

    /// Opens the whole records of `dest[*got..end]` in place and moves each
    /// one's plaintext down to `dest[*got..]` right after it is decrypted;
    /// the partial record left is moved down after them. Returns the bytes
    /// moved and whether the server closed.
    pub fn open_in_place(
        &mut self,
        dest: &mut [u8],
        got: &mut usize,
        end: usize,
    ) -> Result<Placed, HttpFail> {
        let mut at = *got;
        let mut placed = Placed::default();
        while let Some((opened, total)) = self.open(&mut dest[at..end])? {
            match opened {
                Opened::Data { start, len } => {
                    // The gap before this plaintext is the headers and tags
                    // of the records before: closed while the bytes are hot.
                    dest.copy_within(at + start..at + start + len, *got);
                    *got += len;
                    placed.moved += len;
                }
                Opened::Nothing => {}
                Opened::Closed => placed.closed = true,
            }
            at += total;
            if placed.closed {
                break;
            }
        }
        if at != *got {
            dest.copy_within(at..end, *got);
            placed.moved += end - at;
        }
        placed.partial = end - at;
        Ok(placed)
    }

    /// Received bytes not yet opened, in the small buffer.
    pub fn pending(&self) -> usize {
        self.in_len - self.in_start
    }

    /// The length on the wire of the next record in the small buffer, once
    /// its header is in.
    pub fn next_len(&self) -> Result<Option<usize>, HttpFail> {
        record_len(&self.inbuf[self.in_start..self.in_len])
    }

    /// Moves the pending bytes of the small buffer to `to`.
    pub fn drain_to(&mut self, to: &mut [u8]) -> usize {
        let n = self.pending();
        to[..n].copy_from_slice(&self.inbuf[self.in_start..self.in_len]);
        self.in_start = 0;
        self.in_len = 0;
        n
    }

    /// Puts bytes received elsewhere (a partial record) in the small
    /// buffer, in front of what comes next.
    pub fn refill(&mut self, from: &[u8]) -> Result<(), HttpFail> {
        self.make_room(from.len())?;
        self.inbuf[self.in_len..self.in_len + from.len()].copy_from_slice(from);
        self.in_len += from.len();
        Ok(())
    }

    /// Makes at least `want` bytes of room after the pending bytes.
    fn make_room(&mut self, want: usize) -> Result<(), HttpFail> {
        if self.in_start > 0 {
            self.inbuf.copy_within(self.in_start..self.in_len, 0);
            self.in_len -= self.in_start;
            self.in_start = 0;
        }
        if self.inbuf.len() - self.in_len < want {
            let size = (self.in_len + want).next_power_of_two();
            if size > MAX_BUF {
                return Err(HttpFail::new(
                    FailKind::Tls,
                    format!("{} sent a TLS flight over {MAX_BUF} bytes", self.server),
                ));
            }
            self.inbuf.resize(size, 0);
        }
        Ok(())
    }

    /// Where the next receive into the small buffer goes: up to `want`
    /// bytes (at least one).
    pub fn recv_room(&mut self, want: usize) -> Result<(*mut u8, usize), HttpFail> {
        let want = want.max(1);
        self.make_room(want)?;
        let room = (self.inbuf.len() - self.in_len).min(want);
        // SAFETY: in_len + room <= inbuf.len().
        Ok((unsafe { self.inbuf.as_mut_ptr().add(self.in_len) }, room))
    }

    /// `n` bytes arrived at `recv_room`.
    pub fn received(&mut self, n: usize) {
        self.in_len += n;
    }
}

/// What [`TlsConn::open_in_place`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// Bytes moved down (plaintext, and the partial record at the end).
    pub moved: usize,
    /// Bytes of a partial record now right after the plaintext.
    pub partial: usize,
    /// The server sent `close_notify`.
    pub closed: bool,
}

/// The length on the wire of the record at the start of `buf`, once its
/// header is in.
pub fn record_len(buf: &[u8]) -> Result<Option<usize>, HttpFail> {
    if buf.len() < HEADER {
        return Ok(None);
    }
    let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if HEADER + len > MAX_RECORD {
        return Err(HttpFail::new(
            FailKind::Tls,
            format!("a TLS record of {len} bytes, over TLS's limit"),
        ));
    }
    Ok(Some(HEADER + len))
}

fn key_iv(secret: ConnectionTrafficSecrets) -> Result<(AeadKey, Iv, bool), HttpFail> {
    match secret {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes256Gcm { key, iv } => Ok((key, iv, true)),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => Ok((key, iv, false)),
        _ => Err(HttpFail::new(FailKind::Tls, "TLS: an unsupported cipher")),
    }
}

fn decrypter(
    suite: SupportedCipherSuite,
    secret: ConnectionTrafficSecrets,
) -> Result<Box<dyn MessageDecrypter>, HttpFail> {
    let (key, iv, gcm) = key_iv(secret)?;
    Ok(match suite {
        SupportedCipherSuite::Tls13(s) => s.aead_alg.decrypter(key, iv),
        // TLS 1.2 GCM takes the 4-byte implicit salt; the extracted iv is
        // the salt followed by the first explicit nonce.
        SupportedCipherSuite::Tls12(s) if gcm => s.aead_alg.decrypter(key, &iv.as_ref()[..4]),
        SupportedCipherSuite::Tls12(s) => s.aead_alg.decrypter(key, iv.as_ref()),
    })
}

fn encrypter(
    suite: SupportedCipherSuite,
    secret: ConnectionTrafficSecrets,
) -> Result<Box<dyn MessageEncrypter>, HttpFail> {
    let (key, iv, gcm) = key_iv(secret)?;
    Ok(match suite {
        SupportedCipherSuite::Tls13(s) => s.aead_alg.encrypter(key, iv),
        SupportedCipherSuite::Tls12(s) if gcm => {
            let iv = iv.as_ref();
            s.aead_alg.encrypter(key, &iv[..4], &iv[4..])
        }
        SupportedCipherSuite::Tls12(s) => s.aead_alg.encrypter(key, iv.as_ref(), &[]),
    })
}
