//! Tenant ownership as an attacker tries it: a second `rpc` tenant (mallory) against the first
//! one's (alice's, token id `client`) sessions, runs and memories, through every method the
//! catalogue gives an ownership rule (table-driven from `METHODS`), the REST routes, the memory
//! tools, `/api/events` and `session.completed`. Every refusal is the not-found answer and
//! leaves the records as they were (counted in the gateway's own SQLite file).

use std::time::Duration;

use agent_gateway::api::generated::methods::{RecordKind, Scope, METHODS};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use crate::common::*;

const MALLORY: &str = "mallory-secret-0123456789abcdefghijklmnopqrs";
const ALICE_ID: &str = "client";
const ALICE_JOB: &str = "alice-job";
const ALICE_GRAPH: &str = "alice-graph";
const ALICE_GRAPH_RUN: &str = "graph_run_alice";

const CONFIG: &str = r#"    - {id: mallory, secret: mallory-secret-0123456789abcdefghijklmnopqrs, scopes: [rpc]}
  rateLimit: {windowMs: 60000, maxRequests: 100000}
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "remember"
        steps:
          - toolCalls: [{name: memory_store, arguments: {content: "Alice's cat is named Mochi", tags: [pets]}}]
          - reply: "Noted."
      - match: "recall"
        steps:
          - toolCalls: [{name: memory_search, arguments: {query: "cat named"}}]
          - reply: "Looked."
      - steps:
          - reply: "Hello!"
agents:
  default: {model: script/m1, tools: ["*"]}
"#;

async fn start_tenants() -> Gateway {
    start(CONFIG).await
}

fn result(v: &Value, what: &str) -> Value {
    v.get("result")
        .cloned()
        .unwrap_or_else(|| panic!("{what}: {v}"))
}

/// Row counts that no refused call may change.
async fn counts(db: &sqlx::SqlitePool) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for (name, sql) in [
        ("alice's sessions", "SELECT COUNT(*) FROM sessions WHERE tenant_id = 'client'"),
        ("alice's messages", "SELECT COUNT(*) FROM messages m JOIN sessions s ON s.session_key = m.session_key WHERE s.tenant_id = 'client'"),
        ("sessions in alice's namespace", "SELECT COUNT(*) FROM sessions WHERE session_key LIKE 'agent:%:%:client:%'"),
        ("alice's runs", "SELECT COUNT(*) FROM runs WHERE client_id = 'client'"),
        ("runs of unfinished status", "SELECT COUNT(*) FROM runs WHERE status IN ('queued', 'running')"),
        ("alice's memories", "SELECT COUNT(*) FROM memories WHERE tenant_id = 'client'"),
        ("all memories", "SELECT COUNT(*) FROM memories"),
        ("alice's cron jobs", "SELECT COUNT(*) FROM cron_jobs WHERE owner = 'client'"),
        ("alice's cron fires", "SELECT COUNT(*) FROM cron_runs WHERE owner = 'client'"),
        ("cron fires running", "SELECT COUNT(*) FROM cron_runs WHERE status = 'running'"),
        ("alice's graphs", "SELECT COUNT(*) FROM graphs WHERE owner = 'client'"),
        ("alice's graph runs", "SELECT COUNT(*) FROM graph_runs WHERE owner = 'client'"),
    ] {
        let n: i64 = sqlx::query_scalar(sql).fetch_one(db).await.unwrap();
        out.push((name.to_owned(), n));
    }
    out
}

/// A minimal value valid against `schema` (`$ref`s resolved in `root`): required members only.
fn minimal(schema: &Value, root: &Value) -> Value {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.trim_start_matches("#/$defs/");
        return minimal(&root["$defs"][name], root);
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values[0].clone();
    }
    let ty = schema.get("type").cloned().unwrap_or(Value::Null);
    let ty = match &ty {
        Value::Array(a) => a[0].as_str().unwrap_or("null").to_owned(),
        Value::String(s) => s.clone(),
        _ => "object".to_owned(),
    };
    match ty.as_str() {
        "string" => {
            let n = schema
                .get("minLength")
                .and_then(Value::as_u64)
                .unwrap_or(1)
                .max(1);
            Value::String("x".repeat(n as usize))
        }
        "integer" | "number" => {
            let lo = schema
                .get("minimum")
                .and_then(Value::as_f64)
                .or_else(|| {
                    schema
                        .get("exclusiveMinimum")
                        .and_then(Value::as_f64)
                        .map(|v| v + 1.0)
                })
                .unwrap_or(1.0);
            json!(lo as i64)
        }
        "boolean" => json!(false),
        "array" => {
            let n = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            let item = minimal(&schema["items"], root);
            Value::Array(vec![item; n as usize])
        }
        "null" => Value::Null,
        _ => {
            let mut out = Map::new();
            for name in schema["required"].as_array().into_iter().flatten() {
                let name = name.as_str().unwrap();
                out.insert(name.to_owned(), minimal(&schema["properties"][name], root));
            }
            Value::Object(out)
        }
    }
}

/// `params` with the member at the dotted `path` set to `id` (objects on the way are created).
fn with_path(mut params: Value, path: &str, id: &str) -> Value {
    let mut at = &mut params;
    let segments: Vec<&str> = path.split('.').collect();
    for (i, seg) in segments.iter().enumerate() {
        let obj = at.as_object_mut().unwrap();
        if i + 1 == segments.len() {
            obj.insert((*seg).to_owned(), json!(id));
            break;
        }
        at = obj.entry((*seg).to_owned()).or_insert_with(|| json!({}));
    }
    params
}

/// A run of alice's, finished.
async fn finished_run(gw: &Gateway) -> String {
    let r = result(
        &gw.call(
            RPC,
            "session.spawn",
            json!({"task": "say hello", "async": true}),
        )
        .await,
        "session.spawn",
    );
    let run_id = r["runId"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let s = result(
            &gw.call(RPC, "session.run_status", json!({"run_id": run_id}))
                .await,
            "session.run_status",
        );
        if s["status"] == "completed" {
            return run_id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "run never completed: {s}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_owned_method_refuses_a_second_tenant_and_changes_nothing() {
    let gw = start_tenants().await;
    let db = database(&gw).await;
    // Alice's records: a conversation with a memory in it, and a finished background run.
    let turn = |m: &str| json!({"message": m, "sessionKey": {"userId": "main"}});
    result(
        &gw.call(RPC, "agent.execute", turn("hello")).await,
        "execute",
    );
    result(
        &gw.call(RPC, "agent.execute", turn("remember this")).await,
        "remember",
    );
    let alice_key = "agent:default:api:client:main";
    let run_id = finished_run(&gw).await;
    let alice_job = json!({"name": ALICE_JOB, "message": "hello",
                           "schedule": {"kind": "interval", "everyMs": 3_600_000}});
    result(
        &gw.call(RPC, "cron.add", alice_job.clone()).await,
        "cron.add",
    );
    // A saved graph and an ended graph run of alice's, written to the store directly (the
    // graph.* methods are stubs so far; their ownership rules run before the stub answers).
    sqlx::query(
        "INSERT INTO graphs (owner, id, label, agent_id, definition, node_count, created_at, \
         updated_at) VALUES ($1, $2, 'mine', NULL, '{}', 0, 1, 1)",
    )
    .bind(ALICE_ID)
    .bind(ALICE_GRAPH)
    .execute(&db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO graph_runs (run_id, owner, status, node_count, completed_nodes, \
         failed_nodes, artifact_count, created_at, nodes) \
         VALUES ($1, $2, 'completed', 0, 0, 0, 0, 1, '{}')",
    )
    .bind(ALICE_GRAPH_RUN)
    .bind(ALICE_ID)
    .execute(&db)
    .await
    .unwrap();
    let before = counts(&db).await;
    assert_eq!(before[3].1, 1, "alice has one run");
    assert_eq!(before[5].1, 1, "alice has one memory");

    let victim = |kind: RecordKind| match kind {
        RecordKind::Session => alice_key.to_owned(),
        RecordKind::Run => run_id.clone(),
        RecordKind::Tenant | RecordKind::MemoryTenant => ALICE_ID.to_owned(),
        RecordKind::CronJob => ALICE_JOB.to_owned(),
        RecordKind::Graph => ALICE_GRAPH.to_owned(),
        RecordKind::GraphRun => ALICE_GRAPH_RUN.to_owned(),
    };
    // Graph ids are per owner: a rule that claims a missing graph lets mallory name the same id,
    // which is her own graph (none of alice's is reached; the counts below check it).
    let own_namespace = |kind: RecordKind, claim: bool| kind == RecordKind::Graph && claim;
    let mut checked = 0;
    for info in METHODS.iter().filter(|m| !m.internal) {
        let Some(rule) = &info.owner else { continue };
        let root: Value = serde_json::from_str(info.params_schema).unwrap();
        let id = victim(rule.kind);
        let params = with_path(minimal(&root, &root), rule.param, &id);
        let r = gw.call(MALLORY, info.name, params.clone()).await;
        if own_namespace(rule.kind, rule.claim) {
            assert_ne!(code(&r), -32001, "{} {params}: {r}", info.name);
            continue;
        }
        if info.scope == Scope::Admin {
            // The scope comes first: an rpc token never reaches the rule.
            assert_eq!(code(&r), -32603, "{} {params}: {r}", info.name);
            continue;
        }
        if rule.kind.refuse_as_scope() {
            // Naming another tenant's memory is an admin power (catalogue: -32603).
            assert_eq!(code(&r), -32603, "{} {params}: {r}", info.name);
            assert_eq!(
                r["error"]["message"],
                "Insufficient scope: requires 'admin'"
            );
        } else {
            assert_eq!(code(&r), -32001, "{} {params}: {r}", info.name);
            assert_eq!(
                r["error"]["message"],
                format!("{}: {id}", rule.kind.not_found()),
                "{}: the same answer as a record that does not exist",
                info.name
            );
        }
        // The owner passes the same rule with the same params.
        let mine = gw.call(RPC, info.name, params.clone()).await;
        assert!(
            mine["error"]["message"] != r["error"]["message"],
            "{} refused its owner: {mine}",
            info.name
        );
        checked += 1;
        // The owner's own call may have changed her job: put it back as it was, and let a
        // fire it started end before anything is counted.
        if info.name == "cron.remove" {
            result(
                &gw.call(RPC, "cron.add", alice_job.clone()).await,
                "cron.add",
            );
        }
        if info.name == "cron.run" {
            let deadline = tokio::time::Instant::now() + STEP;
            while counts(&db).await[9].1 > 0 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "alice's fire never ended"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if rule.kind == RecordKind::Tenant && rule.param.starts_with("sessionKey.") {
            // The other parts never change whose session a turn runs in: with alice named, every
            // channel and user is hers (refused); without, mallory's own, where the gateway's
            // channels are refused (-32602 naming sessionKey.channelId).
            for channel in [
                None,
                Some("api"),
                Some("heartbeat"),
                Some("webhook"),
                Some("cron"),
            ] {
                for user in [None, Some("main")] {
                    let mut p = params.clone();
                    if let Some(c) = channel {
                        p = with_path(p, "sessionKey.channelId", c);
                    }
                    if let Some(u) = user {
                        p = with_path(p, "sessionKey.userId", u);
                    }
                    let r = gw.call(MALLORY, info.name, p.clone()).await;
                    assert_eq!(code(&r), -32001, "{} {p}: {r}", info.name);
                    p["sessionKey"].as_object_mut().unwrap().remove("tenantId");
                    let r = gw.call(MALLORY, info.name, p.clone()).await;
                    if matches!(channel, Some("heartbeat" | "webhook" | "cron")) {
                        assert_eq!(code(&r), -32602, "{} {p}: {r}", info.name);
                        assert!(
                            r["error"]["message"]
                                .as_str()
                                .unwrap()
                                .contains("'sessionKey.channelId'"),
                            "{r}"
                        );
                    } else {
                        assert!(r.get("result").is_some(), "{} {p}: {r}", info.name);
                    }
                }
            }
        }
        if rule.claim && rule.kind == RecordKind::Session {
            // A key that does not exist yet, in alice's namespace, cannot be claimed either.
            let fresh = "agent:default:api:client:not-yet";
            let r = gw
                .call(
                    MALLORY,
                    info.name,
                    with_path(params.clone(), rule.param, fresh),
                )
                .await;
            assert_eq!(code(&r), -32001, "{} on {fresh}: {r}", info.name);
        }
    }
    assert!(
        checked >= 5,
        "only {checked} rpc methods carry an ownership rule"
    );
    // The owner's own calls above ran turns in her session; count again for the attacker's.
    let after_owner = counts(&db).await;
    // Mallory once more, after the owner's calls: nothing of alice's moves.
    for info in METHODS
        .iter()
        .filter(|m| m.owner.is_some() && m.scope == Scope::Rpc)
    {
        let rule = info.owner.as_ref().unwrap();
        let root: Value = serde_json::from_str(info.params_schema).unwrap();
        let params = with_path(minimal(&root, &root), rule.param, &victim(rule.kind));
        if own_namespace(rule.kind, rule.claim) {
            gw.call(MALLORY, info.name, params).await;
            continue;
        }
        let want = if rule.kind.refuse_as_scope() {
            -32603
        } else {
            -32001
        };
        assert_eq!(code(&gw.call(MALLORY, info.name, params).await), want);
    }
    assert_eq!(
        counts(&db).await,
        after_owner,
        "a refused call changed alice's records"
    );
    let mallory_runs: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM runs WHERE client_id = 'mallory'")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(mallory_runs, 0, "no refused call started a run");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_and_spawn_never_take_over_another_tenants_conversation() {
    let gw = start_tenants().await;
    let db = database(&gw).await;
    let alice_key = "agent:default:api:client:main";
    result(
        &gw.call(
            RPC,
            "agent.execute",
            json!({"message": "hi", "sessionKey": {"userId": "main"}}),
        )
        .await,
        "execute",
    );
    let messages = |key: &'static str| {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM messages WHERE session_key = ?")
                .bind(key)
                .fetch_one(&db)
                .await
                .unwrap()
        }
    };
    assert_eq!(messages(alice_key).await, 2);
    // The review's case: mallory runs a turn in alice's conversation.
    let send =
        |key: &str| json!({"session_key": key, "text": "what did she say?", "agent_id": "default"});
    let r = gw.call(MALLORY, "session.send", send(alice_key)).await;
    assert_eq!(code(&r), -32001, "{r}");
    assert_eq!(
        messages(alice_key).await,
        2,
        "nothing appended to alice's transcript"
    );
    // A key in alice's namespace that alice has not used yet cannot be pre-created.
    let later = "agent:default:api:client:later";
    assert_eq!(
        code(&gw.call(MALLORY, "session.send", send(later)).await),
        -32001
    );
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sessions WHERE session_key = ?")
        .bind(later)
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(n, 0, "the refused key was not created");
    result(
        &gw.call(
            RPC,
            "agent.execute",
            json!({"message": "hi", "sessionKey": {"userId": "later"}}),
        )
        .await,
        "alice uses her key",
    );
    let owner: Option<String> =
        sqlx::query_scalar("SELECT tenant_id FROM sessions WHERE session_key = ?")
            .bind(later)
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(owner.as_deref(), Some(ALICE_ID));
    // A free-form key is a label within the caller's own tenant: no name can be squatted.
    let m = result(
        &gw.call(MALLORY, "session.send", send("shared")).await,
        "mallory sends",
    );
    assert_eq!(m["sessionKey"], "agent:default:session:mallory:shared");
    assert_eq!(m["status"], "completed", "{m}");
    let a = result(
        &gw.call(RPC, "session.send", send("shared")).await,
        "alice sends",
    );
    assert_eq!(a["sessionKey"], "agent:default:session:client:shared");
    // Continuing her own label is the same session.
    let again = result(
        &gw.call(MALLORY, "session.send", send("shared")).await,
        "again",
    );
    assert_eq!(again["sessionKey"], m["sessionKey"]);
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM messages WHERE session_key = 'agent:default:session:mallory:shared'",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(n, 4, "two turns in mallory's own session");
    // Spawned runs live in the caller's tenant.
    let s = result(
        &gw.call(MALLORY, "session.spawn", json!({"task": "hello"}))
            .await,
        "spawn",
    );
    assert!(
        s["sessionKey"]
            .as_str()
            .unwrap()
            .starts_with("agent:default:subagent:mallory:"),
        "{s}"
    );
    // A row stored under alice's key for another owner (written before ownership rules) is
    // never continued, by alice or by its stored owner.
    let squat = "agent:default:api:client:squat";
    sqlx::query(
        "INSERT INTO sessions (session_key, agent_id, channel, tenant_id, user_id, created_at, updated_at) \
         VALUES (?, 'default', 'api', 'mallory', 'squat', 0, 0)",
    )
    .bind(squat)
    .execute(&db)
    .await
    .unwrap();
    let r = gw
        .call(
            RPC,
            "agent.execute",
            json!({"message": "hi", "sessionKey": {"userId": "squat"}}),
        )
        .await;
    assert_eq!(code(&r), -32001, "{r}");
    assert_eq!(
        code(&gw.call(MALLORY, "session.send", send(squat)).await),
        -32001
    );
    assert_eq!(messages(squat).await, 0);
    gw.stop().await;
}

async fn get(gw: &Gateway, path: &str, token: &str) -> Value {
    let r = reqwest::Client::new()
        .get(gw.url(path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{path}");
    r.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memories_and_rest_routes_stay_within_the_tenant() {
    let gw = start_tenants().await;
    let turn = |m: &str, user: &str| json!({"message": m, "sessionKey": {"userId": user}});
    result(
        &gw.call(RPC, "agent.execute", turn("remember this", "main"))
            .await,
        "alice stores",
    );
    // Mallory's own turn searches memories through the tool: alice's fact is not found.
    result(
        &gw.call(MALLORY, "agent.execute", turn("recall it", "m"))
            .await,
        "mallory recalls",
    );
    let h = result(
        &gw.call(
            ADMIN,
            "session.history",
            json!({"session_key": "agent:default:api:mallory:m"}),
        )
        .await,
        "history",
    );
    let tool = h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap_or_else(|| panic!("no tool message: {h}"));
    assert_eq!(
        serde_json::from_str::<Value>(tool["content"].as_str().unwrap()).unwrap()["results"],
        json!([]),
        "{tool}"
    );
    // Alice's own recall finds it.
    result(
        &gw.call(RPC, "agent.execute", turn("recall it", "main"))
            .await,
        "alice recalls",
    );
    let h = result(
        &gw.call(
            RPC,
            "session.history",
            json!({"session_key": "agent:default:api:client:main"}),
        )
        .await,
        "history",
    );
    let found = h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .any(|m| m["content"].as_str().unwrap().contains("Mochi"));
    assert!(found, "{h}");
    // REST: search and stats.
    let q = "/api/memory/search?q=cat";
    assert_eq!(get(&gw, q, MALLORY).await["results"], json!([]));
    assert_eq!(
        get(&gw, q, RPC).await["results"].as_array().unwrap().len(),
        1
    );
    // An admin searches its own tenant unless it names another.
    assert_eq!(get(&gw, q, ADMIN).await["results"], json!([]));
    assert_eq!(
        get(&gw, &format!("{q}&tenantId={ALICE_ID}"), ADMIN).await["results"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        get(&gw, "/api/memory/stats", MALLORY).await["totalEntries"],
        0
    );
    assert_eq!(get(&gw, "/api/memory/stats", RPC).await["totalEntries"], 1);
    // /api/chat keys are built in the caller's tenant; history lists one's own only.
    let r = reqwest::Client::new()
        .post(gw.url("/api/chat"))
        .bearer_auth(MALLORY)
        .json(&json!({"message": "hello", "sessionKey": "main"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let hist = get(&gw, "/api/chat/history", MALLORY).await;
    let keys: Vec<&str> = hist["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionKey"].as_str().unwrap())
        .collect();
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k.contains(":mallory:")), "{keys:?}");
    // Activity: mallory sees her own and system events, none of alice's.
    let act = get(&gw, "/api/activity?limit=100", MALLORY).await;
    let text = act.to_string();
    assert!(text.contains(":mallory:"), "{text}");
    assert!(!text.contains(":client:"), "{text}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_pushes_reach_only_their_tenant() {
    let gw = start_tenants().await;
    // Mallory listens on /api/events and on a WebSocket.
    let resp = reqwest::Client::new()
        .get(gw.url(&format!("/api/events?token={MALLORY}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut sse = resp.bytes_stream();
    let mut mallory_ws = gw.ws(MALLORY).await;
    let mut alice_ws = gw.ws(RPC).await;
    // Alice's turn, an async run of alice's, then a system event, then mallory's own turn.
    result(
        &gw.call(
            RPC,
            "agent.execute",
            json!({"message": "hi", "sessionKey": {"userId": "main"}}),
        )
        .await,
        "alice",
    );
    send(
        &mut alice_ws,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "session.spawn", "params": {"task": "hi", "async": true}}).to_string(),
    )
    .await;
    let mut completed = false;
    let deadline = tokio::time::Instant::now() + STEP;
    while !completed {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no session.completed for alice"
        );
        let v = recv(&mut alice_ws).await;
        completed = v["method"] == "session.completed";
    }
    result(
        &gw.call(
            ADMIN,
            "agents.create",
            json!({"agentId": "extra", "config": {"model": "script/m1"}}),
        )
        .await,
        "agents.create",
    );
    result(
        &gw.call(
            MALLORY,
            "agent.execute",
            json!({"message": "hi", "sessionKey": {"userId": "me"}}),
        )
        .await,
        "mallory",
    );
    // Read mallory's stream up to her own message:sent (published after everything above).
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + STEP;
    while !(text.contains("event: message:sent") && text.contains(":mallory:")) {
        let chunk = tokio::time::timeout_at(deadline, sse.next())
            .await
            .expect("mallory's own events arrive")
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        text.contains("event: agent:hot_added"),
        "system events stay visible: {text}"
    );
    assert!(
        !text.contains(":client:"),
        "alice's session events leaked: {text}"
    );
    // Mallory's socket got heartbeats at most, never alice's session.completed.
    let wait = tokio::time::sleep(Duration::from_millis(300));
    tokio::pin!(wait);
    loop {
        tokio::select! {
            _ = &mut wait => break,
            m = mallory_ws.next() => {
                let Some(Ok(m)) = m else { break };
                let v: Value = serde_json::from_str(m.to_text().unwrap_or("null")).unwrap_or(Value::Null);
                assert_ne!(v["method"], "session.completed", "{v}");
            }
        }
    }
    gw.stop().await;
}

/// Param names that name a session or a run, wherever they appear at the top of a method's
/// params (`key` is session.compact's session key).
const OWNED_PARAMS: &[&str] = &["session_key", "sessionKey", "run_id", "runId", "rootRunId"];

/// Stubs whose params name such a record and carry no rule yet: none since the graph run
/// methods got their `graph_run` rules. A stub made real without a rule fails the test below.
const PENDING: &[&str] = &[];

#[test]
fn every_implemented_method_naming_a_session_or_run_has_an_ownership_rule() {
    let mut pending = Vec::new();
    for info in METHODS.iter().filter(|m| !m.internal) {
        let schema: Value = serde_json::from_str(info.params_schema).unwrap();
        let names: Vec<&str> = schema["properties"]
            .as_object()
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let names_owned = names.iter().any(|n| OWNED_PARAMS.contains(n))
            || (info.name == "session.compact" && names.contains(&"key"));
        if !names_owned || info.owner.is_some() {
            continue;
        }
        assert!(
            info.stub,
            "{} names a session or run in its params but has no `owner` rule (catalogue/README.md, Ownership)",
            info.name
        );
        pending.push(info.name);
    }
    assert_eq!(
        pending, PENDING,
        "update PENDING: a stub was made real or gained a rule"
    );
}
