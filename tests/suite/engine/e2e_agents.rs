//! The agent engine over JSON-RPC on loopback, driven by the scripted provider: every finish
//! reason, budgets, the tool circuit breaker, loop detection, retries and failover, built-in
//! tools, sessions, agents, providers, models, background runs, and usage accounting.

use crate::common::*;
use serde_json::{json, Value};

const ENGINE: &str = r#"
providers:
  script:
    type: scripted
    models: [m1, m2]
    maxRetries: 1
    script:
      - match: "use the clock"
        steps:
          - toolCalls: [{name: current_time}]
            usage: {input: 20, output: 4}
          - reply: "It is now."
            usage: {input: 30, output: 6}
      - match: "loop forever"
        steps:
          - toolCalls: [{name: current_time, arguments: {}}]
      - match: "keep going"
        steps:
          - toolCalls: [{name: memory_search, arguments: {query: a}}]
          - toolCalls: [{name: memory_search, arguments: {query: b}}]
          - toolCalls: [{name: memory_search, arguments: {query: c}}]
          - toolCalls: [{name: memory_search, arguments: {query: d}}]
      - match: "expensive"
        steps:
          - toolCalls: [{name: current_time}]
            usage: {input: 600, output: 500}
          - reply: "done"
      - match: "break things"
        steps:
          - toolCalls: [{name: no_such_tool, arguments: {n: 1}}]
          - toolCalls: [{name: no_such_tool, arguments: {n: 2}}]
          - toolCalls: [{name: no_such_tool, arguments: {n: 3}}]
          - reply: "never"
      - match: "fail hard"
        steps:
          - error: {status: 500, message: "upstream exploded"}
      - match: "flaky"
        steps:
          - error: {status: 503}
            failTimes: 1
            reply: "recovered"
      - match: "remember"
        steps:
          - toolCalls: [{name: memory_store, arguments: {content: "The user's cat is named Mochi", tags: [pets]}}]
          - reply: "Noted."
      - match: "recall"
        steps:
          - toolCalls: [{name: memory_search, arguments: {query: "cat named"}}]
          - reply: "Your cat is Mochi."
      - match: "note this"
        steps:
          - toolCalls: [{name: session_note_add, arguments: {note: "prefers metric units"}}]
          - toolCalls: [{name: session_notes}]
          - reply: "ok"
      - match: "cached"
        steps:
          - reply: "from cache"
            usage: {input: 100, output: 5, cached: 80}
  broken:
    type: scripted
    models: [down]
    maxRetries: 0
    script:
      - steps: [{error: {status: 502, message: "bad gateway"}}]
models:
  - id: script/m1
    aliases: [first]
    contextWindow: 4096
    inputPricePerMTok: 1.0
    outputPricePerMTok: 2.0
agents:
  default: {model: script/m1, systemPrompt: "Be brief.", maxSteps: 3, budget: {tokens: 1000}}
  failover: {model: broken/down, fallbackModels: [script/m2]}
  narrow: {model: script/m1, tools: [current_time]}
agentDefaults: {circuitBreakerThreshold: 3, context: {keepRecentMessages: 4}}
providerPolicy: {apiKeyEnvAllowlist: [AGENT_GATEWAY_TEST_UNSET_KEY], allowLoopbackBaseUrl: true}
"#;

async fn engine() -> Gateway {
    start(ENGINE).await
}

fn session(user: &str) -> Value {
    json!({"userId": user})
}

async fn execute(gw: &Gateway, token: &str, params: Value) -> Value {
    let r = gw.call(token, "agent.execute", params.clone()).await;
    r.get("result")
        .cloned()
        .unwrap_or_else(|| panic!("agent.execute {params}: {r}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_finish_reason() {
    let gw = engine().await;
    let cases = [
        ("hi there", "stop", "You said: hi there"),
        ("use the clock", "stop", "It is now."),
        ("keep going", "max_steps", ""),
        ("expensive", "budget_exceeded", ""),
        ("break things", "circuit_open", ""),
        ("loop forever", "context_loop", ""),
        ("fail hard", "error", ""),
        ("flaky", "stop", "recovered"),
    ];
    for (msg, finish, response) in cases {
        let r = execute(&gw, RPC, json!({"message": msg})).await;
        validate_result("agent.execute", &r);
        assert_eq!(r["finishReason"], finish, "{msg}: {r}");
        if !response.is_empty() {
            assert_eq!(r["response"], response, "{msg}: {r}");
        }
        let t = &r["tokensUsed"];
        assert_eq!(
            t["total"].as_i64().unwrap(),
            t["input"].as_i64().unwrap() + t["output"].as_i64().unwrap()
        );
    }
    // Tokens are summed over the steps of a turn.
    let r = execute(&gw, RPC, json!({"message": "use the clock"})).await;
    assert_eq!(
        r["tokensUsed"],
        json!({"input": 50, "output": 10, "total": 60})
    );
    // A provider failure after its retries says what failed (kind and status), never in
    // the upstream's own words.
    let r = execute(&gw, RPC, json!({"message": "fail hard"})).await;
    assert_eq!(
        (&r["response"], &r["errorKind"]),
        (
            &json!("The model call failed (provider_error, upstream HTTP 500)"),
            &json!("provider_error")
        ),
        "{r}"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_to_the_fallback_model_and_usage_per_provider() {
    let gw = engine().await;
    let r = execute(
        &gw,
        RPC,
        json!({"message": "anything", "agentId": "failover"}),
    )
    .await;
    assert_eq!(r["finishReason"], "stop");
    assert_eq!(r["response"], "You said: anything");
    // Usage rows were written for the failed primary and the fallback; cache figures too.
    execute(&gw, RPC, json!({"message": "cached"})).await;
    let stats = ok(&gw, ADMIN, "agent.cacheStats", json!({})).await;
    assert_eq!(stats["hits"], 1, "{stats}");
    assert_eq!(stats["cachedTokens"], 80);
    // 80 cached tokens at $1/M, 90% saved.
    let saved = stats["totalCacheSaved"].as_f64().unwrap();
    assert!((saved - 80.0 * 0.9 / 1e6).abs() < 1e-12, "{saved}");
    let by_agent = ok(
        &gw,
        ADMIN,
        "agent.cacheStats",
        json!({"agentId": "failover"}),
    )
    .await;
    assert_eq!(by_agent["hits"], 0);
    assert_eq!(by_agent["misses"], 1, "{by_agent}");
    let unknown = gw
        .call(ADMIN, "agent.cacheStats", json!({"agentId": "nope"}))
        .await;
    assert_eq!(code(&unknown), -32001);
    let ops = ok(
        &gw,
        ADMIN,
        "agent.getOperationModels",
        json!({"agentId": "failover"}),
    )
    .await;
    assert_eq!(ops["primaryModel"], "broken/down");
    assert_eq!(ops["providerFamily"], "scripted");
    assert_eq!(ops["operations"][0]["operationType"], "chat");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_persist_and_the_session_methods_manage_them() {
    let gw = engine().await;
    let key = session("alice");
    execute(
        &gw,
        RPC,
        json!({"message": "first question", "sessionKey": key}),
    )
    .await;
    execute(
        &gw,
        RPC,
        json!({"message": "use the clock", "sessionKey": key}),
    )
    .await;
    let list = ok(&gw, RPC, "session.list", json!({})).await;
    assert_eq!(list["total"], 1, "{list}");
    let s = &list["sessions"][0];
    let sk = s["sessionKey"].as_str().unwrap().to_owned();
    assert_eq!(sk, "agent:default:api:client:alice");
    // user, assistant, then user, assistant(tool call), tool, assistant.
    assert_eq!(s["messageCount"], 6);
    let h = ok(&gw, RPC, "session.history", json!({"session_key": sk})).await;
    let roles: Vec<&str> = h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "user",
            "assistant",
            "tool",
            "assistant"
        ]
    );
    assert_eq!(h["messages"][3]["toolCalls"][0]["name"], "current_time");
    assert_eq!(h["messages"][4]["toolName"], "current_time");
    assert_eq!(h["messages"][5]["model"], "script/m1");
    assert_eq!(h["messages"][5]["tokensUsed"]["total"], 36);
    // Paging backwards.
    let page = ok(
        &gw,
        RPC,
        "session.history",
        json!({"session_key": sk, "limit": 2}),
    )
    .await;
    assert_eq!(page["hasMore"], true);
    assert_eq!(page["messages"][0]["seq"], 4);
    let older = ok(
        &gw,
        RPC,
        "session.history",
        json!({"session_key": sk, "limit": 10, "before": 4}),
    )
    .await;
    assert_eq!(older["messages"].as_array().unwrap().len(), 4);
    assert_eq!(older["hasMore"], false);
    // Status and search.
    let st = ok(&gw, RPC, "session.status", json!({"session_key": sk})).await;
    assert_eq!(st["stepsExecuted"], 2);
    assert_eq!(st["maxSteps"], 3);
    assert_eq!(
        code(&gw.call(RPC, "session.status", json!({})).await),
        -32602
    );
    let hits = ok(
        &gw,
        RPC,
        "session.search",
        json!({"query": "first question"}),
    )
    .await;
    assert_eq!(hits[0]["sessionKey"], sk.as_str(), "{hits}");
    assert!(hits[0]["snippet"].as_str().unwrap().contains("first"));
    // Another tenant (rpc token) sees nothing of it; admin sees all.
    execute(
        &gw,
        ADMIN,
        json!({"message": "admin talk", "sessionKey": session("root")}),
    )
    .await;
    let mine = ok(&gw, RPC, "session.list", json!({})).await;
    assert_eq!(mine["total"], 1);
    let all = ok(&gw, ADMIN, "session.list", json!({})).await;
    assert_eq!(all["total"], 2);
    let other = "agent:default:api:admin:root";
    assert_eq!(
        code(
            &gw.call(RPC, "session.history", json!({"session_key": other}))
                .await
        ),
        -32001
    );
    let none = ok(&gw, RPC, "session.search", json!({"query": "admin talk"})).await;
    assert_eq!(none, json!([]));
    let bad = gw
        .call(
            RPC,
            "agent.execute",
            json!({"message": "x", "sessionKey": {"tenantId": "admin"}}),
        )
        .await;
    // The catalogue's `tenant` rule: another tenant is not found, like a missing session.
    assert_eq!(code(&bad), -32001, "{bad}");
    assert_eq!(bad["error"]["message"], "Session not found: admin");
    // Filters and pagination.
    let paged = ok(&gw, ADMIN, "session.list", json!({"limit": 1})).await;
    assert_eq!(paged["hasMore"], true);
    let by_agent = ok(&gw, ADMIN, "session.list", json!({"agent_id": "narrow"})).await;
    assert_eq!(by_agent["total"], 0);
    // Export, compact, reset, delete.
    let ex = ok(&gw, ADMIN, "session.export", json!({"session_key": sk})).await;
    assert_eq!(ex["messageCount"], 6);
    let c = ok(
        &gw,
        ADMIN,
        "session.compact",
        json!({"key": sk, "instructions": "keep names"}),
    )
    .await;
    // The first turn (before the last keepRecentMessages: 4) became one leaf summary; the
    // transcript is kept whole.
    assert_eq!(c["compactionTriggered"], true);
    assert_eq!(c["messageCount"], 5);
    assert_eq!(c["previousMessageCount"], 6);
    let h = ok(&gw, ADMIN, "session.history", json!({"session_key": sk})).await;
    assert_eq!(h["messages"].as_array().unwrap().len(), 6);
    assert_eq!(h["messages"][0]["role"], "user");
    let tree = ok(&gw, ADMIN, "context.tree", json!({"conversation_id": sk})).await;
    assert_eq!(tree["nodes"].as_array().unwrap().len(), 1, "{tree}");
    let again = ok(&gw, ADMIN, "session.compact", json!({"key": sk})).await;
    assert_eq!(again["compactionTriggered"], false);
    let r = ok(&gw, ADMIN, "session.reset", json!({"session_key": sk})).await;
    assert_eq!(r["previousMessageCount"], 6);
    let tree = ok(&gw, ADMIN, "context.tree", json!({"conversation_id": sk})).await;
    assert_eq!(tree["nodes"], json!([]), "{tree}");
    let d = ok(&gw, ADMIN, "session.delete", json!({"session_key": other})).await;
    assert_eq!(d["transcript"]["messageCount"], 2);
    assert_eq!(
        code(
            &gw.call(ADMIN, "session.delete", json!({"session_key": other}))
                .await
        ),
        -32001
    );
    assert_eq!(
        code(
            &gw.call(ADMIN, "session.export", json!({"session_key": "nope"}))
                .await
        ),
        -32001
    );
    // reset_conversation: purge_derived needs memory; an absent session is not an error.
    assert_eq!(
        code(
            &gw.call(
                ADMIN,
                "session.reset_conversation",
                json!({"session_key": sk, "purge_derived": true})
            )
            .await
        ),
        -32602
    );
    let rc = ok(
        &gw,
        ADMIN,
        "session.reset_conversation",
        json!({"session_key": sk, "memory": true}),
    )
    .await;
    assert_eq!(rc["memoriesDeleted"], 0);
    let rc = ok(
        &gw,
        ADMIN,
        "session.reset_conversation",
        json!({"session_key": "gone"}),
    )
    .await;
    assert_eq!(rc["sessionMessagesCleared"], 0);
    assert!(rc.get("memoriesDeleted").is_none());
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_in_tools_remember_across_sessions_and_keep_notes() {
    let gw = engine().await;
    let r = execute(
        &gw,
        RPC,
        json!({"message": "remember this", "sessionKey": session("a")}),
    )
    .await;
    assert_eq!(r["response"], "Noted.");
    let r = execute(
        &gw,
        RPC,
        json!({"message": "recall it", "sessionKey": session("b")}),
    )
    .await;
    assert_eq!(r["finishReason"], "stop");
    let sk = "agent:default:api:client:b";
    let h = ok(&gw, RPC, "session.history", json!({"session_key": sk})).await;
    let tool = &h["messages"][2];
    assert_eq!(tool["toolName"], "memory_search");
    assert!(
        tool["content"].as_str().unwrap().contains("Mochi"),
        "{tool}"
    );
    // Notes belong to the session.
    execute(
        &gw,
        RPC,
        json!({"message": "note this", "sessionKey": session("c")}),
    )
    .await;
    let h = ok(
        &gw,
        RPC,
        "session.history",
        json!({"session_key": "agent:default:api:client:c"}),
    )
    .await;
    let listed = &h["messages"][4];
    assert_eq!(listed["toolName"], "session_notes");
    assert!(listed["content"]
        .as_str()
        .unwrap()
        .contains("prefers metric units"));
    // Without a session there is nowhere to keep notes: the tool fails, the turn goes on.
    let r = execute(&gw, RPC, json!({"message": "note this"})).await;
    assert_eq!(r["finishReason"], "stop");
    // An agent limited to current_time cannot call memory tools (the breaker counts it).
    let r = execute(
        &gw,
        RPC,
        json!({"message": "remember this", "agentId": "narrow", "sessionKey": session("n")}),
    )
    .await;
    let h = ok(
        &gw,
        RPC,
        "session.history",
        json!({"session_key": "agent:narrow:api:client:n"}),
    )
    .await;
    assert_eq!(h["messages"][2]["isError"], true, "{h}");
    assert_eq!(r["response"], "Noted.");
    // Narrowing the scopes of a turn to none the tools need removes them too.
    let r = execute(
        &gw,
        RPC,
        json!({"message": "use the clock", "scopes": ["admin"]}),
    )
    .await;
    assert_eq!(r["finishReason"], "stop");
    let bad = gw
        .call(
            RPC,
            "agent.execute",
            json!({"message": "x", "scopes": ["root"]}),
        )
        .await;
    assert_eq!(code(&bad), -32602);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_are_managed_and_suspended_agents_refuse_turns() {
    let gw = engine().await;
    let list = ok(&gw, ADMIN, "agents.list", json!({})).await;
    assert_eq!(
        list,
        json!({"agents": ["default", "failover", "narrow"], "defaultAgentId": "default"})
    );
    let created = ok(&gw, ADMIN, "agents.create", json!({"agentId": "helper", "config": {"model": "script/m2", "systemPrompt": "Help.", "budget": {"costUsd": 0.5}}})).await;
    assert_eq!(created["agent"]["provider"], "script");
    assert_eq!(created["agent"]["maxSteps"], 10);
    assert_eq!(created["agent"]["tools"], json!(["*"]));
    assert_eq!(
        code(
            &gw.call(ADMIN, "agents.create", json!({"agentId": "helper"}))
                .await
        ),
        -32002
    );
    assert_eq!(
        code(
            &gw.call(
                ADMIN,
                "agents.create",
                json!({"agentId": "x", "config": {"model": "script/nope"}})
            )
            .await
        ),
        -32602
    );
    assert_eq!(
        code(
            &gw.call(
                ADMIN,
                "agents.create",
                json!({"agentId": "x", "config": {"model": "script/m1", "provider": "broken"}})
            )
            .await
        ),
        -32602
    );
    assert_eq!(
        code(
            &gw.call(ADMIN, "agents.create", json!({"agentId": "bad id"}))
                .await
        ),
        -32602
    );
    let dry = ok(
        &gw,
        ADMIN,
        "agents.update",
        json!({"agentId": "helper", "config": {"maxSteps": 2}, "dryRun": true}),
    )
    .await;
    assert_eq!(
        (dry["updated"].clone(), dry["agent"]["maxSteps"].clone()),
        (json!(false), json!(2))
    );
    let got = ok(&gw, ADMIN, "agents.get", json!({"agentId": "helper"})).await;
    assert_eq!(got["maxSteps"], 10);
    ok(
        &gw,
        ADMIN,
        "agents.update",
        json!({"agentId": "helper", "config": {"maxSteps": 2, "name": "Helper"}}),
    )
    .await;
    let got = ok(&gw, ADMIN, "agents.get", json!({"agentId": "helper"})).await;
    assert_eq!(
        (got["maxSteps"].clone(), got["name"].clone()),
        (json!(2), json!("Helper"))
    );
    let r = execute(
        &gw,
        RPC,
        json!({"message": "keep going", "agentId": "helper"}),
    )
    .await;
    assert_eq!(r["finishReason"], "max_steps");
    // Suspension.
    let s = ok(&gw, ADMIN, "agents.suspend", json!({"agentId": "helper"})).await;
    assert_eq!(s["changed"], true);
    let s = ok(&gw, ADMIN, "agents.suspend", json!({"agentId": "helper"})).await;
    assert_eq!(s["changed"], false);
    let refused = gw
        .call(
            RPC,
            "agent.execute",
            json!({"message": "hi", "agentId": "helper"}),
        )
        .await;
    assert_eq!(code(&refused), -32002);
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .contains("suspended"));
    let r = ok(&gw, ADMIN, "agents.resume", json!({"agentId": "helper"})).await;
    assert_eq!(r["changed"], true);
    execute(&gw, RPC, json!({"message": "hi", "agentId": "helper"})).await;
    // Deletion; the default agent stays.
    assert_eq!(
        code(
            &gw.call(ADMIN, "agents.delete", json!({"agentId": "default"}))
                .await
        ),
        -32002
    );
    ok(&gw, ADMIN, "agents.delete", json!({"agentId": "helper"})).await;
    assert_eq!(
        code(
            &gw.call(ADMIN, "agents.get", json!({"agentId": "helper"}))
                .await
        ),
        -32001
    );
    assert_eq!(
        code(
            &gw.call(
                RPC,
                "agent.execute",
                json!({"message": "hi", "agentId": "helper"})
            )
            .await
        ),
        -32001
    );
    // The rpc scope cannot manage agents.
    assert_eq!(code(&gw.call(RPC, "agents.list", json!({})).await), -32603);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_and_models_change_without_a_restart() {
    let gw = engine().await;
    let providers = ok(&gw, ADMIN, "providers.list", json!({})).await;
    let ids: Vec<&str> = providers["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["providerId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["broken", "script"]);
    let created = ok(&gw, ADMIN, "providers.create", json!({"providerId": "demo", "config": {"type": "scripted", "models": ["d1"], "script": [{"steps": [{"reply": "demo says hi"}]}]}})).await;
    assert_eq!(created["provider"]["apiKeyConfigured"], true);
    assert_eq!(
        code(
            &gw.call(
                ADMIN,
                "providers.create",
                json!({"providerId": "demo", "config": {"type": "scripted"}})
            )
            .await
        ),
        -32002
    );
    assert_eq!(
        code(
            &gw.call(
                ADMIN,
                "providers.create",
                json!({"providerId": "x", "config": {}})
            )
            .await
        ),
        -32602
    );
    assert_eq!(
        code(
            &gw.call(
                ADMIN,
                "providers.create",
                json!({"providerId": "x", "config": {"type": "openai", "apiKeyEnv": "sk-raw-key"}})
            )
            .await
        ),
        -32602
    );
    ok(
        &gw,
        ADMIN,
        "agents.create",
        json!({"agentId": "demo-agent", "config": {"model": "demo/d1"}}),
    )
    .await;
    let r = execute(
        &gw,
        RPC,
        json!({"message": "hello", "agentId": "demo-agent"}),
    )
    .await;
    assert_eq!(r["response"], "demo says hi");
    ok(
        &gw,
        ADMIN,
        "providers.update",
        json!({"providerId": "demo", "config": {"script": [{"steps": [{"reply": "updated"}]}]}}),
    )
    .await;
    let r = execute(
        &gw,
        RPC,
        json!({"message": "hello", "agentId": "demo-agent"}),
    )
    .await;
    assert_eq!(r["response"], "updated");
    assert_eq!(
        code(
            &gw.call(
                ADMIN,
                "providers.update",
                json!({"providerId": "demo", "config": {"type": "openai"}})
            )
            .await
        ),
        -32002
    );
    let got = ok(&gw, ADMIN, "providers.get", json!({"providerId": "demo"})).await;
    assert_eq!(got["agentsUsing"], json!(["demo-agent"]));
    // Disabled: its agent cannot run (no fallback).
    let d = ok(
        &gw,
        ADMIN,
        "providers.disable",
        json!({"providerId": "demo"}),
    )
    .await;
    assert_eq!(d["agentsUsing"], json!(["demo-agent"]));
    assert!(d["warning"].is_string());
    let refused = gw
        .call(
            RPC,
            "agent.execute",
            json!({"message": "hello", "agentId": "demo-agent"}),
        )
        .await;
    assert_eq!(code(&refused), -32003, "{refused}");
    let models = ok(&gw, ADMIN, "models.list", json!({"provider": "demo"})).await;
    assert_eq!(models["models"][0]["available"], false);
    ok(
        &gw,
        ADMIN,
        "providers.enable",
        json!({"providerId": "demo"}),
    )
    .await;
    execute(
        &gw,
        RPC,
        json!({"message": "hello", "agentId": "demo-agent"}),
    )
    .await;
    assert_eq!(
        code(
            &gw.call(ADMIN, "providers.delete", json!({"providerId": "demo"}))
                .await
        ),
        -32002
    );
    ok(
        &gw,
        ADMIN,
        "agents.delete",
        json!({"agentId": "demo-agent"}),
    )
    .await;
    ok(
        &gw,
        ADMIN,
        "providers.delete",
        json!({"providerId": "demo"}),
    )
    .await;
    assert_eq!(
        code(
            &gw.call(ADMIN, "providers.get", json!({"providerId": "demo"}))
                .await
        ),
        -32001
    );
    // The catalogue: configured facts, aliases, availability.
    let all = ok(&gw, ADMIN, "models.list", json!({})).await;
    let m1 = all["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "script/m1")
        .unwrap()
        .clone();
    assert_eq!(m1["contextWindow"], 4096);
    assert_eq!(m1["aliases"], json!(["first"]));
    assert_eq!(m1["inputPricePerMTok"], 1.0);
    assert_eq!(all["total"], 3);
    let p = ok(&gw, ADMIN, "models.list_providers", json!({})).await;
    assert_eq!(p, json!({"providers": ["broken", "script"], "count": 2}));
    let t = ok(&gw, ADMIN, "models.test", json!({"provider": "script"})).await;
    assert_eq!(
        (t["ok"].clone(), t["model"].clone()),
        (json!(true), json!("script/m1"))
    );
    let t = ok(&gw, ADMIN, "models.test", json!({"provider": "broken"})).await;
    assert_eq!(
        (t["ok"].clone(), t["errorKind"].clone()),
        (json!(false), json!("provider_error"))
    );
    // An OpenAI-compatible endpoint that is not there, and one whose key is not set.
    ok(&gw, ADMIN, "providers.create", json!({"providerId": "nowhere", "config": {"type": "openai", "baseUrl": "http://127.0.0.1:9/v1", "models": ["x"], "timeoutMs": 2000}})).await;
    let t = ok(&gw, ADMIN, "models.test", json!({"provider": "nowhere"})).await;
    assert_eq!(t["ok"], false);
    ok(&gw, ADMIN, "providers.create", json!({"providerId": "keyless", "config": {"type": "anthropic", "apiKeyEnv": "AGENT_GATEWAY_TEST_UNSET_KEY"}})).await;
    let t = ok(&gw, ADMIN, "models.test", json!({"provider": "keyless"})).await;
    assert_eq!(t["errorKind"], "missing_key");
    assert_eq!(
        code(
            &gw.call(ADMIN, "models.test", json!({"provider": "nope"}))
                .await
        ),
        -32001
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_runs_report_their_status_and_push_completion() {
    let gw = engine().await;
    let spawned = ok(
        &gw,
        RPC,
        "session.spawn",
        json!({"task": "use the clock", "objective": "know the time"}),
    )
    .await;
    assert_eq!(spawned["status"], "completed");
    assert_eq!(spawned["response"], "It is now.");
    assert_eq!(spawned["finishReason"], "stop");
    let st = ok(
        &gw,
        RPC,
        "session.run_status",
        json!({"run_id": spawned["runId"]}),
    )
    .await;
    assert_eq!(st["status"], "completed");
    assert_eq!(st["tokensUsed"]["total"], 60);
    // Another tenant cannot read it.
    assert_eq!(
        code(
            &gw.call(
                MCP,
                "session.run_status",
                json!({"run_id": spawned["runId"]})
            )
            .await
        ),
        -32603
    );
    assert_eq!(
        code(
            &gw.call(
                ADMIN_ONLY,
                "session.run_status",
                json!({"run_id": "run_nope"})
            )
            .await
        ),
        -32001
    );
    // Async: answered at once, completion pushed to this client's WebSocket.
    let mut ws = gw.ws(RPC).await;
    send(&mut ws, &json!({"jsonrpc": "2.0", "id": 1, "method": "session.spawn", "params": {"task": "flaky job", "async": true}}).to_string()).await;
    let mut answer = None;
    let mut pushed = None;
    while answer.is_none() || pushed.is_none() {
        let v = recv(&mut ws).await;
        if v["id"] == 1 {
            answer = Some(v);
        } else if v["method"] == "session.completed" {
            pushed = Some(v);
        }
    }
    let (answer, pushed) = (answer.unwrap(), pushed.unwrap());
    assert_eq!(answer["result"]["status"], "running");
    assert_eq!(pushed["params"]["runId"], answer["result"]["runId"]);
    assert_eq!(pushed["params"]["result"]["response"], "recovered");
    assert_eq!(
        pushed["params"]["sessionKey"],
        answer["result"]["sessionKey"]
    );
    // Spawn refusals.
    assert_eq!(
        code(
            &gw.call(
                RPC,
                "session.spawn",
                json!({"task": "x", "required_tools": ["nope"]})
            )
            .await
        ),
        -32602
    );
    assert_eq!(
        code(
            &gw.call(
                RPC,
                "session.spawn",
                json!({"task": "x", "tool_groups": ["nope"]})
            )
            .await
        ),
        -32602
    );
    assert_eq!(
        code(
            &gw.call(
                RPC,
                "session.spawn",
                json!({"task": "x", "include_parent_history": "full"})
            )
            .await
        ),
        -32602
    );
    let narrowed = ok(
        &gw,
        RPC,
        "session.spawn",
        json!({"task": "use the clock", "tool_groups": ["memory"]}),
    )
    .await;
    assert_eq!(narrowed["finishReason"], "stop");
    // session.send: wait and async.
    execute(
        &gw,
        RPC,
        json!({"message": "hello", "sessionKey": session("s")}),
    )
    .await;
    let sk = "agent:default:api:client:s";
    let sent = ok(
        &gw,
        RPC,
        "session.send",
        json!({"session_key": sk, "text": "use the clock"}),
    )
    .await;
    assert_eq!(
        (sent["status"].clone(), sent["response"].clone()),
        (json!("completed"), json!("It is now."))
    );
    let sent = ok(
        &gw,
        RPC,
        "session.send",
        json!({"session_key": sk, "text": "again", "mode": "async"}),
    )
    .await;
    assert_eq!(sent["status"], "accepted");
    assert_eq!(
        code(
            &gw.call(
                RPC,
                "session.send",
                json!({"session_key": "unknown", "text": "x"})
            )
            .await
        ),
        -32001
    );
    let fresh = ok(
        &gw,
        RPC,
        "session.send",
        json!({"session_key": "my-own-key", "text": "hi", "agent_id": "narrow"}),
    )
    .await;
    assert_eq!(fresh["status"], "completed");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_file_agents_survive_a_restart_with_their_api_changes() {
    let gw = engine().await;
    execute(
        &gw,
        RPC,
        json!({"message": "before restart", "sessionKey": session("r")}),
    )
    .await;
    ok(
        &gw,
        ADMIN,
        "agents.update",
        json!({"agentId": "narrow", "config": {"systemPrompt": "changed"}}),
    )
    .await;
    ok(&gw, ADMIN, "agents.suspend", json!({"agentId": "failover"})).await;
    ok(&gw, ADMIN, "agents.create", json!({"agentId": "extra"})).await;
    ok(&gw, ADMIN, "gateway.restart", json!({})).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let got = ok(&gw, ADMIN, "agents.get", json!({"agentId": "narrow"})).await;
    assert_eq!(got["systemPrompt"], "changed");
    let got = ok(&gw, ADMIN, "agents.get", json!({"agentId": "failover"})).await;
    assert_eq!(got["suspended"], true);
    ok(&gw, ADMIN, "agents.get", json!({"agentId": "extra"})).await;
    let h = ok(
        &gw,
        RPC,
        "session.history",
        json!({"session_key": "agent:default:api:client:r"}),
    )
    .await;
    assert_eq!(h["total"], 2);
    gw.stop().await;
}
