//! Hardening of what the gateway leaves behind: no secret in the log even at trace level,
//! untrusted text logged escaped, a private data directory and database files (0700/0600
//! under umask 022, looser ones tightened at start), a data directory whose name has URL
//! syntax in it, configuration durations capped (the maximum serves, one more is refused at
//! load naming the key), and database URLs shown without any password.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::*;

const BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");
/// A data directory name a URL would read as query, fragment and escape.
const ODD_DIR: &str = "a?b#c%d";
/// The secret store's master key (base64 of 32 bytes).
const MASTER_KEY: &str = "aDVoNWg1aDVoNWg1aDVoNWg1aDVoNWg1aDVoNWg1aDU=";

/// A gateway process started through `sh` with umask 022, its log (stdout and stderr) in
/// files of `dir`, its data in `data`.
struct Process {
    child: GatewayChild,
    port: u16,
    dir: PathBuf,
}

impl Process {
    async fn start(dir: &Path, data: &Path, extra: &str, run: &str) -> Self {
        let port = free_port();
        let config = dir.join("gateway.yaml");
        let text = config_yaml(dir, extra)
            .replace("port: 0", &format!("port: {port}"))
            .replace(
                &format!("dataDir: {}", dir.join("data").display()),
                &format!("dataDir: '{}'", data.display()),
            );
        std::fs::write(&config, text).unwrap();
        let child = Command::new("sh")
            .arg("-c")
            .arg("umask 022; exec \"$0\" serve --config \"$1\"")
            .arg(BIN)
            .arg(&config)
            .env_remove("AGENT_GATEWAY_CONFIG")
            .env_remove("AGENT_GATEWAY_DATA_DIR")
            .env_remove("AGENT_GATEWAY_DATABASE_URL")
            .env("AGENT_GATEWAY_LOG", "info")
            .env("AGENT_GATEWAY_NO_FETCH", "1")
            .env("AGENT_GATEWAY_MASTER_KEY", MASTER_KEY)
            .stdout(std::fs::File::create(dir.join(format!("{run}.out.log"))).unwrap())
            .stderr(std::fs::File::create(dir.join(format!("{run}.err.log"))).unwrap())
            .spawn()
            .unwrap();
        let p = Self {
            child: GatewayChild::from(child),
            port,
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + STEP;
        loop {
            let url = format!("http://127.0.0.1:{port}/health");
            if let Ok(r) = reqwest::get(url).await {
                if r.status() == 200 {
                    return p;
                }
            }
            assert!(Instant::now() < deadline, "gateway did not become healthy");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn ws(&self) -> Ws {
        let url = format!("ws://127.0.0.1:{}/ws?token={ADMIN}", self.port);
        let (ws, _) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
            .await
            .unwrap()
            .unwrap();
        ws
    }

    /// SIGINT, then the exit within a step.
    fn stop(mut self) {
        let sent = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let deadline = Instant::now() + STEP;
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "gateway did not exit in time");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self, run: &str) -> String {
        log(&self.dir, run)
    }
}

/// What run `run` logged (stdout and stderr).
fn log(dir: &Path, run: &str) -> String {
    ["out", "err"]
        .iter()
        .map(|s| std::fs::read_to_string(dir.join(format!("{run}.{s}.log"))).unwrap_or_default())
        .collect()
}

/// One call over the WebSocket: the whole answer.
async fn call(ws: &mut Ws, id: u64, method: &str, params: Value) -> Value {
    let req = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    send(ws, &req.to_string()).await;
    let r = recv(ws).await;
    assert_eq!(r["id"], id, "{r}");
    r
}

async fn result(ws: &mut Ws, id: u64, method: &str, params: Value) -> Value {
    let r = call(ws, id, method, params.clone()).await;
    r.get("result")
        .cloned()
        .unwrap_or_else(|| panic!("{method} {params}: {r}"))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn set_mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_trace_level_no_secret_reaches_the_log_and_untrusted_text_is_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join(ODD_DIR);
    let gw = Process::start(tmp.path(), &data, "", "run").await;
    let mut ws = gw.ws().await;
    let set = result(&mut ws, 1, "daemon.setLogLevel", json!({"level": "trace"})).await;
    assert_eq!(set["level"], "trace");
    // Naming a quiet library is clamped to warn (the fixed cap would hold it there anyway).
    let set = result(
        &mut ws,
        2,
        "daemon.setLogLevel",
        json!({"level": "trace", "module": "tungstenite"}),
    )
    .await;
    assert_eq!(set["updated"], true);
    const VALUE: &str = "h5-stored-secret-value-0123456789abcdef";
    result(
        &mut ws,
        3,
        "secrets.set",
        json!({"name": "H5_SECRET", "value": VALUE}),
    )
    .await;
    let created = result(&mut ws, 4, "tokens.create", json!({"scopes": ["rpc"]})).await;
    let token = created["secret"].as_str().unwrap().to_owned();
    assert!(token.len() >= 32, "{created}");
    let got = result(&mut ws, 5, "secrets.get", json!({"name": "H5_SECRET"})).await;
    assert_eq!(got["value"], VALUE);
    // A method name with CR/LF: the rpc span logs it (the failed call is a debug line).
    let r = call(&mut ws, 6, "no.such\r\nFORGED-LINE injected", json!({})).await;
    assert_eq!(code(&r), -32601, "{r}");
    drop(ws);

    // Files made at creation under umask 022.
    assert_eq!(mode(&data), 0o700);
    for f in ["gateway.db", "gateway.db-wal", "gateway.db-shm"] {
        let p = data.join(f);
        if f.ends_with("-shm") || f.ends_with("-wal") {
            // SQLite may have checkpointed them away; when present they are private too.
            if !p.exists() {
                continue;
            }
        }
        assert_eq!(mode(&p), 0o600, "{f}");
    }
    // Nothing was written beside the odd directory (its name was not read as a URL).
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| n == ODD_DIR || n.ends_with(".log") || n.ends_with(".yaml")),
        "{names:?}"
    );

    gw.stop();
    let log = log(tmp.path(), "run");
    assert!(log.contains("log level changed"), "{log}");
    // Trace was really in force: debug and trace lines are there.
    assert!(log.contains("DEBUG") || log.contains("TRACE"), "{log}");
    for secret in [VALUE, token.as_str(), ADMIN, MASTER_KEY] {
        assert!(!log.contains(secret), "a secret reached the log");
    }
    assert!(
        log.contains("no.such\\r\\nFORGED-LINE injected"),
        "the method is logged escaped: {log}"
    );
    assert!(
        !log.lines().any(|l| l.starts_with("FORGED-LINE")),
        "a forged line: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loose_modes_are_tightened_at_start_and_the_odd_data_dir_keeps_its_data() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join(ODD_DIR);
    // An existing, looser data directory from an earlier build.
    std::fs::create_dir(&data).unwrap();
    set_mode(&data, 0o755);
    let gw = Process::start(tmp.path(), &data, "", "first").await;
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&data.join("gateway.db")), 0o600);
    let mut ws = gw.ws().await;
    result(
        &mut ws,
        1,
        "tokens.create",
        json!({"id": "h5-kept", "scopes": ["rpc"]}),
    )
    .await;
    drop(ws);
    assert!(gw.log("first").contains("tightened"), "{}", gw.log("first"));
    gw.stop();

    set_mode(&data, 0o755);
    set_mode(&data.join("gateway.db"), 0o644);
    let gw = Process::start(tmp.path(), &data, "", "second").await;
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&data.join("gateway.db")), 0o600);
    let log = gw.log("second");
    assert!(
        log.contains("tightened the permissions of a private file"),
        "{log}"
    );
    let mut ws = gw.ws().await;
    let list = result(&mut ws, 1, "tokens.list", json!({})).await;
    assert!(list.to_string().contains("h5-kept"), "{list}");
    drop(ws);
    gw.stop();
}

/// The configuration `extra` (under `gateway:`, or top-level sections) loaded and validated.
fn load(extra: &str) -> Result<(), String> {
    let text = format!("gateway:\n  port: 0\n{extra}");
    let config = agent_gateway::config::parse(&text).map_err(|e| e.0)?;
    agent_gateway::config::validate(&config).map_err(|e| e.0)
}

const MAXIMA: [(&str, &str, u64); 3] = [
    (
        "gateway.web.sseKeepAliveMs",
        "  web:\n    sseKeepAliveMs: {v}\n",
        86_400_000,
    ),
    (
        "gateway.wsHeartbeatMs",
        "  wsHeartbeatMs: {v}\n",
        86_400_000,
    ),
    (
        "store.connectTimeoutMs",
        "store:\n  connectTimeoutMs: {v}\n",
        600_000,
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maximal_durations_serve_and_one_more_is_refused_naming_the_key() {
    for (key, yaml, max) in MAXIMA {
        assert_eq!(
            load(&yaml.replace("{v}", &max.to_string())),
            Ok(()),
            "{key}"
        );
        for v in [max + 1, u64::MAX] {
            let e = load(&yaml.replace("{v}", &v.to_string())).unwrap_err();
            assert!(e.contains(key), "{key}={v}: {e}");
        }
    }
    // The server refuses too, with the key, and does not panic.
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("gateway.yaml");
    std::fs::write(
        &path,
        config_yaml(tmp.path(), "  wsHeartbeatMs: 86400001\n"),
    )
    .unwrap();
    let e = agent_gateway::server::start(Some(path))
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("gateway.wsHeartbeatMs"), "{e}");

    // Every maximum at once: the gateway starts and serves a WebSocket call and the event
    // stream (whose first keep-alive is a deadline a day away).
    let extra: String = MAXIMA
        .iter()
        .map(|(_, yaml, max)| yaml.replace("{v}", &max.to_string()))
        .collect::<Vec<_>>()
        .join("");
    // `store:` last: its indented keys must not fall under another section.
    let gw = start(&extra).await;
    let mut ws = gw.ws(ADMIN).await;
    assert_ping(&mut ws, 1).await;
    let events = tokio::time::timeout(
        STEP,
        reqwest::Client::new()
            .get(gw.url("/api/events"))
            .bearer_auth(ADMIN)
            .send(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(events.status(), 200);
    drop(events);
    // config.schema states the caps.
    let schema = ok(&gw, ADMIN, "config.schema", json!({})).await;
    for (name, max) in [
        ("sseKeepAliveMs", 86_400_000),
        ("wsHeartbeatMs", 86_400_000),
        ("connectTimeoutMs", 600_000),
    ] {
        let found =
            find_member(&schema, name).unwrap_or_else(|| panic!("{name} not in the schema"));
        assert_eq!(found["maximum"], max, "{name}: {found}");
    }
    drop(ws);
    gw.stop().await;
}

/// The schema of the first property named `name` anywhere in `v`.
fn find_member<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) => {
            if let Some(Value::Object(props)) = m.get("properties") {
                if let Some(p) = props.get(name) {
                    return Some(p);
                }
            }
            m.values().find_map(|c| find_member(c, name))
        }
        Value::Array(items) => items.iter().find_map(|c| find_member(c, name)),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_read_shows_the_store_url_without_any_password() {
    let base = crate::pg::database().await;
    let mut url = url::Url::parse(&base).unwrap();
    url.set_password(Some("pw-h5-userinfo")).unwrap();
    // The test cluster trusts local connections: any password connects.
    let url = format!("{url}?password=x-h5-query&sslpassword=y-h5-ssl&application_name=z-h5-app");
    let gw = start_on(&url, "").await;
    let read = ok(&gw, ADMIN, "config.read", json!({})).await;
    let text = read.to_string();
    for secret in ["pw-h5-userinfo", "x-h5-query", "y-h5-ssl"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    assert!(text.contains("application_name=z-h5-app"), "{text}");
    gw.stop().await;
}
