//! The gateway's OpenAI-compatible `/v1/chat/completions` against a bare pass-through proxy, in
//! front of the same near-zero-latency upstream: requests/s, latency percentiles, time to first
//! chunk, CPU time per request and peak RSS of the serving process, non-streaming and streaming,
//! at 16 and 64 keep-alive connections. See README.md.
//!
//! One binary, three roles: without arguments it is the bench (load generator and report);
//! re-executed as `<exe> --v1-proxy-role upstream` it is the upstream, and as
//! `<exe> --v1-proxy-role proxy <upstream port>` the bare proxy, each in its own process.
#![allow(
    clippy::disallowed_methods,
    reason = "tests and benches own the tasks they start"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};

const BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");
/// The bearer token of the proxy and of the gateway (one gateway token with `*` scopes).
const TOKEN: &str = "bench-secret-0123456789abcdefghijklmnopqrstuv";
/// The key the upstream requires; the proxy and the gateway's provider send it.
const UPSTREAM_KEY: &str = "upstream-key-0123456789abcdef";
/// The variable holding UPSTREAM_KEY in the gateway's environment (`apiKeyEnv`).
const UPSTREAM_KEY_ENV: &str = "BENCH_UPSTREAM_KEY";
/// argv[1] of a re-executed server process; argv[2] is its role.
const ROLE_FLAG: &str = "--v1-proxy-role";
/// The assistant's answer, sent whole or in the eight pieces below.
const CONTENT: &str = "hello from upstream";
const PIECES: [&str; 8] = ["hel", "lo", " fr", "om", " up", "str", "ea", "m"];
const PATH: &str = "/v1/chat/completions";
/// Longest a single request may take before it counts as a transport error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(ROLE_FLAG) {
        role(&args[2..]);
    } else {
        bench();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Server roles
// ---------------------------------------------------------------------------------------------

fn role(args: &[String]) {
    // The bench holds our stdin: when it goes away (even killed), its end closes and we exit.
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    let rt = runtime();
    match args.first().map(String::as_str) {
        Some("upstream") => rt.block_on(upstream()),
        Some("proxy") => {
            let port: u16 = args.get(1).and_then(|p| p.parse().ok()).unwrap();
            rt.block_on(proxy(port));
        }
        other => panic!("unknown role {other:?}"),
    }
}

/// Binds a loopback port and tells the bench which (first line of stdout).
async fn listen() -> TcpListener {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut out = std::io::stdout();
    writeln!(out, "port {port}").unwrap();
    out.flush().unwrap();
    listener
}

fn json_response<B>(
    status: StatusCode,
    body: &'static str,
    wrap: fn(Full<Bytes>) -> B,
) -> Response<B> {
    let mut response = Response::new(wrap(Full::new(Bytes::from_static(body.as_bytes()))));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The upstream's canned answers, built once.
struct Replies {
    auth: HeaderValue,
    completion: Bytes,
    chunks: Vec<Bytes>,
    models: Bytes,
}

impl Replies {
    fn new() -> Self {
        let usage = json!({"prompt_tokens": 9, "completion_tokens": 8, "total_tokens": 17});
        let completion = json!({
            "id": "chatcmpl-bench0001",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "bench-model",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": CONTENT},
                "logprobs": null,
                "finish_reason": "stop"
            }],
            "usage": usage
        });
        let chunk = |choices: Value, usage: Value| {
            let v = json!({
                "id": "chatcmpl-bench0001",
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": "bench-model",
                "choices": choices,
                "usage": usage
            });
            Bytes::from(format!("data: {v}\n\n"))
        };
        let delta = |delta: Value, finish: Value| json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]);
        let mut chunks = vec![chunk(
            delta(json!({"role": "assistant", "content": ""}), Value::Null),
            Value::Null,
        )];
        for piece in PIECES {
            chunks.push(chunk(
                delta(json!({"content": piece}), Value::Null),
                Value::Null,
            ));
        }
        chunks.push(chunk(delta(json!({}), json!("stop")), Value::Null));
        chunks.push(chunk(json!([]), usage));
        chunks.push(Bytes::from_static(b"data: [DONE]\n\n"));
        let models = json!({"object": "list", "data": [
            {"id": "bench-model", "object": "model", "created": 1_700_000_000, "owned_by": "bench"}
        ]});
        Self {
            auth: HeaderValue::from_str(&format!("Bearer {UPSTREAM_KEY}")).unwrap(),
            completion: Bytes::from(completion.to_string()),
            chunks,
            models: Bytes::from(models.to_string()),
        }
    }
}

type ChunkStream = futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>;
type UpstreamBody = Either<Full<Bytes>, StreamBody<ChunkStream>>;

#[derive(serde::Deserialize)]
struct StreamFlag {
    #[serde(default)]
    stream: bool,
}

async fn upstream() {
    let listener = listen().await;
    let replies = Arc::new(Replies::new());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let replies = replies.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req| upstream_answer(replies.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn upstream_answer(
    replies: Arc<Replies>,
    req: Request<Incoming>,
) -> Result<Response<UpstreamBody>, Infallible> {
    let chat = req.method() == Method::POST && req.uri().path() == PATH;
    let models = req.method() == Method::GET && req.uri().path() == "/v1/models";
    let authorized = req.headers().get(AUTHORIZATION) == Some(&replies.auth);
    // Always read the whole request body, as a real server would.
    let body = match req.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return Ok(json_response(
                StatusCode::BAD_REQUEST,
                r#"{"error":{"message":"body"}}"#,
                Either::Left,
            ))
        }
    };
    if !authorized {
        return Ok(json_response(
            StatusCode::UNAUTHORIZED,
            r#"{"error":{"message":"invalid api key"}}"#,
            Either::Left,
        ));
    }
    if models {
        let mut response = Response::new(Either::Left(Full::new(replies.models.clone())));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return Ok(response);
    }
    if !chat {
        return Ok(json_response(
            StatusCode::NOT_FOUND,
            r#"{"error":{"message":"not found"}}"#,
            Either::Left,
        ));
    }
    let Ok(flag) = serde_json::from_slice::<StreamFlag>(&body) else {
        return Ok(json_response(
            StatusCode::BAD_REQUEST,
            r#"{"error":{"message":"invalid JSON body"}}"#,
            Either::Left,
        ));
    };
    if !flag.stream {
        let mut response = Response::new(Either::Left(Full::new(replies.completion.clone())));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return Ok(response);
    }
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = replies
        .chunks
        .iter()
        .map(|c| Ok(Frame::data(c.clone())))
        .collect();
    let mut response = Response::new(Either::Right(StreamBody::new(futures_util::stream::iter(
        frames,
    ))));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// The bare pass-through proxy's state.
struct Proxy {
    client: Client<HttpConnector, Incoming>,
    /// `http://127.0.0.1:<port>`
    upstream: String,
    expected: HeaderValue,
    upstream_auth: HeaderValue,
}

type ProxyBody = Either<Incoming, Full<Bytes>>;

async fn proxy(upstream_port: u16) {
    let listener = listen().await;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .build(connector);
    let state = Arc::new(Proxy {
        client,
        upstream: format!("http://127.0.0.1:{upstream_port}"),
        expected: HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap(),
        upstream_auth: HeaderValue::from_str(&format!("Bearer {UPSTREAM_KEY}")).unwrap(),
    });
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| proxy_forward(state.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Headers that belong to one connection, never forwarded.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        headers.remove(name);
    }
}

async fn proxy_forward(
    state: Arc<Proxy>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    if req.headers().get(AUTHORIZATION) != Some(&state.expected) {
        let mut response = json_response(
            StatusCode::UNAUTHORIZED,
            r#"{"error":"Unauthorized"}"#,
            Either::Right,
        );
        response
            .headers_mut()
            .insert("www-authenticate", HeaderValue::from_static("Bearer"));
        return Ok(response);
    }
    let (mut parts, body) = req.into_parts();
    let target = format!(
        "{}{}",
        state.upstream,
        parts.uri.path_and_query().map_or("/", |pq| pq.as_str())
    );
    let Ok(uri) = target.parse() else {
        return Ok(json_response(
            StatusCode::BAD_REQUEST,
            r#"{"error":"bad path"}"#,
            Either::Right,
        ));
    };
    parts.uri = uri;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(HOST);
    parts
        .headers
        .insert(AUTHORIZATION, state.upstream_auth.clone());
    match state.client.request(Request::from_parts(parts, body)).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Ok(Response::from_parts(parts, Either::Left(body)))
        }
        Err(_) => Ok(json_response(
            StatusCode::BAD_GATEWAY,
            r#"{"error":"upstream"}"#,
            Either::Right,
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

/// A server process, killed when dropped.
struct Proc {
    child: Child,
    _stdin: Option<ChildStdin>,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Re-executes this binary in `role`; returns the process and the port it listens on.
fn spawn_role(role: &str, extra: &[String]) -> (Proc, u16) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg(ROLE_FLAG)
        .arg(role)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{role}: no port announced (got {line:?})"));
    (
        Proc {
            child,
            _stdin: stdin,
        },
        port,
    )
}

/// The release gateway binary; built when missing (the bench binary run by hand).
fn gateway_bin() -> PathBuf {
    let bin = PathBuf::from(BIN);
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let status = Command::new(cargo)
            .args(["build", "--release", "--bin", "agent-gateway"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(
            status.success(),
            "cargo build --release --bin agent-gateway failed"
        );
    }
    bin
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn_gateway(dir: &Path, port: u16, upstream_port: u16) -> Proc {
    let config = format!(
        "gateway:\n  port: {port}\n  dataDir: {data}\n  tokens: [{{id: bench, secret: {TOKEN}, scopes: ['*']}}]\n  \
         rateLimit: {{windowMs: 1000, maxRequests: 1000000000}}\n  limits: {{maxConcurrentTurnsPerClient: 100000, maxConcurrentTurns: 100000}}\n\
         local: {{autoFetch: false, preload: false}}\n\
         providers:\n  up: {{type: openai, baseUrl: 'http://127.0.0.1:{upstream_port}/v1', apiKeyEnv: {UPSTREAM_KEY_ENV}, \
         models: [bench-model], timeoutMs: 10000, maxRetries: 0}}\n\
         agents:\n  default: {{model: up/bench-model}}\n",
        data = dir.join("data").display()
    );
    let path = dir.join("bench.yaml");
    std::fs::write(&path, config).unwrap();
    let child = Command::new(gateway_bin())
        .args(["serve", "--config"])
        .arg(&path)
        .env("AGENT_GATEWAY_LOG", "warn")
        .env("AGENT_GATEWAY_NO_FETCH", "1")
        .env(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
        .spawn()
        .unwrap();
    Proc {
        child,
        _stdin: None,
    }
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Peak resident set size (VmHWM) of a process, in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}

fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

// ---------------------------------------------------------------------------------------------
// Load generator
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Direct,
    Proxy,
    Gateway,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Direct => "upstream direct",
            Target::Proxy => "proxy",
            Target::Gateway => "gateway",
        }
    }

    /// The name `BENCH_TARGETS` uses.
    fn key(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Proxy => "proxy",
            Target::Gateway => "gateway",
        }
    }
}

/// Where a scenario sends its requests, and which process serves them.
struct Endpoint {
    target: Target,
    port: u16,
    host: HeaderValue,
    auth: HeaderValue,
    model: &'static str,
    pid: u32,
}

type Sender = SendRequest<Full<Bytes>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn connect(port: u16) -> Result<Sender, BoxError> {
    let stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

fn chat_body(model: &str, stream: bool) -> Bytes {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    Bytes::from(body.to_string())
}

fn chat_request(ep: &Endpoint, body: &Bytes) -> Request<Full<Bytes>> {
    let mut req = Request::new(Full::new(body.clone()));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = hyper::Uri::from_static(PATH);
    let headers = req.headers_mut();
    headers.insert(HOST, ep.host.clone());
    headers.insert(AUTHORIZATION, ep.auth.clone());
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    req
}

struct Reply {
    status: StatusCode,
    content_type: String,
    /// Time to the first body frame with data.
    first: Duration,
    /// Time to the end of the body.
    total: Duration,
    /// The body, when asked to keep it.
    body: Vec<u8>,
}

/// Sends one request and reads the whole response.
async fn call(
    sender: &mut Sender,
    req: Request<Full<Bytes>>,
    keep: bool,
) -> Result<Reply, BoxError> {
    let started = Instant::now();
    let response = sender.send_request(req).await?;
    let status = response.status();
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut body = response.into_body();
    let mut first = None;
    let mut kept = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            if first.is_none() && !data.is_empty() {
                first = Some(started.elapsed());
            }
            if keep {
                kept.extend_from_slice(data);
            }
        }
    }
    let total = started.elapsed();
    Ok(Reply {
        status,
        content_type,
        first: first.unwrap_or(total),
        total,
        body: kept,
    })
}

/// One request on a fresh connection (checks, health).
async fn once(port: u16, req: Request<Full<Bytes>>) -> Result<Reply, BoxError> {
    let mut sender = connect(port).await?;
    sender.ready().await?;
    tokio::time::timeout(REQUEST_TIMEOUT, call(&mut sender, req, true)).await?
}

/// The assistant text of a chat completion (or of an event stream, which must end with
/// `data: [DONE]` and carry a usage chunk).
fn answer_text(reply: &Reply, stream: bool) -> Result<String, String> {
    let text = String::from_utf8_lossy(&reply.body);
    if !stream {
        let v: Value =
            serde_json::from_str(&text).map_err(|e| format!("not JSON ({e}): {text}"))?;
        if v.pointer("/usage/total_tokens")
            .and_then(Value::as_u64)
            .is_none()
        {
            return Err(format!("no usage.total_tokens: {text}"));
        }
        return v
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("no choices[0].message.content: {text}"));
    }
    if !reply.content_type.starts_with("text/event-stream") {
        return Err(format!("content-type {:?}", reply.content_type));
    }
    let (mut content, mut done, mut usage) = (String::new(), false, false);
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:").map(str::trim) else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value =
            serde_json::from_str(data).map_err(|e| format!("chunk not JSON ({e}): {data}"))?;
        if let Some(piece) = v
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
        {
            content.push_str(piece);
        }
        usage |= v
            .pointer("/usage/total_tokens")
            .and_then(Value::as_u64)
            .is_some();
    }
    if !done {
        return Err("no data: [DONE]".to_owned());
    }
    if !usage {
        return Err("no usage chunk".to_owned());
    }
    Ok(content)
}

/// Checks one answer of each kind; Err says what is wrong (`status N` when not 200).
async fn check(ep: &Endpoint) -> Result<(), String> {
    for stream in [false, true] {
        let reply = once(ep.port, chat_request(ep, &chat_body(ep.model, stream)))
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        if reply.status != StatusCode::OK {
            return Err(format!("status {}", reply.status.as_u16()));
        }
        let text = answer_text(&reply, stream)?;
        if text != CONTENT {
            return Err(format!("answer {text:?}, expected {CONTENT:?}"));
        }
    }
    Ok(())
}

async fn wait_healthy(port: u16) {
    for _ in 0..200 {
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.uri_mut() = hyper::Uri::from_static("/health");
        req.headers_mut().insert(
            HOST,
            HeaderValue::from_str(&format!("127.0.0.1:{port}")).unwrap(),
        );
        if let Ok(r) = once(port, req).await {
            if r.status == StatusCode::OK {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("gateway did not start");
}

#[derive(Default)]
struct WorkerOut {
    /// (whole response, first body frame) of each measured 200 answer.
    samples: Vec<(Duration, Duration)>,
    non200: u64,
    errors: u64,
}

/// Requests back to back on one keep-alive connection until `until`; answers to requests
/// started before `measure_from` (warm-up) are not sampled, but non-200s and errors count.
async fn worker(
    ep: Arc<Endpoint>,
    body: Bytes,
    measure_from: Instant,
    until: Instant,
) -> WorkerOut {
    let mut out = WorkerOut::default();
    let mut sender: Option<Sender> = None;
    while Instant::now() < until {
        let s = match sender.as_mut() {
            Some(s) => s,
            None => match connect(ep.port).await {
                Ok(s) => sender.insert(s),
                Err(_) => {
                    out.errors += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        if s.ready().await.is_err() {
            // The server closed the connection: open another.
            sender = None;
            continue;
        }
        let started = Instant::now();
        match tokio::time::timeout(REQUEST_TIMEOUT, call(s, chat_request(&ep, &body), false)).await
        {
            Ok(Ok(reply)) if reply.status == StatusCode::OK => {
                if started >= measure_from {
                    out.samples.push((reply.total, reply.first));
                }
            }
            Ok(Ok(_)) => out.non200 += 1,
            Ok(Err(_)) | Err(_) => {
                out.errors += 1;
                sender = None;
            }
        }
    }
    out
}

struct Row {
    target: Target,
    stream: bool,
    conns: usize,
    requests: usize,
    rps: f64,
    p50: f64,
    p99: f64,
    first_p50: f64,
    non200: u64,
    errors: u64,
    cpu_ms: f64,
    rss_mib: f64,
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

struct Plan {
    warmup: Duration,
    measure: Duration,
    ticks_per_second: f64,
}

async fn scenario(ep: Arc<Endpoint>, stream: bool, conns: usize, plan: &Plan) -> Row {
    let body = chat_body(ep.model, stream);
    let measure_from = Instant::now() + plan.warmup;
    let until = measure_from + plan.measure;
    let tasks: Vec<_> = (0..conns)
        .map(|_| tokio::spawn(worker(ep.clone(), body.clone(), measure_from, until)))
        .collect();
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu0 = cpu_ticks(ep.pid);
    let t0 = Instant::now();
    let mut out = WorkerOut::default();
    for task in tasks {
        let w = task.await.unwrap();
        out.samples.extend(w.samples);
        out.non200 += w.non200;
        out.errors += w.errors;
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (cpu_ticks(ep.pid) - cpu0) as f64 / plan.ticks_per_second;
    let requests = out.samples.len();
    let mut total: Vec<Duration> = out.samples.iter().map(|s| s.0).collect();
    let mut first: Vec<Duration> = out.samples.iter().map(|s| s.1).collect();
    total.sort();
    first.sort();
    Row {
        target: ep.target,
        stream,
        conns,
        requests,
        rps: requests as f64 / wall,
        p50: pct(&total, 0.5),
        p99: pct(&total, 0.99),
        first_p50: pct(&first, 0.5),
        non200: out.non200,
        errors: out.errors,
        cpu_ms: cpu * 1000.0 / requests.max(1) as f64,
        rss_mib: peak_rss_mib(ep.pid),
    }
}

fn mode(stream: bool) -> &'static str {
    if stream {
        "streaming"
    } else {
        "non-streaming"
    }
}

fn print_row(r: &Row) {
    let first = if r.stream {
        format!("{:.3}", r.first_p50)
    } else {
        "-".to_owned()
    };
    println!(
        "| {} | {} | {} | {} | {:.0} | {:.3} | {:.3} | {first} | {} | {:.4} | {:.1} |",
        r.target.name(),
        mode(r.stream),
        r.conns,
        r.requests,
        r.rps,
        r.p50,
        r.p99,
        r.non200 + r.errors,
        r.cpu_ms,
        r.rss_mib
    );
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn bench() {
    let secs: f64 = env_or("BENCH_SECONDS", 5.0);
    let warmup: f64 = env_or("BENCH_WARMUP_SECONDS", 1.0);
    let mut conns: Vec<usize> = std::env::var("BENCH_CONNECTIONS")
        .unwrap_or_else(|_| "16,64".to_owned())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .filter(|&c| c > 0)
        .collect();
    if conns.is_empty() {
        conns = vec![16, 64];
    }
    let plan = Plan {
        warmup: Duration::from_secs_f64(warmup),
        measure: Duration::from_secs_f64(secs),
        ticks_per_second: clock_ticks_per_second(),
    };

    let (upstream, upstream_port) = spawn_role("upstream", &[]);
    let (proxy, proxy_port) = spawn_role("proxy", &[upstream_port.to_string()]);
    let dir = tempfile::tempdir().unwrap();
    let gateway_port = free_port();
    let gateway = spawn_gateway(dir.path(), gateway_port, upstream_port);

    let endpoint = |target, port: u16, auth: &str, model, pid| {
        Arc::new(Endpoint {
            target,
            port,
            host: HeaderValue::from_str(&format!("127.0.0.1:{port}")).unwrap(),
            auth: HeaderValue::from_str(&format!("Bearer {auth}")).unwrap(),
            model,
            pid,
        })
    };
    let endpoints = [
        endpoint(
            Target::Direct,
            upstream_port,
            UPSTREAM_KEY,
            "bench-model",
            upstream.pid(),
        ),
        endpoint(Target::Proxy, proxy_port, TOKEN, "bench-model", proxy.pid()),
        endpoint(
            Target::Gateway,
            gateway_port,
            TOKEN,
            "up/bench-model",
            gateway.pid(),
        ),
    ];

    let rt = runtime();
    let only: Option<Vec<String>> = std::env::var("BENCH_TARGETS")
        .ok()
        .map(|v| v.split(',').map(|t| t.trim().to_owned()).collect());
    let modes: Vec<bool> = match std::env::var("BENCH_MODES") {
        Ok(v) => [false, true]
            .into_iter()
            .filter(|&s| v.split(',').any(|m| m.trim() == mode(s)))
            .collect(),
        Err(_) => vec![false, true],
    };
    let rows = rt.block_on(async {
        wait_healthy(gateway_port).await;
        let mut active = Vec::new();
        for ep in endpoints
            .iter()
            .filter(|ep| only.as_ref().is_none_or(|o| o.iter().any(|t| t == ep.target.key())))
        {
            match check(ep).await {
                Ok(()) => active.push(ep.clone()),
                Err(e) if ep.target == Target::Gateway => {
                    if e.starts_with("status ") {
                        println!("gateway: {PATH} unavailable ({e}); gateway rows skipped");
                    } else {
                        println!("gateway: {PATH} answers wrongly ({e}); gateway rows skipped");
                    }
                }
                Err(e) => panic!("{}: {e}", ep.target.name()),
            }
        }
        println!();
        println!(
            "{secs} s per scenario after {warmup} s of warm-up; CPU and RSS are the serving \
             process's (the upstream for direct rows)"
        );
        println!();
        println!(
            "| target | mode | connections | requests | req/s | p50 ms | p99 ms | first chunk p50 ms | \
             non-200 | CPU ms/req | peak RSS MiB |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        let mut rows = Vec::new();
        for ep in &active {
            for &stream in &modes {
                for &c in &conns {
                    let row = scenario(ep.clone(), stream, c, &plan).await;
                    print_row(&row);
                    rows.push(row);
                }
            }
        }
        rows
    });
    drop(rt);
    report(&rows, &conns);
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| r.non200 + r.errors > 0)
        .map(|r| {
            format!(
                "{} {} {}: {} non-200, {} transport errors",
                r.target.name(),
                mode(r.stream),
                r.conns,
                r.non200,
                r.errors
            )
        })
        .collect();
    drop((gateway, proxy, upstream, dir));
    if !failed.is_empty() {
        eprintln!("FAILED: requests that did not get a 200:");
        for f in failed {
            eprintln!("  {f}");
        }
        std::process::exit(1);
    }
}

fn find(rows: &[Row], target: Target, stream: bool, conns: usize) -> Option<&Row> {
    rows.iter()
        .find(|r| r.target == target && r.stream == stream && r.conns == conns)
}

/// PASS/FAIL, or n/a when the rows the target needs were not measured.
fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "n/a",
    }
}

/// `value` when it was measured (the folds start at an infinity).
fn measured(value: f64) -> Option<f64> {
    value.is_finite().then_some(value)
}

/// Ratios against the proxy and the direct upstream, and the issue's targets.
fn report(rows: &[Row], conns: &[usize]) {
    let low = conns.iter().copied().min().unwrap_or(16);
    let gateway_measured = rows.iter().any(|r| r.target == Target::Gateway);
    println!();
    println!("baseline (bare proxy):");
    let added_p99 = |target, stream| {
        Some(find(rows, target, stream, low)?.p99 - find(rows, Target::Direct, stream, low)?.p99)
    };
    for stream in [false, true] {
        if let Some(d) = added_p99(Target::Proxy, stream) {
            println!(
                "- proxy added p99 vs direct at {low} connections, {}: {d:+.3} ms",
                mode(stream)
            );
        }
    }
    for &c in conns {
        if let Some(r) = find(rows, Target::Proxy, false, c) {
            println!(
                "- proxy CPU per non-streaming request at {c} connections: {:.4} ms",
                r.cpu_ms
            );
        }
    }
    if let Some(r) = rows.iter().rev().find(|r| r.target == Target::Proxy) {
        println!("- proxy peak RSS: {:.1} MiB", r.rss_mib);
    }
    println!();
    if !gateway_measured {
        println!("gateway: not measured ({PATH} unavailable); ratios and targets n/a");
        return;
    }
    println!("gateway:");
    let mut lowest_ratio = f64::INFINITY;
    for stream in [false, true] {
        for &c in conns {
            if let (Some(g), Some(p)) = (
                find(rows, Target::Gateway, stream, c),
                find(rows, Target::Proxy, stream, c),
            ) {
                let ratio = g.rps / p.rps;
                lowest_ratio = lowest_ratio.min(ratio);
                println!(
                    "- gateway / proxy throughput, {} at {c} connections: {ratio:.3}",
                    mode(stream)
                );
            }
        }
    }
    let mut worst_added = f64::NEG_INFINITY;
    for stream in [false, true] {
        if let Some(d) = added_p99(Target::Gateway, stream) {
            worst_added = worst_added.max(d);
            println!(
                "- gateway added p99 vs direct at {low} connections, {}: {d:+.3} ms",
                mode(stream)
            );
        }
    }
    let mut worst_cpu = f64::NEG_INFINITY;
    for &c in conns {
        if let Some(r) = find(rows, Target::Gateway, false, c) {
            worst_cpu = worst_cpu.max(r.cpu_ms);
            println!(
                "- gateway CPU per non-streaming request at {c} connections: {:.4} ms",
                r.cpu_ms
            );
        }
    }
    let rss = rows
        .iter()
        .filter(|r| r.target == Target::Gateway)
        .map(|r| r.rss_mib)
        .fold(0.0, f64::max);
    println!("- gateway peak RSS: {rss:.1} MiB");
    println!();
    println!("targets:");
    println!(
        "- {}: gateway >= 90% of proxy throughput (lowest {:.1}%)",
        verdict(measured(lowest_ratio).map(|r| r >= 0.9)),
        lowest_ratio * 100.0
    );
    println!(
        "- {}: gateway CPU <= 0.03 ms per non-streaming request (highest {worst_cpu:.4} ms)",
        verdict(measured(worst_cpu).map(|c| c <= 0.03))
    );
    println!(
        "- {}: gateway added p99 < 1 ms at {low} connections (highest {worst_added:+.3} ms)",
        verdict(measured(worst_added).map(|d| d < 1.0))
    );
    println!(
        "- {}: gateway peak RSS < 64 MiB ({rss:.1} MiB)",
        verdict(Some(rss < 64.0))
    );
}
