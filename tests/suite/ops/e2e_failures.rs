//! Provider failures on every surface, against upstream mocks on loopback: a 500 (retried,
//! then 502 `server_error` on `/v1`, `finishReason: error` with a generic message and the
//! error kind on JSON-RPC, an error status on `/api/chat`), a huge `Retry-After` (clamped, no
//! panic), and a stream that fails after its first delta with a fallback configured (the
//! fallback is never called).

use serde_json::{json, Value};

use crate::common::*;
use crate::http::providers_http::{
    content_chunk, openai_sse, openai_text_completion, pieces, Fixture, Part, Reply,
};

/// Text only the upstream's error answer contains: it must never reach a caller.
const UPSTREAM_TEXT: &str = "SECRET-UPSTREAM-TEXT-42";

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(STEP).build().unwrap()
}

/// (status, body as JSON or as a string) of a request with the `client` token.
async fn send(req: reqwest::RequestBuilder) -> (u16, Value, String) {
    let r = req.bearer_auth(RPC).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
    (status, body, text)
}

async fn post(gw: &Gateway, path: &str, body: Value) -> (u16, Value, String) {
    send(client().post(gw.url(path)).json(&body)).await
}

/// The primary upstream: the model name picks the failure.
async fn primary() -> Fixture {
    Fixture::start(|req| {
        let streaming = req.body["stream"] == json!(true);
        match req.body["model"].as_str().unwrap_or_default() {
            "m429" => Reply::json(429, &json!({"error": {"message": UPSTREAM_TEXT}}))
                .header("retry-after", "99999999999999999999999999999")
                .header("retry-after-ms", "1e300"),
            // Streams one delta, then the connection breaks.
            "mlate" if streaming => {
                let mut parts = pieces(
                    &openai_sse(&[content_chunk(json!({"content": "Hel"}), None)], "\n")
                        .replace("data: [DONE]\n\n", ""),
                    7,
                );
                parts.push(Part::Hangup);
                Reply::sse(parts)
            }
            _ => Reply::json(
                500,
                &json!({"error": {"message": format!("{UPSTREAM_TEXT} internal meltdown"), "type": "server_error"}}),
            ),
        }
    })
    .await
}

/// The fallback upstream: always answers "from the fallback".
async fn fallback() -> Fixture {
    Fixture::start(|req| {
        if req.body["stream"] == json!(true) {
            Reply::sse(pieces(
                &openai_sse(
                    &[
                        content_chunk(json!({"content": "from the fallback"}), None),
                        content_chunk(json!({}), Some("stop")),
                    ],
                    "\n",
                ),
                16,
            ))
        } else {
            let mut answer = openai_text_completion();
            answer["choices"][0]["message"]["content"] = json!("from the fallback");
            Reply::json(200, &answer)
        }
    })
    .await
}

async fn gateway(up: &Fixture, fb: &Fixture) -> Gateway {
    start(&format!(
        r#"
providers:
  up:
    type: openai
    baseUrl: {up}
    models: [m500, m429, mlate, mearly]
    maxRetries: 1
    timeoutMs: 1500
  fb:
    type: openai
    baseUrl: {fb}
    models: [answer]
    maxRetries: 0
  nokey:
    type: openai
    baseUrl: {up}
    apiKeyEnv: AGENT_GATEWAY_TEST_VARIABLE_NEVER_SET
    models: [m]
agents:
  failing: {{model: up/m500}}
  late: {{model: up/mlate, fallbackModels: [fb/answer]}}
  early: {{model: up/mearly, fallbackModels: [fb/answer]}}
defaultAgent: failing
"#,
        up = up.base("/v1"),
        fb = fb.base("/v1"),
    ))
    .await
}

fn count(f: &Fixture, model: &str) -> usize {
    f.requests()
        .iter()
        .filter(|r| r.body["model"] == json!(model))
        .count()
}

/// A `/v1` error body with `type: server_error` whose message names the kind and never the
/// upstream's text.
fn assert_v1_error(status: u16, body: &Value, expected_status: u16, kind: &str) {
    assert_eq!(status, expected_status, "{body}");
    assert_eq!(body["error"]["type"], "server_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(kind), "{body}");
    assert!(!body.to_string().contains(UPSTREAM_TEXT), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_500_is_an_error_on_every_surface() {
    let (up, fb) = (primary().await, fallback().await);
    let gw = gateway(&up, &fb).await;
    let chat = |stream: bool| {
        json!({"model": "up/m500", "stream": stream,
               "messages": [{"role": "user", "content": "hi"}]})
    };

    // /v1, plain: retried once (maxRetries 1), then 502 server_error.
    let (s, body, _) = post(&gw, "/v1/chat/completions", chat(false)).await;
    assert_v1_error(s, &body, 502, "provider_error");
    assert_eq!(
        body["error"]["message"],
        "The model call failed (provider_error, upstream HTTP 500)"
    );
    assert_eq!(count(&up, "m500"), 2);

    // /v1, streaming: the failure came before the first chunk, so an error status, not 200.
    let (s, body, _) = post(&gw, "/v1/chat/completions", chat(true)).await;
    assert_v1_error(s, &body, 502, "provider_error");
    assert_eq!(count(&up, "m500"), 4);

    // /v1/responses, plain and streaming.
    for stream in [false, true] {
        let (s, body, _) = post(
            &gw,
            "/v1/responses",
            json!({"model": "up/m500", "input": "hi", "stream": stream}),
        )
        .await;
        assert_v1_error(s, &body, 502, "provider_error");
    }

    // JSON-RPC: a result with finishReason error, a generic message and the error kind.
    let r = gw
        .call(
            RPC,
            "agent.execute",
            json!({"message": "hi", "agentId": "failing"}),
        )
        .await;
    let result = &r["result"];
    validate_result("agent.execute", result);
    assert_eq!(result["finishReason"], "error", "{r}");
    assert_eq!(result["errorKind"], "provider_error", "{r}");
    assert_eq!(
        result["response"],
        "The model call failed (provider_error, upstream HTTP 500)"
    );
    assert!(!r.to_string().contains(UPSTREAM_TEXT), "{r}");

    // REST: an error status with the REST error body, plain and streaming.
    let (s, body, _) = post(
        &gw,
        "/api/chat",
        json!({"message": "hi", "agentId": "failing"}),
    )
    .await;
    assert_eq!(s, 502, "{body}");
    assert!(body["error"].as_str().unwrap().contains("provider_error"));
    assert!(!body.to_string().contains(UPSTREAM_TEXT), "{body}");
    let (s, body, _) = send(
        client()
            .get(gw.url("/api/chat/stream"))
            .query(&[("message", "hi"), ("agentId", "failing")]),
    )
    .await;
    assert_eq!(s, 502, "{body}");
    assert!(!body.to_string().contains(UPSTREAM_TEXT), "{body}");

    // models.test: not ok, the kind, and no upstream text.
    let r = gw
        .call(
            ADMIN,
            "models.test",
            json!({"provider": "up", "model": "m500"}),
        )
        .await;
    let result = &r["result"];
    validate_result("models.test", result);
    assert_eq!(
        (&result["ok"], &result["errorKind"]),
        (&json!(false), &json!("provider_error")),
        "{r}"
    );
    assert_eq!(result["error"], "HTTP 500 Internal Server Error", "{r}");

    // Nothing could serve the call (the key variable is not set): 503.
    let (s, body, _) = post(
        &gw,
        "/v1/chat/completions",
        json!({"model": "nokey/m", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(s, 503, "{body}");
    assert_eq!(body["error"]["type"], "server_error");
    assert_eq!(count(&up, "m"), 0);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_retry_after_is_clamped() {
    let (up, fb) = (primary().await, fallback().await);
    let gw = gateway(&up, &fb).await;
    // The upstream asks for a wait of ~10^29 s (and 10^300 ms): parsed without a panic and
    // clamped to the provider's timeout (1.5 s), so the one retry happens within STEP.
    let (s, body, _) = post(
        &gw,
        "/v1/chat/completions",
        json!({"model": "up/m429", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_v1_error(s, &body, 502, "rate_limited");
    assert_eq!(count(&up, "m429"), 2);
    // The gateway is still serving.
    let (s, _, _) = send(client().get(gw.url("/health"))).await;
    assert_eq!(s, 200);
    gw.stop().await;
}

/// The `content` deltas and finish reasons of a `/v1` chunk stream, and whether it ended
/// with `[DONE]`.
fn chunks(text: &str) -> (String, Vec<String>, bool) {
    let mut content = String::new();
    let mut finishes = Vec::new();
    let mut done = false;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        if let Some(c) = chunk["choices"][0]["delta"]["content"].as_str() {
            content.push_str(c);
        }
        if let Some(f) = chunk["choices"][0]["finish_reason"].as_str() {
            finishes.push(f.to_owned());
        }
    }
    (content, finishes, done)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fallback_after_the_first_streamed_delta() {
    let (up, fb) = (primary().await, fallback().await);
    let gw = gateway(&up, &fb).await;
    let stream = |model: &str| {
        json!({"model": model, "stream": true,
               "messages": [{"role": "user", "content": "hi"}]})
    };

    // The primary streams "Hel" and breaks: the stream keeps only the primary's text and
    // ends (stop, [DONE]); neither a retry nor the fallback runs.
    let (s, _, text) = post(&gw, "/v1/chat/completions", stream("late")).await;
    assert_eq!(s, 200, "{text}");
    let (content, finishes, done) = chunks(&text);
    assert_eq!(content, "Hel", "{text}");
    assert_eq!(finishes, ["stop"], "{text}");
    assert!(done, "{text}");
    assert_eq!(count(&up, "mlate"), 1);
    assert!(fb.requests().is_empty(), "{:?}", fb.requests());

    // JSON-RPC over the same agent does not stream: the primary fails before any text, so
    // the fallback answers (it is configured and reachable).
    let r = gw
        .call(
            RPC,
            "agent.execute",
            json!({"message": "hi", "agentId": "late"}),
        )
        .await;
    assert_eq!(r["result"]["response"], "from the fallback", "{r}");
    assert_eq!(count(&fb, "answer"), 1);

    // A stream whose primary fails before its first delta falls back.
    let (s, _, text) = post(&gw, "/v1/chat/completions", stream("early")).await;
    assert_eq!(s, 200, "{text}");
    assert_eq!(chunks(&text).0, "from the fallback", "{text}");
    assert_eq!(count(&fb, "answer"), 2);
    gw.stop().await;
}
