//! The credential sources that speak HTTP (instance metadata IMDSv2,
//! container credentials, STS AssumeRoleWithWebIdentity, a profile's
//! `role_arn` through STS AssumeRole, SSO's GetRoleCredentials) against a
//! tiny server on 127.0.0.1 that checks what each protocol requires, a
//! profile's `credential_process` (a shell script), the chain with a fake
//! environment, and refresh before expiry. Nothing here may
//! reach 169.254.169.254: every environment sets the endpoint or
//! `AWS_EC2_METADATA_DISABLED`.

use ringfeed_test_support as support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ringfeed::net::s3::creds::{self, CredentialSource, Provider};
use ringfeed::net::s3::{Env, S3Config};

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: String,
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
            let length: usize = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() < used + length {
                let mut tmp = [0u8; 4096];
                match conn.read(&mut tmp) {
                    Ok(0) | Err(_) => return,
                    Ok(k) => buf.extend_from_slice(&tmp[..k]),
                }
                continue;
            }
            let seen = Seen {
                body: String::from_utf8_lossy(&buf[used..used + length]).to_string(),
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
            buf.drain(..used + length);
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

fn json_creds(id: &str, expires: SystemTime) -> String {
    format!(
        r#"{{"Code":"Success","AccessKeyId":"{id}","SecretAccessKey":"SECRET-{id}","Token":"TOKEN-{id}","Expiration":"{}"}}"#,
        support::iso(expires)
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
    assert_eq!(source, CredentialSource::InstanceMetadata);
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
        (CredentialSource::Container, "ASIACONT")
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
                support::iso(expires)
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
    assert_eq!(source, CredentialSource::WebIdentity);
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
    // Each fetch hands out credentials that expire in 4 minutes: shorter
    // than twice the 5-minute margin, so they are due at half their life,
    // not at once (which would fetch again at every request).
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
    assert_eq!(p.source(), CredentialSource::Container);
    let a = p.get(SystemTime::now()).unwrap();
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    let b = p.get(SystemTime::now() + Duration::from_secs(125)).unwrap();
    assert_ne!(a.access_key_id, b.access_key_id);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    let c = p.get(SystemTime::now() + Duration::from_secs(130)).unwrap();
    assert_eq!(b.access_key_id, c.access_key_id);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
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

/// A home with `~/.aws/config` holding `config`, and no other source.
fn home_with_config(config: &str) -> (tempfile::TempDir, Env) {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join(".aws")).unwrap();
    std::fs::write(d.path().join(".aws/config"), config).unwrap();
    let env = Env::with_home(Some(d.path().to_path_buf())).set("AWS_EC2_METADATA_DISABLED", "true");
    (d, env)
}

/// An executable shell script `name` in `dir` running `body`.
fn script(dir: &std::path::Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.display().to_string()
}

#[test]
fn credential_process_output_becomes_credentials_and_failures_keep_the_secret() {
    let d = tempfile::tempdir().unwrap();
    let expires = support::iso(SystemTime::now() + Duration::from_secs(3600));
    let good = script(
        d.path(),
        "good",
        &format!(
            r#"[ "$1" = "--role" ] || exit 9
echo '{{"Version": 1, "AccessKeyId": "ASIAPROC", "SecretAccessKey": "SECRET-PROC-LEAK", "SessionToken": "TOKEN-PROC", "Expiration": "{expires}"}}'"#
        ),
    );
    let failing = script(d.path(), "failing", "echo 'SECRET-PROC-LEAK' ; exit 3");
    let v2 = script(
        d.path(),
        "v2",
        r#"echo '{"Version": 2, "AccessKeyId": "A", "SecretAccessKey": "SECRET-PROC-LEAK"}'"#,
    );
    let garbage = script(
        d.path(),
        "garbage",
        "echo 'SecretAccessKey=SECRET-PROC-LEAK'",
    );
    let nosecret = script(
        d.path(),
        "nosecret",
        r#"echo '{"Version": 1, "AccessKeyId": "A"}'"#,
    );
    let config = format!(
        "[profile proc]\ncredential_process = {good} --role \"train ing\"\nregion = eu-west-1\n\
         [profile failing]\ncredential_process = {failing} --token SECRET-ARG\n\
         [profile v2]\ncredential_process = {v2}\n\
         [profile garbage]\ncredential_process = {garbage}\n\
         [profile nosecret]\ncredential_process = {nosecret}\n"
    );
    let (_home, env) = home_with_config(&config);
    let cfg = |p: &str| S3Config {
        profile: Some(p.into()),
        ..Default::default()
    };
    let (source, c) = creds::chain(&cfg("proc"), &env).unwrap();
    assert_eq!(source, CredentialSource::Profile);
    assert_eq!(
        (
            c.access_key_id.as_str(),
            c.secret_access_key(),
            c.session_token()
        ),
        ("ASIAPROC", "SECRET-PROC-LEAK", Some("TOKEN-PROC"))
    );
    assert!(c.expiry.is_some());
    assert!(c.source.contains("credential_process"), "{}", c.source);
    for (profile, want) in [
        ("failing", "exited with status 3"),
        ("v2", "`Version` is not 1"),
        ("garbage", "not a JSON credentials document"),
        ("nosecret", "no `SecretAccessKey`"),
    ] {
        let e = creds::chain(&cfg(profile), &env).unwrap_err();
        assert!(
            e.contains(want) && e.contains(&format!("profile `{profile}`")),
            "{profile}: {e}"
        );
        assert!(
            !e.contains("SECRET-PROC-LEAK") && !e.contains("SECRET-ARG"),
            "{profile}: {e}"
        );
    }
}

/// A fake STS: AssumeRole of `arn:...:role/<name>` answered with keys
/// `ASIA<NAME>` when signed with one of `keys` (key id → expected), else
/// AccessDenied as STS words it.
fn fake_sts() -> Tiny {
    let expires = SystemTime::now() + Duration::from_secs(3600);
    Tiny::start(Arc::new(move |r: &Seen| {
        if r.method == "GET"
            && r.path.contains("Action=AssumeRoleWithWebIdentity")
            && r.path
                .contains("RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fwebid")
            && r.path.contains("WebIdentityToken=JWT.PROFILE")
        {
            return (
                200,
                format!(
                    "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>\
                     <AccessKeyId>ASIAWEBID</AccessKeyId><SecretAccessKey>S</SecretAccessKey>\
                     <SessionToken>T</SessionToken><Expiration>{}</Expiration>\
                     </Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>",
                    support::iso(expires)
                ),
            );
        }
        let auth = r.header("authorization").unwrap_or("");
        let form: Vec<(String, String)> = r
            .body
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.replace("%3A", ":").replace("%2F", "/")))
            .collect();
        let get = |k: &str| {
            form.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
                .unwrap_or("")
        };
        let role = get("RoleArn").rsplit('/').next().unwrap_or("").to_string();
        let signed_by = auth
            .split("Credential=")
            .nth(1)
            .and_then(|c| c.split('/').next())
            .unwrap_or("");
        let allowed = match role.as_str() {
            "first" => signed_by == "AKIDSOURCE",
            "second" => signed_by == "ASIAFIRST",
            _ => false,
        };
        if r.method != "POST"
            || get("Action") != "AssumeRole"
            || !auth.contains("/sts/aws4_request")
            || !allowed
        {
            return (
                403,
                "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>no</Message></Error></ErrorResponse>".into(),
            );
        }
        (
            200,
            format!(
                "<AssumeRoleResponse><AssumeRoleResult><Credentials>\
                 <AccessKeyId>ASIA{}</AccessKeyId><SecretAccessKey>SECRET{}</SecretAccessKey>\
                 <SessionToken>TOKEN{}</SessionToken><Expiration>{}</Expiration>\
                 </Credentials><AssumedRoleUser><Arn>x</Arn></AssumedRoleUser></AssumeRoleResult></AssumeRoleResponse>",
                role.to_uppercase(),
                role.to_uppercase(),
                role.to_uppercase(),
                support::iso(expires)
            ),
        )
    }))
}

#[test]
fn role_arn_is_assumed_with_the_source_profiles_keys_through_sts() {
    let sts = fake_sts();
    let container = Tiny::start(Arc::new(|_r: &Seen| {
        (
            200,
            json_creds("AKIDSOURCE", SystemTime::now() + Duration::from_secs(3600)),
        )
    }));
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "JWT.PROFILE\n").unwrap();
    let config = "\
[profile base]
aws_access_key_id = AKIDSOURCE
aws_secret_access_key = SECRET-SOURCE-LEAK
[profile first]
role_arn = arn:aws:iam::123456789012:role/first
source_profile = base
role_session_name = my-session
[profile second]
role_arn = arn:aws:iam::123456789012:role/second
source_profile = first
[profile denied]
role_arn = arn:aws:iam::123456789012:role/other
source_profile = base
[profile orphan]
role_arn = arn:aws:iam::123456789012:role/first
source_profile = nowhere
[profile nosource]
role_arn = arn:aws:iam::123456789012:role/first
[profile loop-a]
role_arn = arn:aws:iam::123456789012:role/first
source_profile = loop-b
[profile loop-b]
role_arn = arn:aws:iam::123456789012:role/first
source_profile = loop-a
[profile mfa]
role_arn = arn:aws:iam::123456789012:role/first
source_profile = base
mfa_serial = arn:aws:iam::123456789012:mfa/me
[profile ecs]
role_arn = arn:aws:iam::123456789012:role/first
credential_source = EcsContainer
[profile badsource]
role_arn = arn:aws:iam::123456789012:role/first
credential_source = Laptop
[profile webid]
role_arn = arn:aws:iam::123456789012:role/webid
web_identity_token_file = TOKEN_FILE
"
    .replace("TOKEN_FILE", token.to_str().unwrap());
    let (_home, env) = home_with_config(&config);
    let env = env.set("AWS_ENDPOINT_URL_STS", &sts.url).set(
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        &format!("{}/creds", container.url),
    );
    let cfg = |p: &str| S3Config {
        profile: Some(p.into()),
        ..Default::default()
    };
    let (source, c) = creds::chain(&cfg("first"), &env).unwrap();
    assert_eq!(source, CredentialSource::Profile);
    assert_eq!(
        (c.access_key_id.as_str(), c.session_token()),
        ("ASIAFIRST", Some("TOKENFIRST"))
    );
    assert!(c.expiry.is_some());
    {
        let seen = sts.seen.lock().unwrap();
        let r = seen.last().unwrap();
        assert!(r.body.contains("RoleSessionName=my-session"), "{}", r.body);
        assert!(
            r.header("content-type")
                .is_some_and(|t| t.starts_with("application/x-www-form-urlencoded")),
            "{r:?}"
        );
    }
    // The role assumed with the container's credentials; a web identity
    // token file named by the profile.
    let (_, c) = creds::chain(&cfg("ecs"), &env).unwrap();
    assert_eq!(c.access_key_id, "ASIAFIRST");
    assert_eq!(container.requests.load(Ordering::SeqCst), 1);
    let (_, c) = creds::chain(&cfg("webid"), &env).unwrap();
    assert_eq!(c.access_key_id, "ASIAWEBID");
    assert!(c.source.contains("web identity"), "{}", c.source);
    // A chain: `second`'s source is the role `first`, assumed first.
    let before = sts.requests.load(Ordering::SeqCst);
    let (_, c) = creds::chain(&cfg("second"), &env).unwrap();
    assert_eq!(c.access_key_id, "ASIASECOND");
    assert_eq!(sts.requests.load(Ordering::SeqCst), before + 2);

    // The provider fetches again through STS before expiry.
    let p = Provider::new(&cfg("first"), &env).unwrap();
    let before = sts.requests.load(Ordering::SeqCst);
    p.get(SystemTime::now() + Duration::from_secs(3500))
        .unwrap();
    assert_eq!(sts.requests.load(Ordering::SeqCst), before + 1);

    for (profile, want) in [
        ("denied", "HTTP 403 Forbidden, error code AccessDenied"),
        (
            "orphan",
            "source_profile `nowhere` of profile `orphan` is not in the shared files",
        ),
        (
            "nosource",
            "profile `nosource` has role_arn but no source_profile",
        ),
        ("loop-a", "loop-a → loop-b → loop-a"),
        ("mfa", "needs an MFA code"),
        (
            "badsource",
            "credential_source `Laptop` is not Environment, Ec2InstanceMetadata or EcsContainer",
        ),
    ] {
        let e = creds::chain(&cfg(profile), &env).unwrap_err();
        assert!(e.contains(want), "{profile}: {e}");
        assert!(!e.contains("SECRET-SOURCE-LEAK"), "{profile}: {e}");
    }
    // AWS_ENDPOINT_URL serves STS too when no STS endpoint is set, as in the SDKs.
    let (_home2, env2) = home_with_config(&config);
    let env2 = env2.set("AWS_ENDPOINT_URL", &sts.url);
    assert_eq!(
        creds::chain(&cfg("first"), &env2).unwrap().1.access_key_id,
        "ASIAFIRST"
    );
}

/// A fake SSO portal: GetRoleCredentials of account 111122223333, role
/// Trainer, with bearer token `good-token`.
fn fake_portal() -> Tiny {
    let expires_ms = (SystemTime::now() + Duration::from_secs(3600))
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    Tiny::start(Arc::new(move |r: &Seen| {
        if r.method != "GET"
            || r.path != "/federation/credentials?account_id=111122223333&role_name=Trainer"
        {
            return (400, "{}".into());
        }
        if r.header("x-amz-sso_bearer_token") != Some("good-token") {
            return (
                401,
                r#"{"message":"Session token not found or invalid"}"#.into(),
            );
        }
        (
            200,
            format!(
                r#"{{"roleCredentials":{{"accessKeyId":"ASIASSO","secretAccessKey":"SECRET-SSO","sessionToken":"TOKEN-SSO","expiration":{expires_ms}}}}}"#
            ),
        )
    }))
}

#[test]
fn sso_profiles_trade_the_cached_token_for_role_credentials() {
    let portal = fake_portal();
    let config = "\
[profile sso]
sso_session = corp
sso_account_id = 111122223333
sso_role_name = Trainer
region = eu-west-1
[sso-session corp]
sso_start_url = https://corp.awsapps.com/start
sso_region = eu-west-1
sso_registration_scopes = sso:account:access
[profile legacy]
sso_start_url = https://old.awsapps.com/start
sso_region = us-east-2
sso_account_id = 111122223333
sso_role_name = Trainer
[profile stale]
sso_session = stale
sso_account_id = 111122223333
sso_role_name = Trainer
[sso-session stale]
sso_start_url = https://stale.awsapps.com/start
sso_region = eu-west-1
[profile nosession]
sso_session = missing
sso_account_id = 111122223333
sso_role_name = Trainer
[profile revoked]
sso_session = revoked
sso_account_id = 111122223333
sso_role_name = Trainer
[sso-session revoked]
sso_start_url = https://revoked.awsapps.com/start
sso_region = eu-west-1
[profile notloggedin]
sso_start_url = https://never.awsapps.com/start
sso_region = eu-west-1
sso_account_id = 111122223333
sso_role_name = Trainer
";
    let (home, env) = home_with_config(config);
    let env = env.set("AWS_ENDPOINT_URL_SSO", &portal.url);
    let later = support::iso(SystemTime::now() + Duration::from_secs(3600));
    let past = support::iso(SystemTime::now() - Duration::from_secs(60));
    let cache = |key: &str, token: &str, expires: &str| {
        let path = creds::sso_cache_file(&env, key).unwrap();
        assert!(path.starts_with(home.path().join(".aws/sso/cache")));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            &path,
            format!(r#"{{"startUrl":"x","region":"eu-west-1","accessToken":"{token}","expiresAt":"{expires}"}}"#),
        )
        .unwrap();
    };
    // The session's file is the SHA-1 of its name; the older form's, of the start URL.
    cache("corp", "good-token", &later);
    cache("https://old.awsapps.com/start", "good-token", &later);
    cache("stale", "good-token", &past);
    cache("revoked", "old-token", &later);
    let cfg = |p: &str| S3Config {
        profile: Some(p.into()),
        ..Default::default()
    };
    for profile in ["sso", "legacy"] {
        let (source, c) = creds::chain(&cfg(profile), &env).unwrap();
        assert_eq!(source, CredentialSource::Profile);
        assert_eq!(
            (c.access_key_id.as_str(), c.session_token()),
            ("ASIASSO", Some("TOKEN-SSO")),
            "{profile}"
        );
        assert!(c.expiry.is_some_and(|e| e > SystemTime::now()));
    }
    for (profile, want) in [
        ("stale", "expired at"),
        ("notloggedin", "no SSO token cached"),
        ("revoked", "HTTP 401"),
        ("nosession", "no [sso-session missing] section"),
    ] {
        let e = creds::chain(&cfg(profile), &env).unwrap_err();
        assert!(e.contains(want), "{profile}: {e}");
        if profile != "nosession" {
            assert!(
                e.contains(&format!("run `aws sso login --profile {profile}`")),
                "{profile}: {e}"
            );
        }
        assert!(
            !e.contains("good-token") && !e.contains("old-token"),
            "{profile}: {e}"
        );
    }
}

/// A source that gave credentials once and fails from then on.
fn failing_after_first() -> (Tiny, Env) {
    let served = Arc::new(AtomicUsize::new(0));
    let n = Arc::clone(&served);
    let server = Tiny::start(Arc::new(move |_r: &Seen| {
        if n.fetch_add(1, Ordering::SeqCst) == 0 {
            (
                200,
                json_creds("ASIAONCE", SystemTime::now() + Duration::from_secs(1200)),
            )
        } else {
            (500, "down".into())
        }
    }));
    let env = Env::with_home(None)
        .set("AWS_EC2_METADATA_DISABLED", "true")
        .set(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            &format!("{}/c", server.url),
        );
    (server, env)
}

#[test]
fn a_failing_refresh_backs_off_instead_of_trying_at_every_request() {
    // Credentials good for 20 minutes are due 5 minutes before; from then
    // on the source fails. A request every 10 ms for a minute past the
    // due time: the refresh is tried after 0, 1, 3, 7, 15 and 31 s (the
    // backoff doubling from 1 s), and every request still gets the old
    // credentials.
    let (server, env) = failing_after_first();
    let p = Provider::new(&S3Config::default(), &env).unwrap();
    let due = SystemTime::now() + Duration::from_secs(15 * 60 + 1);
    for i in 0..6000u64 {
        let c = p.get(due + Duration::from_millis(10 * i)).unwrap();
        assert_eq!(c.access_key_id, "ASIAONCE");
    }
    let tries = server.requests.load(Ordering::SeqCst) - 1;
    assert_eq!(tries, 6, "refreshes tried in a minute");
    assert_eq!(p.fetches(), 6);
    // Once they expire, the error names the failure and what comes next,
    // without asking the source again before the backoff ends.
    let late = due + Duration::from_secs(5 * 60 + 1);
    let e = p.get(late).unwrap_err();
    assert!(e.contains("expired") && e.contains("HTTP 500"), "{e}");
    let e = p.get(late + Duration::from_millis(10)).unwrap_err();
    assert!(e.contains("the next in"), "{e}");
    assert_eq!(server.requests.load(Ordering::SeqCst) - 1, 7);

    // Control: with no backoff, the same minute of requests asks the
    // failing source at every one of them (200 requests here).
    let (server, env) = failing_after_first();
    let mut p = Provider::new(&S3Config::default(), &env).unwrap();
    p.set_backoff(ringfeed::net::retry::Backoff {
        base: Duration::ZERO,
        cap: Duration::ZERO,
    });
    for i in 0..200u64 {
        p.get(due + Duration::from_millis(300 * i)).unwrap();
    }
    assert_eq!(server.requests.load(Ordering::SeqCst) - 1, 200);
}

/// Whether process `pid` is gone (or a zombie no one reaped yet: it runs
/// no more), waiting up to 10 s for a killed one to die.
fn gone(pid: &str) -> bool {
    for _ in 0..1000 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            // The state follows the command name in parentheses.
            Ok(s)
                if s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z') =>
            {
                return true;
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    false
}

#[test]
fn a_hanging_credential_process_times_out_by_name_with_its_processes_killed() {
    let d = tempfile::tempdir().unwrap();
    let pids = d.path().join("pids");
    // The helper and a child of its own, both waiting for ever.
    let hang = script(
        d.path(),
        "hang",
        &format!(
            "echo $$ > {p}; sleep 300 & echo $! >> {p}; wait",
            p = pids.display()
        ),
    );
    let read_pids = || -> Vec<String> {
        let text = std::fs::read_to_string(&pids).unwrap_or_default();
        text.split_whitespace().map(str::to_string).collect()
    };

    // Control: left alone, both are still there after the time-out the
    // test gives (so `gone` below sees a kill, not a helper that ended).
    let mut alone = std::process::Command::new(&hang).spawn().unwrap();
    while read_pids().len() < 2 {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_secs(1));
    let left = read_pids();
    assert!(left.iter().all(|p| !gone_now(p)), "{left:?}");
    for p in &left {
        let _ = std::process::Command::new("kill").args(["-9", p]).status();
    }
    let _ = alone.wait();
    std::fs::remove_file(&pids).unwrap();

    let e = creds::from_process_within(
        "hang",
        &format!("{hang} --token SECRET-ARG"),
        Duration::from_secs(1),
    )
    .unwrap_err();
    assert!(
        matches!(&e, creds::ProcessError::TimedOut { timeout, .. } if *timeout == Duration::from_secs(1)),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains("did not finish within 1 s") && text.contains("profile `hang`"),
        "{text}"
    );
    assert!(!text.contains("SECRET-ARG"), "{text}");
    let killed = read_pids();
    assert_eq!(killed.len(), 2, "{killed:?}");
    for p in &killed {
        assert!(gone(p), "process {p} of the helper is still running");
    }
    // The documented default is the Go SDK's minute.
    assert_eq!(creds::PROCESS_TIMEOUT, Duration::from_secs(60));
}

/// Whether `pid` is gone or a zombie, now.
fn gone_now(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
    }
}
