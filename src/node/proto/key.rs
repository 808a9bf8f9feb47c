//! A batch's key: which engine (the socket it listens on and its id, drawn
//! at random when it starts), which batch, and the batch's capability, a
//! random number the engine drew for it. A process that shows the key may
//! keep the batch for itself (`Request::Claim`); a key of another engine
//! (one that ran at the socket before), of a batch gone, or with another
//! capability is refused by name. The key is text (JSON), handed from the
//! process that took the batch to the one that keeps it however they talk
//! (a pickled item of a DataLoader, a pipe).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// An engine's identity: 128 random bits, drawn when it starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct EngineId(pub u128);

/// A batch's capability: 64 random bits, drawn when the engine hands it out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Cap(pub u64);

fn random_bytes(out: &mut [u8]) -> std::io::Result<()> {
    getrandom::fill(out).map_err(|e| std::io::Error::other(format!("getrandom: {e}")))
}

impl EngineId {
    pub fn random() -> std::io::Result<EngineId> {
        let mut b = [0u8; 16];
        random_bytes(&mut b)?;
        Ok(EngineId(u128::from_le_bytes(b)))
    }
}

impl Cap {
    pub fn random() -> std::io::Result<Cap> {
        let mut b = [0u8; 8];
        random_bytes(&mut b)?;
        Ok(Cap(u64::from_le_bytes(b)))
    }
}

impl std::fmt::Display for EngineId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Both travel as fixed-width hex: exact in any JSON reader (a number past
/// 2^53 is not), and the width is checked.
macro_rules! hex_serde {
    ($t:ident, $inner:ty, $width:literal) => {
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&format!("{:0w$x}", self.0, w = $width))
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                if text.len() != $width || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(serde::de::Error::custom(format!(
                        "expected {} hex digits, got {text:?}",
                        $width
                    )));
                }
                <$inner>::from_str_radix(&text, 16)
                    .map($t)
                    .map_err(serde::de::Error::custom)
            }
        }
    };
}

hex_serde!(EngineId, u128, 32);
hex_serde!(Cap, u64, 16);

/// A batch's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Key {
    /// The engine's socket.
    pub socket: PathBuf,
    pub engine: EngineId,
    /// The batch's number in the engine (unique for the engine's life).
    pub batch: u64,
    pub cap: Cap,
}

impl Key {
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).expect("a key serializes")
    }

    /// A key from its text, or why it is none.
    pub fn parse(text: &str) -> Result<Key, String> {
        if text.len() > 8192 {
            return Err(format!("not a batch key: {} bytes of text", text.len()));
        }
        serde_json::from_str(text).map_err(|e| {
            format!("not a batch key (from ringfeed_batch_ship or ringfeed_batch_node_key): {e}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cross_as_text_and_broken_ones_say_why() {
        let k = Key {
            socket: "/run/x.sock".into(),
            engine: EngineId::random().unwrap(),
            batch: 12,
            cap: Cap::random().unwrap(),
        };
        assert_eq!(Key::parse(&k.to_text()).unwrap(), k);
        assert_ne!(EngineId::random().unwrap(), k.engine, "drawn at random");
        for bad in [
            "garbage",
            "{}",
            "{\"socket\":\"/x\",\"engine\":\"00\",\"batch\":1,\"cap\":\"0000000000000000\"}",
            "{\"socket\":\"/x\",\"engine\":\"0000000000000000000000000000000g\",\"batch\":1,\"cap\":\"0000000000000000\"}",
        ] {
            let e = Key::parse(bad).unwrap_err();
            assert!(e.contains("not a batch key"), "{bad}: {e}");
        }
        assert!(
            Key::parse(&"x".repeat(10_000))
                .unwrap_err()
                .contains("bytes of text")
        );
    }
}
