//! Run trees on the release binary (issue 30): asynchronous spawns per second with instant
//! scripted steps, registry memory per live run, `run.kill` of a 50-run three-level tree, and
//! the wake-up of 100 `subagent.wait` callers. `--gate N` instead runs N gate decisions
//! in-process (for callgrind: instructions per decision). See README.md.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "a bench: its tasks end before main returns"
)]

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[path = "../ws_idle/gateway.rs"]
mod gateway;
use gateway::{rss_kib, spawn_with, Gateway, TOKEN};

const BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");

/// Memory of the run registry per live run: `n` runs registered the way a spawn registers
/// them (children of one root, ids and names of a real run's length) in this process, its RSS
/// before and after, divided by `n` (no task, turn or session: the registry's share alone).
fn registry(n: usize) {
    use agent_gateway::runtime::tree::{Placement, RunTree};
    let tree = RunTree::default();
    let plain = || agent_gateway::runtime::profiles::TreeProfile::plain(&Default::default());
    let root = tree.register(Placement {
        run_id: format!("run_{}", "0".repeat(32)),
        parent: None,
        agent_id: "researcher",
        client_id: "client-a",
        scopes: Default::default(),
        tools: None,
        denial_threshold: 3,
        timeout: None,
        profile: plain(),
    });
    // The handles the bench keeps (a spawn's task keeps one too) are allocated up front.
    let mut runs = Vec::with_capacity(n);
    let before = rss_kib(std::process::id());
    for i in 0..n {
        runs.push(tree.register(Placement {
            run_id: format!("run_{i:032x}"),
            parent: Some(&root),
            agent_id: "researcher",
            client_id: "client-a",
            scopes: Default::default(),
            tools: None,
            denial_threshold: 3,
            timeout: Some(Duration::from_secs(600)),
            profile: plain(),
        }));
    }
    let after = rss_kib(std::process::id());
    println!(
        "registry: RSS {before} KiB -> {after} KiB with {n} live runs registered: {:.2} KiB per live run",
        after.saturating_sub(before) as f64 / n as f64
    );
    drop(runs);
}

/// The gateway with the scripted agents of the scenarios: a root that spawns 7 mids, each
/// spawning 6 leaves (1 + 7 + 42 = 50 runs in three levels), and the single-step tasks.
async fn start() -> Gateway {
    let mids = (0..7)
        .map(|i| format!("{{name: spawn_agent, arguments: {{task: \"mid {i}\", agent: mid}}}}"))
        .collect::<Vec<_>>()
        .join(", ");
    let leaves = (0..6)
        .map(|i| format!("{{name: spawn_agent, arguments: {{task: \"leaf {i}\", agent: leaf}}}}"))
        .collect::<Vec<_>>()
        .join(", ");
    let gateway = "  limits: {maxConcurrentTurnsPerClient: 100000, maxConcurrentTurns: 100000}\n";
    let sections = format!(
        "providers:\n  s:\n    type: scripted\n    models: [m]\n    script:\n\
         \x20     - match: \"root\"\n        steps:\n          - toolCalls: [{mids}]\n          - toolCalls: [{{name: wait_agents, arguments: {{timeoutMs: 600000}}}}]\n          - reply: done\n\
         \x20     - match: \"mid\"\n        steps:\n          - toolCalls: [{leaves}]\n          - toolCalls: [{{name: wait_agents, arguments: {{timeoutMs: 600000}}}}]\n          - reply: done\n\
         \x20     - match: \"leaf\"\n        steps:\n          - reply: never\n            delayMs: 600000\n\
         \x20     - match: \"slow\"\n        steps:\n          - reply: slow done\n            delayMs: 600000\n\
         \x20     - match: \"timed\"\n        steps:\n          - reply: timed done\n            delayMs: 1500\n\
         \x20     - steps:\n          - reply: instant\n\
         agents:\n  default: {{model: s/m}}\n  root: {{model: s/m, tools: [\"group:agents\"], maxSteps: 4}}\n  \
         mid: {{model: s/m, tools: [\"group:agents\"], maxSteps: 4}}\n  leaf: {{model: s/m}}\n\
         autonomy:\n  subagents: {{maxDepth: 3, maxChildrenPerRun: 10, maxConcurrent: 100000}}\n"
    );
    spawn_with(Path::new(BIN), gateway, &sections).await
}

async fn rpc(client: &reqwest::Client, port: u16, method: &str, params: Value) -> Value {
    let v: Value = client
        .post(format!("http://127.0.0.1:{port}/rpc"))
        .bearer_auth(TOKEN)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v.get("result")
        .cloned()
        .unwrap_or_else(|| panic!("{method}: {v}"))
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Spawns `n` runs of `task` from 16 concurrent clients; their ids.
async fn spawn_many(client: &reqwest::Client, port: u16, n: usize, task: &str) -> Vec<String> {
    let per = n / 16;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (client, task) = (client.clone(), task.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..per {
                let r = rpc(
                    &client,
                    port,
                    "session.spawn",
                    json!({"agent": "default", "task": task, "async": true}),
                )
                .await;
                ids.push(r["runId"].as_str().unwrap().to_owned());
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await.unwrap());
    }
    ids
}

async fn all_ended(client: &reqwest::Client, port: u16, ids: &[String]) {
    for chunk in ids.chunks(100) {
        let w = rpc(
            client,
            port,
            "subagent.wait",
            json!({"runIds": chunk, "timeoutMs": 600000}),
        )
        .await;
        for r in w["results"].as_array().unwrap() {
            assert_ne!(r["status"], "timeout", "{r}");
        }
    }
}

/// N gate decisions on a live run in-process (no approval policy): run under callgrind and
/// divide.
fn gate(n: u64) {
    use agent_gateway::runtime::tree::{Gate, Placement, RunTree};
    let tree = RunTree::default();
    let run = tree.register(Placement {
        run_id: "run_bench".into(),
        parent: None,
        agent_id: "a",
        client_id: "c",
        scopes: Default::default(),
        tools: None,
        denial_threshold: 3,
        timeout: None,
        profile: agent_gateway::runtime::profiles::TreeProfile::plain(&Default::default()),
    });
    let mut allowed = 0u64;
    for _ in 0..n {
        if std::hint::black_box(run.gate(std::hint::black_box("current_time"), None, true))
            == Gate::Allowed
        {
            allowed += 1;
        }
    }
    println!("{allowed} of {n} gate decisions allowed");
}

/// A graph of `n` nodes: a chain of transforms, each rendering its predecessor's output, with
/// a condition every tenth node whose edge onwards carries a second condition.
fn graph_nodes(n: usize) -> (Vec<Value>, Vec<Value>) {
    let mut nodes = Vec::with_capacity(n);
    let mut edges = Vec::with_capacity(n);
    for i in 0..n {
        let node = if i > 0 && i % 10 == 0 {
            json!({"id": format!("n{i}"), "type": "condition",
                   "config": {"expression": "size(output) >= 0 && vars.mode != 'off'"}})
        } else if i == 0 {
            json!({"id": "n0", "type": "transform", "config": {"template": "start {{mode}}"}})
        } else {
            json!({"id": format!("n{i}"), "type": "transform",
                   "config": {"template": format!("{{{{n{}.output}}}}.", i - 1)}})
        };
        nodes.push(node);
        if i > 0 {
            let mut e = json!({"from": format!("n{}", i - 1), "to": format!("n{i}")});
            if i % 10 == 1 && i > 1 {
                e["condition"] = json!("output == 'true'");
            }
            edges.push(e);
        }
    }
    (nodes, edges)
}

/// `graph.define`'s check of an `n`-node definition in-process, `rounds` times: its median
/// and worst time.
fn define(n: usize, rounds: usize) {
    use agent_gateway::runtime::graph::definition::{check, Env, Source};
    let (nodes, edges) = graph_nodes(n);
    let src = Source {
        nodes: serde_json::from_value(Value::Array(nodes)).unwrap(),
        edges: serde_json::from_value(Value::Array(edges)).unwrap(),
        ..Source::default()
    };
    let env = Env {
        agents: ["default".to_owned()].into(),
        default_agent: Some("default".to_owned()),
        node_timeout_ms: 600_000,
        run_timeout_ms: 3_600_000,
        ..Env::default()
    };
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let checked = std::hint::black_box(check(&src, &env));
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        assert!(checked.errors.is_empty(), "{:?}", checked.errors);
    }
    println!(
        "graph.define check of {n} nodes ({} CEL expressions): p50 {:.2} ms, max {:.2} ms",
        (n.saturating_sub(1) / 10) * 2 - usize::from(n % 10 == 1),
        percentile(times.clone(), 0.5),
        percentile(times, 1.0)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--registry") {
        registry(
            args.get(i + 1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(100_000),
        );
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--define") {
        let n = args.get(i + 1).and_then(|n| n.parse().ok()).unwrap_or(1000);
        // The CEL parser needs a large stack (as on the gateway's compile thread).
        std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(move || define(n, 20))
            .unwrap()
            .join()
            .unwrap();
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--gate") {
        gate(
            args.get(i + 1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(1_000_000),
        );
        return;
    }
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let gw = start().await;
    let port = gw.port;
    let client = reqwest::Client::new();

    // 1. 1000 asynchronous spawns with an instant step: runs per second until all ended.
    let t = Instant::now();
    let ids = spawn_many(&client, port, 1008, "instant").await;
    all_ended(&client, port, &ids).await;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "spawns: {} runs spawned and ended in {secs:.3} s: {:.0} runs/s",
        ids.len(),
        ids.len() as f64 / secs
    );

    // 2. Memory per live run: 1000 runs in a long model call.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(gw.child.id());
    let live = spawn_many(&client, port, 1008, "slow").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(gw.child.id());
    println!(
        "memory: RSS {before} KiB -> {after} KiB with {} live runs: {:.1} KiB per live run (whole process: task, turn, session, registry)",
        live.len(),
        (after.saturating_sub(before)) as f64 / live.len() as f64
    );
    for id in &live {
        rpc(&client, port, "run.kill", json!({"rootRunId": id})).await;
    }

    // 3. run.kill of a 50-run three-level tree.
    let mut kills = Vec::new();
    for _ in 0..rounds {
        let root = rpc(
            &client,
            port,
            "session.spawn",
            json!({"agent": "root", "task": "root", "async": true}),
        )
        .await["runId"]
            .as_str()
            .unwrap()
            .to_owned();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let st = rpc(&client, port, "subagent.status", json!({})).await;
            if st["runningRuns"] == 49 {
                break;
            }
            assert!(Instant::now() < deadline, "tree not built: {st}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let t = Instant::now();
        let k = rpc(&client, port, "run.kill", json!({"rootRunId": root})).await;
        kills.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(k["killed"], 50, "{k}");
    }
    println!(
        "run.kill of 50 runs in three levels ({rounds} trees, answered once all are terminal): p50 {:.2} ms, p99 {:.2} ms",
        percentile(kills.clone(), 0.5),
        percentile(kills, 0.99)
    );

    // 4. 100 waiters on one run that ends.
    let mut wakes = Vec::new();
    for _ in 0..(rounds / 4).max(2) {
        let run = rpc(
            &client,
            port,
            "session.spawn",
            json!({"agent": "default", "task": "timed", "async": true}),
        )
        .await["runId"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut waiters = Vec::new();
        for _ in 0..100 {
            let (client, run) = (client.clone(), run.clone());
            waiters.push(tokio::spawn(async move {
                let w = rpc(
                    &client,
                    port,
                    "subagent.wait",
                    json!({"runIds": [run], "timeoutMs": 60000}),
                )
                .await;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as f64;
                now - w["results"][0]["completion"]["completedAt"]
                    .as_f64()
                    .unwrap()
            }));
        }
        for w in waiters {
            wakes.push(w.await.unwrap());
        }
    }
    println!(
        "100 waiters per run ({} waits): woken after the run's end p50 {:.1} ms, p99 {:.1} ms (millisecond clock)",
        wakes.len(),
        percentile(wakes.clone(), 0.5),
        percentile(wakes, 0.99)
    );

    // 5. Executor overhead: a 200-node graph of transforms and conditions (no model call),
    // per node from the run's own start and end.
    let (nodes, edges) = graph_nodes(200);
    let mut per_node = Vec::new();
    for _ in 0..rounds {
        let run = rpc(
            &client,
            port,
            "graph.execute",
            json!({"nodes": nodes, "edges": edges, "variables": {"mode": "on"},
                   "settings": {"maxConcurrency": 4}}),
        )
        .await["runId"]
            .as_str()
            .unwrap()
            .to_owned();
        let deadline = Instant::now() + Duration::from_secs(30);
        let summary = loop {
            let st = rpc(&client, port, "graph.status", json!({"runId": run})).await;
            let summary = st["runs"][0]["run"].clone();
            if summary["status"] != "running" && summary["status"] != "pending" {
                break summary;
            }
            assert!(Instant::now() < deadline, "graph not done: {summary}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(summary["status"], "completed", "{summary}");
        per_node.push(summary["durationMs"].as_f64().unwrap() * 1000.0 / 200.0);
    }
    println!(
        "graph executor, 200 transform and condition nodes ({rounds} runs, millisecond clock): per node p50 {:.1} us, max {:.1} us",
        percentile(per_node.clone(), 0.5),
        percentile(per_node, 1.0)
    );
    drop(gw);
}
