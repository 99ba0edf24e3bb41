//! `obs.fleet.health`: the cross-session health report of a recent window, built from the
//! window's stored records only ([`FleetInput`]): no model call, no clock, no I/O. Equal inputs
//! give byte-identical `serde_json::to_vec` output (BTreeMaps, totally ordered sorts, fixed
//! rounding).
//!
//! Content-free like `obs.explain`: session keys, agent ids, tool names, error kinds and counts.

use std::collections::BTreeMap;

use super::explain::{
    clip, end_reason, error_kind_name, ratio, tool_name, top_count, top_failing, usd, where_value,
    ToolTally, NAME_CHARS,
};
use crate::api::generated::types::{
    ObsFleetHealthReport, ObsFleetHealthReportAutonomy, ObsFleetHealthReportAutonomyRuns,
    ObsFleetHealthReportCost, ObsFleetHealthReportCronWakeGate,
    ObsFleetHealthReportCronWakeGatePerAgentItem, ObsFleetHealthReportFindingsItem,
    ObsFleetHealthReportPipelineAuthoringGate, ObsFleetHealthReportRecentActivityItem,
    ObsFleetHealthReportSessions, ObsFleetHealthReportTopErrorKindsItem,
    ObsFleetHealthReportWindow, ObsRootCause, ObsWakeGateFires,
};
use crate::store::records::{FleetInput, GateFire, RunFact, TraceFact};

/// Most entries of `topErrorKinds` and `recentActivity`.
const TOP_N: usize = 10;
/// Provider error kinds listed in the provider_failures hint.
const PROVIDER_KINDS_SHOWN: usize = 10;
/// Longest finding hint (the catalogue's maximum).
const HINT_CHARS: usize = 500;
/// fleet_high_degraded_rate: at least this many sessions ...
const HIGH_RATE_MIN_RUN: i64 = 5;
/// ... of which at least this share ended degraded.
const HIGH_RATE: f64 = 0.5;
/// fleet_acute_degradation: at least this many degraded ends ...
const ACUTE_MIN: i64 = 3;
/// ... within this long before the end of the window.
const ACUTE_WINDOW_MS: i64 = 3_600_000;
/// fleet_recurring_health_signal: a finding with at least this count.
const RECURRING_MIN: i64 = 3;
/// cron_wake_gate_efficiency: the fail-open rate from which it is a finding.
const FAIL_OPEN_RATE: f64 = 0.2;
/// orchestrate_efficiency: the share of refused socket calls from which it is a finding.
const REFUSED_CALL_RATE: f64 = 0.2;

const STEP_PROVIDER_HEALTH: &str =
    "Check provider health and failed calls with providers.list and obs.billing.byProvider";
const STEP_FALLBACK: &str =
    "Give the agents fallbackModels with agents.update so another model answers when the primary fails";

/// How one session of the window ended (its last turn_end row by ts, then seq).
struct SessionEnd<'a> {
    key: &'a str,
    agent_id: Option<&'a str>,
    ended_at: i64,
    end_reason: String,
    degraded: bool,
}

/// Builds the fleet health report of `input`. Pure: equal inputs give byte-identical reports.
pub fn fleet_health(input: &FleetInput) -> ObsFleetHealthReport {
    // The store passes non-synthetic rows only; a synthetic one is left out here too.
    let rows: Vec<&TraceFact> = input.rows.iter().filter(|r| !r.synthetic).collect();

    // Sessions: the ones with a turn_end row in the window, ended by their last one.
    let mut last_end: BTreeMap<&str, &TraceFact> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.kind == "turn_end") {
        let slot = last_end.entry(r.session_key.as_str()).or_insert(r);
        // At an equal (ts, seq) the later row of the input (id order) wins.
        if (r.ts, r.seq) >= (slot.ts, slot.seq) {
            *slot = r;
        }
    }
    let mut sessions: Vec<SessionEnd<'_>> = last_end
        .into_iter()
        .map(|(key, r)| {
            let end_reason = end_reason(r.finish_reason.as_deref(), r.error_kind.as_deref());
            SessionEnd {
                key,
                agent_id: r.agent_id.as_deref(),
                ended_at: r.ts,
                degraded: end_reason != "stop",
                end_reason,
            }
        })
        .collect();
    // Newest end first; ties by session key.
    sessions.sort_by(|a, b| b.ended_at.cmp(&a.ended_at).then_with(|| a.key.cmp(b.key)));

    let run = sessions.len() as i64;
    let degraded = sessions.iter().filter(|s| s.degraded).count() as i64;
    let degraded_rate = ratio(degraded, run);
    let mut degraded_by_cause: BTreeMap<String, i64> = BTreeMap::new();
    for s in sessions.iter().filter(|s| s.degraded) {
        *degraded_by_cause.entry(s.end_reason.clone()).or_default() += 1;
    }

    // Tools: ok and failed per tool, error kinds over all failures. A skipped call (not run)
    // is neither.
    let mut tally: BTreeMap<String, ToolTally> = BTreeMap::new();
    let mut kinds: BTreeMap<String, i64> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.kind == "tool_result") {
        let failed = r.status.as_deref() == Some("error");
        if r.status.as_deref() == Some("skipped") {
            continue;
        }
        tally
            .entry(tool_name(r.tool_name.as_deref()))
            .or_default()
            .add(failed, r.error_kind.as_deref());
        if failed {
            *kinds
                .entry(error_kind_name(r.error_kind.as_deref()))
                .or_default() += 1;
        }
    }
    let failed_calls: i64 = kinds.values().sum();
    let mut top_error_kinds: Vec<(String, i64)> = kinds.into_iter().collect();
    top_error_kinds.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top_error_kinds.truncate(TOP_N);

    let breaker_trips = rows
        .iter()
        .filter(|r| r.kind == "turn_end" && r.finish_reason.as_deref() == Some("circuit_open"))
        .count() as i64;

    let gate = cron_wake_gate(&input.gate_fires);
    let autonomy = autonomy(&input.runs);

    let mut findings = findings(
        input,
        &tally,
        top_error_kinds.first(),
        failed_calls,
        breaker_trips,
        gate.as_ref(),
    );
    if let Some(a) = &autonomy {
        findings.extend(autonomy_findings(a));
    }
    let most_recent_degraded = sessions.iter().find(|s| s.degraded).map(|s| s.key);
    let cause = root_cause(&Ctx {
        input,
        sessions: &sessions,
        run,
        degraded,
        degraded_rate,
        degraded_by_cause: &degraded_by_cause,
        findings: &findings,
        tally: &tally,
        most_recent_degraded,
        autonomy: autonomy.as_ref(),
    });

    ObsFleetHealthReport {
        schema_version: 1,
        window: ObsFleetHealthReportWindow {
            since_hours: input.since_hours,
            start_ms: input.start_ms,
            end_ms: input.end_ms,
        },
        sessions: ObsFleetHealthReportSessions {
            run,
            degraded,
            degraded_rate,
        },
        degraded_by_cause,
        top_error_kinds: top_error_kinds
            .into_iter()
            .map(|(error_kind, count)| ObsFleetHealthReportTopErrorKindsItem { error_kind, count })
            .collect(),
        breaker_trips,
        tool_stats: tally.iter().map(|(k, t)| (k.clone(), t.stat())).collect(),
        cost: ObsFleetHealthReportCost {
            cost_usd: usd(input.cost.cost_usd),
            total_tokens: input
                .cost
                .input_tokens
                .max(0)
                .saturating_add(input.cost.output_tokens.max(0)),
            call_count: input.cost.calls.max(0),
        },
        recent_activity: sessions
            .iter()
            .take(TOP_N)
            .map(|s| ObsFleetHealthReportRecentActivityItem {
                session_key: s.key.to_owned(),
                agent_id: s.agent_id.map(|a| clip(a, NAME_CHARS)),
                ended_at: s.ended_at,
                end_reason: s.end_reason.clone(),
                degraded: s.degraded,
            })
            .collect(),
        findings,
        likely_root_cause: cause,
        // The gateway records no pipeline-authoring invocations, so the gate never opens.
        pipeline_authoring_gate: ObsFleetHealthReportPipelineAuthoringGate {
            build_author: false,
            reason: "insufficient telemetry: the gateway records no pipeline-authoring \
                     invocations"
                .to_owned(),
        },
        autonomy,
        cron_wake_gate: gate,
    }
}

/// Degraded runs (orphaned plus revoked) from which autonomy degradation is the likely root
/// cause, when they are also at least half of the window's runs.
const AUTONOMY_MIN_DEGRADED: i64 = 3;

/// The autonomy block: the background runs of the window by final status, and the root with
/// the most degraded or killed runs (ties: the higher cost, then the smaller id). None when no
/// run started or ended in the window (every run is recorded in the store, so the block's
/// absence means there was nothing to report).
fn autonomy(runs: &[RunFact]) -> Option<ObsFleetHealthReportAutonomy> {
    if runs.is_empty() {
        return None;
    }
    let count = |s: &str| runs.iter().filter(|r| r.status == s).count() as i64;
    let (orphaned, revoked, killed) = (count("orphaned"), count("revoked"), count("killed"));
    let degraded = orphaned + revoked;
    let total = runs.len() as i64;
    let mut roots: BTreeMap<&str, (i64, f64)> = BTreeMap::new();
    for r in runs {
        let bad = matches!(r.status.as_str(), "orphaned" | "revoked" | "killed");
        let slot = roots.entry(r.root_run_id.as_str()).or_default();
        slot.0 += i64::from(bad);
        slot.1 += r.cost_usd.max(0.0);
    }
    let worst = roots
        .iter()
        .filter(|(_, (bad, _))| *bad > 0)
        .max_by(|a, b| {
            (a.1 .0, a.1 .1)
                .partial_cmp(&(b.1 .0, b.1 .1))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| b.0.cmp(a.0))
        })
        .map(|(root, _)| (*root).to_owned());
    Some(ObsFleetHealthReportAutonomy {
        runs: ObsFleetHealthReportAutonomyRuns {
            total,
            degraded,
            degraded_rate: ratio(degraded, total),
        },
        orphaned,
        resumed: 0,
        revoked,
        killed,
        breaker_trips: runs
            .iter()
            .filter(|r| r.finish_reason.as_deref() == Some("circuit_open"))
            .count() as i64,
        denial_breaker_trips: runs
            .iter()
            .filter(|r| {
                r.error
                    .as_deref()
                    .is_some_and(|e| e.contains("denial breaker"))
            })
            .count() as i64,
        budget_breaches: runs
            .iter()
            .filter(|r| r.finish_reason.as_deref() == Some("budget_exceeded"))
            .count() as i64,
        cost_usd: usd(runs.iter().map(|r| r.cost_usd.max(0.0)).sum()),
        worst_root_run_id: worst,
    })
}

/// The autonomy findings, in this order, each only when its count is above 0:
/// `durable_orphaned`, `autonomy_revoked`, `autonomy_killed`, `autonomy_denial_breaker`.
fn autonomy_findings(a: &ObsFleetHealthReportAutonomy) -> Vec<ObsFleetHealthReportFindingsItem> {
    let mut out = Vec::new();
    if a.orphaned > 0 {
        out.push(finding(
            "durable_orphaned",
            a.orphaned,
            "Background runs were orphaned: the gateway (or their node) stopped before they \
             ended; see subagent.list and the restart history (obs.diagnostics)."
                .to_owned(),
        ));
    }
    if a.revoked > 0 {
        out.push(finding(
            "autonomy_revoked",
            a.revoked,
            "Runs stopped because their lease was revoked (lease.revoke); see subagent.list."
                .to_owned(),
        ));
    }
    if a.killed > 0 {
        out.push(finding(
            "autonomy_killed",
            a.killed,
            "Runs were killed (run.kill or subagent.kill); see subagent.list.".to_owned(),
        ));
    }
    if a.denial_breaker_trips > 0 {
        out.push(finding(
            "autonomy_denial_breaker",
            a.denial_breaker_trips,
            "Run trees were stopped by the denial breaker after refusals in a row (tools \
             outside their lease, or denied approvals); check the agents' tools and \
             autonomy.approvals."
                .to_owned(),
        ));
    }
    out
}

/// Fires, skips and fail-opens of a set of gated fires.
#[derive(Debug, Default, Clone, Copy)]
struct GateSums {
    fires: i64,
    skipped: i64,
    failed_open: i64,
    turns_saved: i64,
    tool_calls: i64,
}

impl GateSums {
    fn add(&mut self, f: &GateFire) {
        self.fires += 1;
        self.skipped += i64::from(f.skipped);
        self.failed_open += i64::from(f.failed_open);
        self.turns_saved = self.turns_saved.saturating_add(f.turns_saved.max(0));
        self.tool_calls = self.tool_calls.saturating_add(f.tool_calls.max(0));
    }
}

/// The cron wake gate block; None when no gated fire ran in the window.
fn cron_wake_gate(fires: &[GateFire]) -> Option<ObsFleetHealthReportCronWakeGate> {
    if fires.is_empty() {
        return None;
    }
    let mut all = GateSums::default();
    let mut per_agent: BTreeMap<&str, GateSums> = BTreeMap::new();
    for f in fires {
        all.add(f);
        per_agent.entry(f.agent_id.as_str()).or_default().add(f);
    }
    Some(ObsFleetHealthReportCronWakeGate {
        fires: ObsWakeGateFires {
            total: all.fires,
            skipped: all.skipped,
            skip_rate: ratio(all.skipped, all.fires),
            failed_open: all.failed_open,
            fail_open_rate: ratio(all.failed_open, all.fires),
        },
        turns_saved: all.turns_saved,
        tool_calls: all.tool_calls,
        per_agent: per_agent
            .into_iter()
            .map(|(agent, s)| ObsFleetHealthReportCronWakeGatePerAgentItem {
                agent_id: clip(agent, NAME_CHARS),
                fires: s.fires,
                skipped: s.skipped,
                skip_rate: ratio(s.skipped, s.fires),
                failed_open: s.failed_open,
                fail_open_rate: ratio(s.failed_open, s.fires),
                turns_saved: s.turns_saved,
                tool_calls: s.tool_calls,
            })
            .collect(),
    })
}

fn finding(code: &str, count: i64, hint: String) -> ObsFleetHealthReportFindingsItem {
    ObsFleetHealthReportFindingsItem {
        code: code.to_owned(),
        count,
        hint: clip(&hint, HINT_CHARS),
    }
}

/// The findings, most severe first, in a fixed order; each only when its count is above 0:
///
/// 1. `config_posture:served_below_configured`: turns a fallback model answered.
/// 2. `tool_failures`: failed tool results.
/// 3. `breaker_trips`: turns ended by the circuit breaker.
/// 4. `provider_failures`: failed model calls.
/// 5. `cron_wake_gate_efficiency`: gated fires that failed open, when they are at least 20 %
///    of the gated fires.
///
/// 6. `orchestrate_efficiency`: capability-socket calls of orchestrated scripts (wake gates)
///    refused by a check, when they are at least 20 % of those scripts' calls: scripts
///    calling what their lease does not hold spend their run for nothing.
///
/// The autonomy findings follow (see [`autonomy_findings`]). `voice_health`,
/// `pipeline_authoring` and `memory_lifecycle` are never produced: the gateway has no voice,
/// pipeline authoring or memory lifecycle records.
fn findings(
    input: &FleetInput,
    tally: &BTreeMap<String, ToolTally>,
    top_kind: Option<&(String, i64)>,
    failed_calls: i64,
    breaker_trips: i64,
    gate: Option<&ObsFleetHealthReportCronWakeGate>,
) -> Vec<ObsFleetHealthReportFindingsItem> {
    let mut out = Vec::new();
    if input.served_below_configured > 0 {
        out.push(finding(
            "config_posture:served_below_configured",
            input.served_below_configured,
            "Turns were answered by a fallback model instead of the agent's configured one; \
             check provider health (providers.list, obs.billing.byProvider)."
                .to_owned(),
        ));
    }
    if failed_calls > 0 {
        let kind = top_kind.map_or_else(|| "failed".to_owned(), |(k, n)| format!("{k} ({n})"));
        let tool = top_failing(tally).map_or_else(
            || "unknown".to_owned(),
            |(t, s)| format!("{t} ({})", s.failed),
        );
        out.push(finding(
            "tool_failures",
            failed_calls,
            format!(
                "Tool calls failed, most often with {kind} and most often in {tool}; see \
                 toolStats, then obs.trace.search with where \"status = error and kind = \
                 tool_result\"."
            ),
        ));
    }
    if breaker_trips > 0 {
        out.push(finding(
            "breaker_trips",
            breaker_trips,
            "Turns ended because the circuit breaker opened after consecutive tool failures; \
             find them with obs.trace.search where \"finishReason = circuit_open\", then run \
             obs.explain on their sessions."
                .to_owned(),
        ));
    }
    let mut provider: BTreeMap<&str, i64> = BTreeMap::new();
    for (kind, n) in &input.provider_failures {
        if *n > 0 {
            let slot = provider.entry(kind.as_str()).or_default();
            *slot = slot.saturating_add(*n);
        }
    }
    let provider_total: i64 = provider.values().sum();
    if provider_total > 0 {
        let mut by_count: Vec<(&str, i64)> = provider.into_iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        let listed: Vec<String> = by_count
            .iter()
            .take(PROVIDER_KINDS_SHOWN)
            .map(|(k, n)| format!("{}: {n}", error_kind_name(Some(k))))
            .collect();
        out.push(finding(
            "provider_failures",
            provider_total,
            format!(
                "Model calls failed ({}); check providers.list and obs.billing.byProvider.",
                listed.join(", ")
            ),
        ));
    }
    if let Some(g) = gate {
        if g.fires.failed_open > 0 && g.fires.fail_open_rate >= FAIL_OPEN_RATE {
            out.push(finding(
                "cron_wake_gate_efficiency",
                g.fires.failed_open,
                format!(
                    "{} of {} gated cron fires failed open (the gate failed and the model was \
                     woken anyway); check the gated jobs' runs with cron.runs.",
                    g.fires.failed_open, g.fires.total
                ),
            ));
        }
    }
    let (allowed, denied) = input.gate_fires.iter().fold((0i64, 0i64), |(a, d), f| {
        (
            a.saturating_add(f.calls_allowed.max(0)),
            d.saturating_add(f.calls_denied.max(0)),
        )
    });
    let calls = allowed.saturating_add(denied);
    if denied > 0 && ratio(denied, calls) >= REFUSED_CALL_RATE {
        out.push(finding(
            "orchestrate_efficiency",
            denied,
            format!(
                "{denied} of {calls} capability-socket calls of wake gate scripts were refused \
                 (a tool outside the run's lease, or an admin method without adminTrust); see \
                 the orchestrate entries of obs.explain on the gated jobs' sessions."
            ),
        ));
    }
    out
}

/// What the root cause is decided from.
struct Ctx<'a> {
    input: &'a FleetInput,
    sessions: &'a [SessionEnd<'a>],
    run: i64,
    degraded: i64,
    degraded_rate: f64,
    degraded_by_cause: &'a BTreeMap<String, i64>,
    findings: &'a [ObsFleetHealthReportFindingsItem],
    tally: &'a BTreeMap<String, ToolTally>,
    most_recent_degraded: Option<&'a str>,
    autonomy: Option<&'a ObsFleetHealthReportAutonomy>,
}

fn explain_step(key: &str) -> String {
    format!("Explain the most recent degraded session: obs.explain with sessionKey {key}")
}

fn cause(code: &str, detail: String, steps: Vec<String>) -> Option<ObsRootCause> {
    Some(ObsRootCause {
        code: code.to_owned(),
        detail: clip(&detail, 1000),
        suggested_next_steps: steps,
    })
}

/// The degraded turns of the window, as a search: the turn_end row of a degraded turn has
/// status error.
const STEP_SEARCH_DEGRADED: &str =
    "List the degraded turns with obs.trace.search where \"kind = turn_end and status = error\"";

/// The likely root cause, first match wins:
///
/// 1. `fleet_high_degraded_rate`: at least 5 sessions ran and at least half ended degraded.
/// 2. `fleet_acute_degradation`: at least 3 sessions ended degraded within the last hour of the
///    window.
/// 3. `fleet_config_posture`: turns were served below the configured model (a fallback).
/// 4. `fleet_recurring_health_signal`: another finding counts at least 3 (the first such, in
///    findings order).
/// 5. None.
///
/// Before them all (the spec ranks it first): `fleet_autonomy_degradation`, when at least
/// [`AUTONOMY_MIN_DEGRADED`] background runs of the window were orphaned or revoked and they
/// are at least half of its runs.
fn root_cause(c: &Ctx<'_>) -> Option<ObsRootCause> {
    let mut degraded_steps = Vec::new();
    if let Some(key) = c.most_recent_degraded {
        degraded_steps.push(explain_step(key));
    }
    degraded_steps.push(STEP_SEARCH_DEGRADED.to_owned());
    if let Some(step) = dominant(c.degraded_by_cause).and_then(cause_step) {
        degraded_steps.push(step.to_owned());
    }

    if let Some(a) = c
        .autonomy
        .filter(|a| a.runs.degraded >= AUTONOMY_MIN_DEGRADED && a.runs.degraded_rate >= HIGH_RATE)
    {
        let mut steps =
            vec!["List the runs with subagent.list (status orphaned or revoked)".to_owned()];
        if let Some(root) = &a.worst_root_run_id {
            steps.insert(
                0,
                format!("Look at the worst run tree: subagent.list, rootRunId {root}"),
            );
        }
        return cause(
            "fleet_autonomy_degradation",
            format!(
                "{} of {} background runs in the window were orphaned or revoked ({} orphaned, {} revoked).",
                a.runs.degraded, a.runs.total, a.orphaned, a.revoked
            ),
            steps,
        );
    }
    if c.run >= HIGH_RATE_MIN_RUN && c.degraded_rate >= HIGH_RATE {
        return cause(
            "fleet_high_degraded_rate",
            format!(
                "{} of {} sessions in the window ended degraded ({}).",
                c.degraded,
                c.run,
                by_cause(c.degraded_by_cause)
            ),
            degraded_steps,
        );
    }
    let since = c.input.end_ms.saturating_sub(ACUTE_WINDOW_MS);
    let acute: Vec<&SessionEnd<'_>> = c
        .sessions
        .iter()
        .filter(|s| s.degraded && s.ended_at >= since)
        .collect();
    if acute.len() as i64 >= ACUTE_MIN {
        let mut counts: BTreeMap<String, i64> = BTreeMap::new();
        for s in &acute {
            *counts.entry(s.end_reason.clone()).or_default() += 1;
        }
        // Sessions are newest first: the first is the most recent degraded one.
        let mut steps = vec![explain_step(acute[0].key)];
        steps.push(
            "List the last hour's degraded turns with obs.trace.search, since \"1h\" and where \
             \"kind = turn_end and status = error\""
                .to_owned(),
        );
        if let Some(step) = dominant(&counts).and_then(cause_step) {
            steps.push(step.to_owned());
        }
        return cause(
            "fleet_acute_degradation",
            format!(
                "{} sessions ended degraded in the last hour of the window ({}).",
                acute.len(),
                by_cause(&counts)
            ),
            steps,
        );
    }
    if c.input.served_below_configured > 0 {
        return cause(
            "fleet_config_posture",
            format!(
                "{} in the window were answered by a fallback model instead of the agent's \
                 configured model.",
                if c.input.served_below_configured == 1 {
                    "1 turn".to_owned()
                } else {
                    format!("{} turns", c.input.served_below_configured)
                }
            ),
            vec![
                STEP_PROVIDER_HEALTH.to_owned(),
                "Look at the failed model calls with obs.diagnostics".to_owned(),
            ],
        );
    }
    let recurring = c
        .findings
        .iter()
        .find(|f| f.code != "config_posture:served_below_configured" && f.count >= RECURRING_MIN)?;
    let mut steps: Vec<String> = match recurring.code.as_str() {
        "tool_failures" => match top_failing(c.tally) {
            Some((tool, _)) => vec![format!(
                "Look at the failures of {tool}: obs.trace.search with where \"toolName = {} and \
                 status = error\"",
                where_value(tool)
            )],
            None => Vec::new(),
        },
        "breaker_trips" => vec![
            "Find the tripped turns with obs.trace.search where \"finishReason = circuit_open\""
                .to_owned(),
            "Fix the failing tools, or raise agentDefaults.circuitBreakerThreshold if the \
             failures are expected"
                .to_owned(),
        ],
        "provider_failures" => vec![STEP_PROVIDER_HEALTH.to_owned(), STEP_FALLBACK.to_owned()],
        "cron_wake_gate_efficiency" => vec![
            "Look at the gated jobs' runs with cron.runs to see why their gates fail".to_owned(),
        ],
        "orchestrate_efficiency" => vec![
            "Look at the refused calls in the orchestrate entries of obs.explain on the gated \
             jobs' sessions (or subscribe to capability:audited)"
                .to_owned(),
            "Give the agent the tools its gate calls, or stop the gate calling them".to_owned(),
        ],
        _ => Vec::new(),
    };
    if let Some(key) = c.most_recent_degraded {
        steps.push(explain_step(key));
    }
    cause(
        "fleet_recurring_health_signal",
        format!(
            "The finding {} recurred {} times in the window.",
            recurring.code, recurring.count
        ),
        steps,
    )
}

/// End reasons with their counts, most frequent first (ties: alphabetical), at most 6:
/// "timeout: 3, error: 1".
fn by_cause(counts: &BTreeMap<String, i64>) -> String {
    let mut sorted: Vec<(&String, &i64)> = counts.iter().collect();
    sorted.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    let mut parts: Vec<String> = sorted
        .iter()
        .take(6)
        .map(|(k, n)| format!("{k}: {n}"))
        .collect();
    if sorted.len() > 6 {
        parts.push("...".to_owned());
    }
    parts.join(", ")
}

/// The end reason more frequent than every other one; None on a tie.
fn dominant(counts: &BTreeMap<String, i64>) -> Option<&str> {
    let (top, n) = top_count(counts)?;
    let tied = counts.iter().any(|(k, m)| *m == n && k != top);
    (!tied).then_some(top)
}

/// A next step for the most frequent degradation cause, when there is a specific one.
fn cause_step(end_reason: &str) -> Option<&'static str> {
    match end_reason {
        "error" | "timeout" => Some(STEP_PROVIDER_HEALTH),
        "circuit_open" => Some(
            "Find the tripped turns with obs.trace.search where \"finishReason = circuit_open\"",
        ),
        "max_steps" => {
            Some("Raise maxSteps with agents.update if the agents' tasks need more steps")
        }
        "budget_exceeded" => Some(
            "Compare spending with obs.billing.byAgent, then adjust budget.tokens or \
             budget.costUsd with agents.update",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str, root: &str, status: &str, cost: f64) -> RunFact {
        RunFact {
            run_id: id.into(),
            root_run_id: root.into(),
            status: status.into(),
            cost_usd: cost,
            ..RunFact::default()
        }
    }

    #[test]
    fn the_autonomy_block_counts_runs_by_final_status_and_names_the_worst_tree() {
        assert!(autonomy(&[]).is_none());
        let mut runs = vec![
            run("a", "a", "completed", 0.5),
            run("b", "a", "orphaned", 0.1),
            run("c", "c", "revoked", 0.2),
            run("d", "c", "killed", 0.0),
            run("e", "c", "revoked", 0.0),
        ];
        runs[0].error = Some("the denial breaker stopped the run tree".into());
        runs[0].finish_reason = Some("circuit_open".into());
        let a = autonomy(&runs).unwrap();
        assert_eq!((a.runs.total, a.runs.degraded), (5, 3));
        assert!((a.runs.degraded_rate - 0.6).abs() < 1e-9);
        assert_eq!((a.orphaned, a.revoked, a.killed), (1, 2, 1));
        assert_eq!((a.breaker_trips, a.denial_breaker_trips), (1, 1));
        assert!((a.cost_usd - 0.8).abs() < 1e-9);
        assert_eq!(a.worst_root_run_id.as_deref(), Some("c"));
        let codes: Vec<String> = autonomy_findings(&a).into_iter().map(|f| f.code).collect();
        assert_eq!(
            codes,
            [
                "durable_orphaned",
                "autonomy_revoked",
                "autonomy_killed",
                "autonomy_denial_breaker"
            ]
        );
        // Three degraded runs of five: autonomy degradation is the likely root cause.
        let r = fleet_health(&FleetInput {
            runs,
            ..FleetInput::default()
        });
        assert_eq!(
            r.likely_root_cause.unwrap().code,
            "fleet_autonomy_degradation"
        );
        assert!(r.autonomy.is_some());
    }
    use crate::obs::explain::assert_golden;
    use crate::store::records::UsageFacts;

    const END: i64 = 1_767_312_000_000;
    const HOUR: i64 = 3_600_000;

    fn window() -> FleetInput {
        FleetInput {
            since_hours: 24.0,
            start_ms: END - 24 * HOUR,
            end_ms: END,
            ..FleetInput::default()
        }
    }

    fn turn_end(
        key: &str,
        agent: &str,
        ts: i64,
        finish: Option<&str>,
        kind: Option<&str>,
    ) -> TraceFact {
        TraceFact {
            ts,
            seq: 7,
            kind: "turn_end".to_owned(),
            trace_id: format!("trace-{ts}"),
            session_key: key.to_owned(),
            agent_id: Some(agent.to_owned()),
            status: Some(
                if finish == Some("stop") {
                    "ok"
                } else {
                    "error"
                }
                .to_owned(),
            ),
            finish_reason: finish.map(str::to_owned),
            error_kind: kind.map(str::to_owned),
            ..TraceFact::default()
        }
    }

    fn tool(key: &str, ts: i64, name: &str, error: Option<&str>) -> TraceFact {
        TraceFact {
            ts,
            seq: 3,
            kind: "tool_result".to_owned(),
            trace_id: format!("trace-{ts}"),
            session_key: key.to_owned(),
            agent_id: Some("main".to_owned()),
            tool_name: Some(name.to_owned()),
            status: Some(if error.is_some() { "error" } else { "ok" }.to_owned()),
            error_kind: error.map(str::to_owned),
            ..TraceFact::default()
        }
    }

    fn gate(agent: &str, skipped: bool, failed_open: bool) -> GateFire {
        GateFire {
            agent_id: agent.to_owned(),
            skipped,
            failed_open,
            tool_calls: 2,
            turns_saved: i64::from(skipped),
            calls_allowed: 2,
            calls_denied: 0,
        }
    }

    fn mixed() -> FleetInput {
        let mut rows = vec![
            tool("agent:main/api#a", END - 20 * HOUR, "web_search", None),
            tool("agent:main/api#a", END - 20 * HOUR, "web_search", None),
            turn_end(
                "agent:main/api#a",
                "main",
                END - 20 * HOUR,
                Some("stop"),
                None,
            ),
            turn_end(
                "agent:main/api#b",
                "main",
                END - 10 * HOUR,
                Some("max_steps"),
                None,
            ),
            turn_end("agent:main/api#h", "main", END - 6 * HOUR, None, None),
            tool(
                "agent:ops/webhook#c",
                END - 5 * HOUR,
                "shell",
                Some("timeout"),
            ),
            tool(
                "agent:ops/webhook#c",
                END - 5 * HOUR,
                "shell",
                Some("timeout"),
            ),
            tool(
                "agent:ops/webhook#c",
                END - 5 * HOUR,
                "shell",
                Some("timeout"),
            ),
            turn_end(
                "agent:ops/webhook#c",
                "ops",
                END - 5 * HOUR,
                Some("circuit_open"),
                None,
            ),
            tool(
                "agent:main/api#g",
                END - 3 * HOUR,
                "list_dir",
                Some("repeated_call"),
            ),
            turn_end(
                "agent:main/api#g",
                "main",
                END - 3 * HOUR,
                Some("context_loop"),
                None,
            ),
            turn_end(
                "agent:research/api#f",
                "research",
                END - 2 * HOUR,
                Some("budget_exceeded"),
                None,
            ),
            tool(
                "agent:main/api#i",
                END - 70 * 60_000,
                "web_fetch",
                Some("not_found"),
            ),
            tool("agent:main/api#i", END - 70 * 60_000, "web_fetch", None),
            turn_end(
                "agent:main/api#i",
                "main",
                END - 70 * 60_000,
                Some("stop"),
                None,
            ),
            tool(
                "agent:ops/webhook#c",
                END - 50 * 60_000,
                "shell",
                Some("failed"),
            ),
            tool(
                "agent:ops/webhook#c",
                END - 50 * 60_000,
                "shell",
                Some("denied"),
            ),
            tool(
                "agent:ops/webhook#c",
                END - 50 * 60_000,
                "shell",
                Some("timeout"),
            ),
            turn_end(
                "agent:ops/webhook#c",
                "ops",
                END - 50 * 60_000,
                Some("circuit_open"),
                None,
            ),
            turn_end(
                "agent:main/v1#d",
                "main",
                END - 40 * 60_000,
                Some("error"),
                Some("rate_limited"),
            ),
            turn_end(
                "agent:main/api#e",
                "main",
                END - 30 * 60_000,
                Some("error"),
                Some("timeout"),
            ),
            // An ephemeral turn's tool results without a turn end in the window: tools only.
            tool("agent:main/api#j", END - 10 * 60_000, "read_file", None),
            tool("agent:main/api#j", END - 10 * 60_000, "read_file", None),
        ];
        // A synthetic row is never counted.
        rows.push(TraceFact {
            synthetic: true,
            ..turn_end(
                "heartbeat:main",
                "main",
                END - 60_000,
                Some("error"),
                Some("timeout"),
            )
        });
        FleetInput {
            rows,
            cost: UsageFacts {
                calls: 42,
                failed_calls: 7,
                input_tokens: 300_000,
                output_tokens: 20_000,
                cached_tokens: 120_000,
                cost_usd: 2.345_678_91,
            },
            served_below_configured: 4,
            provider_failures: vec![
                ("timeout".to_owned(), 1),
                ("server_error".to_owned(), 3),
                ("rate_limited".to_owned(), 3),
            ],
            gate_fires: vec![
                gate("main", true, false),
                gate("main", true, false),
                gate("main", false, true),
                gate("ops", false, true),
                gate("ops", false, false),
            ],
            ..window()
        }
    }

    fn code(r: &ObsFleetHealthReport) -> Option<&str> {
        r.likely_root_cause.as_ref().map(|c| c.code.as_str())
    }

    #[test]
    fn reports_match_their_golden_files() {
        assert_golden("fleet_mixed", &fleet_health(&mixed()));
        assert_golden("fleet_empty", &fleet_health(&window()));
    }

    #[test]
    fn equal_inputs_give_identical_bytes() {
        for i in [mixed(), window()] {
            let a = serde_json::to_vec(&fleet_health(&i)).unwrap();
            let b = serde_json::to_vec(&fleet_health(&i.clone())).unwrap();
            assert_eq!(a, b);
        }
    }

    #[test]
    fn refused_socket_calls_of_gate_scripts_are_a_finding_from_a_fifth_of_the_calls() {
        let with = |allowed: i64, denied: i64| FleetInput {
            gate_fires: vec![GateFire {
                calls_allowed: allowed,
                calls_denied: denied,
                ..gate("main", false, false)
            }],
            ..window()
        };
        let find = |i: &FleetInput| {
            fleet_health(i)
                .findings
                .into_iter()
                .find(|f| f.code == "orchestrate_efficiency")
        };
        assert!(find(&with(5, 0)).is_none(), "none refused");
        assert!(find(&with(5, 1)).is_none(), "1 of 6: under a fifth");
        let f = find(&with(4, 1)).expect("1 of 5: at a fifth");
        assert_eq!(f.count, 1);
        assert!(f.hint.contains("1 of 5"), "{}", f.hint);
        assert!(find(&with(0, 3)).is_some());
    }

    #[test]
    fn the_mixed_window_adds_up() {
        let r = fleet_health(&mixed());
        assert_eq!(r.sessions.run, 9);
        assert_eq!(r.sessions.degraded, 7);
        assert_eq!(r.sessions.degraded_rate, 0.7778);
        assert_eq!(r.degraded_by_cause.values().sum::<i64>(), 7);
        assert_eq!(r.degraded_by_cause["unknown"], 1);
        assert_eq!(r.degraded_by_cause["timeout"], 1);
        assert_eq!(r.degraded_by_cause["error"], 1);
        assert_eq!(r.breaker_trips, 2);
        assert_eq!(r.top_error_kinds[0].error_kind, "timeout");
        assert_eq!(r.top_error_kinds[0].count, 4);
        assert_eq!(r.tool_stats["shell"].failed, 6);
        assert_eq!(r.tool_stats["read_file"].ok, 2);
        assert_eq!(r.recent_activity.len(), 9);
        assert_eq!(r.recent_activity[0].session_key, "agent:main/api#e");
        assert_eq!(r.recent_activity[0].end_reason, "timeout");
        let codes: Vec<&str> = r.findings.iter().map(|f| f.code.as_str()).collect();
        assert_eq!(
            codes,
            [
                "config_posture:served_below_configured",
                "tool_failures",
                "breaker_trips",
                "provider_failures",
                "cron_wake_gate_efficiency"
            ]
        );
        assert!(r.findings[3]
            .hint
            .contains("rate_limited: 3, server_error: 3, timeout: 1"));
        assert_eq!(code(&r), Some("fleet_high_degraded_rate"));
        let gate = r.cron_wake_gate.unwrap();
        assert_eq!((gate.fires.total, gate.fires.failed_open), (5, 2));
        assert_eq!(gate.fires.fail_open_rate, 0.4);
        assert_eq!(gate.per_agent.len(), 2);
        assert!(r.autonomy.is_none());
        assert!(!r.pipeline_authoring_gate.build_author);
    }

    #[test]
    fn an_empty_window_is_healthy() {
        let r = fleet_health(&window());
        assert_eq!(r.sessions.run, 0);
        assert_eq!(r.sessions.degraded_rate, 0.0);
        assert!(r.findings.is_empty() && r.recent_activity.is_empty());
        assert_eq!(code(&r), None);
        assert!(r.cron_wake_gate.is_none());
    }

    #[test]
    fn root_causes_rank_acute_then_posture_then_recurring() {
        // 3 of 7 degraded (under half), all in the last hour: acute.
        let mut i = window();
        for n in 0..4 {
            i.rows.push(turn_end(
                &format!("s{n}"),
                "main",
                END - 5 * HOUR,
                Some("stop"),
                None,
            ));
        }
        for n in 4..7 {
            i.rows.push(turn_end(
                &format!("s{n}"),
                "main",
                END - (n - 3) * 10 * 60_000,
                Some("error"),
                Some("timeout"),
            ));
        }
        i.served_below_configured = 1;
        let r = fleet_health(&i);
        assert_eq!(code(&r), Some("fleet_acute_degradation"));
        let c = r.likely_root_cause.unwrap();
        assert_eq!(
            c.suggested_next_steps[0],
            "Explain the most recent degraded session: obs.explain with sessionKey s4"
        );

        // The same degradation longer ago: the fallback posture.
        for row in &mut i.rows {
            row.ts -= 2 * HOUR;
        }
        assert_eq!(code(&fleet_health(&i)), Some("fleet_config_posture"));

        // No fallback: three tool failures recur.
        i.served_below_configured = 0;
        assert_eq!(code(&fleet_health(&i)), None);
        for _ in 0..3 {
            i.rows
                .push(tool("s0", END - 5 * HOUR, "web_fetch", Some("timeout")));
        }
        let r = fleet_health(&i);
        assert_eq!(code(&r), Some("fleet_recurring_health_signal"));
        assert_eq!(
            r.likely_root_cause.unwrap().detail,
            "The finding tool_failures recurred 3 times in the window."
        );
    }

    #[test]
    fn a_session_ends_with_its_last_turn() {
        let mut i = window();
        i.rows.push(turn_end(
            "s",
            "main",
            END - 2 * HOUR,
            Some("error"),
            Some("timeout"),
        ));
        i.rows
            .push(turn_end("s", "main", END - HOUR, Some("stop"), None));
        let r = fleet_health(&i);
        assert_eq!((r.sessions.run, r.sessions.degraded), (1, 0));
        assert_eq!(r.recent_activity[0].ended_at, END - HOUR);
        assert!(r.degraded_by_cause.is_empty());
    }
}
