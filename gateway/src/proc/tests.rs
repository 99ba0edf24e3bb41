//! Tests of the process runner: exits, signals, timeouts, cancellation, drops, caps, the
//! environment, resource limits and streaming children, with `/bin/sh` scripts in temp dirs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A temp dir holding `home/` and the scripts of one test.
struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("home")).unwrap();
        Dir(dir)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// A spec running `/bin/sh -c body` in the dir.
    fn sh(&self, body: &str) -> Spec {
        Spec::new("/bin/sh", self.path(), self.path().join("home"))
            .arg("-c")
            .arg(body)
    }

    /// Writes an executable `#!/bin/sh` script and a spec running it.
    fn script(&self, name: &str, body: &str) -> Spec {
        let path = self.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        Spec::new(path, self.path(), self.path().join("home"))
    }

    fn read_pid(&self, name: &str) -> u32 {
        std::fs::read_to_string(self.path().join(name))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

pub(crate) fn process_gone(pid: u32) -> bool {
    // A killed grandchild is reparented; an init that does not reap leaves a zombie, dead too.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

pub(crate) async fn wait_gone(pid: u32) -> bool {
    for _ in 0..60 {
        if process_gone(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    process_gone(pid)
}

async fn wait_file(path: &Path) {
    for _ in 0..200 {
        if std::fs::read_to_string(path).is_ok_and(|s| s.ends_with('\n')) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{} never written", path.display());
}

fn python3() -> Option<&'static str> {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[tokio::test]
async fn exit_codes_and_output() {
    let d = Dir::new();
    let out = run(d.sh("echo out; echo err >&2; exit 3")).await;
    assert_eq!(out.exit, Exit::Code(3));
    assert_eq!(out.stdout.kept, b"out\n");
    assert_eq!(out.stderr.kept, b"err\n");
    assert!(!out.stdout.truncated);
    let out = run(d.sh("exit 0")).await;
    assert_eq!(out.exit, Exit::Code(0));
    // The same through prlimit.
    let mut spec = d.sh("echo out; exit 7");
    spec.limits.open_files = Some(64);
    let out = run(spec).await;
    assert_eq!(
        (out.exit, out.stdout.kept),
        (Exit::Code(7), b"out\n".to_vec())
    );
}

#[tokio::test]
async fn stdin_bytes_are_fed_then_closed() {
    let d = Dir::new();
    let mut spec = Spec::new("/bin/cat", d.path(), d.path().join("home"));
    spec.stdin = Some(b"hello\nworld\n".to_vec());
    let out = run(spec).await;
    assert_eq!(out.exit, Exit::Code(0));
    assert_eq!(out.stdout.kept, b"hello\nworld\n");
}

#[tokio::test]
async fn a_signal_is_reported() {
    let d = Dir::new();
    let out = run(d.sh("kill -TERM $$")).await;
    assert_eq!(out.exit, Exit::Signal(15));
}

#[tokio::test]
async fn spawn_failures() {
    let d = Dir::new();
    let out = run(Spec::new(d.path().join("nope"), d.path(), d.path())).await;
    assert!(matches!(out.exit, Exit::SpawnFailed(_)), "{out:?}");
    let out = run(Spec::new("sh", d.path(), d.path())).await;
    assert!(
        matches!(&out.exit, Exit::SpawnFailed(e) if e.contains("absolute")),
        "{out:?}"
    );
    let out = run(d.sh("true").env("PATH", "/tmp")).await;
    assert!(
        matches!(&out.exit, Exit::SpawnFailed(e) if e.contains("PATH")),
        "{out:?}"
    );
    // Through prlimit: a missing program, and files the kernel refuses (which execvp would
    // otherwise hand to /bin/sh) are spawn failures too, not exit codes.
    let limited = |spec: Spec| Spec {
        limits: Limits {
            open_files: Some(64),
            ..Limits::default()
        },
        ..spec
    };
    let out = run(limited(Spec::new(
        d.path().join("nope"),
        d.path(),
        d.path(),
    )))
    .await;
    assert!(
        matches!(&out.exit, Exit::SpawnFailed(e) if e.contains("No such file")),
        "{out:?}"
    );
    for (name, body) in [
        ("noshebang", b"exit 0\n".to_vec()),
        ("badelf", b"\x7fELF garbage".to_vec()),
    ] {
        let path = d.path().join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = run(limited(Spec::new(&path, d.path(), d.path()))).await;
        assert!(
            matches!(&out.exit, Exit::SpawnFailed(e) if e.contains("Exec format error")),
            "{name}: {out:?}"
        );
        let out = run(Spec::new(&path, d.path(), d.path())).await;
        assert!(matches!(out.exit, Exit::SpawnFailed(_)), "{name}: {out:?}");
    }
    // A script whose interpreter is missing.
    let path = d.path().join("badinterp");
    std::fs::write(&path, "#!/nonexistent/interp\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = run(limited(Spec::new(&path, d.path(), d.path()))).await;
    assert!(matches!(out.exit, Exit::SpawnFailed(_)), "{out:?}");
}

#[tokio::test]
async fn timeout_kills_a_grandchild() {
    let d = Dir::new();
    let mut spec = d.sh("sleep 30 &\necho $! > child.pid\nsleep 30");
    spec.timeout = Some(Duration::from_secs(1));
    let started = Instant::now();
    let out = run(spec).await;
    assert_eq!(out.exit, Exit::Timeout);
    assert!(started.elapsed() < Duration::from_secs(5), "{out:?}");
    assert!(
        wait_gone(d.read_pid("child.pid")).await,
        "grandchild survived"
    );
}

#[tokio::test]
async fn the_leaders_exit_sweeps_a_daemonised_grandchild() {
    let d = Dir::new();
    let out = run(d.sh("sleep 30 >/dev/null 2>&1 &\necho $! > child.pid\nexit 0")).await;
    assert_eq!(out.exit, Exit::Code(0));
    assert!(
        wait_gone(d.read_pid("child.pid")).await,
        "grandchild survived"
    );
}

#[tokio::test]
async fn cancellation_kills_at_once() {
    let d = Dir::new();
    let mut spec = d.sh("sleep 30 &\necho $! > child.pid\nsleep 30");
    let cancel = CancellationToken::new();
    spec.cancel = Some(cancel.clone());
    spec.timeout = Some(Duration::from_secs(60));
    let pid_file = d.path().join("child.pid");
    let started = Instant::now();
    let (out, ()) = tokio::join!(run(spec), async {
        wait_file(&pid_file).await;
        cancel.cancel();
    });
    assert_eq!(out.exit, Exit::Cancelled);
    assert!(started.elapsed() < Duration::from_secs(5), "{out:?}");
    assert!(
        wait_gone(d.read_pid("child.pid")).await,
        "grandchild survived"
    );
}

#[tokio::test]
async fn dropping_the_run_kills_the_group() {
    let d = Dir::new();
    let spec = d.sh("echo $$ > leader.pid\nsleep 30 &\necho $! > child.pid\nsleep 30");
    let pid_file = d.path().join("child.pid");
    tokio::select! {
        out = run(spec) => panic!("ran to its end: {out:?}"),
        () = wait_file(&pid_file) => {}
    }
    // The run future is dropped here, with its child running.
    assert!(
        wait_gone(d.read_pid("child.pid")).await,
        "grandchild survived"
    );
    assert!(wait_gone(d.read_pid("leader.pid")).await, "leader survived");
}

#[tokio::test]
async fn output_at_the_cap_is_whole_past_it_truncated() {
    let d = Dir::new();
    let mut spec = d.sh("head -c 100 /dev/zero");
    spec.stdout_cap = 100;
    let out = run(spec).await;
    assert_eq!(out.exit, Exit::Code(0));
    assert_eq!((out.stdout.kept.len(), out.stdout.total), (100, 100));
    assert!(!out.stdout.truncated);

    // 4 MiB on each pipe (far past a pipe's buffer): drained, so the child never blocks.
    let mut spec =
        d.sh("head -c 4194304 /dev/zero; head -c 4194304 /dev/zero >&2; echo done > done.txt");
    spec.stdout_cap = 100;
    spec.stderr_cap = 10;
    spec.timeout = Some(Duration::from_secs(20));
    let out = run(spec).await;
    assert_eq!(out.exit, Exit::Code(0));
    assert_eq!((out.stdout.kept.len(), out.stdout.total), (100, 4_194_304));
    assert!(out.stdout.truncated);
    assert_eq!((out.stderr.kept.len(), out.stderr.total), (10, 4_194_304));
    assert!(out.stderr.truncated);
    assert!(d.path().join("done.txt").exists());
}

/// The names in `env`'s output.
fn names(stdout: &[u8]) -> BTreeSet<String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_owned()))
        .collect()
}

#[tokio::test]
async fn the_environment_is_exactly_the_fixed_three_and_the_added() {
    let d = Dir::new();
    // The test process always has variables of its own (cargo sets CARGO_*).
    assert!(std::env::vars().any(|(k, _)| k.starts_with("CARGO")));
    let home = d.path().join("home");
    for limited in [false, true] {
        let mut spec = Spec::new("/usr/bin/env", d.path(), &home).env("EXTRA_ONE", "1 2");
        if limited {
            spec.limits.open_files = Some(64);
        }
        let out = run(spec).await;
        assert_eq!(out.exit, Exit::Code(0), "{out:?}");
        let expected: BTreeSet<String> = ["PATH", "LANG", "HOME", "EXTRA_ONE"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        assert_eq!(names(&out.stdout.kept), expected, "limited: {limited}");
        let text = String::from_utf8_lossy(&out.stdout.kept).into_owned();
        assert!(
            text.contains("PATH=/usr/local/bin:/usr/bin:/bin\n"),
            "{text}"
        );
        assert!(text.contains("LANG=C.UTF-8\n"), "{text}");
        assert!(
            text.contains(&format!("HOME={}\n", home.display())),
            "{text}"
        );
        assert!(text.contains("EXTRA_ONE=1 2\n"), "{text}");
    }
}

#[tokio::test]
async fn address_space_limit_stops_a_large_allocation() {
    let Some(python) = python3() else {
        eprintln!("no python3: skipped");
        return;
    };
    let d = Dir::new();
    let alloc = |limit: Option<u64>| {
        let mut spec = Spec::new(python, d.path(), d.path().join("home"))
            .arg("-c")
            .arg("b = bytearray(512 * 1024 * 1024); print(len(b))");
        spec.limits.address_space_bytes = limit;
        spec.timeout = Some(Duration::from_secs(30));
        spec
    };
    let out = run(alloc(Some(256 * 1024 * 1024))).await;
    assert!(
        matches!(out.exit, Exit::Code(c) if c != 0) || matches!(out.exit, Exit::Signal(_)),
        "{out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr.kept).contains("MemoryError"),
        "{out:?}"
    );
    let out = run(alloc(None)).await;
    assert_eq!(out.exit, Exit::Code(0), "{out:?}");
}

#[tokio::test]
async fn cpu_limit_kills_a_busy_loop() {
    let d = Dir::new();
    let mut spec = d.sh("while :; do :; done");
    spec.limits.cpu_seconds = Some(1);
    spec.timeout = Some(Duration::from_secs(30));
    let started = Instant::now();
    let out = run(spec).await;
    let xcpu = rustix::process::Signal::XCPU.as_raw();
    assert!(
        out.exit == Exit::Signal(xcpu) || out.exit == Exit::Signal(9),
        "{out:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn open_files_limit() {
    let d = Dir::new();
    let open = |limit: Option<u64>| {
        let mut spec = d.sh("exec 3</dev/null; exec 4</dev/null && echo opened");
        spec.limits.open_files = limit;
        spec
    };
    // Descriptors 0-3 fit under 4; the fifth does not.
    let out = run(open(Some(4))).await;
    assert_ne!(out.exit, Exit::Code(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr.kept).contains("Too many open files"),
        "{out:?}"
    );
    let out = run(open(None)).await;
    assert_eq!(
        (out.exit, out.stdout.kept),
        (Exit::Code(0), b"opened\n".to_vec())
    );
}

#[tokio::test]
async fn process_limit() {
    let d = Dir::new();
    let fork = |limit: Option<u64>| {
        let mut spec = d.sh("/bin/true && echo forked");
        spec.limits.processes = limit;
        spec
    };
    let out = run(fork(None)).await;
    assert_eq!(out.stdout.kept, b"forked\n");
    if is_root() {
        eprintln!("root ignores RLIMIT_NPROC: the limited half is skipped");
        return;
    }
    // The user already runs this test's process, so not one more fits.
    let out = run(fork(Some(1))).await;
    assert_ne!(out.stdout.kept, b"forked\n", "{out:?}");
}

#[test]
fn limits_become_prlimit_options_capped_at_the_hard_limit() {
    assert!(limit_args(&Limits::default()).is_empty());
    let args = limit_args(&Limits {
        cpu_seconds: Some(5),
        address_space_bytes: Some(1 << 30),
        open_files: Some(256),
        processes: None,
    });
    assert_eq!(args.len(), 3);
    assert!(args[0].starts_with("--cpu="));
    assert!(args[1].starts_with("--as="));
    assert!(args[2].starts_with("--nofile="));
    let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
    let args = limit_args(&Limits {
        open_files: Some(u64::MAX - 1),
        ..Limits::default()
    });
    let want = hard.unwrap_or(u64::MAX - 1);
    assert_eq!(args, vec![format!("--nofile={want}")]);
}

#[tokio::test]
async fn a_stream_echoes_a_line_and_dies_with_its_group() {
    let d = Dir::new();
    let mut spec = Spec::new("/bin/cat", d.path(), d.path().join("home"));
    spec.limits.open_files = Some(64);
    let mut child = spawn_stream(spec).await.unwrap();
    let pid = child.id().unwrap();
    let mut stdin = child.take_stdin().unwrap();
    let mut stdout = BufReader::new(child.take_stdout().unwrap());
    stdin.write_all(b"ping\n").await.unwrap();
    stdin.flush().await.unwrap();
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(5), stdout.read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(line, "ping\n");
    assert_eq!(child.kill().await, Exit::Cancelled);
    assert!(wait_gone(pid).await, "cat survived");
}

#[tokio::test]
async fn a_stream_keeps_the_tail_of_stderr_and_drop_kills_its_group() {
    let d = Dir::new();
    let mut spec = d.sh(
        "head -c 5000 /dev/zero | tr '\\0' a >&2; echo END >&2; sleep 30 &\necho $! > child.pid\nsleep 30",
    );
    spec.stderr_cap = 16;
    let child = spawn_stream(spec).await.unwrap();
    wait_file(&d.path().join("child.pid")).await;
    let mut tail = Vec::new();
    for _ in 0..100 {
        tail = child.stderr_tail();
        if tail.ends_with(b"END\n") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(tail, b"aaaaaaaaaaaaEND\n");
    let leader = child.id().unwrap();
    drop(child);
    assert!(
        wait_gone(d.read_pid("child.pid")).await,
        "grandchild survived"
    );
    assert!(wait_gone(leader).await, "leader survived");
}

#[tokio::test]
async fn a_stream_that_exits_reports_it() {
    let d = Dir::new();
    let mut child = spawn_stream(d.script("s.sh", "echo bye >&2; exit 4"))
        .await
        .unwrap();
    assert_eq!(child.wait().await, Exit::Code(4));
    assert_eq!(child.stderr_tail(), b"bye\n");
    let mut spec = Spec::new(d.path().join("missing"), d.path(), d.path());
    spec.limits.cpu_seconds = Some(5);
    match spawn_stream(spec).await {
        Err(e) => assert!(e.contains("missing") || e.contains("No such file"), "{e}"),
        Ok(mut child) => assert!(matches!(child.wait().await, Exit::SpawnFailed(_))),
    }
}

#[test]
fn the_ring_keeps_the_last_bytes() {
    let mut ring = stream_ring(4);
    ring.push(b"ab");
    ring.push(b"cdef");
    ring.push(b"g");
    assert_eq!(ring.bytes.iter().copied().collect::<Vec<_>>(), b"defg");
    ring.push(b"0123456789");
    assert_eq!(ring.bytes.iter().copied().collect::<Vec<_>>(), b"6789");
}

fn stream_ring(cap: usize) -> stream::Ring {
    stream::Ring {
        bytes: std::collections::VecDeque::new(),
        cap,
    }
}
