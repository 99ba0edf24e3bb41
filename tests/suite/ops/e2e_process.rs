//! The real binary: embedded defaults, refusing bad configuration, SIGTERM (1001), kill -9
//! (1006), and no secret in any log line.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");

/// The test configuration on a fixed free port, spawned and healthy.
async fn spawn_configured(dir: &Path, extra: &str) -> (GatewayChild, u16) {
    let port = free_port();
    let config = dir.join("gateway.yaml");
    std::fs::write(
        &config,
        config_yaml(dir, extra).replace("port: 0", &format!("port: {port}")),
    )
    .unwrap();
    let child = spawn(dir, Some(&config), port);
    wait_healthy(port).await;
    (child, port)
}

fn spawn(dir: &Path, config: Option<&Path>, port: u16) -> GatewayChild {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .env_remove("AGENT_GATEWAY_CONFIG")
        .env("AGENT_GATEWAY_PORT", port.to_string())
        .env("AGENT_GATEWAY_DATA_DIR", dir.join("data"))
        .env("AGENT_GATEWAY_LOG", "debug")
        .env("AGENT_GATEWAY_NO_FETCH", "1")
        .stdout(std::fs::File::create(dir.join("out.log")).unwrap())
        .stderr(std::fs::File::create(dir.join("err.log")).unwrap());
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    GatewayChild::from(cmd.spawn().unwrap())
}

async fn wait_healthy(port: u16) {
    let deadline = Instant::now() + STEP;
    while Instant::now() < deadline {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/health")).await {
            if r.status() == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("gateway did not become healthy");
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + STEP;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "process did not exit in time");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

fn logs(dir: &Path) -> String {
    let mut s = String::new();
    for f in ["out.log", "err.log"] {
        std::fs::File::open(dir.join(f))
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_defaults_create_the_data_dir_and_a_private_local_token() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = spawn(dir.path(), None, port);
    wait_healthy(port).await;
    let token_file = dir.path().join("data/local-token");
    let token = std::fs::read_to_string(&token_file).unwrap();
    assert!(token.len() >= 32);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    let r: Value = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/rpc"))
        .bearer_auth(token.trim())
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"gateway.status"}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["result"]["pid"], child.id());
    assert_eq!(r["result"]["configPaths"], serde_json::json!([]));
    signal(&child, "-INT");
    assert!(wait_exit(&mut child).success());
    assert!(
        !logs(dir.path()).contains(token.trim()),
        "the local token never reaches the log"
    );
}

/// Starts the binary on `yaml` (data directory in a temp dir) and asserts it refuses to start
/// with `needle` in its output; the whole output (stdout then stderr).
fn refuses(yaml: &str, needle: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&path)
        .env("AGENT_GATEWAY_PORT", free_port().to_string())
        .env("AGENT_GATEWAY_DATA_DIR", dir.path().join("data"))
        .env("AGENT_GATEWAY_NO_FETCH", "1")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{yaml}");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(needle),
        "expected {needle:?} in {all}"
    );
    all
}

#[test]
fn bad_configuration_refuses_to_start_with_the_key_named() {
    refuses(
        "gateway:\n  tokens:\n    - {id: a, secret: 'only-31-characters-long-secret!', scopes: [rpc]}\n",
        "gateway.tokens[0].secret (token 'a') is shorter than 32 characters",
    );
    // Exactly 32 characters is accepted.
    let dir = tempfile::tempdir().unwrap();
    let ok = dir.path().join("ok.yaml");
    std::fs::write(&ok, "gateway:\n  tokens:\n    - {id: a, secret: 'exactly-32-characters-long-sec!!', scopes: [rpc]}\n").unwrap();
    let out = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&ok)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let missing = Command::new(BIN)
        .args(["check-config", "--config", "/nonexistent/gateway.yaml"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    refuses(
        "gateway:\n  rateLimit:\n    windowMS: 10\n",
        "gateway.rateLimit.windowMS",
    );
    refuses("gatewy:\n  port: 1\n", "gatewy");
    refuses("gateway:\n  port: 'x'\n", "gateway.port");
    refuses(
        &format!("gateway:\n  tokens:\n    - {{id: a, secret: {ADMIN}, scopes: [root]}}\n"),
        "unknown scope 'root'",
    );
    refuses(
        "gateway:\n  tls:\n    requireClientCert: true\n",
        "gateway.tls.requireClientCert",
    );
    // The secret itself is never echoed.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.yaml");
    std::fs::write(
        &path,
        "gateway:\n  tokens:\n    - {id: a, secret: 'short-secret-value-xyz', scopes: []}\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("short-secret-value-xyz"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_websockets_with_1001_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("gateway.yaml");
    std::fs::write(
        &config,
        config_yaml(dir.path(), "  shutdownGraceMs: 1000\n")
            .replace("port: 0", &format!("port: {port}")),
    )
    .unwrap();
    let mut child = spawn(dir.path(), Some(&config), port);
    wait_healthy(port).await;
    let gw_addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{gw_addr}/ws?token={RPC}"))
        .await
        .unwrap();
    assert_ping(&mut ws, 1).await;
    signal(&child, "-TERM");
    assert_eq!(
        closed(&mut ws).await,
        (1001, "Server shutting down".to_owned())
    );
    assert!(wait_exit(&mut child).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateway_leaves_clients_with_an_abnormal_closure() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, port) = spawn_configured(dir.path(), "").await;
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{port}/ws?token={RPC}"))
            .await
            .unwrap();
    assert_ping(&mut ws, 1).await;
    signal(&child, "-KILL");
    wait_exit(&mut child);
    assert_eq!(closed(&mut ws).await.0, 1006);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_or_secret_reaches_a_log_line() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, port) = spawn_configured(dir.path(), "").await;
    let base = format!("127.0.0.1:{port}");
    // Query token, header token, wrong token, admin reading raw config, failures.
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{base}/ws?token={RPC}"))
        .await
        .unwrap();
    send(
        &mut ws,
        r#"{"jsonrpc":"2.0","id":1,"method":"gateway.status"}"#,
    )
    .await;
    recv(&mut ws).await;
    let client = reqwest::Client::new();
    for (token, body) in [
        (
            ADMIN,
            r#"{"jsonrpc":"2.0","id":1,"method":"config.get","params":{"section":"gateway"}}"#,
        ),
        (
            ADMIN,
            r#"{"jsonrpc":"2.0","id":2,"method":"env.set","params":{"key":"K","value":"sekrit-value-that-must-not-be-logged"}}"#,
        ),
        (
            "wrong-token-0123456789-0123456789-0123",
            r#"{"jsonrpc":"2.0","id":3,"method":"system.ping"}"#,
        ),
    ] {
        client
            .post(format!("http://{base}/rpc"))
            .bearer_auth(token)
            .body(body)
            .send()
            .await
            .unwrap();
    }
    signal(&child, "-TERM");
    wait_exit(&mut child);
    let log = logs(dir.path());
    assert!(
        log.contains("agent-gateway listening"),
        "the log was captured: {log}"
    );
    for secret in [
        ADMIN,
        RPC,
        MCP,
        ADMIN_ONLY,
        "sekrit-value-that-must-not-be-logged",
        "wrong-token-0123456789",
    ] {
        assert!(!log.contains(secret), "a secret reached the log");
    }
}

const SCRIPTED: &str = r#"
providers:
  s:
    type: scripted
    models: [m]
agents:
  default: {model: s/m}
"#;

async fn turn(port: u16, text: &str) -> Result<Value, String> {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "agent.execute",
        "params": {"message": text, "sessionKey": {"userId": "durable"}}});
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/rpc"))
        .bearer_auth(RPC)
        .json(&body)
        .timeout(STEP)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let v: Value = r.json().await.map_err(|e| e.to_string())?;
    v.get("result").cloned().ok_or_else(|| v.to_string())
}

async fn history(port: u16) -> Vec<String> {
    history_of(port, RPC, "agent:default:api:client:durable").await
}

/// The contents of session `key`'s messages as `token` reads them, oldest first.
async fn history_of(port: u16, token: &str, key: &str) -> Vec<String> {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "session.history",
        "params": {"session_key": key, "limit": 1000}});
    let v: Value = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/rpc"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["result"]["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect()
}

/// Streams turns to the gateway on `port` until `count` are acknowledged, kills it with
/// kill -9 while the stream goes on, and returns every turn acknowledged before it died.
async fn kill_mid_stream(child: &mut Child, port: u16, count: usize) -> Vec<String> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let writer = tokio::spawn(async move {
        for i in 0.. {
            let text = format!("turn {i}");
            match turn(port, &text).await {
                Ok(_) => {
                    if tx.send(text).is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
    let mut acked = Vec::new();
    while acked.len() < count {
        acked.push(rx.recv().await.unwrap());
    }
    signal(child, "-KILL");
    wait_exit(child);
    writer.await.unwrap();
    while let Ok(t) = rx.try_recv() {
        acked.push(t);
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_survive_a_restart_and_kill_9_loses_no_acknowledged_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, port) = spawn_configured(dir.path(), SCRIPTED).await;
    turn(port, "before a clean restart").await.unwrap();
    signal(&child, "-TERM");
    assert!(wait_exit(&mut child).success());
    let (mut child, port) = spawn_configured(dir.path(), SCRIPTED).await;
    assert_eq!(
        history(port).await,
        ["before a clean restart", "You said: before a clean restart"]
    );
    // A stream of turns, killed without warning while they run.
    let acked = kill_mid_stream(&mut child, port, 25).await;
    let (_child, port) = spawn_configured(dir.path(), SCRIPTED).await;
    let stored = history(port).await;
    for t in &acked {
        assert!(
            stored.contains(t),
            "acknowledged {t:?} lost; stored {stored:?}"
        );
        assert!(stored.contains(&format!("You said: {t}")));
    }
    // Whole turns only: at most the one in flight was written without being acknowledged.
    let turns = stored.len() / 2;
    assert_eq!(stored.len() % 2, 0, "{stored:?}");
    assert!(
        turns == acked.len() + 1 || turns == acked.len() + 2,
        "{turns} vs {}",
        acked.len()
    );
    signal(&_child, "-KILL");
}

#[test]
fn an_unreachable_database_stops_the_start_naming_it_without_its_password() {
    let port = free_port();
    let yaml = format!(
        "store:\n  url: postgres://gw:hunter2-secret-value@127.0.0.1:{port}/fleet\n  connectTimeoutMs: 600\n"
    );
    let all = refuses(
        &yaml,
        &format!("cannot connect to PostgreSQL at postgres://gw@127.0.0.1:{port}/fleet"),
    );
    assert!(
        !all.contains("hunter2"),
        "the password reached the output: {all}"
    );
}

/// Node A is killed (kill -9) while a client streams turns through it; every acknowledged turn
/// is in the shared database, node B serves the client's next turn, and a WebSocket client of
/// A reconnects to B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_stream_loses_no_answered_turn_and_another_node_serves_on() {
    let url = crate::pg::database().await;
    let extra = format!("{SCRIPTED}\n{}", store_yaml(&url));
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut a, port_a) = spawn_configured(dir_a.path(), &extra).await;
    let (mut b, port_b) = spawn_configured(dir_b.path(), &extra).await;
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{port_a}/ws?token={RPC}"))
            .await
            .unwrap();
    assert_ping(&mut ws, 1).await;
    let acked = kill_mid_stream(&mut a, port_a, 20).await;
    // The killed node's socket ends abnormally; the client goes to B.
    let (code, _) = closed(&mut ws).await;
    assert_eq!(code, 1006);
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{port_b}/ws?token={RPC}"))
            .await
            .unwrap();
    assert_ping(&mut ws, 2).await;
    let stored = history(port_b).await;
    for t in &acked {
        assert!(
            stored.contains(t),
            "acknowledged {t:?} lost; stored {stored:?}"
        );
        assert!(stored.contains(&format!("You said: {t}")));
    }
    assert_eq!(stored.len() % 2, 0, "whole turns only: {stored:?}");
    turn(port_b, "after the kill").await.unwrap();
    let stored = history(port_b).await;
    assert_eq!(
        stored[stored.len() - 2..],
        ["after the kill", "You said: after the kill"]
    );
    signal(&b, "-TERM");
    assert!(wait_exit(&mut b).success());
}

const HOOK_TOKEN: &str = "hook-token-0123456789abcdefghijklmnopqrstuv";

async fn hook(port: u16, body: &str) -> u16 {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(HOOK_TOKEN.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let sig = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/hooks/echo"))
        .header("content-type", "application/json")
        .header("x-hub-signature-256", sig)
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A webhook run acknowledged by node A and still queued there when A is killed is run by
/// node B once A counts as dead; the run A was running is marked orphaned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_queued_webhook_run_is_taken_over_by_another_node() {
    let url = crate::pg::database().await;
    let extra = format!(
        r#"
providers:
  s:
    type: scripted
    models: [m]
    script:
      - match: "slow"
        steps:
          - reply: "slow done"
            delayMs: 60000
      - match: "quick"
        steps:
          - reply: "quick done"
agents:
  default: {{model: s/m}}
webhooks:
  enabled: true
  token: {HOOK_TOKEN}
  maxConcurrentRuns: 1
  hmac: {{headerName: x-hub-signature-256}}
  mappings:
    - id: echo
      match: {{path: echo}}
      sessionKey: "{{{{payload.id}}}}"
      messageTemplate: "{{{{payload.text}}}}"
{}"#,
        store_yaml(&url)
    );
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut a, port_a) = spawn_configured(dir_a.path(), &extra).await;
    let (mut b, port_b) = spawn_configured(dir_b.path(), &extra).await;
    assert_eq!(hook(port_a, r#"{"id":"s1","text":"slow"}"#).await, 200);
    assert_eq!(hook(port_a, r#"{"id":"q1","text":"quick"}"#).await, 200);
    let mut db = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    let status = |key: &'static str| {
        sqlx::query_scalar::<_, String>("SELECT status FROM runs WHERE session_key = $1")
            .bind(format!("agent:default:webhook:echo:{key}"))
    };
    assert_eq!(status("q1").fetch_one(&mut db).await.unwrap(), "queued");
    signal(&a, "-KILL");
    wait_exit(&mut a);
    // B takes the queued run over once A is unseen for nodeDeadAfterMs (1.5 s in tests).
    let deadline = Instant::now() + STEP;
    loop {
        let q1 = status("q1").fetch_one(&mut db).await.unwrap();
        if q1 == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "q1 is still {q1}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status("s1").fetch_one(&mut db).await.unwrap(), "orphaned");
    let msgs = history_of(port_b, ADMIN, "agent:default:webhook:echo:q1").await;
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert_eq!(msgs[1], "quick done");
    signal(&b, "-TERM");
    assert!(wait_exit(&mut b).success());
}

const CRON_SCRIPT: &str = r#"providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "slow"
        steps:
          - reply: "done"
            delayMs: 1500
agents:
  default: {model: script/m1, maxSteps: 2}
scheduler:
  lateToleranceMs: 1000
"#;

/// kill -9 in the middle of a fire: the fire is recorded as an error (never re-run), the job
/// is kept, the due times missed while the gateway was down give one catch-up fire, and no due
/// time fires twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fire_cut_by_kill_9_is_recorded_and_missed_fires_catch_up_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, port) = spawn_configured(dir.path(), CRON_SCRIPT).await;
    let v = call_port(
        port,
        RPC,
        "cron.add",
        serde_json::json!({"name": "slow", "message": "slow job",
                           "schedule": {"kind": "interval", "everyMs": 2000}}),
    )
    .await;
    let id = v["result"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_owned();
    // Wait for a fire to start (the job's last run is set when a fire is claimed; a running
    // fire is not listed in cron.runs yet).
    let deadline = Instant::now() + STEP;
    loop {
        let st = call_port(
            port,
            RPC,
            "cron.status",
            serde_json::json!({"name": "slow"}),
        )
        .await;
        if st["result"]["lastRunAtMs"].is_i64() {
            break;
        }
        assert!(Instant::now() < deadline, "no fire started: {st}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(&child, "-9");
    wait_exit(&mut child);
    // Down for more than two due times.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let config = dir.path().join("gateway.yaml");
    let mut child = spawn(dir.path(), Some(&config), port);
    wait_healthy(port).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let runs = loop {
        let v = call_port(
            port,
            RPC,
            "cron.runs",
            serde_json::json!({"jobName": "slow"}),
        )
        .await;
        let runs = v["result"]["runs"].as_array().cloned().unwrap_or_default();
        if runs.len() >= 3 || Instant::now() > deadline {
            break runs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    signal(&child, "-TERM");
    wait_exit(&mut child);
    // Oldest first from here.
    let runs: Vec<&Value> = runs.iter().rev().collect();
    assert!(runs.len() >= 3, "{runs:?}");
    assert_eq!(runs[0]["status"], "error", "{runs:?}");
    assert_eq!(runs[0]["error"], "the gateway stopped during the fire");
    assert_eq!(runs[0]["jobId"], id.as_str());
    assert_eq!(runs[1]["trigger"], "catch_up", "{runs:?}");
    assert_eq!(runs[1]["status"], "ok");
    assert_eq!(runs[2]["trigger"], "schedule", "{runs:?}");
    let dues: Vec<i64> = runs
        .iter()
        .map(|r| r["dueAtMs"].as_i64().unwrap())
        .collect();
    assert!(
        dues.windows(2).all(|w| w[0] < w[1]),
        "each due time once: {dues:?}"
    );
    // One catch-up for the missed due times, then back on the job's grid.
    assert_eq!((dues[2] - dues[0]) % 2000, 0, "{dues:?}");
}

/// The control plane across kill -9: API tokens, secrets and the configuration's history
/// survive; the configuration file is whole after a kill during a stream of writes; the log
/// level changes at run time; no secret reaches the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_state_survives_kill_9_and_no_acknowledged_configuration_write_is_lost() {
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt;
    const PLAIN: &str = "sk-process-PLAINTEXT-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("master.key");
    std::fs::write(
        &key,
        base64::engine::general_purpose::STANDARD.encode([9u8; 32]),
    )
    .unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let extra = format!(
        "secrets:\n  masterKeyFile: {}\nagents:\n  w: {{model: local/smollm2-135m-instruct}}\n",
        key.display()
    );
    let (mut child, port) = spawn_configured(dir.path(), &extra).await;
    let config = dir.path().join("gateway.yaml");
    let created = call_port(
        port,
        ADMIN,
        "tokens.create",
        serde_json::json!({"scopes": ["rpc"], "id": "kept"}),
    )
    .await;
    let token = created["result"]["secret"].as_str().unwrap().to_owned();
    let r = call_port(
        port,
        ADMIN,
        "secrets.set",
        serde_json::json!({"name": "KEPT_SECRET", "value": PLAIN}),
    )
    .await;
    assert_eq!(r["result"]["created"], true, "{r}");
    let r = call_port(
        port,
        ADMIN,
        "config.set",
        serde_json::json!({"section": "agents", "key": "w.maxSteps", "value": 4}),
    )
    .await;
    assert_eq!(r["result"]["restarting"], false, "{r}");
    // The log level at run time: at warn, an info line of a token's creation is not written.
    let r = call_port(
        port,
        ADMIN,
        "daemon.setLogLevel",
        serde_json::json!({"level": "warn"}),
    )
    .await;
    assert_eq!(r["result"]["scope"], "global", "{r}");
    assert_eq!(r["result"]["persistent"], false);
    call_port(
        port,
        ADMIN,
        "tokens.create",
        serde_json::json!({"scopes": ["rpc"], "id": "quiet"}),
    )
    .await;
    let r = call_port(
        port,
        ADMIN,
        "daemon.setLogLevel",
        serde_json::json!({"level": "info", "module": "agent_gateway::handlers"}),
    )
    .await;
    assert_eq!(r["result"]["scope"], "module", "{r}");
    call_port(
        port,
        ADMIN,
        "tokens.create",
        serde_json::json!({"scopes": ["rpc"], "id": "loud"}),
    )
    .await;
    let r = call_port(
        port,
        RPC,
        "daemon.setLogLevel",
        serde_json::json!({"level": "info"}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32603);
    let r = call_port(
        port,
        ADMIN,
        "daemon.setLogLevel",
        serde_json::json!({"level": "loud"}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32602);

    signal(&child, "-KILL");
    wait_exit(&mut child);
    let log = logs(dir.path());
    assert!(log.contains("token=kept"), "{log}");
    assert!(
        !log.contains("token=quiet"),
        "an info line was written at warn"
    );
    assert!(
        log.contains("token=loud"),
        "the module level was not applied"
    );
    for secret in [PLAIN, token.as_str(), ADMIN] {
        assert!(!log.contains(secret), "a secret reached the log");
    }

    let mut child = spawn(dir.path(), Some(&config), port);
    wait_healthy(port).await;
    let r = call_port(port, &token, "system.ping", serde_json::json!({})).await;
    assert_eq!(
        r["result"]["pong"], true,
        "the API token did not survive: {r}"
    );
    let r = call_port(
        port,
        ADMIN,
        "secrets.get",
        serde_json::json!({"name": "KEPT_SECRET"}),
    )
    .await;
    assert_eq!(r["result"]["value"], PLAIN);
    let r = call_port(port, ADMIN, "config.history", serde_json::json!({})).await;
    assert!(
        r["result"]["entries"][0]["message"]
            .as_str()
            .unwrap()
            .contains("agents.w.maxSteps"),
        "{r}"
    );
    let r = call_port(
        port,
        ADMIN,
        "agents.get",
        serde_json::json!({"agentId": "w"}),
    )
    .await;
    assert_eq!(r["result"]["maxSteps"], 4);

    // kill -9 in the middle of a stream of configuration writes: the document in the store
    // is always whole and holds every acknowledged write (or the one in flight); the file,
    // the operator's bootstrap, is never written (issue 27).
    let file_before = std::fs::read_to_string(&config).unwrap();
    for round in 0..3u64 {
        let writer = tokio::spawn(async move {
            let mut acknowledged = None;
            for i in 0..1000u64 {
                let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "config.set",
                    "params": {"section": "agents", "key": "w.maxSteps", "value": 1 + i % 9}});
                let sent = reqwest::Client::new()
                    .post(format!("http://127.0.0.1:{port}/rpc"))
                    .bearer_auth(ADMIN)
                    .json(&body)
                    .send()
                    .await;
                let Ok(sent) = sent else {
                    return acknowledged;
                };
                let Ok(answer) = sent.json::<serde_json::Value>().await else {
                    return acknowledged;
                };
                if answer["result"]["ok"] == true {
                    acknowledged = Some(i);
                }
            }
            acknowledged
        });
        tokio::time::sleep(Duration::from_millis(150 + 70 * round)).await;
        signal(&child, "-KILL");
        wait_exit(&mut child);
        let acknowledged = writer.await.unwrap();
        let text = std::fs::read_to_string(&config).unwrap();
        assert_eq!(text, file_before, "the API wrote the configuration file");
        child = spawn(dir.path(), Some(&config), port);
        wait_healthy(port).await;
        let r = call_port(
            port,
            ADMIN,
            "config.read",
            serde_json::json!({"section": "agents"}),
        )
        .await;
        let steps = r["result"]["w"]["maxSteps"].as_u64().unwrap();
        if let Some(i) = acknowledged {
            assert!(
                steps == 1 + i % 9 || steps == 1 + (i + 1) % 9,
                "acknowledged write {i} lost: maxSteps {steps}"
            );
        }
        let r = call_port(
            port,
            ADMIN,
            "agents.get",
            serde_json::json!({"agentId": "w"}),
        )
        .await;
        assert_eq!(r["result"]["maxSteps"], steps, "{r}");
    }
    signal(&child, "-TERM");
    wait_exit(&mut child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observability_records_survive_kill_9_once_read() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, port) = spawn_configured(dir.path(), SCRIPTED).await;
    let mut trace = String::new();
    for i in 0..3 {
        let r = turn(port, &format!("recorded turn {i}")).await.unwrap();
        trace = r["traceId"].as_str().unwrap().to_owned();
    }
    let key = "agent:default:api:client:durable";
    // A read flushes the writer: everything answered before it is committed.
    let billing = call_port(port, ADMIN, "obs.billing.total", serde_json::json!({})).await;
    assert_eq!(billing["result"]["callCount"], 3, "{billing}");
    let explain = call_port(
        port,
        ADMIN,
        "obs.explain",
        serde_json::json!({"sessionKey": key}),
    )
    .await;
    assert_eq!(explain["result"]["timing"]["turnCount"], 3, "{explain}");
    let rows = call_port(port, ADMIN, "obs.trace.search", serde_json::json!({})).await;
    signal(&child, "-KILL");
    wait_exit(&mut child);
    let (child, port) = spawn_configured(dir.path(), SCRIPTED).await;
    let after = call_port(port, ADMIN, "obs.billing.total", serde_json::json!({})).await;
    assert_eq!(after["result"], billing["result"]);
    let again = call_port(
        port,
        ADMIN,
        "obs.explain",
        serde_json::json!({"sessionKey": key}),
    )
    .await;
    assert_eq!(again["result"], explain["result"]);
    let by_trace = call_port(
        port,
        ADMIN,
        "obs.explain",
        serde_json::json!({"traceId": trace}),
    )
    .await;
    assert_eq!(by_trace["result"]["sessionKey"], key);
    let rows_after = call_port(port, ADMIN, "obs.trace.search", serde_json::json!({})).await;
    assert_eq!(rows_after["result"], rows["result"]);
    assert_eq!(rows["result"]["rows"].as_array().unwrap().len(), 9);
    signal(&child, "-KILL");
}
