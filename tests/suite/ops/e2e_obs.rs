//! Observability over JSON-RPC on loopback, driven by the scripted provider with known token
//! counts and prices: billing figures against sums computed by hand (before and after a
//! restart), post-mortems of sessions ending with every finish reason, fleet health, the
//! session index (search, where filter, tail, export), diagnostics filtered by tenant, prompt
//! reports, context snapshots, channel activity and resets.

use crate::common::*;
use serde_json::{json, Value};

const OBS: &str = r#"
providers:
  s1:
    type: scripted
    models: [m1]
    maxRetries: 0
    script:
      - match: "plain"
        steps:
          - reply: "fine"
            usage: {input: 100, output: 10}
      - match: "cached"
        steps:
          - reply: "from cache"
            usage: {input: 1000, output: 20, cached: 800}
      - match: "keep going"
        steps:
          - toolCalls: [{name: memory_search, arguments: {query: a}}]
            usage: {input: 10, output: 1}
          - toolCalls: [{name: memory_search, arguments: {query: b}}]
            usage: {input: 10, output: 1}
          - toolCalls: [{name: memory_search, arguments: {query: c}}]
            usage: {input: 10, output: 1}
      - match: "expensive"
        steps:
          - toolCalls: [{name: current_time}]
            usage: {input: 600, output: 500}
          - reply: "done"
      - match: "break things"
        steps:
          - toolCalls: [{name: no_such_tool, arguments: {secret: "TOOL-ARG-MARKER"}}]
            usage: {input: 10, output: 1}
          - toolCalls: [{name: no_such_tool, arguments: {n: 2}}]
            usage: {input: 10, output: 1}
          - toolCalls: [{name: no_such_tool, arguments: {n: 3}}]
            usage: {input: 10, output: 1}
          - reply: "never"
      - match: "loop forever"
        steps:
          - toolCalls: [{name: current_time, arguments: {}}]
            usage: {input: 10, output: 1}
      - match: "fail hard"
        steps:
          - error: {status: 500, message: "upstream exploded"}
  s2:
    type: scripted
    models: [m2]
    script:
      - steps:
          - reply: "two"
            usage: {input: 50, output: 5}
  broken:
    type: scripted
    models: [down]
    maxRetries: 0
    script:
      - steps: [{error: {status: 502, message: "bad gateway"}}]
models:
  - id: s1/m1
    contextWindow: 8192
    inputPricePerMTok: 1.0
    outputPricePerMTok: 2.0
  - id: s2/m2
    contextWindow: 8192
    inputPricePerMTok: 3.0
    outputPricePerMTok: 4.0
agents:
  a1: {model: s1/m1, systemPrompt: "Be brief.", maxSteps: 3, budget: {tokens: 1000}}
  a2: {model: s2/m2}
  failing: {model: broken/down}
agentDefaults: {circuitBreakerThreshold: 3}
"#;

async fn turn(gw: &Gateway, token: &str, agent: &str, user: Option<&str>, message: &str) -> Value {
    let mut params = json!({"agentId": agent, "message": message});
    if let Some(u) = user {
        params["sessionKey"] = json!({"userId": u});
    }
    ok(gw, token, "agent.execute", params).await
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn assert_totals(v: &Value, cost: f64, tokens: i64, calls: i64, saved: f64) {
    assert!(close(v["totalCost"].as_f64().unwrap(), cost), "cost {v}");
    assert_eq!(v["totalTokens"], tokens, "{v}");
    assert_eq!(v["callCount"], calls, "{v}");
    assert!(
        close(v["totalCacheSaved"].as_f64().unwrap(), saved),
        "saved {v}"
    );
}

/// Checks every billing breakdown against the figures of the scripted turns.
async fn check_billing(gw: &Gateway, started: i64) {
    // a1: 2 × plain (100 in, 10 out) in session u1 + 1 × cached (1000 in of which 800 cached,
    // 20 out) ephemeral, on s1 at $1/$2 per MTok; a2: 3 × (50 in, 5 out) on s2 at $3/$4.
    let a1_cost = 2.0 * (100.0 + 20.0) / 1e6 + (200.0 + 800.0 * 0.1 + 40.0) / 1e6;
    let a2_cost = 3.0 * (150.0 + 20.0) / 1e6;
    let saved = 800.0 * 0.9 / 1e6;
    let total = ok(gw, ADMIN, "obs.billing.total", json!({})).await;
    assert_totals(&total, a1_cost + a2_cost, 1200 + 40 + 150 + 15, 6, saved);
    let since = ok(gw, ADMIN, "obs.billing.total", json!({"sinceMs": started})).await;
    assert_eq!(since, total);
    let future = ok(
        gw,
        ADMIN,
        "obs.billing.total",
        json!({"sinceMs": started + 3_600_000}),
    )
    .await;
    assert_totals(&future, 0.0, 0, 0, 0.0);
    let a1 = ok(gw, ADMIN, "obs.billing.byAgent", json!({"agentId": "a1"})).await;
    assert_totals(&a1, a1_cost, 1240, 3, saved);
    let a2 = ok(gw, ADMIN, "obs.billing.byAgent", json!({"agentId": "a2"})).await;
    assert_totals(&a2, a2_cost, 165, 3, 0.0);
    // The failing agent's call was not billed; an unknown agent has zeros.
    for id in ["failing", "nobody"] {
        let v = ok(gw, ADMIN, "obs.billing.byAgent", json!({"agentId": id})).await;
        assert_totals(&v, 0.0, 0, 0, 0.0);
    }
    let s = ok(
        gw,
        ADMIN,
        "obs.billing.bySession",
        json!({"sessionKey": "agent:a1:api:admin:u1"}),
    )
    .await;
    assert_totals(&s, 2.0 * 120.0 / 1e6, 220, 2, 0.0);
    let p = ok(gw, ADMIN, "obs.billing.byProvider", json!({})).await;
    let providers = p["providers"].as_array().unwrap();
    assert_eq!(providers.len(), 2, "{p}");
    assert_eq!(providers[0]["provider"], "s1");
    assert_eq!(providers[0]["inputTokens"], 1200);
    assert_eq!(providers[0]["outputTokens"], 40);
    assert!(close(
        providers[0]["estimatedCostUsd"].as_f64().unwrap(),
        a1_cost
    ));
    assert_eq!(providers[1]["provider"], "s2");
    assert_eq!(providers[1]["inputTokens"], 150);
    let hours = ok(gw, ADMIN, "obs.billing.usage24h", json!({})).await;
    let hours = hours.as_array().unwrap();
    assert_eq!(hours.len(), 24);
    let sum: i64 = hours.iter().map(|h| h["tokens"].as_i64().unwrap()).sum();
    assert_eq!(sum, 1405);
    let now_hour = (agent_gateway::clock::now_ms() / 3_600_000) % 24;
    assert_eq!(hours[23]["hour"], now_hour);
    let cache = ok(gw, ADMIN, "obs.getCacheStats", json!({})).await;
    assert_eq!(cache["hits"], 1);
    assert_eq!(cache["misses"], 5);
    assert_eq!(cache["cachedTokens"], 800);
    assert!(close(cache["hitRate"].as_f64().unwrap(), 1.0 / 6.0));
    assert!(close(cache["totalCacheSaved"].as_f64().unwrap(), saved));
    let w = ok(
        gw,
        ADMIN,
        "obs.cacheStats.window",
        json!({"sinceMs": started, "agent": "a1", "provider": "s1"}),
    )
    .await;
    assert_eq!(w["window"]["callCount"], 3, "{w}");
    assert_eq!(w["window"]["hits"], 1);
    assert_eq!(w["window"]["inputTokens"], 1200);
    assert_eq!(w["window"]["cachedTokens"], 800);
    let r = gw
        .call(
            ADMIN,
            "obs.cacheStats.window",
            json!({"sinceMs": started, "untilMs": started - 1}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn billing_figures_are_the_sums_of_the_turns_before_and_after_a_restart() {
    let gw = start(OBS).await;
    let started = agent_gateway::clock::now_ms();
    turn(&gw, ADMIN, "a1", Some("u1"), "plain").await;
    turn(&gw, ADMIN, "a1", Some("u1"), "plain again").await;
    turn(&gw, ADMIN, "a1", None, "cached").await;
    for _ in 0..3 {
        turn(&gw, ADMIN, "a2", Some("u2"), "anything").await;
    }
    let failed = turn(&gw, ADMIN, "failing", None, "x").await;
    assert_eq!(failed["finishReason"], "error");
    check_billing(&gw, started).await;
    // An rpc token cannot read billing.
    let r = gw.call(RPC, "obs.billing.total", json!({})).await;
    assert_eq!(code(&r), -32603, "{r}");
    let gw = gw.restart().await;
    check_billing(&gw, started).await;
    gw.stop().await;
}

/// Runs `message` in a fresh session of a1 and returns (session key, trace id).
async fn session_ending(gw: &Gateway, user: &str, message: &str, finish: &str) -> (String, String) {
    let r = turn(gw, ADMIN, "a1", Some(user), message).await;
    assert_eq!(r["finishReason"], finish, "{message}: {r}");
    let trace = r["traceId"].as_str().unwrap().to_owned();
    assert_eq!(trace.len(), 32);
    (format!("agent:a1:api:admin:{user}"), trace)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reports_every_finish_reason_from_stored_records() {
    let gw = start(OBS).await;
    let cases = [
        ("stop", "plain", "stop", None),
        ("steps", "keep going", "max_steps", Some("max_steps")),
        (
            "budget",
            "expensive",
            "budget_exceeded",
            Some("budget_exceeded"),
        ),
        (
            "breaker",
            "break things",
            "circuit_open",
            Some("tool_circuit_open"),
        ),
        ("loop", "loop forever", "context_loop", Some("context_loop")),
        ("error", "fail hard", "error", Some("provider_error")),
    ];
    for (user, message, finish, cause) in cases {
        let (key, trace) = session_ending(&gw, user, message, finish).await;
        let report = ok(&gw, ADMIN, "obs.explain", json!({"sessionKey": key})).await;
        assert_eq!(report["schemaVersion"], 1);
        assert_eq!(report["sessionKey"], key.as_str());
        assert_eq!(report["reference"]["resolved"], true);
        assert_eq!(report["outcome"]["endReason"], finish, "{report}");
        assert_eq!(report["outcome"]["degraded"], finish != "stop");
        assert_eq!(report["timing"]["turnCount"], 1);
        assert_eq!(report["agentId"], "a1");
        assert_eq!(report["traceId"], trace.as_str());
        match cause {
            None => assert!(report["likelyRootCause"].is_null(), "{report}"),
            Some(c) => assert_eq!(report["likelyRootCause"]["code"], c, "{report}"),
        }
        // Content-free: no message, answer or tool argument text.
        let text = report.to_string();
        for leak in [message, "TOOL-ARG-MARKER", "upstream exploded", "Be brief."] {
            assert!(!text.contains(leak), "{leak} in {text}");
        }
        assert!(text.len() <= 6144, "{}", text.len());
        // Deterministic: the same bytes twice; a trace id resolves to the same report.
        let again = ok(&gw, ADMIN, "obs.explain", json!({"sessionKey": key})).await;
        assert_eq!(again.to_string(), text);
        let mut by_trace = ok(&gw, ADMIN, "obs.explain", json!({"traceId": trace})).await;
        assert_eq!(by_trace["reference"]["kind"], "traceId");
        by_trace["reference"] = report["reference"].clone();
        assert_eq!(by_trace, report);
        if finish == "circuit_open" {
            let failures = report["failures"].as_array().unwrap();
            assert_eq!(failures.len(), 3, "{report}");
            assert_eq!(failures[0]["toolName"], "no_such_tool");
            assert_eq!(failures[0]["errorKind"], "not_available");
            assert!(failures[0]["resultDigest"]
                .as_str()
                .unwrap()
                .starts_with("sha256:"));
            assert!(failures[0].get("errorPreview").is_none());
            assert!(failures[0]["seq"].as_i64() > failures[2]["seq"].as_i64());
            assert_eq!(report["breakerTimeline"][0]["event"], "opened");
            assert_eq!(report["toolStats"]["no_such_tool"]["failed"], 3);
        }
        if finish == "budget_exceeded" {
            // The first step's 1,100 tokens passed the budget of 1,000: its tool never ran.
            assert_eq!(report["toolStats"], json!({}));
            assert_eq!(report["cost"]["totalTokens"], 1100);
        }
        assert!(report["contextBudget"]["windowTokens"] == 8192, "{report}");
    }
    // Unresolvable references are a report, not an error; no reference at all is -32602.
    for (param, value) in [
        ("sessionKey", "agent:a1:api:admin:nobody"),
        ("traceId", "0123456789abcdef0123456789abcdef"),
        ("rootRunId", "run_nope"),
    ] {
        let r = ok(&gw, ADMIN, "obs.explain", json!({ param: value })).await;
        assert_eq!(r["reference"]["resolved"], false);
        assert_eq!(r["reference"]["kind"], param);
        assert!(r["sessionKey"].is_null());
        assert_eq!(r["likelyRootCause"]["code"], "session_not_found");
        assert!(r["likelyRootCause"]["detail"]
            .as_str()
            .unwrap()
            .contains(value));
    }
    let r = gw
        .call(ADMIN, "obs.explain", json!({"depth": "full"}))
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    let r = gw
        .call(
            ADMIN,
            "obs.explain",
            json!({"sessionKey": "x", "depth": "deep"}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");

    // Fleet health over the mix: six sessions, five degraded.
    let fleet = ok(&gw, ADMIN, "obs.fleet.health", json!({})).await;
    assert_eq!(fleet["schemaVersion"], 1);
    assert_eq!(fleet["sessions"]["run"], 6, "{fleet}");
    assert_eq!(fleet["sessions"]["degraded"], 5);
    for cause in [
        "max_steps",
        "budget_exceeded",
        "circuit_open",
        "context_loop",
        "error",
    ] {
        assert_eq!(fleet["degradedByCause"][cause], 1, "{cause}: {fleet}");
    }
    assert_eq!(fleet["breakerTrips"], 1);
    assert_eq!(fleet["toolStats"]["no_such_tool"]["failed"], 3);
    assert_eq!(fleet["likelyRootCause"]["code"], "fleet_high_degraded_rate");
    assert_eq!(fleet["pipelineAuthoringGate"]["buildAuthor"], false);
    assert!(fleet.get("autonomy").is_none());
    let again = ok(&gw, ADMIN, "obs.fleet.health", json!({})).await;
    assert_eq!(again["sessions"], fleet["sessions"]);
    for bad in [json!({"sinceHours": 0}), json!({"sinceHours": 721})] {
        let r = gw.call(ADMIN, "obs.fleet.health", bad).await;
        assert_eq!(code(&r), -32602, "{r}");
    }
    let r = ok(&gw, ADMIN, "obs.fleet.health", json!({"sinceHours": 720})).await;
    assert_eq!(r["window"]["sinceHours"], 720.0);
    // An ephemeral turn (no session) is explained from its index rows, digests included.
    let eph = turn(&gw, ADMIN, "a1", None, "break things").await;
    let report = ok(
        &gw,
        ADMIN,
        "obs.explain",
        json!({"traceId": eph["traceId"], "depth": "full"}),
    )
    .await;
    assert_eq!(report["reference"]["resolved"], true, "{report}");
    assert_eq!(report["outcome"]["endReason"], "circuit_open");
    assert_eq!(report["likelyRootCause"]["code"], "tool_circuit_open");
    let failures = report["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 3, "{report}");
    for f in failures {
        assert!(
            f["resultDigest"].as_str().unwrap().starts_with("sha256:"),
            "{f}"
        );
        assert!(f["resultBytes"].as_i64().unwrap() > 0, "{f}");
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_index_is_searched_filtered_tailed_and_exported() {
    let gw = start(OBS).await;
    let (key, trace) = session_ending(&gw, "t1", "break things", "circuit_open").await;
    session_ending(&gw, "t2", "plain", "stop").await;
    // By trace id: inbound, three tool results, turn end (no answer: the breaker opened).
    let rows = ok(&gw, ADMIN, "obs.trace.search", json!({"traceId": trace})).await["rows"].clone();
    let kinds: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.len(), 5, "{rows}");
    assert!(kinds.contains(&"inbound") && kinds.contains(&"turn_end"));
    assert!(!kinds.contains(&"outbound"));
    assert_eq!(kinds.iter().filter(|k| **k == "tool_result").count(), 3);
    let end = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "turn_end")
        .unwrap();
    assert_eq!(end["finishReason"], "circuit_open");
    assert_eq!(end["sessionKey"], key.as_str());
    assert_eq!(end["chatId"], key.as_str());
    assert!(!rows.to_string().contains("TOOL-ARG-MARKER"));
    // The where filter: parsed, never SQL; a bad expression is -32602.
    let errors = ok(
        &gw,
        ADMIN,
        "obs.trace.search",
        json!({"where": "kind = tool_result and status = error and toolName = no_such_tool"}),
    )
    .await;
    assert_eq!(errors["rows"].as_array().unwrap().len(), 3, "{errors}");
    let none = ok(
        &gw,
        ADMIN,
        "obs.trace.search",
        json!({"where": "toolName = \"x' OR 1=1 --\""}),
    )
    .await;
    assert_eq!(none["rows"], json!([]));
    for bad in [
        "nosuch = 1",
        "durationMs = fast",
        "toolName < a",
        "kind = 'open",
        "kind = x or kind = y",
    ] {
        let r = gw
            .call(ADMIN, "obs.trace.search", json!({"where": bad}))
            .await;
        assert_eq!(code(&r), -32602, "{bad}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains("where"));
    }
    // Limit at the maximum and past it; since.
    let all = ok(&gw, ADMIN, "obs.trace.search", json!({"limit": 1000})).await;
    assert_eq!(all["rows"].as_array().unwrap().len(), 8, "{all}");
    let r = gw
        .call(ADMIN, "obs.trace.search", json!({"limit": 1001}))
        .await;
    assert_eq!(code(&r), -32602);
    let two = ok(&gw, ADMIN, "obs.trace.search", json!({"limit": 2})).await;
    assert_eq!(two["rows"].as_array().unwrap().len(), 2);
    let recent = ok(&gw, ADMIN, "obs.trace.search", json!({"since": "1h"})).await;
    assert_eq!(recent["rows"].as_array().unwrap().len(), 8);
    let r = gw
        .call(ADMIN, "obs.trace.search", json!({"since": "yesterday"}))
        .await;
    assert_eq!(code(&r), -32602);
    // Tail a chat from the start: oldest first, nextSinceMs moves on.
    let tail = ok(
        &gw,
        ADMIN,
        "obs.trace.tail",
        json!({"chatId": key, "sinceMs": 0}),
    )
    .await;
    let events = tail["events"].as_array().unwrap();
    assert_eq!(events.len(), 5);
    assert_eq!(events[0]["kind"], "inbound");
    let next = tail["nextSinceMs"].as_i64().unwrap();
    let later = ok(
        &gw,
        ADMIN,
        "obs.trace.tail",
        json!({"chatId": key, "sinceMs": next}),
    )
    .await;
    assert_eq!(later["events"], json!([]));
    assert_eq!(later["nextSinceMs"], next);
    // Export: a file under the data directory with the session's records.
    let export = ok(&gw, ADMIN, "obs.trace.export", json!({"sessionId": key})).await;
    let path = std::path::PathBuf::from(export["bundlePath"].as_str().unwrap());
    assert!(path.starts_with(gw.dir.path()), "{path:?}");
    let bundle: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(bundle["sessionKey"], key.as_str());
    assert_eq!(bundle["trajectory"].as_array().unwrap().len(), 5);
    assert!(!bundle["messages"].as_array().unwrap().is_empty());
    // The session's own diagnostics only (created, failed), not the other session's.
    let kinds: Vec<&str> = bundle["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["message.failed", "session.created"], "{bundle}");
    assert_eq!(export["bytes"], std::fs::metadata(&path).unwrap().len());
    let r = gw
        .call(ADMIN, "obs.trace.export", json!({"sessionId": "nope"}))
        .await;
    assert_eq!(code(&r), -32001, "{r}");
    // Reset of the index: the rows are gone.
    let reset = ok(
        &gw,
        ADMIN,
        "obs.reset.table",
        json!({"table": "trace_index"}),
    )
    .await;
    assert_eq!(reset["rowsDeleted"], 8);
    let all = ok(&gw, ADMIN, "obs.trace.search", json!({})).await;
    assert_eq!(all["rows"], json!([]));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagnostics_show_an_rpc_caller_only_its_own_sessions() {
    let gw = start(OBS).await;
    turn(&gw, RPC, "a1", Some("mine"), "plain").await;
    turn(&gw, ADMIN, "a1", Some("theirs"), "plain").await;
    turn(&gw, ADMIN, "failing", Some("down"), "x").await;
    let own = ok(&gw, RPC, "obs.diagnostics", json!({})).await;
    let events = own["events"].as_array().unwrap();
    assert!(!events.is_empty(), "{own}");
    for e in events {
        let key = e["sessionKey"].as_str().unwrap_or("");
        assert!(
            key.is_empty() || key.contains(":client:"),
            "another tenant's event: {e}"
        );
    }
    assert!(!own.to_string().contains(":admin:"), "{own}");
    assert_eq!(own["counts"]["message"], 1, "{own}");
    assert_eq!(own["counts"]["session"], 1, "{own}");
    let all = ok(&gw, ADMIN, "obs.diagnostics", json!({})).await;
    assert!(all.to_string().contains("agent:a1:api:admin:theirs"));
    assert_eq!(all["counts"]["usage"], 1, "{all}");
    assert_eq!(all["counts"]["message"], 3, "{all}");
    let failed = ok(
        &gw,
        ADMIN,
        "obs.diagnostics",
        json!({"category": "usage", "limit": 1}),
    )
    .await;
    let e = &failed["events"][0];
    assert_eq!(e["type"], "usage.failed");
    assert_eq!(e["data"]["provider"], "broken");
    assert!(!failed.to_string().contains("bad gateway"));
    // The limit at its maximum and past it; an unknown category.
    ok(&gw, RPC, "obs.diagnostics", json!({"limit": 1000})).await;
    for bad in [json!({"limit": 1001}), json!({"category": "secrets"})] {
        let r = gw.call(RPC, "obs.diagnostics", bad).await;
        assert_eq!(code(&r), -32602, "{r}");
    }
    // Everything else in obs is admin.
    for method in [
        "obs.trace.search",
        "obs.explain",
        "obs.fleet.health",
        "obs.reset",
    ] {
        let r = gw.call(RPC, method, json!({})).await;
        assert_eq!(code(&r), -32603, "{method}: {r}");
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_reports_context_snapshots_channels_and_resets() {
    let gw = start(OBS).await;
    let (key, trace) = session_ending(&gw, "p", "plain", "stop").await;
    turn(&gw, ADMIN, "a1", Some("p"), "plain twice").await;
    let latest = ok(
        &gw,
        ADMIN,
        "obs.systemPromptReport.latest",
        json!({"agentId": "a1", "sessionId": key}),
    )
    .await;
    let report = &latest["report"];
    assert_eq!(report["sessionId"], key.as_str());
    assert_eq!(report["totalChars"], "Be brief.".len());
    assert!(report["toolCount"].as_i64().unwrap() > 0);
    assert!(!latest.to_string().contains("Be brief."));
    let first = ok(
        &gw,
        ADMIN,
        "obs.systemPromptReport.latest",
        json!({"agentId": "a1", "sessionId": key, "runId": trace}),
    )
    .await;
    assert_eq!(first["report"]["runId"], trace.as_str());
    let list = ok(
        &gw,
        ADMIN,
        "obs.systemPromptReport.list",
        json!({"sessionId": key}),
    )
    .await;
    assert_eq!(list["reports"].as_array().unwrap().len(), 2);
    let none = ok(
        &gw,
        ADMIN,
        "obs.systemPromptReport.latest",
        json!({"agentId": "a1", "sessionId": "nope"}),
    )
    .await;
    assert!(none["report"].is_null());
    // Context pipeline: the agent's window and the last turn's layer use.
    let pipe = ok(&gw, ADMIN, "obs.context.pipeline", json!({"agentId": "a1"})).await;
    let a1 = &pipe["pipelines"][0];
    assert_eq!(a1["windowTokens"], 8192);
    assert!(
        a1["layers"][0]["lastUsedTokens"].as_i64().unwrap() > 0,
        "{pipe}"
    );
    let r = gw
        .call(ADMIN, "obs.context.pipeline", json!({"agentId": "ghost"}))
        .await;
    assert_eq!(code(&r), -32001);
    // The DAG snapshot: four messages, no summary yet.
    let dag = ok(&gw, ADMIN, "obs.context.dag", json!({"agentId": "a1"})).await;
    let snap = &dag["snapshots"][0];
    assert_eq!(snap["sessionKey"], key.as_str());
    assert_eq!(snap["nodeCount"], 4);
    assert_eq!(snap["summaryNodes"], 0);
    assert_eq!(snap["compactions"], json!([]));
    // Channels: two turns in and out on the api channel.
    let ch = ok(&gw, ADMIN, "obs.channels.get", json!({"channelId": "api"})).await;
    assert_eq!(ch["channel"]["messagesReceived"], 2, "{ch}");
    assert_eq!(ch["channel"]["messagesSent"], 2);
    let none = ok(
        &gw,
        ADMIN,
        "obs.channels.get",
        json!({"channelId": "slack"}),
    )
    .await;
    assert!(none["channel"].is_null());
    let all = ok(&gw, ADMIN, "obs.channels.all", json!({})).await;
    assert_eq!(all["channels"].as_array().unwrap().len(), 1);
    let stale = ok(&gw, ADMIN, "obs.channels.stale", json!({"thresholdMs": 0})).await;
    assert_eq!(stale["stale"].as_array().unwrap().len(), 1);
    let fresh = ok(&gw, ADMIN, "obs.channels.stale", json!({})).await;
    assert_eq!(fresh["stale"], json!([]));
    // Delivery: nothing is delivered to chat platforms yet, so nothing is shown.
    let d = ok(&gw, ADMIN, "obs.delivery.stats", json!({})).await;
    assert_eq!(d["total"], 0);
    let d = ok(&gw, ADMIN, "obs.delivery.recent", json!({})).await;
    assert_eq!(d["deliveries"], json!([]));
    // Reset everything.
    let reset = ok(&gw, ADMIN, "obs.reset", json!({})).await;
    assert_eq!(reset["reset"], true);
    let rows = &reset["rowsDeleted"];
    assert_eq!(rows["tokenUsage"], 2, "{reset}");
    assert_eq!(rows["traceIndex"], 6);
    assert_eq!(rows["promptReports"], 2);
    assert_eq!(rows["channels"], 1);
    assert_eq!(rows["delivery"], 0);
    assert!(rows["diagnostics"].as_i64().unwrap() >= 3);
    let total = ok(&gw, ADMIN, "obs.billing.total", json!({})).await;
    assert_eq!(total["callCount"], 0);
    let r = gw
        .call(ADMIN, "obs.reset.table", json!({"table": "sessions"}))
        .await;
    assert_eq!(code(&r), -32602);
    gw.stop().await;
}
