//! Running agent turns for the HTTP surfaces: which agent and model a request's `model`
//! names, and a streaming turn whose deltas are read as they come while the turn runs in
//! its own task. Dropping a streaming turn (the client went away) cancels it.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::stream::{self, BoxStream, StreamExt};
use futures_util::FutureExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::api::error::GatewayError;
use crate::api::generated::types::FinishReason;
use crate::providers::models;
use crate::runtime::agents::Agent;
use crate::runtime::engine::Engine;
use crate::runtime::turn::{TurnOutcome, TurnRequest};
use crate::transport::problem::Problem;
use http::StatusCode;

/// What a request's `model` resolves to.
pub struct Target {
    pub agent: Arc<Agent>,
    /// A catalogue model to run on (None: the agent's own model, prompt and tools). A model
    /// target is a plain completion: the default agent's accounting, no tools.
    pub model: Option<String>,
}

/// `model` as `<provider>/<model>`, an alias, a bare model id (the default agent runs on it),
/// or an agent id. None when nothing matches or no agent can run it.
pub fn resolve_target(engine: &Engine, name: &str) -> Option<Target> {
    let snap = engine.providers.snapshot();
    if let Some(m) = models::resolve(&snap.models, name) {
        let agent = engine
            .agents
            .default_id()
            .and_then(|id| engine.agents.require(&id).ok())?;
        return Some(Target {
            agent,
            model: Some(m.id()),
        });
    }
    let agent = engine.agents.require(name).ok()?;
    Some(Target { agent, model: None })
}

/// The `finish_reason` a `/v1` client sees (the spec's mapping).
pub fn openai_finish(f: FinishReason) -> &'static str {
    match f {
        FinishReason::MaxSteps => "length",
        _ => "stop",
    }
}

/// Turns what a streaming turn yields into response bytes (one SSE dialect per surface).
pub trait Render: Send + 'static {
    fn delta(&mut self, text: String) -> Bytes;
    /// The last frames; the stream ends after them.
    fn done(&mut self, result: Result<TurnOutcome, GatewayError>) -> Bytes;
}

/// Runs a turn to its end; the turn is cancelled if the caller goes away first (the
/// request future is dropped). A turn a model failure ended is an error status (502, or 503
/// when nothing could serve it), never an answer that looks like one.
pub async fn run_to_end(engine: &Engine, mut req: TurnRequest) -> Result<TurnOutcome, Problem> {
    let cancel = CancellationToken::new();
    req.cancel = cancel.clone();
    let _cancel_on_drop = cancel.drop_guard();
    let outcome = engine.turns.run_turn(req).await?;
    match failure_problem(&outcome) {
        Some(p) => Err(p),
        None => Ok(outcome),
    }
}

/// The error status of a turn a model failure ended: 503 when no provider could serve it,
/// 502 when the upstream failed. The message is the turn's generic one (kind and status).
pub fn failure_problem(outcome: &TurnOutcome) -> Option<Problem> {
    let failure = outcome.failure?;
    let status = if failure.unavailable() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::BAD_GATEWAY
    };
    Some(Problem::new(status, outcome.response.clone()))
}

/// What a streaming turn yields next.
pub enum Step {
    Delta(String),
    Done(Result<TurnOutcome, GatewayError>),
}

/// A turn running in its own task, its text deltas readable as they arrive.
pub struct StreamingTurn {
    rx: mpsc::UnboundedReceiver<String>,
    done: Option<JoinHandle<Result<TurnOutcome, GatewayError>>>,
    _cancel_on_drop: DropGuard,
    /// The caller's registration when its token can be revoked: the stream ends when it is.
    watch: Option<crate::hub::StreamWatch>,
}

impl StreamingTurn {
    fn start(engine: Arc<Engine>, mut req: TurnRequest) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let watch = engine.api_tokens.watch(&req.caller);
        req.sink = Some(tx.into());
        req.cancel = cancel.clone();
        #[allow(
            clippy::disallowed_methods,
            reason = "the streamed turn ends with its turn; the response holds its handle"
        )]
        let done = tokio::spawn(async move { engine.turns.run_turn(req).await });
        Self {
            rx,
            done: Some(done),
            _cancel_on_drop: cancel.drop_guard(),
            watch,
        }
    }

    /// Starts the turn and waits for its first sign of life, so that a turn that cannot
    /// start (unknown provider, suspended agent) or whose model failed before the first
    /// delta is an error status and not a stream that looks like an answer.
    pub async fn begin(engine: Arc<Engine>, req: TurnRequest) -> Result<Started, Problem> {
        let mut turn = Self::start(engine, req);
        match turn.next().await {
            Some(Step::Done(Err(e))) => Err(e.into()),
            Some(Step::Done(Ok(outcome))) => match failure_problem(&outcome) {
                Some(p) => Err(p),
                None => Ok(Started {
                    turn,
                    first: Some(Step::Done(Ok(outcome))),
                }),
            },
            first => Ok(Started { turn, first }),
        }
    }

    /// The next delta, or the outcome once every delta has been read.
    pub async fn next(&mut self) -> Option<Step> {
        if let Some(delta) = self.rx.recv().await {
            return Some(Step::Delta(delta));
        }
        let handle = self.done.take()?;
        Some(Step::Done(Self::joined(handle.await)))
    }

    /// The next step if it is ready now: a delta already sent, or the outcome of a turn that
    /// has finished and sent every delta. None when the turn is still working.
    fn ready(&mut self) -> Option<Step> {
        match self.rx.try_recv() {
            Ok(delta) => Some(Step::Delta(delta)),
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => {
                let handle = self.done.as_mut()?;
                let joined = handle.now_or_never()?;
                self.done = None;
                Some(Step::Done(Self::joined(joined)))
            }
        }
    }

    fn joined(
        joined: Result<Result<TurnOutcome, GatewayError>, tokio::task::JoinError>,
    ) -> Result<TurnOutcome, GatewayError> {
        joined.unwrap_or_else(|e| Err(GatewayError::Internal(format!("turn task failed: {e}"))))
    }
}

/// A streaming turn that has shown a first sign of life.
pub struct Started {
    turn: StreamingTurn,
    first: Option<Step>,
}

impl Started {
    /// The response body: `opening` (the surface's first events), then `render` applied to
    /// every delta and to the outcome. What is ready when the body is polled goes out as one
    /// write (the opening with the first delta, and every delta the turn has sent since the
    /// last write, with the closing frames when the turn has ended): a frame of the body
    /// costs the server a chunk and a wake-up, whatever its size. Dropping the stream (the
    /// client went away, or its token was revoked) cancels the turn.
    pub fn frames<R: Render>(
        mut self,
        opening: Option<Bytes>,
        render: R,
    ) -> BoxStream<'static, Bytes> {
        let watch = self.turn.watch.take();
        let frames = stream::unfold(
            (self.turn, self.first, opening, render, false),
            |(mut turn, pending, mut opening, mut render, finished)| async move {
                if finished {
                    return None;
                }
                let mut step = match pending {
                    Some(s) => s,
                    None => turn.next().await?,
                };
                let mut out = Batch::default();
                if let Some(o) = opening.take() {
                    out.push(o);
                }
                let ended = loop {
                    match step {
                        Step::Delta(text) => out.push(render.delta(text)),
                        Step::Done(result) => {
                            out.push(render.done(result));
                            break true;
                        }
                    }
                    match turn.ready() {
                        Some(next) => step = next,
                        None => break false,
                    }
                };
                Some((out.finish(), (turn, None, None, render, ended)))
            },
        )
        .boxed();
        crate::http::sse::until_revoked(frames, watch)
    }
}

/// The frames of one write: one frame as it is, several copied into one buffer.
#[derive(Default)]
enum Batch {
    #[default]
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Batch {
    fn push(&mut self, frame: Bytes) {
        *self = match std::mem::take(self) {
            Self::Empty => Self::One(frame),
            Self::One(first) => {
                let mut buf = BytesMut::with_capacity((first.len() + frame.len()) * 4);
                buf.extend_from_slice(&first);
                buf.extend_from_slice(&frame);
                Self::Many(buf)
            }
            Self::Many(mut buf) => {
                buf.extend_from_slice(&frame);
                Self::Many(buf)
            }
        };
    }

    fn finish(self) -> Bytes {
        match self {
            Self::Empty => Bytes::new(),
            Self::One(frame) => frame,
            Self::Many(buf) => buf.freeze(),
        }
    }
}
