//! What the benches that drive the release binary over HTTP share: a free loopback port, the
//! gateway started on a scripted agent `a0` with a `*` token, its health wait, and one
//! JSON-RPC call. Included with `#[path = "../common/mod.rs"] mod common;`.
#![allow(dead_code, clippy::unwrap_used, clippy::panic)]

use std::process::{Child, Command};
use std::time::Duration;

use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");
pub const TOKEN: &str = "bench-secret-0123456789abcdefghijklmnopqrstuv";

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The gateway on `port` with its data under `dir`; `gateway_extra`: more lines of the
/// `gateway` section (each `  key: value\n`).
pub fn spawn(dir: &std::path::Path, port: u16, gateway_extra: &str) -> Child {
    let config = format!(
        "gateway:\n  port: {port}\n  dataDir: {data}\n{gateway_extra}  \
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

pub async fn wait_healthy(port: u16) {
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

/// One call over `POST /rpc`; its result (a panic naming the method on an error).
pub async fn rpc(client: &reqwest::Client, port: u16, method: &str, params: &Value) -> Value {
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
