//! The openai and anthropic providers against a fixture HTTP server on loopback: request
//! bodies and headers, plain and streamed answers (split at awkward byte boundaries), tool
//! calls, error statuses, key scrubbing, cancellation, refused connections and timeouts.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_gateway::providers::anthropic::AnthropicProvider;
use agent_gateway::providers::openai::OpenAiProvider;
use agent_gateway::providers::{
    ChatMessage, ChatRequest, ChatResponse, ErrorKind, Provider, ProviderConnection, ProviderError,
    ProviderKind, StopReason, ToolCall, ToolSpec, Usage,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::Notify;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

/// Every awaited step must finish within this; a hang fails the test instead.
const STEP: Duration = Duration::from_secs(10);
const KEY: &str = "sk-test-0123456789-secret";

// ---------------------------------------------------------------- fixture server

/// One request the fixture received.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Value,
}

impl Recorded {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Part {
    Bytes(Vec<u8>),
    /// Stop sending and wait until the client closes the connection.
    Stall,
    /// Close the connection at once, mid-body.
    Hangup,
}

#[derive(Debug, Clone)]
pub(crate) enum Body {
    Full(Vec<u8>),
    Chunked(Vec<Part>),
    /// Never answer (not even the status line); wait for the client to go away.
    Silence,
}

#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Body,
}

impl Reply {
    pub(crate) fn json(status: u16, body: &Value) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: Body::Full(body.to_string().into_bytes()),
        }
    }

    pub(crate) fn sse(parts: Vec<Part>) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: Body::Chunked(parts),
        }
    }

    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

type Handler = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;

pub(crate) struct Fixture {
    pub(crate) addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
    /// Signalled when a client closes a connection the fixture was stalling on.
    closed: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fixture {
    pub(crate) async fn start(
        handler: impl Fn(&Recorded) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let closed = Arc::new(Notify::new());
        let handler: Handler = Arc::new(handler);
        let task = tokio::spawn({
            let requests = requests.clone();
            let closed = closed.clone();
            async move {
                loop {
                    let Ok((socket, _)) = listener.accept().await else {
                        return;
                    };
                    let (requests, closed, handler) =
                        (requests.clone(), closed.clone(), handler.clone());
                    tokio::spawn(async move {
                        serve(socket, requests, closed, handler).await;
                    });
                }
            }
        });
        Self {
            addr,
            requests,
            closed,
            task,
        }
    }

    /// Serves the same reply to every request.
    pub(crate) async fn always(reply: Reply) -> Self {
        Self::start(move |_| reply.clone()).await
    }

    pub(crate) fn base(&self, suffix: &str) -> String {
        format!("http://{}{suffix}", self.addr)
    }

    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    fn only_request(&self) -> Recorded {
        let requests = self.requests();
        assert_eq!(requests.len(), 1, "{requests:#?}");
        requests.into_iter().next().unwrap()
    }
}

async fn serve(
    mut socket: TcpStream,
    requests: Arc<Mutex<Vec<Recorded>>>,
    closed: Arc<Notify>,
    handler: Handler,
) {
    socket.set_nodelay(true).unwrap();
    let Some(request) = read_request(&mut socket).await else {
        return;
    };
    requests.lock().unwrap().push(request.clone());
    let reply = handler(&request);
    let head = |extra: &str| {
        let mut head = format!("HTTP/1.1 {} Fixture\r\nconnection: close\r\n", reply.status);
        for (name, value) in &reply.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(extra);
        head.push_str("\r\n");
        head.into_bytes()
    };
    match &reply.body {
        Body::Silence => wait_for_close(&mut socket, &closed).await,
        Body::Full(bytes) => {
            let mut out = head(&format!("content-length: {}\r\n", bytes.len()));
            out.extend_from_slice(bytes);
            let _ = socket.write_all(&out).await;
            let _ = socket.shutdown().await;
        }
        Body::Chunked(parts) => {
            if socket
                .write_all(&head("transfer-encoding: chunked\r\n"))
                .await
                .is_err()
            {
                return;
            }
            for part in parts {
                match part {
                    Part::Bytes(bytes) => {
                        let mut frame = format!("{:x}\r\n", bytes.len()).into_bytes();
                        frame.extend_from_slice(bytes);
                        frame.extend_from_slice(b"\r\n");
                        if socket.write_all(&frame).await.is_err() {
                            return;
                        }
                        let _ = socket.flush().await;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Part::Stall => {
                        wait_for_close(&mut socket, &closed).await;
                        return;
                    }
                    Part::Hangup => return,
                }
            }
            let _ = socket.write_all(b"0\r\n\r\n").await;
            let _ = socket.shutdown().await;
        }
    }
}

/// Waits (bounded) until the peer closes the connection, then signals `closed`.
async fn wait_for_close(socket: &mut TcpStream, closed: &Notify) {
    let mut buf = [0u8; 256];
    let _ = timeout(Duration::from_secs(30), async {
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    closed.notify_one();
}

async fn read_request(socket: &mut TcpStream) -> Option<Recorded> {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(pos) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos;
        }
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let path = first.next()?.to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = data[head_end + 4..].to_vec();
    while body.len() < length {
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&buf[..n]);
    }
    let body = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).expect("request body is JSON")
    };
    Some(Recorded {
        method,
        path,
        headers,
        body,
    })
}

/// `text` cut every `size` bytes (inside field names, CRLF pairs and UTF-8 characters alike).
pub(crate) fn pieces(text: &str, size: usize) -> Vec<Part> {
    text.as_bytes()
        .chunks(size)
        .map(|c| Part::Bytes(c.to_vec()))
        .collect()
}

/// OpenAI stream text: one `data:` line per chunk, then `[DONE]`.
pub(crate) fn openai_sse(chunks: &[Value], newline: &str) -> String {
    let mut out = format!(": keep-alive{newline}{newline}");
    for chunk in chunks {
        out.push_str(&format!("data: {chunk}{newline}{newline}"));
    }
    out.push_str(&format!("data: [DONE]{newline}{newline}"));
    out
}

/// Anthropic stream text: `event:` + `data:` per event.
fn anthropic_sse(events: &[Value]) -> String {
    let mut out = String::new();
    for event in events {
        let name = event["type"].as_str().unwrap();
        out.push_str(&format!("event: {name}\ndata: {event}\n\n"));
    }
    out
}

// ---------------------------------------------------------------- helpers

fn settings(kind: ProviderKind, base: String, key: Option<&str>) -> ProviderConnection {
    ProviderConnection {
        address_guard: None,
        id: format!("test-{}", kind.as_str()),
        kind,
        base_url: Some(base),
        api_key: key.map(str::to_string),
        api_key_env: Some("TEST_PROVIDER_KEY".into()),
        timeout: Duration::from_secs(5),
    }
}

fn openai(base: String, key: Option<&str>) -> OpenAiProvider {
    OpenAiProvider::new(settings(ProviderKind::Openai, base, key)).unwrap()
}

fn anthropic(base: String, key: Option<&str>) -> AnthropicProvider {
    AnthropicProvider::new(settings(ProviderKind::Anthropic, base, key)).unwrap()
}

fn simple_request(model: &str) -> ChatRequest {
    ChatRequest {
        model: model.into(),
        system: Some("You are terse.".into()),
        messages: vec![ChatMessage::user("Say hello")],
        tools: Vec::new(),
        max_tokens: None,
        temperature: None,
    }
}

/// A conversation that used a tool, with the tool offered again.
fn tool_request(model: &str) -> ChatRequest {
    let call = ToolCall {
        id: "call_1".into(),
        name: "get_weather".into(),
        arguments: json!({"city": "Paris"}),
    };
    let second = ToolCall {
        id: "call_2".into(),
        name: "get_time".into(),
        arguments: json!({"tz": "CET"}),
    };
    ChatRequest {
        model: model.into(),
        system: Some("Use tools.".into()),
        messages: vec![
            ChatMessage::user("Weather and time in Paris?"),
            ChatMessage::assistant("Checking.", vec![call.clone(), second.clone()]),
            ChatMessage::tool(&call, "sunny", false),
            ChatMessage::tool(&second, "clock broken", true),
        ],
        tools: vec![ToolSpec {
            name: "get_weather".into(),
            description: "Weather of a city".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        }],
        max_tokens: Some(256),
        temperature: Some(0.25),
    }
}

async fn chat(provider: &dyn Provider, req: &ChatRequest) -> Result<ChatResponse, ProviderError> {
    let cancel = CancellationToken::new();
    timeout(STEP, provider.chat(req, None, &cancel))
        .await
        .expect("chat finished in time")
}

/// A streamed call: its result and the deltas the sink received.
async fn chat_streamed(
    provider: &dyn Provider,
    req: &ChatRequest,
) -> (Result<ChatResponse, ProviderError>, Vec<String>) {
    let cancel = CancellationToken::new();
    let (tx, mut rx) = unbounded_channel();
    let result = timeout(STEP, provider.chat(req, Some(&tx.clone().into()), &cancel))
        .await
        .expect("chat finished in time");
    drop(tx);
    (result, drain(&mut rx))
}

fn drain(rx: &mut UnboundedReceiver<String>) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(delta) = rx.try_recv() {
        out.push(delta);
    }
    out
}

/// Cancels a streaming call once its first delta arrived; checks it ends promptly as
/// Cancelled and that the server sees the connection closed.
async fn check_cancel_mid_stream(provider: &dyn Provider, fixture: &Fixture, req: &ChatRequest) {
    let cancel = CancellationToken::new();
    let (tx, mut rx) = unbounded_channel();
    let canceller = async {
        let first = rx.recv().await;
        cancel.cancel();
        (first, Instant::now())
    };
    let (result, (first, cancelled_at)) = timeout(STEP, async {
        let sink = tx.clone().into();
        tokio::join!(provider.chat(req, Some(&sink), &cancel), canceller)
    })
    .await
    .expect("cancelled call ended");
    assert!(cancelled_at.elapsed() < Duration::from_secs(1));
    assert_eq!(first.as_deref(), Some("partial"));
    let err = result.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Cancelled, "{err:?}");
    assert!(!err.retryable());
    timeout(Duration::from_secs(3), fixture.closed.notified())
        .await
        .expect("the connection was closed after cancelling");
}

/// 401/404/429/500 answers map to the right kinds; 429's Retry-After is kept; a body
/// echoing the key does not leak it. The model name picks the status.
async fn check_error_statuses(make: impl Fn(String) -> Box<dyn Provider>, base_suffix: &str) {
    let fixture = Fixture::start(|req| {
        let error = |message: &str, kind: &str| {
            json!({"type": "error", "error": {"type": kind, "message": message}})
        };
        match req.body["model"].as_str().unwrap_or_default() {
            "m401" => Reply::json(401, &error("Incorrect API key", "authentication_error")),
            "m404" => Reply::json(404, &error("No such model", "not_found_error")),
            "m429" => Reply::json(429, &error("Slow down", "rate_limit_error"))
                .header("retry-after", "7"),
            "m500" => Reply::json(
                500,
                &error(&format!("upstream failed for key {KEY}"), "api_error"),
            ),
            _ => Reply {
                status: 502,
                headers: Vec::new(),
                body: Body::Full(format!("<html>bad gateway {KEY}</html>").into_bytes()),
            },
        }
    })
    .await;
    let provider = make(fixture.base(base_suffix));
    let cases = [
        ("m401", ErrorKind::Auth, false, "Incorrect API key"),
        ("m404", ErrorKind::NotFound, false, "No such model"),
        ("m429", ErrorKind::RateLimited, true, "Slow down"),
        ("m500", ErrorKind::ProviderError, true, "upstream failed"),
        ("m502", ErrorKind::ProviderError, true, "bad gateway"),
    ];
    for (model, kind, retryable, text) in cases {
        for streamed in [false, true] {
            let req = simple_request(model);
            let err = if streamed {
                chat_streamed(provider.as_ref(), &req).await.0
            } else {
                chat(provider.as_ref(), &req).await
            }
            .unwrap_err();
            assert_eq!(err.kind, kind, "{model}: {err:?}");
            assert_eq!(err.retryable(), retryable, "{model}: {err:?}");
            assert_eq!(
                err.status,
                Some(model[1..].parse::<u16>().unwrap()),
                "{model}"
            );
            // The upstream's words go to the log, never into the error callers see.
            assert!(!err.message.contains(text), "{model}: {}", err.message);
            assert!(
                err.message.starts_with(&format!("HTTP {}", &model[1..])),
                "{model}: {}",
                err.message
            );
            assert!(!err.message.contains(KEY), "key leaked: {}", err.message);
            let expected_wait = (model == "m429").then(|| Duration::from_secs(7));
            assert_eq!(err.retry_after, expected_wait, "{model}");
        }
    }
    let leaked = chat(provider.as_ref(), &simple_request("m500"))
        .await
        .unwrap_err();
    assert_eq!(leaked.message, "HTTP 500 Internal Server Error");
    assert!(!leaked.to_string().contains(KEY));
}

async fn check_connection_refused(provider: &dyn Provider) {
    let err = chat(provider, &simple_request("m")).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Network, "{err:?}");
    assert!(err.retryable());
    assert_eq!(err.status, None);
}

/// A free loopback port with nothing listening on it.
async fn refused_base(suffix: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}{suffix}")
}

/// A server that stalls (before answering, and mid-stream) past a 300 ms timeout gives
/// Timeout, promptly.
async fn check_timeouts(
    make: impl Fn(ProviderConnection) -> Box<dyn Provider>,
    kind: ProviderKind,
    stream_start: &str,
    suffix: &str,
) {
    let silent = Fixture::always(Reply {
        status: 200,
        headers: Vec::new(),
        body: Body::Silence,
    })
    .await;
    let mut stalling = vec![Part::Bytes(stream_start.as_bytes().to_vec())];
    stalling.push(Part::Stall);
    let mid_stream = Fixture::always(Reply::sse(stalling)).await;
    for (fixture, streamed) in [(&silent, false), (&mid_stream, true)] {
        let mut s = settings(kind, fixture.base(suffix), Some(KEY));
        s.timeout = Duration::from_millis(300);
        let provider = make(s);
        let started = Instant::now();
        let err = if streamed {
            chat_streamed(provider.as_ref(), &simple_request("m"))
                .await
                .0
        } else {
            chat(provider.as_ref(), &simple_request("m")).await
        }
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Timeout, "streamed={streamed}: {err:?}");
        assert!(err.retryable());
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}

// ---------------------------------------------------------------- openai

pub(crate) fn openai_text_completion() -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "Hello!"},
            "finish_reason": "stop"
        }],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 3,
            "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 8}
        }
    })
}

pub(crate) fn content_chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-2",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        "usage": null
    })
}

#[tokio::test]
async fn openai_non_streaming_text() {
    let fixture = Fixture::always(Reply::json(200, &openai_text_completion())).await;
    let provider = openai(fixture.base("/v1/"), Some(KEY));
    let response = chat(&provider, &simple_request("gpt-test")).await.unwrap();
    assert_eq!(response.content, "Hello!");
    assert_eq!(response.stop, StopReason::Stop);
    assert!(response.tool_calls.is_empty());
    assert_eq!(
        response.usage,
        Usage {
            input: 12,
            output: 3,
            cached_input: 8,
            ..Usage::default()
        }
    );
    let request = fixture.only_request();
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(request.body["model"], "gpt-test");
    assert_eq!(
        request.body["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello"}
        ])
    );
    assert!(request.body.get("stream").is_none());
    assert!(request.body.get("tools").is_none());
    assert!(request.body.get("max_tokens").is_none());
}

#[tokio::test]
async fn openai_streaming_text_deltas_and_final_usage() {
    let chunks = [
        content_chunk(json!({"role": "assistant", "content": ""}), None),
        content_chunk(json!({"content": "Hel"}), None),
        content_chunk(json!({"content": "lo, wö"}), None),
        content_chunk(json!({"content": "rld 🌍"}), None),
        content_chunk(json!({}), Some("stop")),
        json!({"id": "chatcmpl-2", "choices": [], "usage": {
            "prompt_tokens": 20, "completion_tokens": 6,
            "prompt_tokens_details": {"cached_tokens": 4}
        }}),
    ];
    for (newline, size) in [("\r\n", 7), ("\n", 3), ("\r\n", 1)] {
        let fixture =
            Fixture::always(Reply::sse(pieces(&openai_sse(&chunks, newline), size))).await;
        let provider = openai(fixture.base("/v1"), Some(KEY));
        let (result, deltas) = chat_streamed(&provider, &simple_request("gpt-test")).await;
        let response = result.unwrap();
        assert_eq!(response.content, "Hello, wörld 🌍");
        assert_eq!(deltas.concat(), response.content);
        assert_eq!(deltas, ["Hel", "lo, wö", "rld 🌍"]);
        assert_eq!(response.stop, StopReason::Stop);
        assert_eq!(
            response.usage,
            Usage {
                input: 20,
                output: 6,
                cached_input: 4,
                ..Usage::default()
            }
        );
        let request = fixture.only_request();
        assert_eq!(request.body["stream"], json!(true));
        assert_eq!(
            request.body["stream_options"],
            json!({"include_usage": true})
        );
    }
}

#[tokio::test]
async fn openai_streaming_parallel_tool_calls() {
    let call_delta = |calls: Value| content_chunk(json!({"tool_calls": calls}), None);
    let chunks = [
        content_chunk(json!({"role": "assistant", "content": null}), None),
        call_delta(json!([{"index": 0, "id": "call_a", "type": "function",
            "function": {"name": "get_weather", "arguments": ""}}])),
        call_delta(json!([{"index": 0, "function": {"arguments": "{\"ci"}}])),
        call_delta(json!([{"index": 1, "id": "call_b", "type": "function",
            "function": {"name": "get_time", "arguments": "{\"tz\""}}])),
        call_delta(json!([{"index": 0, "function": {"arguments": "ty\": \"Par"}}])),
        call_delta(json!([{"index": 1, "function": {"arguments": ": \"CET\"}"}}])),
        call_delta(json!([{"index": 0, "function": {"arguments": "is\"}"}}])),
        content_chunk(json!({}), Some("tool_calls")),
        json!({"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 9}}),
    ];
    let fixture = Fixture::always(Reply::sse(pieces(&openai_sse(&chunks, "\n"), 5))).await;
    let provider = openai(fixture.base("/v1"), Some(KEY));
    let (result, deltas) = chat_streamed(&provider, &tool_request("gpt-test")).await;
    let response = result.unwrap();
    assert!(deltas.is_empty(), "{deltas:?}");
    assert_eq!(response.content, "");
    assert_eq!(response.stop, StopReason::ToolCalls);
    assert_eq!(
        response.tool_calls,
        vec![
            ToolCall {
                id: "call_a".into(),
                name: "get_weather".into(),
                arguments: json!({"city": "Paris"}),
            },
            ToolCall {
                id: "call_b".into(),
                name: "get_time".into(),
                arguments: json!({"tz": "CET"}),
            },
        ]
    );
    assert_eq!(
        response.usage,
        Usage {
            input: 30,
            output: 9,
            cached_input: 0,
            ..Usage::default()
        }
    );
}

#[tokio::test]
async fn openai_non_streaming_tool_call_without_id_or_json_arguments() {
    let completion = json!({
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": null, "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": "not json"}},
                {"id": "call_x", "type": "function", "function": {"name": "g", "arguments": "{\"n\":1}"}}
            ]},
            "finish_reason": "tool_calls"
        }]
    });
    let fixture = Fixture::always(Reply::json(200, &completion)).await;
    let provider = openai(fixture.base("/v1"), Some(KEY));
    let response = chat(&provider, &simple_request("m")).await.unwrap();
    assert_eq!(response.stop, StopReason::ToolCalls);
    assert_eq!(response.usage, Usage::default());
    let calls = &response.tool_calls;
    assert_eq!(calls.len(), 2);
    assert!(calls[0].id.starts_with("call_") && calls[0].id.len() > 10);
    assert_eq!(calls[0].arguments, json!("not json"));
    assert_eq!(calls[1].id, "call_x");
    assert_eq!(calls[1].arguments, json!({"n": 1}));
}

#[tokio::test]
async fn openai_request_body_with_tools_and_tool_results() {
    let fixture = Fixture::always(Reply::json(200, &openai_text_completion())).await;
    let provider = openai(fixture.base("/v1"), Some(KEY));
    chat(&provider, &tool_request("gpt-test")).await.unwrap();
    let body = fixture.only_request().body;
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "get_time", "arguments": "{\"tz\":\"CET\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": "clock broken"}
        ])
    );
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}
        }}])
    );
    assert_eq!(body["max_tokens"], json!(256));
    assert_eq!(body["temperature"], json!(0.25));
}

#[tokio::test]
async fn openai_without_key_sends_no_authorization() {
    let fixture = Fixture::always(Reply::json(200, &openai_text_completion())).await;
    let provider = openai(fixture.base("/v1"), None);
    let response = chat(&provider, &simple_request("llama")).await.unwrap();
    assert_eq!(response.content, "Hello!");
    assert_eq!(fixture.only_request().header("authorization"), None);
}

#[tokio::test]
async fn openai_error_statuses_and_key_scrubbing() {
    check_error_statuses(|base| Box::new(openai(base, Some(KEY))), "/v1").await;
}

#[tokio::test]
async fn openai_cancel_mid_stream() {
    let start = openai_sse(&[content_chunk(json!({"content": "partial"}), None)], "\n");
    let start = start.trim_end_matches("data: [DONE]\n\n").to_string();
    let fixture = Fixture::always(Reply::sse(vec![
        Part::Bytes(start.into_bytes()),
        Part::Stall,
    ]))
    .await;
    let provider = openai(fixture.base("/v1"), Some(KEY));
    check_cancel_mid_stream(&provider, &fixture, &simple_request("m")).await;
}

#[tokio::test]
async fn openai_cancel_before_answer() {
    let fixture = Fixture::always(Reply {
        status: 200,
        headers: Vec::new(),
        body: Body::Silence,
    })
    .await;
    let provider = openai(fixture.base("/v1"), Some(KEY));
    let cancel = CancellationToken::new();
    let req = simple_request("m");
    let canceller = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    };
    let (result, ()) = timeout(STEP, async {
        tokio::join!(provider.chat(&req, None, &cancel), canceller)
    })
    .await
    .unwrap();
    assert_eq!(result.unwrap_err().kind, ErrorKind::Cancelled);
    timeout(Duration::from_secs(3), fixture.closed.notified())
        .await
        .expect("the connection was closed after cancelling");
}

#[tokio::test]
async fn openai_stream_cut_short_is_network() {
    let text = format!(
        "data: {}\n\n",
        content_chunk(json!({"content": "half"}), None)
    );
    let mut hangup = pieces(&text, 9);
    hangup.push(Part::Hangup);
    // a clean end of body without [DONE] or a finish reason, then a connection dropped mid-body
    for parts in [pieces(&text, 9), hangup] {
        let fixture = Fixture::always(Reply::sse(parts)).await;
        let provider = openai(fixture.base("/v1"), Some(KEY));
        let (result, deltas) = chat_streamed(&provider, &simple_request("m")).await;
        let err = result.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Network, "{err:?}");
        assert!(err.retryable());
        assert_eq!(deltas, ["half"]);
    }
}

#[tokio::test]
async fn openai_streaming_request_answered_in_one_piece() {
    let fixture = Fixture::always(Reply::json(200, &openai_text_completion())).await;
    let provider = openai(fixture.base("/v1"), None);
    let (result, deltas) = chat_streamed(&provider, &simple_request("m")).await;
    assert_eq!(result.unwrap().content, "Hello!");
    assert_eq!(deltas, ["Hello!"]);
}

#[tokio::test]
async fn openai_malformed_answer_is_provider_error() {
    let fixture = Fixture::always(Reply {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: Body::Full(b"{not json".to_vec()),
    })
    .await;
    let provider = openai(fixture.base("/v1"), Some(KEY));
    let err = chat(&provider, &simple_request("m")).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::ProviderError, "{err:?}");
    let bad_chunk = Fixture::always(Reply::sse(pieces("data: {oops\n\n", 4))).await;
    let provider = openai(bad_chunk.base("/v1"), Some(KEY));
    let err = chat_streamed(&provider, &simple_request("m"))
        .await
        .0
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::ProviderError, "{err:?}");
}

#[tokio::test]
async fn openai_connection_refused_is_network() {
    check_connection_refused(&openai(refused_base("/v1").await, Some(KEY))).await;
}

#[tokio::test]
async fn openai_stall_is_timeout() {
    let start = format!(
        "data: {}\n\n",
        content_chunk(json!({"content": "slow"}), None)
    );
    check_timeouts(
        |s| Box::new(OpenAiProvider::new(s).unwrap()),
        ProviderKind::Openai,
        &start,
        "/v1",
    )
    .await;
}

#[tokio::test]
async fn openai_embeddings_ordered_by_index() {
    let answer = json!({
        "object": "list",
        "data": [
            {"object": "embedding", "index": 2, "embedding": [0.5, 0.25]},
            {"object": "embedding", "index": 0, "embedding": [1.0, 0.0]},
            {"object": "embedding", "index": 1, "embedding": [0.0, -1.0]}
        ],
        "model": "emb",
        "usage": {"prompt_tokens": 8, "total_tokens": 8}
    });
    let fixture = Fixture::always(Reply::json(200, &answer)).await;
    let provider = openai(fixture.base("/v1"), Some(KEY));
    let inputs = vec!["a".to_string(), "b".to_string(), "c".to_string()];
    let cancel = CancellationToken::new();
    let embeddings = timeout(STEP, provider.embed("emb", &inputs, &cancel))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        embeddings.vectors,
        vec![vec![1.0, 0.0], vec![0.0, -1.0], vec![0.5, 0.25]]
    );
    assert_eq!(embeddings.input_tokens, 8);
    let request = fixture.only_request();
    assert_eq!(request.path, "/v1/embeddings");
    assert_eq!(
        request.body,
        json!({"model": "emb", "input": ["a", "b", "c"], "encoding_format": "float"})
    );
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
}

#[tokio::test]
async fn openai_embeddings_count_mismatch_is_an_error() {
    let answer = json!({"data": [{"index": 0, "embedding": [1.0]}], "usage": {"prompt_tokens": 1}});
    let fixture = Fixture::always(Reply::json(200, &answer)).await;
    let provider = openai(fixture.base("/v1"), Some(KEY));
    let inputs = vec!["a".to_string(), "b".to_string()];
    let cancel = CancellationToken::new();
    let err = timeout(STEP, provider.embed("emb", &inputs, &cancel))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::ProviderError);
}

// ---------------------------------------------------------------- anthropic

fn anthropic_message() -> Value {
    json!({
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [
            {"type": "text", "text": "Hello"},
            {"type": "text", "text": " there"}
        ],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        "usage": {
            "input_tokens": 10,
            "cache_creation_input_tokens": 5,
            "cache_read_input_tokens": 100,
            "output_tokens": 7
        }
    })
}

fn message_start(input_tokens: u64) -> Value {
    json!({"type": "message_start", "message": {
        "id": "msg_2", "type": "message", "role": "assistant", "content": [],
        "model": "claude-test", "stop_reason": null,
        "usage": {"input_tokens": input_tokens, "cache_read_input_tokens": 2,
                  "cache_creation_input_tokens": 0, "output_tokens": 1}
    }})
}

fn text_delta(index: u64, text: &str) -> Value {
    json!({"type": "content_block_delta", "index": index,
           "delta": {"type": "text_delta", "text": text}})
}

fn json_delta(index: u64, partial: &str) -> Value {
    json!({"type": "content_block_delta", "index": index,
           "delta": {"type": "input_json_delta", "partial_json": partial}})
}

fn block_stop(index: u64) -> Value {
    json!({"type": "content_block_stop", "index": index})
}

fn message_delta(stop: &str, output_tokens: u64) -> Value {
    json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
           "usage": {"output_tokens": output_tokens}})
}

#[tokio::test]
async fn anthropic_non_streaming_text() {
    let fixture = Fixture::always(Reply::json(200, &anthropic_message())).await;
    let provider = anthropic(fixture.base(""), Some(KEY));
    let response = chat(&provider, &simple_request("claude-test"))
        .await
        .unwrap();
    assert_eq!(response.content, "Hello there");
    assert_eq!(response.stop, StopReason::Stop);
    assert_eq!(
        response.usage,
        Usage {
            input: 115,
            output: 7,
            cached_input: 100,
            cache_write: 5,
        }
    );
    let request = fixture.only_request();
    assert_eq!(request.path, "/v1/messages");
    assert_eq!(request.header("x-api-key"), Some(KEY));
    assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(request.header("authorization"), None);
    assert_eq!(
        request.body,
        json!({
            "model": "claude-test",
            "max_tokens": 4096,
            "system": "You are terse.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello"}]}]
        })
    );
}

#[tokio::test]
async fn anthropic_streaming_text_deltas_and_usage() {
    let events = [
        message_start(25),
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "text", "text": ""}}),
        json!({"type": "ping"}),
        text_delta(0, "Bon"),
        text_delta(0, "jour, "),
        text_delta(0, "ça va ✨"),
        block_stop(0),
        message_delta("end_turn", 9),
        json!({"type": "message_stop"}),
    ];
    for size in [7, 2] {
        let fixture = Fixture::always(Reply::sse(pieces(&anthropic_sse(&events), size))).await;
        let provider = anthropic(fixture.base(""), Some(KEY));
        let (result, deltas) = chat_streamed(&provider, &simple_request("claude-test")).await;
        let response = result.unwrap();
        assert_eq!(response.content, "Bonjour, ça va ✨");
        assert_eq!(deltas, ["Bon", "jour, ", "ça va ✨"]);
        assert_eq!(deltas.concat(), response.content);
        assert_eq!(response.stop, StopReason::Stop);
        assert_eq!(
            response.usage,
            Usage {
                input: 27,
                output: 9,
                cached_input: 2,
                ..Usage::default()
            }
        );
        assert_eq!(fixture.only_request().body["stream"], json!(true));
    }
}

#[tokio::test]
async fn anthropic_streaming_tool_use() {
    let events = [
        message_start(40),
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "text", "text": ""}}),
        text_delta(0, "Let me check."),
        block_stop(0),
        json!({"type": "content_block_start", "index": 1, "content_block":
               {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}}),
        json_delta(1, ""),
        json_delta(1, "{\"city\": \"Pa"),
        json_delta(1, "ris\"}"),
        block_stop(1),
        json!({"type": "content_block_start", "index": 2, "content_block":
               {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}}),
        json_delta(2, "{\"tz\":"),
        json_delta(2, "\"CET\"}"),
        block_stop(2),
        json!({"type": "content_block_start", "index": 3, "content_block":
               {"type": "tool_use", "id": "toolu_3", "name": "no_args", "input": {}}}),
        block_stop(3),
        message_delta("tool_use", 33),
        json!({"type": "message_stop"}),
    ];
    let fixture = Fixture::always(Reply::sse(pieces(&anthropic_sse(&events), 5))).await;
    let provider = anthropic(fixture.base(""), Some(KEY));
    let (result, deltas) = chat_streamed(&provider, &tool_request("claude-test")).await;
    let response = result.unwrap();
    assert_eq!(deltas, ["Let me check."]);
    assert_eq!(response.content, "Let me check.");
    assert_eq!(response.stop, StopReason::ToolCalls);
    assert_eq!(
        response.tool_calls,
        vec![
            ToolCall {
                id: "toolu_1".into(),
                name: "get_weather".into(),
                arguments: json!({"city": "Paris"}),
            },
            ToolCall {
                id: "toolu_2".into(),
                name: "get_time".into(),
                arguments: json!({"tz": "CET"}),
            },
            ToolCall {
                id: "toolu_3".into(),
                name: "no_args".into(),
                arguments: json!({}),
            },
        ]
    );
    assert_eq!(response.usage.output, 33);
}

#[tokio::test]
async fn anthropic_non_streaming_tool_use() {
    let message = json!({
        "type": "message", "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "Oslo"}}
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "output_tokens": 4}
    });
    let fixture = Fixture::always(Reply::json(200, &message)).await;
    let provider = anthropic(fixture.base(""), Some(KEY));
    let response = chat(&provider, &simple_request("claude-test"))
        .await
        .unwrap();
    assert_eq!(response.stop, StopReason::ToolCalls);
    assert_eq!(response.content, "Checking.");
    assert_eq!(
        response.tool_calls,
        vec![ToolCall {
            id: "toolu_9".into(),
            name: "get_weather".into(),
            arguments: json!({"city": "Oslo"}),
        }]
    );
    assert_eq!(
        response.usage,
        Usage {
            input: 3,
            output: 4,
            cached_input: 0,
            ..Usage::default()
        }
    );
}

#[tokio::test]
async fn anthropic_max_tokens_is_length() {
    let mut message = anthropic_message();
    message["stop_reason"] = json!("max_tokens");
    let fixture = Fixture::always(Reply::json(200, &message)).await;
    let provider = anthropic(fixture.base(""), Some(KEY));
    let response = chat(&provider, &simple_request("claude-test"))
        .await
        .unwrap();
    assert_eq!(response.stop, StopReason::Length);
}

#[tokio::test]
async fn anthropic_request_body_with_tools_and_tool_results() {
    let fixture = Fixture::always(Reply::json(200, &anthropic_message())).await;
    let provider = anthropic(fixture.base(""), Some(KEY));
    chat(&provider, &tool_request("claude-test")).await.unwrap();
    let body = fixture.only_request().body;
    assert_eq!(
        body,
        json!({
            "model": "claude-test",
            "max_tokens": 256,
            "system": "Use tools.",
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "Weather and time in Paris?"}
                ]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "call_1", "name": "get_weather",
                     "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "call_2", "name": "get_time",
                     "input": {"tz": "CET"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny",
                     "is_error": false},
                    {"type": "tool_result", "tool_use_id": "call_2", "content": "clock broken",
                     "is_error": true}
                ]}
            ],
            "tools": [{
                "name": "get_weather",
                "description": "Weather of a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}
            }],
            "temperature": 0.25
        })
    );
}

#[tokio::test]
async fn anthropic_missing_key() {
    let fixture = Fixture::always(Reply::json(200, &anthropic_message())).await;
    let provider = anthropic(fixture.base(""), None);
    let err = chat(&provider, &simple_request("claude-test"))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::MissingKey);
    assert!(err.message.contains("TEST_PROVIDER_KEY"), "{}", err.message);
    assert!(!err.retryable());
    assert!(fixture.requests().is_empty());
}

#[tokio::test]
async fn anthropic_error_statuses_and_key_scrubbing() {
    check_error_statuses(|base| Box::new(anthropic(base, Some(KEY))), "").await;
}

#[tokio::test]
async fn anthropic_error_event_mid_stream() {
    let events = [
        message_start(5),
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "text", "text": ""}}),
        text_delta(0, "Hi"),
        json!({"type": "error", "error": {"type": "overloaded_error",
                                          "message": format!("Overloaded {KEY}")}}),
    ];
    let fixture = Fixture::always(Reply::sse(pieces(&anthropic_sse(&events), 11))).await;
    let provider = anthropic(fixture.base(""), Some(KEY));
    let (result, deltas) = chat_streamed(&provider, &simple_request("claude-test")).await;
    let err = result.unwrap_err();
    assert_eq!(err.kind, ErrorKind::ProviderError, "{err:?}");
    assert!(err.retryable());
    assert!(!err.message.contains("Overloaded"), "{}", err.message);
    assert!(!err.message.contains(KEY));
    assert_eq!(deltas, ["Hi"]);
}

#[tokio::test]
async fn anthropic_cancel_mid_stream() {
    let events = [
        message_start(5),
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "text", "text": ""}}),
        text_delta(0, "partial"),
    ];
    let fixture = Fixture::always(Reply::sse(vec![
        Part::Bytes(anthropic_sse(&events).into_bytes()),
        Part::Stall,
    ]))
    .await;
    let provider = anthropic(fixture.base(""), Some(KEY));
    check_cancel_mid_stream(&provider, &fixture, &simple_request("claude-test")).await;
}

#[tokio::test]
async fn anthropic_connection_refused_is_network() {
    check_connection_refused(&anthropic(refused_base("").await, Some(KEY))).await;
}

#[tokio::test]
async fn anthropic_stall_is_timeout() {
    check_timeouts(
        |s| Box::new(AnthropicProvider::new(s).unwrap()),
        ProviderKind::Anthropic,
        &anthropic_sse(&[message_start(5)]),
        "",
    )
    .await;
}

#[tokio::test]
async fn anthropic_has_no_embeddings() {
    let provider = anthropic("http://127.0.0.1:9".into(), Some(KEY));
    let cancel = CancellationToken::new();
    let err = provider
        .embed("m", &["a".to_string()], &cancel)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidRequest);
    assert!(err.message.contains("no embeddings"));
}

#[tokio::test]
async fn invalid_base_url_is_refused_at_construction() {
    let err =
        OpenAiProvider::new(settings(ProviderKind::Openai, "ftp://x".into(), None)).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidRequest);
    let err = AnthropicProvider::new(settings(ProviderKind::Anthropic, "not a url".into(), None))
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidRequest);
}

// ---------------------------------------------------------------- settings made through the API

/// `apiKeyEnv` and `baseUrl` set through providers.create/update follow `providerPolicy`; the
/// configuration file may name anything.
mod api_policy {
    use serde_json::{json, Value};

    use crate::common::*;

    const FILE: &str = r#"
providers:
  filed:
    type: openai
    baseUrl: http://10.9.9.9/v1
    apiKeyEnv: FILE_NAMED_KEY
    models: [a]
providerPolicy:
  apiKeyEnvAllowlist: [LISTED_KEY]
"#;

    async fn create(gw: &Gateway, id: &str, config: Value) -> Value {
        gw.call(
            ADMIN,
            "providers.create",
            json!({"providerId": id, "config": config}),
        )
        .await
    }

    /// A -32602 naming `member`, and the provider `id` not stored (unless it existed before:
    /// "filed" and "public" are updated, not created).
    async fn refused(gw: &Gateway, r: &Value, member: &str, id: &str) {
        assert_eq!(code(r), -32602, "{r}");
        let message = r["error"]["message"].as_str().unwrap();
        assert!(message.contains(member), "{r}");
        let got = gw
            .call(ADMIN, "providers.get", json!({"providerId": id}))
            .await;
        if id != "filed" && id != "public" {
            assert_eq!(code(&got), -32001, "{id} was stored: {got}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn key_variables_follow_the_allow_list() {
        let gw = start(FILE).await;
        let ok_cases = [
            (
                "by-list",
                json!({"type": "openai", "baseUrl": "https://8.8.8.8/v1", "apiKeyEnv": "LISTED_KEY"}),
            ),
            (
                "keyless",
                json!({"type": "openai", "baseUrl": "https://8.8.8.8/v1"}),
            ),
            ("script", json!({"type": "scripted"})),
        ];
        for (id, config) in ok_cases {
            let r = create(&gw, id, config).await;
            assert_eq!(r["result"]["created"], true, "{id}: {r}");
        }
        let refused_cases = [
            // A variable the file names stays with the endpoint the file sends it to.
            (
                "by-file",
                json!({"type": "openai", "baseUrl": "https://8.8.8.8/v1", "apiKeyEnv": "FILE_NAMED_KEY"}),
            ),
            (
                "secret",
                json!({"type": "openai", "baseUrl": "https://8.8.8.8/v1", "apiKeyEnv": "AWS_SECRET_ACCESS_KEY"}),
            ),
            (
                "near",
                json!({"type": "openai", "baseUrl": "https://8.8.8.8/v1", "apiKeyEnv": "LISTED_KEY_2"}),
            ),
            (
                "case",
                json!({"type": "openai", "baseUrl": "https://8.8.8.8/v1", "apiKeyEnv": "listed_key"}),
            ),
            // The type's default variable counts: the file names neither.
            ("oai", json!({"type": "openai"})),
            ("anth", json!({"type": "anthropic"})),
        ];
        for (id, config) in refused_cases {
            let r = create(&gw, id, config).await;
            refused(&gw, &r, "'config.apiKeyEnv'", id).await;
        }
        // update: a new variable is checked; other changes to a file provider are not.
        let r = gw
            .call(
                ADMIN,
                "providers.update",
                json!({"providerId": "filed", "config": {"apiKeyEnv": "PATH"}}),
            )
            .await;
        refused(&gw, &r, "'config.apiKeyEnv'", "filed").await;
        let r = gw
            .call(
                ADMIN,
                "providers.update",
                json!({"providerId": "keyless", "config": {"apiKeyEnv": "LISTED_KEY"}}),
            )
            .await;
        assert_eq!(r["result"]["provider"]["apiKeyEnv"], "LISTED_KEY", "{r}");
        // Moving the file's provider elsewhere checks its key again.
        let r = gw
            .call(
                ADMIN,
                "providers.update",
                json!({"providerId": "filed", "config": {"baseUrl": "https://8.8.8.8/v1"}}),
            )
            .await;
        refused(&gw, &r, "'config.apiKeyEnv'", "filed").await;
        let r = gw
            .call(
                ADMIN,
                "providers.update",
                json!({"providerId": "filed", "config": {"timeoutMs": 5000}}),
            )
            .await;
        assert_eq!(r["result"]["provider"]["timeoutMs"], 5000, "{r}");
        let got = gw
            .call(ADMIN, "providers.get", json!({"providerId": "filed"}))
            .await;
        assert_eq!(
            (&got["result"]["apiKeyEnv"], &got["result"]["baseUrl"]),
            (&json!("FILE_NAMED_KEY"), &json!("http://10.9.9.9/v1")),
            "{got}"
        );
        gw.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn base_urls_follow_the_url_policy() {
        let gw = start(FILE).await;
        let refused_urls = [
            "http://127.0.0.1:9/v1",
            "http://localhost:9/v1",
            "http://[::1]:9/v1",
            "http://10.0.0.1/v1",
            "http://192.168.1.10/v1",
            "http://169.254.169.254/latest",
            "http://[::ffff:127.0.0.1]/v1",
            "http://0.0.0.0/v1",
        ];
        for (i, url) in refused_urls.iter().enumerate() {
            let id = format!("u{i}");
            let r = create(&gw, &id, json!({"type": "openai", "baseUrl": url})).await;
            refused(&gw, &r, "'config.baseUrl'", &id).await;
        }
        let r = create(
            &gw,
            "ftp",
            json!({"type": "openai", "baseUrl": "ftp://8.8.8.8/"}),
        )
        .await;
        refused(&gw, &r, "'config.baseUrl'", "ftp").await;
        // Public addresses are fine.
        let r = create(
            &gw,
            "public",
            json!({"type": "openai", "baseUrl": "https://8.8.8.8/v1"}),
        )
        .await;
        assert_eq!(r["result"]["created"], true, "{r}");
        // update is checked too, and a refused one changes nothing.
        let r = gw
            .call(
                ADMIN,
                "providers.update",
                json!({"providerId": "public", "config": {"baseUrl": "http://127.0.0.1:9/v1"}}),
            )
            .await;
        refused(&gw, &r, "'config.baseUrl'", "public").await;
        let got = gw
            .call(ADMIN, "providers.get", json!({"providerId": "public"}))
            .await;
        assert_eq!(got["result"]["baseUrl"], "https://8.8.8.8/v1", "{got}");
        gw.stop().await;

        // With the loopback allowance: loopback is accepted, private still refused.
        let gw = start(&format!("{FILE}  allowLoopbackBaseUrl: true\n")).await;
        for (id, url) in [
            ("lo4", "http://127.0.0.1:9/v1"),
            ("lo6", "http://[::1]:9/v1"),
            ("lon", "http://localhost:9/v1"),
        ] {
            let r = create(&gw, id, json!({"type": "openai", "baseUrl": url})).await;
            assert_eq!(r["result"]["created"], true, "{url}: {r}");
        }
        let r = create(
            &gw,
            "priv",
            json!({"type": "openai", "baseUrl": "http://10.0.0.1/v1"}),
        )
        .await;
        refused(&gw, &r, "'config.baseUrl'", "priv").await;
        let r = create(
            &gw,
            "meta",
            json!({"type": "openai", "baseUrl": "http://169.254.169.254/"}),
        )
        .await;
        refused(&gw, &r, "'config.baseUrl'", "meta").await;
        gw.stop().await;
    }

    async fn test(gw: &Gateway, id: &str) -> Value {
        gw.call(ADMIN, "models.test", json!({"provider": id})).await["result"].clone()
    }

    /// A base URL set through the API is checked again at every connection (by the address
    /// its name resolves to then, and a literal address too): a tightened policy applies to
    /// stored providers, and a name cannot later point somewhere refused. The file's URLs
    /// are not checked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn api_urls_are_checked_again_when_connecting() {
        let upstream =
            super::Fixture::always(super::Reply::json(200, &super::openai_text_completion())).await;
        let file = |loopback: bool| {
            format!(
                "providers:\n  filed:\n    type: openai\n    baseUrl: {}\n    models: [m]\nproviderPolicy:\n  allowLoopbackBaseUrl: {loopback}\n",
                upstream.base("/v1").replace("127.0.0.1", "localhost")
            )
        };
        let gw = start(&file(true)).await;
        for (id, host) in [("byname", "localhost"), ("literal", "127.0.0.1")] {
            let url = upstream.base("/v1").replace("127.0.0.1", host);
            let r = create(
                &gw,
                id,
                json!({"type": "openai", "baseUrl": url, "models": ["m"]}),
            )
            .await;
            assert_eq!(r["result"]["created"], true, "{r}");
        }
        for id in ["byname", "literal", "filed"] {
            assert_eq!(test(&gw, id).await["ok"], true, "{id}");
        }
        assert_eq!(upstream.requests().len(), 3);

        // The same stored providers under a policy without the loopback allowance.
        let crate::common::Gateway { running, dir, .. } = gw;
        running.shutdown.cancel();
        tokio::time::timeout(STEP, running.done)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        std::fs::write(
            dir.path().join("gateway.yaml"),
            config_yaml(dir.path(), &file(false)),
        )
        .unwrap();
        let running = agent_gateway::server::start(Some(dir.path().join("gateway.yaml")))
            .await
            .unwrap();
        let gw = Gateway {
            addr: running.addr,
            running,
            dir,
        };
        for id in ["byname", "literal"] {
            let r = test(&gw, id).await;
            assert_eq!(
                (&r["ok"], &r["errorKind"]),
                (&json!(false), &json!("network")),
                "{id}: {r}"
            );
        }
        assert_eq!(
            upstream.requests().len(),
            3,
            "a refused address was connected to"
        );
        assert_eq!(test(&gw, "filed").await["ok"], true);
        assert_eq!(upstream.requests().len(), 4);
        gw.stop().await;
    }

    #[test]
    fn a_bad_allow_list_entry_refuses_to_start() {
        let config = agent_gateway::config::from_value(
            json!({"providerPolicy": {"apiKeyEnvAllowlist": ["GOOD", "BAD NAME"]}}),
        )
        .unwrap();
        let err = agent_gateway::config::validate(&config).unwrap_err();
        assert!(
            err.0.starts_with("providerPolicy.apiKeyEnvAllowlist[1]"),
            "{}",
            err.0
        );
        let unknown =
            agent_gateway::config::from_value(json!({"providerPolicy": {"allowLoopback": true}}))
                .unwrap_err();
        assert!(unknown.0.contains("providerPolicy"), "{}", unknown.0);
    }
}
