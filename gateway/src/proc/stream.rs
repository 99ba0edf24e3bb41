//! Long-lived children (a future MCP stdio server): stdin and stdout handles for the owner, stderr
//! drained into a bounded ring of its last bytes, and a kill (or drop) that takes the whole group.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::{
    exec_failure, exit_of, group_of, kill_group, spawn_once, Exit, SpawnError, Spec,
    BUSY_RETRY_DELAYS_MS, READ_CHUNK, REAP_GRACE,
};

/// The last `cap` bytes a child wrote to stderr.
#[derive(Debug, Default)]
pub(super) struct Ring {
    pub(super) bytes: VecDeque<u8>,
    pub(super) cap: usize,
}

impl Ring {
    pub(super) fn push(&mut self, chunk: &[u8]) {
        let chunk = &chunk[chunk.len().saturating_sub(self.cap)..];
        let over = (self.bytes.len() + chunk.len()).saturating_sub(self.cap);
        self.bytes.drain(..over.min(self.bytes.len()));
        self.bytes.extend(chunk);
    }
}

/// A running long-lived child. Its group is killed and the leader reaped by [`StreamChild::kill`];
/// dropping it kills the group too (the leader is then reaped by tokio in the background).
#[derive(Debug)]
pub struct StreamChild {
    child: Child,
    /// `None` once the group was killed after the leader was reaped (its id may be reused).
    pgid: Option<rustix::process::Pid>,
    spec: Spec,
    stdin: Option<ChildStdin>,
    stdout: Option<ChildStdout>,
    stderr: Arc<Mutex<Ring>>,
    stderr_task: tokio::task::JoinHandle<()>,
}

/// Starts `spec` as a long-lived child: stdin and stdout are pipes for the owner (`spec.stdin`,
/// `stdout_cap` and `timeout` do not apply), the last `stderr_cap` bytes of stderr are kept.
/// A program busy being written (ETXTBSY) is retried a few times.
pub async fn spawn_stream(spec: Spec) -> Result<StreamChild, String> {
    let mut delays = BUSY_RETRY_DELAYS_MS.iter();
    let mut child = loop {
        match spawn_once(&spec, true).await {
            Ok(child) => break child,
            Err(SpawnError::Busy(reason)) => match delays.next() {
                Some(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
                None => return Err(reason),
            },
            Err(SpawnError::Failed(reason)) => return Err(reason),
        }
    };
    let pgid = group_of(&child);
    let ring = Arc::new(Mutex::new(Ring {
        bytes: VecDeque::new(),
        cap: spec.stderr_cap,
    }));
    let stderr_pipe = child.stderr.take();
    let into = Arc::clone(&ring);
    #[allow(
        clippy::disallowed_methods,
        reason = "owned by the StreamChild, which aborts it on drop; it ends by itself at EOF of the child's stderr, which the group kill brings"
    )]
    let stderr_task = tokio::spawn(async move {
        let Some(mut pipe) = stderr_pipe else { return };
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => into
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(&buf[..n]),
            }
        }
    });
    Ok(StreamChild {
        stdin: child.stdin.take(),
        stdout: child.stdout.take(),
        child,
        pgid,
        spec,
        stderr: ring,
        stderr_task,
    })
}

impl StreamChild {
    /// The leader's pid while it is not reaped.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// The writer of the child's stdin (once); dropping it closes the pipe.
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.stdin.take()
    }

    /// The reader of the child's stdout (once).
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.stdout.take()
    }

    /// The last bytes the child wrote to stderr, for diagnostics.
    pub fn stderr_tail(&self) -> Vec<u8> {
        self.stderr
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .bytes
            .iter()
            .copied()
            .collect()
    }

    /// Waits for the leader to exit by itself, then kills what is left of its group. A program
    /// `prlimit` could not execute is [`Exit::SpawnFailed`] (a busy one too: no retry here).
    pub async fn wait(&mut self) -> Exit {
        let status = self.child.wait().await;
        self.sweep();
        let exit = exit_of(status);
        // Its stderr is closed (or held by a setsid escapee); give the ring a moment to fill.
        let _ = tokio::time::timeout(Duration::from_millis(200), &mut self.stderr_task).await;
        match exec_failure(&self.spec, &exit, &self.stderr_tail()) {
            Some(reason) => Exit::SpawnFailed(reason),
            None => exit,
        }
    }

    /// Kills the whole group and reaps the leader (bounded by a grace for a child stuck in the
    /// kernel): [`Exit::Cancelled`], or how it ended if it had exited already.
    pub async fn kill(&mut self) -> Exit {
        if let Ok(Some(status)) = self.child.try_wait() {
            self.sweep();
            return exit_of(Ok(status));
        }
        // Not reaped: the group id cannot have been reused.
        if let Some(pgid) = self.pgid {
            kill_group(pgid);
        }
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(REAP_GRACE, self.child.wait()).await;
        self.pgid = None;
        self.stderr_task.abort();
        Exit::Cancelled
    }

    fn sweep(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            kill_group(pgid);
        }
    }
}

impl Drop for StreamChild {
    fn drop(&mut self) {
        // Not reaped unless `pgid` is already None, so the id is still the child's group.
        self.sweep();
        self.stderr_task.abort();
        // `kill_on_drop` kills the leader as `child` drops; tokio reaps it.
    }
}
