//! The REST API under `/api` (served when `gateway.web.enabled`): health, agents, channels,
//! activity, memory, chat history, an agent turn, and two SSE streams (system events, and a
//! chat answered token by token). Every route but health needs a token with scope `rpc`.

pub mod types;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use poem::web::Data;
use poem_openapi::param::Query;
use poem_openapi::payload::Json;
use poem_openapi::types::Any;
use poem_openapi::{OpenApi, Tags};
use tokio::sync::broadcast::error::RecvError;

use crate::api::principal::Principal;
use crate::app::state::AppState;
use crate::http::security::{RestBearer, SseAuth};
use crate::http::sse::{self, Sse};
use crate::http::turns::{run_to_end, Render, StreamingTurn};
use crate::runtime::sessions::{CallerKey, SessionIdent};
use crate::runtime::turn::{TurnOutcome, TurnRequest};
use crate::store::sessions::SessionFilter;
use crate::transport::problem::{Problem, RestError};
use types::*;

/// Reconnect delay advertised on `/api/events`.
pub const SSE_RETRY_MS: u64 = 3000;
/// The channel label of sessions started through `/api/chat`.
pub const API_CHANNEL: &str = "api";

#[derive(Tags)]
enum ApiTag {
    /// The REST API that serves the dashboard.
    Rest,
    /// Server-sent event streams.
    Streams,
}

pub struct RestApi;

fn event_out(e: &crate::events::Event) -> EventOut {
    EventOut {
        seq: e.seq,
        event: e.name.to_string(),
        ts: e.ts,
        data: Any(e.data_value()),
    }
}

fn result_of(o: &TurnOutcome) -> ChatResult {
    ChatResult {
        response: o.response.clone(),
        tokens_used: o.tokens().into(),
        finish_reason: o.finish.as_str().to_owned(),
    }
}

/// The turn `/api/chat` and `/api/chat/stream` run: the named (or default) agent, in the
/// caller's own session `sessionKey` when given, else ephemeral.
fn chat_turn(
    state: &AppState,
    principal: &Principal,
    message: String,
    agent_id: Option<&str>,
    session_key: Option<&str>,
) -> Result<TurnRequest, Problem> {
    let engine = &state.engine;
    let agent_id = match agent_id {
        Some(id) => id.to_owned(),
        None => engine.agents.default_id().ok_or_else(|| {
            Problem::new(
                http::StatusCode::SERVICE_UNAVAILABLE,
                "No agent is configured",
            )
        })?,
    };
    let agent = engine.agents.require(&agent_id)?;
    let key = |k| CallerKey {
        channel: Some(API_CHANNEL),
        tenant: None,
        user: Some(k),
    };
    let session = session_key
        .map(|k| SessionIdent::for_caller(principal, &agent.id, key(k)))
        .transpose()
        .map_err(|r| r.at("sessionKey"))?;
    Ok(TurnRequest {
        session,
        ..TurnRequest::new(agent, message, &principal.context(None))
    })
}

/// `/api/chat/stream`: `token` events with the text so far, then `done`.
#[derive(Default)]
struct TokenEvents {
    accumulated: String,
}

impl Render for TokenEvents {
    fn delta(&mut self, delta: String) -> Bytes {
        self.accumulated.push_str(&delta);
        let token = ChatToken {
            delta,
            accumulated: self.accumulated.clone(),
        };
        sse::frame(
            Some("token"),
            &serde_json::to_string(&token).unwrap_or_default(),
        )
    }

    fn done(&mut self, result: Result<TurnOutcome, crate::api::error::GatewayError>) -> Bytes {
        let done = match result {
            Ok(o) => result_of(&o),
            Err(e) => {
                tracing::warn!(error = %e, "streamed chat ended by an error");
                ChatResult {
                    response: self.accumulated.clone(),
                    tokens_used: Tokens {
                        input: 0,
                        output: 0,
                        total: 0,
                    },
                    finish_reason: "error".to_owned(),
                }
            }
        };
        sse::frame(
            Some("done"),
            &serde_json::to_string(&done).unwrap_or_default(),
        )
    }
}

#[OpenApi(prefix_path = "/api")]
impl RestApi {
    /// Health
    ///
    /// No token needed; exempt from the rate limit.
    #[oai(
        path = "/health",
        method = "get",
        tag = "ApiTag::Rest",
        operation_id = "apiHealth"
    )]
    async fn health(&self) -> Json<Health> {
        Json(Health::now())
    }

    /// Agents
    #[oai(
        path = "/agents",
        method = "get",
        tag = "ApiTag::Rest",
        operation_id = "listAgents"
    )]
    async fn agents(
        &self,
        _auth: RestBearer,
        Data(state): Data<&Arc<AppState>>,
    ) -> Result<Json<AgentList>, RestError> {
        let engine = &state.engine;
        let default = engine.agents.default_id();
        let agents = engine
            .agents
            .all()
            .iter()
            .map(|a| {
                let model = a.model();
                let (provider, model_id) = model.split_once('/').unwrap_or(("", model));
                AgentSummary {
                    id: a.id.clone(),
                    name: a.config.name.clone().unwrap_or_else(|| a.id.clone()),
                    provider: provider.to_owned(),
                    model: model_id.to_owned(),
                    suspended: a.suspended,
                    is_default: default.as_deref() == Some(a.id.as_str()),
                }
            })
            .collect();
        Ok(Json(AgentList { agents }))
    }

    /// Channels
    ///
    /// Enabled channel connections and their status.
    #[oai(
        path = "/channels",
        method = "get",
        tag = "ApiTag::Rest",
        operation_id = "listChannels"
    )]
    async fn channels(&self, _auth: RestBearer) -> Result<Json<ChannelList>, RestError> {
        Ok(Json(ChannelList {
            channels: Vec::new(),
        }))
    }

    /// Recent activity
    ///
    /// The newest system events (the same events `/api/events` streams), newest first.
    #[oai(
        path = "/activity",
        method = "get",
        tag = "ApiTag::Rest",
        operation_id = "listActivity"
    )]
    async fn activity(
        &self,
        auth: RestBearer,
        Data(state): Data<&Arc<AppState>>,
        #[oai(validator(minimum(value = "1"), maximum(value = "100")))] limit: Query<Option<u32>>,
    ) -> Result<Json<ActivityList>, RestError> {
        let limit = limit.0.unwrap_or(50) as usize;
        let events = state
            .control
            .events
            .recent(auth.0.tenant(), limit)
            .iter()
            .map(|e| event_out(e))
            .collect();
        Ok(Json(ActivityList { events }))
    }

    /// Memory search
    ///
    /// Hybrid search (words and meaning) over one tenant's memory, best first: the caller's
    /// own, or `tenantId` with an admin token (another tenant's name without admin: 403).
    #[oai(
        path = "/memory/search",
        method = "get",
        tag = "ApiTag::Rest",
        operation_id = "searchMemory"
    )]
    async fn memory_search(
        &self,
        auth: RestBearer,
        Data(state): Data<&Arc<AppState>>,
        #[oai(validator(min_length = 1, max_length = 4000))] q: Query<String>,
        #[oai(validator(minimum(value = "1"), maximum(value = "100")))] limit: Query<Option<u32>>,
        #[oai(name = "tenantId", validator(min_length = 1, max_length = 128))] tenant_id: Query<
            Option<String>,
        >,
    ) -> Result<Json<MemorySearch>, RestError> {
        let tenant_id = memory_tenant(state, &auth.0, tenant_id.0.as_deref()).await?;
        let hits = crate::handlers::memory_search(
            &state.engine,
            &tenant_id,
            &q.0,
            limit.0.unwrap_or(10) as usize,
        )
        .await?;
        let results = hits
            .into_iter()
            .map(|h| MemoryHitOut {
                id: h.id,
                content: h.content,
                tags: h.tags,
                memory_type: h.memory_type.as_str().to_owned(),
                trust_level: h.trust_level.as_str().to_owned(),
                agent_id: h.agent_id,
                source_session_key: h.source_session_key,
                pinned: h.pinned,
                created_at: h.created_at,
                score: h.score,
            })
            .collect();
        Ok(Json(MemorySearch { results }))
    }

    /// Memory statistics
    ///
    /// Entry counts and index facts of the caller's memory (or `tenantId`'s, with an admin
    /// token), as `memory.stats` answers them.
    #[oai(
        path = "/memory/stats",
        method = "get",
        tag = "ApiTag::Rest",
        operation_id = "memoryStats"
    )]
    async fn memory_stats(
        &self,
        auth: RestBearer,
        Data(state): Data<&Arc<AppState>>,
        #[oai(name = "tenantId", validator(min_length = 1, max_length = 128))] tenant_id: Query<
            Option<String>,
        >,
    ) -> Result<Json<MemoryStats>, RestError> {
        let tenant_id = memory_tenant(state, &auth.0, tenant_id.0.as_deref()).await?;
        let s = crate::handlers::memory_stats(
            &state.engine,
            &crate::api::tenancy::Tenant::owner(&tenant_id),
            &tenant_id,
            None,
        )
        .await?;
        Ok(Json(MemoryStats {
            tenant_id: s.tenant_id,
            agent_id: s.agent_id,
            total_entries: s.total_entries,
            pinned_entries: s.pinned_entries,
            embedded_entries: s.embedded_entries,
            by_type: s.by_type,
            by_trust_level: s.by_trust_level,
            by_agent: s.by_agent,
            total_sessions: s.total_sessions,
            observations: s.observations,
            entities: s.entities,
            fts_indexed: s.fts_indexed,
            vector_indexed: s.vector_indexed,
            db_size_bytes: s.db_size_bytes,
            oldest_created_at: s.oldest_created_at,
            newest_created_at: s.newest_created_at,
        }))
    }

    /// Chat history
    ///
    /// Your conversations (every tenant's with an admin token), most recent first; at most
    /// 100.
    #[oai(
        path = "/chat/history",
        method = "get",
        tag = "ApiTag::Rest",
        operation_id = "chatHistory"
    )]
    async fn chat_history(
        &self,
        auth: RestBearer,
        Data(state): Data<&Arc<AppState>>,
        #[oai(name = "channelId")] channel_id: Query<Option<String>>,
    ) -> Result<Json<ChatHistory>, RestError> {
        let filter = SessionFilter {
            channel: channel_id.0,
            ..SessionFilter::of(auth.0.tenant().clone())
        };
        let (rows, _) = state.engine.store.session_list(&filter, 100, 0).await?;
        let sessions = rows
            .into_iter()
            .map(|r| ChatSession {
                session_key: r.key,
                agent_id: r.agent_id,
                channel: r.channel,
                message_count: r.message_count,
                input_tokens: r.input_tokens,
                output_tokens: r.output_tokens,
                last_model: r.last_model,
                created_at: r.created_at,
                updated_at: r.updated_at,
            })
            .collect();
        Ok(Json(ChatHistory { sessions }))
    }

    /// Agent turn
    #[oai(
        path = "/chat",
        method = "post",
        tag = "ApiTag::Rest",
        operation_id = "chat"
    )]
    async fn chat(
        &self,
        auth: RestBearer,
        Data(state): Data<&Arc<AppState>>,
        body: Json<ChatRequest>,
    ) -> Result<Json<ChatResult>, RestError> {
        let b = body.0;
        let turn = chat_turn(
            state,
            &auth.0,
            b.message,
            b.agent_id.as_deref(),
            b.session_key.as_deref(),
        )?;
        let outcome = run_to_end(&state.engine, turn).await?;
        Ok(Json(result_of(&outcome)))
    }

    /// System events (SSE)
    ///
    /// Every system event as it happens (`event: <name>`, data `{seq, event, ts, data}`), a
    /// keep-alive comment every 15 seconds and `retry: 3000`. Bearer header or `?token=`. A
    /// client that falls behind gets an `event: lagged` and is disconnected.
    #[oai(
        path = "/events",
        method = "get",
        tag = "ApiTag::Streams",
        operation_id = "events"
    )]
    async fn events(
        &self,
        auth: SseAuth,
        Data(state): Data<&Arc<AppState>>,
    ) -> Result<Sse<EventOut>, RestError> {
        // Ended when the token is revoked, rotated or expires (on whichever node).
        let watch = state.tokens.watch(auth.principal());
        let rx = state.control.events.subscribe();
        let tenant = auth.principal().tenant().clone();
        let keep_alive = Duration::from_millis(state.config.gateway.web.sse_keep_alive_ms.max(1));
        let mut ticker = tokio::time::interval_at(sse::first_tick(keep_alive), keep_alive);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stop = state.stop.clone();
        let opening = stream::once(async { sse::retry(SSE_RETRY_MS) });
        let events = stream::unfold(
            (rx, ticker, stop, false),
            move |(mut rx, mut ticker, stop, done)| {
                let tenant = tenant.clone();
                async move {
                    if done {
                        return None;
                    }
                    let frame: Bytes = loop {
                        tokio::select! {
                            _ = stop.cancelled() => return None,
                            _ = ticker.tick() => break sse::comment("keep-alive"),
                            r = rx.recv() => match r {
                                // Another tenant's session events are not this subscriber's.
                                Ok(ev) if !ev.visible_to(&tenant) => continue,
                                Ok(ev) => {
                                    let json = serde_json::to_string(&*ev).unwrap_or_default();
                                    break sse::frame(Some(&ev.name), &json);
                                }
                                Err(RecvError::Lagged(missed)) => {
                                    let f = sse::frame(Some("lagged"), &serde_json::json!({"missed": missed}).to_string());
                                    return Some((f, (rx, ticker, stop, true)));
                                }
                                Err(RecvError::Closed) => return None,
                            },
                        }
                    };
                    Some((frame, (rx, ticker, stop, false)))
                }
            },
        );
        Ok(Sse::new(sse::until_revoked(
            opening.chain(events).boxed(),
            watch,
        )))
    }

    /// Chat stream (SSE)
    ///
    /// `token` events `{delta, accumulated}` while the agent answers, then one `done` event
    /// `{response, tokensUsed, finishReason}`. Bearer header or `?token=`.
    #[oai(
        path = "/chat/stream",
        method = "get",
        tag = "ApiTag::Streams",
        operation_id = "chatStream"
    )]
    async fn chat_stream(
        &self,
        auth: SseAuth,
        Data(state): Data<&Arc<AppState>>,
        #[oai(validator(min_length = 1))] message: Query<String>,
        #[oai(name = "agentId")] agent_id: Query<Option<String>>,
        #[oai(name = "sessionKey", validator(min_length = 1, max_length = 200))] session_key: Query<
            Option<String>,
        >,
    ) -> Result<Sse<ChatToken>, RestError> {
        let turn = chat_turn(
            state,
            auth.principal(),
            message.0,
            agent_id.0.as_deref(),
            session_key.0.as_deref(),
        )?;
        let started = StreamingTurn::begin(state.engine.clone(), turn).await?;
        Ok(Sse::new(started.frames(None, TokenEvents::default())))
    }
}

/// The tenant a memory route works in: the caller's own, or the one `named`. The route applies
/// the catalogue's `memory_tenant` rule through the same check the JSON-RPC dispatch uses
/// (`tenancy::allowed`), answering 403 where the dispatch answers -32603.
async fn memory_tenant(
    state: &AppState,
    caller: &Principal,
    named: Option<&str>,
) -> Result<String, RestError> {
    use crate::api::generated::methods::RecordKind;
    if let Some(n) = named {
        let kind = RecordKind::MemoryTenant;
        if !crate::api::tenancy::allowed(&state.engine.store, caller.tenant(), kind, false, n)
            .await?
        {
            return Err(RestError(Problem::forbidden(
                "Insufficient scope: naming another tenant requires 'admin'",
            )));
        }
    }
    Ok(caller.tenant_named(named).1)
}
