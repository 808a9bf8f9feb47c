//! The records of a TLS session other than application data, once its
//! handshake is done, and what each says, for the records opened in user
//! space (`uring_tls.rs`) and those the kernel hands over (`ktls.rs`):
//! `close_notify` ends the stream, any other alert fails it by name, a
//! session ticket is dropped (each connection does a full handshake), a
//! key update renews the receiving key (and ours, when asked), anything
//! else is an error naming what came.

use rustls::{AlertDescription, ContentType};

use crate::net::http::{FailKind, HttpFail};

/// Plaintext of a full record (RFC 8446 §5.1, RFC 5246 §6.2.1).
pub const MAX_PLAIN: usize = 1 << 14;

/// What a record other than application data says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsRecord {
    Ignored,
    Closed,
    KeyUpdate { reply: bool },
}

/// Reads a record's type and plaintext as the kernel handed them over.
pub fn classify(typ: ContentType, payload: &[u8], server: &str) -> Result<TlsRecord, HttpFail> {
    match typ {
        ContentType::Alert => {
            alert(payload, server)?;
            Ok(TlsRecord::Closed)
        }
        ContentType::Handshake => {
            let (renew, reply) = post_handshake(payload, server)?;
            Ok(if renew {
                TlsRecord::KeyUpdate { reply }
            } else {
                TlsRecord::Ignored
            })
        }
        t => Err(HttpFail::new(
            FailKind::Protocol,
            format!("{server} sent a TLS record of type {t:?} where no data was due"),
        )),
    }
}

/// An alert's record: `close_notify` (Ok), or any other alert's name as
/// an error.
fn alert(payload: &[u8], server: &str) -> Result<(), HttpFail> {
    match payload {
        [_, 0] => Ok(()),
        [_, d] => Err(HttpFail::new(
            FailKind::Tls,
            format!(
                "{server} sent the TLS alert {:?}",
                AlertDescription::from(*d)
            ),
        )),
        _ => Err(HttpFail::new(
            FailKind::Tls,
            format!("{server} sent a malformed TLS alert"),
        )),
    }
}

/// Looks at the handshake messages of a record after the handshake:
/// returns whether the receiving key must be renewed (a key update) and
/// whether ours must be too (the server asked for it).
fn post_handshake(mut msgs: &[u8], server: &str) -> Result<(bool, bool), HttpFail> {
    const NEW_SESSION_TICKET: u8 = 4;
    let (mut renew, mut reply) = (false, false);
    while msgs.len() >= 4 {
        let len = usize::from(msgs[1]) << 16 | usize::from(msgs[2]) << 8 | usize::from(msgs[3]);
        let Some(body) = msgs.get(4..4 + len) else {
            break;
        };
        match msgs[0] {
            NEW_SESSION_TICKET => {}
            KEY_UPDATE if body == [0] => renew = true,
            KEY_UPDATE if body == [1] => (renew, reply) = (true, true),
            KEY_UPDATE => {
                return Err(HttpFail::new(
                    FailKind::Tls,
                    format!("{server} sent a malformed TLS key update"),
                ));
            }
            t => {
                return Err(HttpFail::new(
                    FailKind::Tls,
                    format!("{server} sent the TLS handshake message {t} after the handshake"),
                ));
            }
        }
        msgs = &msgs[4 + len..];
    }
    Ok((renew, reply))
}

/// A TLS 1.3 KeyUpdate handshake message's type.
pub const KEY_UPDATE: u8 = 24;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_other_than_data_are_read_for_what_they_say() {
        let s = "h:443";
        assert_eq!(
            classify(ContentType::Alert, &[1, 0], s).unwrap(),
            TlsRecord::Closed
        );
        let e = classify(ContentType::Alert, &[2, 20], s).unwrap_err();
        assert!(e.message.contains("BadRecordMac"), "{}", e.message);
        assert_eq!(e.kind, FailKind::Tls);
        assert!(
            classify(ContentType::Alert, &[1], s)
                .unwrap_err()
                .message
                .contains("malformed")
        );
        // A session ticket (type 4) with its 24-bit length.
        assert_eq!(
            classify(ContentType::Handshake, &[4, 0, 0, 2, 9, 9], s).unwrap(),
            TlsRecord::Ignored
        );
        assert_eq!(
            classify(ContentType::Handshake, &[24, 0, 0, 1, 0], s).unwrap(),
            TlsRecord::KeyUpdate { reply: false }
        );
        assert_eq!(
            classify(ContentType::Handshake, &[24, 0, 0, 1, 1], s).unwrap(),
            TlsRecord::KeyUpdate { reply: true }
        );
        assert!(
            classify(ContentType::Handshake, &[24, 0, 0, 1, 7], s)
                .unwrap_err()
                .message
                .contains("malformed")
        );
        assert!(
            classify(ContentType::Handshake, &[1, 0, 0, 0], s)
                .unwrap_err()
                .message
                .contains("message 1")
        );
        let e = classify(ContentType::ApplicationData, b"data", s).unwrap_err();
        assert_eq!(e.kind, FailKind::Protocol);
        assert!(e.message.contains("ApplicationData"), "{}", e.message);
        assert_eq!(
            classify(ContentType::from(99), b"", s).unwrap_err().kind,
            FailKind::Protocol
        );
    }
}
