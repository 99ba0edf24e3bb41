//! Human approval of tool calls over JSON-RPC on loopback (`autonomy.approvals`,
//! `admin.approval.*`): a waiting turn, the pending list without raw arguments, approve, deny
//! with a reason, resolveAll by session, lapse, the denial cache and both ways of clearing it,
//! events, and the refusals.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

const SECRET: &str = "sk-live-do-not-show";

fn config(timeout_seconds: u32) -> String {
    format!(
        r#"
  limits: {{maxConcurrentTurns: 1, maxConcurrentTurnsPerClient: 1}}
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "save please"
        steps:
          - toolCalls: [{{name: save_file, arguments: {{path: out.txt, content: "{SECRET}"}}}}]
          - reply: "finished"
      - match: "note please"
        steps:
          - toolCalls: [{{name: session_note_add, arguments: {{note: "n"}}}}]
          - reply: "noted"
agents:
  default: {{model: script/m1, tools: ["*"], maxSteps: 4}}
  careful: {{model: script/m1, tools: ["*"], maxSteps: 4}}
autonomy:
  approvals:
    tools: ["save_*"]
    agents: {{careful: [session_note_add]}}
    timeoutSeconds: {timeout_seconds}
"#
    )
}

/// Runs `message` on `agent` in the session of `user` on its own task (it waits for a
/// decision).
fn execute(gw: &Gateway, agent: &str, user: &str, message: &str) -> tokio::task::JoinHandle<Value> {
    let (url, agent, user, message) = (
        gw.url("/rpc"),
        agent.to_owned(),
        user.to_owned(),
        message.to_owned(),
    );
    tokio::spawn(async move {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "agent.execute", "params": {
            "agentId": agent, "message": message, "sessionKey": {"userId": user}}});
        let v: Value = reqwest::Client::new()
            .post(url)
            .bearer_auth(RPC)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["result"].clone()
    })
}

/// Waits until `n` requests are pending; answers them.
async fn pending(gw: &Gateway, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + STEP;
    loop {
        let p = ok(gw, ADMIN, "admin.approval.pending", json!({})).await;
        let list = p["requests"].as_array().unwrap().clone();
        if list.len() == n {
            assert_eq!(p["total"], n);
            return list;
        }
        assert!(Instant::now() < deadline, "pending: {p}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The tool results of a session's transcript, as text.
async fn tool_results(gw: &Gateway, key: &str) -> Vec<String> {
    let h = ok(gw, ADMIN, "session.history", json!({"session_key": key})).await;
    h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_runs_once_approved_and_holds_no_admission_slot() {
    let gw = start(&config(30)).await;
    let turn = execute(&gw, "default", "u1", "save please");
    let list = pending(&gw, 1).await;
    let r = &list[0];
    assert_eq!(r["toolName"], "save_file");
    assert_eq!(r["agentId"], "default");
    assert_eq!(r["sessionKey"], "agent:default:api:client:u1");
    assert_eq!(
        r["expiresAt"].as_i64().unwrap() - r["createdAt"].as_i64().unwrap(),
        30_000
    );
    let summary = r["summary"].as_str().unwrap();
    assert!(
        summary.contains("path") && summary.contains("content"),
        "{r}"
    );
    assert!(!r.to_string().contains(SECRET), "no raw arguments: {r}");
    // The waiting turn gave its slot back: with one turn allowed, another turn runs.
    let other = ok(
        &gw,
        RPC,
        "agent.execute",
        json!({"message": "hello", "sessionKey": {"userId": "u2"}}),
    )
    .await;
    assert_eq!(other["finishReason"], "stop", "{other}");
    let id = r["id"].as_str().unwrap();
    let resolved = ok(
        &gw,
        ADMIN,
        "admin.approval.resolve",
        json!({"id": id, "approved": true}),
    )
    .await;
    assert_eq!(
        resolved,
        json!({"id": id, "approved": true, "approvedBy": "admin", "reason": null})
    );
    let done = tokio::time::timeout(STEP, turn).await.unwrap().unwrap();
    assert_eq!(done["response"], "finished", "{done}");
    let results = tool_results(&gw, "agent:default:api:client:u1").await;
    assert!(!results[0].contains("not run"), "{results:?}");
    assert!(pending(&gw, 0).await.is_empty());
    // Resolved and unknown ids are not found; an rpc token is refused.
    for bad in [id, "appr_nope"] {
        let r = gw
            .call(
                ADMIN,
                "admin.approval.resolve",
                json!({"id": bad, "approved": false}),
            )
            .await;
        assert_eq!(code(&r), -32001, "{r}");
    }
    for m in ["admin.approval.pending", "admin.approval.clearDenialCache"] {
        let r = gw.call(RPC, m, json!({})).await;
        assert_eq!(code(&r), -32603, "{m}: {r}");
    }
    let events = activity(&gw).await;
    assert!(events.contains("approval:requested"), "{events}");
    assert!(events.contains("approval:resolved"), "{events}");
    assert!(!events.contains(SECRET), "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_is_remembered_until_the_cache_is_cleared_either_way() {
    let gw = start(&config(30)).await;
    let key = "agent:default:api:client:u1";
    let turn = execute(&gw, "default", "u1", "save please");
    let id = pending(&gw, 1).await[0]["id"].as_str().unwrap().to_owned();
    ok(
        &gw,
        ADMIN,
        "admin.approval.resolve",
        json!({"id": id, "approved": false, "reason": "not today"}),
    )
    .await;
    let done = tokio::time::timeout(STEP, turn).await.unwrap().unwrap();
    assert_eq!(done["response"], "finished");
    let results = tool_results(&gw, key).await;
    assert!(results[0].contains("not today"), "{results:?}");
    // The same call in the same session is denied at once, without asking.
    let t = Instant::now();
    let again = tokio::time::timeout(STEP, execute(&gw, "default", "u1", "save please"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again["response"], "finished");
    assert!(t.elapsed() < Duration::from_secs(5));
    let results = tool_results(&gw, key).await;
    assert!(results[1].contains("earlier"), "{results:?}");
    // Another session asks.
    let elsewhere = execute(&gw, "default", "u2", "save please");
    let list = pending(&gw, 1).await;
    assert_eq!(list[0]["sessionKey"], "agent:default:api:client:u2");
    let all = ok(
        &gw,
        ADMIN,
        "admin.approval.resolveAll",
        json!({"approved": true, "sessionKey": "agent:default:api:client:u2"}),
    )
    .await;
    assert_eq!(all, json!({"resolved": 1, "requestIds": [list[0]["id"]]}));
    tokio::time::timeout(STEP, elsewhere)
        .await
        .unwrap()
        .unwrap();
    // clearDenialCache: the first session asks again.
    let cleared = ok(&gw, ADMIN, "admin.approval.clearDenialCache", json!({})).await;
    assert_eq!(cleared, json!({"cleared": true}));
    let asking = execute(&gw, "default", "u1", "save please");
    let id = pending(&gw, 1).await[0]["id"].as_str().unwrap().to_owned();
    ok(
        &gw,
        ADMIN,
        "admin.approval.resolve",
        json!({"id": id, "approved": false}),
    )
    .await;
    tokio::time::timeout(STEP, asking).await.unwrap().unwrap();
    // session.reset clears that session's remembered denials too.
    ok(&gw, ADMIN, "session.reset", json!({"session_key": key})).await;
    let asking = execute(&gw, "default", "u1", "save please");
    let list = pending(&gw, 1).await;
    // resolveAll without a session resolves everything, recording who decided.
    let all = ok(
        &gw,
        ADMIN,
        "admin.approval.resolveAll",
        json!({"approved": false, "approvedBy": "night-shift", "reason": "later"}),
    )
    .await;
    assert_eq!(all["resolved"], 1);
    assert_eq!(all["requestIds"][0], list[0]["id"]);
    tokio::time::timeout(STEP, asking).await.unwrap().unwrap();
    let none = ok(
        &gw,
        ADMIN,
        "admin.approval.resolveAll",
        json!({"approved": true}),
    )
    .await;
    assert_eq!(none, json!({"resolved": 0, "requestIds": []}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_request_lapses_as_a_denial_and_per_agent_patterns_apply() {
    let gw = start(&config(1)).await;
    // The per-agent pattern: `careful` asks for notes, `default` does not.
    let plain = ok(
        &gw,
        RPC,
        "agent.execute",
        json!({"message": "note please", "sessionKey": {"userId": "u3"}}),
    )
    .await;
    assert_eq!(plain["response"], "noted");
    let t = Instant::now();
    let careful = tokio::time::timeout(STEP, execute(&gw, "careful", "u4", "note please"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(careful["response"], "noted");
    let results = tool_results(&gw, "agent:careful:api:client:u4").await;
    assert!(results[0].contains("lapsed"), "{results:?}");
    assert!(pending(&gw, 0).await.is_empty());
    let r = gw
        .call(
            ADMIN,
            "admin.approval.resolve",
            json!({"id": "appr_x", "approved": true}),
        )
        .await;
    assert_eq!(code(&r), -32001);
    // A policy past its limit does not start.
    let bad = agent_gateway::config::parse("autonomy:\n  approvals: {timeoutSeconds: 86401}\n")
        .and_then(|c| agent_gateway::config::validate(&c));
    assert!(bad.unwrap_err().to_string().contains("timeoutSeconds"));
}
