//! The control plane from outside (issue 16): configuration writes with history, diffs,
//! rollback and audit; the encrypted secret store and its resolver; API tokens created,
//! rotated and revoked on a live gateway; the env.* rate limits; and the one-source rule for
//! agents written through agents.* and config.* in both orders.

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::common::*;
use crate::http::providers_http::{openai_text_completion, Fixture, Reply};

/// A master key file (0600) in `dir`; the configuration lines naming it.
fn master_key(dir: &std::path::Path, byte: u8) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("master.key");
    std::fs::write(
        &path,
        base64::engine::general_purpose::STANDARD.encode([byte; 32]),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    format!("secrets:\n  masterKeyFile: {}\n", path.display())
}

fn ok(v: &Value) -> &Value {
    assert!(v.get("error").is_none(), "{v}");
    &v["result"]
}

async fn generation(gw: &Gateway, n: i64) {
    wait_generation(gw, n).await;
}

fn file(gw: &Gateway) -> String {
    std::fs::read_to_string(gw.dir.path().join("gateway.yaml")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_writes_are_validated_recorded_diffable_and_reversible() {
    let gw = start("").await;
    let before = file(&gw);

    // Refusals write nothing.
    let r = gw
        .call(
            ADMIN,
            "config.set",
            json!({"section": "agentDefaults", "key": "maxSteps", "value": "many"}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("agentDefaults.maxSteps"),
        "{r}"
    );
    let r = gw
        .call(
            ADMIN,
            "config.set",
            json!({"section": "nosuch", "key": "x", "value": 1}),
        )
        .await;
    assert_eq!(code(&r), -32001, "{r}");
    let r = gw
        .call(
            ADMIN,
            "config.set",
            json!({"section": "gateway", "key": "a..b", "value": 1}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    let r = gw
        .call(
            ADMIN,
            "config.set",
            json!({"section": "webhooks", "key": "token", "value": "[REDACTED]"}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    let r = gw
        .call(ADMIN, "config.patch", json!({"gateway": {"nosuchKey": 1}}))
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nosuchKey"),
        "{r}"
    );
    // An agent on a model no provider serves: refused by the start checks.
    let r = gw
        .call(
            ADMIN,
            "config.patch",
            json!({"agents": {"x": {"model": "nowhere/none"}}}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    let r = gw
        .call(
            RPC,
            "config.set",
            json!({"section": "agentDefaults", "key": "maxSteps", "value": 5}),
        )
        .await;
    assert_eq!(code(&r), -32603, "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("admin"),
        "{r}"
    );
    let r = gw
        .call(ADMIN, "config.rollback", json!({"sha": "abcdef0"}))
        .await;
    assert_eq!(code(&r), -32001, "{r}");
    let r = gw
        .call(ADMIN, "config.diff", json!({"sha": "abcdef0"}))
        .await;
    assert_eq!(code(&r), -32001, "{r}");
    assert_eq!(file(&gw), before, "a refused change wrote the file");

    // The history starts with the file as first seen.
    let h = gw.call(ADMIN, "config.history", json!({})).await;
    let entries = ok(&h)["entries"].as_array().unwrap().clone();
    assert_eq!(entries.len(), 1, "{h}");
    let root = entries[0]["sha"].as_str().unwrap().to_owned();
    assert!(
        !h.to_string().contains(ADMIN),
        "a token secret in the history: {h}"
    );

    // A change that needs a restart: answered, then the next generation runs it.
    let r = gw
        .call(
            ADMIN,
            "config.set",
            json!({"section": "agentDefaults", "key": "maxSteps", "value": 5}),
        )
        .await;
    let res = ok(&r);
    assert_eq!(res["ok"], true);
    assert_eq!(res["restarting"], true);
    let sha = res["commitSha"].as_str().unwrap().to_owned();
    validate_result("config.set", res);
    generation(&gw, 2).await;
    let read = gw
        .call(ADMIN, "config.read", json!({"section": "agentDefaults"}))
        .await;
    assert_eq!(ok(&read)["maxSteps"], 5);
    // The fleet's document changed in the store; the file is the bootstrap and stays as the
    // operator wrote it (issue 27), secrets included (the history has none).
    assert_eq!(file(&gw), before, "the API wrote the configuration file");
    assert!(file(&gw).contains(ADMIN));

    let h = gw.call(ADMIN, "config.history", json!({"limit": 1})).await;
    let e = &ok(&h)["entries"][0];
    validate_result("config.history", ok(&h));
    assert_eq!(e["sha"], sha.as_str());
    assert_eq!(e["user"], "admin");
    assert_eq!(e["section"], "agentDefaults");
    assert_eq!(e["key"], "maxSteps");
    assert!(e["message"]
        .as_str()
        .unwrap()
        .contains("agentDefaults.maxSteps"));
    let d = gw.call(ADMIN, "config.diff", json!({})).await;
    let diff = ok(&d)["diff"].as_str().unwrap().to_owned();
    assert!(diff.contains("+  maxSteps: 5"), "{diff}");
    assert!(!diff.contains(ADMIN) && !diff.contains(RPC), "{diff}");
    let d = gw
        .call(ADMIN, "config.diff", json!({"sha": &root[..10]}))
        .await;
    assert!(
        ok(&d)["diff"].as_str().unwrap().contains("+  maxSteps: 5"),
        "{d}"
    );

    // Rollback to the root: a new commit, the old value back after the restart.
    let r = gw
        .call(ADMIN, "config.rollback", json!({"sha": &root[..12]}))
        .await;
    let res = ok(&r).clone();
    validate_result("config.rollback", &res);
    assert_eq!(res["sha"], root.as_str());
    assert_eq!(res["restarting"], true);
    assert_ne!(res["newCommitSha"], root.as_str());
    generation(&gw, 3).await;
    let read = gw
        .call(ADMIN, "config.read", json!({"section": "agentDefaults"}))
        .await;
    assert_ne!(ok(&read)["maxSteps"], 5);
    assert!(!file(&gw).contains("maxSteps: 5"));

    // A live change: an agent through config.patch is served at once, no restart.
    let r = gw
        .call(
            ADMIN,
            "config.patch",
            json!({"agents": {"helper": {"model": "local/smollm2-135m-instruct", "maxSteps": 3}}}),
        )
        .await;
    let res = ok(&r);
    assert_eq!(res["restarting"], false, "{r}");
    assert_eq!(res["sections"], json!(["agents"]));
    let a = gw
        .call(ADMIN, "agents.get", json!({"agentId": "helper"}))
        .await;
    assert!(a.get("result").is_some(), "{a}");
    let s = gw.call(ADMIN, "gateway.status", json!({})).await;
    assert_eq!(s["result"]["generation"], 3, "a live change restarted");

    // config.apply of a redacted read keeps the secrets ([REDACTED] keeps the current value).
    let read = gw.call(ADMIN, "config.read", json!({})).await;
    let mut whole = ok(&read)["config"].clone();
    assert_eq!(whole["gateway"]["tokens"][0]["secret"], "[REDACTED]");
    whole["agentDefaults"]["maxSteps"] = json!(7);
    let r = gw.call(ADMIN, "config.apply", whole).await;
    assert_eq!(ok(&r)["applied"], true, "{r}");
    generation(&gw, 4).await;
    assert!(file(&gw).contains(ADMIN), "apply lost a token secret");
    assert!(!file(&gw).contains("[REDACTED]"));
    let ping = gw.call(RPC, "system.ping", json!({})).await;
    assert_eq!(ok(&ping)["pong"], true);

    // Audit: paths, never values; a change of tokens is suspicious.
    let a = gw.call(ADMIN, "config.audit.list", json!({})).await;
    let records = ok(&a)["records"].as_array().unwrap().clone();
    validate_result("config.audit.list", ok(&a));
    let set = records
        .iter()
        .find(|r| r["method"] == "config.set")
        .unwrap();
    assert_eq!(set["paths"], json!(["agentDefaults.maxSteps"]));
    assert_eq!(set["clientId"], "admin");
    assert_eq!(set["suspicious"], false);
    assert!(!a.to_string().contains(ADMIN));
    let r = gw
        .call(ADMIN, "config.patch", json!({"gateway": {"tokens": [
            {"id": "admin", "secret": "[REDACTED]", "scopes": ["*"]},
            {"id": "client", "secret": "[REDACTED]", "scopes": ["rpc"]},
            {"id": "mcp", "secret": "[REDACTED]", "scopes": ["mcp-client"]},
            {"id": "ops", "secret": "[REDACTED]", "scopes": ["admin"]},
            {"id": "extra", "secret": "extra-secret-0123456789abcdefghijklmnop", "scopes": ["rpc"]}
        ]}}))
        .await;
    assert_eq!(ok(&r)["restarting"], true, "{r}");
    generation(&gw, 5).await;
    let a = gw
        .call(ADMIN, "config.audit.list", json!({"suspiciousOnly": true}))
        .await;
    let records = ok(&a)["records"].as_array().unwrap().clone();
    let tokens = records.last().unwrap();
    assert_eq!(tokens["paths"], json!(["gateway.tokens"]), "{a}");
    assert!(tokens["reasons"][0]
        .as_str()
        .unwrap()
        .contains("gateway.tokens"));
    assert!(records.iter().all(|r| r["suspicious"] == true));
    assert!(!records.iter().any(|r| r["method"] == "config.set"));
    assert!(!a.to_string().contains("extra-secret"));
    let h = gw
        .call(ADMIN, "config.history", json!({"limit": 500}))
        .await;
    assert!(!h.to_string().contains("extra-secret"));
    let d = gw.call(ADMIN, "config.diff", json!({})).await;
    assert!(!d.to_string().contains("extra-secret"), "{d}");
    let extra = gw
        .call(
            "extra-secret-0123456789abcdefghijklmnop",
            "system.ping",
            json!({}),
        )
        .await;
    assert_eq!(ok(&extra)["pong"], true);

    // gc keeps the newest `configHistory.keep` (100 by default: nothing to fold yet).
    let g = gw.call(ADMIN, "config.gc", json!({})).await;
    assert_eq!(ok(&g)["squashed"], 0, "{g}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_gc_folds_old_commits_into_a_new_root() {
    let gw =
        start("configHistory:\n  keep: 2\nagents:\n  a: {model: local/smollm2-135m-instruct}\n")
            .await;
    for steps in 1..=4 {
        let r = gw
            .call(
                ADMIN,
                "config.set",
                json!({"section": "agents", "key": "a.maxSteps", "value": steps}),
            )
            .await;
        assert_eq!(ok(&r)["restarting"], false, "{r}");
    }
    let h = gw.call(ADMIN, "config.history", json!({})).await;
    assert_eq!(ok(&h)["entries"].as_array().unwrap().len(), 5);
    let second = ok(&h)["entries"][1]["sha"].clone();
    let g = gw.call(ADMIN, "config.gc", json!({})).await;
    validate_result("config.gc", ok(&g));
    assert_eq!(ok(&g)["squashed"], 3, "{g}");
    assert_eq!(ok(&g)["newRootSha"], second);
    let h = gw.call(ADMIN, "config.history", json!({})).await;
    assert_eq!(ok(&h)["entries"].as_array().unwrap().len(), 2);
    let d = gw.call(ADMIN, "config.diff", json!({})).await;
    assert!(
        ok(&d)["diff"].as_str().unwrap().contains("maxSteps: 4"),
        "{d}"
    );
    gw.stop().await;
}

/// The one-source rule in both orders: the last writer wins, across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_written_through_the_api_and_the_file_follow_the_last_writer() {
    let gw = start("agents:\n  x: {model: local/smollm2-135m-instruct, maxSteps: 2}\n").await;
    let steps = |v: &Value| v["result"]["maxSteps"].clone();
    // File, then API: the API's value survives a restart (the file did not change since).
    let r = gw
        .call(
            ADMIN,
            "config.set",
            json!({"section": "agents", "key": "x.maxSteps", "value": 3}),
        )
        .await;
    assert_eq!(ok(&r)["restarting"], false);
    assert_eq!(
        steps(&gw.call(ADMIN, "agents.get", json!({"agentId": "x"})).await),
        3
    );
    let r = gw
        .call(
            ADMIN,
            "agents.update",
            json!({"agentId": "x", "config": {"maxSteps": 4}}),
        )
        .await;
    ok(&r);
    gw.call(ADMIN, "gateway.restart", json!({})).await;
    generation(&gw, 2).await;
    assert_eq!(
        steps(&gw.call(ADMIN, "agents.get", json!({"agentId": "x"})).await),
        4
    );
    // API, then file: the file's change wins, live and after a restart.
    let r = gw
        .call(
            ADMIN,
            "agents.update",
            json!({"agentId": "x", "config": {"maxSteps": 6}}),
        )
        .await;
    ok(&r);
    let r = gw
        .call(
            ADMIN,
            "config.set",
            json!({"section": "agents", "key": "x.maxSteps", "value": 7}),
        )
        .await;
    ok(&r);
    assert_eq!(
        steps(&gw.call(ADMIN, "agents.get", json!({"agentId": "x"})).await),
        7
    );
    gw.call(ADMIN, "gateway.restart", json!({})).await;
    generation(&gw, 3).await;
    assert_eq!(
        steps(&gw.call(ADMIN, "agents.get", json!({"agentId": "x"})).await),
        7
    );
    gw.stop().await;
}

async fn http_status(gw: &Gateway, token: &str) -> u16 {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "system.ping"}).to_string();
    gw.post_rpc(token, &body).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_tokens_are_created_rotated_and_revoked_on_a_live_gateway() {
    let gw = start("").await;
    // Create: works at once, listed without its secret.
    let r = gw
        .call(
            ADMIN,
            "tokens.create",
            json!({"scopes": ["rpc"], "id": "app"}),
        )
        .await;
    let created = ok(&r).clone();
    validate_result("tokens.create", &created);
    let secret = created["secret"].as_str().unwrap().to_owned();
    assert!(secret.len() >= 32);
    assert_eq!(http_status(&gw, &secret).await, 200);
    let r = gw.call(&secret, "config.read", json!({})).await;
    assert_eq!(code(&r), -32603, "an rpc token reached an admin method");
    let l = gw.call(ADMIN, "tokens.list", json!({})).await;
    validate_result("tokens.list", ok(&l));
    assert!(!l.to_string().contains(&secret));
    let app = ok(&l)["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "app")
        .unwrap()
        .clone();
    assert_eq!(app["origin"], "store");
    assert!(app["lastUsedAt"].as_i64().is_some(), "{app}");
    let admin = ok(&l)["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "admin")
        .unwrap()
        .clone();
    assert_eq!(admin["origin"], "config");

    // Refusals.
    let r = gw
        .call(
            ADMIN,
            "tokens.create",
            json!({"scopes": ["rpc"], "id": "app"}),
        )
        .await;
    assert_eq!(code(&r), -32002, "{r}");
    let r = gw
        .call(
            ADMIN,
            "tokens.create",
            json!({"scopes": ["rpc"], "id": "client"}),
        )
        .await;
    assert_eq!(code(&r), -32002, "{r}");
    let r = gw
        .call(ADMIN, "tokens.create", json!({"scopes": ["root"]}))
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    let r = gw.call(ADMIN, "tokens.create", json!({"scopes": []})).await;
    assert_eq!(code(&r), -32602, "{r}");
    let r = gw
        .call(
            ADMIN,
            "tokens.create",
            json!({"scopes": ["rpc"], "expiresAt": 1000}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    let r = gw
        .call(ADMIN, "tokens.revoke", json!({"id": "nobody"}))
        .await;
    assert_eq!(code(&r), -32001, "{r}");
    let r = gw
        .call(ADMIN, "tokens.revoke", json!({"id": "client"}))
        .await;
    assert_eq!(code(&r), -32002, "{r}");
    let r = gw
        .call(ADMIN, "tokens.rotate", json!({"id": "client"}))
        .await;
    assert_eq!(code(&r), -32002, "{r}");
    let r = gw
        .call(RPC, "tokens.create", json!({"scopes": ["rpc"]}))
        .await;
    assert_eq!(code(&r), -32603, "{r}");
    // A token never mints a broader one: `ops` holds admin only.
    let r = gw
        .call(ADMIN_ONLY, "tokens.create", json!({"scopes": ["*"]}))
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    let r = gw
        .call(ADMIN_ONLY, "tokens.create", json!({"scopes": ["api"]}))
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    let r = gw
        .call(
            ADMIN_ONLY,
            "tokens.create",
            json!({"scopes": ["admin", "rpc"], "id": "ops2"}),
        )
        .await;
    let ops2 = ok(&r)["secret"].as_str().unwrap().to_owned();
    let r = gw
        .call(&ops2, "tokens.create", json!({"scopes": ["*"]}))
        .await;
    assert_eq!(code(&r), -32602, "{r}");

    // Rotate: the old secret is refused at once, its WebSocket closed with 4001; the new works.
    let mut ws = gw.ws(&secret).await;
    assert_ping(&mut ws, 1).await;
    let r = gw.call(ADMIN, "tokens.rotate", json!({"id": "app"})).await;
    let rotated = ok(&r).clone();
    validate_result("tokens.rotate", &rotated);
    assert_eq!(rotated["newId"], "app");
    let new_secret = rotated["newSecret"].as_str().unwrap().to_owned();
    let t0 = Instant::now();
    let (code4001, reason) = closed(&mut ws).await;
    assert_eq!(code4001, 4001, "{reason}");
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "closed after {:?}",
        t0.elapsed()
    );
    assert_eq!(http_status(&gw, &secret).await, 401);
    assert_eq!(http_status(&gw, &new_secret).await, 200);

    // Revoke: the WebSocket closes within a second, new calls get 401, the id stays reserved.
    let mut ws = gw.ws(&new_secret).await;
    assert_ping(&mut ws, 2).await;
    let mut other = gw.ws(RPC).await;
    let r = gw.call(ADMIN, "tokens.revoke", json!({"id": "app"})).await;
    validate_result("tokens.revoke", ok(&r));
    let t0 = Instant::now();
    assert_eq!(closed(&mut ws).await.0, 4001);
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert_eq!(http_status(&gw, &new_secret).await, 401);
    let mut again = gw.ws(&new_secret).await;
    assert_eq!(closed(&mut again).await.0, 4001);
    assert_ping(&mut other, 3).await; // another token's connection is untouched
    let r = gw
        .call(
            ADMIN,
            "tokens.create",
            json!({"scopes": ["rpc"], "id": "app"}),
        )
        .await;
    assert_eq!(code(&r), -32002, "{r}");
    let r = gw.call(ADMIN, "tokens.revoke", json!({"id": "app"})).await;
    assert_eq!(code(&r), -32001, "{r}");

    // Expiry is enforced.
    let at = agent_gateway::clock::now_ms() + 1_500;
    let r = gw
        .call(
            ADMIN,
            "tokens.create",
            json!({"scopes": ["rpc"], "expiresAt": at}),
        )
        .await;
    let short = ok(&r)["secret"].as_str().unwrap().to_owned();
    assert_eq!(http_status(&gw, &short).await, 200);
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    assert_eq!(http_status(&gw, &short).await, 401);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_secrets_are_encrypted_reach_providers_and_never_leak() {
    let upstream = Fixture::always(Reply::json(200, &openai_text_completion())).await;
    let dir = tempfile::tempdir().unwrap();
    let key = master_key(dir.path(), 7);
    let gw = start(&format!(
        "{key}providers:\n  up:\n    type: openai\n    baseUrl: {}\n    apiKeyEnv: UPSTREAM_KEY_E2E\n    models: [m]\nagents:\n  a: {{model: up/m}}\ndefaultAgent: a\n",
        upstream.base("/v1")
    ))
    .await;
    const PLAIN: &str = "sk-PLAINTEXT-never-anywhere-0123456789";
    // Events are collected while it all happens.
    let events = reqwest::Client::new()
        .get(gw.url("/api/events"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let collector = tokio::spawn(async move {
        let mut events = events;
        let mut text = String::new();
        while let Ok(Ok(Some(chunk))) =
            tokio::time::timeout(Duration::from_secs(4), events.chunk()).await
        {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        text
    });

    // Without the key the provider has none; env.set stores it and the provider uses it at once.
    let r = gw
        .call(ADMIN, "agent.execute", json!({"message": "hi"}))
        .await;
    assert_eq!(code(&r), -32003, "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("env.set"),
        "{r}"
    );
    let r = gw
        .call(
            ADMIN,
            "env.set",
            json!({"key": "UPSTREAM_KEY_E2E", "value": PLAIN}),
        )
        .await;
    let res = ok(&r).clone();
    validate_result("env.set", &res);
    assert_eq!(res["storage"], "encrypted");
    assert_eq!(res["restarting"], false);
    let r = gw
        .call(ADMIN, "agent.execute", json!({"message": "hi"}))
        .await;
    assert_eq!(ok(&r)["finishReason"], "stop", "{r}");
    let sent = upstream.requests();
    let auth = sent
        .last()
        .unwrap()
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.clone());
    assert_eq!(auth.as_deref(), Some(format!("Bearer {PLAIN}").as_str()));

    // secrets.*: get is the only way out; list and env.list carry names and times only.
    let r = gw.call(ADMIN, "secrets.set", json!({"name": "OTHER_SECRET", "value": PLAIN, "provider": "up", "description": "demo"})).await;
    assert_eq!(ok(&r)["created"], true, "{r}");
    let r = gw
        .call(ADMIN, "secrets.get", json!({"name": "OTHER_SECRET"}))
        .await;
    assert_eq!(ok(&r)["value"], PLAIN);
    let r = gw
        .call(ADMIN, "secrets.get", json!({"name": "MISSING"}))
        .await;
    assert_eq!(ok(&r)["exists"], false);
    assert!(ok(&r).get("value").is_none());
    let l = gw.call(ADMIN, "secrets.list", json!({})).await;
    validate_result("secrets.list", ok(&l));
    let names: Vec<&str> = ok(&l)["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["OTHER_SECRET", "UPSTREAM_KEY_E2E"]);
    let l = gw
        .call(ADMIN, "env.list", json!({"filter": "UPSTREAM_*"}))
        .await;
    validate_result("env.list", ok(&l));
    assert_eq!(ok(&l)["total"], 1);
    assert_eq!(ok(&l)["secrets"][0]["source"], "secretstore");
    assert!(ok(&l)["secrets"][0]["createdAt"].is_i64());
    let l = gw.call(ADMIN, "env.list", json!({"limit": 1})).await;
    assert_eq!(ok(&l)["truncated"], true);
    // Refusals.
    for (method, params) in [
        ("env.set", json!({"key": "lower", "value": "v"})),
        ("env.set", json!({"key": "A", "value": "[REDACTED]"})),
        ("env.set", json!({"key": "A", "value": "x".repeat(8193)})),
        ("env.set", json!({"key": "A".repeat(257), "value": "v"})),
        ("secrets.set", json!({"name": "B", "value": "[REDACTED]"})),
        (
            "auth.set",
            json!({"provider": "up", "profileId": "p", "access": "a", "refresh": "r", "expires": 1, "version": 2}),
        ),
    ] {
        let r = gw.call(ADMIN, method, params).await;
        assert_eq!(code(&r), -32602, "{method}: {r}");
    }
    // At the limits: the longest key and value are accepted.
    let r = gw
        .call(
            ADMIN,
            "env.set",
            json!({"key": "K".repeat(256), "value": "v".repeat(8192)}),
        )
        .await;
    ok(&r);
    let r = gw.call(ADMIN, "auth.set", json!({"provider": "nosuch", "profileId": "p", "access": "a", "refresh": "r", "expires": 1, "version": 1})).await;
    assert_eq!(code(&r), -32001, "{r}");
    let r = gw
        .call(RPC, "secrets.get", json!({"name": "OTHER_SECRET"}))
        .await;
    assert_eq!(code(&r), -32603);

    // auth.*: credentials stored encrypted, listed by metadata only.
    let r = gw.call(ADMIN, "auth.set", json!({"provider": "up", "profileId": "me", "access": PLAIN, "refresh": PLAIN, "expires": 42, "version": 1, "email": "me@example.com"})).await;
    assert_eq!(ok(&r)["stored"], true);
    let l = gw.call(ADMIN, "auth.list", json!({})).await;
    validate_result("auth.list", ok(&l));
    assert_eq!(ok(&l)["profiles"][0]["email"], "me@example.com");
    assert!(!l.to_string().contains(PLAIN));

    // Configuration changes around the secret.
    let r = gw
        .call(
            ADMIN,
            "config.set",
            json!({"section": "providers", "key": "up.timeoutMs", "value": 9000}),
        )
        .await;
    ok(&r);
    for (method, params) in [
        ("config.read", json!({})),
        ("config.get", json!({})),
        ("config.history", json!({"limit": 500})),
        ("config.diff", json!({})),
        ("config.audit.list", json!({})),
        ("env.list", json!({})),
        ("secrets.list", json!({})),
        ("tokens.list", json!({})),
    ] {
        let r = gw.call(ADMIN, method, params).await;
        assert!(
            !r.to_string().contains(PLAIN),
            "{method} shows the secret: {r}"
        );
    }
    let r = gw
        .call(ADMIN, "secrets.delete", json!({"name": "OTHER_SECRET"}))
        .await;
    assert_eq!(ok(&r)["deleted"], true);
    let r = gw
        .call(ADMIN, "secrets.delete", json!({"name": "OTHER_SECRET"}))
        .await;
    assert_eq!(ok(&r)["deleted"], false);
    let r = gw
        .call(ADMIN, "auth.logout", json!({"profileId": "me"}))
        .await;
    assert_eq!(ok(&r)["deleted"], true);

    let events = collector.await.unwrap();
    assert!(events.contains("secret:modified"), "{events}");
    assert!(events.contains("secret:accessed"), "{events}");
    assert!(!events.contains(PLAIN), "an event carries the secret");
    let data = gw.dir.path().join("data");
    gw.stop().await;
    // Nothing in the data directory holds the plaintext (the database, its WAL, every file).
    for entry in walk(&data) {
        // The database's -shm/-wal files may go away as the pool closes.
        let Ok(bytes) = std::fs::read(&entry) else {
            continue;
        };
        assert!(
            !bytes.windows(PLAIN.len()).any(|w| w == PLAIN.as_bytes()),
            "{} holds the plaintext",
            entry.display()
        );
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_master_key_env_set_uses_the_private_fallback_file_and_limits_hold() {
    let gw = start("").await;
    let r = gw
        .call(
            ADMIN,
            "env.set",
            json!({"key": "FALLBACK_KEY", "value": "v1"}),
        )
        .await;
    assert_eq!(ok(&r)["storage"], "file", "{r}");
    let file = gw.dir.path().join("data").join("secrets.env");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let r = gw
        .call(ADMIN, "secrets.set", json!({"name": "X", "value": "v"}))
        .await;
    assert_eq!(code(&r), -32003, "{r}");
    let r = gw.call(ADMIN, "secrets.list", json!({})).await;
    assert_eq!(code(&r), -32003, "{r}");
    let l = gw.call(ADMIN, "env.list", json!({})).await;
    assert_eq!(ok(&l)["secrets"][0]["source"], "envfile");
    // env.set: 5 per minute (one used above), the 6th refused; env.list: 30 (one used).
    for i in 0..4 {
        let r = gw
            .call(
                ADMIN,
                "env.set",
                json!({"key": "FALLBACK_KEY", "value": format!("v{i}")}),
            )
            .await;
        ok(&r);
    }
    let r = gw
        .call(
            ADMIN,
            "env.set",
            json!({"key": "FALLBACK_KEY", "value": "over"}),
        )
        .await;
    assert_eq!(code(&r), -32000, "{r}");
    for _ in 0..29 {
        ok(&gw.call(ADMIN, "env.list", json!({})).await);
    }
    let r = gw.call(ADMIN, "env.list", json!({})).await;
    assert_eq!(code(&r), -32000, "{r}");
    assert!(!std::fs::read_to_string(&file).unwrap().contains("over"));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_master_key_refuses_to_start_and_the_right_one_reads_the_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let good = master_key(dir.path(), 1);
    let yaml = |key: &str| {
        format!(
            "{key}gateway:\n  port: 0\n  dataDir: {}\n  tokens:\n    - {{id: admin, secret: {ADMIN}, scopes: ['*']}}\nlocal:\n  autoFetch: false\n",
            data.display()
        )
    };
    let path = dir.path().join("g.yaml");
    std::fs::write(&path, yaml(&good)).unwrap();
    let running = agent_gateway::server::start(Some(path.clone()))
        .await
        .unwrap();
    let gw = Gateway {
        addr: running.addr,
        running,
        dir: tempfile::tempdir().unwrap(),
    };
    ok(&gw
        .call(
            ADMIN,
            "secrets.set",
            json!({"name": "KEPT", "value": "kept-value"}),
        )
        .await);
    gw.stop().await;
    // Another key: the start is refused with a clear message.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(&path, yaml(&master_key(other.path(), 2))).unwrap();
    let err = match agent_gateway::server::start(Some(path.clone())).await {
        Ok(r) => r.done.await.unwrap().unwrap_err(),
        Err(e) => e,
    };
    assert!(err.contains("master key"), "{err}");
    // A key file others can read: refused too.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.path().join("master.key"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    std::fs::write(&path, yaml(&good)).unwrap();
    let err = agent_gateway::server::start(Some(path.clone()))
        .await
        .err()
        .unwrap_or_default();
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(
        dir.path().join("master.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let running = agent_gateway::server::start(Some(path)).await.unwrap();
    let gw = Gateway {
        addr: running.addr,
        running,
        dir: tempfile::tempdir().unwrap(),
    };
    let r = gw.call(ADMIN, "secrets.get", json!({"name": "KEPT"})).await;
    assert_eq!(ok(&r)["value"], "kept-value");
    gw.stop().await;
}
