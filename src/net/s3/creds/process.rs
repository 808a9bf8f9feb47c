//! A profile's `credential_process`: a command whose standard output is a
//! JSON credentials document (`Version: 1`, `AccessKeyId`,
//! `SecretAccessKey`, optional `SessionToken` and `Expiration`), as the AWS
//! CLI and SDKs run it. Its standard error goes to ours (a helper may ask
//! the user to log in there); its output never reaches a message.

use std::process::{Command, Stdio};

use serde::Deserialize;

use super::{Credentials, parse_time};

/// Runs `command` (through `sh -c`, as the Rust SDK does on Unix, so quoted
/// arguments work) for profile `profile`. Messages name the program (the
/// command's first word) only: its arguments may carry a secret.
pub fn from_process(profile: &str, command: &str) -> Result<Credentials, String> {
    let program = command.split_whitespace().next().unwrap_or("");
    let what = format!("credential_process `{program}` of profile `{profile}`");
    let out = Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{what}: cannot run: {e}"))?;
    if !out.status.success() {
        let how = match out.status.code() {
            Some(code) => format!("exited with status {code}"),
            None => "was killed by a signal".to_string(),
        };
        return Err(format!("{what} {how}"));
    }
    let text =
        std::str::from_utf8(&out.stdout).map_err(|_| format!("{what}: the output is not UTF-8"))?;
    parse_process_output(text, &format!("profile `{profile}` (credential_process)"))
        .map_err(|e| format!("{what}: {e}"))
}

/// The credentials in a `credential_process` output; errors never quote it.
pub fn parse_process_output(text: &str, source: &str) -> Result<Credentials, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Output {
        version: Option<serde_json::Value>,
        access_key_id: Option<String>,
        secret_access_key: Option<String>,
        session_token: Option<String>,
        expiration: Option<String>,
    }
    let o: Output = serde_json::from_str(text).map_err(|_| {
        "the output is not a JSON credentials document (Version 1, AccessKeyId, SecretAccessKey)"
            .to_string()
    })?;
    match &o.version {
        Some(v) if v.as_u64() == Some(1) => {}
        Some(_) => return Err("the output's `Version` is not 1".to_string()),
        None => return Err("the output has no `Version` (must be 1)".to_string()),
    }
    let id = o
        .access_key_id
        .filter(|s| !s.is_empty())
        .ok_or("the output has no `AccessKeyId`")?;
    let secret = o
        .secret_access_key
        .filter(|s| !s.is_empty())
        .ok_or("the output has no `SecretAccessKey`")?;
    let expiry = o.expiration.as_deref().map(parse_time).transpose()?;
    Ok(Credentials::new(
        &id,
        &secret,
        o.session_token.as_deref().filter(|s| !s.is_empty()),
        expiry,
        source,
    ))
}
