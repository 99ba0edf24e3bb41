//! The server loop: one listening socket for the life of the process, server generations on
//! top of it (gateway.restart swaps the generation, never the port), our own accept loop (the
//! connection cap, the header deadline from the first byte on), and bounded shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use poem::web::{LocalAddr, RemoteAddr};
use poem::Endpoint;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::error::GatewayError;
use crate::app::state::AppState;
use crate::auth::{self, TokenStore};
use crate::config::{self, Loaded};
use crate::hub::ConnTicket;
use crate::runtime::control::Control;
use crate::runtime::engine::Engine;
use crate::store::Store;
use crate::transport::watch::Watched;

type HyperBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// A gateway running in this process.
pub struct Running {
    pub addr: SocketAddr,
    /// Shared by every generation: the push hub lives here.
    pub control: Arc<Control>,
    /// Cancel to shut down (what SIGINT/SIGTERM do).
    pub shutdown: CancellationToken,
    pub done: tokio::task::JoinHandle<Result<(), String>>,
}

/// Loads the configuration, binds, and serves in a background task.
pub async fn start(config_path: Option<PathBuf>) -> Result<Running, String> {
    let loaded = config::load(config_path.as_deref()).map_err(|e| e.to_string())?;
    let g = &loaded.config.gateway;
    let listener = TcpListener::bind((g.host.as_str(), g.port))
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", g.host, g.port))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let shutdown = CancellationToken::new();
    let control = Arc::new(Control::new());
    #[allow(
        clippy::disallowed_methods,
        reason = "the composition root owns the lifetimes of the server loop and each generation"
    )]
    let done = tokio::spawn(run(
        listener,
        config_path,
        loaded,
        shutdown.clone(),
        control.clone(),
    ));
    Ok(Running {
        addr,
        control,
        shutdown,
        done,
    })
}

/// How often API tokens' last-use times are written to the store.
const TOKEN_USE_FLUSH: Duration = Duration::from_secs(30);

enum Exit {
    Shutdown,
    Restart,
}

/// Builds a generation on this node's configuration file (`file`, as loaded): the store is
/// opened first, the configuration in force is settled with the fleet's stored document
/// (`config_writes::reconcile`), and the engine is opened on it.
async fn build_state(
    file: Loaded,
    settled: Option<crate::app::config_writes::Reconciled>,
    generation: u64,
    control: Arc<Control>,
) -> Result<AppState, String> {
    let text = |e: GatewayError| match e {
        GatewayError::Internal(m) => m,
        other => other.to_string(),
    };
    let data_dir = config::data_dir(&file.config);
    crate::store::files::secure_data_dir(&data_dir)?;
    let connected = Store::connect(&file.config.store, &data_dir)
        .await
        .map_err(text)?;
    // A restart settled it already, on the same database (the store is file-only).
    let settled = match settled {
        Some(s) => s,
        None => crate::app::config_writes::reconcile(&connected.0, file.clone()).await,
    };
    let loaded = settled.loaded;
    let mut tokens = loaded.config.gateway.tokens.clone();
    if tokens.is_empty() {
        tokens.push(
            auth::local_token(&data_dir)
                .map_err(|e| format!("cannot write the local token: {e}"))?,
        );
    }
    let engine = open_engine(
        connected,
        &loaded.config,
        &file.config,
        data_dir.clone(),
        control.clone(),
    )
    .await
    .map_err(text)?;
    let engine_tokens = engine.api_tokens.clone();
    let webhooks = crate::webhooks::Webhooks::new(&loaded.config.webhooks)
        .map_err(|e| e.to_string())?
        .map(Arc::new);
    let mut state = AppState::new(
        loaded.config,
        loaded.paths,
        data_dir,
        TokenStore::new(&tokens).with_api(engine_tokens),
        generation,
        control,
        Arc::new(engine),
    );
    state.webhooks = webhooks;
    state.file_document = settled.file_document;
    state.set_config_sha(settled.sha);
    crate::runtime::queue::resume_queued(
        state.webhooks.as_deref().map(|h| &h.queue),
        &state.engine.runs,
        state.engine.store.live_since(),
    )
    .await;
    crate::app::fleet::follow(&state.engine, state.webhooks.clone(), &state.config.store);
    crate::runtime::scheduler::timer::start(&state.engine.scheduler, state.stop.clone());
    crate::runtime::memory::worker::start(&state.engine.memory, state.stop.clone());
    #[allow(
        clippy::disallowed_methods,
        reason = "the composition root owns the lifetimes of the server loop and each generation"
    )]
    tokio::spawn(auth::flush_last_use(
        Arc::downgrade(&state.engine.api_tokens),
        TOKEN_USE_FLUSH,
        state.stop.clone(),
    ));
    Ok(state)
}

/// Opens the engine of a generation on a connected store (`Store::connect`): this node's
/// bookkeeping on the database (alive, fan-out, what the previous process left), then every
/// service the engine works with (secrets, API tokens, media and its sweeper, observability and
/// its sweeper, memory), handed to [`Engine::new`] with the configuration in force (`config`)
/// and this node's file (`file`).
pub async fn open_engine(
    connected: (Store, String),
    config: &crate::config::Config,
    file: &crate::config::Config,
    data_dir: PathBuf,
    control: Arc<Control>,
) -> Result<Engine, GatewayError> {
    let (store, key) = connected;
    let store = store.for_node(control.node_id.clone());
    let now = crate::clock::now_ms();
    if store.is_shared() {
        // Alive before anything it holds is written: other nodes' sweeps spare its runs.
        store.node_seen(now, control.started_at_ms).await?;
        if let crate::store::Pool::Postgres(pool) = store.pool() {
            control
                .fanout
                .get_or_init(|| crate::fanout::Fanout::start(&pool.connect_options(), &control));
        }
    }
    // Once per process and database: a restart's new generation must not orphan the runs
    // the previous generation of this process still runs (they are this node's). Queued
    // webhook runs are resumed instead (runtime::queue::resume_queued).
    if control.first_open_of(key) {
        let orphaned = store
            .runs_orphan_unresumable(now, store.live_since())
            .await?;
        if orphaned > 0 {
            tracing::warn!(
                orphaned,
                "runs left unfinished by the previous process are marked orphaned"
            );
        }
        let failed = store.graph_runs_orphan(now, store.live_since()).await?;
        if failed > 0 {
            tracing::warn!(
                failed,
                "graph runs left unfinished by the previous process are marked failed"
            );
        }
        let released = store
            .scheduler_release_dead(now, store.live_since())
            .await?;
        if released > 0 {
            tracing::warn!(
                released,
                "cron fires left unfinished by the previous process are recorded as errors"
            );
        }
    }
    let secrets =
        Arc::new(crate::secrets::Secrets::open(&config.secrets, store.clone(), &data_dir).await?);
    let api_tokens =
        Arc::new(crate::auth::ApiTokens::open(store.clone(), control.hub.clone()).await?);
    let m = &config.media;
    let media = crate::media::MediaStore::open(
        data_dir.join(crate::runtime::engine::MEDIA_DIR),
        (m.ttl_seconds > 0).then(|| std::time::Duration::from_secs(m.ttl_seconds)),
        m.max_file_bytes,
    )
    .await
    .map_err(|e| GatewayError::Internal(format!("cannot open the media store: {e}")))?;
    let media = Arc::new(media);
    crate::media::spawn_sweeper(
        Arc::downgrade(&media),
        store.clone(),
        std::time::Duration::from_secs(m.sweep_interval_seconds.max(1)),
    );
    let obs = crate::obs::ObsState::new(config.observability.clone());
    crate::obs::spawn_sweeper(Arc::downgrade(&obs), store.clone());
    let services = crate::runtime::engine::Services {
        store,
        secrets,
        api_tokens,
        media,
        obs,
        memory: crate::runtime::memory::MemoryState::new(config.memory.clone()),
    };
    Engine::new(services, config, file, data_dir, control).await
}

/// Opens the engine for `config` on its own store (tests and the fuzz harness): the file is
/// the configuration in force.
pub async fn open_engine_at(
    config: &crate::config::Config,
    data_dir: PathBuf,
    control: Arc<Control>,
) -> Result<Engine, GatewayError> {
    let connected = Store::connect(&config.store, &data_dir).await?;
    open_engine(connected, config, config, data_dir, control).await
}

/// Waits for `gateway.restart` requests until one yields a next generation that is ready to
/// serve: its configuration loads, passes [`check`] and is built (database opened, seeded).
/// Any failure is logged and the running generation keeps serving.
async fn next_generation(
    config_path: Option<&Path>,
    current: &Loaded,
    current_store: &Store,
    generation: u64,
    control: &Arc<Control>,
) -> (Loaded, AppState) {
    loop {
        control.restart_requested.notified().await;
        let refused = |e: String| {
            control
                .restarts_refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::error!(error = %e, generation, "restart refused: the configuration would not start; the running generation keeps serving");
        };
        let mut next = match config::load(config_path) {
            Ok(next) => next,
            Err(e) => {
                refused(e.to_string());
                continue;
            }
        };
        // Checked as it would run: the fleet's document on this file.
        let mut settled = crate::app::config_writes::reconcile(current_store, next.clone()).await;
        if let Err(e) = crate::app::check::check(&settled.loaded.config, Some(current_store)).await
        {
            refused(e);
            continue;
        }
        if next.config.store != current.config.store {
            tracing::warn!(
                "store changes take effect on the next process start; the running database is kept"
            );
            next.config.store = current.config.store.clone();
            settled.loaded.config.store = current.config.store.clone();
        }
        let (old, new) = (&current.config.gateway, &next.config.gateway);
        if (old.host.as_str(), old.port) != (new.host.as_str(), new.port) {
            tracing::warn!("host/port changes take effect on the next process start; the listening socket is kept");
        }
        match build_state(next.clone(), Some(settled), generation + 1, control.clone()).await {
            Ok(state) => return (next, state),
            Err(e) => refused(e),
        }
    }
}

/// Serves generations until shutdown. A restart builds the next generation while the current
/// one serves, and swaps only when it is ready; a configuration that would not start leaves
/// the current generation serving.
pub async fn run(
    listener: TcpListener,
    config_path: Option<PathBuf>,
    first: Loaded,
    shutdown: CancellationToken,
    control: Arc<Control>,
) -> Result<(), String> {
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let mut loaded = first;
    let mut generation = 1;
    if let Some(problem) = crate::providers::extra_roots_problem() {
        tracing::warn!(%problem, "HTTP providers cannot be used until the trusted roots file is fixed");
    }
    let mut state = Arc::new(build_state(loaded.clone(), None, generation, control.clone()).await?);
    crate::app::config_writes::follow(&state);
    loop {
        control.admission.configure(&state.config.gateway.limits);
        tracing::info!(%addr, generation, "agent-gateway listening");
        let serving = serve(&listener, state.clone(), &shutdown);
        tokio::pin!(serving);
        let next = tokio::select! {
            exit = &mut serving => match exit {
                Exit::Shutdown => None,
                // Nothing but this loop asks a generation to stop for a restart; should it
                // happen anyway, the same configuration is built again.
                Exit::Restart => Some(
                    build_state(loaded.clone(), None, generation + 1, control.clone())
                        .await
                        .map(|s| (loaded.clone(), s))?,
                ),
            },
            (next, next_state) = next_generation(config_path.as_deref(), &loaded, &state.engine.store, generation, &control) => {
                // The next generation is ready: only now is this one stopped.
                control.restart.notify_one();
                if let Exit::Shutdown = serving.await {
                    tracing::info!("shutdown requested during a restart");
                    leave(&state).await;
                    return Ok(());
                }
                Some((next, next_state))
            }
        };
        // Usage rows are written behind the requests: commit the last ones.
        flush_usage(&state).await;
        match next {
            None => {
                leave(&state).await;
                tracing::info!("agent-gateway stopped");
                return Ok(());
            }
            Some((next, next_state)) => {
                loaded = next;
                generation += 1;
                state = Arc::new(next_state);
                crate::app::config_writes::follow(&state);
                tracing::info!(generation, "restarted in-process");
            }
        }
    }
}

async fn flush_usage(state: &AppState) {
    if let Err(e) = state.engine.store.usage_flush().await {
        tracing::warn!(error = %e, "usage rows not flushed");
    }
}

/// The process stops: after the last usage rows, this node leaves the fleet (other nodes may
/// take over its queued runs at once instead of after `store.nodeDeadAfterMs`).
async fn leave(state: &AppState) {
    flush_usage(state).await;
    if state.engine.store.is_shared() {
        if let Err(e) = state.engine.store.node_leave().await {
            tracing::warn!(error = %e, "node not removed from the fleet; it times out instead");
        }
    }
}

/// Connections refused over `gateway.maxConnections` whose close may linger (their unread
/// request is drained for a moment, so the 503 is not lost to a reset); past this many the
/// refused connection is closed at once.
const LINGERING_REFUSALS: usize = 64;
/// How long a refused connection lingers at most.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// After the grace period, how long the dropped connections get to notice.
const KILL_WAIT: Duration = Duration::from_millis(500);

/// The answer to a connection over the cap, written before any byte of it is read.
const REFUSAL: &str = concat!(
    "HTTP/1.1 503 Service Unavailable\r\n",
    "Content-Type: application/json\r\n",
    "Content-Length: 37\r\n",
    "Retry-After: 5\r\n",
    "Connection: close\r\n",
    "\r\n",
    "{\"error\":\"Too many open connections\"}",
);

async fn serve(listener: &TcpListener, state: Arc<AppState>, shutdown: &CancellationToken) -> Exit {
    let ep = Arc::new(crate::http::app(state.clone()));
    let tracker = TaskTracker::new();
    let conn_stop = CancellationToken::new();
    // Cancelled when the grace period is over: every connection still open is dropped.
    let kill = CancellationToken::new();
    let g = &state.config.gateway;
    let slots = Arc::new(Semaphore::new(
        g.max_connections.min(Semaphore::MAX_PERMITS),
    ));
    let lingering = Arc::new(Semaphore::new(LINGERING_REFUSALS));
    let mut http1 = http1::Builder::new();
    // HTTP/1.1 only (README, decisions): the deadline runs from the connection's start, so a
    // client that sends nothing is closed too, and between keep-alive requests.
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(g.header_read_timeout_ms));
    if g.ws_heartbeat_ms > 0 {
        tracker.spawn(heartbeats(
            state.control.clone(),
            Duration::from_millis(g.ws_heartbeat_ms),
            state.stop.clone(),
        ));
    }
    // The capability socket lives as long as the generation serves; the tracker's wait below
    // lets it remove its file before the next generation binds its own.
    tracker.spawn(crate::rpc::capability::serve(
        state.clone(),
        state.stop.clone(),
    ));
    let serving = Arc::new(Serving {
        ep,
        http1,
        local: listener.local_addr().ok(),
        stop: conn_stop.clone(),
        header_deadline: Duration::from_millis(g.header_read_timeout_ms),
    });
    let mut refusing = false;
    let exit = loop {
        tokio::select! {
            _ = shutdown.cancelled() => break Exit::Shutdown,
            _ = state.control.restart.notified() => break Exit::Restart,
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        refusing = false;
                        let _ = stream.set_nodelay(true);
                        let ticket = ConnTicket {
                            slot: Arc::new(slot),
                            tracker: tracker.clone(),
                            kill: kill.clone(),
                        };
                        tracker.spawn(connection(stream, remote, serving.clone(), ticket));
                    }
                    Err(_) => {
                        if !refusing {
                            refusing = true;
                            tracing::warn!(max = g.max_connections, "gateway.maxConnections reached: refusing connections with 503");
                        }
                        refuse(stream, &lingering, &tracker);
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    };
    // WebSockets close with 1001; idle HTTP connections close; requests in flight finish.
    state.stop.cancel();
    conn_stop.cancel();
    tracker.close();
    let grace = Duration::from_millis(g.shutdown_grace_ms);
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::warn!(
            open = tracker.len(),
            websockets = state.hub().count(),
            "grace period over: dropping the connections still open"
        );
        kill.cancel();
        let _ = tokio::time::timeout(KILL_WAIT, tracker.wait()).await;
    }
    exit
}

/// One `heartbeat` to every WebSocket per period, from one task for the whole generation.
async fn heartbeats(control: Arc<Control>, every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {
                control.hub.heartbeat();
            }
        }
    }
}

/// Answers a connection over the cap with [`REFUSAL`] and closes it. The socket is new, so
/// the short answer fits its send buffer: no waiting in the accept loop.
fn refuse(stream: TcpStream, lingering: &Arc<Semaphore>, tracker: &TaskTracker) {
    let _ = stream.try_write(REFUSAL.as_bytes());
    let Ok(permit) = lingering.clone().try_acquire_owned() else {
        return;
    };
    tracker.spawn(async move {
        let mut stream = stream;
        let _ = tokio::time::timeout(REFUSAL_LINGER, async {
            let _ = stream.shutdown().await;
            let mut sink = [0u8; 1024];
            while let Ok(n) = stream.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
        drop(permit);
    });
}

/// What every connection of one generation shares.
struct Serving<E> {
    ep: Arc<E>,
    http1: http1::Builder,
    local: Option<SocketAddr>,
    /// Cancelled when the generation stops: idle connections close, requests in flight finish.
    stop: CancellationToken,
    /// `gateway.headerReadTimeoutMs`.
    header_deadline: Duration,
}

async fn connection<E: Endpoint<Output = poem::Response> + 'static>(
    stream: TcpStream,
    remote: SocketAddr,
    serving: Arc<Serving<E>>,
    ticket: ConnTicket,
) {
    let kill = ticket.kill.clone();
    let (local, stop, header_deadline) = (serving.local, &serving.stop, serving.header_deadline);
    let ep = serving.ep.clone();
    // Set when the first request's head has been read (the service is called).
    let served = Arc::new(AtomicBool::new(false));
    let seen = served.clone();
    let service = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
        seen.store(true, Ordering::Relaxed);
        let ep = ep.clone();
        // Only an upgrade needs the ticket: it carries the slot past this connection's end.
        if req.uri().path() == "/ws" {
            req.extensions_mut().insert(ticket.clone());
        }
        async move {
            let local = LocalAddr(
                local
                    .map(poem::Addr::SocketAddr)
                    .unwrap_or(poem::Addr::Custom("unknown", "".into())),
            );
            let req = poem::Request::from((
                req,
                local,
                RemoteAddr(poem::Addr::SocketAddr(remote)),
                http::uri::Scheme::HTTP,
            ));
            let resp = ep.get_response(req).await;
            Ok::<_, Infallible>(hyper::Response::<HyperBody>::from(resp))
        }
    });
    let conn = serving
        .http1
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    // The stop flag is read at each wake-up rather than its future polled (`Watched`).
    let mut stopped = Watched::new(stop);
    if drive_until(conn.as_mut(), |cx| stopped.fired(cx)).await {
        return;
    }
    // A connection accepted just before the stop (a restart, most often) may not have sent
    // its request yet; a graceful shutdown now would close it unanswered. It gets until its
    // first request's head is read (bounded by the header deadline, then by `kill`), and that
    // request is answered before the connection closes.
    if !served.load(Ordering::Relaxed) {
        let first = drive_until(conn.as_mut(), |_| served.load(Ordering::Relaxed));
        let ended = tokio::select! {
            _ = kill.cancelled() => return,
            ended = tokio::time::timeout(header_deadline, first) => ended.unwrap_or(false),
        };
        if ended {
            return;
        }
    }
    // `kill` fires only after `stop`, when the grace period is over.
    conn.as_mut().graceful_shutdown();
    tokio::select! {
        _ = kill.cancelled() => {}
        _ = conn => {}
    }
}

/// Drives `conn` until it ends (true) or `until` says to stop (false). `until` is asked after
/// each poll of `conn` that did not end it, with the task's context, so it can register to be
/// woken (the stop signal, [`Watched`]) or read what the poll just changed (a flag the service
/// sets).
async fn drive_until<F: Future>(
    mut conn: Pin<&mut F>,
    mut until: impl FnMut(&mut Context<'_>) -> bool,
) -> bool {
    std::future::poll_fn(|cx| {
        if conn.as_mut().poll(cx).is_ready() {
            Poll::Ready(true)
        } else if until(cx) {
            Poll::Ready(false)
        } else {
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[test]
    fn the_refusal_is_a_whole_http_answer_with_a_json_body() {
        let (head, body) = super::REFUSAL.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(length, body.len());
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v, serde_json::json!({"error": "Too many open connections"}));
    }
}
