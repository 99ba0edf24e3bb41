//! `session.*`: conversations - listing, reading, searching, exporting, compacting, resetting
//! and deleting them, and runs started in them (send, spawn, run_status, status). Ownership is
//! the catalogue's rule (checked before these handlers run); every store call passes the
//! caller's tenant, so a caller without admin reaches only its own sessions and runs.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::SessionApi;
use crate::api::generated::types::{
    SessionCompactParams, SessionCompactResult, SessionDeleteParams, SessionDeleteResult,
    SessionExportParams, SessionExportResult, SessionHistoryParams, SessionHistoryResult,
    SessionListParams, SessionListResult, SessionResetConversationParams,
    SessionResetConversationResult, SessionResetParams, SessionResetResult, SessionRunStatusParams,
    SessionRunStatusResult, SessionSearchHit, SessionSearchParams, SessionSendParams,
    SessionSendParamsMode, SessionSendResult, SessionSendResultStatus, SessionSpawnParams,
    SessionSpawnParamsIncludeParentHistory, SessionSpawnResult, SessionStatusParams,
    SessionStatusResult, SessionSummary, SessionTranscript, SubagentRunStatus, TokensUsed,
};
use crate::api::CallContext;
use crate::runtime::runs::RunSpec;
use crate::runtime::sessions::{self, CallerKey, SessionIdent};
use crate::store::sessions::{SessionFilter, SessionRow};

/// Tool groups session.spawn can narrow a run to.
const TOOL_GROUPS: &[(&str, &[&str])] = &[
    ("time", &["current_time"]),
    ("memory", &["memory_store", "memory_search"]),
    ("notes", &["session_note_add", "session_notes"]),
    ("files", &["save_file"]),
];

fn summary(s: &SessionRow) -> SessionSummary {
    SessionSummary {
        session_key: s.key.clone(),
        agent_id: s.agent_id.clone(),
        channel: s.channel.clone(),
        tenant_id: s.tenant_id.clone(),
        user_id: s.user_id.clone(),
        label: s.label.clone(),
        message_count: s.message_count,
        total_tokens: s.input_tokens + s.output_tokens,
        created_at: s.created_at,
        updated_at: s.updated_at,
    }
}

fn metadata(s: &SessionRow) -> std::collections::BTreeMap<String, serde_json::Value> {
    serde_json::from_str(&s.metadata).unwrap_or_default()
}

fn tokens(input: Option<i64>, output: Option<i64>) -> Option<TokensUsed> {
    match (input, output) {
        (Some(i), Some(o)) => Some(TokensUsed {
            input: i,
            output: o,
            total: i + o,
        }),
        _ => None,
    }
}

fn run_status(s: &str) -> SubagentRunStatus {
    match s {
        "queued" => SubagentRunStatus::Queued,
        "running" => SubagentRunStatus::Running,
        "completed" => SubagentRunStatus::Completed,
        "timeout" => SubagentRunStatus::Timeout,
        "killed" => SubagentRunStatus::Killed,
        "revoked" => SubagentRunStatus::Revoked,
        "orphaned" => SubagentRunStatus::Orphaned,
        _ => SubagentRunStatus::Failed,
    }
}

/// Channel label of sessions session.send creates from a key that is not canonical.
const SEND_CHANNEL: &str = "session";

impl Rpc {
    /// The session `key` within the caller's reach; NotFound otherwise.
    async fn session_row(&self, ctx: &CallContext, key: &str) -> Result<SessionRow, GatewayError> {
        self.engine()
            .store
            .session_get(ctx.tenant(), key)
            .await?
            .ok_or_else(|| GatewayError::not_found("Session", key))
    }
}

impl SessionApi for Rpc {
    async fn list(
        &self,
        ctx: &CallContext,
        p: SessionListParams,
    ) -> Result<SessionListResult, GatewayError> {
        let filter = SessionFilter {
            agent_id: p.agent_id,
            channel: p.channel,
            updated_since: p.since_minutes.map(|m| crate::clock::now_ms() - m * 60_000),
            ..SessionFilter::of(ctx.tenant().clone())
        };
        let (rows, total) = self
            .engine()
            .store
            .session_list(&filter, p.limit, p.offset)
            .await?;
        let sessions: Vec<SessionSummary> = rows.iter().map(summary).collect();
        Ok(SessionListResult {
            has_more: p.offset + (sessions.len() as i64) < total,
            sessions,
            total,
            offset: p.offset,
        })
    }

    async fn history(
        &self,
        ctx: &CallContext,
        p: SessionHistoryParams,
    ) -> Result<SessionHistoryResult, GatewayError> {
        let s = self.session_row(ctx, &p.session_key).await?;
        let (rows, has_more) = self
            .engine()
            .store
            .session_messages(ctx.tenant(), &s.key, p.before, p.limit)
            .await?;
        Ok(SessionHistoryResult {
            total: s.message_count,
            session: summary(&s),
            messages: rows.iter().map(sessions::to_wire).collect(),
            has_more,
        })
    }

    async fn delete(
        &self,
        ctx: &CallContext,
        p: SessionDeleteParams,
    ) -> Result<SessionDeleteResult, GatewayError> {
        let s = self.session_row(ctx, &p.session_key).await?;
        let store = &self.engine().store;
        let rows = store.session_all_messages(ctx.tenant(), &s.key).await?;
        if !store.session_delete(ctx.tenant(), &s.key).await? {
            return Err(GatewayError::not_found("Session", &s.key));
        }
        crate::obs::recorder::session_event(
            store,
            "session.deleted",
            s.tenant_id.as_deref(),
            &s.key,
            serde_json::json!({"messages": rows.len()}),
        );
        Ok(SessionDeleteResult {
            session_key: s.key.clone(),
            deleted: true,
            transcript: SessionTranscript {
                message_count: rows.len() as i64,
                messages: rows.iter().map(sessions::to_wire).collect(),
                metadata: metadata(&s),
            },
        })
    }

    async fn reset(
        &self,
        ctx: &CallContext,
        p: SessionResetParams,
    ) -> Result<SessionResetResult, GatewayError> {
        let s = self.session_row(ctx, &p.session_key).await?;
        let lock = self.engine().turns.session_lock(&s.key);
        let _turns = lock.lock().await;
        let previous = self
            .engine()
            .store
            .session_clear(ctx.tenant(), &s.key)
            .await?
            .ok_or_else(|| GatewayError::not_found("Session", &s.key))?;
        // The spec: a reset "clears cached approval decisions".
        self.engine().approvals.clear_denials(Some(&s.key)).await?;
        crate::obs::recorder::session_event(
            &self.engine().store,
            "session.reset",
            s.tenant_id.as_deref(),
            &s.key,
            serde_json::json!({"previousMessageCount": previous}),
        );
        Ok(SessionResetResult {
            session_key: s.key,
            reset: true,
            previous_message_count: previous,
        })
    }

    async fn export(
        &self,
        ctx: &CallContext,
        p: SessionExportParams,
    ) -> Result<SessionExportResult, GatewayError> {
        let s = self.session_row(ctx, &p.session_key).await?;
        let rows = self
            .engine()
            .store
            .session_all_messages(ctx.tenant(), &s.key)
            .await?;
        Ok(SessionExportResult {
            session_key: s.key.clone(),
            message_count: rows.len() as i64,
            messages: rows.iter().map(sessions::to_wire).collect(),
            metadata: metadata(&s),
            created_at: s.created_at,
            updated_at: s.updated_at,
        })
    }

    async fn run_status(
        &self,
        ctx: &CallContext,
        p: SessionRunStatusParams,
    ) -> Result<SessionRunStatusResult, GatewayError> {
        let r = self.run_row(ctx, &p.run_id).await?;
        let end = r.completed_at.unwrap_or_else(crate::clock::now_ms);
        Ok(SessionRunStatusResult {
            status: run_status(&r.status),
            runtime_ms: (end - r.started_at).max(0),
            tokens_used: tokens(r.input_tokens, r.output_tokens),
            run_id: r.run_id,
            agent_id: r.agent_id,
            task: r.task,
            session_key: r.session_key,
            started_at: r.started_at,
            completed_at: r.completed_at,
            response: r.response,
            cost: r.cost_usd,
            error: r.error,
        })
    }

    async fn search(
        &self,
        ctx: &CallContext,
        p: SessionSearchParams,
    ) -> Result<Vec<SessionSearchHit>, GatewayError> {
        let hits = self
            .engine()
            .store
            .search_messages(ctx.tenant(), &p.query, p.limit)
            .await?;
        Ok(hits
            .into_iter()
            .map(|h| SessionSearchHit {
                session_key: h.session_key,
                agent_id: h.agent_id,
                channel_type: h.channel,
                snippet: h.snippet,
                score: h.score,
                timestamp: h.timestamp,
            })
            .collect())
    }

    async fn compact(
        &self,
        ctx: &CallContext,
        p: SessionCompactParams,
    ) -> Result<SessionCompactResult, GatewayError> {
        let s = self.session_row(ctx, &p.key).await?;
        let engine = self.engine();
        let agent = engine.agents.require(&s.agent_id)?;
        let c = engine
            .turns
            .compact(
                ctx.tenant(),
                s.tenant_id.as_deref(),
                &agent,
                &s.key,
                &s.channel,
                p.instructions.as_deref(),
            )
            .await?;
        Ok(SessionCompactResult {
            session_key: s.key,
            compaction_triggered: c.triggered,
            previous_message_count: c.previous_count as i64,
            message_count: c.count as i64,
            previous_estimated_tokens: c.previous_tokens as i64,
            estimated_tokens: c.tokens as i64,
            instructions: p.instructions,
        })
    }

    async fn reset_conversation(
        &self,
        ctx: &CallContext,
        p: SessionResetConversationParams,
    ) -> Result<SessionResetConversationResult, GatewayError> {
        if p.purge_derived && !p.memory {
            return Err(GatewayError::InvalidParams(
                "'purge_derived' is only allowed with 'memory': true".into(),
            ));
        }
        let engine = self.engine();
        let store = &engine.store;
        // Best effort per layer: an absent session is not an error (a storage failure is).
        let (cleared, attached) = {
            let lock = engine.turns.session_lock(&p.session_key);
            let _turns = lock.lock().await;
            // Counted under the turn lock; the delete cascades to messages and notes (the
            // summary nodes are deleted first, to be counted).
            match store.session_get(ctx.tenant(), &p.session_key).await? {
                Some(s) => {
                    let notes = store.notes_list(&s.key).await?.len() as i64;
                    let summaries = store.context_delete(&s.key).await?;
                    store.session_delete(ctx.tenant(), &s.key).await?;
                    (s.message_count, notes + summaries)
                }
                None => (0, 0),
            }
        };
        // Memories outlive their session, so they are deleted even when it is gone.
        let memories_deleted = if p.memory {
            Some(
                match self
                    .engine()
                    .memory
                    .forget_session(ctx.tenant(), &p.session_key, p.purge_derived)
                    .await
                {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::error!(error = %e, "memory delete failed during reset_conversation");
                        0
                    }
                },
            )
        } else {
            None
        };
        Ok(SessionResetConversationResult {
            session_key: p.session_key,
            lcd_rows_deleted: cleared + attached,
            session_messages_cleared: cleared,
            memories_deleted,
            runtime_session_destroyed: None,
        })
    }

    async fn send(
        &self,
        ctx: &CallContext,
        p: SessionSendParams,
    ) -> Result<SessionSendResult, GatewayError> {
        let engine = self.engine().clone();
        // The rule let the call through: the key is the caller's, or does not exist and names
        // no other tenant. Storage errors are errors, never "not found".
        let existing = engine
            .store
            .session_get(ctx.tenant(), &p.session_key)
            .await?;
        let (agent, session) = match existing {
            Some(s) => {
                let agent = engine
                    .agents
                    .require(p.agent_id.as_deref().unwrap_or(&s.agent_id))?;
                let ident = SessionIdent::for_caller_stored(&s, &agent.id)
                    .map_err(|r| r.at("session_key"))?;
                (agent, ident)
            }
            None => {
                let Some(agent_id) = &p.agent_id else {
                    return Err(GatewayError::not_found(
                        "Session",
                        format_args!("{} (give agent_id to create it)", p.session_key),
                    ));
                };
                let agent = engine.agents.require(agent_id)?;
                // A canonical key is created as named (in the caller's tenant, or any tenant
                // an admin names); any other key is a label of a new key in the caller's own
                // tenant, so no caller can take a name away from another. Either way the owner
                // is the caller's (or the admin-named tenant's), never the gateway's.
                let named = SessionIdent::for_caller_key(ctx, &agent.id, &p.session_key);
                let ident = match named.map_err(|r| r.at("session_key"))? {
                    Some(ident) => ident,
                    None => {
                        let label = CallerKey {
                            channel: Some(SEND_CHANNEL),
                            tenant: None,
                            user: Some(&p.session_key),
                        };
                        SessionIdent::for_caller(ctx, &agent.id, label)
                            .map_err(|r| r.at("session_key"))?
                    }
                };
                (agent, ident)
            }
        };
        let started = engine
            .runs
            .start_run(RunSpec::new(agent, session, p.text, ctx))
            .await?;
        let base = SessionSendResult {
            session_key: started.row.session_key.clone(),
            run_id: started.row.run_id.clone(),
            status: SessionSendResultStatus::Accepted,
            response: None,
            tokens_used: None,
            finish_reason: None,
            error: None,
        };
        if p.mode == SessionSendParamsMode::Async {
            return Ok(base);
        }
        let wait = Duration::from_millis(p.timeout_ms.max(0) as u64);
        Ok(match tokio::time::timeout(wait, started.done).await {
            Err(_) => SessionSendResult {
                status: SessionSendResultStatus::Timeout,
                ..base
            },
            Ok(Ok((_, Some(o)))) => SessionSendResult {
                status: SessionSendResultStatus::Completed,
                response: Some(o.response.clone()),
                tokens_used: Some(o.tokens()),
                finish_reason: Some(o.finish),
                ..base
            },
            Ok(Ok((row, None))) => SessionSendResult {
                status: SessionSendResultStatus::Error,
                error: row.error,
                ..base
            },
            Ok(Err(_)) => SessionSendResult {
                status: SessionSendResultStatus::Error,
                error: Some("the run stopped unexpectedly".to_owned()),
                ..base
            },
        })
    }

    async fn spawn(
        &self,
        ctx: &CallContext,
        p: SessionSpawnParams,
    ) -> Result<SessionSpawnResult, GatewayError> {
        if p.include_parent_history != SessionSpawnParamsIncludeParentHistory::None {
            return Err(GatewayError::InvalidParams(
                "'include_parent_history': a JSON-RPC caller has no parent conversation; use none"
                    .into(),
            ));
        }
        if p.announce_channel_type.is_some() || p.announce_channel_id.is_some() {
            return Err(GatewayError::Unavailable(
                "No chat channel is configured to announce the result to".into(),
            ));
        }
        let engine: Arc<_> = self.engine().clone();
        let agent = self.agent_or_default(p.agent.as_deref())?;
        if let Some(m) = &p.model {
            if engine.providers.snapshot().model(m).is_none() {
                return Err(GatewayError::InvalidParams(format!(
                    "'model': unknown model {m}"
                )));
            }
        }
        let mut only: Option<BTreeSet<String>> = None;
        if let Some(groups) = &p.tool_groups {
            let mut set = BTreeSet::new();
            for g in groups {
                let (_, tools) = TOOL_GROUPS.iter().find(|(n, _)| n == g).ok_or_else(|| {
                    GatewayError::InvalidParams(format!(
                        "'tool_groups': unknown group '{g}' (time, memory, notes, files)"
                    ))
                })?;
                set.extend(tools.iter().map(|t| (*t).to_owned()));
            }
            only = Some(set);
        }
        for t in p.required_tools.iter().flatten() {
            let offered = engine.turns.tools().names().contains(&t.as_str())
                && agent.allows_tool_in(t, engine.turns.tools().opt_in_group(t))
                && only.as_ref().is_none_or(|o| o.contains(t));
            if !offered {
                return Err(GatewayError::InvalidParams(format!(
                    "'required_tools': {t} is not available to this run"
                )));
            }
        }
        let mut task = p.task.clone();
        if let Some(o) = &p.objective {
            task.push_str(&format!("\n\nObjective: {o}"));
        }
        for (title, items) in [
            ("Expected outputs", &p.expected_outputs),
            ("Artifacts", &p.artifact_refs),
            ("Facts", &p.domain_knowledge),
        ] {
            if let Some(items) = items.as_ref().filter(|i| !i.is_empty()) {
                task.push_str(&format!("\n\n{title}:"));
                for i in items {
                    task.push_str(&format!("\n- {i}"));
                }
            }
        }
        let child = format!("spawn-{}", uuid::Uuid::new_v4().simple());
        let child = CallerKey {
            channel: Some("subagent"),
            tenant: None,
            user: Some(&child),
        };
        let session = SessionIdent::for_caller(ctx, &agent.id, child).map_err(|r| r.at("agent"))?;
        let started = engine
            .runs
            .start_run(RunSpec {
                max_steps: p.max_steps.map(|m| m.clamp(1, 1000) as u32),
                model: p.model.clone(),
                only_tools: only,
                spawned: true,
                ..RunSpec::new(agent.clone(), session, task, ctx)
            })
            .await?;
        let row = started.row.clone();
        let base = SessionSpawnResult {
            run_id: row.run_id.clone(),
            root_run_id: row.root_run_id.clone(),
            session_key: row.session_key.clone(),
            agent_id: row.agent_id.clone(),
            status: SubagentRunStatus::Running,
            response: None,
            tokens_used: None,
            finish_reason: None,
            cost: None,
            error: None,
        };
        if p.async_ {
            return Ok(base);
        }
        Ok(match started.done.await {
            Ok((row, Some(o))) => SessionSpawnResult {
                status: run_status(&row.status),
                response: Some(o.response.clone()),
                tokens_used: Some(o.tokens()),
                finish_reason: Some(o.finish),
                cost: Some(o.cost_usd),
                ..base
            },
            Ok((row, None)) => SessionSpawnResult {
                status: run_status(&row.status),
                error: row.error,
                ..base
            },
            Err(_) => SessionSpawnResult {
                status: SubagentRunStatus::Failed,
                error: Some("the run stopped unexpectedly".to_owned()),
                ..base
            },
        })
    }

    async fn status(
        &self,
        ctx: &CallContext,
        p: SessionStatusParams,
    ) -> Result<SessionStatusResult, GatewayError> {
        let Some(key) = p.session_key else {
            return Err(GatewayError::InvalidParams(
                "'session_key' is required: a JSON-RPC caller has no session of its own".into(),
            ));
        };
        let s = self.session_row(ctx, &key).await?;
        let engine = self.engine();
        let agent = engine.agents.require(&s.agent_id)?;
        Ok(SessionStatusResult {
            session_key: s.key.clone(),
            agent_id: agent.id.clone(),
            agent_name: agent
                .config
                .name
                .clone()
                .unwrap_or_else(|| agent.id.clone()),
            model: s
                .last_model
                .clone()
                .unwrap_or_else(|| agent.model().to_owned()),
            tokens_used: TokensUsed {
                input: s.input_tokens,
                output: s.output_tokens,
                total: s.input_tokens + s.output_tokens,
            },
            cost_usd: s.cost_usd,
            steps_executed: s.last_steps,
            max_steps: i64::from(agent.max_steps()),
        })
    }
}
