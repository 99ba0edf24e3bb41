//! Shared test harness: a gateway on 127.0.0.1 with a temp data dir, tokens of each scope,
//! and small HTTP / WebSocket clients.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub const ADMIN: &str = "admin-secret-0123456789abcdefghijklmnopqrstuv";
pub const RPC: &str = "rpc-secret-0123456789abcdefghijklmnopqrstuvwxy";
pub const MCP: &str = "mcp-secret-0123456789abcdefghijklmnopqrstuvwxy";
pub const ADMIN_ONLY: &str = "admin-only-0123456789abcdefghijklmnopqrstuvw";

/// A step that must finish quickly in a healthy gateway; a hang fails the test instead.
pub const STEP: Duration = Duration::from_secs(10);

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub struct Gateway {
    pub addr: SocketAddr,
    pub running: agent_gateway::server::Running,
    pub dir: tempfile::TempDir,
}

/// The YAML of a test configuration; `extra` lines are appended under `gateway:` (lines at
/// column 0 add top-level sections). The local model is never fetched by tests.
pub fn config_yaml(dir: &std::path::Path, extra: &str) -> String {
    let local = if extra.contains("\nlocal:") {
        ""
    } else {
        "local:\n  autoFetch: false\n  preload: false\n"
    };
    format!(
        "{local}gateway:\n  host: 127.0.0.1\n  port: 0\n  dataDir: {data}\n  tokens:\n    - {{id: admin, secret: {ADMIN}, scopes: ['*']}}\n    - {{id: client, secret: {RPC}, scopes: [rpc]}}\n    - {{id: mcp, secret: {MCP}, scopes: [mcp-client]}}\n    - {{id: ops, secret: {ADMIN_ONLY}, scopes: [admin]}}\n{extra}",
        data = dir.join("data").display()
    )
}

/// A port free on 127.0.0.1 now (for a process that binds it itself).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub async fn start(extra: &str) -> Gateway {
    // The whole suite on PostgreSQL, on demand: every gateway without a store of its own gets a
    // fresh database on the suite's throwaway server.
    if std::env::var("AGENT_GATEWAY_TEST_BACKEND").as_deref() == Ok("postgres")
        && !extra.contains("\nstore:")
    {
        let url = crate::pg::database().await;
        return start_plain(&format!("{extra}\n{}", store_yaml(&url))).await;
    }
    start_plain(extra).await
}

/// The `store:` section of a gateway on the PostgreSQL database `url`, with node timings short
/// enough for tests (a node unseen for 1.5 s is dead).
pub fn store_yaml(url: &str) -> String {
    format!("store:\n  url: {url}\n  nodeHeartbeatMs: 250\n  nodeDeadAfterMs: 1500\n")
}

/// A gateway on the PostgreSQL database `url` (several may share one: nodes of a fleet).
pub async fn start_on(url: &str, extra: &str) -> Gateway {
    start_on_with(url, extra, "").await
}

/// [`start_on`] with more `store:` keys (lines indented by two spaces).
pub async fn start_on_with(url: &str, extra: &str, store: &str) -> Gateway {
    start_plain(&format!("{extra}\n{}{store}", store_yaml(url))).await
}

async fn start_plain(extra: &str) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, config_yaml(dir.path(), extra)).unwrap();
    let running = agent_gateway::server::start(Some(path)).await.unwrap();
    Gateway {
        addr: running.addr,
        running,
        dir,
    }
}

impl Gateway {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn post_rpc(&self, token: &str, body: &str) -> (u16, String) {
        let r = reqwest::Client::new()
            .post(self.url("/rpc"))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// One call over POST /rpc; the whole response object.
    pub async fn call(&self, token: &str, method: &str, params: Value) -> Value {
        let body =
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let (status, text) = self.post_rpc(token, &body.to_string()).await;
        assert_eq!(status, 200, "{method}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    pub async fn ws(&self, token: &str) -> Ws {
        let url = format!("ws://{}/ws?token={token}", self.addr);
        let (ws, _) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
            .await
            .unwrap()
            .unwrap();
        ws
    }

    pub async fn ws_with_header(&self, token: &str) -> Ws {
        let mut req = format!("ws://{}/ws", self.addr)
            .into_client_request()
            .unwrap();
        req.headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let (ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        ws
    }

    /// Stops this gateway and starts a new process-like instance on the same configuration
    /// file and data directory (everything in memory is gone; the database stays).
    pub async fn restart(self) -> Gateway {
        let Gateway { running, dir, .. } = self;
        running.shutdown.cancel();
        tokio::time::timeout(STEP, running.done)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let running = agent_gateway::server::start(Some(dir.path().join("gateway.yaml")))
            .await
            .unwrap();
        Gateway {
            addr: running.addr,
            running,
            dir,
        }
    }

    pub async fn stop(self) {
        self.running.shutdown.cancel();
        tokio::time::timeout(STEP, self.running.done)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}

/// Waits until `gw` serves server generation `n` (an in-process restart happened).
pub async fn wait_generation(gw: &Gateway, n: i64) {
    tokio::time::timeout(STEP, async {
        loop {
            let r = gw
                .call(ADMIN, "gateway.status", serde_json::json!({}))
                .await;
            if r["result"]["generation"] == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("generation {n} never served"));
}

pub async fn send(ws: &mut Ws, text: &str) {
    ws.send(Message::text(text)).await.unwrap();
}

/// The next JSON text frame that is not a heartbeat.
pub async fn recv(ws: &mut Ws) -> Value {
    loop {
        let msg = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("no frame in time");
        match msg.expect("stream ended").expect("ws error") {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v.get("method").and_then(Value::as_str) == Some("heartbeat") {
                    continue;
                }
                return v;
            }
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

/// Waits for the close frame and returns (code, reason).
pub async fn closed(ws: &mut Ws) -> (u16, String) {
    loop {
        let msg = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("no close in time");
        match msg {
            Some(Ok(Message::Close(Some(frame)))) => {
                return (u16::from(frame.code), frame.reason.to_string())
            }
            Some(Ok(Message::Close(None))) => return (1005, String::new()),
            Some(Ok(_)) => continue,
            // The stream ended without a close frame: an abnormal closure.
            Some(Err(_)) | None => return (1006, String::new()),
        }
    }
}

/// Asserts no frame (other than heartbeats) arrives within `wait`.
pub async fn silent(ws: &mut Ws, wait: Duration) {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => return,
            Ok(Some(Ok(Message::Text(t)))) if t.contains("\"heartbeat\"") => continue,
            Ok(other) => panic!("expected silence, got {other:?}"),
        }
    }
}

pub fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {v}"))
}

/// Sends `system.ping` with `id` and asserts the pong: the connection is alive and served.
pub async fn assert_ping(ws: &mut Ws, id: u64) {
    send(
        ws,
        &format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"system.ping"}}"#),
    )
    .await;
    let r = recv(ws).await;
    assert_eq!(
        (r["id"].as_u64(), r["result"]["pong"].as_bool()),
        (Some(id), Some(true)),
        "{r}"
    );
}

/// Checks a result against its method's result schema.
/// The result of a call that must succeed, checked against the method's result schema.
pub async fn ok(gw: &Gateway, token: &str, method: &str, params: Value) -> Value {
    let r = gw.call(token, method, params.clone()).await;
    let result = r
        .get("result")
        .cloned()
        .unwrap_or_else(|| panic!("{method} {params}: {r}"));
    validate_result(method, &result);
    result
}

pub fn validate_result(method: &str, result: &Value) {
    let info = agent_gateway::api::generated::methods::METHODS
        .iter()
        .find(|m| m.name == method)
        .unwrap();
    let schema: Value = serde_json::from_str(info.result_schema).unwrap();
    let v = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = v
        .iter_errors(result)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{method} result violates its schema: {errors:?}\n{result}"
    );
}

/// The gateway's own SQLite file, for reading rows no route exposes (once the gateway answers
/// a call, the file exists).
pub async fn database(gw: &Gateway) -> sqlx::SqlitePool {
    let ping = gw.call(RPC, "system.ping", serde_json::json!({})).await;
    assert!(ping.get("result").is_some(), "{ping}");
    let db = gw.dir.path().join("data").join("gateway.db");
    sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap()
}

/// The gateway binary the suite was built with.
pub const GATEWAY_BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");

/// A spawned gateway process, killed (SIGKILL) and reaped when dropped: a test that panics
/// before its own kill never leaves a gateway running. Derefs to the `std::process::Child`.
pub struct GatewayChild(std::process::Child);

impl std::ops::Deref for GatewayChild {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for GatewayChild {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl From<std::process::Child> for GatewayChild {
    fn from(c: std::process::Child) -> Self {
        Self(c)
    }
}

impl Drop for GatewayChild {
    fn drop(&mut self) {
        // Both fail harmlessly when the test already killed and reaped it.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The real binary serving `config` on `port` (logs in `dir/<log>.out` and `.err`).
pub fn spawn_child(
    dir: &std::path::Path,
    config: &std::path::Path,
    log: &str,
    port: u16,
) -> GatewayChild {
    GatewayChild(
        std::process::Command::new(GATEWAY_BIN)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .env_remove("AGENT_GATEWAY_CONFIG")
            .env("AGENT_GATEWAY_PORT", port.to_string())
            .env("AGENT_GATEWAY_NO_FETCH", "1")
            .stdout(std::fs::File::create(dir.join(format!("{log}.out"))).unwrap())
            .stderr(std::fs::File::create(dir.join(format!("{log}.err"))).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// The real binary on `config`, healthy, and its port.
pub async fn spawn_binary(
    dir: &std::path::Path,
    config: &std::path::Path,
    log: &str,
) -> (GatewayChild, u16) {
    let port = free_port();
    let mut child = spawn_child(dir, config, log, port);
    let deadline = std::time::Instant::now() + STEP;
    while std::time::Instant::now() < deadline {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/health")).await {
            if r.status() == 200 {
                return (child, port);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("gateway did not become healthy");
}

/// One JSON-RPC call over `POST /rpc` to the gateway on `port` (a spawned binary); the whole
/// response object.
pub async fn call_port(port: u16, token: &str, method: &str, params: Value) -> Value {
    reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/rpc"))
        .bearer_auth(token)
        .json(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .timeout(STEP)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The events `/api/activity` shows admin (the newest 100), as text.
pub async fn activity(gw: &Gateway) -> String {
    let v: Value = reqwest::Client::new()
        .get(gw.url("/api/activity?limit=100"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v.to_string()
}
