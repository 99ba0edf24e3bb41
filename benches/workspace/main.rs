//! Workspace file methods on the release binary, end to end over `POST /rpc` on loopback:
//! `workspace.readFile` of a 1 MiB file (answered as text) and an atomic `workspace.writeFile`
//! of 1 MiB of content, p50 and p99 of the whole call (request, JSON, file work, answer). See
//! README.md.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");
const TOKEN: &str = "bench-secret-0123456789abcdefghijklmnopqrstuv";
const ROUNDS: usize = 200;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn(dir: &std::path::Path, port: u16) -> Child {
    let config = format!(
        "gateway:\n  port: {port}\n  dataDir: {data}\n  httpBodyLimitBytes: 4194304\n  \
         tokens: [{{id: bench, secret: {TOKEN}, scopes: ['*']}}]\n  \
         rateLimit: {{windowMs: 1000, maxRequests: 100000000}}\n\
         local: {{autoFetch: false}}\nproviders:\n  s: {{type: scripted, models: [m]}}\nagents:\n  a0: {{model: s/m}}\n",
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
    for _ in 0..400 {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/health")).await {
            if r.status() == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("gateway did not start");
}

async fn rpc(client: &reqwest::Client, port: u16, method: &str, params: &Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let r: Value = client
        .post(format!("http://127.0.0.1:{port}/rpc"))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    r.get("result")
        .cloned()
        .unwrap_or_else(|| panic!("{method}: {r}"))
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

async fn timed(client: &reqwest::Client, port: u16, method: &str, params: &Value) -> (f64, f64) {
    for _ in 0..10 {
        rpc(client, port, method, params).await;
    }
    let mut times = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        rpc(client, port, method, params).await;
        times.push(t.elapsed());
    }
    times.sort();
    (pct(&times, 0.5), pct(&times, 0.99))
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = spawn(dir.path(), port);
    wait_healthy(port).await;
    let client = reqwest::Client::new();
    let content = "a".repeat(1 << 20);
    let write = json!({"agentId": "a0", "filePath": "bench/big.txt", "content": content});
    let read = json!({"agentId": "a0", "filePath": "bench/big.txt"});
    let (w50, w99) = timed(&client, port, "workspace.writeFile", &write).await;
    let (r50, r99) = timed(&client, port, "workspace.readFile", &read).await;
    println!(
        "workspace.writeFile 1 MiB (atomic): p50 {w50:.2} ms, p99 {w99:.2} ms ({ROUNDS} calls)"
    );
    println!("workspace.readFile 1 MiB: p50 {r50:.2} ms, p99 {r99:.2} ms ({ROUNDS} calls)");
    let _ = child.kill();
    let _ = child.wait();
}
