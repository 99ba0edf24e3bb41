//! Shared by the benches that drive a gateway process (`ws_idle`, `ws_rpc`, `orchestration`): a
//! gateway binary as a child process
//! on a free loopback port with a bench configuration, its figures from /proc, and a
//! WebSocket client with small buffers (so ten thousand of them fit in the bench process).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub const TOKEN: &str = "bench-secret-0123456789abcdefghijklmnopqrstuvwxyz";

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A gateway process, killed when dropped.
pub struct Gateway {
    pub child: Child,
    pub port: u16,
    pub bin: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `--gateway <path>` or `target/release/agent-gateway`; `--baseline <path>` the same way.
pub fn arg(name: &str) -> Option<PathBuf> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
}

pub fn default_gateway() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/agent-gateway")
}

pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port()
}

/// Starts `bin` with the bench configuration plus `extra` lines under `gateway:`.
pub async fn spawn(bin: &Path, extra: &str) -> Gateway {
    spawn_with(bin, extra, "").await
}

/// [`spawn`] with `sections` (providers, agents, ...) appended at the top level.
pub async fn spawn_with(bin: &Path, extra: &str, sections: &str) -> Gateway {
    assert!(
        bin.exists(),
        "{} not found: build it with `cargo build --release --bin agent-gateway`",
        bin.display()
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = dir.path().join("bench.yaml");
    std::fs::write(
        &config,
        format!(
            "gateway:\n  host: 127.0.0.1\n  port: {port}\n  dataDir: {data}\n  tokens: [{{id: bench, secret: {TOKEN}, scopes: ['*']}}]\n  rateLimit: {{windowMs: 1000, maxRequests: 1000000000}}\n  wsMessageRateLimit: {{maxMessages: 1000000000, windowMs: 1000}}\n{extra}local: {{autoFetch: false, preload: false}}\n{sections}",
            data = dir.path().join("data").display()
        ),
    )
    .expect("config written");
    let child = Command::new(bin)
        .args(["serve", "--config"])
        .arg(&config)
        .env_remove("AGENT_GATEWAY_CONFIG")
        .env_remove("AGENT_GATEWAY_PORT")
        .env("AGENT_GATEWAY_LOG", "warn")
        .env("AGENT_GATEWAY_NO_FETCH", "1")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("gateway started");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/health")).await {
            if r.status() == 200 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "gateway did not become healthy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Gateway {
        child,
        port,
        bin: bin.to_owned(),
        _dir: dir,
    }
}

fn status_field(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Resident memory now, KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_field(pid, "VmRSS:")
}

/// Peak resident memory, KiB.
pub fn hwm_kib(pid: u32) -> u64 {
    status_field(pid, "VmHWM:")
}

/// User + system CPU time of a process, in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): state is field 3, utime 14.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    f.iter().sum()
}

pub fn ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// An authenticated `/ws` client with 4 KiB buffers.
pub async fn connect(port: u16) -> Ws {
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0);
    let url = format!("ws://127.0.0.1:{port}/ws?token={TOKEN}");
    let (ws, _) = tokio_tungstenite::connect_async_with_config(url, Some(config), true)
        .await
        .expect("websocket connected");
    ws
}
