//! Gateway overhead of one agent.execute turn on the scripted provider (no model time):
//! latency percentiles and calls/s over one WebSocket and over 16, for ephemeral turns and
//! for turns in stored sessions, against the release binary on loopback. See README.md.
#![allow(
    clippy::disallowed_methods,
    reason = "tests and benches own the tasks they start"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");
const TOKEN: &str = "bench-secret-0123456789abcdefghijklmnopqrstuv";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn(dir: &std::path::Path, port: u16) -> Child {
    let config = format!(
        "gateway:\n  port: {port}\n  dataDir: {data}\n  tokens: [{{id: bench, secret: {TOKEN}, scopes: ['*']}}]\n  \
         rateLimit: {{windowMs: 1000, maxRequests: 100000000}}\n  wsMessageRateLimit: {{maxMessages: 100000000, windowMs: 1000}}\n  limits: {{maxConcurrentTurnsPerClient: 100000, maxConcurrentTurns: 100000}}\n\
         local: {{autoFetch: false}}\nproviders:\n  s: {{type: scripted, models: [m]}}\nagents:\n  default: {{model: s/m}}\n",
        data = dir.join("data").display()
    );
    let path = dir.join("bench.yaml");
    std::fs::write(&path, config).unwrap();
    Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&path)
        .env("AGENT_GATEWAY_LOG", "warn")
        .env("AGENT_GATEWAY_NO_FETCH", "1")
        .spawn()
        .unwrap()
}

async fn wait_healthy(port: u16) {
    for _ in 0..200 {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/health")).await {
            if r.status() == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("gateway did not start");
}

/// `calls` sequential agent.execute calls on one connection; the latency of each.
async fn client(port: u16, calls: usize, session: Option<String>) -> Vec<Duration> {
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{port}/ws?token={TOKEN}"))
            .await
            .unwrap();
    let mut lat = Vec::with_capacity(calls);
    for i in 0..calls {
        let mut params = json!({"message": format!("hello {i}")});
        if let Some(s) = &session {
            params["sessionKey"] = json!({"userId": s});
        }
        let req = json!({"jsonrpc": "2.0", "id": i, "method": "agent.execute", "params": params});
        let t = Instant::now();
        ws.send(Message::Text(req.to_string().into()))
            .await
            .unwrap();
        loop {
            match ws.next().await.unwrap().unwrap() {
                Message::Text(t) => {
                    let v: Value = serde_json::from_str(&t).unwrap();
                    if v.get("id").is_some() {
                        assert!(v.get("result").is_some(), "{v}");
                        break;
                    }
                }
                _ => continue,
            }
        }
        lat.push(t.elapsed());
    }
    lat
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

async fn scenario(port: u16, name: &str, conns: usize, total: usize, stored: bool) {
    let per = total / conns;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..conns {
        // Stored sessions: each connection its own conversation, restarted every 100 turns
        // so the history sent to the model stays at a realistic size.
        let session = stored.then(|| format!("{name}-{c}"));
        tasks.push(tokio::spawn(async move {
            let mut all = Vec::new();
            let mut left = per;
            let mut round = 0;
            while left > 0 {
                let n = left.min(100);
                let s = session.as_ref().map(|s| format!("{s}-{round}"));
                all.extend(client(port, n, s).await);
                left -= n;
                round += 1;
            }
            all
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let wall = started.elapsed().as_secs_f64();
    lat.sort();
    println!(
        "| {name} | {conns} | {} | {:.3} | {:.3} | {:.0} |",
        lat.len(),
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        lat.len() as f64 / wall
    );
}

fn db_counts(dir: &std::path::Path) -> (i64, i64) {
    let db = dir.join("data/gateway.db");
    let q = |sql: &str| -> i64 {
        let out = Command::new("python3")
            .args([
                "-c",
                &format!(
                    "import sqlite3;print(sqlite3.connect('{}').execute('{sql}').fetchone()[0])",
                    db.display()
                ),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(-1)
    };
    (
        q("SELECT COUNT(*) FROM usage"),
        q("SELECT COUNT(*) FROM messages"),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let total: usize = std::env::var("BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4000);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = spawn(dir.path(), port);
    wait_healthy(port).await;
    client(port, 200, None).await;
    println!("| scenario | connections | calls | p50 ms | p99 ms | calls/s |");
    println!("|---|---|---|---|---|---|");
    scenario(port, "ephemeral", 1, total, false).await;
    scenario(port, "ephemeral", 16, total, false).await;
    let (u0, m0) = db_counts(dir.path());
    scenario(port, "stored-session", 1, total, true).await;
    let (u1, m1) = db_counts(dir.path());
    scenario(port, "stored-session", 16, total, true).await;
    println!();
    println!(
        "stored-session turns: {:.2} usage rows and {:.2} message rows per turn",
        (u1 - u0) as f64 / total as f64,
        (m1 - m0) as f64 / total as f64
    );
    let _ = child.kill();
    let _ = child.wait();
}
