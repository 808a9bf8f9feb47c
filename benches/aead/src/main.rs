//! Decryption speed of one core, per provider and cipher, on TLS 1.3's
//! largest record (16 KiB of plaintext): what the HTTPS receive path pays
//! per byte for the cipher alone. Each (provider, cipher) opens the same
//! sealed record in place, over and over, for `--seconds` per round; the
//! rounds rotate over the contenders and the medians are printed, with each
//! provider's ratio to ring's on the same cipher.
//!
//!     benches/aead.sh [--seconds 1] [--rounds 5]

use std::time::{Duration, Instant};

const RECORD: usize = 16 * 1024;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Provider {
    Ring,
    AwsLc,
}

#[derive(Clone, Copy, Debug)]
enum Cipher {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

impl Cipher {
    fn name(self) -> &'static str {
        match self {
            Cipher::Aes128Gcm => "AES-128-GCM",
            Cipher::Aes256Gcm => "AES-256-GCM",
            Cipher::Chacha20Poly1305 => "CHACHA20-POLY1305",
        }
    }
    fn key_len(self) -> usize {
        match self {
            Cipher::Aes128Gcm => 16,
            _ => 32,
        }
    }
}

/// Opens one sealed record in place `n` times (the ciphertext restored from
/// `sealed` before each, as a receive lands new bytes); returns the time.
trait Opener {
    fn open(&self, sealed: &[u8], buf: &mut [u8], n: u64) -> Duration;
}

struct RingKey(ring::aead::LessSafeKey);
struct AwsKey(aws_lc_rs::aead::LessSafeKey);

impl Opener for RingKey {
    fn open(&self, sealed: &[u8], buf: &mut [u8], n: u64) -> Duration {
        use ring::aead::{Aad, Nonce};
        let start = Instant::now();
        for _ in 0..n {
            buf.copy_from_slice(sealed);
            let nonce = Nonce::assume_unique_for_key([7; 12]);
            let plain = self
                .0
                .open_in_place(nonce, Aad::from([23u8, 3, 3, 0x40, 0x11]), buf)
                .expect("tag");
            std::hint::black_box(plain);
        }
        start.elapsed()
    }
}

impl Opener for AwsKey {
    fn open(&self, sealed: &[u8], buf: &mut [u8], n: u64) -> Duration {
        use aws_lc_rs::aead::{Aad, Nonce};
        let start = Instant::now();
        for _ in 0..n {
            buf.copy_from_slice(sealed);
            let nonce = Nonce::assume_unique_for_key([7; 12]);
            let plain = self
                .0
                .open_in_place(nonce, Aad::from([23u8, 3, 3, 0x40, 0x11]), buf)
                .expect("tag");
            std::hint::black_box(plain);
        }
        start.elapsed()
    }
}

/// The key and a record sealed with it, for `provider` and `cipher`.
fn setup(provider: Provider, cipher: Cipher) -> (Box<dyn Opener>, Vec<u8>) {
    let key = vec![0x42u8; cipher.key_len()];
    let mut record: Vec<u8> = (0..RECORD).map(|i| (i * 31 % 251) as u8).collect();
    match provider {
        Provider::Ring => {
            use ring::aead::*;
            let alg = match cipher {
                Cipher::Aes128Gcm => &AES_128_GCM,
                Cipher::Aes256Gcm => &AES_256_GCM,
                Cipher::Chacha20Poly1305 => &CHACHA20_POLY1305,
            };
            let k = LessSafeKey::new(UnboundKey::new(alg, &key).unwrap());
            k.seal_in_place_append_tag(
                Nonce::assume_unique_for_key([7; 12]),
                Aad::from([23u8, 3, 3, 0x40, 0x11]),
                &mut record,
            )
            .unwrap();
            (Box::new(RingKey(k)), record)
        }
        Provider::AwsLc => {
            use aws_lc_rs::aead::*;
            let alg = match cipher {
                Cipher::Aes128Gcm => &AES_128_GCM,
                Cipher::Aes256Gcm => &AES_256_GCM,
                Cipher::Chacha20Poly1305 => &CHACHA20_POLY1305,
            };
            let k = LessSafeKey::new(UnboundKey::new(alg, &key).unwrap());
            k.seal_in_place_append_tag(
                Nonce::assume_unique_for_key([7; 12]),
                Aad::from([23u8, 3, 3, 0x40, 0x11]),
                &mut record,
            )
            .unwrap();
            (Box::new(AwsKey(k)), record)
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let mut seconds = 1.0f64;
    let mut rounds = 5usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--seconds" => seconds = value().parse().expect("--seconds: a number"),
            "--rounds" => rounds = value().parse().expect("--rounds: a number"),
            other => panic!("unknown argument {other} (--seconds S, --rounds N)"),
        }
    }
    let ciphers = [
        Cipher::Aes128Gcm,
        Cipher::Aes256Gcm,
        Cipher::Chacha20Poly1305,
    ];
    let providers = [Provider::Ring, Provider::AwsLc];
    let contenders: Vec<(Provider, Cipher)> = ciphers
        .iter()
        .flat_map(|&c| providers.iter().map(move |&p| (p, c)))
        .collect();
    let mut results = vec![Vec::new(); contenders.len()];
    for round in 0..rounds {
        for k in 0..contenders.len() {
            let i = (k + round) % contenders.len();
            let (provider, cipher) = contenders[i];
            let (opener, sealed) = setup(provider, cipher);
            let mut buf = sealed.clone();
            // Calibrate: as many records as fill the time asked for.
            let probe = opener.open(&sealed, &mut buf, 2000);
            let n = ((seconds / probe.as_secs_f64()) * 2000.0).max(2000.0) as u64;
            let t = opener.open(&sealed, &mut buf, n);
            results[i].push(n as f64 * RECORD as f64 / t.as_secs_f64() / 1e9);
        }
    }
    println!(
        "open in place of a {RECORD}-byte record, one core, medians of {rounds} rounds of {seconds} s"
    );
    println!("(each open first restores the ciphertext: one 16 KiB copy, as a receive lands it)");
    println!(
        "{:<20} {:<8} {:>20} {:>10} {:>8}",
        "cipher", "provider", "GB/s [rounds]", "CPU-s/GB", "/ ring"
    );
    for c in ciphers {
        let ring_i = contenders
            .iter()
            .position(|&(p, cc)| p == Provider::Ring && cc.name() == c.name())
            .unwrap();
        let ring = median(&mut results[ring_i].clone());
        for p in providers {
            let i = contenders
                .iter()
                .position(|&(pp, cc)| pp == p && cc.name() == c.name())
                .unwrap();
            let mut v = results[i].clone();
            let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = v.iter().cloned().fold(0.0, f64::max);
            let m = median(&mut v);
            println!(
                "{:<20} {:<8} {:>20} {:>10.3} {:>8.2}",
                c.name(),
                format!("{p:?}"),
                format!("{m:.2} [{lo:.2}-{hi:.2}]"),
                1.0 / m,
                m / ring
            );
        }
    }
}
