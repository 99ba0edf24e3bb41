//! Workspace file methods on the release binary, end to end over `POST /rpc` on loopback:
//! `workspace.readFile` of a 1 MiB file (answered as text) and an atomic `workspace.writeFile`
//! of 1 MiB of content, p50 and p99 of the whole call (request, JSON, file work, answer). See
//! README.md.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[path = "../common/mod.rs"]
mod common;
use common::{free_port, rpc, spawn, wait_healthy};

const ROUNDS: usize = 200;

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
    let mut child = spawn(dir.path(), port, "  httpBodyLimitBytes: 4194304\n");
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
