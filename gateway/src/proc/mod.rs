//! The one process runner: every child process the daemon starts for its own work is started here.
//!
//! A child gets no shell (a program path and an argv), exactly the environment the caller names
//! (a fixed `PATH`, `LANG=C.UTF-8`, a private `HOME` and the caller's variables; nothing of the
//! gateway's own environment), its own process group (killed whole on timeout, on cancellation,
//! once the leader has exited, and when the run is dropped), bounded capture of its output, and
//! optional resource limits (CPU seconds, address space, open files, processes).
//!
//! Limits are applied without `unsafe` by executing through util-linux `prlimit`
//! (`prlimit --cpu=N ... -- program args`), which sets them on itself and then execs the program
//! in the same process: the program never runs unlimited. When limits are asked and `prlimit` is
//! missing, the spawn fails. `prlimit` execs with `execvp`, which runs a file the kernel refuses
//! with ENOEXEC through `/bin/sh`; so a program must start with `#!` or an ELF header
//! ([`check_exec_format`]), and `prlimit`'s own "failed to execute" exit is reported as
//! [`Exit::SpawnFailed`]. See docs/decisions.md (area "Structure", the "child ..." rows).
//!
//! [`run`] is a one-shot run to an [`Outcome`]; [`spawn_stream`] starts a long-lived child with
//! stdin and stdout handles and a bounded ring of its last stderr bytes.

mod run;
mod stream;

pub use run::run;
pub use stream::{spawn_stream, StreamChild};

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

/// The `PATH` every child gets, so none can be steered by the gateway's own environment.
pub const FIXED_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// The `LANG` every child gets.
pub const FIXED_LANG: &str = "C.UTF-8";
/// Where util-linux `prlimit` is looked for, in order, when limits are asked.
const PRLIMIT_PATHS: [&str; 2] = ["/usr/bin/prlimit", "/bin/prlimit"];
/// Variables the runner sets itself; a caller cannot replace them.
const RESERVED: [&str; 3] = ["PATH", "LANG", "HOME"];
/// After SIGKILL the child should be reapable at once; this only bounds a child stuck in the kernel.
pub(crate) const REAP_GRACE: Duration = Duration::from_secs(1);
/// Once the leader has exited, how long its pipes may stay open: only a descendant that left the
/// group (setsid) can still hold them, and the caller should not wait on it.
pub(crate) const EXIT_READ_GRACE: Duration = Duration::from_secs(1);
/// ETXTBSY happens when another thread of this process forked while the program was open for
/// writing (the fork holds the write descriptor until it execs); it clears within milliseconds.
pub(crate) const BUSY_RETRY_DELAYS_MS: [u64; 4] = [10, 25, 50, 100];
/// Read chunk for draining pipes.
pub(crate) const READ_CHUNK: usize = 8192;
/// Bytes of stderr always captured internally, whatever the caller's cap, so `prlimit`'s
/// "failed to execute" line can be recognised.
pub(crate) const MARKER_CAPTURE: usize = 1024;

/// Resource limits of a child (and, inherited, of everything it starts); `None` leaves the
/// gateway's own limit. A limit above the gateway's hard limit is lowered to it (a process may
/// not raise its hard limits), so asking never makes the spawn fail.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// RLIMIT_CPU: CPU seconds per process (SIGXCPU, then SIGKILL).
    pub cpu_seconds: Option<u64>,
    /// RLIMIT_AS: bytes of address space per process (allocations past it fail).
    pub address_space_bytes: Option<u64>,
    /// RLIMIT_NOFILE: open descriptors per process.
    pub open_files: Option<u64>,
    /// RLIMIT_NPROC: processes (threads included) of the gateway's user, counted across the
    /// whole host user, not just this child's tree; ignored for root.
    pub processes: Option<u64>,
}

impl Limits {
    /// No limit set.
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }
}

/// What to start and how. The child's environment is exactly `PATH` ([`FIXED_PATH`]), `LANG`
/// ([`FIXED_LANG`]), `HOME` (`home`) and `env`.
#[derive(Debug, Clone)]
pub struct Spec {
    /// An absolute path; never looked up on `PATH`, never run through a shell.
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// The working directory.
    pub cwd: PathBuf,
    /// The child's private `HOME`; the caller makes and owns it.
    pub home: PathBuf,
    /// Variables added to the fixed three (names other than `PATH`, `LANG`, `HOME`). The values
    /// are given by the caller; secret-store names resolved at spawn belong in [`resolve_env`].
    pub env: Vec<(String, OsString)>,
    /// `None`: stdin is `/dev/null`. `Some(bytes)`: written to a pipe, then closed ([`run`]
    /// only; a stream's stdin is always a pipe its owner writes).
    pub stdin: Option<Vec<u8>>,
    /// Bytes of stdout kept by [`run`]; the rest is read and discarded.
    pub stdout_cap: usize,
    /// Bytes of stderr kept by [`run`] (the first ones), or by a stream (the last ones).
    pub stderr_cap: usize,
    /// Wall time of a [`run`]; `None`: no deadline. A stream has none.
    pub timeout: Option<Duration>,
    /// Cancelling it kills the group of a [`run`] at once.
    pub cancel: Option<CancellationToken>,
    pub limits: Limits,
}

impl Spec {
    /// A spec with no arguments, no added variables, stdin closed, 64 KiB caps, no timeout, no
    /// cancellation and no limits.
    pub fn new(
        program: impl Into<PathBuf>,
        cwd: impl Into<PathBuf>,
        home: impl Into<PathBuf>,
    ) -> Self {
        Spec {
            program: program.into(),
            args: Vec::new(),
            cwd: cwd.into(),
            home: home.into(),
            env: Vec::new(),
            stdin: None,
            stdout_cap: 64 * 1024,
            stderr_cap: 64 * 1024,
            timeout: None,
            cancel: None,
            limits: Limits::default(),
        }
    }

    /// Adds an argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds a variable to the child's environment.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<OsString>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }
}

/// How a child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// It was ended by this signal (not by the runner).
    Signal(i32),
    /// It ran past the spec's timeout; its group was killed.
    Timeout,
    /// The spec's cancellation token fired (or the owner killed a stream); its group was killed.
    Cancelled,
    /// It never ran: a refused spec, a missing `prlimit`, a program that could not be executed.
    SpawnFailed(String),
    /// Waiting for it failed (never expected on Linux).
    WaitFailed(String),
}

/// Output of one pipe.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The bytes kept (at most the cap).
    pub kept: Vec<u8>,
    /// Every byte read, kept or not.
    pub total: usize,
    /// More was read than kept.
    pub truncated: bool,
}

impl Captured {
    fn push(&mut self, bytes: &[u8], cap: usize) {
        let room = cap.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
        self.total = self.total.saturating_add(bytes.len());
        self.truncated = self.total > self.kept.len();
    }

    /// Keeps the first `cap` bytes only.
    fn cut(mut self, cap: usize) -> Self {
        self.kept.truncate(cap);
        self.truncated = self.total > self.kept.len();
        self
    }
}

/// Result of [`run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub exit: Exit,
    pub stdout: Captured,
    pub stderr: Captured,
    /// From the spawn to the end (retries of a busy program included).
    pub duration: Duration,
}

/// The hook where a later issue resolves secret-store names into values at spawn; today the
/// values are the caller's. Refuses names the runner owns or the kernel cannot carry.
pub fn resolve_env(spec: &Spec) -> Result<Vec<(String, OsString)>, String> {
    let mut out = Vec::with_capacity(spec.env.len());
    for (name, value) in &spec.env {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(format!("environment variable name {name:?} is not valid"));
        }
        if RESERVED.contains(&name.as_str()) {
            return Err(format!("environment variable {name} is set by the runner"));
        }
        if std::os::unix::ffi::OsStrExt::as_bytes(value.as_os_str()).contains(&0) {
            return Err(format!("environment variable {name} contains a NUL byte"));
        }
        out.push((name.clone(), value.clone()));
    }
    Ok(out)
}

/// The `prlimit` options for `limits`, each lowered to the gateway's hard limit; empty when no
/// limit is set.
fn limit_args(limits: &Limits) -> Vec<String> {
    use rustix::process::{getrlimit, Resource};
    let mut out = Vec::new();
    let entries = [
        ("cpu", Resource::Cpu, limits.cpu_seconds),
        ("as", Resource::As, limits.address_space_bytes),
        ("nofile", Resource::Nofile, limits.open_files),
        ("nproc", Resource::Nproc, limits.processes),
    ];
    for (name, resource, want) in entries {
        let Some(want) = want else { continue };
        let value = match getrlimit(resource).maximum {
            Some(hard) => want.min(hard),
            None => want,
        };
        out.push(format!("--{name}={value}"));
    }
    out
}

fn prlimit_path() -> Option<&'static Path> {
    PRLIMIT_PATHS.iter().map(Path::new).find(|p| p.is_file())
}

/// A limited program is executed by `prlimit` through `execvp`, which hands a file the kernel
/// refuses with ENOEXEC to `/bin/sh`. So it must open like something the kernel runs: `#!`, or
/// an ELF header (magic, a whole header, an executable or shared-object type). A corrupt ELF
/// past its header, or a `#!` naming an interpreter the kernel cannot run, still falls through
/// to `/bin/sh`: the file is then read as a shell script, its arguments are still never parsed.
pub async fn check_exec_format(program: &Path) -> Result<(), String> {
    let mut file = tokio::fs::File::open(program)
        .await
        .map_err(|e| format!("{}: {e}", program.display()))?;
    let mut head = [0u8; 64];
    let mut len = 0;
    while len < head.len() {
        match file.read(&mut head[len..]).await {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) => return Err(format!("{}: {e}", program.display())),
        }
    }
    let head = &head[..len];
    if head.starts_with(b"#!") {
        return Ok(());
    }
    // e_ident (16) + e_type (2); a 32-bit header is 52 bytes, a 64-bit one 64.
    let header_len = match head.get(4) {
        Some(1) => 52,
        Some(2) => 64,
        _ => usize::MAX,
    };
    let elf = head.starts_with(b"\x7fELF") && head.len() >= header_len && {
        let e_type = match head.get(5) {
            Some(2) => u16::from_be_bytes([head[16], head[17]]),
            _ => u16::from_le_bytes([head[16], head[17]]),
        };
        matches!(e_type, 2 | 3)
    };
    if elf {
        Ok(())
    } else {
        Err(format!(
            "failed to execute {}: Exec format error",
            program.display()
        ))
    }
}

/// The command for `spec`: through `prlimit` when limits are set, its own process group, the
/// fixed environment, every stdio piped but stdin (`stdin_piped`).
pub(crate) fn command(spec: &Spec, stdin_piped: bool) -> Result<Command, String> {
    if !spec.program.is_absolute() {
        return Err(format!(
            "program {} is not an absolute path",
            spec.program.display()
        ));
    }
    let env = resolve_env(spec)?;
    let mut cmd = if spec.limits.is_empty() {
        Command::new(&spec.program)
    } else {
        let prlimit = prlimit_path().ok_or_else(|| {
            format!(
                "resource limits asked but util-linux prlimit is not installed (looked for {})",
                PRLIMIT_PATHS.join(", ")
            )
        })?;
        let mut cmd = Command::new(prlimit);
        cmd.args(limit_args(&spec.limits))
            .arg("--")
            .arg(&spec.program);
        cmd
    };
    cmd.args(&spec.args)
        .env_clear()
        .env("PATH", FIXED_PATH)
        .env("LANG", FIXED_LANG)
        .env("HOME", &spec.home)
        .envs(env)
        .current_dir(&spec.cwd)
        .stdin(if stdin_piped {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so a kill reaches everything the child started, not just the child.
        .process_group(0)
        .kill_on_drop(true);
    Ok(cmd)
}

/// Why an attempt did not start: busy (retry) or anything else.
pub(crate) enum SpawnError {
    Busy(String),
    Failed(String),
}

/// Spawns `spec`'s command once, checking a limited program's format first.
pub(crate) async fn spawn_once(
    spec: &Spec,
    stdin_piped: bool,
) -> Result<tokio::process::Child, SpawnError> {
    let mut cmd = command(spec, stdin_piped).map_err(SpawnError::Failed)?;
    // Needed only behind `prlimit`, but checked always: the rule does not depend on the limits,
    // nor on whether std spawns with posix_spawn (no fallback) or fork and execvp (the fallback).
    check_exec_format(&spec.program)
        .await
        .map_err(SpawnError::Failed)?;
    match cmd.spawn() {
        Ok(child) => Ok(child),
        Err(e) if is_text_busy(&e) => Err(SpawnError::Busy(e.to_string())),
        Err(e) => Err(SpawnError::Failed(e.to_string())),
    }
}

fn is_text_busy(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::TXTBSY.raw_os_error())
}

/// When a limited child exited 126 or 127 with `prlimit`'s "failed to execute <program>: ..."
/// first on stderr, the program never ran: that line, without the `prlimit: ` prefix. A
/// program could print the line itself; it would only change how its failure is classed.
pub(crate) fn exec_failure(spec: &Spec, exit: &Exit, stderr: &[u8]) -> Option<String> {
    if spec.limits.is_empty() || !matches!(exit, Exit::Code(126 | 127)) {
        return None;
    }
    let prefix = format!("prlimit: failed to execute {}: ", spec.program.display());
    let text = String::from_utf8_lossy(stderr);
    let rest = text.strip_prefix(&prefix)?;
    let reason = rest.lines().next().unwrap_or("").trim();
    Some(format!(
        "failed to execute {}: {reason}",
        spec.program.display()
    ))
}

/// `prlimit` reports ETXTBSY through [`exec_failure`]; this tells it apart for a retry.
pub(crate) fn is_busy_message(reason: &str) -> bool {
    reason.ends_with("Text file busy")
}

/// The process group of a freshly spawned child (its pid, as it leads its own group).
pub(crate) fn group_of(child: &tokio::process::Child) -> Option<rustix::process::Pid> {
    child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(rustix::process::Pid::from_raw)
}

/// SIGKILL to every process of the group. Callers only pass a group whose leader is not yet
/// reaped, or was reaped an instant ago, so the id cannot have been reused.
pub(crate) fn kill_group(pgid: rustix::process::Pid) {
    // kill(-1) would signal every process we may signal; a child can never be pid 1, but be certain.
    if pgid.as_raw_nonzero().get() <= 1 {
        return;
    }
    // ESRCH (group already empty) is the normal case after a clean exit.
    let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
}

/// How a reaped child ended.
pub(crate) fn exit_of(status: std::io::Result<std::process::ExitStatus>) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(sig)) => Exit::Signal(sig),
            (None, None) => Exit::WaitFailed(format!("abnormal exit ({status})")),
        },
        Err(e) => Exit::WaitFailed(e.to_string()),
    }
}

#[cfg(test)]
pub(crate) mod tests;
