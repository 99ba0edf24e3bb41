//! Run trees over JSON-RPC on loopback (`docs/orchestration.md`): scripted agents that spawn
//! sub-agents with the `spawn_agent` tool and wait for them, listed with their depths, waited
//! for, killed as a tree, revoked, steered, paused; limits; another tenant kept out.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

pub(crate) const TREE: &str = r#"
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "level one"
        steps:
          - toolCalls: [{name: spawn_agent, arguments: {task: "level two", agent: mid}}]
          - toolCalls: [{name: wait_agents, arguments: {timeoutMs: 60000}}]
          - reply: "boss done"
      - match: "level two"
        steps:
          - toolCalls: [{name: spawn_agent, arguments: {task: "level three", agent: leaf}}]
          - toolCalls: [{name: wait_agents, arguments: {timeoutMs: 60000}}]
          - reply: "mid done"
      - match: "level three"
        steps:
          - toolCalls: [{name: current_time}]
            delayMs: 30000
          - reply: "leaf done"
      - match: "quick three"
        steps:
          - reply: "quick leaf"
      - match: "quick two"
        steps:
          - toolCalls: [{name: spawn_agent, arguments: {task: "quick three", agent: leaf}}]
          - toolCalls: [{name: wait_agents, arguments: {timeoutMs: 20000}}]
          - reply: "quick mid"
      - match: "quick one"
        steps:
          - toolCalls: [{name: spawn_agent, arguments: {task: "quick two", agent: mid}}]
          - toolCalls: [{name: wait_agents, arguments: {timeoutMs: 20000}}]
          - reply: "quick boss"
      - match: "revocable"
        steps:
          - toolCalls: [{name: current_time}]
            delayMs: 1500
          - toolCalls: [{name: session_notes}]
          - reply: "never reached"
      - match: "slow child"
        steps:
          - toolCalls: [{name: current_time}]
            delayMs: 1500
          - reply: "went on unsteered"
      - match: "STEER"
        steps:
          - reply: "steered ok"
      - match: "introspect"
        steps:
          - toolCalls: [{name: my_capabilities}]
            usage: {input: 40, output: 10}
          - reply: "introspected"
      - match: "ask approval"
        steps:
          - toolCalls: [{name: session_notes}]
          - reply: "approved path"
      - match: "outside"
        steps:
          - toolCalls: [{name: save_file, arguments: {path: a.txt, content: x}}]
          - toolCalls: [{name: save_file, arguments: {path: b.txt, content: x}}]
          - toolCalls: [{name: save_file, arguments: {path: c.txt, content: x}}]
          - reply: "never reached"
agents:
  boss: {model: script/m1, tools: ["group:agents", current_time], maxSteps: 6}
  mid: {model: script/m1, tools: ["group:agents", current_time], maxSteps: 6}
  leaf: {model: script/m1, tools: [current_time, session_notes], maxSteps: 6}
  star: {model: script/m1, tools: ["*"], maxSteps: 4}
  narrow: {model: script/m1, tools: [current_time], maxSteps: 6}
  intro: {model: script/m1, tools: ["group:agents", current_time], maxSteps: 4, budget: {tokens: 500}}
"#;

pub(crate) async fn spawn(gw: &Gateway, token: &str, agent: &str, task: &str) -> Value {
    ok(
        gw,
        token,
        "session.spawn",
        json!({"agent": agent, "task": task, "async": true}),
    )
    .await
}

/// The runs of `root`'s tree as `subagent.list` shows them, by depth.
pub(crate) async fn tree_of(gw: &Gateway, root: &str) -> Vec<Value> {
    let list = ok(gw, ADMIN, "subagent.list", json!({})).await;
    let mut runs: Vec<Value> = list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["rootRunId"] == root)
        .cloned()
        .collect();
    runs.sort_by_key(|r| r["depth"].as_i64());
    runs
}

/// Waits until `root`'s tree has `n` runs, all running.
pub(crate) async fn until_running(gw: &Gateway, root: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + STEP;
    loop {
        let runs = tree_of(gw, root).await;
        if runs.len() == n && runs.iter().all(|r| r["status"] == "running") {
            return runs;
        }
        assert!(Instant::now() < deadline, "tree of {root}: {runs:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A session's transcript (`session.history` as admin).
async fn history(gw: &Gateway, key: &Value) -> Value {
    ok(gw, ADMIN, "session.history", json!({"session_key": key})).await
}

async fn usage_rows(gw: &Gateway) -> i64 {
    let db = database(gw).await;
    sqlx::query_scalar("SELECT COUNT(*) FROM usage")
        .fetch_one(&db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_level_tree_is_listed_waited_for_and_killed_at_once() {
    let gw = start(TREE).await;
    let root = spawn(&gw, ADMIN, "boss", "level one").await;
    let root_id = root["runId"].as_str().unwrap().to_owned();
    assert_eq!(root["rootRunId"], root_id);
    let runs = until_running(&gw, &root_id, 3).await;
    let depths: Vec<i64> = runs.iter().map(|r| r["depth"].as_i64().unwrap()).collect();
    assert_eq!(depths, [0, 1, 2]);
    assert_eq!(runs[1]["parentRunId"], runs[0]["runId"]);
    assert_eq!(runs[2]["parentRunId"], runs[1]["runId"]);
    assert_eq!(
        [
            &runs[0]["agentId"],
            &runs[1]["agentId"],
            &runs[2]["agentId"]
        ],
        ["boss", "mid", "leaf"]
    );
    assert!(runs.iter().all(|r| r["leaseId"].is_string()), "{runs:?}");
    let leaf = runs[2]["runId"].as_str().unwrap().to_owned();
    let status = ok(&gw, ADMIN, "subagent.status", json!({})).await;
    assert_eq!(status["runningRuns"], 2, "{status}");

    // A wait that times out: the leaf is in a 30 s model call.
    let t = Instant::now();
    let waited = ok(
        &gw,
        ADMIN,
        "subagent.wait",
        json!({"runIds": [leaf], "timeoutMs": 200}),
    )
    .await;
    assert_eq!(waited["results"][0]["status"], "timeout");
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert!(t.elapsed() < Duration::from_secs(3));

    // The kill of the root reaches the grandchild in its provider call (the rows of the
    // calls made so far are written first).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = usage_rows(&gw).await;
    let t = Instant::now();
    let killed = ok(&gw, ADMIN, "run.kill", json!({"rootRunId": root_id})).await;
    assert_eq!(killed, json!({"killed": 3, "leasesRevoked": 3}));
    let runs = tree_of(&gw, &root_id).await;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    for r in &runs {
        assert_eq!(r["status"], "killed", "{r}");
        assert!(r["completedAt"].is_i64(), "{r}");
        assert!(
            r.get("leaseId").is_none(),
            "an ended run holds no lease: {r}"
        );
    }
    let waited = ok(
        &gw,
        ADMIN,
        "subagent.wait",
        json!({"runIds": [leaf, "run_nope"], "timeoutMs": 1000}),
    )
    .await;
    assert_eq!(waited["results"][0]["status"], "cancelled");
    assert_eq!(waited["results"][0]["completion"]["status"], "killed");
    assert_eq!(waited["results"][1]["status"], "denied_unknown");
    // Nothing is recorded for the killed runs afterwards.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(usage_rows(&gw).await, before);
    // Killing it again kills nothing.
    let again = ok(&gw, ADMIN, "run.kill", json!({"rootRunId": root_id})).await;
    assert_eq!(again, json!({"killed": 0, "leasesRevoked": 0}));
    // The fleet report counts them.
    let fleet = ok(&gw, ADMIN, "obs.fleet.health", json!({})).await;
    let a = &fleet["autonomy"];
    assert_eq!(a["runs"]["total"], 3, "{fleet}");
    assert_eq!(a["killed"], 3);
    assert_eq!(a["worstRootRunId"], root_id);
    let codes: Vec<&str> = fleet["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect();
    assert!(codes.contains(&"autonomy_killed"), "{codes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_runs_to_its_end_and_each_parent_reads_its_childs_answer() {
    let gw = start(TREE).await;
    let root = spawn(&gw, ADMIN, "boss", "quick one").await;
    let root_id = root["runId"].as_str().unwrap();
    let waited = ok(
        &gw,
        ADMIN,
        "subagent.wait",
        json!({"runIds": [root_id], "timeoutMs": 20000}),
    )
    .await;
    let done = &waited["results"][0];
    assert_eq!(done["status"], "completed", "{waited}");
    assert_eq!(done["completion"]["response"], "quick boss");
    let runs = tree_of(&gw, root_id).await;
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert!(runs.iter().all(|r| r["status"] == "completed"), "{runs:?}");
    // The mid run's wait_agents result carried the leaf's answer into its conversation.
    let history = history(&gw, &runs[1]["sessionKey"]).await;
    let text = history.to_string();
    assert!(text.contains("quick leaf"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subagent_kill_stops_one_subtree_and_leaves_the_rest() {
    let gw = start(TREE).await;
    let root = spawn(&gw, ADMIN, "boss", "level one").await;
    let root_id = root["runId"].as_str().unwrap().to_owned();
    let runs = until_running(&gw, &root_id, 3).await;
    let mid = runs[1]["runId"].as_str().unwrap();
    let r = ok(&gw, ADMIN, "subagent.kill", json!({"target": mid})).await;
    assert_eq!(r, json!({"killed": true, "runId": mid}));
    let runs = tree_of(&gw, &root_id).await;
    // The root goes on: its wait sees the child cancelled (it may already have answered).
    assert_ne!(runs[0]["status"], "killed", "{runs:?}");
    assert_eq!(runs[1]["status"], "killed");
    assert_eq!(runs[2]["status"], "killed");
    // The root's wait_agents sees its child cancelled and the root answers.
    let waited = ok(
        &gw,
        ADMIN,
        "subagent.wait",
        json!({"runIds": [root_id], "timeoutMs": 10000}),
    )
    .await;
    assert_eq!(waited["results"][0]["completion"]["response"], "boss done");
    let again = ok(&gw, ADMIN, "subagent.kill", json!({"target": mid})).await;
    assert_eq!(again["killed"], false);
    let unknown = gw
        .call(ADMIN, "subagent.kill", json!({"target": "run_nope"}))
        .await;
    assert_eq!(code(&unknown), -32001, "{unknown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_refuses_the_next_tool_call_and_the_call_in_flight_completes() {
    let gw = start(TREE).await;
    let run = spawn(&gw, ADMIN, "leaf", "revocable").await;
    let run_id = run["runId"].as_str().unwrap().to_owned();
    let runs = until_running(&gw, &run_id, 1).await;
    let lease = runs[0]["leaseId"].as_str().unwrap().to_owned();
    // Both forms are refused together, and neither is refused too.
    for bad in [json!({}), json!({"leaseId": lease, "rootRunId": run_id})] {
        let r = gw.call(ADMIN, "lease.revoke", bad).await;
        assert_eq!(code(&r), -32602, "{r}");
    }
    // The first model call (1.5 s) is in flight when the lease is revoked.
    let revoked = ok(&gw, ADMIN, "lease.revoke", json!({"leaseId": lease})).await;
    assert_eq!(revoked["revoked"], 1);
    let again = ok(&gw, ADMIN, "lease.revoke", json!({"rootRunId": run_id})).await;
    assert_eq!(again["revoked"], 0);
    let waited = ok(
        &gw,
        ADMIN,
        "subagent.wait",
        json!({"runIds": [run_id], "timeoutMs": 10000}),
    )
    .await;
    assert_eq!(waited["results"][0]["status"], "cancelled", "{waited}");
    assert_eq!(waited["results"][0]["completion"]["status"], "revoked");
    // The model call completed (its usage is recorded); its tool call was refused.
    let st = ok(&gw, ADMIN, "session.run_status", json!({"run_id": run_id})).await;
    assert_eq!(st["status"], "revoked");
    assert!(st["tokensUsed"]["total"].as_i64().unwrap() > 0, "{st}");
    let history = history(&gw, &run["sessionKey"]).await;
    let text = history.to_string();
    assert!(text.contains("lease was revoked"), "{text}");
    assert!(!text.contains("never reached"), "{text}");
    let fleet = ok(&gw, ADMIN, "obs.fleet.health", json!({})).await;
    assert_eq!(fleet["autonomy"]["revoked"], 1, "{fleet}");
    assert_eq!(fleet["autonomy"]["runs"]["degraded"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steering_joins_a_running_run_before_its_next_model_call() {
    let gw = start(TREE).await;
    let run = spawn(&gw, ADMIN, "leaf", "slow child").await;
    let run_id = run["runId"].as_str().unwrap().to_owned();
    until_running(&gw, &run_id, 1).await;
    let steered = ok(
        &gw,
        ADMIN,
        "subagent.steer",
        json!({"target": run_id, "message": "STEER: answer now"}),
    )
    .await;
    assert_eq!(
        steered,
        json!({"status": "steered_inject", "runId": run_id})
    );
    let waited = ok(
        &gw,
        ADMIN,
        "subagent.wait",
        json!({"runIds": [run_id], "timeoutMs": 10000}),
    )
    .await;
    assert_eq!(
        waited["results"][0]["completion"]["response"], "steered ok",
        "{waited}"
    );
    let history = history(&gw, &run["sessionKey"]).await;
    let users: Vec<&str> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(users, ["slow child", "STEER: answer now"], "{history}");
    // An ended run takes no steering; an unknown one is not found.
    let ended = gw
        .call(
            ADMIN,
            "subagent.steer",
            json!({"target": run_id, "message": "late"}),
        )
        .await;
    assert_eq!(code(&ended), -32002, "{ended}");
    let unknown = gw
        .call(
            ADMIN,
            "subagent.steer",
            json!({"target": "run_nope", "message": "x"}),
        )
        .await;
    assert_eq!(code(&unknown), -32001, "{unknown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_refuses_every_spawn_until_resume() {
    let gw = start(TREE).await;
    let paused = ok(&gw, ADMIN, "subagent.pause", json!({})).await;
    assert_eq!(
        paused,
        json!({"paused": true, "acceptingSpawns": false, "resetsOnRestart": true, "changed": true})
    );
    let again = ok(&gw, ADMIN, "subagent.pause", json!({})).await;
    assert_eq!(again["changed"], false);
    let st = ok(&gw, ADMIN, "subagent.status", json!({})).await;
    assert_eq!(
        (st["paused"].clone(), st["acceptingSpawns"].clone()),
        (json!(true), json!(false))
    );
    let refused = gw
        .call(
            RPC,
            "session.spawn",
            json!({"agent": "leaf", "task": "quick three"}),
        )
        .await;
    assert_eq!(code(&refused), -32002, "{refused}");
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .contains("paused"));
    // An agent's own spawn_agent is refused too: the model sees the refusal.
    let r = ok(
        &gw,
        ADMIN,
        "agent.execute",
        json!({"agentId": "mid", "message": "quick two"}),
    )
    .await;
    let resumed = ok(&gw, ADMIN, "subagent.resume", json!({})).await;
    assert_eq!(
        resumed,
        json!({"paused": false, "acceptingSpawns": true, "resetsOnRestart": true, "changed": true})
    );
    assert_eq!(r["response"], "quick mid", "{r}");
    let history = ok(&gw, ADMIN, "subagent.list", json!({})).await;
    assert!(
        history["runs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["agentId"] != "leaf"),
        "no leaf ran while paused: {history}"
    );
    let spawned = ok(
        &gw,
        RPC,
        "session.spawn",
        json!({"agent": "leaf", "task": "quick three"}),
    )
    .await;
    assert_eq!(spawned["response"], "quick leaf");
    // Only admin supervises.
    for m in [
        "subagent.pause",
        "subagent.list",
        "run.kill",
        "lease.revoke",
    ] {
        let r = gw.call(RPC, m, json!({"rootRunId": "x"})).await;
        assert_eq!(code(&r), -32603, "{m}: {r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_bound_the_tree_and_the_agents_group_is_opt_in() {
    let gw = start(&format!("{TREE}autonomy:\n  subagents: {{maxDepth: 1}}\n")).await;
    let root = spawn(&gw, ADMIN, "boss", "quick one").await;
    let root_id = root["runId"].as_str().unwrap();
    let waited = ok(
        &gw,
        ADMIN,
        "subagent.wait",
        json!({"runIds": [root_id], "timeoutMs": 20000}),
    )
    .await;
    assert_eq!(waited["results"][0]["completion"]["response"], "quick boss");
    let runs = tree_of(&gw, root_id).await;
    // The mid run (depth 1) was refused its own child (depth 2).
    assert_eq!(runs.len(), 2, "{runs:?}");
    let mid = ok(
        &gw,
        ADMIN,
        "session.history",
        json!({"session_key": runs[1]["sessionKey"]}),
    )
    .await
    .to_string();
    assert!(mid.contains("maxDepth"), "{mid}");
    // `*` does not include the agents group: the tool is not offered.
    let star = ok(
        &gw,
        ADMIN,
        "agent.execute",
        json!({"agentId": "star", "message": "quick two"}),
    )
    .await;
    assert_eq!(star["response"], "quick mid", "{star}");
    let list = ok(&gw, ADMIN, "subagent.list", json!({})).await;
    assert_eq!(
        list["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["agentId"] == "leaf")
            .count(),
        0,
        "{list}"
    );
    // A configuration past a limit does not start.
    let bad = agent_gateway::config::parse("autonomy:\n  subagents: {maxDepth: 17}\n")
        .and_then(|c| agent_gateway::config::validate(&c));
    assert!(bad.unwrap_err().to_string().contains("maxDepth"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_denial_breaker_stops_the_tree_as_completed() {
    let gw = start(&format!(
        "{TREE}autonomy:\n  denialBreaker: {{threshold: 2}}\n"
    ))
    .await;
    // The narrow agent may not save files: two refusals in a row trip the breaker.
    let run = spawn(&gw, ADMIN, "narrow", "outside").await;
    let run_id = run["runId"].as_str().unwrap();
    let waited = ok(
        &gw,
        ADMIN,
        "subagent.wait",
        json!({"runIds": [run_id], "timeoutMs": 10000}),
    )
    .await;
    let c = &waited["results"][0]["completion"];
    assert_eq!(c["status"], "completed", "{waited}");
    assert!(
        c["error"].as_str().unwrap().contains("denial breaker"),
        "{c}"
    );
    let fleet = ok(&gw, ADMIN, "obs.fleet.health", json!({})).await;
    assert_eq!(fleet["autonomy"]["denialBreakerTrips"], 1, "{fleet}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_cannot_wait_on_a_run_or_learn_that_it_exists() {
    let gw = start(TREE).await;
    let run = spawn(&gw, RPC, "leaf", "quick three").await;
    let run_id = run["runId"].as_str().unwrap();
    let other = ok(
        &gw,
        ADMIN,
        "tokens.create",
        json!({"id": "other", "scopes": ["rpc"]}),
    )
    .await["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let theirs = ok(
        &gw,
        &other,
        "subagent.wait",
        json!({"runIds": [run_id, "run_nope"], "timeoutMs": 0}),
    )
    .await;
    assert_eq!(theirs["results"][0]["status"], "denied_unknown");
    assert_eq!(
        theirs["results"][0],
        json!({"runId": run_id, "status": "denied_unknown"})
    );
    let mine = ok(
        &gw,
        RPC,
        "subagent.wait",
        json!({"runIds": [run_id], "timeoutMs": 10000}),
    )
    .await;
    assert_eq!(mine["results"][0]["status"], "completed");
    // Over JSON-RPC the ids are required.
    let r = gw.call(RPC, "subagent.wait", json!({})).await;
    assert_eq!(code(&r), -32602, "{r}");
}

/// kill -9 of the real binary with a revoked run and a running one: after the restart the
/// revoked run is still revoked, and the running one is orphaned, never resumed; the fleet
/// report counts both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_9_a_revoked_run_stays_revoked_and_a_running_one_is_orphaned() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.yaml");
    std::fs::write(&config, config_yaml(dir.path(), TREE)).unwrap();
    let (mut child, port) = spawn_binary(dir.path(), &config, "first").await;
    let call = |m: &'static str, p: Value| call_port(port, ADMIN, m, p);
    let revoked = call(
        "session.spawn",
        json!({"agent": "leaf", "task": "revocable", "async": true}),
    )
    .await["result"]["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = call("lease.revoke", json!({"rootRunId": revoked})).await;
    assert_eq!(r["result"]["revoked"], 1, "{r}");
    let w = call(
        "subagent.wait",
        json!({"runIds": [revoked], "timeoutMs": 10000}),
    )
    .await;
    assert_eq!(w["result"]["results"][0]["completion"]["status"], "revoked");
    let running = call(
        "session.spawn",
        json!({"agent": "leaf", "task": "level three", "async": true}),
    )
    .await["result"]["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    tokio::time::sleep(Duration::from_millis(300)).await;
    child.kill().unwrap();
    child.wait().unwrap();

    let (mut child, port) = spawn_binary(dir.path(), &config, "second").await;
    let list = call_port(port, ADMIN, "subagent.list", json!({})).await;
    let runs = list["result"]["runs"].as_array().unwrap();
    let status = |id: &str| {
        runs.iter()
            .find(|r| r["runId"] == id)
            .map(|r| r["status"].clone())
            .unwrap()
    };
    assert_eq!(status(&revoked), "revoked", "{list}");
    assert_eq!(status(&running), "orphaned", "{list}");
    let fleet = call_port(port, ADMIN, "obs.fleet.health", json!({})).await;
    let a = &fleet["result"]["autonomy"];
    assert_eq!(
        (a["revoked"].clone(), a["orphaned"].clone()),
        (json!(1), json!(1)),
        "{fleet}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspection_answers_a_client_its_scopes_and_a_run_its_own_tools_and_budget() {
    let gw = start(TREE).await;
    let me = ok(&gw, RPC, "capabilities.introspect", json!({})).await;
    assert_eq!(
        me,
        json!({"kind": "client", "scopes": ["rpc"], "enabled": false, "caps": []})
    );
    let run = spawn(&gw, RPC, "intro", "introspect").await;
    let run_id = run["runId"].as_str().unwrap();
    let w = ok(
        &gw,
        RPC,
        "subagent.wait",
        json!({"runIds": [run_id], "timeoutMs": 10000}),
    )
    .await;
    assert_eq!(
        w["results"][0]["completion"]["response"], "introspected",
        "{w}"
    );
    let h = history(&gw, &run["sessionKey"]).await;
    let tool = h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let answer: Value = serde_json::from_str(&tool).unwrap();
    validate_result("capabilities.introspect", &answer);
    assert_eq!(answer["kind"], "run");
    assert_eq!(answer["agentId"], "intro");
    assert_eq!(answer["enabled"], true);
    assert_eq!(
        answer["caps"],
        json!([
            "current_time",
            "my_capabilities",
            "spawn_agent",
            "wait_agents"
        ])
    );
    assert_eq!(answer["budget"]["tokensRemaining"], 450, "{answer}");
    assert_eq!(answer["budget"]["wallClockMsRemaining"], Value::Null);
    assert_eq!(answer["scopes"], json!(["rpc"]));
}

const BUDGETED: &str = r#"
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "budget root"
        steps:
          - toolCalls: [{name: spawn_agent, arguments: {task: "budget child", agent: spender}}]
            usage: {input: 5, output: 5}
          - toolCalls: [{name: wait_agents, arguments: {timeoutMs: 20000}}]
            usage: {input: 0, output: 0}
          - toolCalls: [{name: current_time}]
            usage: {input: 0, output: 0}
          - reply: "root never answers"
      - match: "budget child"
        steps:
          - toolCalls: [{name: my_capabilities}]
            usage: {input: 30, output: 10}
          - reply: "child spent it"
            usage: {input: 40, output: 20}
          - reply: "never reached"
      - steps:
          - reply: "fresh tree"
            usage: {input: 1, output: 1}
agents:
  spender: {model: script/m1, tools: ["group:agents", current_time], maxSteps: 6}
autonomy:
  treeBudget: {maxTokens: 100}
"#;

/// `autonomy.treeBudget`: every run of a tree spends its root's budget. The child sees what
/// the tree has left, spends the rest and ends `budget_exceeded`; its parent makes no model
/// call after that (its turn ends `budget_exceeded` before the next step); a new tree starts
/// with the whole budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_tree_spends_one_budget_and_stops_when_it_is_spent() {
    let gw = start(BUDGETED).await;
    let root = spawn(&gw, RPC, "spender", "budget root").await;
    let root_id = root["runId"].as_str().unwrap();
    let waited = ok(
        &gw,
        RPC,
        "subagent.wait",
        json!({"runIds": [root_id], "timeoutMs": 20000}),
    )
    .await;
    let done = &waited["results"][0];
    assert_eq!(
        done["completion"]["finishReason"], "budget_exceeded",
        "{waited}"
    );
    let runs = tree_of(&gw, root_id).await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    let child = &runs[1];
    // The child's introspection: 100 - (10 by the root + 40 by its own first call).
    let h = history(&gw, &child["sessionKey"]).await;
    let messages = h["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("{child} {h}"));
    let tool = messages
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap_or_else(|| panic!("{child} {h}"));
    let answer: Value = serde_json::from_str(tool["content"].as_str().unwrap()).unwrap();
    assert_eq!(answer["budget"]["tokensRemaining"], 50, "{answer}");
    assert_eq!(answer["budget"]["usdRemaining"], Value::Null, "{answer}");
    assert!(
        messages.iter().any(|m| m["content"] == "child spent it"),
        "{h}"
    );
    assert!(!messages.iter().any(|m| m["content"] == "never reached"));
    // The root never made its fourth model call: no current_time call, no answer.
    let h = history(&gw, &root["sessionKey"]).await;
    let text = h.to_string();
    assert!(!text.contains("current_time"), "{text}");
    assert!(!text.contains("root never answers"), "{text}");
    // Another tree has the whole budget.
    let fresh = spawn(&gw, RPC, "spender", "another tree").await;
    let waited = ok(
        &gw,
        RPC,
        "subagent.wait",
        json!({"runIds": [fresh["runId"]], "timeoutMs": 20000}),
    )
    .await;
    assert_eq!(
        waited["results"][0]["completion"]["response"], "fresh tree",
        "{waited}"
    );
    gw.stop().await;
}

pub(crate) const PROFILED: &str = r#"
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "profiled"
        steps:
          - toolCalls: [{name: save_file, arguments: {path: one.txt, content: x}}]
            delayMs: 1500
            usage: {input: 5, output: 5}
          - toolCalls: [{name: my_capabilities}]
            usage: {input: 5, output: 5}
          - reply: "kept running"
            usage: {input: 5, output: 5}
agents:
  builder: {model: script/m1, tools: [save_file, current_time, "group:agents"], maxSteps: 6}
  plain: {model: script/m1, tools: [save_file, current_time, "group:agents"], maxSteps: 6}
autonomy:
  treeBudget: {maxTokens: 1000}
  profiles:
    default: {tools: [current_time, my_capabilities]}
    build: {agents: [builder], tools: [save_file], treeBudget: {maxTokens: 100000}}
"#;

/// The tool results of a run's session, in order.
pub(crate) async fn tool_results(gw: &Gateway, key: &Value) -> Vec<String> {
    let h = history(gw, key).await;
    h["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("{h}"))
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// `autonomy.profiles` and `autonomy.evict`: a tree of an agent in a named profile may call
/// what the profile adds and spend its budget; evicted while its first model call is in
/// flight, the same tree is refused the added tool at its next gate decision, sees default's
/// budget, and is not stopped (it answers and completes). A tree of an agent in no profile
/// works under default from the start. Evict is admin-only, strict about its param, and says
/// when a root was already marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_tree_drops_to_the_default_profile_without_stopping() {
    let gw = start(PROFILED).await;
    let evicted = spawn(&gw, RPC, "builder", "profiled").await;
    let kept = spawn(&gw, RPC, "builder", "profiled").await;
    let plain = spawn(&gw, RPC, "plain", "profiled").await;
    let root = evicted["runId"].as_str().unwrap();
    until_running(&gw, root, 1).await;

    let r = gw
        .call(RPC, "autonomy.evict", json!({"rootRunId": root}))
        .await;
    assert_eq!(code(&r), -32603, "admin only: {r}");
    let marked = ok(&gw, ADMIN, "autonomy.evict", json!({"rootRunId": root})).await;
    assert_eq!(
        marked,
        json!({"evicted": true, "rootRunId": root, "alreadyEvicted": false})
    );
    let again = ok(&gw, ADMIN, "autonomy.evict", json!({"rootRunId": root})).await;
    assert_eq!(again["alreadyEvicted"], true);
    for bad in [
        json!({}),
        json!({"rootRunId": ""}),
        json!({"rootRunId": "r".repeat(129)}),
    ] {
        let r = gw.call(ADMIN, "autonomy.evict", bad).await;
        assert_eq!(code(&r), -32602, "{r}");
    }
    let unknown = ok(
        &gw,
        ADMIN,
        "autonomy.evict",
        json!({"rootRunId": "r".repeat(128)}),
    )
    .await;
    assert_eq!(
        unknown["alreadyEvicted"], false,
        "an unknown root is marked"
    );

    let ids: Vec<&Value> = [&evicted, &kept, &plain].map(|r| &r["runId"]).to_vec();
    let waited = ok(
        &gw,
        ADMIN,
        "subagent.wait",
        json!({"runIds": ids, "timeoutMs": 20000}),
    )
    .await;
    for r in waited["results"].as_array().unwrap() {
        assert_eq!(r["status"], "completed", "not stopped: {waited}");
        assert_eq!(r["completion"]["response"], "kept running", "{waited}");
    }
    let caps = |results: &[String]| -> Value { serde_json::from_str(&results[1]).unwrap() };

    // Evicted: the added tool refused, default's tools and budget (1000 - 2 calls of 10).
    let results = tool_results(&gw, &evicted["sessionKey"]).await;
    assert!(
        results[0].contains("not within this run's capabilities"),
        "{results:?}"
    );
    let c = caps(&results);
    assert_eq!(c["caps"], json!(["current_time", "my_capabilities"]), "{c}");
    assert_eq!(c["budget"]["tokensRemaining"], 980, "{c}");

    // Never evicted: the profile's tool ran and its budget applies.
    let results = tool_results(&gw, &kept["sessionKey"]).await;
    assert!(!results[0].contains("not within"), "{results:?}");
    let c = caps(&results);
    assert_eq!(
        c["caps"],
        json!(["current_time", "my_capabilities", "save_file"]),
        "{c}"
    );
    assert_eq!(c["budget"]["tokensRemaining"], 99_980, "{c}");

    // An agent in no profile: default from the start.
    let results = tool_results(&gw, &plain["sessionKey"]).await;
    assert!(
        results[0].contains("not within this run's capabilities"),
        "{results:?}"
    );
    assert_eq!(caps(&results)["budget"]["tokensRemaining"], 980);
    gw.stop().await;
}
