//! Graphs (`docs/graphs.md`, `catalogue/methods/graph.yaml`) end to end over JSON-RPC on
//! loopback, as a client and as an attacker use them: validation codes, a run through every
//! node kind with variables, conditions and a merge, cancelling mid-node, retries and both
//! failure policies, timeouts and budgets, approvals and `run.kill` of a graph's run tree,
//! saved definitions, ownership between two tenants (and admin), the `graph:*` events on
//! `/api/events`, and the records across a kill -9 of the real binary.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::common::*;

/// A second `rpc` tenant (token id `bob`); `RPC` is the first one (token id `client`).
const BOB: &str = "bob-secret-0123456789abcdefghijklmnopqrstuvwxyz";

/// Agents on the scripted provider. A prompt containing SLOW is answered after 20 s (a node
/// that is still running when the test acts); any other prompt is echoed back ("You said:
/// <prompt>"), so an agent node's output shows the prompt it was given.
const CONFIG: &str = r#"    - {id: bob, secret: bob-secret-0123456789abcdefghijklmnopqrstuvwxyz, scopes: [rpc]}
  rateLimit: {windowMs: 60000, maxRequests: 100000}
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "SLOW"
        steps:
          - reply: "slow answer"
            delayMs: 20000
      - match: "SAVE"
        steps:
          - toolCalls: [{name: save_file, arguments: {fileName: "report.md", content: "Report one"}}]
          - reply: "saved"
agents:
  default: {model: script/m1, tools: ["*"]}
  writer: {model: script/m1, tools: [current_time]}
"#;

/// How long a run of a few quick nodes may take, at most.
const RUN: Duration = Duration::from_secs(20);

const FINAL: &[&str] = &["completed", "failed", "cancelled"];

async fn gateway() -> Gateway {
    start(CONFIG).await
}

/// The error of a call that must fail: (code, message).
async fn refused(gw: &Gateway, token: &str, method: &str, params: Value) -> (i64, String) {
    let r = gw.call(token, method, params.clone()).await;
    let c = r["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("{method} {params} must fail: {r}"));
    (c, r["error"]["message"].as_str().unwrap_or("").to_owned())
}

/// The validation issue of `code` in `list` (errors or warnings of graph.define).
fn issue<'a>(v: &'a Value, list: &str, code: &str) -> &'a Value {
    v[list]
        .as_array()
        .unwrap_or_else(|| panic!("no {list}: {v}"))
        .iter()
        .find(|i| i["code"] == code)
        .unwrap_or_else(|| panic!("no {list} entry with code {code}: {v}"))
}

/// graph.define of `def` as the first tenant, checked against the result schema.
async fn define(gw: &Gateway, def: Value) -> Value {
    ok(gw, RPC, "graph.define", def).await
}

/// graph.define of an invalid `def`: asserts valid false and an error of `code`; the error.
async fn invalid(gw: &Gateway, def: Value, code: &str) -> Value {
    let v = define(gw, def.clone()).await;
    assert_eq!(v["valid"], false, "{def}: {v}");
    assert_eq!(
        v["nodeCount"].as_u64(),
        Some(def["nodes"].as_array().unwrap().len() as u64),
        "{v}"
    );
    let e = issue(&v, "errors", code).clone();
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    e
}

/// Starts a run; asserts the immediate answer and returns the runId.
async fn execute(gw: &Gateway, token: &str, params: Value) -> String {
    let r = ok(gw, token, "graph.execute", params.clone()).await;
    let id = r["runId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_owned();
    assert!(id.starts_with("graph_"), "{r}");
    assert!(
        r["status"] == "pending" || r["status"] == "running",
        "right after submission: {r}"
    );
    if let Some(nodes) = params["nodes"].as_array() {
        assert_eq!(r["nodeCount"].as_u64(), Some(nodes.len() as u64), "{r}");
    }
    id
}

/// graph.status of one run: the GraphRun.
async fn status(gw: &Gateway, token: &str, run: &str) -> Value {
    let s = ok(gw, token, "graph.status", json!({"runId": run})).await;
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{s}");
    assert_eq!(runs[0]["run"]["runId"], run, "{s}");
    runs[0].clone()
}

/// Polls graph.status until the run is final (within `within`): the GraphRun.
async fn wait_final(gw: &Gateway, token: &str, run: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let s = status(gw, token, run).await;
        if FINAL.contains(&s["run"]["status"].as_str().unwrap_or("")) {
            return s;
        }
        assert!(Instant::now() < deadline, "run {run} never ended: {s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls graph.status until node `node` has `want` status: the GraphRun.
async fn wait_node(gw: &Gateway, token: &str, run: &str, node: &str, want: &str) -> Value {
    let deadline = Instant::now() + STEP;
    loop {
        let s = status(gw, token, run).await;
        if node_of(&s, node)["status"] == want {
            return s;
        }
        assert!(Instant::now() < deadline, "{node} never {want}: {s}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The entry of `node` in a GraphRun's (or runDetail's) nodes.
fn node_of<'a>(run: &'a Value, node: &str) -> &'a Value {
    run["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("no nodes: {run}"))
        .iter()
        .find(|n| n["nodeId"] == node)
        .unwrap_or_else(|| panic!("no node {node}: {run}"))
}

/// The runs of `run`'s tree below its root (its agent nodes' runs), as `subagent.list` shows
/// them, once `ready` holds for them (within STEP).
async fn children(gw: &Gateway, run: &str, ready: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + STEP;
    loop {
        let list = ok(gw, ADMIN, "subagent.list", json!({})).await;
        let found: Vec<Value> = list["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["rootRunId"] == run && r["runId"] != run)
            .cloned()
            .collect();
        if ready(&found) {
            return found;
        }
        assert!(Instant::now() < deadline, "children of {run}: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn node_ids(run: &Value) -> Vec<String> {
    run["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["nodeId"].as_str().unwrap().to_owned())
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

fn one_transform(template: &str) -> Value {
    json!({"nodes": [{"id": "t", "type": "transform", "config": {"template": template}}]})
}

/// `/api/events` of one token, read frame by frame.
struct Events {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: String,
    /// Every event read so far: (name, the whole JSON `{seq, event, ts, data}`).
    seen: Vec<(String, Value)>,
    /// Every byte read so far, as text.
    raw: String,
}

impl Events {
    async fn open(gw: &Gateway, token: &str) -> Events {
        let r = reqwest::Client::new()
            .get(gw.url("/api/events"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let mut ev = Events {
            body: Box::pin(r.bytes_stream()),
            buf: String::new(),
            seen: Vec::new(),
            raw: String::new(),
        };
        // The opening `retry:` frame: the subscription is live.
        ev.read_chunk(Instant::now() + STEP).await;
        ev
    }

    async fn read_chunk(&mut self, deadline: Instant) {
        let chunk = tokio::time::timeout_at(deadline.into(), self.body.next())
            .await
            .unwrap_or_else(|_| panic!("no event in time; seen so far: {}", self.raw))
            .expect("event stream ended")
            .unwrap();
        let text = String::from_utf8_lossy(&chunk).into_owned();
        self.raw.push_str(&text);
        self.buf.push_str(&text);
        while let Some(end) = self.buf.find("\n\n") {
            let frame: String = self.buf.drain(..end + 2).collect();
            let mut name = None;
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            if let Some(name) = name {
                let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                self.seen.push((name, v));
            }
        }
    }

    /// Reads until an event named `name` whose data's runId is `run` has arrived.
    async fn until(&mut self, name: &str, run: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self
            .seen
            .iter()
            .any(|(n, v)| n == name && v["data"]["runId"] == run)
        {
            self.read_chunk(deadline).await;
        }
    }

    /// The `graph:*` events of `run` read so far, in order: (name, data).
    fn of_run(&self, run: &str) -> Vec<(String, Value)> {
        self.seen
            .iter()
            .filter(|(n, v)| n.starts_with("graph:") && v["data"]["runId"] == run)
            .map(|(n, v)| (n.clone(), v["data"].clone()))
            .collect()
    }
}

/// The statuses `graph:node_updated` reported for `node`, in order, with their attempts.
fn node_updates(events: &[(String, Value)], node: &str) -> Vec<(String, Option<i64>)> {
    events
        .iter()
        .filter(|(n, d)| n == "graph:node_updated" && d["nodeId"] == node)
        .map(|(_, d)| {
            (
                d["status"].as_str().unwrap().to_owned(),
                d["attempt"].as_i64(),
            )
        })
        .collect()
}

/// Index of the first `graph:node_updated` of `node` with `status`.
fn position(events: &[(String, Value)], node: &str, status: &str) -> usize {
    events
        .iter()
        .position(|(n, d)| {
            n == "graph:node_updated" && d["nodeId"] == node && d["status"] == status
        })
        .unwrap_or_else(|| panic!("no {status} event for {node}: {events:?}"))
}

// ---------------------------------------------------------------------------- validation

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn define_reports_every_error_code_and_refusals_are_exact() {
    let gw = gateway().await;
    let t = |id: &str, template: &str| json!({"id": id, "type": "transform", "config": {"template": template}});

    // A cycle: no order, and the message names the nodes on it (not the one leading into it).
    let v = define(
        &gw,
        json!({"nodes": [t("alpha", "a"), t("beta", "b"), t("gamma", "c")],
               "edges": [{"from": "alpha", "to": "beta"}, {"from": "beta", "to": "gamma"},
                         {"from": "gamma", "to": "beta"}]}),
    )
    .await;
    assert_eq!(v["valid"], false, "{v}");
    assert_eq!(v["executionOrder"], json!([]), "{v}");
    let m = issue(&v, "errors", "cycle")["message"].as_str().unwrap();
    assert!(m.contains("beta") && m.contains("gamma"), "{m}");
    assert!(!m.contains("alpha"), "alpha is not on the cycle: {m}");

    // An edge naming a node that does not exist.
    let e = invalid(
        &gw,
        json!({"nodes": [t("alpha", "a")], "edges": [{"from": "alpha", "to": "ghost"}]}),
        "unknown_node",
    )
    .await;
    assert!(e["message"].as_str().unwrap().contains("ghost"), "{e}");

    // Two nodes of one id.
    let e = invalid(
        &gw,
        json!({"nodes": [t("alpha", "a"), t("alpha", "b")]}),
        "duplicate_node_id",
    )
    .await;
    assert!(e["message"].as_str().unwrap().contains("alpha"), "{e}");

    // An agent that is not configured.
    let e = invalid(
        &gw,
        json!({"nodes": [{"id": "ask", "type": "agent", "agentId": "ghost-agent",
                          "config": {"prompt": "hi"}}]}),
        "unknown_agent",
    )
    .await;
    assert_eq!(e["nodeId"], "ask", "{e}");

    // A tool that does not exist, and an opt-in tool the default agent's `*` does not offer.
    for tool in ["no_such_tool", "spawn_agent"] {
        let e = invalid(
            &gw,
            json!({"nodes": [{"id": "call", "type": "tool", "config": {"tool": tool, "args": {}}}]}),
            "unknown_tool",
        )
        .await;
        assert_eq!(e["nodeId"], "call", "{tool}: {e}");
    }

    // Required config absent or of the wrong type.
    for (node, why) in [
        (json!({"id": "n", "type": "agent"}), "agent without config"),
        (
            json!({"id": "n", "type": "agent", "config": {}}),
            "agent without prompt",
        ),
        (
            json!({"id": "n", "type": "agent", "config": {"prompt": 5}}),
            "prompt not a string",
        ),
        (
            json!({"id": "n", "type": "tool", "config": {"args": {}}}),
            "tool without tool",
        ),
        (
            json!({"id": "n", "type": "tool", "config": {"tool": "current_time", "args": "x"}}),
            "args not an object",
        ),
        (
            json!({"id": "n", "type": "condition", "config": {}}),
            "condition without expression",
        ),
        (
            json!({"id": "n", "type": "transform", "config": {}}),
            "transform without template",
        ),
    ] {
        let v = define(&gw, json!({"nodes": [node]})).await;
        assert_eq!(v["valid"], false, "{why}: {v}");
        assert_eq!(
            issue(&v, "errors", "missing_config")["nodeId"],
            "n",
            "{why}: {v}"
        );
    }

    // CEL that does not parse, on a condition node and on an edge; and one over 1,024 characters.
    let e = invalid(
        &gw,
        json!({"nodes": [t("a", "x"), {"id": "c", "type": "condition", "config": {"expression": "output == "}}],
               "edges": [{"from": "a", "to": "c"}]}),
        "invalid_expression",
    )
    .await;
    assert_eq!(e["nodeId"], "c", "{e}");
    invalid(
        &gw,
        json!({"nodes": [t("a", "x"), t("b", "y")],
               "edges": [{"from": "a", "to": "b", "condition": "size(output) >"}]}),
        "invalid_expression",
    )
    .await;
    let long = format!("output == \"{}\"", "x".repeat(1100));
    invalid(
        &gw,
        json!({"nodes": [t("a", "x"), {"id": "c", "type": "condition", "config": {"expression": long}}],
               "edges": [{"from": "a", "to": "c"}]}),
        "invalid_expression",
    )
    .await;

    // A placeholder that is neither a node's output nor a variable.
    for bad in ["{{ two words }}", "{{a.input}}", "{{a.output.more}}"] {
        let v = define(
            &gw,
            json!({"nodes": [t("a", "x"), t("b", bad)], "edges": [{"from": "a", "to": "b"}]}),
        )
        .await;
        assert_eq!(v["valid"], false, "{bad}: {v}");
        assert_eq!(
            issue(&v, "errors", "invalid_template")["nodeId"],
            "b",
            "{bad}: {v}"
        );
    }

    // A placeholder naming a node downstream of the one using it, or unrelated to it.
    let e = invalid(
        &gw,
        json!({"nodes": [t("a", "x"), t("b", "{{c.output}}"), t("c", "y")],
               "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]}),
        "invalid_reference",
    )
    .await;
    assert_eq!(e["nodeId"], "b", "{e}");
    let e = invalid(
        &gw,
        json!({"nodes": [t("a", "x"), t("b", "y"), t("c", "{{b.output}}")],
               "edges": [{"from": "a", "to": "b"}, {"from": "a", "to": "c"}]}),
        "invalid_reference",
    )
    .await;
    assert_eq!(e["nodeId"], "c", "{e}");

    // The documentation's example: valid, topological order, its one variable.
    let example = json!({"nodes": [
        {"id": "brief", "type": "transform", "config": {"template": "Summarise {{topic}} in one line."}},
        {"id": "write", "type": "agent", "config": {"prompt": "{{brief.output}}"}},
        {"id": "long", "type": "condition", "config": {"expression": "size(output) > 200"}},
        {"id": "shorten", "type": "agent", "config": {"prompt": "Shorten: {{write.output}}"}},
        {"id": "done", "type": "merge"}],
      "edges": [{"from": "brief", "to": "write"}, {"from": "write", "to": "long"},
        {"from": "long", "to": "shorten"}, {"from": "long", "to": "done", "condition": "output == \"false\""},
        {"from": "shorten", "to": "done"}]});
    let v = define(&gw, example.clone()).await;
    assert_eq!(
        v,
        json!({"valid": true, "nodeCount": 5,
               "executionOrder": ["brief", "write", "long", "shorten", "done"],
               "userVariables": ["topic"], "errors": [], "warnings": []})
    );
    // Ties keep the definition's order (not the ids' alphabetical one); a node defined first
    // still comes after its inputs. Variables are listed once each, the label is echoed.
    let v = define(
        &gw,
        json!({"label": "Ties",
               "nodes": [{"id": "m", "type": "merge"}, t("q", "{{who}} and {{ what }}"), t("p", "{{who}}")],
               "edges": [{"from": "q", "to": "m"}, {"from": "p", "to": "m"}]}),
    )
    .await;
    assert_eq!(v["valid"], true, "{v}");
    assert_eq!(v["label"], "Ties");
    assert_eq!(v["executionOrder"], json!(["q", "p", "m"]), "{v}");
    let mut vars = strings(&v["userVariables"]);
    vars.sort();
    assert_eq!(vars, ["what", "who"]);
    // Warnings do not make it invalid.
    let v = define(
        &gw,
        json!({"nodes": [t("a", "x"), t("b", "{{a.output}}"), t("lonely", "z"),
                         {"id": "one", "type": "merge"},
                         {"id": "extra", "type": "transform", "config": {"template": "y", "prompt": "unused"}}],
               "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "one"}, {"from": "a", "to": "extra"}]}),
    )
    .await;
    assert_eq!(v["valid"], true, "{v}");
    assert_eq!(v["errors"], json!([]));
    assert_eq!(issue(&v, "warnings", "isolated_node")["nodeId"], "lonely");
    assert_eq!(issue(&v, "warnings", "merge_inputs")["nodeId"], "one");
    assert_eq!(issue(&v, "warnings", "ignored_config")["nodeId"], "extra");

    // save and execute refuse an invalid definition with -32602 naming its first error.
    let cyclic = json!({"nodes": [t("a", "x"), t("b", "y")],
                        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "a"}]});
    let mut save = cyclic.clone();
    save["label"] = json!("Cyclic");
    let (c, m) = refused(&gw, RPC, "graph.save", save).await;
    assert_eq!(c, -32602, "{m}");
    assert!(m.contains("cycle"), "{m}");
    let (c, m) = refused(&gw, RPC, "graph.execute", cyclic).await;
    assert_eq!(c, -32602, "{m}");
    assert!(m.contains("cycle"), "{m}");
    let (c, _) = refused(
        &gw,
        RPC,
        "graph.execute",
        json!({"nodes": [{"id": "a", "type": "agent", "config": {"prompt": "hi"}}], "agentId": "ghost-agent"}),
    )
    .await;
    assert_eq!(c, -32602, "the graph's agentId is not configured");
    // Exactly one of id and nodes.
    ok(
        &gw,
        RPC,
        "graph.save",
        json!({"id": "saved", "label": "Saved", "nodes": [t("t", "x")]}),
    )
    .await;
    let (c, m) = refused(
        &gw,
        RPC,
        "graph.execute",
        json!({"id": "saved", "nodes": [t("t", "x")]}),
    )
    .await;
    assert_eq!(c, -32602, "both: {m}");
    let (c, m) = refused(&gw, RPC, "graph.execute", json!({"variables": {"a": "b"}})).await;
    assert_eq!(c, -32602, "neither: {m}");
    // A variable the definition uses and the caller does not pass.
    let (c, m) = refused(
        &gw,
        RPC,
        "graph.execute",
        json!({"nodes": [t("t", "Hello {{name}}")], "variables": {"other": "x"}}),
    )
    .await;
    assert_eq!(c, -32602, "{m}");
    assert!(m.contains("name"), "names the missing variable: {m}");
    // A saved id that does not exist.
    let (c, m) = refused(&gw, RPC, "graph.execute", json!({"id": "nope"})).await;
    assert_eq!((c, m.as_str()), (-32001, "Graph not found: nope"));
    // Params the schema refuses.
    for bad in [
        json!({"nodes": []}),
        json!({"nodes": [{"id": "bad id", "type": "transform", "config": {"template": "x"}}]}),
        json!({"nodes": [{"id": "a", "type": "loop"}]}),
        json!({"nodes": [t("a", "x")], "settings": {"maxRetries": 6}}),
        json!({"nodes": [t("a", "x")], "settings": {"maxConcurrency": 33}}),
        json!({"nodes": [t("a", "x")], "onFailure": "ignore"}),
        json!({"nodes": [t("a", "x")], "surprise": true}),
    ] {
        let (c, m) = refused(&gw, RPC, "graph.define", bad.clone()).await;
        assert_eq!(c, -32602, "{bad}: {m}");
    }
    // Nothing ran.
    let runs = ok(&gw, RPC, "graph.runs", json!({})).await;
    assert_eq!(runs, json!({"runs": [], "total": 0}));
    gw.stop().await;
}

// ---------------------------------------------------------------------------- a run

/// transform -> agent -> condition (false) -> [agent skipped] -> merge, with a variable.
fn pipeline() -> Value {
    json!({
        "label": "Pipeline",
        "nodes": [
            {"id": "brief", "type": "transform", "config": {"template": "Summarise {{ topic }} briefly."}},
            {"id": "write", "type": "agent", "config": {"prompt": "Write: {{brief.output}}"}},
            {"id": "check", "type": "condition", "config": {"expression": "size(output) > 1000"}},
            {"id": "shorten", "type": "agent", "config": {"prompt": "Shorten: {{write.output}}"}},
            {"id": "done", "type": "merge"}
        ],
        "edges": [
            {"from": "brief", "to": "write"},
            {"from": "write", "to": "check"},
            {"from": "check", "to": "shorten"},
            {"from": "write", "to": "done"},
            {"from": "shorten", "to": "done"},
            {"from": "check", "to": "done", "condition": "output == \"false\""}
        ]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_renders_variables_feeds_outputs_forward_skips_the_branch_not_taken_and_merges() {
    let gw = gateway().await;
    let mut events = Events::open(&gw, RPC).await;
    let v = define(&gw, pipeline()).await;
    assert_eq!(v["valid"], true, "{v}");
    assert_eq!(
        v["executionOrder"],
        json!(["brief", "write", "check", "shorten", "done"])
    );
    assert_eq!(v["userVariables"], json!(["topic"]));
    assert_eq!(v["warnings"], json!([]));

    let mut params = pipeline();
    params["variables"] = json!({"topic": "PostgreSQL"});
    let started = ok(&gw, RPC, "graph.execute", params).await;
    assert_eq!(started["nodeCount"], 5, "{started}");
    assert_eq!(started["label"], "Pipeline", "{started}");
    assert_eq!(started["warnings"], json!([]), "{started}");
    let run = started["runId"].as_str().unwrap().to_owned();
    assert!(run.starts_with("graph_"), "{started}");

    let s = wait_final(&gw, RPC, &run, RUN).await;
    assert_eq!(s["run"]["status"], "completed", "{s}");
    assert_eq!(node_ids(&s), ["brief", "write", "check", "shorten", "done"]);
    for (id, st) in [
        ("brief", "completed"),
        ("write", "completed"),
        ("check", "completed"),
        ("shorten", "skipped"),
        ("done", "completed"),
    ] {
        let n = node_of(&s, id);
        assert_eq!(n["status"], st, "{id}: {s}");
        if st == "completed" {
            assert!(n["startedAt"].is_i64() && n["completedAt"].is_i64(), "{n}");
            assert!(n.get("error").is_none(), "{n}");
        }
    }
    assert!(
        node_of(&s, "shorten").get("startedAt").is_none(),
        "a skipped node never started: {s}"
    );
    assert_eq!(node_of(&s, "check")["type"], "condition");
    assert_eq!(node_of(&s, "done")["type"], "merge");

    // Outputs: the variable rendered, the agent given the transform's output (the scripted
    // model echoes its prompt), the condition's verdict, the merge of the inputs that ran in
    // the order of its incoming edges; the skipped node has none.
    let out = ok(&gw, RPC, "graph.outputs", json!({"runId": run})).await;
    assert_eq!(out["runId"], run.as_str());
    assert_eq!(out["status"], "completed");
    assert!(
        out["source"] == "live" || out["source"] == "stored",
        "{out}"
    );
    let o = out["outputs"].as_object().unwrap();
    let mut keys: Vec<&String> = o.keys().collect();
    keys.sort();
    assert_eq!(keys, ["brief", "check", "done", "write"], "{out}");
    assert_eq!(o["brief"], "Summarise PostgreSQL briefly.");
    let write = o["write"].as_str().unwrap();
    assert!(
        write.starts_with("You said: ") && write.contains("Write: Summarise PostgreSQL briefly."),
        "the agent's prompt was the rendered template: {write}"
    );
    assert_eq!(o["check"], "false");
    assert_eq!(o["done"], format!("{write}\n\nfalse"), "{out}");

    // The agent node ran as a child run (depth 1) of the graph's tree in a session of its own.
    let kids = children(&gw, &run, |c| {
        !c.is_empty() && c.iter().all(|r| r["status"] == "completed")
    })
    .await;
    assert_eq!(kids.len(), 1, "one agent node ran: {kids:?}");
    let child = &kids[0];
    assert_eq!(child["depth"], 1, "{child}");
    assert_eq!(child["parentRunId"], run.as_str(), "{child}");
    assert_eq!(child["agentId"], "default", "{child}");
    assert_eq!(child["status"], "completed", "{child}");
    let key = format!("agent:default:graph:client:{run}.write");
    assert_eq!(child["sessionKey"], key, "{child}");
    let h = ok(&gw, RPC, "session.history", json!({"session_key": key})).await;
    let msgs = h["messages"].as_array().unwrap();
    let user = msgs
        .iter()
        .find(|m| m["role"] == "user")
        .unwrap_or_else(|| panic!("{h}"));
    assert!(
        user["content"]
            .as_str()
            .unwrap()
            .contains("Write: Summarise PostgreSQL briefly."),
        "{h}"
    );
    let answer = msgs
        .iter()
        .rev()
        .find(|m| m["role"] == "assistant")
        .unwrap();
    assert_eq!(answer["content"], write, "{h}");

    // runDetail: the summary, every node in execution order, null output when skipped.
    let d = ok(&gw, RPC, "graph.runDetail", json!({"runId": run})).await;
    let r = &d["run"];
    assert_eq!(r["runId"], run.as_str());
    assert_eq!(r["status"], "completed");
    assert_eq!(r["label"], "Pipeline");
    assert_eq!(
        (
            r["nodeCount"].as_i64(),
            r["completedNodes"].as_i64(),
            r["failedNodes"].as_i64(),
            r["artifactCount"].as_i64()
        ),
        (Some(5), Some(4), Some(0), Some(0)),
        "{r}"
    );
    assert!(r.get("definitionId").is_none(), "an inline run: {r}");
    assert!(r.get("error").is_none(), "{r}");
    let (created, began, ended) = (
        r["createdAt"].as_i64().unwrap(),
        r["startedAt"].as_i64().unwrap(),
        r["completedAt"].as_i64().unwrap(),
    );
    assert!(created <= began && began <= ended, "{r}");
    assert_eq!(r["durationMs"].as_i64(), Some(ended - began), "{r}");
    assert_eq!(node_ids(&d), ["brief", "write", "check", "shorten", "done"]);
    for n in d["nodes"].as_array().unwrap() {
        assert_eq!(n["artifacts"], json!([]), "{n}");
        let id = n["nodeId"].as_str().unwrap();
        if id == "shorten" {
            assert_eq!(n["status"], "skipped");
            assert_eq!(n["output"], Value::Null, "{n}");
        } else {
            assert_eq!(n["status"], "completed");
            assert_eq!(n["output"], o[id], "{n}");
            assert!(n["durationMs"].as_i64().is_some_and(|ms| ms >= 0), "{n}");
        }
    }
    assert_eq!(node_of(&d, "write")["type"], "agent");

    // Events for that run, in order.
    events.until("graph:completed", &run, STEP).await;
    let ev = events.of_run(&run);
    assert_eq!(ev.first().unwrap().0, "graph:started", "{ev:?}");
    let started_ev = &ev[0].1;
    assert_eq!(started_ev["nodeCount"], 5, "{started_ev}");
    assert_eq!(started_ev["label"], "Pipeline", "{started_ev}");
    assert!(started_ev.get("definitionId").is_none(), "{started_ev}");
    let (last, done) = ev.last().unwrap();
    assert_eq!(last, "graph:completed", "{ev:?}");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["completedNodes"], 4, "{done}");
    assert_eq!(done["failedNodes"], 0, "{done}");
    assert!(
        done["durationMs"].as_i64().is_some_and(|ms| ms >= 0),
        "{done}"
    );
    assert!(done.get("error").is_none(), "{done}");
    assert!(
        ev[1..ev.len() - 1]
            .iter()
            .all(|(n, _)| n == "graph:node_updated"),
        "{ev:?}"
    );
    let ran = |s: &str| (s.to_owned(), Some(1_i64));
    for id in ["brief", "write", "check", "done"] {
        assert_eq!(
            node_updates(&ev, id),
            [ran("running"), ran("completed")],
            "{id}: {ev:?}"
        );
    }
    let skipped = node_updates(&ev, "shorten");
    assert_eq!(skipped.len(), 1, "{ev:?}");
    assert_eq!(skipped[0].0, "skipped");
    for (_, d) in ev.iter().filter(|(n, _)| n == "graph:node_updated") {
        let want = node_of(&s, d["nodeId"].as_str().unwrap())["type"].clone();
        assert_eq!(d["type"], want, "{d}");
    }
    // A node starts only after its inputs completed.
    assert!(position(&ev, "write", "running") > position(&ev, "brief", "completed"));
    assert!(position(&ev, "check", "running") > position(&ev, "write", "completed"));
    assert!(position(&ev, "shorten", "skipped") > position(&ev, "check", "completed"));
    assert!(position(&ev, "done", "running") > position(&ev, "check", "completed"));

    // A second run; graph.runs lists both, newest first, paged.
    let second = execute(&gw, RPC, one_transform("second")).await;
    wait_final(&gw, RPC, &second, RUN).await;
    let runs = ok(&gw, RPC, "graph.runs", json!({})).await;
    assert_eq!(runs["total"], 2, "{runs}");
    let ids: Vec<&str> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [second.as_str(), run.as_str()]);
    assert_eq!(
        runs["runs"][1], d["run"],
        "graph.runs carries the same summary"
    );
    let page = ok(&gw, RPC, "graph.runs", json!({"limit": 1})).await;
    assert_eq!(page["total"], 2);
    assert_eq!(page["runs"].as_array().unwrap().len(), 1);
    assert_eq!(page["runs"][0]["runId"], second.as_str());
    let page = ok(&gw, RPC, "graph.runs", json!({"limit": 1, "offset": 1})).await;
    assert_eq!(page["runs"][0]["runId"], run.as_str(), "{page}");
    let page = ok(&gw, RPC, "graph.runs", json!({"offset": 2})).await;
    assert_eq!(page, json!({"runs": [], "total": 2}));
    // graph.status without runId: the recent runs, newest first.
    let recent = ok(&gw, RPC, "graph.status", json!({})).await;
    let ids: Vec<&str> = recent["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run"]["runId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [second.as_str(), run.as_str()]);
    let out = ok(&gw, RPC, "graph.outputs", json!({"runId": second})).await;
    assert_eq!(out["outputs"], json!({"t": "second"}));
    gw.stop().await;
}

// ---------------------------------------------------------------------------- cancel

/// go -> slow (an agent answering after 20 s) -> after.
fn slow_chain() -> Value {
    json!({"label": "Slow",
           "nodes": [{"id": "go", "type": "transform", "config": {"template": "go"}},
                     {"id": "slow", "type": "agent", "config": {"prompt": "SLOW {{go.output}}"}},
                     {"id": "after", "type": "transform", "config": {"template": "{{slow.output}} then"}}],
           "edges": [{"from": "go", "to": "slow"}, {"from": "slow", "to": "after"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_the_running_node_and_downstream_never_starts_then_the_run_is_deleted() {
    let gw = gateway().await;
    let mut events = Events::open(&gw, RPC).await;
    let run = execute(&gw, RPC, slow_chain()).await;
    let s = wait_node(&gw, RPC, &run, "slow", "running").await;
    assert_eq!(s["run"]["status"], "running", "{s}");
    assert!(s["run"]["startedAt"].is_i64(), "{s}");
    assert!(s["run"].get("completedAt").is_none(), "a live run: {s}");
    let out = ok(&gw, RPC, "graph.outputs", json!({"runId": run})).await;
    assert_eq!(out["status"], "running");
    assert_eq!(
        out["source"], "live",
        "answered from memory on the node that runs it"
    );
    assert_eq!(out["outputs"], json!({"go": "go"}));

    // A live run cannot be deleted.
    let (c, m) = refused(&gw, RPC, "graph.deleteRun", json!({"runId": run})).await;
    assert_eq!(c, -32002, "{m}");

    let t = Instant::now();
    let r = ok(&gw, RPC, "graph.cancel", json!({"runId": run})).await;
    assert_eq!(
        r,
        json!({"runId": run, "cancelled": true, "status": "cancelled"})
    );
    let s = wait_final(&gw, RPC, &run, STEP).await;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(s["run"]["status"], "cancelled", "{s}");
    assert!(s["run"]["error"].is_string(), "why it ended: {s}");
    assert_eq!(node_of(&s, "go")["status"], "completed");
    assert_eq!(node_of(&s, "slow")["status"], "cancelled", "{s}");
    assert_eq!(node_of(&s, "after")["status"], "cancelled", "{s}");
    assert!(node_of(&s, "after").get("startedAt").is_none(), "{s}");

    // Cancelling again changes nothing.
    let r = ok(&gw, RPC, "graph.cancel", json!({"runId": run})).await;
    assert_eq!(
        r,
        json!({"runId": run, "cancelled": false, "status": "cancelled"})
    );

    events.until("graph:completed", &run, STEP).await;
    let ev = events.of_run(&run);
    assert!(
        node_updates(&ev, "after")
            .iter()
            .all(|(s, _)| s != "running"),
        "{ev:?}"
    );
    assert_eq!(
        node_updates(&ev, "slow").last().map(|u| u.0.as_str()),
        Some("cancelled"),
        "{ev:?}"
    );
    assert_eq!(ev.last().unwrap().1["status"], "cancelled", "{ev:?}");
    // The agent node's turn was stopped, not finished.
    let kids = children(&gw, &run, |c| {
        c.len() == 1 && c[0]["status"] != "running" && c[0]["status"] != "queued"
    })
    .await;
    assert_ne!(kids[0]["status"], "completed", "{kids:?}");
    let out = ok(&gw, RPC, "graph.outputs", json!({"runId": run})).await;
    assert_eq!(out["outputs"], json!({"go": "go"}), "{out}");

    // Final: deleted once; then gone for every run method, and deleting again is false.
    let r = ok(&gw, RPC, "graph.deleteRun", json!({"runId": run})).await;
    assert_eq!(r, json!({"runId": run, "deleted": true}));
    let gone = format!("Graph run not found: {run}");
    for m in [
        "graph.runDetail",
        "graph.status",
        "graph.outputs",
        "graph.cancel",
    ] {
        let (c, msg) = refused(&gw, RPC, m, json!({"runId": run})).await;
        assert_eq!((c, msg.as_str()), (-32001, gone.as_str()), "{m}");
    }
    let r = ok(&gw, RPC, "graph.deleteRun", json!({"runId": run})).await;
    assert_eq!(r, json!({"runId": run, "deleted": false}));
    assert_eq!(ok(&gw, RPC, "graph.runs", json!({})).await["total"], 0);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_kill_of_the_graphs_tree_stops_it_like_cancel() {
    let gw = gateway().await;
    let run = execute(&gw, RPC, slow_chain()).await;
    wait_node(&gw, RPC, &run, "slow", "running").await;
    // The agent node is a child run of the graph's tree, listed while it runs.
    let kids = children(&gw, &run, |c| c.len() == 1 && c[0]["status"] == "running").await;
    let child = &kids[0];
    assert_eq!(child["depth"], 1, "{child}");
    assert_eq!(child["parentRunId"], run.as_str(), "{child}");
    assert_eq!(
        child["sessionKey"],
        format!("agent:default:graph:client:{run}.slow")
    );
    // run.kill is admin's.
    let (c, _) = refused(&gw, RPC, "run.kill", json!({"rootRunId": run})).await;
    assert_eq!(c, -32603);
    let k = ok(&gw, ADMIN, "run.kill", json!({"rootRunId": run})).await;
    assert!(k["killed"].as_i64().is_some_and(|n| n >= 1), "{k}");
    let s = wait_final(&gw, RPC, &run, STEP).await;
    assert_eq!(s["run"]["status"], "cancelled", "{s}");
    assert_eq!(node_of(&s, "slow")["status"], "cancelled", "{s}");
    assert_eq!(node_of(&s, "after")["status"], "cancelled", "{s}");
    let r = ok(&gw, RPC, "graph.cancel", json!({"runId": run})).await;
    assert_eq!(r["cancelled"], false, "{r}");
    gw.stop().await;
}

// ---------------------------------------------------------------------------- failures

/// q renders the variable `query` (empty here), then `search` calls memory_search with it:
/// an empty query breaks the tool's schema (minLength 1) after templating, a deterministic
/// tool error on every attempt.
fn failing_search() -> Value {
    json!({"id": "search", "type": "tool",
           "config": {"tool": "memory_search", "args": {"query": "{{q.output}}"}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_tool_node_is_retried_then_fails_and_continue_lets_the_other_branch_finish() {
    let gw = gateway().await;
    let mut events = Events::open(&gw, RPC).await;
    let def = json!({
        "label": "Retries",
        "onFailure": "continue",
        "settings": {"maxRetries": 2},
        "variables": {"query": ""},
        "nodes": [
            {"id": "q", "type": "transform", "config": {"template": "{{query}}"}},
            failing_search(),
            {"id": "after", "type": "transform", "config": {"template": "found {{search.output}}"}},
            {"id": "side", "type": "transform", "config": {"template": "independent {{q.output}}."}}
        ],
        "edges": [{"from": "q", "to": "search"}, {"from": "search", "to": "after"},
                  {"from": "q", "to": "side"}]
    });
    let t = Instant::now();
    let run = execute(&gw, RPC, def).await;
    let s = wait_final(&gw, RPC, &run, RUN).await;
    // Two retries wait 250 ms and 500 ms.
    assert!(
        t.elapsed() >= Duration::from_millis(700),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(s["run"]["status"], "failed", "{s}");
    assert!(s["run"]["error"].is_string(), "{s}");
    assert_eq!(s["run"]["failedNodes"], 1, "{s}");
    assert_eq!(s["run"]["completedNodes"], 2, "q and side: {s}");
    let search = node_of(&s, "search");
    assert_eq!(search["status"], "failed", "{s}");
    assert!(
        search["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{search}"
    );
    assert_eq!(node_of(&s, "after")["status"], "skipped", "{s}");
    assert_eq!(node_of(&s, "side")["status"], "completed", "{s}");
    let out = ok(&gw, RPC, "graph.outputs", json!({"runId": run})).await;
    assert_eq!(
        out["outputs"],
        json!({"q": "", "side": "independent ."}),
        "{out}"
    );
    let d = ok(&gw, RPC, "graph.runDetail", json!({"runId": run})).await;
    assert_eq!(node_of(&d, "search")["output"], Value::Null);
    assert!(node_of(&d, "search")["error"].is_string(), "{d}");

    events.until("graph:completed", &run, STEP).await;
    let ev = events.of_run(&run);
    assert_eq!(
        node_updates(&ev, "search"),
        [
            ("running".to_owned(), Some(1_i64)),
            ("running".to_owned(), Some(2)),
            ("running".to_owned(), Some(3)),
            ("failed".to_owned(), Some(3)),
        ],
        "three attempts: {ev:?}"
    );
    let failed = ev
        .iter()
        .find(|(n, d)| n == "graph:node_updated" && d["status"] == "failed")
        .unwrap();
    assert!(failed.1["error"].is_string(), "{failed:?}");
    assert_eq!(
        node_updates(&ev, "after").len(),
        1,
        "skipped without running: {ev:?}"
    );
    let (last, done) = ev.last().unwrap();
    assert_eq!(last, "graph:completed");
    assert_eq!(
        (
            done["status"].clone(),
            done["failedNodes"].clone(),
            done["completedNodes"].clone()
        ),
        (json!("failed"), json!(1), json!(2)),
        "{done}"
    );
    assert!(done["error"].is_string(), "{done}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_stop_the_first_failure_fails_the_run_at_once_and_stops_the_rest() {
    let gw = gateway().await;
    let def = json!({
        "nodes": [
            {"id": "slow", "type": "agent", "config": {"prompt": "SLOW please"}},
            {"id": "q", "type": "transform", "config": {"template": "{{query}}"}},
            failing_search(),
            {"id": "after", "type": "transform", "config": {"template": "{{slow.output}}"}}
        ],
        "edges": [{"from": "q", "to": "search"}, {"from": "slow", "to": "after"}],
        "variables": {"query": ""}
    });
    let t = Instant::now();
    let run = execute(&gw, RPC, def).await;
    let s = wait_final(&gw, RPC, &run, STEP).await;
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "not after the slow node: {:?}",
        t.elapsed()
    );
    assert_eq!(s["run"]["status"], "failed", "{s}");
    assert_eq!(node_of(&s, "search")["status"], "failed", "{s}");
    assert_eq!(node_of(&s, "slow")["status"], "cancelled", "stopped: {s}");
    assert_eq!(
        node_of(&s, "after")["status"],
        "cancelled",
        "never started: {s}"
    );
    assert!(node_of(&s, "after").get("startedAt").is_none(), "{s}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_and_run_timeouts_and_the_token_budget_fail_the_run() {
    let gw = gateway().await;
    // A node attempt longer than settings.nodeTimeoutMs fails.
    let mut def = slow_chain();
    def["settings"] = json!({"nodeTimeoutMs": 1000});
    let t = Instant::now();
    let run = execute(&gw, RPC, def).await;
    let s = wait_final(&gw, RPC, &run, STEP).await;
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert_eq!(s["run"]["status"], "failed", "{s}");
    assert_eq!(node_of(&s, "slow")["status"], "failed", "{s}");
    assert!(node_of(&s, "slow")["error"].is_string(), "{s}");
    assert_ne!(node_of(&s, "after")["status"], "completed", "{s}");
    // The whole run longer than timeoutMs fails.
    let mut def = slow_chain();
    def["timeoutMs"] = json!(1000);
    let t = Instant::now();
    let run = execute(&gw, RPC, def).await;
    let s = wait_final(&gw, RPC, &run, STEP).await;
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert_eq!(s["run"]["status"], "failed", "{s}");
    assert!(s["run"]["error"].is_string(), "{s}");
    assert_ne!(node_of(&s, "slow")["status"], "completed", "{s}");
    // A token cap the first agent node's turn already exceeds stops the run before the next.
    let def = json!({
        "budget": {"maxTokens": 1},
        "nodes": [{"id": "one", "type": "agent", "config": {"prompt": "first turn"}},
                  {"id": "two", "type": "agent", "config": {"prompt": "second: {{one.output}}"}}],
        "edges": [{"from": "one", "to": "two"}]
    });
    let run = execute(&gw, RPC, def).await;
    let s = wait_final(&gw, RPC, &run, RUN).await;
    assert_eq!(s["run"]["status"], "failed", "{s}");
    assert!(
        s["run"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("budget reached")),
        "{s}"
    );
    assert!(node_of(&s, "two").get("startedAt").is_none(), "{s}");
    assert_ne!(node_of(&s, "two")["status"], "completed", "{s}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_node_waits_for_approval_and_a_denial_fails_it() {
    let extra = format!(
        "{CONFIG}autonomy:\n  approvals:\n    tools: [current_time]\n    timeoutSeconds: 30\n"
    );
    let gw = start(&extra).await;
    let clock = json!({"nodes": [{"id": "clock", "type": "tool", "config": {"tool": "current_time", "args": {}}}]});
    async fn one_pending(gw: &Gateway) -> Value {
        let deadline = Instant::now() + STEP;
        loop {
            let p = ok(gw, ADMIN, "admin.approval.pending", json!({})).await;
            if let Some(r) = p["requests"].as_array().and_then(|l| l.first()) {
                return r.clone();
            }
            assert!(Instant::now() < deadline, "no approval request: {p}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Approved: the call runs; the node's output is the tool's JSON text.
    let run = execute(&gw, RPC, clock.clone()).await;
    let req = one_pending(&gw).await;
    assert_eq!(req["toolName"], "current_time", "{req}");
    assert_eq!(status(&gw, RPC, &run).await["run"]["status"], "running");
    ok(
        &gw,
        ADMIN,
        "admin.approval.resolve",
        json!({"id": req["id"], "approved": true}),
    )
    .await;
    let s = wait_final(&gw, RPC, &run, STEP).await;
    assert_eq!(s["run"]["status"], "completed", "{s}");
    let out = ok(&gw, RPC, "graph.outputs", json!({"runId": run})).await;
    let text = out["outputs"]["clock"]
        .as_str()
        .unwrap_or_else(|| panic!("{out}"));
    let v: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("JSON text: {text}"));
    assert!(v["epochMs"].is_i64() && v["utc"].is_string(), "{v}");
    // Denied: the gate refused, the node fails, and so does the run.
    let run = execute(&gw, RPC, clock).await;
    let req = one_pending(&gw).await;
    ok(
        &gw,
        ADMIN,
        "admin.approval.resolve",
        json!({"id": req["id"], "approved": false, "reason": "not now"}),
    )
    .await;
    let s = wait_final(&gw, RPC, &run, STEP).await;
    assert_eq!(s["run"]["status"], "failed", "{s}");
    assert_eq!(node_of(&s, "clock")["status"], "failed", "{s}");
    let out = ok(&gw, RPC, "graph.outputs", json!({"runId": run})).await;
    assert_eq!(out["outputs"], json!({}), "{out}");
    gw.stop().await;
}

// ---------------------------------------------------------------------------- saved graphs

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saved_graphs_are_created_updated_listed_loaded_run_and_deleted() {
    let gw = gateway().await;
    let node = json!({"id": "t", "type": "transform", "config": {"template": "Hi {{name}}"}});
    let saved = ok(
        &gw,
        RPC,
        "graph.save",
        json!({"id": "greet", "label": "Greet", "nodes": [node]}),
    )
    .await;
    assert_eq!(
        saved,
        json!({"id": "greet", "saved": true, "created": true})
    );
    let first = ok(&gw, RPC, "graph.load", json!({"id": "greet"})).await;
    assert_eq!(first["id"], "greet");
    assert_eq!(first["label"], "Greet");
    assert_eq!(first["nodes"], json!([node]));
    assert_eq!(first["edges"], json!([]));
    assert_eq!(first["onFailure"], "stop");
    for absent in ["agentId", "timeoutMs", "budget", "settings"] {
        assert!(first.get(absent).is_none(), "{absent}: {first}");
    }
    let created_at = first["createdAt"].as_i64().unwrap();
    assert_eq!(first["updatedAt"].as_i64(), Some(created_at), "{first}");

    // Saved again under the same id: replaced, createdAt kept, updatedAt moved.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second_def = json!({"id": "greet", "label": "Greet v2", "agentId": "writer",
        "onFailure": "continue", "timeoutMs": 60000, "budget": {"maxTokens": 5000},
        "settings": {"maxRetries": 1},
        "nodes": [node, {"id": "u", "type": "transform", "config": {"template": "{{t.output}}!"}}],
        "edges": [{"from": "t", "to": "u"}]});
    let saved = ok(&gw, RPC, "graph.save", second_def.clone()).await;
    assert_eq!(
        saved,
        json!({"id": "greet", "saved": true, "created": false})
    );
    let second = ok(&gw, RPC, "graph.load", json!({"id": "greet"})).await;
    assert_eq!(second["createdAt"].as_i64(), Some(created_at), "{second}");
    assert!(
        second["updatedAt"].as_i64().unwrap() > created_at,
        "{second}"
    );
    for k in [
        "label",
        "agentId",
        "onFailure",
        "timeoutMs",
        "budget",
        "nodes",
        "edges",
    ] {
        assert_eq!(second[k], second_def[k], "{k}: {second}");
    }
    assert_eq!(second["settings"]["maxRetries"], 1, "{second}");

    // Without an id, one is generated.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let other = ok(
        &gw,
        RPC,
        "graph.save",
        json!({"label": "Other", "nodes": [{"id": "x", "type": "transform", "config": {"template": "x"}}]}),
    )
    .await;
    assert_eq!(other["created"], true);
    let other_id = other["id"].as_str().unwrap().to_owned();
    assert!(!other_id.is_empty() && other_id != "greet");

    // Listed most recently updated first, paged.
    let list = ok(&gw, RPC, "graph.list", json!({})).await;
    assert_eq!(list["total"], 2, "{list}");
    let e = list["entries"].as_array().unwrap();
    assert_eq!(e[0]["id"], other_id.as_str());
    assert_eq!(e[0]["label"], "Other");
    assert_eq!(e[0]["nodeCount"], 1);
    assert!(e[0].get("agentId").is_none(), "{list}");
    assert_eq!(e[1]["id"], "greet");
    assert_eq!(e[1]["label"], "Greet v2");
    assert_eq!(e[1]["agentId"], "writer");
    assert_eq!(e[1]["nodeCount"], 2);
    assert_eq!(e[1]["createdAt"], second["createdAt"]);
    assert_eq!(e[1]["updatedAt"], second["updatedAt"]);
    tokio::time::sleep(Duration::from_millis(20)).await;
    ok(&gw, RPC, "graph.save", second_def.clone()).await;
    let list = ok(&gw, RPC, "graph.list", json!({"limit": 1})).await;
    assert_eq!(list["total"], 2);
    let ids: Vec<&Value> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["id"])
        .collect();
    assert_eq!(ids, [&json!("greet")], "the re-saved graph comes first");
    let list = ok(&gw, RPC, "graph.list", json!({"limit": 1, "offset": 1})).await;
    assert_eq!(list["entries"][0]["id"], other_id.as_str(), "{list}");
    let list = ok(&gw, RPC, "graph.list", json!({"offset": 2})).await;
    assert_eq!(list, json!({"entries": [], "total": 2}));

    // Executing a saved graph records its id on the run.
    let (c, m) = refused(&gw, RPC, "graph.execute", json!({"id": "greet"})).await;
    assert_eq!(c, -32602, "the variable is missing: {m}");
    let mut events = Events::open(&gw, RPC).await;
    let started = ok(
        &gw,
        RPC,
        "graph.execute",
        json!({"id": "greet", "variables": {"name": "Ada"}}),
    )
    .await;
    assert_eq!(started["nodeCount"], 2, "{started}");
    assert_eq!(started["label"], "Greet v2", "{started}");
    let run = started["runId"].as_str().unwrap().to_owned();
    let s = wait_final(&gw, RPC, &run, RUN).await;
    assert_eq!(s["run"]["status"], "completed", "{s}");
    assert_eq!(s["run"]["definitionId"], "greet", "{s}");
    let out = ok(&gw, RPC, "graph.outputs", json!({"runId": run})).await;
    assert_eq!(out["outputs"], json!({"t": "Hi Ada", "u": "Hi Ada!"}));
    let runs = ok(&gw, RPC, "graph.runs", json!({})).await;
    assert_eq!(runs["runs"][0]["runId"], run.as_str());
    assert_eq!(runs["runs"][0]["definitionId"], "greet");
    assert_eq!(runs["runs"][0]["label"], "Greet v2");
    events.until("graph:started", &run, STEP).await;
    let ev = events.of_run(&run);
    assert_eq!(ev[0].1["definitionId"], "greet", "{ev:?}");

    // Deleted once; the past run stays.
    let r = ok(&gw, RPC, "graph.delete", json!({"id": "greet"})).await;
    assert_eq!(r, json!({"id": "greet", "deleted": true}));
    let r = ok(&gw, RPC, "graph.delete", json!({"id": "greet"})).await;
    assert_eq!(r, json!({"id": "greet", "deleted": false}));
    let (c, m) = refused(&gw, RPC, "graph.load", json!({"id": "greet"})).await;
    assert_eq!((c, m.as_str()), (-32001, "Graph not found: greet"));
    let (c, m) = refused(
        &gw,
        RPC,
        "graph.execute",
        json!({"id": "greet", "variables": {"name": "x"}}),
    )
    .await;
    assert_eq!((c, m.as_str()), (-32001, "Graph not found: greet"));
    let list = ok(&gw, RPC, "graph.list", json!({})).await;
    assert_eq!(list["total"], 1, "{list}");
    let d = ok(&gw, RPC, "graph.runDetail", json!({"runId": run})).await;
    assert_eq!(d["run"]["definitionId"], "greet");

    // Refusals of save: an invalid definition, an id outside the pattern, no label.
    let (c, _) = refused(
        &gw,
        RPC,
        "graph.save",
        json!({"id": "bad", "label": "Bad", "nodes": [{"id": "a", "type": "agent"}]}),
    )
    .await;
    assert_eq!(c, -32602);
    let (c, _) = refused(
        &gw,
        RPC,
        "graph.save",
        json!({"id": "has space", "label": "x", "nodes": [node]}),
    )
    .await;
    assert_eq!(c, -32602);
    let (c, _) = refused(
        &gw,
        RPC,
        "graph.save",
        json!({"id": "nolabel", "nodes": [node]}),
    )
    .await;
    assert_eq!(c, -32602);
    let (c, _) = refused(&gw, RPC, "graph.load", json!({"id": "bad"})).await;
    assert_eq!(c, -32001, "a refused save stored nothing");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_owner_limits_on_saved_graphs_and_live_runs() {
    let extra = format!(
        "{CONFIG}graphs:\n  maxSavedPerOwner: 2\n  maxLiveRunsPerOwner: 1\n  keepRunsPerOwner: 2\n"
    );
    let gw = start(&extra).await;
    let def = |id: &str| json!({"id": id, "label": id, "nodes": [{"id": "t", "type": "transform", "config": {"template": "x"}}]});
    ok(&gw, RPC, "graph.save", def("one")).await;
    ok(&gw, RPC, "graph.save", def("two")).await;
    let (c, m) = refused(&gw, RPC, "graph.save", def("three")).await;
    assert_eq!(c, -32002, "{m}");
    // Replacing one of them is not a new one; another tenant has its own allowance.
    assert_eq!(
        ok(&gw, RPC, "graph.save", def("two")).await["created"],
        false
    );
    assert_eq!(
        ok(&gw, BOB, "graph.save", def("three")).await["created"],
        true
    );
    assert_eq!(ok(&gw, RPC, "graph.list", json!({})).await["total"], 2);

    let run = execute(&gw, RPC, slow_chain()).await;
    wait_node(&gw, RPC, &run, "slow", "running").await;
    let (c, m) = refused(&gw, RPC, "graph.execute", one_transform("more")).await;
    assert_eq!(c, -32002, "{m}");
    let theirs = execute(&gw, BOB, one_transform("bob's")).await;
    wait_final(&gw, BOB, &theirs, RUN).await;
    ok(&gw, RPC, "graph.cancel", json!({"runId": run})).await;
    wait_final(&gw, RPC, &run, STEP).await;
    let again = execute(&gw, RPC, one_transform("once it ended")).await;
    assert_eq!(
        wait_final(&gw, RPC, &again, RUN).await["run"]["status"],
        "completed"
    );
    // keepRunsPerOwner 2: at the limit both ended runs stay; one more ends and the oldest
    // goes (the other tenant's run is its own).
    let ids = |v: Value| -> Vec<String> {
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["runId"].as_str().unwrap().to_owned())
            .collect()
    };
    let mut kept = ids(ok(&gw, RPC, "graph.runs", json!({})).await);
    kept.sort();
    let mut want = vec![run.clone(), again.clone()];
    want.sort();
    assert_eq!(kept, want);
    let third = execute(&gw, RPC, one_transform("third")).await;
    wait_final(&gw, RPC, &third, RUN).await;
    let mut kept = ids(ok(&gw, RPC, "graph.runs", json!({})).await);
    kept.sort();
    let mut want = vec![again.clone(), third.clone()];
    want.sort();
    assert_eq!(kept, want, "the oldest ended run went");
    let (c, _) = refused(&gw, RPC, "graph.status", json!({"runId": run})).await;
    assert_eq!(c, -32001);
    assert_eq!(ids(ok(&gw, BOB, "graph.runs", json!({})).await), [theirs]);
    gw.stop().await;
}

// ---------------------------------------------------------------------------- tenancy

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_reaches_nothing_of_a_tenants_graphs_runs_or_events() {
    let gw = gateway().await;
    let mut bob_events = Events::open(&gw, BOB).await;
    let mut admin_events = Events::open(&gw, ADMIN).await;
    let mut alice_events = Events::open(&gw, RPC).await;

    // Alice's saved graph: bob's calls by its id do not find it.
    let alice_def = json!({"id": "shared", "label": "Alice's",
        "nodes": [{"id": "t", "type": "transform", "config": {"template": "alice {{x}}"}}]});
    ok(&gw, RPC, "graph.save", alice_def).await;
    let alice_graph = ok(&gw, RPC, "graph.load", json!({"id": "shared"})).await;
    let not_found = (-32001, "Graph not found: shared".to_owned());
    assert_eq!(
        refused(&gw, BOB, "graph.load", json!({"id": "shared"})).await,
        not_found
    );
    assert_eq!(
        refused(
            &gw,
            BOB,
            "graph.execute",
            json!({"id": "shared", "variables": {"x": "1"}})
        )
        .await,
        not_found
    );
    assert_eq!(
        ok(&gw, BOB, "graph.delete", json!({"id": "shared"})).await,
        json!({"id": "shared", "deleted": false})
    );
    assert_eq!(
        ok(&gw, BOB, "graph.list", json!({})).await,
        json!({"entries": [], "total": 0})
    );
    // Admin addresses its own graphs too.
    assert_eq!(
        refused(&gw, ADMIN, "graph.load", json!({"id": "shared"})).await,
        not_found
    );
    assert_eq!(ok(&gw, ADMIN, "graph.list", json!({})).await["total"], 0);
    // Bob saving under the same id creates his own and leaves alice's alone.
    let saved = ok(
        &gw,
        BOB,
        "graph.save",
        json!({"id": "shared", "label": "Bob's",
               "nodes": [{"id": "b", "type": "transform", "config": {"template": "bob"}}]}),
    )
    .await;
    assert_eq!(
        saved,
        json!({"id": "shared", "saved": true, "created": true})
    );
    assert_eq!(
        ok(&gw, BOB, "graph.load", json!({"id": "shared"})).await["label"],
        "Bob's"
    );
    assert_eq!(
        ok(&gw, RPC, "graph.load", json!({"id": "shared"})).await,
        alice_graph
    );
    assert_eq!(ok(&gw, RPC, "graph.list", json!({})).await["total"], 1);
    assert_eq!(ok(&gw, BOB, "graph.list", json!({})).await["total"], 1);

    // Alice's runs: one finished (of her saved graph), one running.
    let done = execute(&gw, RPC, json!({"id": "shared", "variables": {"x": "1"}})).await;
    assert_eq!(
        wait_final(&gw, RPC, &done, RUN).await["run"]["status"],
        "completed"
    );
    let live = execute(&gw, RPC, slow_chain()).await;
    wait_node(&gw, RPC, &live, "slow", "running").await;

    // Every run method answers bob as for a run that does not exist.
    for run in [&done, &live] {
        for m in [
            "graph.status",
            "graph.cancel",
            "graph.outputs",
            "graph.runDetail",
        ] {
            let theirs = refused(&gw, BOB, m, json!({"runId": run})).await;
            assert_eq!(
                theirs,
                (-32001, format!("Graph run not found: {run}")),
                "{m}"
            );
            let nobody = refused(&gw, BOB, m, json!({"runId": "graph_does_not_exist"})).await;
            assert_eq!(
                nobody,
                (
                    -32001,
                    "Graph run not found: graph_does_not_exist".to_owned()
                )
            );
        }
        let r = ok(&gw, BOB, "graph.deleteRun", json!({"runId": run})).await;
        assert_eq!(
            r,
            json!({"runId": run, "deleted": false}),
            "not found, not deleted"
        );
    }
    let r = ok(
        &gw,
        BOB,
        "graph.deleteRun",
        json!({"runId": "graph_does_not_exist"}),
    )
    .await;
    assert_eq!(
        r,
        json!({"runId": "graph_does_not_exist", "deleted": false})
    );
    // ... and changed nothing.
    assert_eq!(status(&gw, RPC, &live).await["run"]["status"], "running");
    assert_eq!(
        ok(&gw, RPC, "graph.runDetail", json!({"runId": done})).await["run"]["status"],
        "completed"
    );
    assert_eq!(
        ok(&gw, BOB, "graph.runs", json!({})).await,
        json!({"runs": [], "total": 0})
    );
    assert_eq!(
        ok(&gw, BOB, "graph.status", json!({})).await,
        json!({"runs": []})
    );

    // Bob's own run: his lists hold it and nothing of alice's; alice's hold none of his.
    let bobs = execute(&gw, BOB, json!({"id": "shared"})).await;
    let s = wait_final(&gw, BOB, &bobs, RUN).await;
    assert_eq!(s["run"]["status"], "completed", "{s}");
    assert_eq!(
        ok(&gw, BOB, "graph.outputs", json!({"runId": bobs})).await["outputs"],
        json!({"b": "bob"}),
        "bob ran his own graph of that id"
    );
    let runs = ok(&gw, BOB, "graph.runs", json!({})).await;
    assert_eq!(runs["total"], 1, "{runs}");
    assert_eq!(runs["runs"][0]["runId"], bobs.as_str());
    let st = ok(&gw, BOB, "graph.status", json!({})).await;
    let ids: Vec<&Value> = st["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["run"]["runId"])
        .collect();
    assert_eq!(ids, [&json!(bobs)], "{st}");
    let mine = ok(&gw, RPC, "graph.runs", json!({})).await;
    assert_eq!(mine["total"], 2, "{mine}");
    assert!(!mine.to_string().contains(&bobs), "{mine}");
    let st = ok(&gw, RPC, "graph.status", json!({})).await;
    assert!(!st.to_string().contains(&bobs), "{st}");
    assert_eq!(
        refused(&gw, RPC, "graph.runDetail", json!({"runId": bobs}))
            .await
            .0,
        -32001
    );

    // Bob's stream got his own run's events and none of alice's.
    bob_events.until("graph:completed", &bobs, STEP).await;
    for run in [&done, &live] {
        assert!(
            !bob_events.raw.contains(run.as_str()),
            "alice's {run} leaked: {}",
            bob_events.raw
        );
    }
    assert!(
        bob_events
            .seen
            .iter()
            .filter(|(n, _)| n.starts_with("graph:"))
            .all(|(_, v)| v["data"]["runId"] == bobs.as_str()),
        "{:?}",
        bob_events.seen
    );
    alice_events.until("graph:started", &live, STEP).await;
    alice_events.until("graph:completed", &done, STEP).await;
    assert!(
        !alice_events.raw.contains(bobs.as_str()),
        "{}",
        alice_events.raw
    );
    // Admin sees both tenants' events and reaches alice's run.
    admin_events.until("graph:started", &live, STEP).await;
    admin_events.until("graph:completed", &bobs, STEP).await;
    assert_eq!(status(&gw, ADMIN, &live).await["run"]["status"], "running");
    ok(&gw, ADMIN, "graph.runDetail", json!({"runId": live})).await;
    assert_eq!(
        ok(&gw, ADMIN, "graph.outputs", json!({"runId": live})).await["outputs"],
        json!({"go": "go"})
    );
    let r = ok(&gw, ADMIN, "graph.cancel", json!({"runId": live})).await;
    assert_eq!(
        r,
        json!({"runId": live, "cancelled": true, "status": "cancelled"})
    );
    assert_eq!(
        wait_final(&gw, RPC, &live, STEP).await["run"]["status"],
        "cancelled"
    );
    gw.stop().await;
}

// ---------------------------------------------------------------------------- persistence

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_survive_a_kill_9_and_a_run_live_at_the_kill_reads_failed() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.yaml");
    std::fs::write(&config, config_yaml(dir.path(), CONFIG)).unwrap();
    let (mut child, port) = spawn_binary(dir.path(), &config, "first").await;
    let call = |m: &'static str, p: Value| call_port(port, RPC, m, p);
    let result = |v: Value, what: &str| -> Value {
        let r = v
            .get("result")
            .cloned()
            .unwrap_or_else(|| panic!("{what}: {v}"));
        validate_result(what, &r);
        r
    };
    result(
        call(
            "graph.save",
            json!({"id": "kept", "label": "Kept",
            "nodes": [{"id": "t", "type": "transform", "config": {"template": "kept {{v}}"}}]}),
        )
        .await,
        "graph.save",
    );
    let done = result(
        call(
            "graph.execute",
            json!({"id": "kept", "variables": {"v": "1"}}),
        )
        .await,
        "graph.execute",
    )["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + RUN;
    let before = loop {
        let s = result(
            call("graph.runDetail", json!({"runId": done})).await,
            "graph.runDetail",
        );
        if s["run"]["status"] == "completed" {
            break s;
        }
        assert!(Instant::now() < deadline, "{s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let live = result(call("graph.execute", slow_chain()).await, "graph.execute")["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + STEP;
    loop {
        let s = result(
            call("graph.status", json!({"runId": live})).await,
            "graph.status",
        );
        if node_of(&s["runs"][0], "slow")["status"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "{s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();

    let (mut child, port) = spawn_binary(dir.path(), &config, "second").await;
    let call = |m: &'static str, p: Value| call_port(port, RPC, m, p);
    // The finished run, as it was; its outputs now from the stored record.
    let after = result(
        call("graph.runDetail", json!({"runId": done})).await,
        "graph.runDetail",
    );
    assert_eq!(after, before);
    let out = result(
        call("graph.outputs", json!({"runId": done})).await,
        "graph.outputs",
    );
    assert_eq!(
        out,
        json!({"runId": done, "status": "completed", "outputs": {"t": "kept 1"}, "source": "stored"})
    );
    let kept = result(
        call("graph.load", json!({"id": "kept"})).await,
        "graph.load",
    );
    assert_eq!(kept["label"], "Kept");
    // The run that was live when the process died ends failed, saying so.
    let deadline = Instant::now() + Duration::from_secs(15);
    let s = loop {
        let s = result(
            call("graph.status", json!({"runId": live})).await,
            "graph.status",
        );
        let run = s["runs"][0].clone();
        if FINAL.contains(&run["run"]["status"].as_str().unwrap_or("")) {
            break run;
        }
        assert!(Instant::now() < deadline, "never swept: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(s["run"]["status"], "failed", "{s}");
    assert_eq!(
        s["run"]["error"], "the gateway stopped before the run ended",
        "{s}"
    );
    assert!(s["run"]["completedAt"].is_i64(), "{s}");
    assert_eq!(node_of(&s, "go")["status"], "completed", "{s}");
    for n in s["nodes"].as_array().unwrap() {
        assert!(
            n["status"] != "running" && n["status"] != "pending",
            "no node of an ended run is live: {s}"
        );
    }
    let runs = result(call("graph.runs", json!({})).await, "graph.runs");
    assert_eq!(runs["total"], 2, "{runs}");
    let r = result(
        call("graph.deleteRun", json!({"runId": live})).await,
        "graph.deleteRun",
    );
    assert_eq!(r, json!({"runId": live, "deleted": true}));
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Files saved by an agent node's turn and by a `save_file` tool node are the nodes'
/// artifacts: runDetail inlines their content, the summary counts them. An output longer
/// than 256 KiB is cut there and marked.
#[tokio::test]
async fn saved_files_are_artifacts_and_long_outputs_are_cut() {
    let gw = gateway().await;
    let big = "x".repeat(300 * 1024);
    let run = execute(
        &gw,
        RPC,
        json!({
            "nodes": [
                {"id": "agent", "type": "agent", "config": {"prompt": "SAVE it"}},
                {"id": "tool", "type": "tool", "config": {"tool": "save_file",
                    "args": {"fileName": "notes.txt", "content": "from {{agent.output}}"}}},
                {"id": "long", "type": "transform", "config": {"template": "{{big}}"}}
            ],
            "edges": [{"from": "agent", "to": "tool"}],
            "variables": {"big": big}
        }),
    )
    .await;
    let s = wait_final(&gw, RPC, &run, RUN).await;
    assert_eq!(s["run"]["status"], "completed", "{s}");
    assert_eq!(s["run"]["artifactCount"], 2, "{s}");
    let d = ok(&gw, RPC, "graph.runDetail", json!({"runId": run})).await;
    let node = |id: &str| {
        d["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["nodeId"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(
        node("agent")["artifacts"],
        json!([{"filename": "report.md", "content": "Report one", "sizeBytes": 10}])
    );
    assert_eq!(
        node("tool")["artifacts"],
        json!([{"filename": "notes.txt", "content": "from saved", "sizeBytes": 10}])
    );
    let long = node("long")["output"].as_str().unwrap().to_owned();
    assert_eq!(long.len(), 256 * 1024 + "\n[truncated]".len());
    assert!(long.ends_with("x\n[truncated]"));
    // At the limit: kept whole.
    let exact = "y".repeat(256 * 1024);
    let run = execute(
        &gw,
        RPC,
        json!({"nodes": [{"id": "t", "type": "transform", "config": {"template": "{{v}}"}}],
               "variables": {"v": exact}}),
    )
    .await;
    wait_final(&gw, RPC, &run, RUN).await;
    let o = ok(&gw, RPC, "graph.outputs", json!({"runId": run})).await;
    assert_eq!(o["outputs"]["t"].as_str().unwrap().len(), 256 * 1024);
}
