//! Prometheus metrics (`GET /metrics`, text exposition format 0.0.4) through the `metrics`
//! facade and `metrics-exporter-prometheus`'s recorder, installed once per process (server
//! generations and the test suite's many gateways share it, so counters are per process).
//!
//! Every label value comes from a bounded set: route templates, HTTP methods and statuses,
//! catalogue method names, JSON-RPC error codes, fixed limiter and queue names, and the
//! operator's provider/model ids (at most [`MAX_MODEL_SERIES`] pairs, then `other`), and the
//! tenant ids (client ids, never secrets) of the largest memory indexes (at most
//! [`MAX_MEMORY_TENANT_SERIES`], then `other`). Never a raw path, a method name a client made
//! up, or anything else a client chooses.
//!
//! The request paths (HTTP, JSON-RPC) keep their handles in static tables filled on first use:
//! a request costs a table lookup, an atomic add and a histogram sample, no allocation.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics::{Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::api::generated::methods::{error_codes, MethodId, METHODS};

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Histogram buckets (seconds) of every duration histogram.
pub const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Distinct (provider, model) label pairs per process; later pairs are counted as `other`.
pub const MAX_MODEL_SERIES: usize = 256;

/// Histogram samples wait in the recorder until they are folded into their buckets: at a
/// scrape, and at least this often without one (so memory stays flat when nobody scrapes).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

const HTTP_REQUESTS: &str = "agentgw_http_requests_total";
const HTTP_DURATION: &str = "agentgw_http_request_duration_seconds";
const RPC_REQUESTS: &str = "agentgw_rpc_requests_total";
const RPC_DURATION: &str = "agentgw_rpc_request_duration_seconds";
const WS_CONNECTIONS: &str = "agentgw_websocket_connections";
const SSE_SUBSCRIBERS: &str = "agentgw_sse_subscribers";
const RATE_LIMITED: &str = "agentgw_rate_limited_total";
const WEBHOOK_QUEUED: &str = "agentgw_webhook_runs_queued";
const MODEL_CALLS: &str = "agentgw_model_calls_total";
const MODEL_TOKENS: &str = "agentgw_model_tokens_total";
const MODEL_COST: &str = "agentgw_model_cost_microusd_total";
const MODEL_DURATION: &str = "agentgw_model_call_duration_seconds";
const TURNS: &str = "agentgw_turns_total";
const QUEUE_DEPTH: &str = "agentgw_queue_depth";
const RECORDER_DROPPED: &str = "agentgw_recorder_dropped_total";
const RECORDER_BACKPRESSURE: &str = "agentgw_recorder_backpressure_total";
const MEMORY_INDEX_ENTRIES: &str = "agentgw_memory_index_entries";

/// Tenants with a series of their own in `agentgw_memory_index_entries` (the largest ones);
/// the others are summed into `tenant="other"`.
pub const MAX_MEMORY_TENANT_SERIES: usize = 100;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's recorder, installed on first use (never twice, never failing: when another
/// recorder was installed first, the handle renders only what this one saw, i.e. nothing).
pub fn handle() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new();
        let builder = match builder.set_buckets(BUCKETS) {
            Ok(b) => b,
            Err(_) => PrometheusBuilder::new(),
        };
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was already installed: /metrics stays empty");
        }
        describe();
        // The gauges are in the exposition from the start, at 0.
        gauge!(WS_CONNECTIONS).set(0.0);
        gauge!(SSE_SUBSCRIBERS).set(0.0);
        gauge!(WEBHOOK_QUEUED).set(0.0);
        handle.run_upkeep();
        let upkeep = handle.clone();
        let spawned = std::thread::Builder::new()
            .name("metrics-upkeep".to_owned())
            .spawn(move || loop {
                std::thread::sleep(UPKEEP_EVERY);
                upkeep.run_upkeep();
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "metrics upkeep thread not started; samples fold in at scrapes");
        }
        handle
    })
}

/// Installs the recorder now (idempotent): every metric recorded from here on is kept.
pub fn install() {
    let _ = handle();
}

/// The exposition (text format 0.0.4).
pub fn render() -> String {
    let mut out = handle().render();
    memory_index_exposition(&mut out);
    out
}

fn describe() {
    describe_counter!(
        HTTP_REQUESTS,
        "HTTP requests answered, by route template, method and status"
    );
    describe_histogram!(
        HTTP_DURATION,
        "Time to the response head of HTTP requests, by route template and method (seconds)"
    );
    describe_counter!(
        RPC_REQUESTS,
        "JSON-RPC calls (/ws and /rpc), by catalogue method and outcome (ok or the error code)"
    );
    describe_histogram!(
        RPC_DURATION,
        "Duration of JSON-RPC calls, by catalogue method (seconds)"
    );
    describe_gauge!(WS_CONNECTIONS, "Open authenticated /ws connections");
    describe_gauge!(SSE_SUBSCRIBERS, "Open server-sent event streams");
    describe_counter!(RATE_LIMITED, "Requests refused by a limiter, by limiter");
    describe_gauge!(
        WEBHOOK_QUEUED,
        "Webhook agent runs accepted and waiting for a run slot"
    );
    describe_counter!(
        MODEL_CALLS,
        "Model calls, by provider, model and outcome (ok, error)"
    );
    describe_counter!(
        MODEL_TOKENS,
        "Model tokens, by provider, model and kind (input, output, cached)"
    );
    describe_counter!(
        MODEL_COST,
        "Estimated model cost in millionths of a US dollar (each call rounded), by provider and model"
    );
    describe_histogram!(
        MODEL_DURATION,
        "Model call latency, by provider and model (seconds)"
    );
    describe_counter!(TURNS, "Agent turns ended, by finish reason");
    describe_gauge!(QUEUE_DEPTH, "Items waiting in an internal queue, by queue");
    describe_counter!(
        RECORDER_DROPPED,
        "Observability rows dropped because the writer's queue was full, by kind"
    );
    describe_counter!(
        RECORDER_BACKPRESSURE,
        "Model calls that waited to start because the writer's queue held its most usage rows"
    );
}

/// One row of a [`Table`]: its cells, each filled on first use.
type Row<T> = Box<[OnceLock<T>]>;

/// Rows of `cols` cells each, a row allocated when first used.
struct Table<T> {
    rows: Box<[OnceLock<Row<T>>]>,
    cols: usize,
}

impl<T> Table<T> {
    fn new(rows: usize, cols: usize) -> Self {
        install();
        Self {
            rows: (0..rows).map(|_| OnceLock::new()).collect(),
            cols,
        }
    }

    fn get(&self, row: usize, col: usize, make: impl FnOnce() -> T) -> Option<&T> {
        let cells = self
            .rows
            .get(row)?
            .get_or_init(|| (0..self.cols).map(|_| OnceLock::new()).collect());
        Some(cells.get(col)?.get_or_init(make))
    }
}

/// A few handles by `&'static str` name (a queue, a finish reason): the name's set is fixed by
/// the code that calls; past `CAP` names the handle is made for each call instead.
struct ByName<T> {
    entries: Mutex<Vec<(&'static str, T)>>,
}

impl<T> ByName<T> {
    const CAP: usize = 32;

    const fn new() -> Self {
        Self {
            entries: Mutex::new(Vec::new()),
        }
    }

    fn with(&self, name: &'static str, make: impl FnOnce() -> T, f: impl FnOnce(&T)) {
        install();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, h)) = entries.iter().find(|(n, _)| *n == name) {
            return f(h);
        }
        let h = make();
        f(&h);
        if entries.len() < Self::CAP {
            entries.push((name, h));
        }
    }
}

// ---------------------------------------------------------------------------------------
// HTTP

macro_rules! routes {
    ($($id:ident = $name:literal,)*) => {
        /// The route templates (index of [`ROUTES`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(u8)]
        pub enum R {
            $($id,)*
        }

        /// Route templates, the only values of the `route` label (`other`: everything
        /// else). `{webhooks}` stands for the configured `webhooks.path`.
        pub const ROUTES: &[&str] = &[$($name,)*];
    };
}

routes! {
    Other = "other",
    Root = "/",
    Health = "/health",
    Metrics = "/metrics",
    Rpc = "/rpc",
    Ws = "/ws",
    ApiHealth = "/api/health",
    ApiAgents = "/api/agents",
    ApiChannels = "/api/channels",
    ApiActivity = "/api/activity",
    ApiMemorySearch = "/api/memory/search",
    ApiMemoryStats = "/api/memory/stats",
    ApiChatHistory = "/api/chat/history",
    ApiChat = "/api/chat",
    ApiChatStream = "/api/chat/stream",
    ApiEvents = "/api/events",
    V1Chat = "/v1/chat/completions",
    V1Models = "/v1/models",
    V1Model = "/v1/models/{model}",
    V1Embeddings = "/v1/embeddings",
    V1Responses = "/v1/responses",
    Media = "/media/{id}",
    MediaMeta = "/media/{id}/meta",
    HookStrict = "{webhooks}/webhook",
    HookMapped = "{webhooks}/{mapping}",
    OpenApi = "/openapi.json",
    OpenRpc = "/openrpc.json",
    RpcDocs = "/docs/rpc/{page}",
    Docs = "/docs/{file}",
    App = "/app/{file}",
}

/// A request's route template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpRoute(pub R);

impl HttpRoute {
    pub fn as_str(self) -> &'static str {
        ROUTES.get(self.0 as usize).copied().unwrap_or("other")
    }
}

/// HTTP methods of the `method` label (index 0: any other).
const HTTP_METHODS: &[&str] = &[
    "other", "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS",
];

/// A request's method (an index of the method label's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpMethod(u8);

pub fn http_method(m: &http::Method) -> HttpMethod {
    HttpMethod(match *m {
        http::Method::GET => 1,
        http::Method::POST => 2,
        http::Method::PUT => 3,
        http::Method::PATCH => 4,
        http::Method::DELETE => 5,
        http::Method::HEAD => 6,
        http::Method::OPTIONS => 7,
        _ => 0,
    })
}

/// Status codes with a cached handle; any other code is formatted at each request.
const STATUSES: &[(u16, &str)] = &[
    (200, "200"),
    (101, "101"),
    (201, "201"),
    (202, "202"),
    (204, "204"),
    (206, "206"),
    (301, "301"),
    (302, "302"),
    (303, "303"),
    (304, "304"),
    (307, "307"),
    (308, "308"),
    (400, "400"),
    (401, "401"),
    (403, "403"),
    (404, "404"),
    (405, "405"),
    (406, "406"),
    (408, "408"),
    (409, "409"),
    (410, "410"),
    (411, "411"),
    (412, "412"),
    (413, "413"),
    (414, "414"),
    (415, "415"),
    (416, "416"),
    (422, "422"),
    (426, "426"),
    (429, "429"),
    (431, "431"),
    (500, "500"),
    (501, "501"),
    (502, "502"),
    (503, "503"),
    (504, "504"),
];

static HTTP_COUNTS: LazyLock<Table<Counter>> =
    LazyLock::new(|| Table::new(ROUTES.len() * HTTP_METHODS.len(), STATUSES.len()));
static HTTP_TIMES: LazyLock<Table<Histogram>> =
    LazyLock::new(|| Table::new(ROUTES.len(), HTTP_METHODS.len()));

/// Counts one answered HTTP request and its time to the response head.
pub fn http_request(route: HttpRoute, method: HttpMethod, status: u16, elapsed: Duration) {
    let (r, m) = (route.0 as usize, usize::from(method.0));
    let route_name = route.as_str();
    let method_name = HTTP_METHODS.get(m).copied().unwrap_or("other");
    match STATUSES.iter().position(|(code, _)| *code == status) {
        Some(s) => {
            let row = r * HTTP_METHODS.len() + m;
            if let Some(c) = HTTP_COUNTS.get(row, s, || {
                let code = STATUSES.get(s).map_or("other", |(_, name)| *name);
                counter!(HTTP_REQUESTS, "route" => route_name, "method" => method_name, "status" => code)
            }) {
                c.increment(1);
            }
        }
        None => counter!(HTTP_REQUESTS, "route" => route_name, "method" => method_name, "status" => status.to_string())
            .increment(1),
    }
    if let Some(h) = HTTP_TIMES.get(
        r,
        m,
        || histogram!(HTTP_DURATION, "route" => route_name, "method" => method_name),
    ) {
        h.record(elapsed.as_secs_f64());
    }
}

// ---------------------------------------------------------------------------------------
// JSON-RPC

/// A call's method as the label knows it: a public catalogue method, else `unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcMethod(Option<MethodId>);

impl RpcMethod {
    /// By the dispatch's own lookup; internal methods (never dispatchable) are `unknown`.
    pub fn of(name: &str) -> Self {
        Self(MethodId::from_name(name).filter(|id| !id.info().internal))
    }

    /// A message that names no method (unparseable, not a request object).
    pub const UNKNOWN: Self = Self(None);

    pub fn as_str(self) -> &'static str {
        self.0.map_or("unknown", |id| id.info().name)
    }

    fn index(self) -> usize {
        self.0.map_or(METHODS.len(), |id| id as usize)
    }
}

/// JSON-RPC error codes with a cached handle (the catalogue's); column 0 is `ok`.
const RPC_CODES: &[(i64, &str)] = &[
    (error_codes::PARSE_ERROR, "-32700"),
    (error_codes::INVALID_REQUEST, "-32600"),
    (error_codes::METHOD_NOT_FOUND, "-32601"),
    (error_codes::INVALID_PARAMS, "-32602"),
    (error_codes::INTERNAL_ERROR, "-32603"),
    (error_codes::RATE_LIMITED, "-32000"),
    (error_codes::NOT_FOUND, "-32001"),
    (error_codes::CONFLICT, "-32002"),
    (error_codes::UNAVAILABLE, "-32003"),
    (error_codes::NOT_IMPLEMENTED, "-32004"),
];

static RPC_COUNTS: LazyLock<Table<Counter>> =
    LazyLock::new(|| Table::new(METHODS.len() + 1, RPC_CODES.len() + 1));
static RPC_TIMES: LazyLock<Table<Histogram>> = LazyLock::new(|| Table::new(METHODS.len() + 1, 1));

/// Counts one JSON-RPC call: `Ok` or its error code, and how long it took.
pub fn rpc_call(method: RpcMethod, outcome: Result<(), i64>, elapsed: Duration) {
    let row = method.index();
    let name = method.as_str();
    let col = match outcome {
        Ok(()) => Some(0),
        Err(code) => RPC_CODES
            .iter()
            .position(|(c, _)| *c == code)
            .map(|i| i + 1),
    };
    match col {
        Some(col) => {
            if let Some(c) = RPC_COUNTS.get(row, col, || {
                let outcome = match col.checked_sub(1) {
                    None => "ok",
                    Some(i) => RPC_CODES.get(i).map_or("other", |(_, s)| *s),
                };
                counter!(RPC_REQUESTS, "method" => name, "outcome" => outcome)
            }) {
                c.increment(1);
            }
        }
        // A code outside the catalogue's (set by the gateway's code, so still bounded).
        None => {
            let code = outcome.err().unwrap_or_default();
            counter!(RPC_REQUESTS, "method" => name, "outcome" => code.to_string()).increment(1)
        }
    }
    if let Some(h) = RPC_TIMES.get(row, 0, || histogram!(RPC_DURATION, "method" => name)) {
        h.record(elapsed.as_secs_f64());
    }
}

/// Counts a JSON-RPC message the transport refused before the envelope read it (over the
/// size cap, over the WebSocket message rate, binary, not UTF-8): `method="unknown"`.
pub fn rpc_refused(code: i64) {
    rpc_call(RpcMethod::UNKNOWN, Err(code), Duration::ZERO);
}

// ---------------------------------------------------------------------------------------
// Gauges of open things

static WS_GAUGE: LazyLock<Gauge> = LazyLock::new(|| {
    install();
    gauge!(WS_CONNECTIONS)
});
static SSE_GAUGE: LazyLock<Gauge> = LazyLock::new(|| {
    install();
    gauge!(SSE_SUBSCRIBERS)
});
static WEBHOOK_GAUGE: LazyLock<Gauge> = LazyLock::new(|| {
    install();
    gauge!(WEBHOOK_QUEUED)
});

/// One open /ws connection while held (`agentgw_websocket_connections`).
#[must_use = "counts the connection only while held"]
pub struct WsConnection(());

impl WsConnection {
    pub fn open() -> Self {
        WS_GAUGE.increment(1.0);
        Self(())
    }
}

impl Drop for WsConnection {
    fn drop(&mut self) {
        WS_GAUGE.decrement(1.0);
    }
}

/// One open server-sent event stream while held (`agentgw_sse_subscribers`).
#[must_use = "counts the stream only while held"]
pub struct SseSubscriber(());

impl SseSubscriber {
    pub fn open() -> Self {
        SSE_GAUGE.increment(1.0);
        Self(())
    }
}

impl Drop for SseSubscriber {
    fn drop(&mut self) {
        SSE_GAUGE.decrement(1.0);
    }
}

/// One webhook run waiting for a run slot while held (`agentgw_webhook_runs_queued`).
#[must_use = "counts the run only while held"]
pub struct WebhookQueued(());

impl WebhookQueued {
    pub fn enter() -> Self {
        WEBHOOK_GAUGE.increment(1.0);
        Self(())
    }
}

impl Drop for WebhookQueued {
    fn drop(&mut self) {
        WEBHOOK_GAUGE.decrement(1.0);
    }
}

// ---------------------------------------------------------------------------------------
// Limiters

/// The limiters whose refusals are counted (`agentgw_rate_limited_total{limiter}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limiter {
    /// `gateway.rateLimit`: HTTP requests (and /rpc batch items) per client address.
    Http,
    /// `gateway.wsMessageRateLimit`: messages per WebSocket connection.
    WsMessages,
    /// `gateway.limits.maxConcurrentTurnsPerClient`.
    TurnsPerClient,
    /// `gateway.limits.maxConcurrentTurns`.
    TurnsGlobal,
    /// A JSON-RPC method's own limit (`env.set`, `env.list`).
    RpcMethod,
    /// The webhook run queue is full (`webhooks.maxQueuedRuns`): 503.
    WebhookQueue,
}

impl Limiter {
    pub const ALL: [Limiter; 6] = [
        Limiter::Http,
        Limiter::WsMessages,
        Limiter::TurnsPerClient,
        Limiter::TurnsGlobal,
        Limiter::RpcMethod,
        Limiter::WebhookQueue,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Limiter::Http => "http",
            Limiter::WsMessages => "ws_messages",
            Limiter::TurnsPerClient => "turns_per_client",
            Limiter::TurnsGlobal => "turns_global",
            Limiter::RpcMethod => "rpc_method",
            Limiter::WebhookQueue => "webhook_queue",
        }
    }
}

static LIMITED: LazyLock<Table<Counter>> = LazyLock::new(|| Table::new(1, Limiter::ALL.len()));

/// Counts one refusal by `limiter`.
pub fn rate_limited(limiter: Limiter) {
    let name = limiter.as_str();
    if let Some(c) = LIMITED.get(
        0,
        limiter as usize,
        || counter!(RATE_LIMITED, "limiter" => name),
    ) {
        c.increment(1);
    }
}

// ---------------------------------------------------------------------------------------
// Agent turns and model calls

struct ModelSeries {
    ok: Counter,
    error: Counter,
    input: Counter,
    output: Counter,
    cached: Counter,
    cost: Counter,
    duration: Histogram,
}

impl ModelSeries {
    fn new(provider: &str, model: &str) -> Self {
        let (p, m) = (provider.to_owned(), model.to_owned());
        Self {
            ok: counter!(MODEL_CALLS, "provider" => p.clone(), "model" => m.clone(), "outcome" => "ok"),
            error: counter!(MODEL_CALLS, "provider" => p.clone(), "model" => m.clone(), "outcome" => "error"),
            input: counter!(MODEL_TOKENS, "provider" => p.clone(), "model" => m.clone(), "kind" => "input"),
            output: counter!(MODEL_TOKENS, "provider" => p.clone(), "model" => m.clone(), "kind" => "output"),
            cached: counter!(MODEL_TOKENS, "provider" => p.clone(), "model" => m.clone(), "kind" => "cached"),
            cost: counter!(MODEL_COST, "provider" => p.clone(), "model" => m.clone()),
            duration: histogram!(MODEL_DURATION, "provider" => p, "model" => m),
        }
    }
}

#[derive(Default)]
struct Models {
    /// provider -> model -> series.
    by: HashMap<String, HashMap<String, ModelSeries>>,
    pairs: usize,
    other: Option<ModelSeries>,
}

impl Models {
    fn series(&mut self, provider: &str, model: &str) -> &ModelSeries {
        let known = self.by.get(provider).is_some_and(|m| m.contains_key(model));
        if !known && self.pairs >= MAX_MODEL_SERIES {
            return self
                .other
                .get_or_insert_with(|| ModelSeries::new("other", "other"));
        }
        if !known {
            self.pairs += 1;
        }
        self.by
            .entry(provider.to_owned())
            .or_default()
            .entry(model.to_owned())
            .or_insert_with(|| ModelSeries::new(provider, model))
    }
}

static MODELS: LazyLock<Mutex<Models>> = LazyLock::new(|| {
    install();
    Mutex::default()
});

/// Millionths of a dollar, rounded; 0 for a cost that is not a positive number.
fn micro_usd(cost_usd: f64) -> u64 {
    let micro = (cost_usd * 1_000_000.0).round();
    if micro.is_finite() && micro > 0.0 {
        micro as u64
    } else {
        0
    }
}

/// One model call: `agentgw_model_calls_total{provider, model, outcome}`,
/// `agentgw_model_tokens_total{provider, model, kind}`,
/// `agentgw_model_cost_microusd_total{provider, model}` and
/// `agentgw_model_call_duration_seconds{provider, model}`.
#[allow(clippy::too_many_arguments)]
pub fn model_call(
    provider: &str,
    model: &str,
    ok: bool,
    input_tokens: u64,
    output_tokens: u64,
    cached_tokens: u64,
    cost_usd: f64,
    latency: std::time::Duration,
) {
    let mut models = MODELS.lock().unwrap_or_else(PoisonError::into_inner);
    let s = models.series(provider, model);
    if ok { &s.ok } else { &s.error }.increment(1);
    s.input.increment(input_tokens);
    s.output.increment(output_tokens);
    s.cached.increment(cached_tokens);
    s.cost.increment(micro_usd(cost_usd));
    s.duration.record(latency.as_secs_f64());
}

static TURN_COUNTS: ByName<Counter> = ByName::new();
static QUEUE_GAUGES: ByName<Gauge> = ByName::new();
static DROPPED: ByName<Counter> = ByName::new();

/// One agent turn ended: `agentgw_turns_total{finish_reason}`.
pub fn turn_finished(finish_reason: &'static str) {
    TURN_COUNTS.with(
        finish_reason,
        || counter!(TURNS, "finish_reason" => finish_reason),
        |c| c.increment(1),
    );
}

/// Items waiting in an internal queue now: `agentgw_queue_depth{queue}`.
pub fn set_queue_depth(queue: &'static str, depth: usize) {
    QUEUE_GAUGES.with(
        queue,
        || gauge!(QUEUE_DEPTH, "queue" => queue),
        |g| g.set(depth as f64),
    );
}

/// `rows` records of `kind` dropped: `agentgw_recorder_dropped_total{kind}`.
pub fn recorder_dropped(kind: &'static str, rows: u64) {
    DROPPED.with(
        kind,
        || counter!(RECORDER_DROPPED, "kind" => kind),
        |c| c.increment(rows),
    );
}

/// A model call waited for room in the writer's queue: `agentgw_recorder_backpressure_total`.
pub fn recorder_backpressure() {
    counter!(RECORDER_BACKPRESSURE).increment(1);
}

// ---------------------------------------------------------------------------------------
// Memory index entries per tenant

/// The memory state of every live server generation (one in a daemon; the test suite runs
/// many gateways in one process). Weak: a dropped generation leaves the gauge by itself.
static MEMORY_INDEXES: Mutex<Vec<Weak<dyn IndexSizes>>> = Mutex::new(Vec::new());

/// What the memory index gauge reads at a scrape: vectors held per tenant. The engine's memory
/// implements it (the metrics floor knows no engine).
pub trait IndexSizes: Send + Sync {
    /// Calls `each(tenant, entries)` for every tenant holding vectors.
    fn each_tenant(&self, each: &mut dyn FnMut(&str, usize));
}

/// Makes `memory`'s vector index part of `agentgw_memory_index_entries`.
pub fn watch_memory_index(memory: &Arc<dyn IndexSizes>) {
    let mut watched = MEMORY_INDEXES
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    watched.retain(|m| m.strong_count() > 0);
    watched.push(Arc::downgrade(memory));
}

/// Appends `agentgw_memory_index_entries{tenant}`: vectors held in the in-memory recall index
/// per tenant, read from the live indexes at the scrape (no work on the write path, and no
/// series left behind by a tenant that emptied). The label set is bounded: the largest
/// [`MAX_MEMORY_TENANT_SERIES`] tenants, then one `other` series summing the rest (a tenant
/// whose id is `other` shares that series).
fn memory_index_exposition(out: &mut String) {
    let live: Vec<Arc<dyn IndexSizes>> = {
        let mut watched = MEMORY_INDEXES
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        watched.retain(|m| m.strong_count() > 0);
        watched.iter().filter_map(Weak::upgrade).collect()
    };
    let mut by_tenant: HashMap<String, u64> = HashMap::new();
    for memory in &live {
        memory.each_tenant(&mut |tenant, entries| {
            *by_tenant.entry(tenant.to_owned()).or_default() += entries as u64;
        });
    }
    let (top, rest) = largest_tenants(by_tenant, MAX_MEMORY_TENANT_SERIES);
    let _ = writeln!(
        out,
        "# HELP {MEMORY_INDEX_ENTRIES} Vectors held in the in-memory recall index, by tenant (the {MAX_MEMORY_TENANT_SERIES} largest; the rest summed as tenant=\"other\")"
    );
    let _ = writeln!(out, "# TYPE {MEMORY_INDEX_ENTRIES} gauge");
    for (tenant, entries) in &top {
        let _ = writeln!(
            out,
            "{MEMORY_INDEX_ENTRIES}{{tenant=\"{}\"}} {entries}",
            label_value(tenant)
        );
    }
    if let Some(rest) = rest {
        let _ = writeln!(out, "{MEMORY_INDEX_ENTRIES}{{tenant=\"other\"}} {rest}");
    }
}

/// The `max` largest tenants, largest first (ties by name), and the sum of the others; the
/// sum is None when a tenant named `other` is among the largest, which then holds it.
fn largest_tenants(
    by_tenant: HashMap<String, u64>,
    max: usize,
) -> (Vec<(String, u64)>, Option<u64>) {
    let mut sizes: Vec<(String, u64)> = by_tenant.into_iter().collect();
    sizes.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let rest: u64 = sizes.iter().skip(max).map(|(_, n)| n).sum();
    sizes.truncate(max);
    match sizes.iter_mut().find(|(t, _)| t == "other") {
        Some((_, n)) => {
            *n += rest;
            (sizes, None)
        }
        None => (sizes, Some(rest)),
    }
}

/// A label value escaped as the text format wants (backslash, double quote, line feed).
fn label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::metrics::http_route;

    #[test]
    fn paths_map_to_templates_and_nothing_else() {
        let hooks = Some("/hooks");
        for (path, want) in [
            ("/health", "/health"),
            ("/v1/chat/completions", "/v1/chat/completions"),
            ("/v1/models/a", "/v1/models/{model}"),
            ("/v1/models/a/b", "/v1/models/{model}"),
            ("/v1/models/a/b/c", "other"),
            ("/v1/models/", "other"),
            ("/media/abc.png", "/media/{id}"),
            ("/media/abc.png/meta", "/media/{id}/meta"),
            ("/media/abc.png/x", "other"),
            ("/hooks/webhook", "{webhooks}/webhook"),
            ("/hooks/github", "{webhooks}/{mapping}"),
            ("/hooksx/github", "other"),
            ("/docs/rpc/session.html", "/docs/rpc/{page}"),
            ("/docs/rpc", "/docs/rpc/{page}"),
            ("/docs/index.html", "/docs/{file}"),
            ("/app/x.js", "/app/{file}"),
            ("/nope/abc123", "other"),
            ("/healthz", "other"),
            ("/api/agents/x", "other"),
            ("/metrics", "/metrics"),
            ("/", "/"),
        ] {
            assert_eq!(http_route(path, hooks).as_str(), want, "{path}");
        }
        assert_eq!(http_route("/hooks/github", None).as_str(), "other");
        // Every exact arm names a listed template.
        for r in ROUTES {
            if r.starts_with('/') && !r.contains('{') {
                assert_eq!(http_route(r, hooks).as_str(), *r);
            }
        }
    }

    #[test]
    fn code_labels_are_the_codes() {
        for (code, s) in RPC_CODES {
            assert_eq!(code.to_string(), *s);
        }
        for (code, s) in STATUSES {
            assert_eq!(code.to_string(), *s);
        }
        assert_eq!(RpcMethod::of("system.ping").as_str(), "system.ping");
        assert_eq!(RpcMethod::of("x.secretname").as_str(), "unknown");
        assert_eq!(micro_usd(0.0000015), 2);
        assert_eq!(micro_usd(f64::NAN), 0);
        assert_eq!(micro_usd(-1.0), 0);
    }

    #[test]
    fn model_pairs_are_capped() {
        let mut m = Models::default();
        for i in 0..(MAX_MODEL_SERIES + 10) {
            let _ = m.series("cap-test", &format!("m{i}"));
        }
        assert_eq!(m.pairs, MAX_MODEL_SERIES);
        assert!(m.other.is_some());
        let _ = m.series("cap-test", "m0");
        assert_eq!(m.pairs, MAX_MODEL_SERIES);
    }

    #[test]
    fn memory_tenant_series_are_capped_with_an_other_bucket() {
        let sizes: HashMap<String, u64> = (0..10u64).map(|i| (format!("t{i}"), i + 1)).collect();
        let (top, rest) = largest_tenants(sizes.clone(), 3);
        assert_eq!(
            top,
            vec![
                ("t9".to_owned(), 10),
                ("t8".to_owned(), 9),
                ("t7".to_owned(), 8)
            ]
        );
        assert_eq!(rest, Some((1..=7).sum()));
        // At the cap exactly, nobody is left over.
        let (top, rest) = largest_tenants(sizes.clone(), 10);
        assert_eq!((top.len(), rest), (10, Some(0)));
        // A tenant called "other" holds the rest itself: one series, never two.
        let mut with_other = sizes;
        with_other.insert("other".to_owned(), 100);
        let (top, rest) = largest_tenants(with_other, 2);
        assert_eq!(top[0], ("other".to_owned(), 100 + (1..=9).sum::<u64>()));
        assert_eq!(rest, None);
    }

    #[test]
    fn memory_index_gauge_reads_the_live_indexes() {
        let memory = crate::runtime::memory::MemoryState::new(
            crate::config::memory::MemoryConfig::default(),
        );
        let tenant = "gauge-unit-test-tenant \"q\"";
        if let Ok(mut ix) = memory.index.write() {
            assert!(ix.upsert(tenant, "a", 1, &[1.0, 0.0]));
            assert!(ix.upsert(tenant, "a", 2, &[0.0, 1.0]));
        }
        let line = "agentgw_memory_index_entries{tenant=\"gauge-unit-test-tenant \\\"q\\\"\"} 2";
        assert!(
            render().lines().any(|l| l == line),
            "{line} not in the exposition"
        );
        drop(memory);
        assert!(!render().contains("gauge-unit-test-tenant"));
        assert_eq!(label_value("a\\b\nc"), "a\\\\b\\nc");
    }
}
