//! SigV4 for S3 with smithy-rs's `aws-sigv4`: the header lines of each
//! request (`x-amz-date`, `x-amz-content-sha256: UNSIGNED-PAYLOAD`,
//! `x-amz-security-token`, `Authorization`). The data plane gets them
//! through [`RequestSigner`]; the control plane (listing) through
//! [`SigV4Signer::headers`].

use std::sync::Arc;
use std::time::SystemTime;

use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode, sign,
};

use super::creds::Provider;
use crate::net::http::{FailKind, HttpFail};
use crate::net::object::{HttpObject, RequestSigner};

/// Signs S3 requests with the provider's current credentials.
#[derive(Debug)]
pub struct SigV4Signer {
    provider: Arc<Provider>,
    region: String,
}

impl SigV4Signer {
    pub fn new(provider: Arc<Provider>, region: &str) -> SigV4Signer {
        SigV4Signer {
            provider,
            region: region.to_string(),
        }
    }

    /// The signing headers of `method url` carrying `headers` (which must
    /// include `host` and any `range`), at `now`. `url` is exactly what is
    /// sent: path and query already encoded.
    pub fn headers(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        now: SystemTime,
    ) -> Result<Vec<(String, String)>, String> {
        let c = self.provider.get(now)?;
        let identity = c.sigv4_identity();
        // S3's rules: the path is signed as sent (single encoding, no
        // normalization) and the payload hash header is required.
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("s3")
            .time(now)
            .settings(settings)
            .build()
            .map_err(|e| format!("SigV4 parameters: {e}"))?
            .into();
        // Errors of the signer name the part that is wrong (a bad URI or
        // header), never the key: it is not in what they format.
        let req = SignableRequest::new(
            method,
            url,
            headers.iter().copied(),
            SignableBody::UnsignedPayload,
        )
        .map_err(|e| format!("SigV4: {e}"))?;
        signed_headers(req, &params)
    }
}

/// The header lines SigV4 adds to `req` under `params` (S3's requests and
/// STS's). Errors of the signer name the part that is wrong, never the key.
pub(crate) fn signed_headers(
    req: SignableRequest<'_>,
    params: &aws_sigv4::http_request::SigningParams<'_>,
) -> Result<Vec<(String, String)>, String> {
    let (instructions, _) = sign(req, params)
        .map_err(|e| format!("SigV4: {e}"))?
        .into_parts();
    Ok(instructions
        .headers()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

impl RequestSigner for SigV4Signer {
    fn sign(
        &self,
        method: &str,
        obj: &HttpObject,
        range: Option<&str>,
    ) -> Result<String, HttpFail> {
        let host = obj.host_header();
        let scheme = if obj.tls { "https" } else { "http" };
        let url = format!("{scheme}://{host}{}", obj.target);
        let mut hs = vec![("host", host.as_str())];
        if let Some(r) = range {
            hs.push(("range", r));
        }
        let signed = self
            .headers(method, &url, &hs, SystemTime::now())
            // Not retryable: new attempts would sign with the same (missing
            // or expired) credentials.
            .map_err(|e| HttpFail::new(FailKind::Client, e))?;
        Ok(signed
            .iter()
            .map(|(k, v)| format!("{k}: {v}\r\n"))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::s3::creds::{CredentialSource, Credentials};
    use crate::net::s3::{Env, S3Config};

    fn signer(token: Option<&str>) -> SigV4Signer {
        let c = Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            token,
            None,
            "t",
        );
        let p = Provider::with(
            CredentialSource::Config,
            c,
            &S3Config::default(),
            &Env::default(),
        );
        SigV4Signer::new(Arc::new(p), "us-east-1")
    }

    #[test]
    fn signs_the_s3_headers_and_keeps_the_secret_out() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_369_353_600); // 2013-05-24
        let h = signer(Some("SESSIONTOKEN"))
            .headers(
                "GET",
                "https://examplebucket.s3.amazonaws.com/test.txt",
                &[
                    ("host", "examplebucket.s3.amazonaws.com"),
                    ("range", "bytes=0-9"),
                ],
                t,
            )
            .unwrap();
        let get = |n: &str| {
            h.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("x-amz-content-sha256"), Some("UNSIGNED-PAYLOAD"));
        assert_eq!(get("x-amz-date"), Some("20130524T000000Z"));
        assert_eq!(get("x-amz-security-token"), Some("SESSIONTOKEN"));
        let auth = get("authorization").unwrap();
        assert!(
            auth.starts_with(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20130524/us-east-1/s3/aws4_request"
            ),
            "{auth}"
        );
        assert!(
            auth.contains(
                "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date;x-amz-security-token"
            ),
            "{auth}"
        );
        assert!(!format!("{h:?}").contains("wJalrXUtnFEMI"));
    }

    #[test]
    fn data_plane_requests_carry_the_signature() {
        let obj = HttpObject::new("http://127.0.0.1:9000/b/k%20x.tar", vec![])
            .unwrap()
            .with_signer(Arc::new(signer(None)));
        let req = String::from_utf8(obj.range_request(0, 10, None).unwrap()).unwrap();
        assert!(req.starts_with("GET /b/k%20x.tar HTTP/1.1\r\n"), "{req}");
        assert!(
            req.contains("\r\nauthorization: AWS4-HMAC-SHA256 "),
            "{req}"
        );
        assert!(
            req.contains("\r\nx-amz-content-sha256: UNSIGNED-PAYLOAD\r\n"),
            "{req}"
        );
        assert!(req.ends_with("\r\n\r\n"));
        assert!(!req.contains("x-amz-security-token"));
        assert!(!format!("{obj:?}").contains("wJalrXUtnFEMI"));
    }
}
