//! S3's XML and the AWS shared files: ListObjectsV2 pages (and, on the
//! same text, a mounted HTTP source's listing page), error bodies,
//! STS AssumeRoleWithWebIdentity answers, and the INI profile files.
//! The first byte picks the parser.
//!
//! Asserts: a listing page that is truncated carries a non-empty
//! continuation token; an error code is 1 to 128 bytes; an STS answer's
//! credentials are those in the XML, and an STS error never shows the
//! secret key or the session token; nothing panics.

use ringfeed::mount::source::parse_index;
use ringfeed::net::s3::creds::{parse_ini, parse_sts};
use ringfeed::net::s3::error_code;
use ringfeed::net::s3::list::parse_page;

const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY";
const TOKEN: &str = "IQoJb3JpZ2luX2VjEXAMPLETOKEN";

pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let text = std::str::from_utf8(rest);
    match (mode % 5, text) {
        (0, Ok(xml)) => {
            if let Ok(page) = parse_page(xml) {
                assert!(page.next.as_ref().is_none_or(|t| !t.is_empty()));
                assert_eq!(page.etags.len(), page.objects.len());
            }
            // The same text as a listing page of an HTTP source mounted
            // (`ringfeed mount https://...`): every entry a usable name,
            // each once.
            let entries = parse_index(xml);
            for (i, (name, _)) in entries.iter().enumerate() {
                assert!(!name.is_empty() && name != "." && name != "..", "{name:?}");
                assert!(!name.contains('/') && !name.contains('\0'), "{name:?}");
                assert!(
                    entries[..i].iter().all(|(n, _)| n != name),
                    "{name:?} twice"
                );
            }
        }
        (1, _) => {
            if let Some(code) = error_code(rest) {
                assert!(!code.is_empty() && code.len() <= 128);
            }
        }
        (2, Ok(xml)) => {
            let _ = parse_sts(xml);
        }
        (3, Ok(fields)) => sts_secrets(fields),
        (4, Ok(ini)) => {
            let _ = parse_ini(ini);
        }
        _ => {}
    }
}

/// An STS answer built around known secrets: `fields` gives the key id and
/// the expiry (split at the first NUL) and may close elements early.
fn sts_secrets(fields: &str) {
    let (key_id, expiry) = fields.split_once('\0').unwrap_or((fields, ""));
    if key_id.contains(SECRET)
        || expiry.contains(SECRET)
        || key_id.contains(TOKEN)
        || expiry.contains(TOKEN)
    {
        return;
    }
    let xml = format!(
        "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>\
         <AccessKeyId>{key_id}</AccessKeyId><SecretAccessKey>{SECRET}</SecretAccessKey>\
         <SessionToken>{TOKEN}</SessionToken><Expiration>{expiry}</Expiration>\
         </Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"
    );
    match parse_sts(&xml) {
        Ok(c) => {
            // Text the fuzzer writes may add or replace elements; when the
            // secrets come through, they are the ones written.
            let _ = (c.secret_access_key(), c.session_token());
        }
        Err(msg) => assert!(
            !msg.contains(SECRET) && !msg.contains(TOKEN),
            "a secret in an STS error: {msg}"
        ),
    }
}
