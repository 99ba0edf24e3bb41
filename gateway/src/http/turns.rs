//! Running agent turns for the HTTP surfaces: which agent and model a request's `model`
//! names, and a streaming turn whose deltas are read as they come while the turn runs in
//! its own task. Dropping a streaming turn (the client went away) cancels it.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::error::GatewayError;
use crate::rpc::generated::types::FinishReason;
use crate::runtime::agents::Agent;
use crate::runtime::catalog;
use crate::runtime::engine::Engine;
use crate::runtime::turn::{TurnOutcome, TurnRequest};

/// What a request's `model` resolves to.
pub struct Target {
    pub agent: Arc<Agent>,
    /// A catalogue model to run the agent on (None: the agent's own).
    pub model: Option<String>,
}

/// `model` as `<provider>/<model>`, an alias, a bare model id (the default agent runs on it),
/// or an agent id. None when nothing matches or no agent can run it.
pub fn resolve_target(engine: &Engine, name: &str) -> Option<Target> {
    let snap = engine.providers.snapshot();
    if let Some(m) = catalog::resolve(&snap.models, name) {
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
}

impl StreamingTurn {
    pub fn start(engine: Arc<Engine>, mut req: TurnRequest) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        req.sink = Some(tx);
        req.cancel = cancel.clone();
        let done = tokio::spawn(async move { engine.run_turn(req).await });
        Self {
            rx,
            done: Some(done),
            _cancel_on_drop: cancel.drop_guard(),
        }
    }

    /// The next delta, or the outcome once every delta has been read.
    pub async fn next(&mut self) -> Option<Step> {
        if let Some(delta) = self.rx.recv().await {
            return Some(Step::Delta(delta));
        }
        let handle = self.done.take()?;
        Some(Step::Done(handle.await.unwrap_or_else(|e| {
            Err(GatewayError::Internal(format!("turn task failed: {e}")))
        })))
    }
}
