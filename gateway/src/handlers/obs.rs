//! `obs.*`: billing over the usage rows and their hourly rollup, diagnostics, the session index
//! (search, tail, export), post-mortems and fleet health, system prompt reports, context
//! pipeline and DAG snapshots, channel activity, resets.

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::ObsApi;
use crate::api::generated::types::*;
use crate::api::CallContext;
use crate::clock::now_ms;
use crate::store::filter;
use crate::store::obs::{
    usage_facts, DiagQuery, ObsTable, Sums, TraceQuery, TraceView, UsageWindow,
};
use crate::store::records::{Depth, ExplainInput, FleetInput, RefKind, SessionFacts};
use crate::store::usage::{hour_of, HOUR_MS};

/// Rounds a dollar figure to micro-dollars, so sums over different groupings read alike.
fn usd(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

fn totals(s: &Sums) -> ObsBillingTotals {
    ObsBillingTotals {
        total_cost: usd(s.cost_usd),
        total_tokens: s.input_tokens + s.output_tokens,
        call_count: s.calls,
        total_cache_saved: usd(s.cache_saved_usd),
    }
}

fn trace_row(v: TraceView) -> ObsTraceRow {
    let f = v.fact;
    ObsTraceRow {
        ts: f.ts,
        seq: f.seq,
        kind: match f.kind.as_str() {
            "inbound" => ObsTraceRowKind::Inbound,
            "outbound" => ObsTraceRowKind::Outbound,
            "tool_call" => ObsTraceRowKind::ToolCall,
            "tool_result" => ObsTraceRowKind::ToolResult,
            "turn_end" => ObsTraceRowKind::TurnEnd,
            _ => ObsTraceRowKind::Error,
        },
        session_key: f.session_key,
        chat_id: v.chat_id,
        message_id: v.message_id,
        trace_id: Some(f.trace_id),
        agent_id: f.agent_id,
        channel: v.channel,
        tool_name: f.tool_name,
        status: f.status.as_deref().map(|s| match s {
            "ok" => ObsTraceRowStatus::Ok,
            "skipped" => ObsTraceRowStatus::Skipped,
            _ => ObsTraceRowStatus::Error,
        }),
        duration_ms: f.duration_ms,
        tokens: f.tokens,
        cost_usd: f.cost_usd,
        synthetic: f.synthetic,
        finish_reason: f.finish_reason.as_deref().and_then(FinishReason::from_wire),
        error_kind: f.error_kind,
    }
}

/// `since` of obs.trace.search: a relative duration (30m, 6h, 1d) before `now`, or an ISO 8601
/// date (midnight UTC) or date-time.
fn parse_since(s: &str, now: i64) -> Result<i64, GatewayError> {
    let bad = || {
        GatewayError::InvalidParams(format!(
            "'since': '{s}' is neither a duration (30m, 6h, 1d) nor an ISO 8601 date or date-time"
        ))
    };
    if let Some(split) = s.find(|c: char| !c.is_ascii_digit()) {
        let (n, unit) = s.split_at(split);
        if !n.is_empty() && !s.contains('-') {
            let n: i64 = n.parse().map_err(|_| bad())?;
            let ms = match unit {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                _ => return Err(bad()),
            };
            return Ok(now.saturating_sub(n.saturating_mul(ms)));
        }
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.timestamp_millis());
    }
    // A date-time without seconds (2026-11-23T10:00Z).
    if let Some((date, rest)) = s.split_once('T') {
        let zone_at = rest.find(['Z', '+', '-']).ok_or_else(bad)?;
        let (time, zone) = rest.split_at(zone_at);
        if time.len() == 5 {
            if let Ok(t) = chrono::DateTime::parse_from_rfc3339(&format!("{date}T{time}:00{zone}"))
            {
                return Ok(t.timestamp_millis());
            }
        }
        return Err(bad());
    }
    let date = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").map_err(|_| bad())?;
    Ok(date
        .and_hms_opt(0, 0, 0)
        .ok_or_else(bad)?
        .and_utc()
        .timestamp_millis())
}

fn channel_activity(c: crate::store::obs::ChannelTouch) -> ObsChannelActivity {
    ObsChannelActivity {
        channel_id: c.channel_id,
        channel_type: c.channel_type,
        last_active_at: c.ts,
        messages_sent: c.sent,
        messages_received: c.received,
    }
}

/// The channel label of cron sessions.
const CRON_CHANNEL: &str = crate::store::sessions::InternalChannel::Cron.label();
/// Gated fires of a job `obs.explain` reads (newest first): the full depth's cap.
const GATE_RUNS_READ: i64 = crate::obs::explain::FULL_ORCHESTRATE as i64;

impl Rpc {
    /// The stored facts of one session for obs.explain; None when it has neither a sessions
    /// row nor index rows.
    async fn session_facts(
        &self,
        key: &str,
        include_synthetic: bool,
    ) -> Result<Option<SessionFacts>, GatewayError> {
        let store = &self.engine().store;
        let row = store.session_row_facts(key).await?;
        let (trace, last_detail) = store.trace_of_session(key).await?;
        // A cron job's session: its gated fires (a job whose gate skipped every fire has no
        // turn, but its session still resolves to the gate runs).
        let gated = match crate::store::sessions::key_parts(key) {
            Some([agent, channel, owner, job]) if channel == CRON_CHANNEL => {
                store
                    .gated_fires_of_job(&job, &owner, &agent, GATE_RUNS_READ)
                    .await?
            }
            _ => Vec::new(),
        };
        if row.is_none() && trace.is_empty() && gated.is_empty() {
            return Ok(None);
        }
        let usage = usage_facts(&store.usage_sums_of_session(key, None).await?);
        let last_end = trace.iter().rev().find(|t| t.kind == "turn_end");
        let mut facts = SessionFacts {
            session_key: key.to_owned(),
            last_trace_id: last_end.map(|t| t.trace_id.clone()),
            usage,
            context_budget: last_detail.and_then(|d| serde_json::from_str(&d).ok()),
            include_synthetic,
            ..SessionFacts::default()
        };
        let row_missing = row.is_none();
        match row {
            Some(r) => {
                facts.agent_id = Some(r.agent_id);
                facts.channel = Some(r.channel);
                facts.created_at = r.created_at;
                facts.updated_at = r.updated_at;
                facts.turns = r.turns;
                facts.last_finish_reason = r.last_finish_reason;
                facts.last_error_kind = r.last_error_kind;
                facts.tool_results = store.session_tool_results(key).await?;
            }
            None => {
                // An ephemeral turn (a /v1 completion): its index rows are all there is.
                let ends: Vec<_> = trace.iter().filter(|t| t.kind == "turn_end").collect();
                facts.agent_id = trace.iter().find_map(|t| t.agent_id.clone());
                facts.channel = crate::store::sessions::key_parts(key).map(|[_, c, _, _]| c);
                facts.turns = ends.len() as i64;
                if let (Some(first), Some(last)) = (trace.first(), ends.last()) {
                    facts.created_at = first.ts - last.duration_ms.unwrap_or(0);
                    facts.updated_at = last.ts;
                    facts.last_finish_reason = last.finish_reason.clone();
                    facts.last_error_kind = last.error_kind.clone();
                }
                facts.tool_results = trace
                    .iter()
                    .filter(|t| t.kind == "tool_result")
                    .map(|t| crate::store::records::ToolResultFact {
                        seq: t.seq,
                        tool_name: t.tool_name.clone().unwrap_or_default(),
                        is_error: t.status.as_deref() == Some("error"),
                        digest: t.result_digest.clone().unwrap_or_default(),
                        bytes: t.result_bytes.unwrap_or(0),
                        error_kind: t.error_kind.clone(),
                        recall_hits: None,
                    })
                    .collect();
            }
        }
        facts.trace = trace;
        facts.cron_gate = gated.first().map(crate::obs::orchestrate::cron_wake_gate);
        facts.orchestrate = gated
            .iter()
            .filter_map(|g| crate::obs::orchestrate::orchestrate_run(&g.record))
            .collect();
        if row_missing && facts.agent_id.is_none() {
            facts.agent_id = crate::store::sessions::key_parts(key).map(|[a, ..]| a);
            facts.channel = Some(CRON_CHANNEL.to_owned());
        }
        Ok(Some(facts))
    }
}

impl ObsApi for Rpc {
    async fn diagnostics(
        &self,
        ctx: &CallContext,
        p: ObsDiagnosticsParams,
    ) -> Result<ObsDiagnosticsResult, GatewayError> {
        let (events, counts) = self
            .engine()
            .store
            .diagnostics(
                ctx.tenant(),
                DiagQuery {
                    category: p.category.map(|c| c.as_str()),
                    session_key: None,
                    since: p.since_ms.unwrap_or(0),
                    limit: p.limit,
                },
            )
            .await?;
        Ok(ObsDiagnosticsResult {
            events: events
                .into_iter()
                .map(|e| ObsDiagnosticEvent {
                    ts: e.ts,
                    category: match e.category.as_str() {
                        "usage" => ObsDiagnosticCategory::Usage,
                        "webhook" => ObsDiagnosticCategory::Webhook,
                        "message" => ObsDiagnosticCategory::Message,
                        _ => ObsDiagnosticCategory::Session,
                    },
                    type_: e.kind,
                    agent_id: e.agent_id,
                    session_key: e.session_key,
                    channel_id: e.channel_id,
                    data: serde_json::from_str(&e.data).unwrap_or_default(),
                })
                .collect(),
            counts: counts.into_iter().collect(),
        })
    }

    async fn billing_total(
        &self,
        _ctx: &CallContext,
        p: ObsBillingTotalParams,
    ) -> Result<ObsBillingTotals, GatewayError> {
        let sums = self
            .engine()
            .store
            .usage_sums(UsageWindow {
                since: p.since_ms,
                ..UsageWindow::default()
            })
            .await?;
        Ok(totals(&Sums::total(sums.values())))
    }

    async fn billing_by_agent(
        &self,
        _ctx: &CallContext,
        p: ObsBillingByAgentParams,
    ) -> Result<ObsBillingTotals, GatewayError> {
        let sums = self
            .engine()
            .store
            .usage_sums(UsageWindow {
                since: p.since_ms,
                agent: Some(&p.agent_id),
                ..UsageWindow::default()
            })
            .await?;
        Ok(totals(&Sums::total(sums.values())))
    }

    async fn billing_by_session(
        &self,
        _ctx: &CallContext,
        p: ObsBillingBySessionParams,
    ) -> Result<ObsBillingTotals, GatewayError> {
        let s = self
            .engine()
            .store
            .usage_sums_of_session(&p.session_key, p.since_ms)
            .await?;
        Ok(totals(&s))
    }

    async fn billing_by_provider(
        &self,
        _ctx: &CallContext,
        p: ObsBillingByProviderParams,
    ) -> Result<ObsBillingByProviderResult, GatewayError> {
        let sums = self
            .engine()
            .store
            .usage_sums(UsageWindow {
                since: p.since_ms,
                ..UsageWindow::default()
            })
            .await?;
        let mut providers: Vec<ObsBillingByProviderResultProvidersItem> = sums
            .into_iter()
            .filter(|(_, s)| s.calls > 0)
            .map(|(provider, s)| ObsBillingByProviderResultProvidersItem {
                provider,
                input_tokens: s.input_tokens,
                output_tokens: s.output_tokens,
                estimated_cost_usd: usd(s.cost_usd),
            })
            .collect();
        providers.sort_by(|a, b| {
            b.estimated_cost_usd
                .total_cmp(&a.estimated_cost_usd)
                .then_with(|| a.provider.cmp(&b.provider))
        });
        Ok(ObsBillingByProviderResult { providers })
    }

    async fn billing_usage24h(
        &self,
        _ctx: &CallContext,
        _p: ObsBillingUsage24hParams,
    ) -> Result<Vec<ObsHourlyUsage>, GatewayError> {
        let first = hour_of(now_ms()) - 23 * HOUR_MS;
        let by_hour = self.engine().store.usage_tokens_by_hour(first).await?;
        Ok((0..24)
            .map(|i| {
                let start = first + i * HOUR_MS;
                ObsHourlyUsage {
                    hour: (start / HOUR_MS).rem_euclid(24),
                    tokens: by_hour.get(&start).copied().unwrap_or(0),
                }
            })
            .collect())
    }

    async fn get_cache_stats(
        &self,
        _ctx: &CallContext,
        _p: ObsGetCacheStatsParams,
    ) -> Result<ObsGetCacheStatsResult, GatewayError> {
        let sums = self
            .engine()
            .store
            .usage_sums(UsageWindow::default())
            .await?;
        let all = Sums::total(sums.values());
        Ok(ObsGetCacheStatsResult {
            hits: all.cache_hits,
            misses: all.misses(),
            hit_rate: all.hit_rate(),
            cached_tokens: all.cached_tokens,
            total_cache_saved: usd(all.cache_saved_usd),
            providers: sums
                .iter()
                .filter(|(_, s)| s.calls > 0)
                .map(|(provider, s)| ObsGetCacheStatsResultProvidersItem {
                    provider: provider.clone(),
                    hits: s.cache_hits,
                    misses: s.misses(),
                    hit_rate: s.hit_rate(),
                    cached_tokens: s.cached_tokens,
                })
                .collect(),
        })
    }

    async fn cache_stats_window(
        &self,
        _ctx: &CallContext,
        p: ObsCacheStatsWindowParams,
    ) -> Result<ObsCacheStatsWindowResult, GatewayError> {
        let until = p.until_ms.unwrap_or_else(now_ms);
        if until < p.since_ms {
            return Err(GatewayError::InvalidParams(format!(
                "'untilMs' ({until}) is before 'sinceMs' ({})",
                p.since_ms
            )));
        }
        let sums = self
            .engine()
            .store
            .usage_sums(UsageWindow {
                since: Some(p.since_ms),
                until: Some(until),
                agent: p.agent.as_deref(),
                provider: p.provider.as_deref(),
            })
            .await?;
        let s = Sums::total(sums.values());
        Ok(ObsCacheStatsWindowResult {
            window: ObsCacheStatsWindowResultWindow {
                since_ms: p.since_ms,
                until_ms: until,
                call_count: s.calls,
                hits: s.cache_hits,
                misses: s.misses(),
                hit_rate: s.hit_rate(),
                input_tokens: s.input_tokens,
                cached_tokens: s.cached_tokens,
                cache_write_tokens: s.cache_write_tokens,
                total_cache_saved: usd(s.cache_saved_usd),
            },
        })
    }

    async fn channels_all(
        &self,
        _ctx: &CallContext,
        _p: ObsChannelsAllParams,
    ) -> Result<ObsChannelsAllResult, GatewayError> {
        let rows = self.engine().store.channel_activity(None).await?;
        Ok(ObsChannelsAllResult {
            channels: rows.into_iter().map(channel_activity).collect(),
        })
    }

    async fn channels_get(
        &self,
        _ctx: &CallContext,
        p: ObsChannelsGetParams,
    ) -> Result<ObsChannelsGetResult, GatewayError> {
        let rows = self
            .engine()
            .store
            .channel_activity(Some(&p.channel_id))
            .await?;
        Ok(ObsChannelsGetResult {
            channel: rows.into_iter().next().map(channel_activity),
        })
    }

    async fn channels_stale(
        &self,
        _ctx: &CallContext,
        p: ObsChannelsStaleParams,
    ) -> Result<ObsChannelsStaleResult, GatewayError> {
        let now = now_ms();
        let mut stale: Vec<_> = self
            .engine()
            .store
            .channel_activity(None)
            .await?
            .into_iter()
            .filter(|c| now - c.ts > p.threshold_ms)
            .collect();
        stale.sort_by(|a, b| {
            a.ts.cmp(&b.ts)
                .then_with(|| a.channel_id.cmp(&b.channel_id))
        });
        Ok(ObsChannelsStaleResult {
            stale: stale.into_iter().map(channel_activity).collect(),
        })
    }

    async fn delivery_recent(
        &self,
        _ctx: &CallContext,
        _p: ObsDeliveryRecentParams,
    ) -> Result<ObsDeliveryRecentResult, GatewayError> {
        // Nothing is delivered to chat platforms yet (the channel adapters are not built), so
        // there is no delivery to show; never invented.
        Ok(ObsDeliveryRecentResult {
            deliveries: Vec::new(),
        })
    }

    async fn delivery_stats(
        &self,
        _ctx: &CallContext,
        _p: ObsDeliveryStatsParams,
    ) -> Result<ObsDeliveryStatsResult, GatewayError> {
        Ok(ObsDeliveryStatsResult {
            total: 0,
            successes: 0,
            failures: 0,
            avg_latency_ms: 0.0,
        })
    }

    async fn context_dag(
        &self,
        _ctx: &CallContext,
        p: ObsContextDagParams,
    ) -> Result<ObsContextDagResult, GatewayError> {
        let store = &self.engine().store;
        let shapes = store.session_shapes(p.agent_id.as_deref(), p.limit).await?;
        let mut snapshots = Vec::with_capacity(shapes.len());
        for s in shapes {
            let compactions = store.compactions_of(&s.session_key, 20).await?;
            // Summaries are the nodes of the tree plus the system message the old
            // session.compact stored; depths count from the messages (a leaf is 1).
            let (tree_nodes, tree_depth) = store.context_shape(&s.session_key).await?;
            let legacy_depth = i64::from(s.summaries > 0);
            snapshots.push(ObsContextDagResultSnapshotsItem {
                agent_id: s.agent_id,
                session_key: s.session_key,
                updated_at: s.updated_at,
                node_count: s.messages + tree_nodes,
                message_nodes: s.messages - s.summaries,
                summary_nodes: s.summaries + tree_nodes,
                max_depth: tree_depth.map_or(legacy_depth, |d| (d + 1).max(legacy_depth)),
                total_tokens: s.tokens,
                compactions,
            });
        }
        Ok(ObsContextDagResult { snapshots })
    }

    async fn context_pipeline(
        &self,
        _ctx: &CallContext,
        p: ObsContextPipelineParams,
    ) -> Result<ObsContextPipelineResult, GatewayError> {
        let engine = self.engine();
        if let Some(id) = &p.agent_id {
            engine.agents.require(id)?;
        }
        let snap = engine.providers.snapshot();
        let mut pipelines = Vec::new();
        for agent in engine.agents.all() {
            if p.agent_id.as_ref().is_some_and(|id| *id != agent.id) {
                continue;
            }
            if pipelines.len() as i64 >= p.limit {
                break;
            }
            let Some(model) = snap.model(agent.model()) else {
                continue;
            };
            let window = model.context_window;
            let reserve = model.max_output_tokens.unwrap_or(1024).min(window / 4);
            let last = engine.obs.budget(&agent.id);
            let layer = |name: &str, budget: u64, used: Option<i64>| {
                ObsContextPipelineResultPipelinesItemLayersItem {
                    name: name.to_owned(),
                    enabled: true,
                    budget_tokens: budget as i64,
                    last_used_tokens: used,
                }
            };
            let input = window.saturating_sub(reserve);
            pipelines.push(ObsContextPipelineResultPipelinesItem {
                agent_id: agent.id.clone(),
                model: model.id(),
                window_tokens: window as i64,
                output_headroom_tokens: reserve as i64,
                layers: vec![
                    layer("system", input, last.as_ref().map(|b| b.system_tokens)),
                    layer(
                        "history",
                        last.as_ref()
                            .map_or(input, |b| b.budgeted_history_tokens.max(0) as u64),
                        last.as_ref().map(|b| {
                            b.assembled_input_tokens - b.system_tokens - b.fresh_tail_tokens
                        }),
                    ),
                    layer("message", input, last.as_ref().map(|b| b.fresh_tail_tokens)),
                ],
            });
        }
        Ok(ObsContextPipelineResult { pipelines })
    }

    async fn trace_search(
        &self,
        _ctx: &CallContext,
        p: ObsTraceSearchParams,
    ) -> Result<ObsTraceSearchResult, GatewayError> {
        let now = now_ms();
        let horizon = self.engine().obs.trace_horizon(now);
        let since = match &p.since {
            Some(s) => parse_since(s, now)?.max(horizon),
            None => horizon,
        };
        let filter = match &p.where_ {
            Some(w) => filter::parse(w)
                .map_err(|e| GatewayError::InvalidParams(format!("'where': {e}")))?,
            None => filter::Filter::default(),
        };
        let rows = self
            .engine()
            .store
            .trace_search(&TraceQuery {
                since,
                message_id: p.message_id.as_deref(),
                trace_id: p.trace_id.as_deref(),
                chat_id: p.chat_id.as_deref(),
                filter,
                include_synthetic: p.include_synthetic,
                limit: p.limit,
            })
            .await?;
        Ok(ObsTraceSearchResult {
            rows: rows.into_iter().map(trace_row).collect(),
        })
    }

    async fn trace_tail(
        &self,
        _ctx: &CallContext,
        p: ObsTraceTailParams,
    ) -> Result<ObsTraceTailResult, GatewayError> {
        let now = now_ms();
        let since = p
            .since_ms
            .unwrap_or(now - 5 * 60_000)
            .max(self.engine().obs.trace_horizon(now));
        let rows = self
            .engine()
            .store
            .trace_tail(&p.chat_id, since, p.limit)
            .await?;
        let next = rows.last().map_or(since, |r| r.fact.ts);
        Ok(ObsTraceTailResult {
            events: rows.into_iter().map(trace_row).collect(),
            next_since_ms: next.max(0),
        })
    }

    async fn trace_export(
        &self,
        ctx: &CallContext,
        p: ObsTraceExportParams,
    ) -> Result<ObsTraceExportResult, GatewayError> {
        let engine = self.engine();
        let store = &engine.store;
        let session = store.session_get(ctx.tenant(), &p.session_id).await?;
        let (trace, _) = store.trace_of_session(&p.session_id).await?;
        if session.is_none() && trace.is_empty() {
            return Err(GatewayError::not_found("Session", &p.session_id));
        }
        let messages = match &session {
            Some(_) => {
                store
                    .session_all_messages(ctx.tenant(), &p.session_id)
                    .await?
            }
            None => Vec::new(),
        };
        let (diagnostics, _) = store
            .diagnostics(
                ctx.tenant(),
                DiagQuery {
                    session_key: Some(&p.session_id),
                    limit: 10_000,
                    ..DiagQuery::default()
                },
            )
            .await?;
        let bundle = serde_json::json!({
            "bundleVersion": 1,
            "sessionKey": p.session_id,
            "createdAt": now_ms(),
            "session": session.as_ref().map(|s| serde_json::json!({
                "agentId": s.agent_id, "channel": s.channel, "tenantId": s.tenant_id,
                "createdAt": s.created_at, "updatedAt": s.updated_at,
            })),
            "messages": messages.iter().map(crate::runtime::sessions::to_wire).collect::<Vec<_>>(),
            "trajectory": trace.iter().map(|t| serde_json::json!({
                "ts": t.ts, "seq": t.seq, "kind": t.kind, "traceId": t.trace_id,
                "toolName": t.tool_name, "status": t.status, "durationMs": t.duration_ms,
                "tokens": t.tokens, "costUsd": t.cost_usd, "finishReason": t.finish_reason,
                "errorKind": t.error_kind, "synthetic": t.synthetic,
            })).collect::<Vec<_>>(),
            "diagnostics": diagnostics.iter()
                .map(|d| serde_json::json!({"ts": d.ts, "category": d.category, "type": d.kind,
                    "data": serde_json::from_str::<serde_json::Value>(&d.data).unwrap_or_default()}))
                .collect::<Vec<_>>(),
        });
        let mut text = serde_json::to_string_pretty(&bundle)
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        // Secrets that ended up in a transcript (a pasted key) do not leave in a bundle.
        for secret in crate::app::config_writes::known_secrets(&self.state) {
            if let Ok(quoted) = serde_json::to_string(&secret) {
                let inner = &quoted[1..quoted.len() - 1];
                if !inner.is_empty() {
                    text = text.replace(inner, crate::config::REDACTED);
                }
            }
        }
        let dir = engine.data_dir.join("traces");
        let created_at = now_ms();
        let name: String = p
            .session_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(100)
            .collect();
        let path = dir.join(format!("{name}-{created_at}.json"));
        let bytes = text.len() as i64;
        let written = path.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            crate::secrets::write_private_atomic(&written, &text)
        })
        .await
        .map_err(|e| GatewayError::Internal(e.to_string()))?
        .map_err(|e| GatewayError::Internal(format!("cannot write the trace bundle: {e}")))?;
        let abs = std::path::absolute(&path).unwrap_or(path);
        Ok(ObsTraceExportResult {
            bundle_path: abs.display().to_string(),
            bytes,
            created_at,
        })
    }

    async fn system_prompt_report_latest(
        &self,
        _ctx: &CallContext,
        p: ObsSystemPromptReportLatestParams,
    ) -> Result<ObsSystemPromptReportLatestResult, GatewayError> {
        let reports = self
            .engine()
            .store
            .prompt_reports(&p.session_id, Some(&p.agent_id), p.run_id.as_deref(), 1)
            .await?;
        Ok(ObsSystemPromptReportLatestResult {
            report: reports.first().and_then(|r| serde_json::from_str(r).ok()),
        })
    }

    async fn system_prompt_report_list(
        &self,
        _ctx: &CallContext,
        p: ObsSystemPromptReportListParams,
    ) -> Result<ObsSystemPromptReportListResult, GatewayError> {
        let reports = self
            .engine()
            .store
            .prompt_reports(&p.session_id, None, None, p.limit)
            .await?;
        Ok(ObsSystemPromptReportListResult {
            reports: reports
                .iter()
                .filter_map(|r| serde_json::from_str(r).ok())
                .collect(),
        })
    }

    async fn reset(
        &self,
        _ctx: &CallContext,
        _p: ObsResetParams,
    ) -> Result<ObsResetResult, GatewayError> {
        let store = &self.engine().store;
        let rows = ObsResetResultRowsDeleted {
            token_usage: store.obs_reset(ObsTable::TokenUsage).await?,
            delivery: store.obs_reset(ObsTable::Delivery).await?,
            diagnostics: store.obs_reset(ObsTable::Diagnostics).await?,
            channels: store.obs_reset(ObsTable::Channels).await?,
            trace_index: store.obs_reset(ObsTable::TraceIndex).await?,
            prompt_reports: store.obs_reset(ObsTable::PromptReports).await?,
        };
        self.engine()
            .emit_operator("observability:reset", serde_json::json!({"table": "all"}));
        Ok(ObsResetResult {
            reset: true,
            rows_deleted: rows,
        })
    }

    async fn reset_table(
        &self,
        _ctx: &CallContext,
        p: ObsResetTableParams,
    ) -> Result<ObsResetTableResult, GatewayError> {
        let (table, out) = match p.table {
            ObsResetTableParamsTable::TokenUsage => {
                (ObsTable::TokenUsage, ObsResetTableResultTable::TokenUsage)
            }
            ObsResetTableParamsTable::Delivery => {
                (ObsTable::Delivery, ObsResetTableResultTable::Delivery)
            }
            ObsResetTableParamsTable::Diagnostics => {
                (ObsTable::Diagnostics, ObsResetTableResultTable::Diagnostics)
            }
            ObsResetTableParamsTable::Channels => {
                (ObsTable::Channels, ObsResetTableResultTable::Channels)
            }
            ObsResetTableParamsTable::TraceIndex => {
                (ObsTable::TraceIndex, ObsResetTableResultTable::TraceIndex)
            }
            ObsResetTableParamsTable::PromptReports => (
                ObsTable::PromptReports,
                ObsResetTableResultTable::PromptReports,
            ),
        };
        let rows_deleted = self.engine().store.obs_reset(table).await?;
        self.engine().emit_operator(
            "observability:reset",
            serde_json::json!({"table": out.as_str()}),
        );
        Ok(ObsResetTableResult {
            reset: true,
            table: out,
            rows_deleted,
        })
    }

    async fn explain(
        &self,
        _ctx: &CallContext,
        p: ObsExplainParams,
    ) -> Result<ObsIncidentReport, GatewayError> {
        let (kind, value) = match (&p.session_key, &p.trace_id, &p.root_run_id) {
            (Some(k), _, _) => (RefKind::SessionKey, k.clone()),
            (None, Some(t), _) => (RefKind::TraceId, t.clone()),
            (None, None, Some(r)) => (RefKind::RootRunId, r.clone()),
            (None, None, None) => {
                return Err(GatewayError::InvalidParams(
                    "one of 'sessionKey', 'traceId' or 'rootRunId' is required".to_owned(),
                ))
            }
        };
        let store = &self.engine().store;
        let key = match kind {
            RefKind::SessionKey => Some(value.clone()),
            RefKind::TraceId => store.trace_session_of(&value).await?,
            RefKind::RootRunId => store.run_session_of(&value).await?,
        };
        let session = match &key {
            Some(k) => self.session_facts(k, p.include_synthetic).await?,
            None => None,
        };
        Ok(crate::obs::explain::explain(&ExplainInput {
            kind,
            value,
            depth: match p.depth {
                ObsExplainParamsDepth::Summary => Depth::Summary,
                ObsExplainParamsDepth::Full => Depth::Full,
            },
            session,
        }))
    }

    async fn fleet_health(
        &self,
        _ctx: &CallContext,
        p: ObsFleetHealthParams,
    ) -> Result<ObsFleetHealthReport, GatewayError> {
        let store = &self.engine().store;
        let end = now_ms();
        let start = end - (p.since_hours * 3_600_000.0) as i64;
        let rows = store.trace_window(start, end).await?;
        let sums = store
            .usage_sums(UsageWindow {
                since: Some(start),
                until: Some(end + 1),
                ..UsageWindow::default()
            })
            .await?;
        Ok(crate::obs::health::fleet_health(&FleetInput {
            since_hours: p.since_hours,
            start_ms: start,
            end_ms: end,
            rows,
            cost: usage_facts(&Sums::total(sums.values())),
            served_below_configured: store.trace_fallback_turns(start, end).await?,
            provider_failures: store.usage_failures(start, end).await?,
            gate_fires: store.gate_fires(start, end).await?,
            runs: store.runs_window(start, end).await?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_since;

    #[test]
    fn since_reads_durations_dates_and_date_times() {
        let now = 10 * 86_400_000;
        assert_eq!(parse_since("30m", now).unwrap(), now - 1_800_000);
        assert_eq!(parse_since("6h", now).unwrap(), now - 6 * 3_600_000);
        assert_eq!(parse_since("1d", now).unwrap(), now - 86_400_000);
        assert_eq!(parse_since("250ms", now).unwrap(), now - 250);
        assert_eq!(parse_since("2026-11-23", now).unwrap(), 1_795_392_000_000);
        assert_eq!(
            parse_since("2026-11-23T10:00:00Z", now).unwrap(),
            1_795_392_000_000 + 36_000_000
        );
        assert_eq!(
            parse_since("2026-11-23T10:00+01:00", now).unwrap(),
            1_795_392_000_000 + 32_400_000
        );
        for bad in ["5y", "2026-13-01", "2026-11-23T25:00Z", "m"] {
            assert!(parse_since(bad, now).is_err(), "{bad}");
        }
    }
}
