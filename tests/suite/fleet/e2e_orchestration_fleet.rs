//! Run trees on a two-node PostgreSQL fleet: a kill, a revocation, a steering message, a
//! spawn pause and an approval decided on node A reach the run that node B holds.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::*;
use crate::engine::e2e_orchestration::{spawn, tree_of, until_running, TREE};

async fn wait(gw: &Gateway, run_id: &str) -> serde_json::Value {
    let w = ok(
        gw,
        ADMIN,
        "subagent.wait",
        json!({"runIds": [run_id], "timeoutMs": 15000}),
    )
    .await;
    w["results"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stops_steering_pause_and_approvals_reach_the_node_that_holds_the_run() {
    let url = crate::pg::database().await;
    let config = format!(
        "{TREE}autonomy:\n  approvals:\n    tools: [session_notes]\n    timeoutSeconds: 60\n"
    );
    let a = start_on(&url, &config).await;
    let b = start_on(&url, &config).await;

    // A three-level tree on B, killed from A.
    let root = spawn(&b, ADMIN, "boss", "level one").await;
    let root_id = root["runId"].as_str().unwrap().to_owned();
    until_running(&b, &root_id, 3).await;
    let t = Instant::now();
    let killed = ok(&a, ADMIN, "run.kill", json!({"rootRunId": root_id})).await;
    assert_eq!(killed, json!({"killed": 3, "leasesRevoked": 3}));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let runs = tree_of(&a, &root_id).await;
    assert_eq!(runs.len(), 3);
    for r in &runs {
        assert_eq!(r["status"], "killed", "{r}");
    }

    // A lease of a run on B, revoked from A by its id.
    let run = spawn(&b, ADMIN, "leaf", "revocable").await;
    let run_id = run["runId"].as_str().unwrap().to_owned();
    let lease = until_running(&b, &run_id, 1).await[0]["leaseId"]
        .as_str()
        .unwrap()
        .to_owned();
    let revoked = ok(&a, ADMIN, "lease.revoke", json!({"leaseId": lease})).await;
    assert_eq!(revoked["revoked"], 1);
    let done = wait(&a, &run_id).await;
    assert_eq!(done["completion"]["status"], "revoked", "{done}");

    // A steering message sent to A for a run on B.
    let run = spawn(&b, ADMIN, "leaf", "slow child").await;
    let run_id = run["runId"].as_str().unwrap().to_owned();
    until_running(&b, &run_id, 1).await;
    let steered = ok(
        &a,
        ADMIN,
        "subagent.steer",
        json!({"target": run_id, "message": "STEER: from node A"}),
    )
    .await;
    assert_eq!(steered["status"], "steered_inject");
    let done = wait(&a, &run_id).await;
    assert_eq!(done["completion"]["response"], "steered ok", "{done}");

    // Spawning paused on A is paused on B.
    let paused = ok(&a, ADMIN, "subagent.pause", json!({})).await;
    assert_eq!(paused["changed"], true);
    let deadline = Instant::now() + STEP;
    loop {
        let r = b
            .call(
                ADMIN,
                "session.spawn",
                json!({"agent": "leaf", "task": "quick three"}),
            )
            .await;
        if code(&r) == -32002 {
            break;
        }
        assert!(Instant::now() < deadline, "B still spawns: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ok(&a, ADMIN, "subagent.resume", json!({})).await;
    let deadline = Instant::now() + STEP;
    while ok(&b, ADMIN, "subagent.status", json!({})).await["paused"] == true {
        assert!(Instant::now() < deadline, "B stays paused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A tool call waiting on B, approved on A.
    let run = spawn(&b, ADMIN, "leaf", "ask approval").await;
    let run_id = run["runId"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + STEP;
    let id = loop {
        let p = ok(&a, ADMIN, "admin.approval.pending", json!({})).await;
        if let Some(r) = p["requests"].as_array().unwrap().first() {
            assert_eq!(r["sessionKey"], run["sessionKey"]);
            break r["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "no request");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    ok(
        &a,
        ADMIN,
        "admin.approval.resolve",
        json!({"id": id, "approved": true}),
    )
    .await;
    let done = wait(&a, &run_id).await;
    assert_eq!(done["completion"]["response"], "approved path", "{done}");
}

/// `autonomy.evict` on node A reaches the tree node B holds: evicted while its first model
/// call is in flight, the tree is refused its profile's tool at its next gate decision on B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_on_one_node_reaches_the_tree_on_another() {
    use crate::engine::e2e_orchestration::{tool_results, PROFILED};
    let url = crate::pg::database().await;
    let a = start_on(&url, PROFILED).await;
    let b = start_on(&url, PROFILED).await;
    let run = spawn(&b, RPC, "builder", "profiled").await;
    let run_id = run["runId"].as_str().unwrap().to_owned();
    until_running(&b, &run_id, 1).await;
    let marked = ok(&a, ADMIN, "autonomy.evict", json!({"rootRunId": run_id})).await;
    assert_eq!(marked["alreadyEvicted"], false, "{marked}");
    let done = wait(&a, &run_id).await;
    assert_eq!(done["status"], "completed", "not stopped: {done}");
    let results = tool_results(&b, &run["sessionKey"]).await;
    assert!(
        results[0].contains("not within this run's capabilities"),
        "{results:?}"
    );
}

/// On PostgreSQL too, a stop ends a webhook run still waiting for its slot (`runs_end_queued`
/// in one statement on either store): `run.kill` and `lease.revoke` each end one queued run,
/// which then never starts, while the queued run nobody stopped runs once the slot frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_a_queued_run_on_postgresql() {
    let url = crate::pg::database().await;
    let config = crate::http::e2e_webhooks::one_slot_jobs(1500);
    let gw = start_on(&url, &config).await;
    let hook = |kind: &str| {
        let body = json!({"kind": kind});
        let url = gw.url("/hooks/any");
        async move {
            let r = reqwest::Client::new()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    };
    let runs = || async {
        ok(&gw, ADMIN, "subagent.list", json!({})).await["runs"]
            .as_array()
            .unwrap()
            .clone()
    };
    let find = |runs: &[serde_json::Value], kind: &str| {
        runs.iter()
            .find(|r| {
                r["task"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(&format!("{kind} job"))
            })
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} job: {runs:?}"))
    };
    hook("slow").await;
    let deadline = Instant::now() + STEP;
    while find(&runs().await, "slow")["status"] != "running" {
        assert!(Instant::now() < deadline, "slow job not running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for kind in ["killed", "revoked", "kept"] {
        hook(kind).await;
    }
    let queued = runs().await;
    for (method, kind) in [("run.kill", "killed"), ("lease.revoke", "revoked")] {
        let run = find(&queued, kind);
        assert_eq!(run["status"], "queued", "{run}");
        let r = ok(&gw, ADMIN, method, json!({"rootRunId": run["runId"]})).await;
        assert_eq!(r[kind], 1, "{method}: {r}");
    }
    let kept = find(&queued, "kept");
    let done = wait(&gw, kept["runId"].as_str().unwrap()).await;
    assert_eq!(done["completion"]["response"], "done", "{done}");
    let after = runs().await;
    for kind in ["killed", "revoked"] {
        let run = find(&after, kind);
        assert_eq!(run["status"], kind, "{run}");
    }
}

/// `graph.cancel` on node A reaches the graph run node B executes: A stores the request, B's
/// executor reads it within half a second, stops the running agent node (its run is killed) and
/// never starts the next; A answers once the run's final status is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_cancel_on_one_node_reaches_the_run_on_another() {
    let url = crate::pg::database().await;
    let a = start_on(&url, TREE).await;
    let b = start_on(&url, TREE).await;
    // A sees the node running through the stored record.
    let run_id = slow_graph_on(&b, &a, json!({})).await;
    let t = Instant::now();
    let cancelled = ok(&a, RPC, "graph.cancel", json!({"runId": run_id})).await;
    assert_eq!(
        cancelled,
        json!({"runId": run_id, "cancelled": true, "status": "cancelled"})
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let detail = ok(&a, RPC, "graph.runDetail", json!({"runId": run_id})).await;
    assert_eq!(detail["run"]["status"], "cancelled", "{detail}");
    assert_eq!(detail["nodes"][0]["status"], "cancelled", "{detail}");
    assert_eq!(detail["nodes"][1]["status"], "cancelled", "{detail}");
    let outputs = ok(&a, RPC, "graph.outputs", json!({"runId": run_id})).await;
    assert_eq!(outputs["source"], "stored");
    assert_eq!(outputs["outputs"], json!({}));
    // The agent node's run, below the graph's root, was killed on B.
    let runs = tree_of(&a, &run_id).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["status"], "killed", "{}", runs[0]);
}

/// Executes on `runner` a graph whose slow agent node feeds a transform (with `settings`), and
/// waits until `watcher` sees that node running (from the stored record when it is another
/// node); answers the run id.
async fn slow_graph_on(runner: &Gateway, watcher: &Gateway, settings: serde_json::Value) -> String {
    let started = ok(
        runner,
        RPC,
        "graph.execute",
        json!({
            "settings": settings,
            "nodes": [
                {"id": "slow", "type": "agent", "agentId": "leaf", "config": {"prompt": "level three"}},
                {"id": "after", "type": "transform", "config": {"template": "{{slow.output}}"}}
            ],
            "edges": [{"from": "slow", "to": "after"}]
        }),
    )
    .await;
    let run_id = started["runId"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let st = ok(watcher, RPC, "graph.status", json!({"runId": run_id})).await;
        if st["runs"][0]["nodes"][0]["status"] == "running" {
            return run_id;
        }
        assert!(Instant::now() < deadline, "not running: {st}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `run.kill` of a graph's root on node A while node B runs it: the graph ends `cancelled`
/// (as with graph.cancel), not failed over its killed node, and its node's run is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_kill_on_one_node_cancels_a_graph_running_on_another() {
    let url = crate::pg::database().await;
    let a = start_on(&url, TREE).await;
    let b = start_on(&url, TREE).await;
    let run_id = slow_graph_on(&b, &a, json!({"maxRetries": 2})).await;
    let t = Instant::now();
    let k = ok(&a, ADMIN, "run.kill", json!({"rootRunId": run_id})).await;
    assert_eq!(k["killed"], 1, "the node's run, on B: {k}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let detail = loop {
        let d = ok(&a, RPC, "graph.runDetail", json!({"runId": run_id})).await;
        if d["run"]["status"] != "running" && d["run"]["status"] != "pending" {
            break d;
        }
        assert!(Instant::now() < deadline, "never ended: {d}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(detail["run"]["status"], "cancelled", "{detail}");
    assert_eq!(detail["nodes"][0]["status"], "cancelled", "{detail}");
    assert_eq!(detail["nodes"][1]["status"], "cancelled", "{detail}");
    // Killed, and not retried (maxRetries 2): one run below the graph's root.
    let runs = tree_of(&a, &run_id).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["status"], "killed", "{}", runs[0]);
}
