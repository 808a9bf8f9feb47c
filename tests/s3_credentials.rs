//! The credential sources that speak HTTP (instance metadata IMDSv2,
//! container credentials, STS AssumeRoleWithWebIdentity) against a tiny
//! server on 127.0.0.1 that checks what each protocol requires, the chain
//! with a fake environment, and refresh before expiry. Nothing here may
//! reach 169.254.169.254: every environment sets the endpoint or
//! `AWS_EC2_METADATA_DISABLED`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ringfeed::net::s3::creds::{self, Provider, Source};
use ringfeed::net::s3::{Env, S3Config};

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

type Handler = dyn Fn(&Seen) -> (u16, String) + Send + Sync;

/// Answers each request with `handler`, one per connection.
struct Tiny {
    url: String,
    requests: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Tiny {
    fn start(handler: Arc<Handler>) -> Tiny {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (r, s) = (Arc::clone(&requests), Arc::clone(&seen));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (h, r, s) = (Arc::clone(&handler), Arc::clone(&r), Arc::clone(&s));
                std::thread::spawn(move || serve(conn, &*h, &r, &s));
            }
        });
        Tiny {
            url,
            requests,
            seen,
        }
    }
}

fn serve(mut conn: TcpStream, handler: &Handler, n: &AtomicUsize, log: &Mutex<Vec<Seen>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(used)) = req.parse(&buf) {
            let seen = Seen {
                method: req.method.unwrap_or("").to_string(),
                path: req.path.unwrap_or("").to_string(),
                headers: req
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_string(),
                            String::from_utf8_lossy(h.value).to_string(),
                        )
                    })
                    .collect(),
            };
            buf.drain(..used);
            n.fetch_add(1, Ordering::SeqCst);
            log.lock().unwrap().push(seen.clone());
            let (status, body) = handler(&seen);
            let _ = write!(
                conn,
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            return;
        }
        let mut tmp = [0u8; 4096];
        match conn.read(&mut tmp) {
            Ok(0) | Err(_) => return,
            Ok(k) => buf.extend_from_slice(&tmp[..k]),
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a time (civil-from-days, Howard Hinnant's).
fn iso(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn json_creds(id: &str, expires: SystemTime) -> String {
    format!(
        r#"{{"Code":"Success","AccessKeyId":"{id}","SecretAccessKey":"SECRET-{id}","Token":"TOKEN-{id}","Expiration":"{}"}}"#,
        iso(expires)
    )
}

#[test]
fn imds_v2_token_then_role_then_credentials() {
    let expires = SystemTime::now() + Duration::from_secs(3600);
    let server = Tiny::start(Arc::new(move |r: &Seen| {
        match (r.method.as_str(), r.path.as_str()) {
            ("PUT", "/latest/api/token")
                if r.header("x-aws-ec2-metadata-token-ttl-seconds").is_some() =>
            {
                (200, "IMDSTOKEN".into())
            }
            (_, p) if r.header("x-aws-ec2-metadata-token") != Some("IMDSTOKEN") => {
                (401, format!("no token for {p}"))
            }
            ("GET", "/latest/meta-data/iam/security-credentials/") => (200, "my-role\n".into()),
            ("GET", "/latest/meta-data/iam/security-credentials/my-role") => {
                (200, json_creds("ASIAIMDS", expires))
            }
            _ => (404, String::new()),
        }
    }));
    let env = Env::with_home(None).set("AWS_EC2_METADATA_SERVICE_ENDPOINT", &server.url);
    let c = creds::from_imds(&env).unwrap().unwrap();
    assert_eq!(c.access_key_id, "ASIAIMDS");
    assert_eq!(
        (c.secret_access_key(), c.session_token()),
        ("SECRET-ASIAIMDS", Some("TOKEN-ASIAIMDS"))
    );
    assert!(c.expiry.is_some());
    assert_eq!(server.requests.load(Ordering::SeqCst), 3);
    // The whole chain ends there when nothing else is configured.
    let (source, _) = creds::chain(&S3Config::default(), &env).unwrap();
    assert_eq!(source, Source::InstanceMetadata);
    // Disabled: never asked.
    let before = server.requests.load(Ordering::SeqCst);
    let env = env.set("AWS_EC2_METADATA_DISABLED", "true");
    assert!(creds::from_imds(&env).unwrap().is_none());
    assert_eq!(server.requests.load(Ordering::SeqCst), before);
}

#[test]
fn an_unreachable_imds_ends_the_chain_with_what_was_tried() {
    // Bound then closed: nobody listens.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let env = Env::with_home(None).set(
        "AWS_EC2_METADATA_SERVICE_ENDPOINT",
        &format!("http://127.0.0.1:{port}"),
    );
    let t = std::time::Instant::now();
    let e = creds::chain(&S3Config::default(), &env).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(e.starts_with("no AWS credentials found: tried"), "{e}");
    assert!(e.contains("instance metadata at http://127.0.0.1"), "{e}");
}

#[test]
fn container_credentials_send_the_authorization_token() {
    let expires = SystemTime::now() + Duration::from_secs(3600);
    let server = Tiny::start(Arc::new(move |r: &Seen| {
        if r.path == "/v2/creds" && r.header("authorization") == Some("CONTAINERTOKEN") {
            (200, json_creds("ASIACONT", expires))
        } else {
            (403, String::new())
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "CONTAINERTOKEN\n").unwrap();
    let env = Env::with_home(None)
        .set("AWS_EC2_METADATA_DISABLED", "true")
        .set(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            &format!("{}/v2/creds", server.url),
        );
    let e = creds::from_container(&env).unwrap_err();
    assert!(e.contains("403") && !e.contains("CONTAINERTOKEN"), "{e}");
    let env = env.set("AWS_CONTAINER_AUTHORIZATION_TOKEN", "CONTAINERTOKEN");
    assert_eq!(
        creds::from_container(&env).unwrap().unwrap().access_key_id,
        "ASIACONT"
    );
    let env = env.set("AWS_CONTAINER_AUTHORIZATION_TOKEN", "stale").set(
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
        token_file.to_str().unwrap(),
    );
    let (source, c) = creds::chain(&S3Config::default(), &env).unwrap();
    assert_eq!(
        (source, c.access_key_id.as_str()),
        (Source::Container, "ASIACONT")
    );
}

#[test]
fn web_identity_assumes_the_role_with_the_token_file() {
    let expires = SystemTime::now() + Duration::from_secs(3600);
    let server = Tiny::start(Arc::new(move |r: &Seen| {
        let ok = r.path.contains("Action=AssumeRoleWithWebIdentity")
            && r.path
                .contains("RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Ftrainer")
            && r.path.contains("WebIdentityToken=JWT.TOKEN.X");
        if !ok {
            return (
                400,
                "<ErrorResponse><Error><Code>InvalidParameter</Code></Error></ErrorResponse>"
                    .into(),
            );
        }
        (
            200,
            format!(
                "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>\
                 <AccessKeyId>ASIAWEB</AccessKeyId><SecretAccessKey>SECRETWEB</SecretAccessKey>\
                 <SessionToken>TOKENWEB</SessionToken><Expiration>{}</Expiration>\
                 </Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>",
                iso(expires)
            ),
        )
    }));
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "JWT.TOKEN.X\n").unwrap();
    let env = Env::with_home(None)
        .set("AWS_EC2_METADATA_DISABLED", "true")
        .set("AWS_WEB_IDENTITY_TOKEN_FILE", token.to_str().unwrap())
        .set("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/trainer")
        .set("AWS_ENDPOINT_URL_STS", &server.url);
    let (source, c) = creds::chain(&S3Config::default(), &env).unwrap();
    assert_eq!(source, Source::WebIdentity);
    assert_eq!(
        (c.access_key_id.as_str(), c.session_token()),
        ("ASIAWEB", Some("TOKENWEB"))
    );
    // A configured but broken source is an error, not a fall-through, and
    // the error does not carry the token.
    let env = env.set("AWS_ROLE_ARN", "arn:aws:iam::1:role/other");
    let e = creds::chain(&S3Config::default(), &env).unwrap_err();
    assert!(e.contains("HTTP 400") && !e.contains("JWT.TOKEN.X"), "{e}");
}

#[test]
fn temporary_credentials_are_refreshed_before_they_expire() {
    // Each fetch hands out credentials that expire in 4 minutes: inside
    // the 5-minute margin, so every `get` fetches again.
    let fetches = Arc::new(AtomicUsize::new(0));
    let f = Arc::clone(&fetches);
    let server = Tiny::start(Arc::new(move |_r: &Seen| {
        let n = f.fetch_add(1, Ordering::SeqCst);
        (
            200,
            json_creds(
                &format!("ASIA{n}"),
                SystemTime::now() + Duration::from_secs(240),
            ),
        )
    }));
    let env = Env::with_home(None)
        .set("AWS_EC2_METADATA_DISABLED", "true")
        .set(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            &format!("{}/c", server.url),
        );
    let p = Provider::new(&S3Config::default(), &env).unwrap();
    assert_eq!(p.source(), Source::Container);
    let a = p.get(SystemTime::now()).unwrap();
    let b = p.get(SystemTime::now()).unwrap();
    assert_ne!(a.access_key_id, b.access_key_id);
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    // Long-lived ones are not fetched again within the margin.
    let server2 = Tiny::start(Arc::new(move |_r: &Seen| {
        (
            200,
            json_creds("ASIALONG", SystemTime::now() + Duration::from_secs(3600)),
        )
    }));
    let env = env.set(
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        &format!("{}/c", server2.url),
    );
    let p = Provider::new(&S3Config::default(), &env).unwrap();
    p.get(SystemTime::now()).unwrap();
    p.get(SystemTime::now()).unwrap();
    assert_eq!(server2.requests.load(Ordering::SeqCst), 1);
    // ...until their expiry comes within 5 minutes.
    p.get(SystemTime::now() + Duration::from_secs(3400))
        .unwrap();
    assert_eq!(server2.requests.load(Ordering::SeqCst), 2);
    assert!(
        server2
            .seen
            .lock()
            .unwrap()
            .iter()
            .all(|s| s.method == "GET")
    );
}
