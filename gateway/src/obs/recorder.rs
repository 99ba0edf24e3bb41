//! What an agent turn leaves for observability: its rows of the session index, its diagnostic
//! events, its system prompt report and its channel activity, queued behind the request (the
//! store's writer task commits them in groups). Everything is content-free: the tool results
//! are reduced to a digest, a size and an error classification here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::api::generated::types::{
    FinishReason, ObsContextBudget, ObsSystemPromptReport, ObsSystemPromptReportSectionsItem,
};
use crate::clock::now_ms;
use crate::store::obs::{ChannelTouch, DiagRow, ObsRow, PromptRow, TraceRow};
use crate::store::Store;

/// One tool call of the turn.
struct ToolTrace {
    /// Index of the tool message in the turn's message list.
    index: usize,
    name: String,
    is_error: bool,
    duration_ms: i64,
    digest: String,
    bytes: i64,
    error_kind: Option<&'static str>,
}

/// The observations of one turn, gathered while it runs.
pub struct TurnTrace {
    /// The turn's id in the session index (32 hex digits).
    pub trace_id: String,
    started: Instant,
    tools: Vec<ToolTrace>,
    budget: Option<ObsContextBudget>,
}

impl Default for TurnTrace {
    fn default() -> Self {
        Self::start()
    }
}

/// Where and how a turn ended.
pub struct TurnEnd<'a> {
    pub session_key: &'a str,
    /// Whose session it is (its events are that tenant's).
    pub tenant: &'a str,
    pub agent_id: &'a str,
    /// The channel kind (api, v1, webhook, cron, heartbeat).
    pub channel: &'a str,
    /// The transcript position of the turn's first message (its user message), when stored.
    pub first_seq: Option<i64>,
    /// Index of the user message in the turn's message list.
    pub first_index: usize,
    /// Messages of the turn (user message included).
    pub count: usize,
    pub finish: FinishReason,
    /// The model call's error kind when the turn ended in error.
    pub error_kind: Option<&'static str>,
    pub tokens: i64,
    pub cost_usd: f64,
    pub steps: u32,
    /// The answer came from a fallback model.
    pub fallback: bool,
    /// A session created by this turn.
    pub created: bool,
    /// The turn ended with an answer (its last message is the model's).
    pub answered: bool,
}

impl TurnTrace {
    pub fn start() -> Self {
        Self {
            trace_id: crate::clock::ordered_id().simple().to_string(),
            started: Instant::now(),
            tools: Vec::new(),
            budget: None,
        }
    }

    /// A tool call's result (message `index` of the turn's list).
    pub fn tool(&mut self, index: usize, name: &str, result: &str, is_error: bool, took: Duration) {
        self.tools.push(ToolTrace {
            index,
            name: name.to_owned(),
            is_error,
            duration_ms: took.as_millis() as i64,
            digest: crate::store::records::digest(result),
            bytes: result.len() as i64,
            error_kind: is_error.then(|| crate::store::records::classify_tool_error(result)),
        });
    }

    /// The context budget of the turn's first model call.
    pub fn budget(&mut self, b: ObsContextBudget) {
        self.budget = Some(b);
    }

    /// The budget recorded, if any.
    pub fn budget_of(&self) -> Option<&ObsContextBudget> {
        self.budget.as_ref()
    }

    /// Queues the turn's rows: for a stored session its inbound row, one row per tool result,
    /// its outbound row and its turn end, with the transcript positions; for an ephemeral turn
    /// its turn end only. Also the diagnostic events and the channel activity.
    pub fn finish(self, store: &Store, end: &TurnEnd<'_>) {
        let now = now_ms();
        let duration_ms = self.started.elapsed().as_millis() as i64;
        let synthetic = end.channel == "heartbeat";
        let tenant = Some(end.tenant.to_owned());
        let chat_id = end.first_seq.map(|_| end.session_key.to_owned());
        let row = |kind: &'static str, seq: i64| TraceRow {
            ts: now,
            seq,
            kind,
            session_key: end.session_key.to_owned(),
            tenant_id: tenant.clone(),
            chat_id: chat_id.clone(),
            trace_id: self.trace_id.clone(),
            agent_id: Some(end.agent_id.to_owned()),
            channel: Some(end.channel.to_owned()),
            synthetic,
            ..TraceRow::default()
        };
        // Message rows (stored sessions only) carry the message's id.
        let message = |kind: &'static str, seq: i64| TraceRow {
            message_id: Some(format!("{}#{seq}", end.session_key)),
            ..row(kind, seq)
        };
        let seq_of = |index: usize| {
            end.first_seq.unwrap_or(0) + index.saturating_sub(end.first_index) as i64
        };
        let last_seq = seq_of(end.first_index + end.count.saturating_sub(1));
        let stored = end.first_seq.is_some();
        if stored {
            store.trace_record(message("inbound", seq_of(end.first_index)));
        }
        // An ephemeral turn keeps no transcript; its tool results are still indexed.
        for t in &self.tools {
            store.trace_record(TraceRow {
                tool_name: Some(t.name.clone()),
                status: Some(if t.is_error { "error" } else { "ok" }),
                duration_ms: Some(t.duration_ms),
                error_kind: t.error_kind.map(str::to_owned),
                result_digest: Some(t.digest.clone()),
                result_bytes: Some(t.bytes),
                ..row("tool_result", seq_of(t.index))
            });
        }
        if stored && end.answered {
            store.trace_record(message("outbound", last_seq));
        }
        let degraded = end.finish != FinishReason::Stop;
        let detail = self
            .budget
            .as_ref()
            .and_then(|b| serde_json::to_string(b).ok());
        store.trace_record(TraceRow {
            status: Some(if degraded { "error" } else { "ok" }),
            duration_ms: Some(duration_ms),
            tokens: Some(end.tokens),
            cost_usd: Some(end.cost_usd),
            finish_reason: Some(end.finish.as_str()),
            error_kind: end.error_kind.map(str::to_owned),
            detail,
            fallback: end.fallback,
            ..row("turn_end", last_seq)
        });
        // Diagnostics: every stored session's turn, and every degraded turn.
        if stored && end.created {
            store.obs_record(ObsRow::Diag(DiagRow {
                ts: now,
                category: "session",
                kind: "session.created",
                tenant_id: tenant.clone(),
                agent_id: Some(end.agent_id.to_owned()),
                session_key: Some(end.session_key.to_owned()),
                channel_id: Some(end.channel.to_owned()),
                data: "{}".to_owned(),
            }));
        }
        if stored || degraded {
            let failed = self.tools.iter().filter(|t| t.is_error).count();
            let mut data = json!({
                "traceId": self.trace_id,
                "finishReason": end.finish.as_str(),
                "steps": end.steps,
                "durationMs": duration_ms,
                "tokens": end.tokens,
                "toolCalls": self.tools.len(),
                "toolFailures": failed,
            });
            if let Some(kind) = end.error_kind {
                data["errorKind"] = json!(kind);
            }
            store.obs_record(ObsRow::Diag(DiagRow {
                ts: now,
                category: "message",
                kind: if degraded {
                    "message.failed"
                } else {
                    "message.completed"
                },
                tenant_id: tenant,
                agent_id: Some(end.agent_id.to_owned()),
                session_key: stored.then(|| end.session_key.to_owned()),
                channel_id: Some(end.channel.to_owned()),
                data: data.to_string(),
            }));
        }
        store.obs_record(ObsRow::Channel(ChannelTouch {
            channel_id: channel_id(end.channel, end.tenant),
            channel_type: end.channel.to_owned(),
            ts: now,
            received: 1,
            sent: i64::from(end.answered),
        }));
    }
}

/// The channel id activity is counted under: a webhook mapping's own id (its tenant,
/// `webhook:<mapping>`), else the channel kind.
pub fn channel_id(channel: &str, tenant: &str) -> String {
    if channel == "webhook" && tenant.starts_with("webhook:") {
        tenant.to_owned()
    } else {
        channel.to_owned()
    }
}

/// Queues a diagnostic event about a failed model call.
pub fn model_call_failed(
    store: &Store,
    owner: Option<&Arc<str>>,
    agent_id: &str,
    provider: &str,
    model: &str,
    error_kind: &str,
    latency_ms: i64,
) {
    store.obs_record(ObsRow::Diag(DiagRow {
        ts: now_ms(),
        category: "usage",
        kind: "usage.failed",
        tenant_id: owner.map(|o| o.to_string()),
        agent_id: Some(agent_id.to_owned()),
        session_key: None,
        channel_id: None,
        data: json!({"provider": provider, "model": model, "errorKind": error_kind,
                     "latencyMs": latency_ms})
        .to_string(),
    }));
}

/// Queues a diagnostic event of a session's lifecycle (reset, deleted, compacted).
pub fn session_event(
    store: &Store,
    kind: &'static str,
    tenant: Option<&str>,
    session_key: &str,
    data: serde_json::Value,
) {
    store.obs_record(ObsRow::Diag(DiagRow {
        ts: now_ms(),
        category: "session",
        kind,
        tenant_id: tenant.map(str::to_owned),
        agent_id: None,
        session_key: Some(session_key.to_owned()),
        channel_id: None,
        data: data.to_string(),
    }));
}

/// A system prompt's sections for its report: (name, text, truncated).
pub struct PromptParts<'a> {
    /// The whole prompt as sent.
    pub whole: &'a str,
    pub sections: Vec<(&'static str, &'a str, bool)>,
    pub tool_count: usize,
    pub tool_schema_chars: usize,
    pub model: String,
}

/// Queues the system prompt report of a stored session's turn.
pub fn prompt_report(
    store: &Store,
    agent_id: &str,
    session_key: &str,
    trace_id: &str,
    parts: PromptParts<'_>,
) {
    let tokens = |s: &str| crate::providers::tokens::estimate_tokens(s) as i64;
    let sections: Vec<ObsSystemPromptReportSectionsItem> = parts
        .sections
        .iter()
        .filter(|(_, text, _)| !text.is_empty())
        .map(
            |(name, text, truncated)| ObsSystemPromptReportSectionsItem {
                name: (*name).to_owned(),
                chars: text.chars().count() as i64,
                estimated_tokens: tokens(text),
                truncated: *truncated,
            },
        )
        .collect();
    let report = ObsSystemPromptReport {
        agent_id: agent_id.to_owned(),
        session_id: session_key.to_owned(),
        run_id: Some(trace_id.to_owned()),
        created_at: now_ms(),
        model: Some(parts.model),
        total_chars: parts.whole.chars().count() as i64,
        estimated_tokens: tokens(parts.whole),
        sections,
        tool_count: parts.tool_count as i64,
        tool_schema_chars: parts.tool_schema_chars as i64,
        skill_count: 0,
        injected_files: Vec::new(),
    };
    let Ok(json) = serde_json::to_string(&report) else {
        return;
    };
    store.obs_record(ObsRow::Prompt(PromptRow {
        session_key: session_key.to_owned(),
        agent_id: agent_id.to_owned(),
        run_id: Some(trace_id.to_owned()),
        created_at: report.created_at,
        report: json,
    }));
}

/// Queues a diagnostic event of a webhook delivery (operator only: no token is a mapping's
/// tenant). `data` must be content-free (names, codes, counts).
pub fn webhook_event(
    store: &Store,
    kind: &'static str,
    mapping: Option<&str>,
    session_key: Option<&str>,
    data: serde_json::Value,
) {
    store.obs_record(ObsRow::Diag(DiagRow {
        ts: now_ms(),
        category: "webhook",
        kind,
        tenant_id: None,
        agent_id: None,
        session_key: session_key.map(str::to_owned),
        channel_id: mapping.map(|m| format!("webhook:{m}")),
        data: data.to_string(),
    }));
}
