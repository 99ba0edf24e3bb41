//! Restart safety: `gateway.restart` with a configuration that would not start keeps the
//! running generation serving, `check-config` refuses the same files, and a restart does not
//! orphan the runs still running in the process.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");

const SCRIPT: &str = r#"
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "slow"
        steps:
          - reply: "Finally."
            delayMs: 60000
      - match: "medium"
        steps:
          - reply: "Took a while."
            delayMs: 1500
      - steps:
          - reply: "Fast."
agents:
  bot: {model: script/m1}
"#;

fn good(dir: &Path) -> String {
    config_yaml(dir, &format!("  shutdownGraceMs: 300\n{SCRIPT}"))
}

/// Each kind of file that must not start: (what, the file).
fn bad_files(dir: &Path) -> Vec<(&'static str, String)> {
    let ok = good(dir);
    vec![
        ("YAML syntax", "gateway: [\n".to_owned()),
        (
            "unknown key",
            config_yaml(dir, &format!("  bogus: 1\n{SCRIPT}")),
        ),
        ("short secret", ok.replace(RPC, "too-short-a-secret")),
        (
            "unknown provider type",
            ok.replace("type: scripted", "type: nope"),
        ),
        (
            "bad provider",
            ok.replace(
                "agents:\n",
                "  broken: {type: openai, baseUrl: 'ftp://example.com'}\nagents:\n",
            ),
        ),
        (
            "agent on an unknown model",
            ok.replace("{model: script/m1}", "{model: script/missing}"),
        ),
        ("unknown defaultAgent", format!("{ok}defaultAgent: ghost\n")),
        (
            "trusted proxy that is not an address",
            config_yaml(dir, &format!("  trustedProxies: [10.0.0.0/8, proxy.local]\n{SCRIPT}")),
        ),
        (
            "no turn allowed",
            config_yaml(
                dir,
                &format!("  limits: {{maxConcurrentTurnsPerClient: 0}}\n{SCRIPT}"),
            ),
        ),
        (
            "bad webhook path",
            format!(
                "{ok}webhooks:\n  enabled: true\n  path: hooks\n  token: 0123456789abcdef0123456789abcdef\n"
            ),
        ),
    ]
}

async fn status(gw: &Gateway) -> Value {
    gw.call(ADMIN, "gateway.status", json!({})).await["result"].clone()
}

async fn execute(gw: &Gateway, agent: &str) -> Value {
    gw.call(
        RPC,
        "agent.execute",
        json!({"message": "hi", "agentId": agent}),
    )
    .await
}

async fn refusals(gw: &Gateway, n: u64) {
    let refused = &gw.running.control.restarts_refused;
    tokio::time::timeout(STEP, async {
        while refused.load(Ordering::Relaxed) < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("restart {n} was not refused"));
    assert_eq!(refused.load(Ordering::Relaxed), n);
}

async fn generation(gw: &Gateway, n: i64) {
    wait_generation(gw, n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_each_kind_of_bad_file_keeps_serving_the_previous_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, good(dir.path())).unwrap();
    let running = agent_gateway::server::start(Some(path.clone()))
        .await
        .unwrap();
    let gw = Gateway {
        addr: running.addr,
        running,
        dir,
    };
    let mut ws = gw.ws(RPC).await;
    let mut bad = bad_files(gw.dir.path());
    // Passes check-config (nothing is touched there) but cannot be built: the data directory
    // cannot be created under a file.
    let blocker = gw.dir.path().join("a-file");
    std::fs::write(&blocker, "").unwrap();
    bad.push((
        "data directory that cannot be created",
        good(gw.dir.path()).replace(
            &gw.dir.path().join("data").display().to_string(),
            &blocker.join("data").display().to_string(),
        ),
    ));
    for (i, (what, yaml)) in bad.iter().enumerate() {
        std::fs::write(&path, yaml).unwrap();
        let r = gw.call(ADMIN, "gateway.restart", json!({})).await;
        assert_eq!(r["result"]["restarting"], true, "{what}: {r}");
        refusals(&gw, i as u64 + 1).await;
        // The running generation still answers, its WebSocket included.
        assert_eq!(status(&gw).await["generation"], 1, "{what}");
        assert_eq!(
            execute(&gw, "bot").await["result"]["response"],
            "Fast.",
            "{what}"
        );
        let id = i as i64 + 100;
        send(
            &mut ws,
            &json!({"jsonrpc": "2.0", "id": id, "method": "system.ping"}).to_string(),
        )
        .await;
        assert_eq!(recv(&mut ws).await["id"], id, "{what}");
    }
    // A good file is taken: the next generation serves it, the old one closes with 1001.
    std::fs::write(
        &path,
        format!("{}  bot2: {{model: script/m1}}\n", good(gw.dir.path())),
    )
    .unwrap();
    gw.call(ADMIN, "gateway.restart", json!({})).await;
    generation(&gw, 2).await;
    assert_eq!(closed(&mut ws).await.0, 1001);
    assert_eq!(execute(&gw, "bot2").await["result"]["response"], "Fast.");
    assert_eq!(
        gw.running.control.restarts_refused.load(Ordering::Relaxed),
        bad.len() as u64
    );
    gw.stop().await;
}

fn check_config(path: &Path) -> (bool, String) {
    let out = std::process::Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(path)
        .env("AGENT_GATEWAY_NO_FETCH", "1")
        .env_remove("AGENT_GATEWAY_CONFIG")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_refuses_the_files_restart_refuses_and_touches_no_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    let data = dir.path().join("data");
    let files = bad_files(dir.path());
    let expected = [
        "unclosed",
        "gateway.bogus",
        "gateway.tokens[1].secret",
        "providers.script.type",
        "providers.broken",
        "agents.bot",
        "defaultAgent",
        "gateway.trustedProxies: 'proxy.local' is not an IP address or CIDR block",
        "gateway.limits.maxConcurrentTurnsPerClient must be greater than 0",
        "webhooks.path",
    ];
    assert_eq!(files.len(), expected.len());
    let checks = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        for (what, yaml) in &files {
            std::fs::write(&path, yaml).unwrap();
            out.push((*what, check_config(&path)));
        }
        std::fs::write(&path, good(path.parent().unwrap())).unwrap();
        out.push(("good", check_config(&path)));
        out
    })
    .await
    .unwrap();
    for ((what, (ok, stderr)), needle) in checks.iter().zip(expected) {
        assert!(!ok, "{what}: check-config accepted it");
        assert!(stderr.contains(needle), "{what}: {stderr}");
    }
    let (what, (ok, stderr)) = checks.last().unwrap();
    assert!(ok, "{what}: {stderr}");
    assert!(!data.exists(), "check-config created the data directory");
}

async fn spawn(gw: &Gateway, task: &str) -> Value {
    let spawned = gw
        .call(
            RPC,
            "session.spawn",
            json!({"task": task, "agent": "bot", "async": true}),
        )
        .await;
    assert_eq!(spawned["result"]["status"], "running", "{spawned}");
    spawned["result"]["runId"].clone()
}

async fn run_status(gw: &Gateway, run_id: &Value) -> Value {
    gw.call(RPC, "session.run_status", json!({"run_id": run_id}))
        .await["result"]["status"]
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_before_a_restart_is_not_orphaned_by_it() {
    let gw = start(&format!("  shutdownGraceMs: 300\n{SCRIPT}")).await;
    let slow = spawn(&gw, "slow job").await;
    let medium = spawn(&gw, "medium job").await;
    gw.call(ADMIN, "gateway.restart", json!({})).await;
    generation(&gw, 2).await;
    assert_eq!(run_status(&gw, &slow).await, "running");
    // The previous generation's run finishes and is recorded.
    tokio::time::timeout(STEP, async {
        loop {
            let s = run_status(&gw, &medium).await;
            assert_ne!(s, "orphaned");
            if s == "completed" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the run never completed");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_sees_providers_created_through_the_api_as_startup_would() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, good(dir.path())).unwrap();
    let running = agent_gateway::server::start(Some(path.clone()))
        .await
        .unwrap();
    let gw = Gateway {
        addr: running.addr,
        running,
        dir,
    };
    let created = gw
        .call(
            ADMIN,
            "providers.create",
            json!({"providerId": "viaapi", "config": {"type": "scripted", "models": ["m9"]}}),
        )
        .await;
    assert!(created.get("result").is_some(), "{created}");
    // An agent on the API's provider: the file alone cannot say it exists (check-config
    // refuses it), but the running database has it, so the restart goes through.
    std::fs::write(
        &path,
        format!("{}  api: {{model: viaapi/m9}}\n", good(gw.dir.path())),
    )
    .unwrap();
    let p = path.clone();
    let (ok, stderr) = tokio::task::spawn_blocking(move || check_config(&p))
        .await
        .unwrap();
    assert!(!ok && stderr.contains("agents.api"), "{stderr}");
    gw.call(ADMIN, "gateway.restart", json!({})).await;
    generation(&gw, 2).await;
    assert_eq!(
        gw.running.control.restarts_refused.load(Ordering::Relaxed),
        0
    );
    let r = execute(&gw, "api").await;
    assert!(r.get("result").is_some(), "{r}");
    gw.stop().await;
}

/// A connection the previous generation accepted just before a restart, whose request arrives
/// after that generation was told to stop: the request is answered (by the generation that
/// accepted the connection), then the connection closes; it is not closed unanswered. (The
/// next generation serves once the previous one's connections are done.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_accepted_before_a_restart_gets_its_request_answered() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gw = start(
        "  shutdownGraceMs: 5000
",
    )
    .await;
    let mut early = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    // A WebSocket of the same generation tells when it stops: 1001.
    let mut ws = gw.ws(RPC).await;
    gw.call(ADMIN, "gateway.restart", json!({})).await;
    assert_eq!(
        closed(&mut ws).await,
        (1001, "Server shutting down".to_owned())
    );
    early
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(STEP, early.read_to_end(&mut out))
        .await
        .expect("the connection was neither answered nor closed")
        .unwrap();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text:?}");
    generation(&gw, 2).await;
    gw.stop().await;
}
