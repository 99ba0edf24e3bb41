//! Moving a populated gateway's store between backends with the real binary: a SQLite
//! gateway is populated through the API, `agent-gateway export` / `import` move its store to a
//! fresh PostgreSQL database and back to a fresh SQLite file, and a gateway started on each
//! copy answers the listing, history, registry, usage and search methods exactly as the
//! original did. Also `agent-gateway migrate [--check]`.

use std::path::Path;

use serde_json::{json, Value};

use crate::common::*;

const CONFIG: &str = r#"  rateLimit: {windowMs: 60000, maxRequests: 100000}
providers:
  script:
    type: scripted
    models: [m1, m2]
    script:
      - match: "use the clock"
        steps:
          - toolCalls: [{name: current_time}]
            usage: {input: 20, output: 4}
          - reply: "It is now."
            usage: {input: 30, output: 6}
      - match: "remember"
        steps:
          - toolCalls: [{name: memory_store, arguments: {content: "The user's cat is named Mochi", tags: [pets]}}]
          - reply: "Noted."
      - match: "note this"
        steps:
          - toolCalls: [{name: session_note_add, arguments: {note: "prefers metric units"}}]
          - toolCalls: [{name: session_notes}]
          - reply: "ok"
      - match: "recall"
        steps:
          - toolCalls: [{name: memory_search, arguments: {query: "cat named"}}]
          - reply: "Your cat is Mochi."
      - match: "cached"
        steps:
          - reply: "from cache"
            usage: {input: 100, output: 5, cached: 80}
models:
  - id: script/m1
    contextWindow: 4096
    inputPricePerMTok: 1.3
    outputPricePerMTok: 2.7
agents:
  default: {model: script/m1, maxSteps: 4}
"#;

/// The binary on `args`: (exit code, stdout, stderr). Nothing of this process's environment
/// chooses its database.
async fn cli(args: &[&str]) -> (i32, String, String) {
    let home = tempfile::tempdir().unwrap();
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_agent-gateway"))
        .args(args)
        .env_remove("AGENT_GATEWAY_DATABASE_URL")
        .env_remove("AGENT_GATEWAY_CONFIG")
        .env("AGENT_GATEWAY_DATA_DIR", home.path())
        .env("AGENT_GATEWAY_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(STEP * 3, run)
        .await
        .expect("the command did not finish in time")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn cli_ok(args: &[&str]) -> String {
    let (code, out, err) = cli(args).await;
    assert_eq!(code, 0, "{args:?}\nstdout: {out}\nstderr: {err}");
    out
}

async fn ok(gw: &Gateway, token: &str, method: &str, params: Value) -> Value {
    let v = gw.call(token, method, params.clone()).await;
    assert!(v.get("error").is_none(), "{method} {params}: {v}");
    v["result"].clone()
}

async fn execute(gw: &Gateway, token: &str, message: &str, user: &str) -> Value {
    ok(
        gw,
        token,
        "agent.execute",
        json!({"message": message, "sessionKey": {"userId": user}}),
    )
    .await
}

/// What the gateway answers about its stored state, by method and caller.
async fn answers(gw: &Gateway) -> Vec<(String, Value)> {
    let mut all = Vec::new();
    for (who, token) in [("admin", ADMIN), ("client", RPC)] {
        let list = ok(gw, token, "session.list", json!({})).await;
        all.push((format!("session.list {who}"), list));
    }
    let list = ok(gw, ADMIN, "session.list", json!({})).await;
    for s in list["sessions"].as_array().unwrap() {
        let key = s["sessionKey"].as_str().unwrap();
        let h = ok(gw, ADMIN, "session.history", json!({"session_key": key})).await;
        all.push((format!("session.history {key}"), h));
    }
    for (method, params) in [
        ("agents.list", json!({})),
        ("providers.list", json!({})),
        ("agent.cacheStats", json!({})),
        ("session.search", json!({"query": "Zürich"})),
        ("session.search", json!({"query": "clock"})),
        ("agent.cacheStats", json!({"agentId": "helper"})),
    ] {
        let mut v = ok(gw, ADMIN, method, params.clone()).await;
        // The rank is each backend's own figure (bm25 on SQLite, ts_rank on PostgreSQL):
        // the hits and their order are compared, not the score.
        if method == "session.search" {
            for hit in v.as_array_mut().unwrap() {
                assert!(hit["score"].is_number(), "{hit}");
                hit.as_object_mut().unwrap().remove("score");
            }
        }
        all.push((format!("{method} {params}"), v));
    }
    all
}

fn rows(dump: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dump).unwrap();
    // Without the header (its source and time differ); the trailer's counts and digests too.
    // Every gateway start records the configuration file it read (`config_files_seen`), so
    // those rows are left out: a gateway runs on the database between the two exports.
    const FILES: &str = "config_files_seen";
    text.lines()
        .skip(1)
        .filter(|l| !l.starts_with(&format!(r#"{{"t":"{FILES}""#)))
        .map(|l| {
            if !l.starts_with(r#"{"end":true"#) {
                return l.to_owned();
            }
            let mut trailer: Value = serde_json::from_str(l).unwrap();
            for part in ["counts", "digest"] {
                trailer[part].as_object_mut().unwrap().remove(FILES);
            }
            trailer.to_string()
        })
        .collect()
}

fn assert_same(what: &str, got: &[(String, Value)], want: &[(String, Value)]) {
    assert_eq!(got.len(), want.len(), "{what}: number of answers");
    for ((name, g), (_, w)) in got.iter().zip(want) {
        assert_eq!(g, w, "{what}: {name} differs");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_populated_store_moves_to_postgres_and_back_with_identical_answers() {
    let work = tempfile::tempdir().unwrap();
    let source_db = work.path().join("source.db");
    let sqlite_url = |p: &Path| format!("sqlite://{}", p.display());

    // 1. A SQLite gateway, populated through the API by two callers.
    let store = format!("\nstore:\n  url: {}\n", sqlite_url(&source_db));
    let gw = start(&format!("{CONFIG}{store}")).await;
    assert_eq!(
        execute(&gw, RPC, "use the clock", "a").await["response"],
        "It is now."
    );
    assert_eq!(
        execute(&gw, RPC, "remember this", "a").await["response"],
        "Noted."
    );
    execute(&gw, RPC, "note this", "a").await;
    execute(&gw, ADMIN, "cached", "b").await;
    execute(&gw, ADMIN, "hello Zürich", "b").await;
    ok(
        &gw,
        ADMIN,
        "agents.create",
        json!({"agentId": "helper", "config": {"model": "script/m2", "systemPrompt": "Help."}}),
    )
    .await;
    ok(
        &gw,
        ADMIN,
        "providers.create",
        json!({"providerId": "demo", "config": {"type": "scripted", "models": ["d1"],
            "script": [{"steps": [{"reply": "demo says hi"}]}]}}),
    )
    .await;
    ok(
        &gw,
        RPC,
        "agent.execute",
        json!({"message": "hi helper", "agentId": "helper", "sessionKey": {"userId": "h"}}),
    )
    .await;
    let want = answers(&gw).await;
    // The recorded answers are not empty: the comparison below can fail.
    let sessions = &want[0].1;
    assert_eq!(sessions["total"], 3, "{sessions}");
    assert_eq!(want[1].1["total"], 2, "the client's own sessions");
    let history_a = &want
        .iter()
        .find(|(n, _)| n == "session.history agent:default:api:client:a")
        .unwrap()
        .1;
    // Clock 4 (user, call, tool, answer), remember 4, note 6 (two calls).
    assert_eq!(
        history_a["messages"].as_array().unwrap().len(),
        14,
        "{history_a}"
    );
    let cache = &want
        .iter()
        .find(|(n, _)| n == "agent.cacheStats {}")
        .unwrap()
        .1;
    assert_eq!(cache["cachedTokens"], 80, "{cache}");
    let found = &want
        .iter()
        .find(|(n, _)| n.starts_with("session.search") && n.contains("Zürich"))
        .unwrap()
        .1;
    assert_eq!(found.as_array().unwrap().len(), 2, "{found}");
    gw.stop().await;

    // 2. Export the file, import it into a fresh PostgreSQL database.
    let dump = work.path().join("dump.ndjson");
    cli_ok(&[
        "export",
        "--database-url",
        &sqlite_url(&source_db),
        "--out",
        dump.to_str().unwrap(),
    ])
    .await;
    let pg = crate::pg::database().await;
    let out = cli_ok(&[
        "import",
        "--database-url",
        &pg,
        "--in",
        dump.to_str().unwrap(),
    ])
    .await;
    assert!(out.starts_with("imported "), "{out}");
    assert!(out.contains("sessions 3"), "{out}");
    assert!(out.contains("verified"), "{out}");
    // A second import into the same database is refused, naming the reason.
    let (code, _, err) = cli(&[
        "import",
        "--database-url",
        &pg,
        "--in",
        dump.to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, 1);
    assert!(err.contains("not empty"), "{err}");
    let out = cli_ok(&[
        "import",
        "--database-url",
        &pg,
        "--in",
        dump.to_str().unwrap(),
        "--verify-only",
    ])
    .await;
    assert!(out.starts_with("verified "), "{out}");

    // 3. A gateway on PostgreSQL answers the same.
    let gw = start_on(&pg, CONFIG).await;
    assert_same("on PostgreSQL", &answers(&gw).await, &want);
    gw.stop().await;

    // 4. Back to a fresh SQLite file, through standard output and input.
    let back = work.path().join("back.ndjson");
    let exported = cli_ok(&["export", "--database-url", &pg]).await;
    std::fs::write(&back, &exported).unwrap();
    assert_eq!(rows(&back), rows(&dump), "the rows survive the round trip");
    let target_db = work.path().join("nested/target.db");
    let import = tokio::process::Command::new(env!("CARGO_BIN_EXE_agent-gateway"))
        .args([
            "import",
            "--database-url",
            &sqlite_url(&target_db),
            "--in",
            "-",
        ])
        .env_remove("AGENT_GATEWAY_DATABASE_URL")
        .env("AGENT_GATEWAY_LOG", "warn")
        .stdin(std::fs::File::open(&back).unwrap())
        .kill_on_drop(true)
        .output();
    let import = tokio::time::timeout(STEP * 3, import)
        .await
        .unwrap()
        .unwrap();
    assert!(
        import.status.success(),
        "{}",
        String::from_utf8_lossy(&import.stderr)
    );
    let store = format!("\nstore:\n  url: {}\n", sqlite_url(&target_db));
    let gw = start(&format!("{CONFIG}{store}")).await;
    assert_same("back on SQLite", &answers(&gw).await, &want);
    // The imported store keeps working: a new turn lands after the imported ones.
    execute(&gw, RPC, "use the clock", "a").await;
    let h = ok(
        &gw,
        ADMIN,
        "session.history",
        json!({"session_key": "agent:default:api:client:a"}),
    )
    .await;
    assert_eq!(h["messages"].as_array().unwrap().len(), 18);
    // The memory stored on the first gateway is found by search on the third.
    execute(&gw, RPC, "recall it", "r").await;
    let h = ok(
        &gw,
        ADMIN,
        "session.history",
        json!({"session_key": "agent:default:api:client:r"}),
    )
    .await;
    let tool = &h["messages"][2];
    assert_eq!(tool["toolName"], "memory_search", "{h}");
    assert!(
        tool["content"].as_str().unwrap().contains("Mochi"),
        "{tool}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn migrate_applies_pending_migrations_and_check_reports_them() {
    let work = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", work.path().join("db/fresh.db").display());
    let (code, out, err) = cli(&["migrate", "--database-url", &url, "--check"]).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("12 migrations pending: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12"),
        "{err}"
    );
    assert!(
        !work.path().join("db/fresh.db").exists(),
        "--check applies nothing"
    );

    let out = cli_ok(&["migrate", "--database-url", &url]).await;
    assert_eq!(out.trim(), "migrated sqlite to version 12");
    let out = cli_ok(&["migrate", "--database-url", &url, "--check"]).await;
    assert_eq!(out.trim(), "sqlite at version 12 (up to date)");

    // The same on PostgreSQL, and the database chosen by the configuration file.
    let pg = crate::pg::database().await;
    let config = work.path().join("gateway.yaml");
    std::fs::write(&config, format!("store:\n  url: {pg}\n")).unwrap();
    let config = config.to_str().unwrap();
    let (code, _, err) = cli(&["migrate", "--config", config, "--check"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("(postgres): 12 migrations pending"), "{err}");
    let out = cli_ok(&["migrate", "--config", config]).await;
    assert_eq!(out.trim(), "migrated postgres to version 12");
    let out = cli_ok(&["migrate", "--config", config, "--check"]).await;
    assert_eq!(out.trim(), "postgres at version 12 (up to date)");

    // An unreachable server is an error that names the URL without its password.
    let quick = work.path().join("quick.yaml");
    std::fs::write(&quick, "store:\n  connectTimeoutMs: 300\n").unwrap();
    let (code, _, err) = cli(&[
        "export",
        "--config",
        quick.to_str().unwrap(),
        "--database-url",
        "postgres://gw:hunter2-secret@127.0.0.1:1/x",
    ])
    .await;
    assert_eq!(code, 1);
    assert!(err.contains("postgres://gw@127.0.0.1:1/x"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}
