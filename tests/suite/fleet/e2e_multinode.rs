//! Several gateway nodes on one PostgreSQL database behave as one gateway: two in-process
//! nodes (each with its own control block, hub, event bus and node id) on loopback ports,
//! sharing a fresh database of the suite's throwaway server. Conversations continue across
//! nodes, pushes and events cross over LISTEN/NOTIFY (large ones through the spill table),
//! registry changes reach every node, a webhook delivered to both runs once, and a node whose
//! notification connection is killed reconnects and catches up.

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::common::*;

const HOOK_TOKEN: &str = "hook-token-0123456789abcdefghijklmnopqrstuv";

fn config() -> String {
    format!(
        r#"  rateLimit: {{windowMs: 60000, maxRequests: 100000}}
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "big"
        steps:
          - reply: "{big}"
      - match: "hello"
        steps:
          - reply: "Hello there."
            usage: {{input: 10, output: 5}}
      - match: "again"
        steps:
          - reply: "Hello again."
            usage: {{input: 20, output: 5}}
agents:
  default: {{model: script/m1, maxSteps: 2}}
webhooks:
  enabled: true
  token: {HOOK_TOKEN}
  hmac:
    headerName: x-hub-signature-256
  mappings:
    - id: echo
      match: {{path: echo}}
      sessionKey: "{{{{payload.id}}}}"
      messageTemplate: "hello {{{{payload.name}}}}"
"#,
        big = "B".repeat(9000)
    )
}

async fn two_nodes() -> (Gateway, Gateway) {
    let url = crate::pg::database().await;
    let a = start_on(&url, &config()).await;
    let b = start_on(&url, &config()).await;
    (a, b)
}

async fn ok(gw: &Gateway, method: &str, params: Value) -> Value {
    let v = gw.call(ADMIN, method, params).await;
    assert!(v.get("error").is_none(), "{method}: {v}");
    v["result"].clone()
}

/// The contents of a session's messages, oldest first.
async fn contents(gw: &Gateway, key: &str) -> Vec<String> {
    let h = ok(gw, "session.history", json!({"session_key": key})).await;
    h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Polls `check` until it returns Some, for at most STEP (notifications take milliseconds).
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within STEP: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn read_until(resp: &mut reqwest::Response, seen: &mut String, needle: &str) {
    let fut = async {
        while !seen.contains(needle) {
            let c = resp.chunk().await.unwrap().expect("stream ended");
            seen.push_str(&String::from_utf8_lossy(&c));
        }
    };
    tokio::time::timeout(STEP, fut).await.expect(needle);
}

#[tokio::test]
async fn a_conversation_continues_across_nodes_and_events_reach_every_node() {
    let (a, b) = two_nodes().await;
    // An event stream on B sees the turn served by A.
    let mut events = reqwest::Client::new()
        .get(b.url("/api/events"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    let mut seen = String::new();
    read_until(&mut events, &mut seen, "retry:").await;

    let key = "agent:default:api:admin:shared";
    let who = json!({"userId": "shared"});
    let first = ok(
        &a,
        "agent.execute",
        json!({"message": "hello", "sessionKey": who}),
    )
    .await;
    assert_eq!(first["response"], "Hello there.");
    read_until(&mut events, &mut seen, "event: message:sent").await;
    assert!(seen.contains("event: message:received"), "{seen}");
    assert!(seen.contains("shared"), "{seen}");
    // Events keep their owner across nodes: on B, another tenant's activity feed has none of
    // the admin session's events, the admin's has them.
    let activity = |token: &'static str| {
        let url = b.url("/api/activity?limit=100");
        async move {
            let r = reqwest::Client::new()
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap()
        }
    };
    assert!(activity(ADMIN).await.contains("shared"));
    let other = activity(RPC).await;
    assert!(!other.contains("shared"), "{other}");
    assert!(!other.contains("message:received"), "{other}");

    let second = ok(
        &b,
        "agent.execute",
        json!({"message": "again", "sessionKey": who}),
    )
    .await;
    assert_eq!(second["response"], "Hello again.");
    for node in [&a, &b] {
        assert_eq!(
            contents(node, key).await,
            ["hello", "Hello there.", "again", "Hello again."]
        );
    }
    // Usage is the same whichever node answers (each node commits its rows within ~50 ms).
    let a_stats = eventually("usage on both nodes", || async {
        let x = ok(&a, "agent.cacheStats", json!({})).await;
        let y = ok(&b, "agent.cacheStats", json!({})).await;
        (x == y && x.to_string().contains("\"misses\":2")).then_some(x)
    })
    .await;
    assert!(a_stats.to_string().contains("script"), "{a_stats}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_run_started_on_one_node_pushes_its_completion_to_the_client_on_another() {
    let (a, b) = two_nodes().await;
    let mut ws = b.ws(RPC).await;
    assert_ping(&mut ws, 1).await;
    // A 9000-character result: over PostgreSQL's NOTIFY limit, so it travels spilled.
    let started = a
        .call(
            RPC,
            "session.spawn",
            json!({"task": "big job", "async": true}),
        )
        .await;
    let run_id = started["result"]["runId"].clone();
    assert!(run_id.is_string(), "{started}");
    let pushed = loop {
        let v = recv(&mut ws).await;
        if v["method"] == "session.completed" {
            break v;
        }
    };
    assert_eq!(pushed["params"]["runId"], run_id);
    assert_eq!(pushed["params"]["status"], "completed");
    assert_eq!(
        pushed["params"]["result"]["response"]
            .as_str()
            .map(str::len),
        Some(9000)
    );
    // The run's record is readable through either node.
    let st = ok(&b, "session.run_status", json!({"run_id": run_id})).await;
    assert_eq!(st["status"], "completed");
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn registry_changes_on_one_node_reach_the_other() {
    let (a, b) = two_nodes().await;
    ok(
        &a,
        "agents.create",
        json!({"agentId": "helper", "config": {"model": "script/m1", "systemPrompt": "Help."}}),
    )
    .await;
    eventually("agent on B", || async {
        let list = ok(&b, "agents.list", json!({})).await;
        list.to_string().contains("\"helper\"").then_some(())
    })
    .await;
    // And it serves turns there.
    let r = ok(
        &b,
        "agent.execute",
        json!({"message": "hello", "agentId": "helper"}),
    )
    .await;
    assert_eq!(r["response"], "Hello there.");
    ok(&b, "agents.delete", json!({"agentId": "helper"})).await;
    eventually("agent gone from A", || async {
        let list = ok(&a, "agents.list", json!({})).await;
        (!list.to_string().contains("\"helper\"")).then_some(())
    })
    .await;
    a.stop().await;
    b.stop().await;
}

fn sign(body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(HOOK_TOKEN.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

async fn deliver(gw: &Gateway, body: &[u8]) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(gw.url("/hooks/echo"))
        .header("content-type", "application/json")
        .header("x-hub-signature-256", sign(body))
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_webhook_delivered_to_both_nodes_at_once_runs_once() {
    let (a, b) = two_nodes().await;
    let body = br#"{"name":"Bo","id":"twice"}"#;
    let (x, y) = tokio::join!(deliver(&a, body), deliver(&b, body));
    assert_eq!((x.0, y.0), (200, 200), "{x:?} {y:?}");
    let key = "agent:default:webhook:echo:twice";
    let msgs = eventually("the run's answer", || async {
        let h = b
            .call(ADMIN, "session.history", json!({"session_key": key}))
            .await;
        let msgs = h["result"]["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (msgs.len() >= 2).then_some(msgs)
    })
    .await;
    // Give a second run (if there were one) the time to land, then count exactly.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let h = ok(&a, "session.history", json!({"session_key": key})).await;
    assert_eq!(h["messages"].as_array().unwrap().len(), 2, "{msgs:?}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_node_whose_notification_connection_drops_reconnects_and_catches_up() {
    let url = crate::pg::database().await;
    let a = start_on(&url, &config()).await;
    let b = start_on(&url, &config()).await;
    let b_node = b.running.control.node_id.to_string();
    let mut events = b.running.control.events.subscribe();

    // Kill B's listener connection from the server side (once it is up).
    let admin_url = url.clone();
    let listener = format!("agent-gateway-listener:{b_node}");
    eventually("B's listener connection ended", || {
        let (url, name) = (admin_url.clone(), listener.clone());
        async move {
            let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
                .await
                .unwrap();
            let killed: Vec<bool> = sqlx::query_scalar(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            )
            .bind(name)
            .fetch_all(&mut admin)
            .await
            .unwrap();
            (killed == [true]).then_some(())
        }
    })
    .await;
    // B keeps serving meanwhile.
    let r = ok(&b, "agent.execute", json!({"message": "hello"})).await;
    assert_eq!(r["response"], "Hello there.");
    // B reconnects and says so on its event stream...
    let resumed = tokio::time::timeout(STEP, async {
        loop {
            let e = events.recv().await.unwrap();
            if e.name == "system:fanout_resumed" {
                return e.data_value();
            }
        }
    })
    .await
    .expect("system:fanout_resumed within STEP");
    assert_eq!(resumed["node"], b_node);
    // ...and what A does afterwards reaches B again.
    ok(
        &a,
        "agents.create",
        json!({"agentId": "late", "config": {"model": "script/m1"}}),
    )
    .await;
    eventually("agent created after the reconnect", || async {
        let list = ok(&b, "agents.list", json!({})).await;
        list.to_string().contains("\"late\"").then_some(())
    })
    .await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_and_restarted_under_a_running_gateway() {
    let mut server = crate::pg::private_server();
    let url = server.database().await;
    let gw = start_on_with(&url, &config(), "  acquireTimeoutMs: 1000\n").await;
    let who = json!({"userId": "outage"});
    let first = ok(
        &gw,
        "agent.execute",
        json!({"message": "hello", "sessionKey": who}),
    )
    .await;
    assert_eq!(first["response"], "Hello there.");

    tokio::task::block_in_place(|| server.stop());
    // Down: calls fail with "unavailable" (-32003, 503 on REST) within the acquire timeout.
    let down = gw
        .call(
            ADMIN,
            "agent.execute",
            json!({"message": "again", "sessionKey": who}),
        )
        .await;
    assert_eq!(code(&down), -32003, "{down}");
    let r = reqwest::Client::new()
        .get(gw.url("/api/memory/stats"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(
        gw.call(ADMIN, "system.ping", json!({})).await["result"]["pong"],
        true
    );

    tokio::task::block_in_place(|| server.start());
    let again = eventually("a turn after PostgreSQL is back", || async {
        let v = gw
            .call(
                ADMIN,
                "agent.execute",
                json!({"message": "again", "sessionKey": who}),
            )
            .await;
        v.get("result").cloned()
    })
    .await;
    assert_eq!(again["response"], "Hello again.");
    assert_eq!(
        contents(&gw, "agent:default:api:admin:outage").await,
        ["hello", "Hello there.", "again", "Hello again."]
    );
    gw.stop().await;
}

/// Twenty jobs due every second on two nodes sharing one database: every due time fires once
/// (one run record and one agent turn each), both nodes fire, and when one node stops the other
/// keeps firing its jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_fire_every_due_time_exactly_once() {
    let url = crate::pg::database().await;
    let cfg = format!("{}scheduler:\n  maxConcurrentRuns: 8\n", config());
    let a = start_on(&url, &cfg).await;
    let b = start_on(&url, &cfg).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let v = ok(
            &a,
            "cron.add",
            json!({"name": format!("j{i}"), "message": "hello",
                   "schedule": {"kind": "cron", "expr": "* * * * * *"}}),
        )
        .await;
        ids.push(v["id"].as_str().unwrap().to_owned());
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    for id in &ids {
        ok(&a, "cron.update", json!({"name": id, "enabled": false})).await;
    }
    let db = sqlx::PgPool::connect(&url).await.unwrap();
    // Let the fires already claimed end.
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let running: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM cron_runs WHERE status = 'running'")
                .fetch_one(&db)
                .await
                .unwrap();
        if running == 0 || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (records, turns, nodes): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM cron_runs WHERE status = 'ok'), \
         (SELECT COUNT(*) FROM messages m JOIN sessions s ON s.session_key = m.session_key \
          WHERE s.channel = 'cron' AND m.role = 'user'), \
         (SELECT COUNT(DISTINCT node) FROM cron_runs)",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert!(
        records >= 40,
        "only {records} fires in 5 s of 20 jobs due every second"
    );
    assert_eq!(records, turns, "one agent turn per recorded fire");
    assert_eq!(nodes, 2, "both nodes fired");
    let errors: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM cron_runs WHERE status <> 'ok'")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(errors, 0);
    // Node A stops: B fires A's jobs on its own.
    for id in &ids[..2] {
        ok(&b, "cron.update", json!({"name": id, "enabled": true})).await;
    }
    a.stop().await;
    let before = records;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (after, from_b): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(*) FILTER (WHERE ts > $1) FROM cron_runs WHERE status = 'ok'",
    )
    .bind(chrono::Utc::now().timestamp_millis() - 2_500)
    .fetch_one(&db)
    .await
    .unwrap();
    assert!(after > before && from_b > 0, "{before} -> {after}");
    b.stop().await;
}
