//! The agent turn: system prompt (with the conversation's summaries) + the messages no summary
//! covers, trimmed to the window + the user's message -> model -> tool calls -> results -> ...
//! until a final answer, a step or budget limit, the tool circuit breaker, a repeated tool
//! call, or a provider failure. Usage is recorded per model call; the transcript is written in
//! one transaction before the answer is returned.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::api::error::GatewayError;
use crate::api::generated::methods::RecordKind;
use crate::api::generated::types::{
    AgentTurnResult, FinishReason, ObsContextBudget, ObsContextBudgetVerdict, TokensUsed,
    TurnErrorKind,
};
use crate::api::principal::Principal;
use crate::api::scopes::Scopes;
use crate::api::tenancy::{Lookup, Owners, Tenant};
use crate::api::CallContext;
use crate::obs::recorder::{prompt_report, PromptParts, TurnEnd, TurnTrace};
use crate::providers::models::ModelInfo;
use crate::providers::{ChatMessage, ChatRequest, DeltaSink, ErrorKind, ToolSpec, Usage};
use crate::runtime::agents::Agent;
use crate::runtime::agents::Agents;
use crate::runtime::approvals::{Ask, Decision};
use crate::runtime::calls::{CallFor, Called, ModelCalls};
use crate::runtime::context_tree::{compose_system, TurnContext, TurnSide};
use crate::runtime::control::Control;
use crate::runtime::memory::Memory;
use crate::runtime::sessions::{self, SessionIdent};
use crate::runtime::tools::ToolContext;
use crate::runtime::tools::Tools;
use crate::runtime::tree::{Gate, Stop};
use crate::store::sessions::{NewSession, TurnTotals};
use crate::store::Store;

/// One turn to run.
pub struct TurnRequest {
    pub agent: Arc<Agent>,
    /// The stored conversation; None runs an ephemeral turn (no history, nothing stored).
    pub session: Option<SessionIdent>,
    pub message: String,
    /// Scopes the turn's tools may require (the caller's, possibly narrowed).
    pub scopes: Scopes,
    /// Who asks: its tenant is whose records the turn's tools reach (admin: every tenant), its
    /// client id owns what an ephemeral turn's tools store, and its turns count against
    /// `gateway.limits.maxConcurrentTurnsPerClient`.
    pub caller: Principal,
    /// Receives text deltas as they are produced.
    pub sink: Option<DeltaSink>,
    /// Cancelled when the caller goes away.
    pub cancel: CancellationToken,
    pub max_steps: Option<u32>,
    /// Overrides the agent's primary model (`<provider>/<modelId>`).
    pub model: Option<String>,
    /// Narrows the agent's tools to these names.
    pub only_tools: Option<BTreeSet<String>>,
    /// Replaces the agent's system prompt (the /v1 routes pass the request's system messages).
    pub system: Option<String>,
    /// Sampling settings passed to the model.
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    /// The session key recorded with usage when the turn is ephemeral (e.g. a /v1 completion).
    pub usage_label: Option<String>,
    /// Already admitted (a background run holds its permit from `start_run` on).
    pub admitted: Option<crate::runtime::admission::Permit>,
    /// The run this turn is (a background run): its lease is checked before every tool call
    /// (the gate decision) and its steering messages join at each step boundary.
    pub run: Option<Arc<crate::runtime::tree::LiveRun>>,
}

impl TurnRequest {
    /// A turn of `agent` on `message` for `caller` with every option at its default:
    /// ephemeral, no streaming, the agent's own model, prompt and tools, the caller's scopes.
    pub fn new(agent: Arc<Agent>, message: String, caller: &CallContext) -> Self {
        Self {
            agent,
            session: None,
            message,
            scopes: caller.scopes,
            caller: caller.principal.clone(),
            sink: None,
            cancel: CancellationToken::new(),
            max_steps: None,
            model: None,
            only_tools: None,
            system: None,
            max_tokens: None,
            temperature: None,
            usage_label: None,
            admitted: None,
            run: None,
        }
    }
}

/// What a turn produced.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    pub response: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub finish: FinishReason,
    pub cost_usd: f64,
    pub steps: u32,
    /// The model that produced the last answer.
    pub model: String,
    /// Why the turn ended with `finishReason: error`, when a model call failed.
    pub failure: Option<TurnFailure>,
    /// Tool calls the model asked for in this turn (a cron fire's `toolCalls`).
    pub tool_calls: u32,
    /// The turn's id in the session index (`obs.trace.search`, `obs.explain`).
    pub trace_id: String,
}

/// A model call that ended a turn: its kind and the upstream's HTTP status, which are all a
/// caller is told (the upstream's own words go to the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnFailure {
    pub kind: ErrorKind,
    pub status: Option<u16>,
    /// Whether text of the failed step had already been streamed to the caller.
    pub after_output: bool,
}

impl TurnFailure {
    /// Nothing could serve the call (no usable provider, no key, disabled, not loaded), as
    /// opposed to an upstream that answered with a failure.
    pub fn unavailable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Unavailable | ErrorKind::MissingKey | ErrorKind::NotFound
        ) && self.status.is_none()
    }
}

impl TurnOutcome {
    pub fn tokens(&self) -> TokensUsed {
        TokensUsed {
            input: self.input_tokens as i64,
            output: self.output_tokens as i64,
            total: (self.input_tokens + self.output_tokens) as i64,
        }
    }

    pub fn result(&self) -> AgentTurnResult {
        AgentTurnResult {
            response: self.response.clone(),
            tokens_used: self.tokens(),
            finish_reason: self.finish,
            error_kind: self.failure.map(|f| turn_error_kind(f.kind)),
            trace_id: Some(self.trace_id.clone()),
        }
    }
}

/// Key order does not make two tool calls different.
/// JSON with every object's keys sorted: equal for equal values whatever their key order.
pub(crate) fn canonical_json(v: &Value) -> String {
    fn sort(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                Value::Object(keys.into_iter().map(|k| (k.clone(), sort(&m[k]))).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(v).to_string()
}

/// The payloads of the events every turn publishes (typed: no JSON tree; the bus writes
/// them out only when somebody reads them).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageReceived {
    agent_id: String,
    session_key: Option<String>,
    streaming: bool,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageSent {
    agent_id: String,
    session_key: Option<String>,
    finish_reason: &'static str,
    model: String,
    steps: u32,
    tokens_used: Tokens,
}

#[derive(serde::Serialize)]
struct Tokens {
    input: u64,
    output: u64,
    total: u64,
}

/// Who a turn serves and with which models, settled at its start.
struct Opening {
    /// The turn's admission slot when the turn took one itself (a background run holds its
    /// own in the request): parked while the turn waits for an approval.
    permit: Option<crate::runtime::admission::Permit>,
    agent: Arc<Agent>,
    session_key: Option<String>,
    /// The turn's events belong to the session's owner (an ephemeral turn's to its caller).
    owner: Arc<str>,
    /// The primary model, then the agent's fallbacks.
    chain: Vec<String>,
    /// The primary model: its window sizes the context.
    context_model: ModelInfo,
}

/// The prompt and transcript a turn's first step sends.
struct Assembled {
    agent_prompt: String,
    summary: Option<String>,
    /// The system prompt as sent (the agent's prompt with the conversation summary).
    system: String,
    /// The kept history, then the user's message.
    messages: Vec<ChatMessage>,
    /// Index of the user's message: what this turn adds starts here.
    first_new: usize,
    /// Whether this turn created its session.
    created: bool,
}

/// What the step loop produced besides the outcome: the transcript with this turn's messages
/// and which of them carry a model call's usage.
struct Stepped {
    out: TurnOutcome,
    messages: Vec<ChatMessage>,
    step_usage: Vec<(usize, String, Usage)>,
}

/// Runs agent turns, and grows and compacts the conversations they continue (the summary
/// tree: `context_tree.rs`, `compact.rs`). It holds exactly what a turn touches.
pub struct Turns {
    pub(super) store: Store,
    pub(super) providers: Arc<crate::providers::registry::Providers>,
    pub(super) agents: Arc<Agents>,
    pub(super) tools: Tools,
    /// One turn at a time per stored session (compaction takes the same lock).
    pub(super) locks: sessions::SessionLocks,
    pub(super) media: Arc<crate::media::MediaStore>,
    /// Where each agent's last context budget is kept.
    pub(super) obs: Arc<crate::obs::ObsState>,
    /// Turn admission and the event bus.
    pub(super) control: Arc<Control>,
    pub(super) calls: ModelCalls,
    /// For the memory tools.
    pub(super) memory: Arc<Memory>,
    /// Background runs, for the sub-agent tools (set once the runs service exists; weak,
    /// since the runs service holds the turns).
    runs: std::sync::OnceLock<std::sync::Weak<crate::runtime::runs::Runs>>,
    /// Tool calls the operator decides (`autonomy.approvals`).
    approvals: Arc<crate::runtime::approvals::Approvals>,
}

impl Turns {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        providers: Arc<crate::providers::registry::Providers>,
        agents: Arc<Agents>,
        media: Arc<crate::media::MediaStore>,
        obs: Arc<crate::obs::ObsState>,
        control: Arc<Control>,
        calls: ModelCalls,
        memory: Arc<Memory>,
        approvals: Arc<crate::runtime::approvals::Approvals>,
    ) -> Self {
        Self {
            store,
            providers,
            agents,
            tools: Tools::builtin(),
            locks: sessions::SessionLocks::default(),
            media,
            obs,
            control,
            calls,
            memory,
            runs: std::sync::OnceLock::new(),
            approvals,
        }
    }

    /// Gives the sub-agent tools the runs service.
    pub fn attach_runs(&self, runs: &Arc<crate::runtime::runs::Runs>) {
        let _ = self.runs.set(Arc::downgrade(runs));
    }

    /// The lock a stored session's turns hold: resetting or deleting the session takes it
    /// too, so that no turn writes into a session being cleared.
    pub fn session_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.lock_for(key)
    }

    /// The built-in tools turns offer.
    pub fn tools(&self) -> &Tools {
        &self.tools
    }

    /// Runs one turn. Errors are for turns that could not start (suspended agent, no usable
    /// provider); a provider failure during the turn ends it with finishReason error.
    ///
    /// The steps, in order: admit, open (models and the `message:received` event), open or
    /// continue the session, assemble the context, plan the tools, the step loop, persist,
    /// announce.
    pub async fn run_turn(&self, req: TurnRequest) -> Result<TurnOutcome, GatewayError> {
        let permit = self.control.admission.admit_turn(&req)?;
        let mut trace = TurnTrace::start();
        let _guard = self.admit(&req).await?;
        let mut opening = self.open_turn(&req)?;
        opening.permit = permit;
        let user = ChatMessage::user(req.message.clone());
        let user_tokens = sessions::message_tokens(&user);
        let reserve = opening
            .context_model
            .max_output_tokens
            .unwrap_or(1024)
            .min(opening.context_model.context_window / 4);
        let agent_prompt = req
            .system
            .clone()
            .or_else(|| opening.agent.config.system_prompt.clone())
            .unwrap_or_default();
        let (context, created) = self
            .open_session(&req, &opening, &agent_prompt, user_tokens, reserve)
            .await?;
        let mut assembled = assemble_context(
            &opening,
            agent_prompt,
            context,
            created,
            user,
            user_tokens,
            reserve,
            &mut trace,
        );
        let tools = self.plan_tools(&req, &opening.agent);
        let messages = std::mem::take(&mut assembled.messages);
        let stepped = self
            .step_loop(
                &req,
                &opening,
                &assembled.system,
                messages,
                &tools,
                &mut trace,
            )
            .await?;
        let first_seq = self.persist(&req, &assembled, &stepped).await?;
        Ok(self.announce(
            &req, &opening, &assembled, &tools, stepped, first_seq, trace,
        ))
    }

    /// Admit: a suspended agent does not run; a stored session runs one turn at a time (the
    /// returned guard holds its lock).
    async fn admit(
        &self,
        req: &TurnRequest,
    ) -> Result<Option<tokio::sync::OwnedMutexGuard<()>>, GatewayError> {
        if req.agent.suspended {
            return Err(GatewayError::Conflict(format!(
                "Agent {} is suspended; agents.resume lets it run again",
                req.agent.id
            )));
        }
        Ok(match &req.session {
            Some(s) => Some(self.locks.lock_for(&s.key).lock_owned().await),
            None => None,
        })
    }

    /// Open: whom the turn's events belong to (announced as `message:received`), and the
    /// model chain (the primary model must be in the catalogue).
    fn open_turn(&self, req: &TurnRequest) -> Result<Opening, GatewayError> {
        let agent = req.agent.clone();
        let session_key = req.session.as_ref().map(|s| s.key.clone());
        let owner: Arc<str> = Arc::from(
            req.session
                .as_ref()
                .map_or(req.caller.client_id.as_str(), |s| s.tenant_id.as_str()),
        );
        self.control.events.publish_to(
            &owner,
            "message:received",
            MessageReceived {
                agent_id: agent.id.clone(),
                session_key: session_key.clone(),
                streaming: req.sink.is_some(),
            },
        );
        let snap = self.providers.snapshot();
        let primary = req
            .model
            .clone()
            .unwrap_or_else(|| agent.model().to_owned());
        let mut chain = vec![primary.clone()];
        chain.extend(agent.config.fallback_models.iter().flatten().cloned());
        let context_model = snap
            .model(&primary)
            .cloned()
            .ok_or_else(|| GatewayError::Unavailable(format!("Model not found: {primary}")))?;
        Ok(Opening {
            permit: None,
            agent,
            session_key,
            owner,
            chain,
            context_model,
        })
    }

    /// Open or continue the session: a stored session's summary tree and the messages it does
    /// not cover, or a new session row (created before the first step, since tools write rows
    /// that reference it). Returns the context and whether the session was created.
    async fn open_session(
        &self,
        req: &TurnRequest,
        opening: &Opening,
        agent_prompt: &str,
        user_tokens: u64,
        reserve: u64,
    ) -> Result<(TurnContext, bool), GatewayError> {
        let Some(s) = &req.session else {
            return Ok((TurnContext::default(), false));
        };
        // The key was authorized for its owner; a row stored under it for another owner
        // (written before ownership rules existed) is never continued.
        let reach = Tenant::owner(&s.tenant_id);
        let exists = match self
            .store
            .lookup(RecordKind::Session, &s.key, &reach)
            .await?
        {
            Lookup::Exists(owner) if owner.as_deref() == Some(s.tenant_id.as_str()) => true,
            Lookup::Exists(_) => {
                return Err(GatewayError::record_not_found(RecordKind::Session, &s.key))
            }
            Lookup::Missing { .. } => false,
        };
        if exists {
            // The summary tree and the messages it does not cover (grown first when the
            // history no longer fits its share of the window).
            let context = self
                .turn_context(
                    TurnSide {
                        agent: &opening.agent,
                        key: &s.key,
                        channel: &s.channel,
                        owner: &opening.owner,
                        agent_prompt,
                        user_tokens,
                        input_window: opening.context_model.context_window.saturating_sub(reserve),
                        cancel: &req.cancel,
                    },
                    &reach,
                )
                .await?;
            return Ok((context, false));
        }
        self.store
            .session_ensure(&NewSession {
                key: &s.key,
                agent_id: &s.agent_id,
                channel: &s.channel,
                tenant_id: Some(&s.tenant_id),
                user_id: Some(&s.user_id),
            })
            .await?;
        self.control.events.publish_to(
            &opening.owner,
            "session:created",
            json!({"sessionKey": s.key, "agentId": s.agent_id, "channel": s.channel}),
        );
        Ok((TurnContext::default(), true))
    }

    /// Plan the tools: the agent's tools, narrowed to the request's list and to the turn's
    /// scopes.
    fn plan_tools(&self, req: &TurnRequest, agent: &Agent) -> Vec<ToolSpec> {
        self.tools.specs(|name, scope, group| {
            agent.allows_tool_in(name, group)
                && req.only_tools.as_ref().is_none_or(|o| o.contains(name))
                && req.scopes.allows(scope)
        })
    }

    /// The step loop: a model call (the chain in order, each with its retries), then the tool
    /// calls it asked for, until an answer or a limit (steps, budget, repeated call, circuit
    /// breaker, the caller going away). A provider failure at the first step that leaves no
    /// usable model is an error; later ones end the turn with finishReason error.
    async fn step_loop(
        &self,
        req: &TurnRequest,
        opening: &Opening,
        system: &str,
        mut messages: Vec<ChatMessage>,
        tools: &[ToolSpec],
        trace: &mut TurnTrace,
    ) -> Result<Stepped, GatewayError> {
        let permit = opening.permit.as_ref().or(req.admitted.as_ref());
        let agent = &opening.agent;
        let max_steps = req.max_steps.unwrap_or_else(|| agent.max_steps()).max(1);
        let limits = agent.budget();
        let breaker = self.agents.defaults().circuit_breaker_threshold.max(1);
        let tool_trace_id = trace.trace_id.clone();
        let spent = crate::runtime::tools::Spent::default();
        let ctx = ToolContext {
            store: &self.store,
            media: &self.media,
            agent_id: &agent.id,
            session_key: req.session.as_ref().map(|s| s.key.as_str()),
            tenant: req.caller.tenant(),
            owner: req
                .session
                .as_ref()
                .map_or(req.caller.client_id.as_str(), |s| s.tenant_id.as_str()),
            memory: &self.memory,
            trace_id: &tool_trace_id,
            run: req.run.as_ref(),
            agent,
            caller: &req.caller,
            scopes: req.scopes,
            runs: &self.runs,
            offered: tools,
            tools: &self.tools,
            spent: &spent,
        };
        let mut out = TurnOutcome {
            response: String::new(),
            input_tokens: 0,
            output_tokens: 0,
            finish: FinishReason::Stop,
            cost_usd: 0.0,
            steps: 0,
            model: opening.context_model.id(),
            failure: None,
            tool_calls: 0,
            trace_id: String::new(),
        };
        let mut seen_calls = HashSet::new();
        let mut failures = 0u32;
        let mut step_usage = Vec::new();
        'steps: loop {
            if out.steps >= max_steps {
                out.finish = FinishReason::MaxSteps;
                break;
            }
            out.steps += 1;
            if let Some(run) = &req.run {
                // A step is a use of the lease too: a revoked run stops here; steering
                // messages join the conversation before the model call.
                if !run.lease.valid() {
                    run.stop(Stop::Revoked);
                    revoked(&mut out);
                    break;
                }
                // The tree's budget (other runs of it may have spent it) is checked before
                // each model call.
                if run.budget.spent_out() {
                    out.finish = FinishReason::BudgetExceeded;
                    break;
                }
                for m in run.take_steering() {
                    messages.push(ChatMessage::user(m));
                }
            }
            let request = ChatRequest {
                model: String::new(),
                system: (!system.is_empty()).then(|| system.to_owned()),
                messages: messages.clone(),
                tools: tools.to_vec(),
                max_tokens: req.max_tokens,
                temperature: req.temperature,
            };
            let called = match self
                .calls
                .call_step(
                    &opening.chain,
                    request,
                    req.sink.as_ref(),
                    &req.cancel,
                    CallFor {
                        agent_id: &agent.id,
                        session_key: req
                            .session
                            .as_ref()
                            .map(|s| s.key.as_str())
                            .or(req.usage_label.as_deref()),
                        owner: Some(&opening.owner),
                        operation: "chat",
                    },
                )
                .await
            {
                Ok(c) => c,
                Err(e)
                    if out.steps == 1
                        && matches!(
                            e.error.kind,
                            ErrorKind::Unavailable | ErrorKind::MissingKey
                        ) =>
                {
                    return Err(GatewayError::Unavailable(e.error.message));
                }
                Err(failed) => {
                    let e = &failed.error;
                    tracing::warn!(agent = %agent.id, kind = e.kind.as_str(), status = e.status, error = %crate::logging::escaped(&bounded(&e.message)), "turn ended by a provider failure");
                    out.finish = FinishReason::Error;
                    out.response = e.public_message();
                    out.failure = Some(TurnFailure {
                        kind: e.kind,
                        status: e.status,
                        after_output: failed.after_output,
                    });
                    break;
                }
            };
            let Called { response, model } = called;
            out.input_tokens += response.usage.input;
            out.output_tokens += response.usage.output;
            let cost = model.cost(&response.usage);
            out.cost_usd += cost;
            if let Some(run) = &req.run {
                run.budget
                    .add(response.usage.input + response.usage.output, cost);
            }
            spent.set(out.input_tokens + out.output_tokens, out.cost_usd);
            out.model = model.id();
            out.response = response.content.clone();
            let assistant =
                ChatMessage::assistant(response.content.clone(), response.tool_calls.clone());
            messages.push(assistant);
            step_usage.push((messages.len() - 1, model.id(), response.usage));
            let over_budget = limits
                .tokens
                .is_some_and(|t| out.input_tokens + out.output_tokens > t.max(0) as u64)
                || limits.cost_usd.is_some_and(|c| out.cost_usd > c)
                || req.run.as_ref().is_some_and(|r| r.budget.spent_out());
            if over_budget {
                out.finish = FinishReason::BudgetExceeded;
                break;
            }
            if response.tool_calls.is_empty() {
                // A steering message that came during the last step gets one more step.
                if req.run.as_ref().is_some_and(|r| r.has_steering()) && out.steps < max_steps {
                    continue;
                }
                out.finish = FinishReason::Stop;
                break;
            }
            for call in &response.tool_calls {
                out.tool_calls = out.tool_calls.saturating_add(1);
                if !seen_calls.insert((call.name.clone(), canonical_json(&call.arguments))) {
                    out.finish = FinishReason::ContextLoop;
                    // The repeated call gets no result; close it so the transcript stays valid.
                    let text = "not run: the same call was already made in this turn";
                    trace.tool(messages.len(), &call.name, text, true, Duration::ZERO);
                    messages.push(ChatMessage::tool(call, text, true));
                    break 'steps;
                }
                let called_at = Instant::now();
                let offered = tools.iter().any(|t| t.name == call.name);
                let gate = match &req.run {
                    None => Gate::Allowed,
                    Some(run) => run.gate(&call.name, self.tools.opt_in_group(&call.name), offered),
                };
                let result = match gate {
                    Gate::Allowed if offered => {
                        match self.approve(req, opening, call, permit).await {
                            Decision::Approved => {
                                self.tools.call(&ctx, &call.name, &call.arguments).await
                            }
                            Decision::Denied(why) => {
                                let tripped = req.run.as_ref().is_some_and(|r| r.refused());
                                if tripped {
                                    let why = format!("{why}; refusals in a row stopped the run tree (denial breaker)");
                                    trace.tool(
                                        messages.len(),
                                        &call.name,
                                        &why,
                                        true,
                                        Duration::ZERO,
                                    );
                                    messages.push(ChatMessage::tool(call, &why, true));
                                    if let Some(run) = &req.run {
                                        self.control.tree.trip_denial_breaker(&run.root_run_id);
                                    }
                                    out.finish = FinishReason::CircuitOpen;
                                    break 'steps;
                                }
                                Err(why)
                            }
                        }
                    }
                    Gate::Allowed => {
                        Err(format!("tool not available to this agent: {}", call.name))
                    }
                    Gate::Refused(why) => Err(why),
                    Gate::Revoked => {
                        let text = "not run: the run's lease was revoked";
                        trace.tool(messages.len(), &call.name, text, true, Duration::ZERO);
                        messages.push(ChatMessage::tool(call, text, true));
                        if let Some(run) = &req.run {
                            run.stop(Stop::Revoked);
                        }
                        revoked(&mut out);
                        break 'steps;
                    }
                    Gate::Breaker(why) => {
                        trace.tool(messages.len(), &call.name, &why, true, Duration::ZERO);
                        messages.push(ChatMessage::tool(call, &why, true));
                        if let Some(run) = &req.run {
                            self.control.tree.trip_denial_breaker(&run.root_run_id);
                        }
                        out.finish = FinishReason::CircuitOpen;
                        break 'steps;
                    }
                };
                let (text, is_error) = match result {
                    Ok(t) => {
                        failures = 0;
                        (t, false)
                    }
                    Err(t) => {
                        failures += 1;
                        (t, true)
                    }
                };
                trace.tool(
                    messages.len(),
                    &call.name,
                    &text,
                    is_error,
                    called_at.elapsed(),
                );
                messages.push(ChatMessage::tool(call, text, is_error));
                if failures >= breaker {
                    out.finish = FinishReason::CircuitOpen;
                    break 'steps;
                }
            }
            if req.cancel.is_cancelled() {
                out.finish = FinishReason::Error;
                out.response = "The caller went away".to_owned();
                out.failure = Some(TurnFailure {
                    kind: ErrorKind::Cancelled,
                    status: None,
                    after_output: false,
                });
                break;
            }
        }
        Ok(Stepped {
            out,
            messages,
            step_usage,
        })
    }

    /// Persist: this turn's messages (each model answer with its usage) and the turn's totals
    /// are appended to a stored session in one transaction; the first new sequence number is
    /// returned (None for an ephemeral turn).
    async fn persist(
        &self,
        req: &TurnRequest,
        assembled: &Assembled,
        stepped: &Stepped,
    ) -> Result<Option<i64>, GatewayError> {
        let Some(s) = &req.session else {
            return Ok(None);
        };
        let (out, first_new) = (&stepped.out, assembled.first_new);
        let stored: Vec<_> = stepped.messages[first_new..]
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let at = first_new + i;
                let usage = stepped.step_usage.iter().find(|(idx, _, _)| *idx == at);
                sessions::to_row(
                    m,
                    usage.map(|(_, id, _)| id.as_str()),
                    usage.map(|(_, _, u)| (u.input, u.output)),
                )
            })
            .collect();
        let first_seq = self
            .store
            .session_append(
                &s.key,
                &stored,
                &TurnTotals {
                    input_tokens: out.input_tokens as i64,
                    output_tokens: out.output_tokens as i64,
                    cost_usd: out.cost_usd,
                    steps: i64::from(out.steps),
                    model: Some(out.model.clone()),
                    finish_reason: Some(out.finish.as_str()),
                    error_kind: out.failure.map(|f| f.kind.as_str()),
                },
            )
            .await?;
        Ok(Some(first_seq))
    }

    /// Announce: the turn's metrics, its context budget, the system prompt report and the
    /// session index row (behind the request), and `message:sent`.
    #[allow(clippy::too_many_arguments)]
    fn announce(
        &self,
        req: &TurnRequest,
        opening: &Opening,
        assembled: &Assembled,
        tools: &[ToolSpec],
        stepped: Stepped,
        first_seq: Option<i64>,
        trace: TurnTrace,
    ) -> TurnOutcome {
        let Stepped {
            mut out, messages, ..
        } = stepped;
        let agent = &opening.agent;
        let first_new = assembled.first_new;
        let error_kind = out.failure.map(|f| f.kind.as_str());
        out.trace_id = trace.trace_id.clone();
        crate::metrics::turn_finished(out.finish.as_str());
        if let Some(b) = trace.budget_of() {
            self.obs.set_budget(&agent.id, b);
        }
        let label = req
            .session
            .as_ref()
            .map(|s| s.key.clone())
            .or_else(|| req.usage_label.clone())
            .unwrap_or_else(|| format!("ephemeral:{}", trace.trace_id));
        let channel = match &req.session {
            Some(s) => s.channel.clone(),
            None => crate::store::sessions::key_parts(&label)
                .map_or_else(|| "api".to_owned(), |[_, channel, _, _]| channel),
        };
        if let Some(s) = &req.session {
            prompt_report(
                &self.store,
                &agent.id,
                &s.key,
                &trace.trace_id,
                PromptParts {
                    whole: &assembled.system,
                    sections: vec![
                        ("agent", assembled.agent_prompt.as_str(), false),
                        (
                            "conversation summary",
                            assembled.summary.as_deref().unwrap_or(""),
                            false,
                        ),
                    ],
                    tool_count: tools.len(),
                    tool_schema_chars: serde_json::to_string(tools).map_or(0, |t| t.len()),
                    model: out.model.clone(),
                },
            );
        }
        trace.finish(
            &self.store,
            &TurnEnd {
                session_key: &label,
                tenant: &opening.owner,
                agent_id: &agent.id,
                channel: &channel,
                first_seq,
                first_index: first_new,
                count: messages.len() - first_new,
                finish: out.finish,
                error_kind,
                tokens: (out.input_tokens + out.output_tokens) as i64,
                cost_usd: out.cost_usd,
                steps: out.steps,
                fallback: out.model != opening.context_model.id(),
                created: assembled.created,
                answered: out.finish != FinishReason::Error
                    && messages
                        .last()
                        .is_some_and(|m| m.role == crate::providers::Role::Assistant),
            },
        );
        self.control.events.publish_to(
            &opening.owner,
            "message:sent",
            MessageSent {
                agent_id: agent.id.clone(),
                session_key: opening.session_key.clone(),
                finish_reason: out.finish.as_str(),
                model: out.model.clone(),
                steps: out.steps,
                tokens_used: Tokens {
                    input: out.input_tokens,
                    output: out.output_tokens,
                    total: out.input_tokens + out.output_tokens,
                },
            },
        );
        out
    }
}

/// One tool call made outside a model's turn (a graph's tool node), on a run's lease.
pub struct ToolCallOf<'a> {
    pub agent: &'a Arc<Agent>,
    pub caller: &'a CallContext,
    /// The run whose lease the call uses (a graph run's root).
    pub run: &'a Arc<crate::runtime::tree::LiveRun>,
    pub tool: &'a str,
    pub args: &'a Value,
    /// Names the call in the approval queue and the denial cache (`graph:<runId>.<node>`).
    pub label: &'a str,
    pub cancel: &'a CancellationToken,
}

impl Turns {
    /// Calls one built-in tool through the gate a turn's calls go through: the tool must be
    /// one the agent offers the caller, then the run's lease, capabilities and budget, then
    /// the approval policy. The tool's text, or why it was refused or failed.
    pub async fn call_tool(&self, c: ToolCallOf<'_>) -> Result<String, String> {
        let offered: Vec<ToolSpec> = self.tools.specs(|name, scope, group| {
            name == c.tool && c.agent.allows_tool_in(name, group) && c.caller.scopes.allows(scope)
        });
        if offered.is_empty() {
            return Err(format!("tool not available to this agent: {}", c.tool));
        }
        match c.run.gate(c.tool, self.tools.opt_in_group(c.tool), true) {
            Gate::Allowed => {}
            Gate::Refused(why) | Gate::Breaker(why) => return Err(why),
            Gate::Revoked => return Err("not run: the run's lease was revoked".to_owned()),
        }
        let policy = self.approvals.policy();
        if !policy.is_empty() && policy.needs(&c.agent.id, c.tool) {
            let decision = self
                .approvals
                .ask(Ask {
                    session_key: c.label,
                    agent_id: &c.agent.id,
                    tool: c.tool,
                    args: c.args,
                    owner: &c.caller.client_id,
                    run_id: Some(&c.run.run_id),
                    cancel: c.cancel,
                })
                .await;
            if let Decision::Denied(why) = decision {
                return Err(why);
            }
        }
        let trace_id = uuid::Uuid::new_v4().simple().to_string();
        let spent = crate::runtime::tools::Spent::default();
        let ctx = ToolContext {
            store: &self.store,
            media: &self.media,
            agent_id: &c.agent.id,
            session_key: None,
            tenant: c.caller.tenant(),
            owner: &c.caller.client_id,
            memory: &self.memory,
            trace_id: &trace_id,
            run: Some(c.run),
            agent: c.agent,
            caller: &c.caller.principal,
            scopes: c.caller.scopes,
            runs: &self.runs,
            offered: &offered,
            tools: &self.tools,
            spent: &spent,
        };
        self.tools.call(&ctx, c.tool, c.args).await
    }
}

/// How the context window of a turn's first model call was budgeted (token counts only).
impl Turns {
    /// The approval step of the gate: a call the policy names waits for an operator's
    /// decision, without holding its admission slot; any other call is approved at once (and
    /// costs one check of an empty policy by default).
    async fn approve(
        &self,
        req: &TurnRequest,
        opening: &Opening,
        call: &crate::providers::ToolCall,
        permit: Option<&crate::runtime::admission::Permit>,
    ) -> Decision {
        let policy = self.approvals.policy();
        if policy.is_empty() || !policy.needs(&opening.agent.id, &call.name) {
            return Decision::Approved;
        }
        let parked = permit.map(crate::runtime::admission::Permit::park);
        let session_key = req
            .session
            .as_ref()
            .map(|s| s.key.as_str())
            .or(req.usage_label.as_deref())
            .unwrap_or("");
        let decision = self
            .approvals
            .ask(Ask {
                session_key,
                agent_id: &opening.agent.id,
                tool: &call.name,
                args: &call.arguments,
                owner: &opening.owner,
                run_id: req.run.as_ref().map(|r| r.run_id.as_str()),
                cancel: &req.cancel,
            })
            .await;
        drop(parked);
        decision
    }
}

/// Ends a turn whose run's lease was revoked (the run's status becomes `revoked`).
fn revoked(out: &mut TurnOutcome) {
    out.finish = FinishReason::Error;
    out.response = "The run's lease was revoked".to_owned();
    out.failure = Some(TurnFailure {
        kind: ErrorKind::Cancelled,
        status: None,
        after_output: false,
    });
}

fn context_budget(
    model: &ModelInfo,
    reserve: u64,
    fixed: u64,
    user_tokens: u64,
    budget: u64,
    kept: &[ChatMessage],
    history_len: usize,
) -> ObsContextBudget {
    let kept_tokens: u64 = kept.iter().map(sessions::message_tokens).sum();
    let window = model.context_window;
    let verdict = if fixed > window.saturating_sub(reserve) {
        ObsContextBudgetVerdict::Exhausted
    } else if kept.len() < history_len {
        ObsContextBudgetVerdict::Downshifted
    } else {
        ObsContextBudgetVerdict::Fits
    };
    ObsContextBudget {
        window_tokens: window as i64,
        raw_context_window_tokens: window as i64,
        window_cap_source: "none".to_owned(),
        system_tokens: fixed.saturating_sub(user_tokens) as i64,
        fresh_tail_tokens: user_tokens as i64,
        budgeted_history_tokens: budget as i64,
        kept_count: kept.len() as i64,
        assembled_input_tokens: (fixed + kept_tokens) as i64,
        output_headroom: reserve as i64,
        verdict,
    }
}

/// At most this much of a provider's error text is logged per failed turn.
const LOGGED_ERROR_CHARS: usize = 1000;

fn bounded(text: &str) -> String {
    let mut out: String = text.chars().take(LOGGED_ERROR_CHARS).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// The wire value of a failed turn's error kind.
pub fn turn_error_kind(kind: ErrorKind) -> TurnErrorKind {
    match kind {
        ErrorKind::Auth => TurnErrorKind::Auth,
        ErrorKind::NotFound => TurnErrorKind::NotFound,
        ErrorKind::RateLimited => TurnErrorKind::RateLimited,
        ErrorKind::Timeout => TurnErrorKind::Timeout,
        ErrorKind::Network => TurnErrorKind::Network,
        ErrorKind::ProviderError => TurnErrorKind::ProviderError,
        ErrorKind::MissingKey => TurnErrorKind::MissingKey,
        ErrorKind::Unavailable => TurnErrorKind::Unavailable,
        ErrorKind::InvalidRequest => TurnErrorKind::InvalidRequest,
        ErrorKind::Cancelled => TurnErrorKind::Cancelled,
    }
}

/// Assemble the context: the system prompt with the conversation summary, the history trimmed
/// to what the window leaves after the prompt, the user's message and the reserved output;
/// the context budget is recorded on the trace.
#[allow(clippy::too_many_arguments)]
fn assemble_context(
    opening: &Opening,
    agent_prompt: String,
    context: TurnContext,
    created: bool,
    user: ChatMessage,
    user_tokens: u64,
    reserve: u64,
    trace: &mut TurnTrace,
) -> Assembled {
    let summary = context.summary;
    let system = compose_system(&agent_prompt, summary.as_deref());
    let fixed = crate::providers::tokens::estimate_tokens(&system) + user_tokens;
    let budget = opening
        .context_model
        .context_window
        .saturating_sub(reserve)
        .saturating_sub(fixed);
    let history_len = context.history.len();
    let mut messages = sessions::trim_history(context.history, budget);
    let first_new = messages.len();
    messages.push(user);
    trace.budget(context_budget(
        &opening.context_model,
        reserve,
        fixed,
        user_tokens,
        budget,
        &messages[..first_new],
        history_len,
    ));
    Assembled {
        agent_prompt,
        summary,
        system,
        messages,
        first_new,
        created,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::agents::AgentSettings;
    use crate::providers::tokens::estimate_tokens;
    use crate::providers::Role;

    fn opening(window: u64) -> Opening {
        Opening {
            permit: None,
            agent: Arc::new(Agent {
                id: "a".into(),
                config: AgentSettings::default(),
                suspended: false,
                created_at: 0,
                updated_at: 0,
            }),
            session_key: None,
            owner: Arc::from("me"),
            chain: vec!["p/m".into()],
            context_model: ModelInfo {
                provider: "p".into(),
                model_id: "m".into(),
                aliases: Vec::new(),
                context_window: window,
                max_output_tokens: None,
                input_price: 0.0,
                output_price: 0.0,
                capabilities: Vec::new(),
            },
        }
    }

    /// The assemble step alone: the newest history that fits the window after the prompt and
    /// the reserved output, starting at a user message, then the user's message; the summary
    /// joins the agent's prompt; the budget is on the trace.
    #[test]
    fn assembling_keeps_the_newest_history_that_fits_and_ends_with_the_message() {
        let history: Vec<ChatMessage> = (0..20)
            .map(|i| {
                if i % 2 == 0 {
                    ChatMessage::user(format!("question {i} {}", "x".repeat(200)))
                } else {
                    ChatMessage::assistant(format!("answer {i} {}", "y".repeat(200)), Vec::new())
                }
            })
            .collect();
        let user = ChatMessage::user("now");
        let user_tokens = sessions::message_tokens(&user);
        let mut trace = TurnTrace::start();
        let context = TurnContext {
            summary: Some("earlier talk".into()),
            history,
        };
        let (window, reserve) = (1000, 250);
        let a = assemble_context(
            &opening(window),
            "be brief".into(),
            context,
            false,
            user,
            user_tokens,
            reserve,
            &mut trace,
        );
        assert_eq!(a.messages.last().unwrap().content, "now");
        assert_eq!(a.first_new, a.messages.len() - 1);
        assert!(a.first_new > 0 && a.first_new < 20, "{}", a.first_new);
        assert_eq!(a.messages[0].role, Role::User);
        assert!(a.system.contains("be brief") && a.system.contains("earlier talk"));
        let kept: u64 = a.messages[..a.first_new]
            .iter()
            .map(sessions::message_tokens)
            .sum();
        let fixed = estimate_tokens(&a.system) + user_tokens;
        assert!(kept <= window - reserve - fixed, "{kept}");
        assert!(trace.budget_of().is_some());
        assert!(!a.created);
    }
}
