//! Wake gates: a workspace script a cron job runs before each fire to decide whether the model turn is worth a call.
//!
//! The script lives in the agent's workspace (operator content: no turn, tool or API method writes there, but
//! whatever else runs on the host may), so it is treated as untrusted: path rules are re-checked at every run, and
//! it runs on the process runner ([`crate::proc`]: no shell, a scrubbed environment, its own process group killed
//! whole on timeout, on a kill of its run and once it exits, bounded output) under [`gate_limits`]. This file keeps
//! only the gate's own rules: the script checks, the private home, its variables and the reply protocol. Every
//! failure *fails open* (the fire goes ahead): a broken gate must never silently stop a job.
//!
//! A gate's `HOME` is a private directory of its agent outside every workspace
//! (`<dataDir>/gates/<agent>/home`, mode 0700, checked and repaired at every run): credentials the tools
//! it runs write there (`.netrc`, `.config/...`) never land in the workspace, which `memory.get_file` and
//! the agent's own turns read. Gates are declared in the configuration file only, never through the API.
//!
//! Protocol: exit 0 with stdout `{"wake": bool, "toolCalls"?: n}` decides by `wake`; exit 0 with any other
//! stdout (empty, not JSON, not exactly one such object, or more than [`MAX_OUTPUT`] bytes) wakes; exit
//! [`SKIP_EXIT_CODE`] skips; anything else fails open with a reason. A printed `toolCalls` is a
//! self-report and is not recorded: the fire counts the `tool.invoke` calls the gate made with
//! the lease its environment carries (`AGENT_GATEWAY_LEASE`, on the socket named by
//! `AGENT_GATEWAY_CAPABILITY_SOCKET`; `fire.rs`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::proc::{self, Captured, Exit};

/// Most arguments a gate may be given.
pub const MAX_ARGS: usize = 16;
/// Bytes of stdout (and of stderr) kept from a gate; the rest is read and discarded.
pub const MAX_OUTPUT: usize = 4096;
/// Longest accepted `script` path, in bytes.
pub const MAX_SCRIPT_LEN: usize = 512;
/// Longest accepted single argument, in bytes.
pub const MAX_ARG_LEN: usize = 4096;
/// Accepted range of `timeout_seconds`.
pub const MIN_TIMEOUT_SECONDS: u32 = 1;
/// Accepted range of `timeout_seconds`.
pub const MAX_TIMEOUT_SECONDS: u32 = 300;
/// Exit code by which a gate says "skip" without printing anything.
pub const SKIP_EXIT_CODE: i32 = 10;
/// RLIMIT_AS of each process of a gate: 1 GiB of address space.
pub const GATE_ADDRESS_SPACE_BYTES: u64 = 1 << 30;
/// RLIMIT_NOFILE of each process of a gate.
pub const GATE_OPEN_FILES: u64 = 256;

/// Mode of a gate's home and of the directories above it that the gateway creates.
const HOME_MODE: u32 = 0o700;

use crate::config::scheduler::GateSpec;

/// What the gate is told about the fire, through `GATEWAY_*` environment variables.
#[derive(Debug, Clone, Copy)]
pub struct GateEnv<'a> {
    pub job_id: &'a str,
    pub job_name: &'a str,
    pub agent_id: &'a str,
    pub due_at_ms: i64,
    /// The capability socket and the lease of the run registered for the gate's duration
    /// (`AGENT_GATEWAY_CAPABILITY_SOCKET`, `AGENT_GATEWAY_LEASE`); None: neither is set.
    pub capability: Option<(&'a Path, &'a str)>,
    /// Cancelled by a kill of the gate's run (`run.kill`): the gate's process group is killed
    /// at once and the gate fails open.
    pub cancel: Option<&'a tokio_util::sync::CancellationToken>,
}

/// Why a gate's process did not run to a decision (the `failureClass` of `obs.explain`'s
/// `orchestrate` entries, with [`Failure::Killed`] reported as `lease_absent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The script could not be started (path rules, not found, not executable, spawn error).
    SpawnFail,
    /// It ran past `timeout_seconds`; its group was killed.
    Timeout,
    /// It exited 0 with more than [`MAX_OUTPUT`] bytes of stdout (its reply was not read).
    StdoutCap,
    /// It exited with a code other than 0 and [`SKIP_EXIT_CODE`], or by a signal.
    NonzeroExit,
    /// Its run was killed (`run.kill`), which killed its group.
    Killed,
}

/// What to do with this fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Run the model turn.
    Wake,
    /// Do not run the model turn.
    Skip,
    /// The gate could not decide; the model turn runs.
    FailedOpen,
}

impl Decision {
    /// Stable name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Wake => "wake",
            Decision::Skip => "skip",
            Decision::FailedOpen => "failed_open",
        }
    }
}

/// Result of one gate run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateOutcome {
    pub decision: Decision,
    /// Wall time from the start of the checks to the decision.
    pub duration_ms: u64,
    /// Why the gate failed open; `None` for `Wake` and `Skip`.
    pub reason: Option<String>,
    /// Tool calls the gate reports having made (`toolCalls`), 0 when absent: a self-report,
    /// logged but not recorded (the fire records the calls made with its lease).
    pub tool_calls: u32,
    /// The process's exit code; None when it never started, was killed or ended by a signal.
    pub exit_code: Option<i32>,
    /// Why it did not run to a decision; None when it did (exit 0 with a readable reply, or
    /// the skip code).
    pub failure: Option<Failure>,
}

/// Configuration-time check of the script path alone.
pub fn check_script_path(script: &str) -> Result<(), String> {
    if script.is_empty() {
        return Err("script path is empty".to_owned());
    }
    if script.len() > MAX_SCRIPT_LEN {
        return Err(format!("script path is longer than {MAX_SCRIPT_LEN} bytes"));
    }
    if script.contains('\0') {
        return Err("script path contains a NUL byte".to_owned());
    }
    let path = Path::new(script);
    if path.is_absolute() {
        return Err("script path must be relative to the workspace".to_owned());
    }
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err("script path must not contain `..`".to_owned());
    }
    Ok(())
}

/// Configuration-time check of a whole spec; `run_gate` repeats it so a spec built elsewhere is safe too.
pub fn check_spec(spec: &GateSpec) -> Result<(), String> {
    check_script_path(&spec.script)?;
    if spec.args.len() > MAX_ARGS {
        return Err(format!(
            "{} arguments, at most {MAX_ARGS} allowed",
            spec.args.len()
        ));
    }
    for (i, arg) in spec.args.iter().enumerate() {
        if arg.len() > MAX_ARG_LEN {
            return Err(format!("argument {i} is longer than {MAX_ARG_LEN} bytes"));
        }
        if arg.contains('\0') {
            return Err(format!("argument {i} contains a NUL byte"));
        }
    }
    if !(MIN_TIMEOUT_SECONDS..=MAX_TIMEOUT_SECONDS).contains(&spec.timeout_seconds) {
        return Err(format!(
            "timeout_seconds must be {MIN_TIMEOUT_SECONDS}..={MAX_TIMEOUT_SECONDS}, got {}",
            spec.timeout_seconds
        ));
    }
    Ok(())
}

/// The private `HOME` of `agent_id`'s gates: `<data_dir>/gates/<agent>/home`, beside the workspaces
/// (`<data_dir>/workspaces/<agent>`), never inside one. An agent id that is not a plain file name (the
/// configuration file does not restrict them) is hex-encoded behind a `%`, which no plain id contains, so
/// it can neither leave `gates/` nor share another agent's home.
pub fn home_dir(data_dir: &Path, agent_id: &str) -> PathBuf {
    let plain = !agent_id.is_empty()
        && agent_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let name = if plain {
        agent_id.to_owned()
    } else {
        agent_id.bytes().fold(String::from("%"), |mut out, b| {
            out.push_str(&format!("{b:02x}"));
            out
        })
    };
    data_dir.join("gates").join(name).join("home")
}

/// Makes `home` a directory of mode 0700 (created with its missing parents, 0700 as well; a wrong mode is
/// repaired) that is not a symlink and lies outside the canonical `workspace`. Its canonical path, or a
/// fail-open reason.
async fn private_home(home: &Path, workspace: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    let home = home.to_owned();
    let workspace = workspace.to_owned();
    tokio::task::spawn_blocking(move || -> Result<PathBuf, String> {
        let fail = |e: std::io::Error| format!("gate home: {e}");
        // Judged before anything is created, on the deepest part of the path that exists (the rest
        // cannot be a symlink yet), so a refused home leaves nothing behind in the workspace.
        let planned = home
            .ancestors()
            .find_map(|a| {
                let canon = std::fs::canonicalize(a).ok()?;
                Some(canon.join(home.strip_prefix(a).ok()?))
            })
            .ok_or_else(|| "gate home: no usable parent".to_owned())?;
        if planned.starts_with(&workspace) || workspace.starts_with(&planned) {
            return Err("gate home: overlaps the workspace".to_owned());
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(HOME_MODE)
            .create(&home)
            .map_err(fail)?;
        // Not followed: a symlink planted in its place could point anywhere, the workspace included.
        let meta = std::fs::symlink_metadata(&home).map_err(fail)?;
        if !meta.file_type().is_dir() {
            return Err("gate home: not a directory".to_owned());
        }
        if meta.permissions().mode() & 0o7777 != HOME_MODE {
            tracing::warn!(
                home = %home.display(),
                mode = %format!("{:o}", meta.permissions().mode() & 0o7777),
                "wake gate home had the wrong mode; set to 0700"
            );
            std::fs::set_permissions(&home, std::fs::Permissions::from_mode(HOME_MODE))
                .map_err(fail)?;
        }
        let home = std::fs::canonicalize(&home).map_err(fail)?;
        if home.starts_with(&workspace) || workspace.starts_with(&home) {
            return Err("gate home: overlaps the workspace".to_owned());
        }
        Ok(home)
    })
    .await
    .map_err(|e| format!("gate home: {e}"))?
}

/// Runs the gate once and decides, with `home` (see [`home_dir`]) as its private `HOME`. Never panics;
/// returns within about `timeout_seconds` + 1 s.
pub async fn run_gate(
    workspace: &Path,
    home: &Path,
    spec: &GateSpec,
    env: &GateEnv<'_>,
) -> GateOutcome {
    let started = Instant::now();
    let verdict = match run_checked(workspace, home, spec, env).await {
        Ok(v) => v,
        Err(reason) => Verdict {
            failure: Some(Failure::SpawnFail),
            ..Verdict::failed(reason, String::new())
        },
    };
    let Verdict {
        decision,
        tool_calls,
        reason,
        stderr,
        exit_code,
        failure,
    } = verdict;
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    tracing::debug!(
        job_id = env.job_id,
        agent_id = env.agent_id,
        decision = decision.as_str(),
        reason = reason.as_deref().unwrap_or(""),
        tool_calls,
        duration_ms,
        stderr = %stderr,
        "wake gate finished"
    );
    GateOutcome {
        decision,
        duration_ms,
        reason,
        tool_calls,
        exit_code,
        failure,
    }
}

struct Verdict {
    decision: Decision,
    tool_calls: u32,
    reason: Option<String>,
    stderr: String,
    exit_code: Option<i32>,
    failure: Option<Failure>,
}

impl Verdict {
    fn failed(reason: String, stderr: String) -> Self {
        Verdict {
            decision: Decision::FailedOpen,
            tool_calls: 0,
            reason: Some(reason),
            stderr,
            exit_code: None,
            failure: Some(Failure::NonzeroExit),
        }
    }
}

/// `Err` is a fail-open reason for anything that went wrong before the gate produced a result.
async fn run_checked(
    workspace: &Path,
    home: &Path,
    spec: &GateSpec,
    env: &GateEnv<'_>,
) -> Result<Verdict, String> {
    check_spec(spec)?;
    let (workspace, script) = resolve_script(workspace, &spec.script).await?;
    let home = private_home(home, &workspace).await?;
    let outcome = proc::run(process_spec(&workspace, &home, &script, spec, env)).await;
    let stdout = outcome.stdout;
    let stderr_text = sanitize_stderr(&outcome.stderr.kept);

    Ok(match outcome.exit {
        Exit::SpawnFailed(e) => return Err(format!("spawn failed: {e}")),
        Exit::WaitFailed(e) => Verdict::failed(format!("waiting for the gate: {e}"), stderr_text),
        Exit::Cancelled => Verdict {
            failure: Some(Failure::Killed),
            ..Verdict::failed("killed with its run".to_owned(), stderr_text)
        },
        Exit::Timeout => Verdict {
            failure: Some(Failure::Timeout),
            ..Verdict::failed(
                format!("timed out after {} s", spec.timeout_seconds),
                stderr_text,
            )
        },
        Exit::Code(0) => {
            let (decision, tool_calls) = parse_reply(&stdout);
            Verdict {
                decision,
                tool_calls,
                reason: None,
                stderr: stderr_text,
                exit_code: Some(0),
                failure: stdout.truncated.then_some(Failure::StdoutCap),
            }
        }
        Exit::Code(SKIP_EXIT_CODE) => Verdict {
            decision: Decision::Skip,
            tool_calls: 0,
            reason: None,
            stderr: stderr_text,
            exit_code: Some(SKIP_EXIT_CODE),
            failure: None,
        },
        Exit::Code(code) => Verdict {
            exit_code: Some(code),
            ..Verdict::failed(format!("exit status {code}"), stderr_text)
        },
        Exit::Signal(sig) => Verdict::failed(format!("killed by signal {sig}"), stderr_text),
    })
}

/// Returns the canonical workspace and the canonical script path, or a fail-open reason.
async fn resolve_script(workspace: &Path, script: &str) -> Result<(PathBuf, PathBuf), String> {
    let workspace = tokio::fs::canonicalize(workspace)
        .await
        .map_err(|e| format!("workspace: {e}"))?;
    let script = match tokio::fs::canonicalize(workspace.join(script)).await {
        Ok(path) => path,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err("not found".to_owned()),
        Err(e) => return Err(format!("script: {e}")),
    };
    // Canonical paths, so a symlink (at any level) that leads out of the workspace is caught here.
    if !script.starts_with(&workspace) || script == workspace {
        return Err("outside the workspace".to_owned());
    }
    let meta = tokio::fs::metadata(&script)
        .await
        .map_err(|e| format!("script: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".to_owned());
    }
    let mode = meta.permissions().mode();
    if mode & 0o100 == 0 {
        return Err("not executable".to_owned());
    }
    // Writable by others means someone besides the owner could swap in their own gate.
    if mode & 0o022 != 0 {
        return Err("group- or world-writable".to_owned());
    }
    Ok((workspace, script))
}

/// The gate's process: the script without a shell, in the workspace, with its private `HOME`, the
/// `GATEWAY_*` variables and the capability socket and lease, [`MAX_OUTPUT`] bytes of each pipe,
/// its timeout, its run's kill token and the [`gate_limits`].
fn process_spec(
    workspace: &Path,
    home: &Path,
    script: &Path,
    spec: &GateSpec,
    env: &GateEnv<'_>,
) -> proc::Spec {
    let mut p = proc::Spec::new(script, workspace, home)
        .env("GATEWAY_JOB_ID", env.job_id)
        .env("GATEWAY_JOB_NAME", env.job_name)
        .env("GATEWAY_AGENT_ID", env.agent_id)
        .env("GATEWAY_DUE_AT_MS", env.due_at_ms.to_string());
    if let Some((socket, lease)) = env.capability {
        p = p
            .env(crate::runtime::capability::ENV_SOCKET, socket)
            .env(crate::runtime::capability::ENV_LEASE, lease);
    }
    p.args = spec.args.iter().map(Into::into).collect();
    p.stdout_cap = MAX_OUTPUT;
    p.stderr_cap = MAX_OUTPUT;
    p.timeout = Some(Duration::from_secs(u64::from(spec.timeout_seconds)));
    p.cancel = env.cancel.cloned();
    p.limits = gate_limits(spec.timeout_seconds);
    p
}

/// A gate's resource limits (per process of its group): CPU seconds = its timeout (a gate that
/// only computes cannot outlast it), [`GATE_ADDRESS_SPACE_BYTES`] of address space and
/// [`GATE_OPEN_FILES`] descriptors. No process limit: RLIMIT_NPROC counts every process of
/// the gateway's user (its own threads included), so no small number is safe to set.
pub fn gate_limits(timeout_seconds: u32) -> proc::Limits {
    proc::Limits {
        cpu_seconds: Some(u64::from(timeout_seconds)),
        address_space_bytes: Some(GATE_ADDRESS_SPACE_BYTES),
        open_files: Some(GATE_OPEN_FILES),
        processes: None,
    }
}

#[derive(Deserialize)]
struct Reply {
    wake: bool,
    #[serde(default, rename = "toolCalls")]
    tool_calls: Option<serde_json::Value>,
}

/// Decision for an exit-0 gate. Output cut at [`MAX_OUTPUT`] is not parsed at all (wake): a reply is the
/// whole of stdout, and a cut one is not known to be whole.
fn parse_reply(stdout: &Captured) -> (Decision, u32) {
    if stdout.truncated {
        return (Decision::Wake, 0);
    }
    let Ok(text) = std::str::from_utf8(&stdout.kept) else {
        return (Decision::Wake, 0);
    };
    match serde_json::from_str::<Reply>(text.trim()) {
        Ok(reply) => {
            let decision = if reply.wake {
                Decision::Wake
            } else {
                Decision::Skip
            };
            (decision, reply.tool_calls.as_ref().map_or(0, clamp_count))
        }
        Err(_) => (Decision::Wake, 0),
    }
}

fn clamp_count(value: &serde_json::Value) -> u32 {
    if let Some(n) = value.as_u64() {
        return u32::try_from(n).unwrap_or(u32::MAX);
    }
    match value.as_f64() {
        // `as` saturates and maps NaN to 0, which is the clamp wanted here.
        Some(f) if f > 0.0 => f as u32,
        _ => 0,
    }
}

/// Stderr is only for a debug line: control characters become spaces so it cannot forge log lines.
fn sanitize_stderr(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len().min(MAX_OUTPUT));
    for c in text.trim().chars() {
        let c = if c.is_control() { ' ' } else { c };
        if out.len() + c.len_utf8() > MAX_OUTPUT {
            break;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::proc::tests::wait_gone;
    use std::collections::HashSet;

    const ENV: GateEnv<'static> = GateEnv {
        job_id: "job-1",
        job_name: "nightly digest",
        agent_id: "agent-7",
        due_at_ms: 1_700_000_000_123,
        capability: None,
        cancel: None,
    };

    fn spec(script: &str, timeout_seconds: u32) -> GateSpec {
        GateSpec {
            script: script.to_owned(),
            args: Vec::new(),
            timeout_seconds,
        }
    }

    /// Runs a gate with a fresh private home beside (never inside) the workspace.
    async fn gate(ws: &Path, spec: &GateSpec) -> GateOutcome {
        let home = tempfile::tempdir().unwrap();
        run_gate(ws, &home.path().join("home"), spec, &ENV).await
    }

    fn write_script(dir: &Path, name: &str, body: &str, mode: u32) {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Runs `body` as a 0o755 gate with the given timeout and checks the run stayed bounded.
    async fn run_body(body: &str, timeout_seconds: u32) -> (GateOutcome, tempfile::TempDir) {
        let ws = tempfile::tempdir().unwrap();
        write_script(ws.path(), "gate.sh", body, 0o755);
        let started = Instant::now();
        let out = gate(ws.path(), &spec("gate.sh", timeout_seconds)).await;
        assert!(
            started.elapsed() < Duration::from_secs(u64::from(timeout_seconds) + 5),
            "gate run not bounded: {:?}",
            started.elapsed()
        );
        (out, ws)
    }

    fn assert_failed(out: &GateOutcome, reason_part: &str) {
        assert_eq!(out.decision, Decision::FailedOpen, "{out:?}");
        let reason = out.reason.as_deref().unwrap_or("");
        assert!(
            reason.contains(reason_part),
            "reason {reason:?} lacks {reason_part:?}"
        );
    }

    #[tokio::test]
    async fn json_skip_with_tool_calls() {
        let (out, _ws) = run_body(r#"echo '{"wake": false, "toolCalls": 3}'"#, 10).await;
        assert_eq!(out.decision, Decision::Skip);
        assert_eq!(out.tool_calls, 3);
        assert_eq!(out.reason, None);
    }

    #[tokio::test]
    async fn json_wake() {
        let (out, _ws) = run_body(r#"printf '  \n{"wake": true}\n\n'"#, 10).await;
        assert_eq!(out.decision, Decision::Wake);
        assert_eq!(out.tool_calls, 0);
    }

    #[tokio::test]
    async fn tool_calls_clamped() {
        let (out, _ws) = run_body(r#"echo '{"wake": true, "toolCalls": 99999999999}'"#, 10).await;
        assert_eq!((out.decision, out.tool_calls), (Decision::Wake, u32::MAX));
        let (out, _ws) = run_body(r#"echo '{"wake": false, "toolCalls": -4}'"#, 10).await;
        assert_eq!((out.decision, out.tool_calls), (Decision::Skip, 0));
    }

    #[tokio::test]
    async fn exit_ten_skips() {
        let (out, _ws) = run_body("echo whatever; exit 10", 10).await;
        assert_eq!(out.decision, Decision::Skip);
        assert_eq!(out.tool_calls, 0);
        assert_eq!((out.exit_code, out.failure), (Some(SKIP_EXIT_CODE), None));
    }

    #[tokio::test]
    async fn exit_zero_empty_wakes() {
        let (out, _ws) = run_body("exit 0", 10).await;
        assert_eq!(out.decision, Decision::Wake);
        assert_eq!(out.reason, None);
        assert_eq!((out.exit_code, out.failure), (Some(0), None));
    }

    #[tokio::test]
    async fn exit_zero_garbage_wakes() {
        let (out, _ws) = run_body("echo 'not json {'; echo '{\"wake\": false}' >&2", 10).await;
        assert_eq!(out.decision, Decision::Wake);
        // JSON of the wrong shape is not a reply either.
        let (out, _ws) = run_body(r#"echo '{"wake": "no"}'"#, 10).await;
        assert_eq!(out.decision, Decision::Wake);
    }

    #[tokio::test]
    async fn exit_one_fails_open() {
        let (out, _ws) = run_body("echo oops >&2; exit 1", 10).await;
        assert_failed(&out, "exit status 1");
        assert_eq!(out.reason.as_deref(), Some("exit status 1"));
        assert_eq!(
            (out.exit_code, out.failure),
            (Some(1), Some(Failure::NonzeroExit))
        );
    }

    #[tokio::test]
    async fn killed_by_signal() {
        let (out, _ws) = run_body("kill -9 $$", 10).await;
        assert_eq!(out.reason.as_deref(), Some("killed by signal 9"));
        assert_eq!(out.decision, Decision::FailedOpen);
        assert_eq!(
            (out.exit_code, out.failure),
            (None, Some(Failure::NonzeroExit))
        );
    }

    #[tokio::test]
    async fn timeout_fails_open() {
        let (out, _ws) = run_body("sleep 30", 1).await;
        assert_eq!(out.decision, Decision::FailedOpen);
        assert_eq!(out.reason.as_deref(), Some("timed out after 1 s"));
        assert_eq!((out.exit_code, out.failure), (None, Some(Failure::Timeout)));
    }

    #[tokio::test]
    async fn a_kill_of_the_gates_run_kills_its_group_at_once() {
        let ws = tempfile::tempdir().unwrap();
        write_script(
            ws.path(),
            "gate.sh",
            "sleep 30 &\necho $! > child.pid\nsleep 30",
            0o755,
        );
        let home = tempfile::tempdir().unwrap();
        let cancel = tokio_util::sync::CancellationToken::new();
        let env = GateEnv {
            cancel: Some(&cancel),
            ..ENV
        };
        let killer = cancel.clone();
        let pid_file = ws.path().join("child.pid");
        let watch = pid_file.clone();
        #[allow(clippy::disallowed_methods, reason = "test")]
        tokio::spawn(async move {
            while !watch.exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            killer.cancel();
        });
        let started = Instant::now();
        let out = run_gate(
            ws.path(),
            &home.path().join("home"),
            &spec("gate.sh", 60),
            &env,
        )
        .await;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert_failed(&out, "killed with its run");
        assert_eq!((out.exit_code, out.failure), (None, Some(Failure::Killed)));
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(wait_gone(pid).await, "grandchild {pid} survived the kill");
    }

    #[tokio::test]
    async fn timeout_kills_grandchild() {
        let (out, ws) = run_body("sleep 30 &\necho $! > child.pid\nsleep 30", 1).await;
        assert_failed(&out, "timed out after 1 s");
        let pid: u32 = std::fs::read_to_string(ws.path().join("child.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(wait_gone(pid).await, "grandchild {pid} survived the gate");
    }

    #[tokio::test]
    async fn clean_exit_sweeps_background_grandchild() {
        // The grandchild holds no pipe, so nothing but the group sweep would stop it.
        let (out, ws) = run_body(
            "sleep 30 >/dev/null 2>&1 &\necho $! > child.pid\nexit 10",
            10,
        )
        .await;
        assert_eq!(out.decision, Decision::Skip);
        let pid: u32 = std::fs::read_to_string(ws.path().join("child.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(wait_gone(pid).await, "grandchild {pid} survived the gate");
    }

    #[tokio::test]
    async fn flood_of_output_is_bounded_and_wakes() {
        // A valid reply followed by 1 MiB on stdout (and on stderr): the kept 4 KiB prefix is not a whole
        // reply, so by design this wakes rather than reading the leading JSON as a skip.
        let (out, _ws) = run_body(
            "echo '{\"wake\": false}'\nhead -c 1048576 /dev/zero | tr '\\0' x\nhead -c 1048576 /dev/zero | tr '\\0' y >&2\nexit 0",
            20,
        )
        .await;
        assert_eq!(out.decision, Decision::Wake, "{out:?}");
        assert_eq!(out.reason, None);
    }

    #[test]
    fn truncated_reply_is_not_parsed() {
        let mut kept = br#"{"wake": false}"#.to_vec();
        kept.resize(MAX_OUTPUT, b' ');
        let full = Captured {
            kept: kept.clone(),
            total: MAX_OUTPUT,
            truncated: false,
        };
        assert_eq!(parse_reply(&full), (Decision::Skip, 0));
        let cut = Captured {
            kept,
            total: MAX_OUTPUT + 1,
            truncated: true,
        };
        assert_eq!(parse_reply(&cut), (Decision::Wake, 0));
    }

    #[tokio::test]
    async fn a_reply_past_the_cap_wakes_and_is_classed_stdout_cap() {
        let (out, _ws) = run_body("head -c 5000 /dev/zero | tr '\\0' x; exit 0", 10).await;
        assert_eq!(out.decision, Decision::Wake);
        assert_eq!(
            (out.exit_code, out.failure),
            (Some(0), Some(Failure::StdoutCap))
        );
    }

    #[tokio::test]
    async fn environment_is_scrubbed() {
        let ws = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        write_script(
            ws.path(),
            "gate.sh",
            "env > env.txt; pwd > pwd.txt; echo \"$1|$2\" > args.txt",
            0o755,
        );
        let home = home_dir(data.path(), "agent-7");
        let out = run_gate(ws.path(), &home, &spec("gate.sh", 10), &ENV).await;
        assert_eq!(out.decision, Decision::Wake, "{out:?}");
        let canon = std::fs::canonicalize(ws.path()).unwrap();
        let canon = canon.to_str().unwrap();
        let home_canon = std::fs::canonicalize(&home).unwrap();
        let home_canon = home_canon.to_str().unwrap();

        let vars: Vec<(String, String)> = std::fs::read_to_string(ws.path().join("env.txt"))
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let get = |name: &str| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("PATH"), Some("/usr/local/bin:/usr/bin:/bin"));
        // A private home, not the workspace.
        assert_eq!(get("HOME"), Some(home_canon));
        assert_ne!(get("HOME"), Some(canon));
        assert_eq!(get("LANG"), Some("C.UTF-8"));
        assert_eq!(get("GATEWAY_JOB_ID"), Some("job-1"));
        assert_eq!(get("GATEWAY_JOB_NAME"), Some("nightly digest"));
        assert_eq!(get("GATEWAY_AGENT_ID"), Some("agent-7"));
        assert_eq!(get("GATEWAY_DUE_AT_MS"), Some("1700000000123"));

        // Variables the shell itself sets are not leaks.
        let allowed: HashSet<&str> = [
            "PATH",
            "HOME",
            "LANG",
            "GATEWAY_JOB_ID",
            "GATEWAY_JOB_NAME",
            "GATEWAY_AGENT_ID",
            "GATEWAY_DUE_AT_MS",
            "PWD",
            "OLDPWD",
            "SHLVL",
            "_",
        ]
        .into_iter()
        .collect();
        for (k, _) in &vars {
            assert!(allowed.contains(k.as_str()), "leaked variable {k}");
        }
        // Without set_var (unsafe in edition 2024): the test process always has something outside the list
        // (cargo sets CARGO_*), and none of it reached the gate.
        let outside: Vec<String> = std::env::vars()
            .map(|(k, _)| k)
            .filter(|k| !allowed.contains(k.as_str()))
            .collect();
        assert!(!outside.is_empty());

        assert_eq!(
            std::fs::read_to_string(ws.path().join("pwd.txt"))
                .unwrap()
                .trim(),
            canon
        );
    }

    #[tokio::test]
    async fn a_gate_runs_under_its_default_limits() {
        let (out, ws) = run_body(
            "ulimit -n > nofile.txt; ulimit -t > cpu.txt; ulimit -v > as.txt; exit 10",
            7,
        )
        .await;
        assert_eq!(out.decision, Decision::Skip, "{out:?}");
        let read = |name: &str| {
            std::fs::read_to_string(ws.path().join(name))
                .unwrap()
                .trim()
                .to_owned()
        };
        let hard_nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .maximum
            .unwrap_or(u64::MAX);
        assert_eq!(
            read("nofile.txt"),
            GATE_OPEN_FILES.min(hard_nofile).to_string()
        );
        assert_eq!(read("cpu.txt"), "7");
        // `ulimit -v` counts KiB.
        assert_eq!(
            read("as.txt"),
            (GATE_ADDRESS_SPACE_BYTES / 1024).to_string()
        );
    }

    #[tokio::test]
    async fn args_passed_without_shell() {
        let ws = tempfile::tempdir().unwrap();
        write_script(
            ws.path(),
            "gate.sh",
            "printf '%s|' \"$@\" > args.txt",
            0o755,
        );
        let mut s = spec("gate.sh", 10);
        s.args = vec![
            "a b".to_owned(),
            "$HOME".to_owned(),
            "; rm -rf x".to_owned(),
        ];
        let out = gate(ws.path(), &s).await;
        assert_eq!(out.decision, Decision::Wake, "{out:?}");
        assert_eq!(
            std::fs::read_to_string(ws.path().join("args.txt")).unwrap(),
            "a b|$HOME|; rm -rf x|"
        );
    }

    #[tokio::test]
    async fn group_writable_fails_open() {
        let ws = tempfile::tempdir().unwrap();
        write_script(ws.path(), "gate.sh", "exit 10", 0o775);
        let out = gate(ws.path(), &spec("gate.sh", 5)).await;
        assert_failed(&out, "group- or world-writable");
        write_script(ws.path(), "gate2.sh", "exit 10", 0o757);
        let out = gate(ws.path(), &spec("gate2.sh", 5)).await;
        assert_failed(&out, "group- or world-writable");
    }

    #[tokio::test]
    async fn not_executable_fails_open() {
        let ws = tempfile::tempdir().unwrap();
        write_script(ws.path(), "gate.sh", "exit 10", 0o644);
        let out = gate(ws.path(), &spec("gate.sh", 5)).await;
        assert_failed(&out, "not executable");
    }

    #[tokio::test]
    async fn symlink_outside_workspace_fails_open() {
        let ws = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/bin/true", ws.path().join("gate")).unwrap();
        let out = gate(ws.path(), &spec("gate", 5)).await;
        assert_failed(&out, "outside the workspace");
    }

    #[tokio::test]
    async fn symlink_inside_workspace_is_followed() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws.path().join("bin")).unwrap();
        write_script(ws.path(), "bin/real.sh", "exit 10", 0o755);
        std::os::unix::fs::symlink("bin/real.sh", ws.path().join("gate")).unwrap();
        let out = gate(ws.path(), &spec("gate", 5)).await;
        assert_eq!(out.decision, Decision::Skip, "{out:?}");
    }

    #[tokio::test]
    async fn missing_and_odd_paths_fail_open() {
        let ws = tempfile::tempdir().unwrap();
        let out = gate(ws.path(), &spec("nope.sh", 5)).await;
        assert_failed(&out, "not found");
        assert_eq!(
            (out.exit_code, out.failure),
            (None, Some(Failure::SpawnFail))
        );
        std::fs::create_dir(ws.path().join("dir")).unwrap();
        let out = gate(ws.path(), &spec("dir", 5)).await;
        assert_failed(&out, "not a regular file");
        let out = gate(ws.path(), &spec(".", 5)).await;
        assert_failed(&out, "outside the workspace");
        // Run-time repetition of the configuration checks.
        let out = gate(ws.path(), &spec("../x", 5)).await;
        assert_failed(&out, "..");
        let out = gate(ws.path(), &spec("gate.sh", 0)).await;
        assert_failed(&out, "timeout_seconds");
        let out = gate(&ws.path().join("gone"), &spec("gate.sh", 5)).await;
        assert_failed(&out, "workspace");
    }

    #[tokio::test]
    async fn not_a_valid_executable_fails_open_with_spawn_error() {
        let ws = tempfile::tempdir().unwrap();
        let path = ws.path().join("gate.bin");
        std::fs::write(&path, b"\x7fELF garbage").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = gate(ws.path(), &spec("gate.bin", 5)).await;
        assert_failed(&out, "spawn failed");
    }

    #[tokio::test]
    async fn script_without_shebang_is_not_run_by_a_shell() {
        let ws = tempfile::tempdir().unwrap();
        let path = ws.path().join("gate.sh");
        std::fs::write(&path, "exit 10\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = gate(ws.path(), &spec("gate.sh", 5)).await;
        assert_failed(&out, "spawn failed");
    }

    #[tokio::test]
    async fn escaped_descendant_holding_stdout_does_not_hold_the_decision() {
        // setsid leaves the group, so the sweep misses it and it keeps stdout open; the decision must come
        // from the gate's own exit within the read grace, not at the 30 s timeout.
        let (out, ws) = run_body(
            "setsid sleep 30 &\necho $! > child.pid\nsleep 0.5\necho '{\"wake\": false}'\nexit 0",
            30,
        )
        .await;
        let pid: i32 = std::fs::read_to_string(ws.path().join("child.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::KILL,
        );
        assert_eq!(out.decision, Decision::Skip, "{out:?}");
        assert!(out.duration_ms < 10_000, "{out:?}");
    }

    #[test]
    fn check_spec_limits() {
        let ok = |s: &GateSpec| check_spec(s).is_ok();
        assert!(ok(&spec("gate.sh", 1)));
        assert!(ok(&spec("gates/./gate.sh", 300)));
        assert!(!ok(&spec("/usr/bin/true", 5)));
        assert!(!ok(&spec("../x", 5)));
        assert!(!ok(&spec("a/../../x", 5)));
        assert!(!ok(&spec("", 5)));
        assert!(!ok(&spec(&"a".repeat(MAX_SCRIPT_LEN + 1), 5)));
        assert!(ok(&spec(&"a".repeat(MAX_SCRIPT_LEN), 5)));
        assert!(!ok(&spec("gate.sh", 0)));
        assert!(!ok(&spec("gate.sh", 301)));

        let mut s = spec("gate.sh", 5);
        s.args = vec!["x".to_owned(); MAX_ARGS];
        assert!(ok(&s));
        s.args.push("x".to_owned());
        assert!(!ok(&s));
        s.args = vec!["y".repeat(MAX_ARG_LEN)];
        assert!(ok(&s));
        s.args = vec!["y".repeat(MAX_ARG_LEN + 1)];
        assert!(!ok(&s));
        s.args = vec!["a\0b".to_owned()];
        assert!(!ok(&s));
    }

    #[test]
    fn decision_names() {
        assert_eq!(Decision::Wake.as_str(), "wake");
        assert_eq!(Decision::Skip.as_str(), "skip");
        assert_eq!(Decision::FailedOpen.as_str(), "failed_open");
    }

    #[test]
    fn stderr_sanitized_and_bounded() {
        assert_eq!(sanitize_stderr(b"a\x1b[31mb\nc\r\n"), "a [31mb c");
        let long = "é".repeat(MAX_OUTPUT);
        let s = sanitize_stderr(long.as_bytes());
        assert!(s.len() <= MAX_OUTPUT);
        assert!(sanitize_stderr(&[0xff, 0xfe])
            .chars()
            .all(|c| c == '\u{fffd}'));
    }

    #[test]
    fn spec_serde_round_trip() {
        let s: GateSpec =
            serde_json::from_str(r#"{"script": "gate.sh", "timeoutSeconds": 5}"#).unwrap();
        assert_eq!(s, spec("gate.sh", 5));
        let back: GateSpec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    fn mode_of(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[tokio::test]
    async fn home_is_private_and_outside_the_workspace() {
        let data = tempfile::tempdir().unwrap();
        let ws = data.path().join("workspaces").join("agent-7");
        std::fs::create_dir_all(&ws).unwrap();
        write_script(&ws, "gate.sh", "touch \"$HOME/.netrc\"", 0o755);
        let home = home_dir(data.path(), "agent-7");
        assert_eq!(home, data.path().join("gates/agent-7/home"));
        let out = run_gate(&ws, &home, &spec("gate.sh", 10), &ENV).await;
        assert_eq!(out.decision, Decision::Wake, "{out:?}");
        assert_eq!(mode_of(&home), 0o700);
        assert_eq!(mode_of(&data.path().join("gates/agent-7")), 0o700);
        // What the gate's tools write under HOME stays out of the workspace.
        assert!(home.join(".netrc").exists());
        assert!(!ws.join(".netrc").exists());

        // A wrong mode is repaired at the next run.
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = run_gate(&ws, &home, &spec("gate.sh", 10), &ENV).await;
        assert_eq!(out.decision, Decision::Wake, "{out:?}");
        assert_eq!(mode_of(&home), 0o700);
    }

    #[tokio::test]
    async fn home_inside_the_workspace_or_a_symlink_fails_open() {
        let data = tempfile::tempdir().unwrap();
        let ws = data.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        write_script(&ws, "gate.sh", "echo '{\"wake\": false}'", 0o755);
        let out = run_gate(&ws, &ws.join("home"), &spec("gate.sh", 5), &ENV).await;
        assert_failed(&out, "overlaps the workspace");
        assert!(
            !ws.join("home").exists(),
            "nothing created in the workspace"
        );
        let out = run_gate(&ws, data.path(), &spec("gate.sh", 5), &ENV).await;
        assert_failed(&out, "overlaps the workspace");
        // A symlink planted where the home goes is refused: into the workspace as overlapping,
        // anywhere else as not being the home directory itself.
        std::os::unix::fs::symlink(&ws, data.path().join("linked")).unwrap();
        let out = run_gate(&ws, &data.path().join("linked"), &spec("gate.sh", 5), &ENV).await;
        assert_failed(&out, "overlaps the workspace");
        std::fs::create_dir(data.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(data.path().join("elsewhere"), data.path().join("l2")).unwrap();
        let out = run_gate(&ws, &data.path().join("l2"), &spec("gate.sh", 5), &ENV).await;
        assert_failed(&out, "not a directory");
        // A private home elsewhere: the gate decides.
        let out = run_gate(&ws, &data.path().join("h"), &spec("gate.sh", 5), &ENV).await;
        assert_eq!(out.decision, Decision::Skip, "{out:?}");
    }

    #[test]
    fn home_dir_names_stay_inside_gates() {
        let data = Path::new("/data");
        assert_eq!(
            home_dir(data, "main_2-x"),
            Path::new("/data/gates/main_2-x/home")
        );
        assert_eq!(home_dir(data, ".."), Path::new("/data/gates/%2e2e/home"));
        assert_eq!(home_dir(data, "a/b"), Path::new("/data/gates/%612f62/home"));
        assert_eq!(home_dir(data, ""), Path::new("/data/gates/%/home"));
    }
}
