//! One-shot runs: spawn, feed stdin, drain both pipes under their caps, wait under the deadline
//! and the cancellation token, kill the whole group, reap.

use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{
    exec_failure, exit_of, group_of, is_busy_message, kill_group, spawn_once, Captured, Exit,
    Outcome, SpawnError, Spec, BUSY_RETRY_DELAYS_MS, EXIT_READ_GRACE, MARKER_CAPTURE, READ_CHUNK,
    REAP_GRACE,
};

/// Runs `spec` once to its end. Never panics; returns within about the timeout plus 2 s
/// ([`REAP_GRACE`] and [`EXIT_READ_GRACE`]). The child's whole group is killed once the leader
/// has exited (so nothing it daemonised survives), on timeout, on cancellation, and when this
/// future is dropped. A program busy being written (ETXTBSY) is retried a few times.
pub async fn run(spec: Spec) -> Outcome {
    let started = Instant::now();
    let deadline = spec.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut delays = BUSY_RETRY_DELAYS_MS.iter();
    loop {
        let (exit, stdout, stderr) = match attempt(&spec, deadline).await {
            Attempt::Done(exit, stdout, stderr) => (exit, stdout, stderr),
            Attempt::Busy(reason) => match delays.next() {
                Some(ms) => {
                    tokio::time::sleep(Duration::from_millis(*ms)).await;
                    continue;
                }
                None => (
                    Exit::SpawnFailed(reason),
                    Captured::default(),
                    Captured::default(),
                ),
            },
        };
        return Outcome {
            exit,
            stdout,
            stderr,
            duration: started.elapsed(),
        };
    }
}

enum Attempt {
    Done(Exit, Captured, Captured),
    Busy(String),
}

/// A spawned child whose group is killed when this is dropped, unless it was swept already.
/// Dropped before its fields, so the group goes before `kill_on_drop` hands the leader to
/// tokio's reaper.
struct Running {
    child: tokio::process::Child,
    pgid: Option<rustix::process::Pid>,
}

impl Running {
    /// Kills the group now; later drops leave it alone (its id may be reused once reaped).
    fn sweep(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            kill_group(pgid);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.sweep();
    }
}

async fn attempt(spec: &Spec, deadline: Option<tokio::time::Instant>) -> Attempt {
    let child = match spawn_once(spec, spec.stdin.is_some()).await {
        Ok(child) => child,
        Err(SpawnError::Busy(reason)) => return Attempt::Busy(reason),
        Err(SpawnError::Failed(reason)) => {
            return Attempt::Done(
                Exit::SpawnFailed(reason),
                Captured::default(),
                Captured::default(),
            )
        }
    };
    let pgid = group_of(&child);
    let mut running = Running { child, pgid };

    let mut stdout = Captured::default();
    let mut stderr = Captured::default();
    let stdout_pipe = running.child.stdout.take();
    let stderr_pipe = running.child.stderr.take();
    let stdin_pipe = running.child.stdin.take();
    let stdout_cap = spec.stdout_cap;
    let stderr_cap = spec.stderr_cap.max(MARKER_CAPTURE);

    let never = tokio_util::sync::CancellationToken::new();
    let cancel = spec.cancel.as_ref().unwrap_or(&never);
    let mut status = None;
    let mut cancelled = false;
    {
        let feed = async {
            if let (Some(mut pipe), Some(bytes)) = (stdin_pipe, spec.stdin.as_deref()) {
                // A child that does not read its stdin ends the write with EPIPE; fine.
                let _ = pipe.write_all(bytes).await;
            }
        };
        // Readers run alongside the wait so a chatty child never blocks on a full pipe. They stop
        // at EOF, which only comes once every holder of the pipe (descendants too) has closed it.
        let io = async {
            tokio::join!(
                drain(stdout_pipe, &mut stdout, stdout_cap),
                drain(stderr_pipe, &mut stderr, stderr_cap),
                feed
            )
        };
        tokio::pin!(io);
        let mut io_done = false;
        let mut until = deadline;
        loop {
            let sleep = async {
                match until {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                res = running.child.wait(), if status.is_none() => {
                    // The leader is gone; what it left behind in its group goes too, so a child
                    // cannot park a daemon. Reaped an instant ago: far too soon for reuse.
                    running.sweep();
                    status = Some(res);
                    let grace = tokio::time::Instant::now() + EXIT_READ_GRACE;
                    until = Some(until.map_or(grace, |t| t.min(grace)));
                }
                _ = &mut io, if !io_done => io_done = true,
                _ = sleep => break,
                _ = cancel.cancelled(), if status.is_none() => {
                    cancelled = true;
                    break;
                }
            }
            if status.is_some() && io_done {
                break;
            }
        }
    }

    let exit = match status {
        Some(res) => exit_of(res),
        None => {
            // Killed before reaping: the unreaped leader keeps its pid, so the group id cannot
            // have been reused yet.
            running.sweep();
            let _ = running.child.start_kill();
            // kill_on_drop covers a child that is still not reapable after the grace.
            let _ = tokio::time::timeout(REAP_GRACE, running.child.wait()).await;
            if cancelled {
                Exit::Cancelled
            } else {
                Exit::Timeout
            }
        }
    };
    if let Some(reason) = exec_failure(spec, &exit, &stderr.kept) {
        if is_busy_message(&reason) {
            return Attempt::Busy(reason);
        }
        return Attempt::Done(
            Exit::SpawnFailed(reason),
            Captured::default(),
            Captured::default(),
        );
    }
    Attempt::Done(exit, stdout, stderr.cut(spec.stderr_cap))
}

/// Reads to EOF, keeping the first `cap` bytes. Writes into `into` as it goes so a caller that
/// abandons the read at the deadline still has what arrived.
async fn drain<R: AsyncRead + Unpin>(pipe: Option<R>, into: &mut Captured, cap: usize) {
    let Some(mut pipe) = pipe else { return };
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => into.push(&buf[..n], cap),
        }
    }
}
