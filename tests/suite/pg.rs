//! A throwaway PostgreSQL server for the test binary: one shared cluster (`server()`, a fresh
//! database per test through `database()`), private clusters a test may stop and start
//! (`private_server()`), or an existing server named by `AGENT_GATEWAY_TEST_DATABASE_URL`.
//!
//! Every server runs under a small `sh` wrapper whose stdin is a pipe from this process. When
//! the test binary exits, however it exits (panic, kill -9, Ctrl-C), the pipe closes, the wrapper
//! sends the server SIGINT (fast shutdown) and removes its directory, so no server outlives a
//! test run. `pg_ctl start` would detach the server instead, and nothing would stop it.
#![allow(dead_code)]

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use sqlx::{Connection, Executor, PgConnection};

/// How long a server may take to accept a real connection after its start.
const READY: Duration = Duration::from_secs(30);

/// The role `initdb` creates; the clusters trust every local connection (`-A trust`).
const USER: &str = "gateway";

/// The wrapper. `$0` is the `postgres` binary, `$1` the server's directory (data in `$1/data`,
/// log in `$1/log`), `$2` the port, `$3` the `initdb` binary when the cluster is still to be
/// made (empty otherwise). A line `stop` on stdin stops the server and keeps the directory (a
/// private server restarted later); end of input stops it, or interrupts `initdb`, and removes
/// the directory (the test binary is gone). The wrapper exits when the server exits, also when
/// it fails on its own (port taken), keeping the directory for its log, so the caller sees the
/// failure through `try_wait`. Background lists get /dev/null as stdin in a non-interactive
/// shell, hence the copy of the pipe on fd 3.
const WRAPPER: &str = r#"exec 3<&0 0</dev/null
gone="$1/gone.$$"
if [ -n "$3" ]; then
  "$3" -D "$1/data" -A trust -U gateway --no-sync -E UTF8 --locale=C.UTF-8 >>"$1/log" 2>&1 3<&- &
  pid=$!
  ( read -r cmd <&3 || : >"$gone"; kill -INT "$pid" ) 2>/dev/null &
  watcher=$!
  wait "$pid"; st=$?
  kill "$watcher" 2>/dev/null; wait "$watcher"
  if [ -e "$gone" ]; then rm -rf "$1"; exit 1; fi
  if [ "$st" != 0 ]; then echo "initdb exited with $st" >>"$1/log"; exit 1; fi
fi
"$0" -D "$1/data" -p "$2" -k "$1/data" -c listen_addresses=127.0.0.1 -c fsync=off \
  -c synchronous_commit=off -c full_page_writes=off -c max_connections=300 \
  >>"$1/log" 2>&1 3<&- &
pid=$!
( read -r cmd <&3 || : >"$gone"; kill -INT "$pid" ) 2>/dev/null &
wait "$pid"
if [ -e "$gone" ]; then rm -rf "$1"; fi
"#;

/// The shared server of this test binary: a cluster started on first use, or an existing server.
pub struct PgServer {
    pub port: u16,
    /// `postgres://user[:password]@host:port/` without the database name.
    base: url::Url,
    /// The database `database()` connects to for `CREATE DATABASE`.
    maintenance: String,
    /// Held for the life of the process: its end of input is what stops the cluster.
    _process: Option<Mutex<Running>>,
}

impl PgServer {
    /// The URL of database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        let mut u = self.base.clone();
        u.set_path(db);
        u.to_string()
    }
}

/// The test binary's shared server, started once (about 1 s) on first call. Blocks the calling
/// thread while the cluster starts; safe to call from a `#[tokio::test]`.
pub fn server() -> &'static PgServer {
    static SERVER: OnceLock<PgServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        if let Ok(existing) = std::env::var("AGENT_GATEWAY_TEST_DATABASE_URL") {
            return existing_server(&existing);
        }
        let bins = binaries();
        let cluster = Cluster::new();
        let (running, port) = cluster.start_on_free_port(&bins);
        PgServer {
            port,
            base: local_base(port),
            maintenance: "postgres".to_owned(),
            _process: Some(Mutex::new(running)),
        }
    })
}

/// A new empty database on the shared server; returns its URL
/// (`postgres://gateway@127.0.0.1:<port>/gw_<n>_<pid>` on the throwaway cluster). One database
/// per test isolates the data and the NOTIFY channels, which are per database. Open your own
/// pool on it: a sqlx pool belongs to the runtime that created it, and every `#[tokio::test]`
/// has its own.
pub async fn database() -> String {
    let s = server();
    create_database(&s.url(&s.maintenance), |db| s.url(db)).await
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

async fn create_database(maintenance_url: &str, url_of: impl Fn(&str) -> String) -> String {
    let name = format!(
        "gw_{}_{}",
        COUNTER.fetch_add(1, Ordering::Relaxed),
        std::process::id()
    );
    let mut conn = PgConnection::connect(maintenance_url)
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", redact(maintenance_url)));
    conn.execute(format!("CREATE DATABASE {name}").as_str())
        .await
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
    let _ = conn.close().await;
    url_of(&name)
}

fn existing_server(url: &str) -> PgServer {
    let parsed = url::Url::parse(url).unwrap_or_else(|e| {
        panic!(
            "AGENT_GATEWAY_TEST_DATABASE_URL is not a URL ({e}): {}",
            redact(url)
        )
    });
    assert!(
        matches!(parsed.scheme(), "postgres" | "postgresql"),
        "AGENT_GATEWAY_TEST_DATABASE_URL must be postgres://user@host:port/db, got {}",
        redact(url)
    );
    let maintenance = match parsed.path().trim_start_matches('/') {
        "" => "postgres".to_owned(),
        db => db.to_owned(),
    };
    let mut base = parsed.clone();
    base.set_path("");
    PgServer {
        port: parsed.port().unwrap_or(5432),
        base,
        maintenance,
        _process: None,
    }
}

fn local_base(port: u16) -> url::Url {
    url::Url::parse(&format!("postgres://{USER}@127.0.0.1:{port}/")).unwrap()
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "<unparsable URL>".to_owned(),
    }
}

/// A cluster of its own, for a test that stops and restarts PostgreSQL under a running gateway.
/// Always a throwaway cluster (needs the server binaries even when
/// `AGENT_GATEWAY_TEST_DATABASE_URL` is set). Dropping it stops the server and removes its
/// directory.
pub struct PrivateServer {
    pub port: u16,
    cluster: Cluster,
    bins: Binaries,
    running: Option<Running>,
}

/// A private cluster, initialised and started (about 1 s; blocks the calling thread).
pub fn private_server() -> PrivateServer {
    let bins = binaries();
    let cluster = Cluster::new();
    let (running, port) = cluster.start_on_free_port(&bins);
    PrivateServer {
        port,
        cluster,
        bins,
        running: Some(running),
    }
}

impl PrivateServer {
    /// The URL of database `db` on this server (`postgres` always exists).
    pub fn url(&self, db: &str) -> String {
        let mut u = local_base(self.port);
        u.set_path(db);
        u.to_string()
    }

    /// A new empty database on this server; returns its URL.
    pub async fn database(&self) -> String {
        create_database(&self.url("postgres"), |db| self.url(db)).await
    }

    /// Fast shutdown (open connections are cut); returns once the port no longer accepts.
    /// Blocks the calling thread (well under a second).
    pub fn stop(&mut self) {
        if let Err(e) = self.halt() {
            panic!("{e}");
        }
    }

    /// `stop` without panicking (also used by `Drop`, which may run during a panic).
    fn halt(&mut self) -> Result<(), String> {
        let Some(mut running) = self.running.take() else {
            return Ok(());
        };
        // A write error means the wrapper is already gone, which is the state we want.
        let _ = running.stdin.write_all(b"stop\n");
        drop(running.stdin);
        let deadline = Instant::now() + READY;
        while !matches!(running.child.try_wait(), Ok(Some(_))) {
            if Instant::now() >= deadline {
                let _ = running.child.kill();
                return Err(format!(
                    "PostgreSQL in {} did not stop",
                    self.cluster.root.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        while port_open(self.port) {
            if Instant::now() >= deadline {
                return Err(format!(
                    "PostgreSQL still accepts on port {} after its stop",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Starts the server again on the same port and data directory; returns once it accepts
    /// connections. Blocks the calling thread.
    pub fn start(&mut self) {
        if self.running.is_some() {
            return;
        }
        let running = self
            .cluster
            .start(&self.bins, self.port)
            .unwrap_or_else(|log| {
                panic!(
                    "PostgreSQL did not start again on port {}:\n{log}",
                    self.port
                )
            });
        self.running = Some(running);
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        if let Err(e) = self.halt() {
            eprintln!("{e}");
        }
        let _ = std::fs::remove_dir_all(&self.cluster.root);
    }
}

/// Where the server binaries are: `initdb` and `postgres` in one directory.
#[derive(Clone)]
struct Binaries {
    initdb: PathBuf,
    postgres: PathBuf,
}

/// `AGENT_GATEWAY_PG_BIN`, else the highest `/usr/lib/postgresql/<version>/bin`, else `initdb`
/// on `PATH` (with `postgres` beside it or beside the file the symlink points to).
fn binaries() -> Binaries {
    if let Some(dir) = std::env::var_os("AGENT_GATEWAY_PG_BIN") {
        let dir = PathBuf::from(dir);
        let b = Binaries {
            initdb: dir.join("initdb"),
            postgres: dir.join("postgres"),
        };
        assert!(
            b.initdb.is_file() && b.postgres.is_file(),
            "AGENT_GATEWAY_PG_BIN={} has no initdb and postgres",
            dir.display()
        );
        return b;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("postgres").is_file())
                .then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Binaries {
            initdb: bin.join("initdb"),
            postgres: bin.join("postgres"),
        };
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("initdb"))
            .find(|initdb| initdb.is_file())
    });
    if let Some(initdb) = on_path {
        let beside = |p: &Path| p.parent().map(|d| d.join("postgres"));
        let postgres = beside(&initdb)
            .filter(|p| p.is_file())
            .or_else(|| {
                std::fs::canonicalize(&initdb)
                    .ok()
                    .and_then(|real| beside(&real))
            })
            .filter(|p| p.is_file());
        if let Some(postgres) = postgres {
            return Binaries { initdb, postgres };
        }
    }
    panic!(
        "PostgreSQL server binaries not found: install postgresql-15 (apt) or set \
         AGENT_GATEWAY_PG_BIN, or AGENT_GATEWAY_TEST_DATABASE_URL for an existing server"
    );
}

/// Makes `path` the server's (when running as root the server runs as `postgres`), so it can
/// read files a test writes for it, such as TLS keys.
pub fn give_to_server(path: &Path) {
    if let Some(uid) = server_user() {
        std::os::unix::fs::chown(path, Some(uid), None)
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }
}

/// The uid the server runs as when the tests run as root (PostgreSQL refuses to run as root).
fn server_user() -> Option<u32> {
    if !is_root() {
        return None;
    }
    let out = Command::new("id")
        .args(["-u", "postgres"])
        .output()
        .unwrap_or_else(|e| panic!("running `id -u postgres`: {e}"));
    let uid = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse::<u32>()
        .ok();
    assert!(
        out.status.success() && uid.is_some(),
        "running as root, PostgreSQL needs the `postgres` user (installed with postgresql-common), \
         which does not exist; run the tests as another user or create it"
    );
    uid
}

fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output();
    matches!(out, Ok(o) if String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A server's directory: `data/` (the cluster, also holding the unix socket) and `log`.
struct Cluster {
    root: PathBuf,
    /// `Some(uid)` when the server binaries run as `postgres` through `runuser`.
    run_as: Option<u32>,
}

/// A started wrapper: the child (`runuser` or `sh`) and the write end of its stdin.
struct Running {
    child: Child,
    stdin: ChildStdin,
}

impl Cluster {
    /// A new temporary directory for a cluster; the wrapper runs `initdb` on its first start.
    fn new() -> Cluster {
        let run_as = server_user();
        // As root the directory must be reachable by `postgres`: /tmp is, a TMPDIR under
        // /root may not be.
        let parent = if run_as.is_some() {
            PathBuf::from("/tmp")
        } else {
            std::env::temp_dir()
        };
        let root = tempfile::Builder::new()
            .prefix("gw-pg-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(&parent)
            .unwrap_or_else(|e| panic!("temporary directory in {}: {e}", parent.display()))
            .keep();
        if let Some(uid) = run_as {
            std::os::unix::fs::chown(&root, Some(uid), None)
                .unwrap_or_else(|e| panic!("chown {} to postgres: {e}", root.display()));
        }
        Cluster { root, run_as }
    }

    /// `program` as the server's user: through `runuser -u postgres --` when running as root.
    fn command(&self, program: &Path) -> Command {
        if self.run_as.is_some() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }

    /// Starts the server on a free port, trying another port when the chosen one was taken
    /// between choosing and binding it.
    fn start_on_free_port(&self, bins: &Binaries) -> (Running, u16) {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            match self.start(bins, port) {
                Ok(running) => return (running, port),
                Err(log) if log.contains("already in use") => last = log,
                Err(log) => {
                    let _ = std::fs::remove_dir_all(&self.root);
                    panic!("PostgreSQL did not start on port {port}:\n{log}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
        panic!("PostgreSQL found no free port in 5 tries:\n{last}");
    }

    /// Spawns the wrapper and waits until a real connection succeeds (the port accepts before
    /// the server is ready, so a TCP probe is not enough). `Err` carries the server log.
    fn start(&self, bins: &Binaries, port: u16) -> Result<Running, String> {
        let log_len = std::fs::metadata(self.root.join("log")).map_or(0, |m| m.len());
        let mut cmd = self.command(Path::new("sh"));
        cmd.arg("-c")
            .arg(WRAPPER)
            .arg(&bins.postgres)
            .arg(&self.root)
            .arg(port.to_string())
            .arg(if self.root.join("data/PG_VERSION").exists() {
                Path::new("")
            } else {
                bins.initdb.as_path()
            })
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Out of the terminal's process group: Ctrl-C reaches the test binary only, and the
        // server then stops through the closed pipe, after which the wrapper cleans up.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting the PostgreSQL wrapper: {e}"));
        let stdin = child.stdin.take().unwrap();
        wait_ready(&local_base(port), Running { child, stdin })
            .map_err(|()| self.log_since(log_len))
    }

    fn log_since(&self, offset: u64) -> String {
        let log = std::fs::read(self.root.join("log")).unwrap_or_default();
        let from = usize::try_from(offset).unwrap_or(0).min(log.len());
        String::from_utf8_lossy(&log[from..]).into_owned()
    }
}

/// Retries a real connection until it succeeds (returns the wrapper) or the wrapper exits or
/// the deadline passes (`Err`; the wrapper is then stopped). Runs on a thread of its own with a
/// current-thread runtime, so it works from sync code and from inside a `#[tokio::test]` alike.
fn wait_ready(base: &url::Url, mut r: Running) -> Result<Running, ()> {
    let url = {
        let mut u = base.clone();
        u.set_path("postgres");
        u.to_string()
    };
    let ready = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let deadline = Instant::now() + READY;
                while Instant::now() < deadline {
                    if let Ok(conn) = PgConnection::connect(&url).await {
                        let _ = conn.close().await;
                        return true;
                    }
                    if matches!(r.child.try_wait(), Ok(Some(_))) {
                        return false;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                false
            })
        })
        .join()
        .unwrap()
    });
    if ready {
        Ok(r)
    } else {
        // Not ready in time or exited on its own: stop whatever is left, keep the directory
        // (the caller reads the log, then retries or removes it).
        let _ = r.stdin.write_all(b"stop\n");
        drop(r.stdin);
        let _ = r.child.wait();
        Err(())
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn port_open(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::postgres::PgListener;

    async fn select_one(url: &str) -> i32 {
        let mut conn = PgConnection::connect(url).await.unwrap();
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        let db: String = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(Some(db.as_str()), url.rsplit('/').next());
        conn.close().await.unwrap();
        one
    }

    #[tokio::test]
    async fn two_databases_are_distinct_and_answer() {
        let a = database().await;
        let b = database().await;
        assert_ne!(a, b);
        assert_eq!(select_one(&a).await, 1);
        assert_eq!(select_one(&b).await, 1);

        // A table made in one is not visible in the other.
        let mut ca = PgConnection::connect(&a).await.unwrap();
        ca.execute("CREATE TABLE only_in_a (x BIGINT)")
            .await
            .unwrap();
        let mut cb = PgConnection::connect(&b).await.unwrap();
        let seen: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = 'only_in_a'",
        )
        .fetch_one(&mut cb)
        .await
        .unwrap();
        assert_eq!(seen, 0);
    }

    #[tokio::test]
    async fn notify_reaches_a_listener_on_the_same_database() {
        let url = database().await;
        let mut listener = PgListener::connect(&url).await.unwrap();
        listener.listen("gw_test").await.unwrap();
        let mut sender = PgConnection::connect(&url).await.unwrap();
        sqlx::query("SELECT pg_notify('gw_test', $1)")
            .bind("hello")
            .execute(&mut sender)
            .await
            .unwrap();
        let n = tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .expect("no notification within STEP")
            .unwrap();
        assert_eq!(n.channel(), "gw_test");
        assert_eq!(n.payload(), "hello");

        // Another database's NOTIFY on the same channel name does not arrive here.
        let other = database().await;
        let mut elsewhere = PgConnection::connect(&other).await.unwrap();
        sqlx::query("SELECT pg_notify('gw_test', 'elsewhere')")
            .execute(&mut elsewhere)
            .await
            .unwrap();
        sqlx::query("SELECT pg_notify('gw_test', 'second')")
            .execute(&mut sender)
            .await
            .unwrap();
        let n = tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .expect("no second notification within STEP")
            .unwrap();
        assert_eq!(n.payload(), "second");
    }

    #[tokio::test]
    async fn private_server_stops_and_starts_again() {
        let mut pg = private_server();
        let url = pg.database().await;
        let mut conn = PgConnection::connect(&url).await.unwrap();
        conn.execute("CREATE TABLE kept (x BIGINT); INSERT INTO kept VALUES (7)")
            .await
            .unwrap();
        drop(conn);

        pg.stop();
        assert!(PgConnection::connect(&url).await.is_err());

        pg.start();
        let mut conn = PgConnection::connect(&url).await.unwrap();
        let x: i64 = sqlx::query_scalar("SELECT x FROM kept")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(x, 7, "the data directory survives a stop");
        conn.close().await.unwrap();

        let root = pg.cluster.root.clone();
        assert!(root.join("data").is_dir());
        drop(pg);
        assert!(
            !root.exists(),
            "dropping a private server removes its directory"
        );
    }
}
