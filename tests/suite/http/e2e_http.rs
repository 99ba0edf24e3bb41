//! The HTTP surfaces on loopback with reqwest: the /v1 streaming order and error bodies,
//! cancellation when a streaming client goes away, the SSE streams (retry, keep-alive,
//! lagging subscribers, no leaked subscriptions), the body and query limits at the limit and
//! one past it, the dashboard redirect and static files, and the OpenAPI snapshot.

use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

const SCRIPT: &str = r#"
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "hello"
        steps:
          - reply: "Hello there, friend."
            usage: {input: 10, output: 5}
      - match: "slow"
        steps:
          - reply: "Let me look. "
            toolCalls: [{name: current_time}]
          - reply: "Done."
            delayMs: 30000
      - match: "loop"
        steps:
          - toolCalls: [{name: current_time}]
          - toolCalls: [{name: current_time, arguments: {zone: "UTC"}}]
          - toolCalls: [{name: current_time, arguments: {zone: "CET"}}]
agents:
  default: {model: script/m1, maxSteps: 2}
"#;

async fn gateway(extra: &str) -> Gateway {
    start(&format!("{extra}{SCRIPT}")).await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(STEP).build().unwrap()
}

async fn post(gw: &Gateway, path: &str, token: Option<&str>, body: String) -> (u16, Value) {
    let mut req = client()
        .post(gw.url(path))
        .header("content-type", "application/json")
        .body(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn get(gw: &Gateway, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = client().get(gw.url(path));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Reads SSE `data:` payloads of a response until the stream ends.
async fn sse_data(resp: reqwest::Response) -> Vec<String> {
    let text = tokio::time::timeout(STEP, resp.text())
        .await
        .unwrap()
        .unwrap();
    text.split("\n\n")
        .filter_map(|block| {
            let data: Vec<&str> = block
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

/// Reads a streaming body into `seen` until it contains `needle`.
async fn read_until(resp: &mut reqwest::Response, seen: &mut String, needle: &str) {
    let fut = async {
        while !seen.contains(needle) {
            let c = resp.chunk().await.unwrap().expect("stream ended");
            seen.push_str(&String::from_utf8_lossy(&c));
        }
    };
    tokio::time::timeout(STEP, fut).await.expect(needle);
}

fn assert_openai_error(body: &Value, kind: &str) {
    let e = &body["error"];
    assert_eq!(e["type"], kind, "{body}");
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(e.get("param").is_some(), "{body}");
    assert_eq!(e["code"], Value::Null, "{body}");
    assert_eq!(e.as_object().unwrap().len(), 4, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completion_streams_in_the_spec_order_and_maps_finish_reasons() {
    let gw = gateway("").await;
    let body = json!({"model": "script/m1", "messages": [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": [{"type": "text", "text": "say"}, {"type": "text", "text": "hello"}]}
    ], "stream": true, "stream_options": {"include_usage": true}});
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(RPC)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let data = sse_data(resp).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-") && id.len() == "chatcmpl-".len() + 36);
    assert!(chunks.iter().all(|c| c["id"] == id
        && c["object"] == "chat.completion.chunk"
        && c["model"] == "script/m1"));
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant"})
    );
    assert_eq!(chunks[0]["choices"][0]["finish_reason"], Value::Null);
    let n = chunks.len();
    let text: String = chunks[1..n - 2]
        .iter()
        .map(|c| {
            assert_eq!(c["choices"][0]["finish_reason"], Value::Null);
            assert!(c["choices"][0]["delta"].get("role").is_none());
            c["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(text, "Hello there, friend.");
    assert_eq!(chunks[n - 2]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(
        chunks[n - 1]["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
    );

    // Without include_usage there is no usage chunk.
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(RPC)
        .json(&json!({"model": "m1", "messages": [{"role": "user", "content": "hello"}], "stream": true}))
        .send()
        .await
        .unwrap();
    let data = sse_data(resp).await;
    assert!(data.iter().all(|d| !d.contains("\"usage\"")));
    assert_eq!(data.last().unwrap(), "[DONE]");

    // max_steps -> length; the other internal reasons -> stop.
    let (s, v) = post(
        &gw,
        "/v1/chat/completions",
        Some(RPC),
        json!({"model": "default", "messages": [{"role": "user", "content": "loop"}]}).to_string(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "default");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_v1_failure_has_the_openai_error_body() {
    let gw = gateway("  httpBodyLimitBytes: 2048\n").await;
    let chat = |extra: Value| {
        let mut b =
            json!({"model": "script/m1", "messages": [{"role": "user", "content": "hello"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string()
    };
    let cases: Vec<(String, u16, &str)> = vec![
        (chat(json!({"foo": 1})), 400, "invalid_request_error"),
        (
            chat(json!({"temperature": 2.01})),
            400,
            "invalid_request_error",
        ),
        (
            chat(json!({"temperature": -0.01})),
            400,
            "invalid_request_error",
        ),
        (chat(json!({"max_tokens": 0})), 400, "invalid_request_error"),
        (
            chat(json!({"max_tokens": 1.5})),
            400,
            "invalid_request_error",
        ),
        (chat(json!({"messages": []})), 400, "invalid_request_error"),
        (chat(json!({"model": ""})), 400, "invalid_request_error"),
        (
            chat(json!({"messages": [{"role": "system", "content": "x"}]})),
            400,
            "invalid_request_error",
        ),
        (
            chat(json!({"messages": [{"role": "tool", "content": "x"}]})),
            400,
            "invalid_request_error",
        ),
        ("{not json".to_owned(), 400, "invalid_request_error"),
        ("".to_owned(), 400, "invalid_request_error"),
        (
            chat(json!({"model": "nope/nothing"})),
            404,
            "not_found_error",
        ),
    ];
    for (body, status, kind) in cases {
        let (s, v) = post(&gw, "/v1/chat/completions", Some(RPC), body.clone()).await;
        assert_eq!(s, status, "{body} -> {v}");
        assert_openai_error(&v, kind);
    }
    let (_, v) = post(
        &gw,
        "/v1/chat/completions",
        Some(RPC),
        chat(json!({"model": "nope"})),
    )
    .await;
    assert_eq!(v["error"]["message"], "Model not found: nope");
    for (t, ok) in [(0.0, true), (2.0, true)] {
        let (s, v) = post(
            &gw,
            "/v1/chat/completions",
            Some(RPC),
            chat(json!({"temperature": t})),
        )
        .await;
        assert_eq!(s == 200, ok, "{v}");
    }
    let (s, _) = post(
        &gw,
        "/v1/chat/completions",
        Some(RPC),
        chat(json!({"max_tokens": 1})),
    )
    .await;
    assert_eq!(s, 200);
    let image = chat(json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}));
    let (s, v) = post(&gw, "/v1/chat/completions", Some(RPC), image).await;
    assert_eq!(s, 400);
    assert_openai_error(&v, "invalid_request_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Vision input"));
    assert_eq!(v["error"]["param"], "messages[0].content[1]");

    // Auth and scopes.
    let (s, v) = post(&gw, "/v1/chat/completions", None, chat(json!({}))).await;
    assert_eq!(s, 401);
    assert_openai_error(&v, "authentication_error");
    let (s, v) = post(
        &gw,
        "/v1/chat/completions",
        Some("x".repeat(40).as_str()),
        chat(json!({})),
    )
    .await;
    assert_eq!(s, 401);
    assert_openai_error(&v, "authentication_error");
    let (s, v) = get(&gw, "/v1/models", Some(MCP)).await;
    assert_eq!(s, 403);
    assert_openai_error(&v, "permission_error");

    // Routing: unknown route, wrong method, unknown single model.
    let (s, v) = get(&gw, "/v1/nothing", Some(RPC)).await;
    assert_eq!(s, 404);
    assert_openai_error(&v, "not_found_error");
    let (s, v) = get(&gw, "/v1/chat/completions", Some(RPC)).await;
    assert_eq!(s, 405);
    assert_openai_error(&v, "server_error");
    let (s, v) = get(&gw, "/v1/models/script/nothing", Some(RPC)).await;
    assert_eq!(s, 404);
    assert_eq!(v["error"]["message"], "Model not found");
    let (s, v) = get(&gw, "/v1/models/script/m1", Some(RPC)).await;
    assert_eq!(
        (s, &v["id"], &v["owned_by"], &v["created"]),
        (200, &json!("script/m1"), &json!("script"), &json!(0))
    );

    // The body limit: exactly at it is read, one byte more is refused.
    let base = chat(json!({}));
    let pad = 2048 - base.len();
    let at = format!("{}{}", base, " ".repeat(pad));
    assert_eq!(at.len(), 2048);
    let (s, v) = post(&gw, "/v1/chat/completions", Some(RPC), at.clone()).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = post(&gw, "/v1/chat/completions", Some(RPC), format!("{at} ")).await;
    assert_eq!(s, 413);
    assert_openai_error(&v, "server_error");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_answers_in_each_areas_format() {
    let gw = gateway("  rateLimit: {windowMs: 60000, maxRequests: 3}\n").await;
    for _ in 0..3 {
        let (s, _) = get(&gw, "/v1/models", Some(RPC)).await;
        assert_eq!(s, 200);
    }
    let (s, v) = get(&gw, "/v1/models", Some(RPC)).await;
    assert_eq!(s, 429);
    assert_openai_error(&v, "rate_limit_error");
    let (s, v) = get(&gw, "/api/agents", Some(RPC)).await;
    assert_eq!(s, 429);
    assert_eq!(v["error"], "Too many requests");
    // Exempt.
    for path in ["/health", "/api/health"] {
        let (s, v) = get(&gw, path, None).await;
        assert_eq!(s, 200, "{path}");
        assert_eq!(v["status"], "ok");
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_client_that_goes_away_cancels_the_turn() {
    let gw = gateway("").await;
    let mut events = gw.running.control.events.subscribe();
    let mut resp = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(RPC)
        .json(&json!({"model": "script/m1", "messages": [{"role": "user", "content": "slow"}], "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut seen = String::new();
    while !seen.contains("look. ") {
        let chunk = tokio::time::timeout(STEP, resp.chunk())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(resp);
    // The second step waits 30 s unless cancelled: the turn must end well before that.
    let sent = tokio::time::timeout(STEP, async {
        loop {
            let e = events.recv().await.unwrap();
            if e.name == "message:sent" {
                return e;
            }
        }
    })
    .await
    .expect("the turn was not cancelled");
    assert_eq!(sent.data_value()["finishReason"], "error");
    let (s, _) = get(&gw, "/v1/models", Some(RPC)).await;
    assert_eq!(s, 200);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_stream_sends_retry_keepalive_events_and_drops_laggards() {
    let gw = gateway("  web: {sseKeepAliveMs: 200}\n").await;
    let (s, v) = get(&gw, "/api/events", Some(MCP)).await;
    assert_eq!(s, 403, "{v}");
    assert_eq!(v["error"], "Insufficient scope: requires 'rpc'");
    let (s, _) = get(&gw, &format!("/api/events?token={MCP}"), None).await;
    assert_eq!(s, 403);
    let (s, _) = get(&gw, "/api/events", None).await;
    assert_eq!(s, 401);

    let mut resp = client()
        .get(gw.url(&format!("/api/events?token={RPC}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut seen = String::new();
    read_until(&mut resp, &mut seen, ": keep-alive").await;
    assert!(seen.starts_with("retry: 3000\n\n"), "{seen}");
    let (s, v) = post(
        &gw,
        "/api/chat",
        Some(RPC),
        json!({"message": "hello"}).to_string(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    read_until(&mut resp, &mut seen, "event: message:sent").await;
    assert!(seen.contains("event: message:received\ndata: {"));

    // A subscriber that cannot keep up is told and dropped; the publisher never waits.
    let mut slow = client()
        .get(gw.url("/api/events"))
        .bearer_auth(RPC)
        .send()
        .await
        .unwrap();
    let first = slow.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("retry: 3000"));
    let bus = &gw.running.control.events;
    for i in 0..5_000 {
        bus.publish("system:error", json!({"i": i, "pad": "x".repeat(200)}));
    }
    let rest = tokio::time::timeout(STEP, slow.text())
        .await
        .unwrap()
        .unwrap();
    assert!(
        rest.contains("event: lagged\ndata: {\"missed\":"),
        "no lag notice"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_subscribers_come_and_go_without_leaking() {
    let gw = gateway("  web: {sseKeepAliveMs: 100}\n").await;
    let bus = &gw.running.control.events;
    let base = bus.subscribers();
    let mut open = Vec::new();
    for _ in 0..40 {
        let mut r = client()
            .get(gw.url("/api/events"))
            .bearer_auth(RPC)
            .send()
            .await
            .unwrap();
        let c = r.chunk().await.unwrap().unwrap();
        assert!(c.starts_with(b"retry: 3000"));
        open.push(r);
    }
    assert_eq!(bus.subscribers(), base + 40);
    drop(open);
    // Each stream notices its client is gone at its next write (keep-alive at the latest).
    let deadline = tokio::time::Instant::now() + STEP;
    while bus.subscribers() > base {
        assert!(
            tokio::time::Instant::now() < deadline,
            "subscriptions leaked: {}",
            bus.subscribers()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream_sends_tokens_then_done() {
    let gw = gateway("").await;
    let resp = client()
        .get(gw.url(&format!("/api/chat/stream?message=hello&token={RPC}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = tokio::time::timeout(STEP, resp.text())
        .await
        .unwrap()
        .unwrap();
    let events: Vec<(&str, Value)> = text
        .split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|b| {
            let name = b.lines().find_map(|l| l.strip_prefix("event: ")).unwrap();
            let data = b.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            (name, serde_json::from_str(data).unwrap())
        })
        .collect();
    let (last, tokens) = events.split_last().unwrap();
    assert!(tokens.len() >= 2);
    let mut acc = String::new();
    for (name, v) in tokens {
        assert_eq!(*name, "token");
        acc.push_str(v["delta"].as_str().unwrap());
        assert_eq!(v["accumulated"], acc);
    }
    assert_eq!(last.0, "done");
    assert_eq!(
        last.1,
        json!({"response": "Hello there, friend.", "tokensUsed": {"input": 10, "output": 5, "total": 15}, "finishReason": "stop"})
    );
    assert_eq!(acc, "Hello there, friend.");
    let (s, v) = get(&gw, "/api/chat/stream", Some(RPC)).await;
    assert_eq!(s, 400, "{v}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_routes_check_their_limits_and_scopes() {
    let gw = gateway("").await;
    for (path, ok) in [
        ("/api/activity?limit=1", true),
        ("/api/activity?limit=100", true),
        ("/api/activity?limit=0", false),
        ("/api/activity?limit=101", false),
        ("/api/memory/search?q=x&limit=1", true),
        ("/api/memory/search?q=x&limit=100", true),
        ("/api/memory/search?q=x&limit=0", false),
        ("/api/memory/search?q=x&limit=101", false),
        ("/api/memory/search", false),
    ] {
        let (s, v) = get(&gw, path, Some(RPC)).await;
        assert_eq!(s == 200, ok, "{path}: {s} {v}");
        if !ok {
            assert_eq!(s, 400);
            assert!(v["error"].is_string(), "{v}");
        }
    }
    for path in [
        "/api/agents",
        "/api/channels",
        "/api/memory/stats",
        "/api/chat/history",
        "/api/activity",
    ] {
        let (s, v) = get(&gw, path, None).await;
        assert_eq!(s, 401, "{path}");
        assert_eq!(v["error"], "Missing or invalid bearer token");
        let (s, _) = get(&gw, path, Some(MCP)).await;
        assert_eq!(s, 403, "{path}");
        let (s, _) = get(&gw, path, Some(ADMIN_ONLY)).await;
        assert_eq!(s, 200, "{path}: admin includes rpc");
    }
    let (s, v) = post(
        &gw,
        "/api/chat",
        Some(RPC),
        json!({"message": "hello", "sessionKey": "k1"}).to_string(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = post(
        &gw,
        "/api/chat",
        Some(RPC),
        json!({"message": "hello", "sessionKey": "k1"}).to_string(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (_, h) = get(&gw, "/api/chat/history?channelId=api", Some(RPC)).await;
    assert_eq!(
        h["sessions"][0]["sessionKey"],
        "agent:default:api:client:k1"
    );
    assert_eq!(h["sessions"][0]["messageCount"], 4);
    let (_, h) = get(&gw, "/api/chat/history?channelId=other", Some(RPC)).await;
    assert_eq!(h["sessions"], json!([]));
    let (s, v) = post(
        &gw,
        "/api/chat",
        Some(RPC),
        json!({"message": "hello", "agentId": "ghost"}).to_string(),
    )
    .await;
    assert_eq!((s, &v["error"]), (404, &json!("Agent not found: ghost")));
    let (s, _) = post(
        &gw,
        "/api/chat",
        Some(RPC),
        json!({"message": "hi", "x": 1}).to_string(),
    )
    .await;
    assert_eq!(s, 400);
    let (_, a) = get(&gw, "/api/agents", Some(RPC)).await;
    assert_eq!(a["agents"][0]["id"], "default");
    assert_eq!(a["agents"][0]["provider"], "script");
    assert_eq!(a["agents"][0]["model"], "m1");
    let (_, act) = get(&gw, "/api/activity?limit=2", Some(RPC)).await;
    assert_eq!(act["events"].as_array().unwrap().len(), 2);
    assert_eq!(act["events"][0]["event"], "message:sent");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_docs_routes_follow_the_configuration() {
    let dist = tempfile::tempdir().unwrap();
    std::fs::write(dist.path().join("index.html"), "<h1>dash</h1>").unwrap();
    let gw = gateway(&format!("  web: {{distDir: {}}}\n", dist.path().display())).await;
    let no_redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = no_redirect.get(gw.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 307);
    assert_eq!(r.headers()["location"], "/app/");
    let r = client().get(gw.url("/app/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "<h1>dash</h1>");
    let r = client()
        .get(gw.url("/app/../gateway.yaml"))
        .send()
        .await
        .unwrap();
    assert_ne!(r.status(), 200);
    let (s, doc) = get(&gw, "/openapi.json", None).await;
    assert_eq!(s, 200);
    assert_eq!(
        doc,
        serde_json::from_str::<Value>(&agent_gateway::http::openapi::document()).unwrap()
    );
    let r = client().get(gw.url("/docs")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let html = r.text().await.unwrap();
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "the UI must not load from a CDN"
    );
    gw.stop().await;

    let gw = gateway("  web: {enabled: false}\n  docs: {enabled: false}\n").await;
    for path in ["/", "/api/agents", "/openapi.json", "/docs"] {
        let (s, _) = get(&gw, path, Some(RPC)).await;
        assert_eq!(s, 404, "{path}");
    }
    let (s, _) = get(&gw, "/v1/models", Some(RPC)).await;
    assert_eq!(s, 200);
    gw.stop().await;
}
