//! The capability socket from outside: its file modes, a wake gate (a Python client on the
//! stdlib `socket`) calling `tool.invoke` with the lease it was given, each refusal in the
//! spec's order (lease, denylist with and without `adminTrust`, capability), the routes to a
//! built-in tool and to a method, the fire's `toolCalls`, the line limit, and `tool.invoke`
//! staying -32601 on /rpc.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::common::*;

/// The gate: calls `tool.invoke` once per entry of argv[2] (`[tool, args|null, useLease]`),
/// writes the lease and every answer to argv[1], then skips the fire (exit 10).
const CLIENT: &str = r#"#!/usr/bin/env python3
import json, os, socket, sys
path = os.environ["AGENT_GATEWAY_CAPABILITY_SOCKET"]
lease = os.environ["AGENT_GATEWAY_LEASE"]
answers = []
for i, (tool, args, use_lease) in enumerate(json.loads(sys.argv[2])):
    params = {"lease": lease if use_lease else "lt_" + "0" * 64, "tool": tool}
    if args is not None:
        params["args"] = args
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    f = s.makefile("rwb")
    f.write((json.dumps({"jsonrpc": "2.0", "id": i, "method": "tool.invoke", "params": params}) + "\n").encode())
    f.flush()
    answers.append(json.loads(f.readline()))
    s.close()
with open(sys.argv[1], "w") as out:
    json.dump({"lease": lease, "socket": path, "answers": answers}, out)
sys.exit(10)
"#;

fn job(name: &str, agent: &str, out: &std::path::Path, calls: &Value) -> String {
    format!(
        "    {name}:\n      agentId: {agent}\n      message: report\n      enabled: false\n      schedule: {{kind: interval, everyMs: 3600000}}\n      wakeGate: {{script: gates/client.py, args: ['{}', '{}']}}\n",
        out.display(),
        calls
    )
}

fn message(v: &Value) -> &str {
    v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {v}"))
}

/// Waits for `name`'s first recorded fire.
async fn fired(gw: &Gateway, name: &str) -> Value {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let v = gw.call(ADMIN, "cron.runs", json!({"jobName": name})).await;
        if let Some(run) = v["result"]["runs"].get(0) {
            return run.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "{name} never fired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One request line on a fresh connection; its answer line.
async fn ask(socket: &std::path::Path, line: &str) -> Value {
    let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    let (rd, mut wr) = stream.into_split();
    wr.write_all(format!("{line}\n").as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(STEP, BufReader::new(rd).read_line(&mut answer))
        .await
        .unwrap()
        .unwrap();
    serde_json::from_str(&answer).unwrap()
}

#[tokio::test]
async fn a_wake_gate_calls_tools_through_the_capability_socket_checked_in_the_specs_order() {
    let outs = tempfile::tempdir().unwrap();
    let (checks, trusted, one) = (
        outs.path().join("checks.json"),
        outs.path().join("trusted.json"),
        outs.path().join("one.json"),
    );
    let calls = json!([
        ["current_time", {}, true],
        ["current_time", {}, false],
        ["run.kill", {"rootRunId": "run_x"}, true],
        ["admin.approval.pending", {}, true],
        ["tool.invoke", {}, true],
        ["save_file", {"fileName": "a.txt", "content": "x"}, true],
        ["system.ping", {}, true],
        ["no_such_tool", null, true],
        ["current_time", {"extra": 1}, true]
    ]);
    let trusted_calls = json!([
        ["run.kill", {"rootRunId": "run_x"}, true],
        ["tool.invoke", {}, true],
        ["admin.approval.pending", {}, true]
    ]);
    let config = format!(
        r#"providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "report"
        steps:
          - reply: "done"
agents:
  default: {{model: script/m1, maxSteps: 2, tools: [current_time]}}
  trusted: {{model: script/m1, maxSteps: 2, tools: [current_time], adminTrust: true}}
scheduler:
  jobs:
{}{}{}"#,
        job("checks", "default", &checks, &calls),
        job("trusted", "trusted", &trusted, &trusted_calls),
        job("one", "default", &one, &json!([["current_time", {}, true]])),
    );
    let gw = start(&config).await;
    let data = gw.dir.path().join("data");
    let socket = data.join("capability.sock");
    // The socket is bound as the generation starts serving.
    let deadline = tokio::time::Instant::now() + STEP;
    while !socket.exists() {
        assert!(tokio::time::Instant::now() < deadline, "no socket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700, "the data directory");
    assert_eq!(mode(&socket), 0o600, "the socket");

    for agent in ["default", "trusted"] {
        let gates = data.join("workspaces").join(agent).join("gates");
        std::fs::create_dir_all(&gates).unwrap();
        let p = gates.join("client.py");
        std::fs::write(&p, CLIENT).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for name in ["checks", "trusted", "one"] {
        ok(&gw, ADMIN, "cron.run", json!({"name": name})).await;
    }

    // The untrusted agent's gate: one answer per call, in the spec's order of checks.
    let fire = fired(&gw, "checks").await;
    assert_eq!(fire["status"], "skipped", "{fire}");
    let out: Value = serde_json::from_str(&std::fs::read_to_string(&checks).unwrap()).unwrap();
    let a = out["answers"].as_array().unwrap();
    assert_eq!(out["socket"], socket.display().to_string());
    assert!(out["lease"].as_str().unwrap().starts_with("lt_"));
    assert_eq!(a[0]["result"]["routedTo"], "builtin", "{}", a[0]);
    assert_eq!(a[0]["result"]["tool"], "current_time");
    let time: Value = serde_json::from_str(a[0]["result"]["result"].as_str().unwrap()).unwrap();
    assert!(time["epochMs"].as_i64().unwrap() > 0);
    assert_eq!(code(&a[1]), -32603);
    assert!(message(&a[1]).starts_with("lease: "), "{}", a[1]);
    for (i, what) in [
        (2, "run.kill"),
        (3, "admin.approval.pending"),
        (4, "tool.invoke"),
    ] {
        assert_eq!(code(&a[i]), -32603, "{what}");
        assert!(message(&a[i]).starts_with("denylist: "), "{what}: {}", a[i]);
    }
    assert_eq!(code(&a[5]), -32603);
    assert!(message(&a[5]).starts_with("capability: "), "{}", a[5]);
    assert_eq!(a[6]["result"]["routedTo"], "rpc", "{}", a[6]);
    assert_eq!(a[6]["result"]["tool"], "system.ping");
    assert_eq!(code(&a[7]), -32601, "{}", a[7]);
    assert_eq!(code(&a[8]), -32602, "{}", a[8]);
    // Every call its lease authenticated counts (the bad-lease call is not its lease's).
    assert_eq!(fire["toolCalls"], 8, "{fire}");
    // The gate's run, as obs.explain of the job's session reports it (`orchestrate`): its
    // lease, exit code (the skip code is a decision: success), calls grouped by tool,
    // capability and decision, and the results the socket returned.
    let gate_run = fire["gate"]["runId"].as_str().unwrap().to_owned();
    assert!(gate_run.starts_with("gate_"), "{fire}");
    let session = format!(
        "agent:default:cron:cron%3Aconfig:{}",
        fire["jobId"].as_str().unwrap()
    );
    let report = ok(&gw, ADMIN, "obs.explain", json!({"sessionKey": session})).await;
    assert_eq!(report["reference"]["resolved"], true, "{report}");
    let o = &report["orchestrate"][0];
    assert_eq!(o["runId"], gate_run.as_str(), "{report}");
    assert_eq!(o["leaseId"], format!("lease_{gate_run}"));
    assert_eq!(
        (&o["outcome"], &o["exitCode"], o.get("failureClass")),
        (&json!("success"), &json!(10), None),
        "{o}"
    );
    let groups: Vec<(String, String, String, i64)> = o["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["tool"].as_str().unwrap().to_owned(),
                g["capability"].as_str().unwrap().to_owned(),
                g["decision"].as_str().unwrap().to_owned(),
                g["count"].as_i64().unwrap(),
            )
        })
        .collect();
    let has = |tool: &str, cap: &str, decision: &str, n: i64| {
        assert!(
            groups.contains(&(tool.into(), cap.into(), decision.into(), n)),
            "{tool} {cap} {decision} x{n} not in {groups:?}"
        );
    };
    has("current_time", "tool:current_time", "allowed", 1);
    has("current_time", "tool:current_time", "denied", 1);
    has("save_file", "tool:save_file", "denied", 1);
    has("admin.approval.pending", "scope:admin", "denied", 1);
    has("no_such_tool", "none", "denied", 1);
    assert_eq!(groups.iter().map(|g| g.3).sum::<i64>(), 8, "{groups:?}");
    assert_eq!(o["resultRefs"]["count"], 2, "current_time and system.ping");
    assert!(o["resultRefs"]["bytes"].as_i64().unwrap() > 10, "{o}");
    let gate = &report["cronWakeGate"];
    assert_eq!(
        (&gate["wake"], &gate["toolCalls"]),
        (&json!(false), &json!(8)),
        "{report}"
    );
    // A gate whose every fire skipped has no turn: its session resolves to its gate runs.
    assert_eq!(report["timing"]["turnCount"], 0);
    assert!(
        activity(&gw).await.contains(&session),
        "the session key of the fires"
    );

    // With adminTrust (and a job of the file), the gate holds scope admin: the control
    // method and an admin method run; tool.invoke stays denied.
    let fire = fired(&gw, "trusted").await;
    let out: Value = serde_json::from_str(&std::fs::read_to_string(&trusted).unwrap()).unwrap();
    let a = out["answers"].as_array().unwrap();
    assert_eq!(a[0]["result"]["routedTo"], "rpc", "{}", a[0]);
    assert_eq!(
        a[0]["result"]["result"]["killed"], 0,
        "an unknown root: {}",
        a[0]
    );
    assert!(message(&a[1]).starts_with("denylist: "), "{}", a[1]);
    assert_eq!(a[2]["result"]["tool"], "admin.approval.pending", "{}", a[2]);
    assert!(a[2]["result"]["result"].is_object(), "{}", a[2]);
    assert_eq!(fire["toolCalls"], 3, "{fire}");

    // One call, one recorded tool call.
    let fire = fired(&gw, "one").await;
    let out: Value = serde_json::from_str(&std::fs::read_to_string(&one).unwrap()).unwrap();
    assert_eq!(out["answers"][0]["result"]["routedTo"], "builtin");
    assert_eq!(fire["toolCalls"], 1, "{fire}");
    // Across the three gates 7 of 12 socket calls were refused: a fleet finding.
    let fleet = ok(&gw, ADMIN, "obs.fleet.health", json!({})).await;
    let finding = fleet["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["code"] == "orchestrate_efficiency")
        .unwrap_or_else(|| panic!("no orchestrate_efficiency finding: {fleet}"));
    assert_eq!(finding["count"], 7, "{finding}");
    assert!(
        finding["hint"].as_str().unwrap().contains("7 of 12"),
        "{finding}"
    );

    // The gate's run ended with the gate: its lease is refused now.
    let lease = out["lease"].as_str().unwrap();
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": "tool.invoke",
                     "params": {"lease": lease, "tool": "current_time"}});
    let v = ask(&socket, &req.to_string()).await;
    assert!(message(&v).starts_with("lease: "), "{v}");
    // Only tool.invoke is served; params are validated.
    let v = ask(
        &socket,
        r#"{"jsonrpc":"2.0","id":2,"method":"system.ping"}"#,
    )
    .await;
    assert_eq!(code(&v), -32601, "{v}");
    let v = ask(
        &socket,
        r#"{"jsonrpc":"2.0","id":3,"method":"tool.invoke","params":{"tool":"current_time"}}"#,
    )
    .await;
    assert_eq!(code(&v), -32602, "{v}");
    assert_eq!(v["id"], 3);

    // Audited with names and decisions, never the lease.
    let feed = activity(&gw).await;
    assert!(feed.contains("capability:audited"), "{feed}");
    assert!(feed.contains("\"check\":\"denylist\""), "{feed}");
    assert!(!feed.contains(lease), "the lease leaked into an event");

    // tool.invoke is not on the public gateway.
    let v = gw
        .call(
            ADMIN,
            "tool.invoke",
            json!({"lease": lease, "tool": "current_time"}),
        )
        .await;
    assert_eq!(code(&v), -32601, "{v}");
    let mut ws = gw.ws(ADMIN).await;
    let req = json!({"jsonrpc": "2.0", "id": 9, "method": "tool.invoke",
                     "params": {"lease": lease, "tool": "current_time"}});
    send(&mut ws, &req.to_string()).await;
    let v = recv(&mut ws).await;
    assert_eq!(code(&v), -32601, "{v}");
    drop(ws);
    gw.stop().await;
    assert!(!socket.exists(), "the socket goes with the generation");
}

/// A request line past 1 MiB is answered with an error and the connection closes; one at
/// the limit is read whole (and answered for what it is).
#[tokio::test]
async fn a_request_line_past_one_mebibyte_closes_the_connection() {
    let gw = start("").await;
    let socket = gw.dir.path().join("data/capability.sock");
    let deadline = tokio::time::Instant::now() + STEP;
    while !socket.exists() {
        assert!(tokio::time::Instant::now() < deadline, "no socket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let limit = 1 << 20;
    let head = r#"{"jsonrpc":"2.0","id":1,"method":"tool.invoke","params":{"lease":"x","tool":"current_time","args":{"pad":""#;
    let tail = r#""}}}"#;
    let at_limit = format!(
        "{head}{}{tail}",
        "a".repeat(limit - head.len() - tail.len())
    );
    assert_eq!(at_limit.len(), limit);
    let v = ask(&socket, &at_limit).await;
    assert!(message(&v).starts_with("lease: "), "{v}");

    let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let (rd, mut wr) = stream.into_split();
    let over = format!(
        "{head}{}{tail}\n",
        "a".repeat(limit + 1 - head.len() - tail.len())
    );
    // The server may close before it has read everything: a failed write is fine.
    let _ = wr.write_all(over.as_bytes()).await;
    let mut rd = BufReader::new(rd);
    let mut answer = String::new();
    tokio::time::timeout(STEP, rd.read_line(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(code(&v), -32600, "{v}");
    let mut rest = String::new();
    let n = tokio::time::timeout(STEP, rd.read_line(&mut rest))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "the connection is closed");
    gw.stop().await;
}

/// A restart's new generation serves its own socket at the same path: the old generation's
/// stop does not remove it.
#[tokio::test]
async fn the_socket_is_served_again_after_an_in_process_restart() {
    let gw = start("").await;
    let socket = gw.dir.path().join("data/capability.sock");
    let deadline = tokio::time::Instant::now() + STEP;
    while !socket.exists() {
        assert!(tokio::time::Instant::now() < deadline, "no socket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ok(&gw, ADMIN, "gateway.restart", json!({})).await;
    wait_generation(&gw, 2).await;
    let req = r#"{"jsonrpc":"2.0","id":1,"method":"tool.invoke","params":{"lease":"lt_x","tool":"current_time"}}"#;
    // The old generation's file went with it; the new one's answers (a stale file would
    // refuse the connection).
    let deadline = tokio::time::Instant::now() + STEP;
    while tokio::net::UnixStream::connect(&socket).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "no new socket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let v = ask(&socket, req).await;
    assert!(message(&v).starts_with("lease: "), "{v}");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    gw.stop().await;
    assert!(!socket.exists());
}
