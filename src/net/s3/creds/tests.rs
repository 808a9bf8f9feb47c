//! Tests of the credential chain over fake homes and environments (the
//! shared files are written to a temporary directory); the sources over
//! HTTP are tested against local servers in `tests/s3_credentials.rs`.

use std::time::{Duration, SystemTime};

use super::http::json_credentials;
use super::*;
use crate::net::s3::{Env, S3Config};

fn home_with(credentials: &str, config: &str) -> (tempfile::TempDir, Env) {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join(".aws")).unwrap();
    std::fs::write(d.path().join(".aws/credentials"), credentials).unwrap();
    std::fs::write(d.path().join(".aws/config"), config).unwrap();
    let env = Env::with_home(Some(d.path().to_path_buf())).set("AWS_EC2_METADATA_DISABLED", "true");
    (d, env)
}

const CREDS: &str = "\
# comment
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = secretdefault

[work]
aws_access_key_id=AKIDWORK
aws_secret_access_key=secretwork
aws_session_token = tokwork
";
const CONFIG: &str = "\
[default]
region = eu-north-1
[profile cfgonly]
aws_access_key_id = AKIDCFG
aws_secret_access_key = secretcfg
region = ap-south-1
s3 =
  addressing_style = path
[work]
aws_access_key_id = AKIDWRONG
aws_secret_access_key = wrong
";

#[test]
fn ini_sections_and_profiles() {
    let ini = parse_ini(CONFIG);
    assert_eq!(ini["profile cfgonly"]["region"], "ap-south-1");
    assert!(!ini["profile cfgonly"].contains_key("addressing_style"));
    let (_d, env) = home_with(CREDS, CONFIG);
    let c = from_profile(&env, "default").unwrap().unwrap();
    assert_eq!(c.access_key_id, "AKIDDEFAULT");
    assert_eq!(c.session_token(), None);
    let c = from_profile(&env, "work").unwrap().unwrap();
    assert_eq!(
        (c.access_key_id.as_str(), c.session_token()),
        ("AKIDWORK", Some("tokwork"))
    );
    // `[profile x]` in config, `[x]` in credentials; `[work]` in config is not a profile.
    let c = from_profile(&env, "cfgonly").unwrap().unwrap();
    assert_eq!(c.access_key_id, "AKIDCFG");
    assert_eq!(
        profile_value(&env, "cfgonly", "region").as_deref(),
        Some("ap-south-1")
    );
    assert_eq!(
        profile_value(&env, "default", "region").as_deref(),
        Some("eu-north-1")
    );
    assert!(from_profile(&env, "nope").unwrap().is_none());
    let env2 = env.clone().set("AWS_PROFILE", "cfgonly");
    assert_eq!(
        super::super::Addressing::resolve(&S3Config::default(), &env2)
            .unwrap()
            .region,
        "ap-south-1"
    );
}

#[test]
fn files_from_the_environment_override_home() {
    let (d, env) = home_with(CREDS, CONFIG);
    let other = d.path().join("other-creds");
    std::fs::write(
        &other,
        "[default]\naws_access_key_id=AKIDOTHER\naws_secret_access_key=s\n",
    )
    .unwrap();
    let env = env
        .set("AWS_SHARED_CREDENTIALS_FILE", other.to_str().unwrap())
        .set("AWS_CONFIG_FILE", "/nonexistent/config");
    let c = from_profile(&env, "default").unwrap().unwrap();
    assert_eq!(c.access_key_id, "AKIDOTHER");
    assert!(from_profile(&env, "cfgonly").unwrap().is_none());
}

#[test]
fn chain_precedence() {
    let (_d, env) = home_with(CREDS, CONFIG);
    let (s, c) = chain(&S3Config::default(), &env).unwrap();
    assert_eq!(
        (s, c.access_key_id.as_str()),
        (CredentialSource::Profile, "AKIDDEFAULT")
    );
    let cfg_profile = S3Config {
        profile: Some("work".into()),
        ..Default::default()
    };
    let env = env.set("AWS_PROFILE", "cfgonly");
    assert_eq!(
        chain(&S3Config::default(), &env).unwrap().1.access_key_id,
        "AKIDCFG"
    );
    assert_eq!(
        chain(&cfg_profile, &env).unwrap().1.access_key_id,
        "AKIDWORK"
    );
    let env = env
        .set("AWS_ACCESS_KEY_ID", "AKIDENV")
        .set("AWS_SECRET_ACCESS_KEY", "secretenv");
    let (s, c) = chain(&cfg_profile, &env).unwrap();
    assert_eq!(
        (s, c.access_key_id.as_str()),
        (CredentialSource::Environment, "AKIDENV")
    );
    let explicit = S3Config {
        access_key_id: Some("AKIDCONF".into()),
        secret_access_key: Some("secretconf".into()),
        ..Default::default()
    };
    let (s, c) = chain(&explicit, &env).unwrap();
    assert_eq!(
        (s, c.access_key_id.as_str()),
        (CredentialSource::Config, "AKIDCONF")
    );
    let half = S3Config {
        access_key_id: Some("AKIDCONF".into()),
        ..Default::default()
    };
    assert!(chain(&half, &env).unwrap_err().contains("together"));
    let half_env = Env::default()
        .set("AWS_ACCESS_KEY_ID", "x")
        .set("AWS_EC2_METADATA_DISABLED", "true");
    assert!(
        chain(&S3Config::default(), &half_env)
            .unwrap_err()
            .contains("together")
    );
}

#[test]
fn nothing_configured_is_a_clear_error_quickly() {
    let env = Env::with_home(None).set("AWS_EC2_METADATA_DISABLED", "true");
    let t = std::time::Instant::now();
    let e = chain(&S3Config::default(), &env).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2));
    for want in [
        "no AWS credentials found: tried",
        "AWS_ACCESS_KEY_ID",
        "profile `default`",
        "web identity",
        "container",
        "AWS_EC2_METADATA_DISABLED",
        "s3_unsigned",
    ] {
        assert!(e.contains(want), "{want}: {e}");
    }
}

#[test]
fn expiry_and_refresh() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let long = Credentials::new("A", "s", None, None, "t");
    assert!(!needs_refresh(&long, now, REFRESH_MARGIN));
    let soon = Credentials::new(
        "A",
        "s",
        Some("t"),
        Some(now + Duration::from_secs(200)),
        "t",
    );
    assert!(needs_refresh(&soon, now, REFRESH_MARGIN));
    assert!(!expired(&soon, now));
    let later = Credentials::new(
        "A",
        "s",
        Some("t"),
        Some(now + Duration::from_secs(3600)),
        "t",
    );
    assert!(!needs_refresh(&later, now, REFRESH_MARGIN));
    assert!(needs_refresh(
        &later,
        now + Duration::from_secs(3301),
        REFRESH_MARGIN
    ));
    assert!(expired(&later, now + Duration::from_secs(3600)));
    // A refresh from a source that now gives nothing keeps valid
    // credentials, and fails clearly once they have expired.
    let env = Env::default();
    let p = Provider::with(
        CredentialSource::Environment,
        soon.clone(),
        &S3Config::default(),
        &env,
    );
    assert_eq!(p.get(now).unwrap(), soon);
    let e = p.get(now + Duration::from_secs(300)).unwrap_err();
    assert!(e.contains("expired"), "{e}");
    // A refresh that finds new credentials takes them.
    let env = env
        .set("AWS_ACCESS_KEY_ID", "NEW")
        .set("AWS_SECRET_ACCESS_KEY", "s2");
    let p = Provider::with(
        CredentialSource::Environment,
        soon,
        &S3Config::default(),
        &env,
    );
    assert_eq!(p.get(now).unwrap().access_key_id, "NEW");
    assert_eq!(
        parse_time("2026-11-30T09:00:00Z").unwrap(),
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_029_200)
    );
    assert!(parse_time("yesterday").is_err());
}

#[test]
fn sts_and_json_documents() {
    let xml = r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>sub</SubjectFromWebIdentityToken>
    <Credentials>
      <SessionToken>TOKEN</SessionToken>
      <SecretAccessKey>SECRET</SecretAccessKey>
      <Expiration>2026-11-30T09:00:00Z</Expiration>
      <AccessKeyId>ASIAWEB</AccessKeyId>
    </Credentials>
  </AssumeRoleWithWebIdentityResult>
</AssumeRoleWithWebIdentityResponse>"#;
    let c = parse_sts(xml).unwrap();
    assert_eq!(
        (
            c.access_key_id.as_str(),
            c.secret_access_key(),
            c.session_token()
        ),
        ("ASIAWEB", "SECRET", Some("TOKEN"))
    );
    assert!(c.expiry.is_some());
    let e = parse_sts("<Error><Code>AccessDenied</Code></Error>").unwrap_err();
    assert!(e.contains("not an AssumeRole"), "{e}");
    let j = r#"{"Code":"Success","AccessKeyId":"ASIAJ","SecretAccessKey":"SJ","Token":"TJ","Expiration":"2026-11-30T09:00:00Z"}"#;
    assert_eq!(json_credentials(j, "x").unwrap().access_key_id, "ASIAJ");
    let e = json_credentials(r#"{"AccessKeyId":"SECRETISH"}"#, "x").unwrap_err();
    assert!(!e.contains("SECRETISH"), "{e}");
}

#[test]
fn debug_output_is_redacted() {
    let c = Credentials::new("AKIDLONGKEY", "topsecret", Some("sessiontok"), None, "t");
    let d = format!("{c:?}");
    assert!(
        !d.contains("topsecret") && !d.contains("sessiontok") && !d.contains("AKIDLONGKEY"),
        "{d}"
    );
    let cfg = S3Config {
        access_key_id: Some("AKIDLONGKEY".into()),
        secret_access_key: Some("topsecret".into()),
        session_token: Some("sessiontok".into()),
        ..Default::default()
    };
    let d = format!("{cfg:?}");
    assert!(
        !d.contains("topsecret") && !d.contains("sessiontok") && !d.contains("AKIDLONGKEY"),
        "{d}"
    );
    let env = Env::default().set("AWS_SECRET_ACCESS_KEY", "topsecret");
    assert!(!format!("{env:?}").contains("topsecret"));
}

#[test]
fn credential_process_documents() {
    let c = parse_process_output(
        r#"{"Version": 1, "AccessKeyId": "A", "SecretAccessKey": "S", "SessionToken": "T", "Expiration": "2030-01-01T00:00:00Z"}"#,
        "p",
    )
    .unwrap();
    assert_eq!(
        (c.access_key_id.as_str(), c.session_token()),
        ("A", Some("T"))
    );
    assert!(c.expiry.is_some());
    // Long-lived keys: no token, no expiry.
    let c = parse_process_output(
        r#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":"S"}"#,
        "p",
    )
    .unwrap();
    assert_eq!((c.session_token(), c.expiry), (None, None));
    for (text, want) in [
        (
            r#"{"AccessKeyId":"A","SecretAccessKey":"LEAK"}"#,
            "no `Version`",
        ),
        (
            r#"{"Version":"1","AccessKeyId":"A","SecretAccessKey":"LEAK"}"#,
            "not 1",
        ),
        (
            r#"{"Version":1,"SecretAccessKey":"LEAK"}"#,
            "no `AccessKeyId`",
        ),
        ("LEAK", "not a JSON credentials document"),
        (
            r#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":"LEAK","Expiration":"soon"}"#,
            "bad expiration",
        ),
    ] {
        let e = parse_process_output(text, "p").unwrap_err();
        assert!(e.contains(want) && !e.contains("LEAK"), "{text}: {e}");
    }
}

#[test]
fn sso_tokens_and_role_credentials() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000);
    let doc = |at: &str| format!(r#"{{"accessToken":"tok","expiresAt":"{at}"}}"#);
    assert_eq!(
        parse_sso_token(&doc("2030-06-01T00:00:00Z"), now).unwrap(),
        "tok"
    );
    // The AWS CLI v1's `UTC` suffix.
    assert_eq!(
        parse_sso_token(&doc("2030-06-01T00:00:00UTC"), now).unwrap(),
        "tok"
    );
    let e = parse_sso_token(&doc("2020-01-01T00:00:00Z"), now).unwrap_err();
    assert!(e.contains("expired at 2020-01-01T00:00:00Z"), "{e}");
    assert!(
        parse_sso_token(r#"{"expiresAt":"2030-06-01T00:00:00Z"}"#, now)
            .unwrap_err()
            .contains("no accessToken")
    );
    assert!(
        parse_sso_token("x", now)
            .unwrap_err()
            .contains("not a token")
    );
    let c = parse_role_credentials(
        r#"{"roleCredentials":{"accessKeyId":"A","secretAccessKey":"S","sessionToken":"T","expiration":1900000000000}}"#,
        "sso",
    )
    .unwrap();
    assert_eq!(c.expiry, Some(now));
    assert!(parse_role_credentials("{}", "sso").is_err());
    // The cache file is named by the SHA-1 of the session (FIPS 180 "abc").
    let env = Env::with_home(Some("/h".into()));
    assert_eq!(
        sso_cache_file(&env, "abc").unwrap(),
        std::path::PathBuf::from("/h/.aws/sso/cache/a9993e364706816aba3e25717850c26c9cd0d89d.json")
    );
    assert_eq!(sso_cache_file(&Env::default(), "abc"), None);
}

#[test]
fn sts_requests_are_signed_for_sts_with_the_body() {
    let c = Credentials::new("AKIDEXAMPLE", "SECRETLEAK", Some("TOK"), None, "t");
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_369_353_600);
    let h = sign_sts(
        &c,
        "eu-west-1",
        "https://sts.eu-west-1.amazonaws.com/",
        &[("host", "sts.eu-west-1.amazonaws.com")],
        b"Action=AssumeRole",
        t,
    )
    .unwrap();
    let auth = &h.iter().find(|(k, _)| k == "authorization").unwrap().1;
    assert!(
        auth.contains("Credential=AKIDEXAMPLE/20130524/eu-west-1/sts/aws4_request"),
        "{auth}"
    );
    assert!(
        h.iter()
            .any(|(k, v)| k == "x-amz-security-token" && v == "TOK")
    );
    assert!(!format!("{h:?}").contains("SECRETLEAK"));
    assert_eq!(
        sts_endpoint(&Env::default(), "eu-west-1"),
        "https://sts.eu-west-1.amazonaws.com"
    );
    let env = Env::default()
        .set("AWS_ENDPOINT_URL", "http://all:1")
        .set("AWS_ENDPOINT_URL_STS", "http://sts:2/");
    assert_eq!(sts_endpoint(&env, "x"), "http://sts:2");
}
