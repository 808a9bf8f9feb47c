//! A profile's `credential_process`: a command whose standard output is a
//! JSON credentials document (`Version: 1`, `AccessKeyId`,
//! `SecretAccessKey`, optional `SessionToken` and `Expiration`), as the AWS
//! CLI and SDKs run it, killed with what it started past [`PROCESS_TIMEOUT`].
//! Its standard error goes to ours (a helper may ask
//! the user to log in there); its output never reaches a message.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{Credentials, parse_time};

/// How long a `credential_process` may run before it is killed: the AWS
/// SDK for Go's `processcreds.DefaultTimeout` (one minute; botocore and
/// the AWS CLI wait for ever, which would hang a loader on a helper that
/// waits for a login no one gives).
pub const PROCESS_TIMEOUT: Duration = Duration::from_secs(60);

/// The most output read from a helper: a credentials document is a few
/// hundred bytes; the Java SDK's `processOutputLimit` is 64,000 bytes.
const MAX_OUTPUT: u64 = 64 * 1024;

/// How often a helper that closed its output is checked for its exit: a
/// helper exits right after writing, so a few milliseconds each.
const EXIT_POLL: Duration = Duration::from_millis(5);

/// Why a `credential_process` gave no credentials. `what` names the
/// program (the command's first word) and the profile, never the
/// arguments (they may carry a secret) or the output.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("{what}: cannot run: {source}")]
    Spawn {
        what: String,
        source: std::io::Error,
    },
    /// It ran past the time-out; it and every process of its group were
    /// killed.
    #[error("{what} did not finish within {} s and was killed", timeout.as_secs_f64())]
    TimedOut { what: String, timeout: Duration },
    #[error("{what} {how}")]
    Failed { what: String, how: String },
    #[error("{what}: {reason}")]
    Output { what: String, reason: String },
}

/// Runs `command` (through `sh -c`, as the Rust SDK does on Unix, so quoted
/// arguments work) for profile `profile`, killed past [`PROCESS_TIMEOUT`].
pub fn from_process(profile: &str, command: &str) -> Result<Credentials, ProcessError> {
    from_process_within(profile, command, PROCESS_TIMEOUT)
}

/// [`from_process`] with a time-out of `timeout`. The helper runs in a
/// process group of its own, so that a time-out kills what it started too.
pub fn from_process_within(
    profile: &str,
    command: &str,
    timeout: Duration,
) -> Result<Credentials, ProcessError> {
    let program = command.split_whitespace().next().unwrap_or("");
    let what = format!("credential_process `{program}` of profile `{profile}`");
    let deadline = Instant::now() + timeout;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .map_err(|source| ProcessError::Spawn {
            what: what.clone(),
            source,
        })?;
    let timed_out = |mut child: Child| {
        kill_group(&mut child);
        ProcessError::TimedOut {
            what: what.clone(),
            timeout,
        }
    };
    // The output is read on a thread of its own, so the time-out holds
    // while the helper writes nothing.
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(mut out) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let r = (&mut out).take(MAX_OUTPUT).read_to_end(&mut b);
            let _ = tx.send(r.map(|_| b));
        });
    }
    let left = deadline.saturating_duration_since(Instant::now());
    let stdout = match rx.recv_timeout(left) {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            kill_group(&mut child);
            return Err(ProcessError::Output {
                what,
                reason: format!("reading the output: {e}"),
            });
        }
        Err(_) => return Err(timed_out(child)),
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() >= deadline => return Err(timed_out(child)),
            Ok(None) => std::thread::sleep(EXIT_POLL),
            Err(e) => {
                kill_group(&mut child);
                return Err(ProcessError::Output {
                    what,
                    reason: format!("waiting for it: {e}"),
                });
            }
        }
    };
    if !status.success() {
        let how = match status.code() {
            Some(code) => format!("exited with status {code}"),
            None => "was killed by a signal".to_string(),
        };
        return Err(ProcessError::Failed { what, how });
    }
    let text = std::str::from_utf8(&stdout).map_err(|_| ProcessError::Output {
        what: what.clone(),
        reason: "the output is not UTF-8".into(),
    })?;
    parse_process_output(text, &format!("profile `{profile}` (credential_process)"))
        .map_err(|reason| ProcessError::Output { what, reason })
}

/// Kills the helper's process group and reaps the helper. It has not been
/// reaped before this, so its id (and its group's) is not anyone else's.
fn kill_group(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: plain killpg(2) of the group the child leads; an error
        // (the group is gone already) changes nothing.
        unsafe { libc::killpg(pid, libc::SIGKILL) };
    }
    let _ = child.wait();
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
