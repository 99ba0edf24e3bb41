//! `obs.explain`: the deterministic post-mortem of one session, built from its stored records
//! only ([`ExplainInput`]), without a model call, a clock or any I/O. Equal inputs give
//! byte-identical `serde_json::to_vec` output: every map is a `BTreeMap`, every list is sorted
//! on a total order, and every number is rounded the same way.
//!
//! The report is content-free. Tool output is untrusted (a tool may return anything, including
//! text written to steer whoever reads it), so no tool result text is ever inlined, at either
//! depth: a failure is its tool name, error kind, size and `resultDigest` fingerprint. Root
//! causes, summaries and next steps are built from names, counts, codes and reasons only.
//!
//! Depth `summary` caps the failure list at 10 and the breaker timeline at 20 items, then bounds
//! the serialized report to [`SUMMARY_MAX_BYTES`] by dropping the oldest failures, then the
//! oldest breaker events, then the tool stats with the fewest calls. Depth `full` caps both lists
//! at 200. Both lists keep their newest items (the ones closest to how the session ended);
//! everything dropped is counted in `truncations[]`.

use std::collections::BTreeMap;

use crate::api::generated::types::{
    ObsBreakerEvent, ObsBreakerEventEvent, ObsContextBudgetVerdict, ObsExplainFailure,
    ObsIncidentReport, ObsIncidentReportCost, ObsIncidentReportOutcome,
    ObsIncidentReportOutcomeSeverity, ObsIncidentReportReference, ObsIncidentReportReferenceKind,
    ObsIncidentReportTiming, ObsRecallStats, ObsRootCause, ObsToolStat, ObsTruncation,
    ObsTruncationReason,
};
use crate::store::records::{
    Depth, ExplainInput, RefKind, SessionFacts, ToolResultFact, TraceFact,
};

/// The byte bound of a depth-summary report (serialized compactly).
pub const SUMMARY_MAX_BYTES: usize = 6144;
/// Failures kept at depth summary before the byte bound applies.
const SUMMARY_FAILURES: usize = 10;
/// Breaker events kept at depth summary before the byte bound applies.
const SUMMARY_BREAKER_EVENTS: usize = 20;
/// Failures kept at depth full.
const FULL_FAILURES: usize = 200;
/// Breaker events kept at depth full.
const FULL_BREAKER_EVENTS: usize = 200;
/// Orchestrated script runs (wake gate runs) kept, newest first, at depth summary.
const SUMMARY_ORCHESTRATE: usize = 5;
/// ... and at depth full (also how many the handler reads).
pub const FULL_ORCHESTRATE: usize = 50;
/// Longest reference or session key quoted in a summary or detail, in characters.
const SHOWN_REF_CHARS: usize = 128;
/// Longest reference value echoed in `reference.value` (the parameter's own maximum).
const REF_VALUE_CHARS: usize = 512;
/// Longest summary paragraph, in characters.
const SUMMARY_CHARS: usize = 2000;
/// Longest tool name, agent id or digest in the report (the catalogue's maximum).
pub(crate) const NAME_CHARS: usize = 128;
/// Longest error kind or channel in the report (the catalogue's maximum).
pub(crate) const KIND_CHARS: usize = 64;
/// The tool whose results are memory recalls.
const RECALL_TOOL: &str = "memory_search";

const STEP_GROUP_BY_DIGEST: &str =
    "Group failures by resultDigest: identical digests are the same error";
const STEP_COMPACT: &str = "Compact the session's history with session.compact, or lower \
     agentDefaults.maxHistoryMessages so fewer messages are sent to the model";
const STEP_PROVIDER_HEALTH: &str =
    "Check the provider's health and failed calls with providers.list and obs.billing.byProvider";
const STEP_FALLBACK: &str =
    "Give the agent fallbackModels with agents.update so another model answers when the primary fails";
const STEP_READ_HISTORY: &str =
    "Read the last turn with session.history to see which calls the agent made";

/// Builds the incident report of `input`. Pure: equal inputs give byte-identical reports.
pub fn explain(input: &ExplainInput) -> ObsIncidentReport {
    let reference = ObsIncidentReportReference {
        kind: ref_kind(input.kind),
        value: clip(&input.value, REF_VALUE_CHARS),
        resolved: input.session.is_some(),
    };
    match &input.session {
        None => not_found(input, reference),
        Some(facts) => resolved(input.depth, facts, reference),
    }
}

fn ref_kind(kind: RefKind) -> ObsIncidentReportReferenceKind {
    match kind {
        RefKind::SessionKey => ObsIncidentReportReferenceKind::SessionKey,
        RefKind::TraceId => ObsIncidentReportReferenceKind::TraceId,
        RefKind::RootRunId => ObsIncidentReportReferenceKind::RootRunId,
    }
}

/// The `session_not_found` marker: zero counts, empty lists, a root cause naming the reference.
fn not_found(input: &ExplainInput, reference: ObsIncidentReportReference) -> ObsIncidentReport {
    let kind = input.kind.as_str();
    let shown = clip(&input.value, SHOWN_REF_CHARS);
    let steps = vec![
        format!("Check the {kind}: obs.trace.search lists the session index of the last two days"),
        "A cron job id is not a session reference: use cron.runs to find the fire's session"
            .to_owned(),
    ];
    ObsIncidentReport {
        schema_version: 1,
        reference,
        session_key: None,
        trace_id: None,
        agent_id: None,
        channel: None,
        outcome: ObsIncidentReportOutcome {
            end_reason: "session_not_found".to_owned(),
            degraded: false,
            severity: ObsIncidentReportOutcomeSeverity::None,
        },
        cost: ObsIncidentReportCost {
            cost_usd: 0.0,
            total_tokens: 0,
            cache_read_ratio: 0.0,
        },
        timing: ObsIncidentReportTiming {
            duration_ms: 0,
            turn_count: 0,
        },
        tool_stats: BTreeMap::new(),
        failures: Vec::new(),
        breaker_timeline: Vec::new(),
        offloads: Vec::new(),
        summary: format!("No session matches {kind} {shown}."),
        likely_root_cause: Some(ObsRootCause {
            code: "session_not_found".to_owned(),
            detail: format!(
                "The {kind} \"{shown}\" matches no stored session: it may be mistyped, deleted, \
                 or older than the session index keeps."
            ),
            suggested_next_steps: steps.clone(),
        }),
        suggested_next_steps: steps,
        truncations: Vec::new(),
        context_budget: None,
        recall: None,
        voice: None,
        learning: None,
        orchestrate: None,
        cron_wake_gate: None,
        coverage: None,
    }
}

/// Ok and failed calls of one tool, with the failures per error kind.
#[derive(Debug, Default, Clone)]
pub(crate) struct ToolTally {
    pub ok: i64,
    pub failed: i64,
    pub kinds: BTreeMap<String, i64>,
}

impl ToolTally {
    /// Counts one call; `error_kind` is only looked at for a failure (None → `failed`).
    pub fn add(&mut self, failed: bool, error_kind: Option<&str>) {
        if failed {
            self.failed += 1;
            *self.kinds.entry(error_kind_name(error_kind)).or_default() += 1;
        } else {
            self.ok += 1;
        }
    }

    /// The most frequent error kind and its count (ties: alphabetical); None when none failed.
    pub fn top_kind(&self) -> Option<(&str, i64)> {
        top_count(&self.kinds)
    }

    pub fn stat(&self) -> ObsToolStat {
        ObsToolStat {
            ok: self.ok,
            failed: self.failed,
            top_error_kind: self.top_kind().map(|(k, _)| k.to_owned()),
        }
    }
}

/// The highest count of `counts` and its key; ties go to the alphabetically first key.
pub(crate) fn top_count(counts: &BTreeMap<String, i64>) -> Option<(&str, i64)> {
    let mut best: Option<(&str, i64)> = None;
    for (k, &n) in counts {
        if n > 0 && best.is_none_or(|(_, b)| n > b) {
            best = Some((k.as_str(), n));
        }
    }
    best
}

/// The tool with the most failures and its tally (ties: alphabetical); None when none failed.
pub(crate) fn top_failing(tally: &BTreeMap<String, ToolTally>) -> Option<(&str, &ToolTally)> {
    let mut best: Option<(&str, &ToolTally)> = None;
    for (k, t) in tally {
        if t.failed > 0 && best.is_none_or(|(_, b)| t.failed > b.failed) {
            best = Some((k.as_str(), t));
        }
    }
    best
}

/// An error kind as reported: clipped, `failed` when absent or empty.
pub(crate) fn error_kind_name(kind: Option<&str>) -> String {
    match kind.map(str::trim) {
        Some(k) if !k.is_empty() => clip(k, KIND_CHARS),
        _ => "failed".to_owned(),
    }
}

/// A tool name as reported: clipped, `unknown` when absent or empty.
pub(crate) fn tool_name(name: Option<&str>) -> String {
    match name {
        Some(n) if !n.is_empty() => clip(n, NAME_CHARS),
        _ => "unknown".to_owned(),
    }
}

/// The first `max` characters of `s`.
pub(crate) fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => s[..at].to_owned(),
        None => s.to_owned(),
    }
}

/// A USD amount rounded to 6 decimals; 0 when negative or not finite.
pub(crate) fn usd(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        (x * 1e6).round() / 1e6
    } else {
        0.0
    }
}

/// `num / den` in [0, 1] rounded to 4 decimals; 0 when `den` is not positive.
pub(crate) fn ratio(num: i64, den: i64) -> f64 {
    if den <= 0 || num <= 0 {
        return 0.0;
    }
    let r = (num as f64 / den as f64).min(1.0);
    (r * 1e4).round() / 1e4
}

/// The end reason of a turn from its finish reason and error kind: an `error` whose kind is
/// `timeout` is the named degradation cause `timeout`, any other `error` stays `error`, no
/// recorded finish reason is `unknown`, and every other finish reason is itself.
pub(crate) fn end_reason(finish: Option<&str>, error_kind: Option<&str>) -> String {
    match (finish, error_kind) {
        (None, _) => "unknown".to_owned(),
        (Some(f), _) if f.trim().is_empty() => "unknown".to_owned(),
        (Some("error"), Some("timeout")) => "timeout".to_owned(),
        (Some(f), _) => clip(f, KIND_CHARS),
    }
}

/// How bad an end reason is. A designed scale, kept to one small match:
///
/// - `none`: a clean `stop`; also `unknown` with zero turns (nothing ran, so nothing went wrong).
/// - `low`: the agent stopped itself by rule - `max_steps`, `context_loop`.
/// - `medium`: a limit or resource ran out - `budget_exceeded`, `context_exhausted`,
///   `output_starved`, `timeout`.
/// - `high`: the turn broke - `circuit_open`, `error`, `unknown` after turns ran, and any
///   reason this scale does not know.
fn severity(end: &str, turns: i64) -> ObsIncidentReportOutcomeSeverity {
    use ObsIncidentReportOutcomeSeverity as S;
    match end {
        "stop" => S::None,
        "unknown" if turns <= 0 => S::None,
        "max_steps" | "context_loop" => S::Low,
        "budget_exceeded" | "context_exhausted" | "output_starved" | "timeout" => S::Medium,
        _ => S::High,
    }
}

/// A value for the `where` filter of obs.trace.search: bare when it can be, else single-quoted.
pub(crate) fn where_value(v: &str) -> String {
    let bare = !v.is_empty()
        && v.chars()
            .all(|c| !c.is_whitespace() && c != '"' && c != '\'');
    if bare {
        v.to_owned()
    } else {
        format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

fn plural(n: i64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {many}")
    }
}

/// The report of a resolved session.
fn resolved(
    depth: Depth,
    facts: &SessionFacts,
    reference: ObsIncidentReportReference,
) -> ObsIncidentReport {
    // Synthetic index rows (heartbeats, wake gates, probes) only count when asked for.
    let trace: Vec<&TraceFact> = facts
        .trace
        .iter()
        .filter(|r| facts.include_synthetic || !r.synthetic)
        .collect();

    let finish = facts.last_finish_reason.as_deref();
    let verdict = facts.context_budget.as_ref().map(|b| b.verdict);
    let mut end = end_reason(finish, facts.last_error_kind.as_deref());
    if verdict == Some(ObsContextBudgetVerdict::Exhausted) && finish != Some("stop") {
        end = "context_exhausted".to_owned();
    }
    // output_starved is never produced yet: it needs a model stop capped by the output length,
    // and the gateway records no such finish reason (a turn_end row with zero tokens after
    // max_steps is not that signal, so none is guessed from it).
    let degraded = end != "stop";

    let mut tally: BTreeMap<String, ToolTally> = BTreeMap::new();
    for t in &facts.tool_results {
        tally
            .entry(tool_name(Some(&t.tool_name)))
            .or_default()
            .add(t.is_error, t.error_kind.as_deref());
    }
    let calls: i64 = tally.values().map(|t| t.ok + t.failed).sum();
    let failed_total: i64 = tally.values().map(|t| t.failed).sum();

    let failures = failures_newest_first(&facts.tool_results);
    let breaker = breaker_timeline(&trace);
    let recall = recall_stats(&facts.tool_results);

    // A repeated call the gateway refused to run (the context loop guard) is an error result,
    // but not a tool failure: the loop itself is the cause.
    let tool_failures = facts
        .tool_results
        .iter()
        .filter(|t| t.is_error && t.error_kind.as_deref() != Some("repeated_call"))
        .count() as i64;
    let ctx = Ctx {
        facts,
        end: &end,
        degraded,
        tally: &tally,
        failed_total: tool_failures,
        breaker: &breaker,
        recall: recall.as_ref(),
    };
    let cause = root_cause(&ctx);

    let mut steps: Vec<String> = cause
        .as_ref()
        .map(|c| c.suggested_next_steps.clone())
        .unwrap_or_default();
    if failed_total > 0 {
        steps.push(STEP_GROUP_BY_DIGEST.to_owned());
    }
    if matches!(
        verdict,
        Some(ObsContextBudgetVerdict::Downshifted | ObsContextBudgetVerdict::Exhausted)
    ) {
        steps.push(STEP_COMPACT.to_owned());
    }
    let mut seen = std::collections::BTreeSet::new();
    steps.retain(|s| seen.insert(s.clone()));

    let tokens = facts
        .usage
        .input_tokens
        .max(0)
        .saturating_add(facts.usage.output_tokens.max(0));
    let cost_usd = usd(facts.usage.cost_usd);
    let duration_ms = facts.updated_at.saturating_sub(facts.created_at).max(0);
    let turns = facts.turns.max(0);
    let failing_tools = tally.values().filter(|t| t.failed > 0).count() as i64;

    let mut summary = format!(
        "Session {key} (agent {agent}, channel {channel}) ran {turns} over {duration_ms} ms and \
         used {tokens} tokens (${cost_usd:.6}). It ended with {end}.",
        key = clip(&facts.session_key, SHOWN_REF_CHARS),
        agent = clip(facts.agent_id.as_deref().unwrap_or("unknown"), NAME_CHARS),
        channel = clip(facts.channel.as_deref().unwrap_or("unknown"), KIND_CHARS),
        turns = plural(turns, "turn", "turns"),
    );
    match (calls, failed_total) {
        (0, _) => summary.push_str(" It made no tool calls."),
        (_, 0) => summary.push_str(&format!(
            " It made {} to {}; none failed.",
            plural(calls, "tool call", "tool calls"),
            plural(tally.len() as i64, "tool", "tools"),
        )),
        _ => summary.push_str(&format!(
            " It made {} to {}; {failed_total} failed across {}.",
            plural(calls, "tool call", "tool calls"),
            plural(tally.len() as i64, "tool", "tools"),
            plural(failing_tools, "tool", "tools"),
        )),
    }
    match breaker.len() {
        0 => {}
        1 => summary.push_str(" The circuit breaker opened once."),
        n => summary.push_str(&format!(" The circuit breaker opened {n} times.")),
    }
    if let Some(c) = &cause {
        summary.push_str(&format!(" Likely root cause: {}.", c.code));
    }

    let mut cuts = Cuts::default();
    let (failure_cap, breaker_cap) = match depth {
        Depth::Summary => (SUMMARY_FAILURES, SUMMARY_BREAKER_EVENTS),
        Depth::Full => (FULL_FAILURES, FULL_BREAKER_EVENTS),
    };
    let failures = cuts.cap("failures", failures, failure_cap);
    let breaker_timeline = cuts.cap_oldest("breakerTimeline", breaker, breaker_cap);
    let orchestrate_cap = match depth {
        Depth::Summary => SUMMARY_ORCHESTRATE,
        Depth::Full => FULL_ORCHESTRATE,
    };
    let orchestrate = cuts.cap("orchestrate", facts.orchestrate.clone(), orchestrate_cap);

    let mut report = ObsIncidentReport {
        schema_version: 1,
        reference,
        session_key: Some(facts.session_key.clone()),
        trace_id: facts.last_trace_id.clone(),
        agent_id: facts.agent_id.as_deref().map(|a| clip(a, NAME_CHARS)),
        channel: facts.channel.as_deref().map(|c| clip(c, KIND_CHARS)),
        outcome: ObsIncidentReportOutcome {
            severity: severity(&end, turns),
            end_reason: end,
            degraded,
        },
        cost: ObsIncidentReportCost {
            cost_usd,
            total_tokens: tokens,
            cache_read_ratio: ratio(facts.usage.cached_tokens, facts.usage.input_tokens),
        },
        timing: ObsIncidentReportTiming {
            duration_ms,
            turn_count: turns,
        },
        tool_stats: tally.iter().map(|(k, t)| (k.clone(), t.stat())).collect(),
        failures,
        breaker_timeline,
        // The gateway does not offload tool results out of the context yet.
        offloads: Vec::new(),
        summary: clip(&summary, SUMMARY_CHARS),
        likely_root_cause: cause,
        suggested_next_steps: steps,
        truncations: cuts.list(),
        context_budget: facts.context_budget.clone(),
        recall,
        // The gateway has no voice or learning subsystem, and reads a single store (nothing
        // to cross-check for coverage): these blocks are never present. Its orchestrated
        // script runs are wake gates (`obs/orchestrate.rs`).
        voice: None,
        learning: None,
        orchestrate: (!orchestrate.is_empty()).then_some(orchestrate),
        cron_wake_gate: facts.cron_gate.clone(),
        coverage: None,
    };
    if depth == Depth::Summary {
        fit(&mut report, &mut cuts);
    }
    report
}

/// Failed tool results, newest first, without their text: the result is untrusted tool output,
/// so it is only ever fingerprinted (`resultDigest`), and `errorPreview` is always absent.
fn failures_newest_first(results: &[ToolResultFact]) -> Vec<ObsExplainFailure> {
    let mut failed: Vec<&ToolResultFact> = results.iter().filter(|t| t.is_error).rev().collect();
    // Stable: at an equal seq the later transcript entry stays first.
    failed.sort_by_key(|t| std::cmp::Reverse(t.seq));
    failed
        .into_iter()
        .map(|t| ObsExplainFailure {
            seq: t.seq.max(0),
            tool_name: tool_name(Some(&t.tool_name)),
            error_kind: error_kind_name(t.error_kind.as_deref()),
            result_digest: clip(&t.digest, NAME_CHARS),
            result_bytes: t.bytes.max(0),
            error_preview: None,
        })
        .collect()
}

/// Every turn that ended with `circuit_open` opened the breaker; the tool is the one of the last
/// failed tool result before it. In seq order (a tool result at the turn end's own seq comes
/// before it: the turn end is recorded after the turn's last message).
fn breaker_timeline(trace: &[&TraceFact]) -> Vec<ObsBreakerEvent> {
    let mut rows = trace.to_vec();
    rows.sort_by_key(|r| (r.seq, r.kind == "turn_end"));
    let mut last_failed: Option<&str> = None;
    let mut out = Vec::new();
    for r in rows {
        match r.kind.as_str() {
            "tool_result" if r.status.as_deref() == Some("error") => {
                last_failed = Some(r.tool_name.as_deref().unwrap_or(""));
            }
            "turn_end" if r.finish_reason.as_deref() == Some("circuit_open") => {
                out.push(ObsBreakerEvent {
                    seq: r.seq.max(0),
                    event: ObsBreakerEventEvent::Opened,
                    tool_name: tool_name(last_failed),
                });
            }
            _ => {}
        }
    }
    out
}

/// Memory recalls (results of the memory_search tool). The gateway's recall has one lane (the
/// keyword lane) and no reranker, and cross-user recall does not exist (those members absent).
fn recall_stats(results: &[ToolResultFact]) -> Option<ObsRecallStats> {
    let recalls: Vec<&ToolResultFact> = results
        .iter()
        .filter(|t| t.tool_name == RECALL_TOOL)
        .collect();
    let last = recalls.last()?;
    Some(ObsRecallStats {
        recalls: recalls.len() as i64,
        zero_hits: recalls.iter().filter(|t| t.recall_hits == Some(0)).count() as i64,
        last_lanes: 1,
        last_final_count: last.recall_hits.unwrap_or(0).max(0),
        reranker_available: false,
        cross_user_recalls: None,
        last_cross_user_count: None,
    })
}

/// What the root cause is decided from.
struct Ctx<'a> {
    facts: &'a SessionFacts,
    end: &'a str,
    degraded: bool,
    tally: &'a BTreeMap<String, ToolTally>,
    /// Failed tool calls, the context loop guard's refusals left out.
    failed_total: i64,
    breaker: &'a [ObsBreakerEvent],
    recall: Option<&'a ObsRecallStats>,
}

fn cause(code: &str, detail: String, steps: Vec<String>) -> Option<ObsRootCause> {
    Some(ObsRootCause {
        code: code.to_owned(),
        detail: clip(&detail, 1000),
        suggested_next_steps: steps,
    })
}

fn look_at_failures(tool: &str) -> String {
    format!(
        "Look at the failures of {tool}: obs.trace.search with where \"toolName = {} and status = \
         error\"",
        where_value(tool)
    )
}

/// "web_fetch: 4 × timeout" for the tool with the most failures.
fn top_failing_text(tally: &BTreeMap<String, ToolTally>) -> Option<(String, String)> {
    let (tool, t) = top_failing(tally)?;
    let (kind, n) = t.top_kind().unwrap_or(("failed", t.failed));
    Some((tool.to_owned(), format!("{tool}: {n} × {kind}")))
}

/// The likely root cause, first match wins:
///
/// 1. `tool_circuit_open`: the breaker opened (a breaker timeline entry).
/// 2. `tool_failures`: the session ended degraded and tool calls failed (a tool-failure cause
///    outranks the degradation causes).
/// 3. `context_exhausted`, `timeout` (`output_starved` is never produced, see above).
/// 4. `max_steps`, `budget_exceeded`, `context_loop`, `provider_error` (end reason error),
///    `tool_circuit_open` (circuit_open whose rows were swept).
/// 5. `orchestrate_failed`: the newest orchestrated script run (wake gate) failed.
/// 6. `completed_with_tool_errors`: a clean stop with failed tool calls.
/// 7. `recall_miss`: every memory recall found nothing.
/// 8. `outcome_unresolved`: no finish reason recorded (end reason unknown); the spec ranks it
///    lowest (benign), so it comes after recall_miss.
/// 9. None.
fn root_cause(c: &Ctx<'_>) -> Option<ObsRootCause> {
    if let Some(last) = c.breaker.last() {
        let tool = last.tool_name.as_str();
        let times = if c.breaker.len() > 1 {
            format!(
                "The circuit breaker opened {} times, the last time",
                c.breaker.len()
            )
        } else {
            "The circuit breaker opened".to_owned()
        };
        let detail = match c.tally.get(tool).filter(|t| t.failed > 0) {
            Some(t) => format!(
                "{times} after consecutive failures of {tool} ({}, mostly {}).",
                plural(t.failed, "failed call", "failed calls"),
                t.top_kind().map_or("failed", |(k, _)| k)
            ),
            None => format!(
                "{times} after consecutive failures of {tool} (its results are not in the \
                 transcript)."
            ),
        };
        return cause(
            "tool_circuit_open",
            detail,
            vec![
                look_at_failures(tool),
                "Fix the tool's inputs or availability, or raise \
                 agentDefaults.circuitBreakerThreshold if the failures are expected"
                    .to_owned(),
            ],
        );
    }
    if c.degraded && c.failed_total > 0 {
        if let Some((tool, top)) = top_failing_text(c.tally) {
            let mut steps = vec![
                look_at_failures(&tool),
                format!("Fix {tool}'s inputs or availability, then rerun the task"),
            ];
            if let Some(first) =
                degradation(c).and_then(|d| d.suggested_next_steps.into_iter().next())
            {
                steps.push(first);
            }
            return cause(
                "tool_failures",
                format!(
                    "{} failed ({top}) before the session ended with {}.",
                    plural(c.failed_total, "tool call", "tool calls"),
                    c.end
                ),
                steps,
            );
        }
    }
    let degraded_cause = degradation(c);
    if let Some(d) = degraded_cause
        .as_ref()
        .filter(|d| d.code != "outcome_unresolved")
    {
        return Some(d.clone());
    }
    if let Some(o) = orchestrate_failed(c) {
        return Some(o);
    }
    if c.end == "stop" && c.failed_total > 0 {
        if let Some((tool, top)) = top_failing_text(c.tally) {
            return cause(
                "completed_with_tool_errors",
                format!(
                    "The session ended normally, but {} failed ({top}).",
                    plural(c.failed_total, "tool call", "tool calls")
                ),
                vec![
                    look_at_failures(&tool),
                    "Check that the final answer does not rely on the failed calls (session.history)"
                        .to_owned(),
                ],
            );
        }
    }
    if let Some(r) = c
        .recall
        .filter(|r| r.recalls > 0 && r.zero_hits == r.recalls)
    {
        return cause(
            "recall_miss",
            format!(
                "Every memory recall of the session found nothing ({}).",
                plural(r.recalls, "recall", "recalls")
            ),
            vec![
                "Check what the agent's memory holds with memory.browse or memory.search"
                    .to_owned(),
                "Store the facts the agent needs with memory.store (or the memory_store tool)"
                    .to_owned(),
            ],
        );
    }
    // outcome_unresolved is the lowest-ranked cause (benign): below recall_miss.
    degraded_cause
}

/// `orchestrate_failed`: the newest orchestrated script run (the job's last wake gate)
/// failed, so the fire failed open (or was decided without a readable reply).
fn orchestrate_failed(c: &Ctx<'_>) -> Option<ObsRootCause> {
    use crate::api::generated::types::ObsOrchestrateRunOutcome;
    let last = c
        .facts
        .orchestrate
        .first()
        .filter(|o| o.outcome == ObsOrchestrateRunOutcome::Failure)?;
    let class = last.failure_class.map_or("failure", |f| f.as_str());
    let exit = last
        .exit_code
        .map_or_else(|| "no exit code".to_owned(), |e| format!("exit code {e}"));
    cause(
        "orchestrate_failed",
        format!(
            "The newest wake gate run ({}) failed: {class}, {exit}, after {} ms; the fire went \
             ahead as if the gate had woken it.",
            clip(&last.run_id, NAME_CHARS),
            last.duration_ms
        ),
        vec![
            "Run the gate script by hand in the agent's workspace with the GATEWAY_* variables \
             of docs/scheduler.md and check its exit code and output"
                .to_owned(),
            "cron.runs lists each fire's gate decision and reason".to_owned(),
        ],
    )
}

/// The cause named by the end reason alone (rules 3 and 4), whatever the tool failures.
fn degradation(c: &Ctx<'_>) -> Option<ObsRootCause> {
    match c.end {
        "context_exhausted" => {
            let detail = match &c.facts.context_budget {
                Some(b) => format!(
                    "The last turn's input exhausted the context window: {} tokens assembled for \
                     a window of {} ({} left for output).",
                    b.assembled_input_tokens, b.window_tokens, b.output_headroom
                ),
                None => "The last turn's input exhausted the context window.".to_owned(),
            };
            cause(
                "context_exhausted",
                detail,
                vec![
                    STEP_COMPACT.to_owned(),
                    "Use a model with a larger context window (models.list) for this agent"
                        .to_owned(),
                ],
            )
        }
        "timeout" => cause(
            "timeout",
            "The last model call timed out.".to_owned(),
            vec![
                STEP_PROVIDER_HEALTH.to_owned(),
                "Raise providers.<id>.timeoutMs (providers.update) if the model needs longer"
                    .to_owned(),
                STEP_FALLBACK.to_owned(),
            ],
        ),
        "max_steps" => cause(
            "max_steps",
            "The last turn used all its model steps (maxSteps) without a final answer.".to_owned(),
            vec![
                STEP_READ_HISTORY.to_owned(),
                "Raise the agent's maxSteps with agents.update (or agentDefaults.maxSteps) if the \
                 task needs more steps"
                    .to_owned(),
            ],
        ),
        "budget_exceeded" => cause(
            "budget_exceeded",
            "The last turn went past the agent's per-turn budget (budget.tokens or \
             budget.costUsd)."
                .to_owned(),
            vec![
                "Compare the session's spending with obs.billing.bySession".to_owned(),
                "Raise or remove the agent's budget.tokens or budget.costUsd with agents.update"
                    .to_owned(),
            ],
        ),
        "context_loop" => cause(
            "context_loop",
            "The model repeated a tool call with the same arguments, so the turn was stopped."
                .to_owned(),
            vec![
                STEP_READ_HISTORY.to_owned(),
                "Adjust the agent's systemPrompt or tools with agents.update so it does not \
                 retry the same call"
                    .to_owned(),
            ],
        ),
        "error" => {
            let detail = match c.facts.last_error_kind.as_deref() {
                Some(k) if !k.trim().is_empty() => format!(
                    "The last model call failed (error kind {}).",
                    clip(k, KIND_CHARS)
                ),
                _ => "The last model call failed.".to_owned(),
            };
            cause(
                "provider_error",
                detail,
                vec![
                    STEP_PROVIDER_HEALTH.to_owned(),
                    STEP_FALLBACK.to_owned(),
                    "Look at the failed model calls with obs.diagnostics".to_owned(),
                ],
            )
        }
        "circuit_open" => cause(
            "tool_circuit_open",
            "The circuit breaker opened after consecutive tool failures; the session index no \
             longer holds the failing calls."
                .to_owned(),
            vec![
                STEP_READ_HISTORY.to_owned(),
                "Fix the tool's inputs or availability, or raise \
                 agentDefaults.circuitBreakerThreshold if the failures are expected"
                    .to_owned(),
            ],
        ),
        "unknown" if c.facts.turns > 0 || c.facts.last_finish_reason.is_some() => cause(
            "outcome_unresolved",
            "No turn outcome is recorded for this session.".to_owned(),
            vec![
                "Look for the session's turn_end rows with obs.trace.search (where \"kind = \
                 turn_end\"); the index keeps two days"
                    .to_owned(),
                STEP_READ_HISTORY.to_owned(),
            ],
        ),
        "unknown" => cause(
            "outcome_unresolved",
            "No turn outcome is recorded for this session.".to_owned(),
            vec![STEP_READ_HISTORY.to_owned()],
        ),
        _ => None,
    }
}

/// What was cut, per report member.
#[derive(Debug, Default)]
struct Cuts(BTreeMap<&'static str, ObsTruncation>);

impl Cuts {
    /// Keeps the first `cap` items of `items` (a newest-first list), counting the rest as a
    /// depth cap.
    fn cap<T>(&mut self, member: &'static str, mut items: Vec<T>, cap: usize) -> Vec<T> {
        if items.len() > cap {
            items.reverse();
            items = self.cap_oldest(member, items, cap);
            items.reverse();
        }
        items
    }

    /// Keeps the last `cap` items of `items` (a list in session order), counting the rest as a
    /// depth cap.
    fn cap_oldest<T>(&mut self, member: &'static str, mut items: Vec<T>, cap: usize) -> Vec<T> {
        if items.len() > cap {
            let dropped = items.len() - cap;
            items.drain(..dropped);
            self.0.insert(
                member,
                ObsTruncation {
                    member: member.to_owned(),
                    kept: cap as i64,
                    dropped: dropped as i64,
                    reason: ObsTruncationReason::DepthCap,
                },
            );
        }
        items
    }

    /// One more item of `member` dropped for size; a member cut for both reasons is reported
    /// once, as size_cap, with the total dropped.
    fn size(&mut self, member: &'static str, kept: usize) {
        let t = self.0.entry(member).or_insert_with(|| ObsTruncation {
            member: member.to_owned(),
            kept: 0,
            dropped: 0,
            reason: ObsTruncationReason::SizeCap,
        });
        t.kept = kept as i64;
        t.dropped += 1;
        t.reason = ObsTruncationReason::SizeCap;
    }

    /// Sorted by member name.
    fn list(&self) -> Vec<ObsTruncation> {
        self.0.values().cloned().collect()
    }
}

fn json_len<T: serde::Serialize + ?Sized>(v: &T) -> usize {
    serde_json::to_vec(v).map_or(0, |b| b.len())
}

/// Bounds a summary report to [`SUMMARY_MAX_BYTES`]: drops the oldest failure, then the oldest
/// breaker event, then the tool stat with the fewest calls (ties: the alphabetically last), as
/// few as it takes. Each round drops items until their bytes cover the excess (an item's bytes
/// plus its comma, exactly what leaving it out saves), then measures again, because the
/// truncation entries it adds take room too.
fn fit(report: &mut ObsIncidentReport, cuts: &mut Cuts) {
    loop {
        report.truncations = cuts.list();
        let len = json_len(report);
        if len <= SUMMARY_MAX_BYTES {
            return;
        }
        let mut excess = len - SUMMARY_MAX_BYTES;
        let mut dropped_any = false;
        while excess > 0 {
            let saved = if let Some(f) = report.failures.pop() {
                cuts.size("failures", report.failures.len());
                json_len(&f) + 1
            } else if !report.breaker_timeline.is_empty() {
                let b = report.breaker_timeline.remove(0);
                cuts.size("breakerTimeline", report.breaker_timeline.len());
                json_len(&b) + 1
            } else if let Some(o) = report
                .orchestrate
                .as_mut()
                .filter(|o| o.len() > 1)
                .and_then(Vec::pop)
            {
                cuts.size(
                    "orchestrate",
                    report.orchestrate.as_ref().map_or(0, Vec::len),
                );
                json_len(&o) + 1
            } else if let Some(name) = fewest_calls(&report.tool_stats) {
                let Some(stat) = report.tool_stats.remove(&name) else {
                    break;
                };
                cuts.size("toolStats", report.tool_stats.len());
                json_len(&name) + 1 + json_len(&stat) + 1
            } else {
                break;
            };
            dropped_any = true;
            excess = excess.saturating_sub(saved);
        }
        if !dropped_any {
            // Nothing left to drop: the fixed members alone exceed the bound.
            report.truncations = cuts.list();
            return;
        }
    }
}

fn fewest_calls(stats: &BTreeMap<String, ObsToolStat>) -> Option<String> {
    stats
        .iter()
        .min_by(|a, b| {
            let calls = |s: &ObsToolStat| s.ok.saturating_add(s.failed);
            calls(a.1).cmp(&calls(b.1)).then_with(|| b.0.cmp(a.0))
        })
        .map(|(k, _)| k.clone())
}

/// Compares `report` pretty-printed with `tests/golden/obs/<name>.json`, or writes the file
/// when `UPDATE_GOLDEN=1` is set.
#[cfg(test)]
pub(crate) fn assert_golden<T: serde::Serialize>(name: &str, report: &T) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/obs");
    let path = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(report).unwrap() + "\n";
    if std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to write it)",
            path.display()
        )
    });
    assert!(
        text == want,
        "{name}: the report differs from {}; check the change, then run with UPDATE_GOLDEN=1\n\
         --- got ---\n{text}",
        path.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::generated::types::{ObsContextBudget, ObsCronWakeGateRun};
    use crate::store::records::UsageFacts;

    /// Stands in for content: tool output text, and fields a report must not read. It must
    /// appear in no report.
    const MARKER: &str = "CANARY-7f3a-tool-output";

    const T0: i64 = 1_767_225_600_000;

    fn budget(verdict: ObsContextBudgetVerdict, assembled: i64) -> ObsContextBudget {
        ObsContextBudget {
            window_tokens: 32_000,
            raw_context_window_tokens: 128_000,
            window_cap_source: "none".to_owned(),
            system_tokens: 1_200,
            fresh_tail_tokens: 4_000,
            budgeted_history_tokens: 20_000,
            kept_count: 40,
            assembled_input_tokens: assembled,
            output_headroom: (32_000 - assembled).max(0),
            verdict,
        }
    }

    fn session(key: &str) -> SessionFacts {
        SessionFacts {
            session_key: key.to_owned(),
            agent_id: Some("main".to_owned()),
            channel: Some("api".to_owned()),
            created_at: T0,
            updated_at: T0,
            turns: 0,
            last_finish_reason: None,
            last_error_kind: None,
            last_trace_id: None,
            tool_results: Vec::new(),
            usage: UsageFacts {
                calls: 4,
                failed_calls: 0,
                input_tokens: 12_000,
                output_tokens: 850,
                cached_tokens: 4_000,
                cost_usd: 0.012_345_678_9,
            },
            trace: Vec::new(),
            context_budget: Some(budget(ObsContextBudgetVerdict::Fits, 9_000)),
            cron_gate: None,
            orchestrate: Vec::new(),
            include_synthetic: false,
        }
    }

    /// A session index row; the fields a report must not read carry the marker.
    fn row(seq: i64, ts: i64, kind: &str) -> TraceFact {
        TraceFact {
            ts,
            seq,
            kind: kind.to_owned(),
            trace_id: format!("{MARKER}-trace"),
            session_key: format!("{MARKER}-key"),
            agent_id: Some(format!("{MARKER}-agent")),
            tool_name: Some(format!("{MARKER}-row-tool")),
            status: Some("ok".to_owned()),
            duration_ms: Some(12),
            tokens: None,
            cost_usd: None,
            finish_reason: None,
            error_kind: Some(format!("{MARKER}-row-kind")),
            result_digest: Some(format!("{MARKER}-row-digest")),
            result_bytes: None,
            synthetic: false,
        }
    }

    /// One tool call of a turn: the tool, its error kind when it failed, its recall hits.
    struct Call<'a>(&'a str, Option<&'a str>, Option<i64>);

    /// Appends one turn the way the recorder stores it: the transcript's tool results and the
    /// index's inbound, tool_result, outbound and turn_end rows.
    fn turn(f: &mut SessionFacts, calls: &[Call<'_>], finish: &str, error_kind: Option<&str>) {
        let first = f
            .trace
            .iter()
            .map(|r| r.seq + 1)
            .chain(f.tool_results.iter().map(|t| t.seq + 1))
            .max()
            .unwrap_or(0);
        let ts = f.updated_at + 15_000;
        f.trace.push(row(first, ts, "inbound"));
        let mut seq = first;
        for Call(tool, kind, hits) in calls {
            seq += 1;
            // The result text is content: only its digest and size may be reported.
            let text = format!("{MARKER}: result {seq} of {tool}");
            f.tool_results.push(ToolResultFact {
                seq,
                tool_name: (*tool).to_owned(),
                is_error: kind.is_some(),
                digest: crate::store::records::digest(&text),
                bytes: text.len() as i64,
                // An ok result's kind is never looked at.
                error_kind: Some(kind.unwrap_or(MARKER).to_owned()),
                recall_hits: *hits,
            });
            f.trace.push(TraceFact {
                tool_name: Some((*tool).to_owned()),
                status: Some(if kind.is_some() { "error" } else { "ok" }.to_owned()),
                error_kind: kind.map(str::to_owned),
                ..row(seq, ts, "tool_result")
            });
        }
        let last = match finish {
            "error" | "circuit_open" => seq,
            _ => seq + 1,
        };
        if finish != "error" {
            f.trace.push(row(last, ts, "outbound"));
        }
        f.trace.push(TraceFact {
            status: Some(if finish == "stop" { "ok" } else { "error" }.to_owned()),
            tokens: Some(1_200),
            cost_usd: Some(0.001),
            finish_reason: Some(finish.to_owned()),
            error_kind: error_kind.map(str::to_owned),
            tool_name: None,
            ..row(last, ts, "turn_end")
        });
        f.turns += 1;
        f.updated_at = ts;
        f.last_finish_reason = Some(finish.to_owned());
        f.last_error_kind = error_kind.map(str::to_owned);
        f.last_trace_id = Some(format!("trace-{:04}", f.turns));
    }

    fn input(depth: Depth, f: SessionFacts) -> ExplainInput {
        ExplainInput {
            kind: RefKind::SessionKey,
            value: f.session_key.clone(),
            depth,
            session: Some(f),
        }
    }

    fn stop_clean() -> SessionFacts {
        let mut f = session("agent:main/api#clean");
        turn(
            &mut f,
            &[
                Call("memory_search", None, Some(3)),
                Call("web_search", None, None),
            ],
            "stop",
            None,
        );
        turn(&mut f, &[Call("read_file", None, None)], "stop", None);
        f
    }

    fn stop_tool_errors() -> SessionFacts {
        let mut f = session("agent:main/api#tool-errors");
        turn(
            &mut f,
            &[
                Call("web_fetch", Some("not_found"), None),
                Call("web_fetch", Some("not_found"), None),
                Call("web_fetch", None, None),
                Call("read_file", Some("denied"), None),
            ],
            "stop",
            None,
        );
        // A synthetic failure (a probe) is not counted without includeSynthetic.
        f.trace.push(TraceFact {
            synthetic: true,
            status: Some("error".to_owned()),
            ..row(99, f.updated_at, "tool_result")
        });
        f
    }

    fn max_steps() -> SessionFacts {
        let mut f = session("cron:nightly-digest/run-17");
        f.channel = Some("cron".to_owned());
        f.context_budget = Some(budget(ObsContextBudgetVerdict::Downshifted, 27_500));
        f.cron_gate = Some(ObsCronWakeGateRun {
            job_id: "nightly-digest".to_owned(),
            wake: true,
            duration_ms: 420,
            tool_calls: 2,
            est_turns_saved: 0,
        });
        let calls: Vec<Call<'_>> = (0..10).map(|_| Call("web_search", None, None)).collect();
        turn(&mut f, &calls, "max_steps", None);
        f
    }

    /// A gated cron job: eight gate runs, the newest timed out (the fire failed open and its
    /// turn stopped cleanly).
    fn gate_failed() -> SessionFacts {
        use crate::api::generated::types::{
            ObsOrchestrateRun, ObsOrchestrateRunFailureClass, ObsOrchestrateRunOutcome,
            ObsOrchestrateRunResultRefs, ObsOrchestrateRunToolCallsItem,
            ObsOrchestrateRunToolCallsItemDecision,
        };
        let mut f = session("agent:ops:cron:alice:disk-check");
        f.channel = Some("cron".to_owned());
        f.cron_gate = Some(ObsCronWakeGateRun {
            job_id: "disk-check".to_owned(),
            wake: true,
            duration_ms: 1_003,
            tool_calls: 2,
            est_turns_saved: 0,
        });
        f.orchestrate = (0..8)
            .map(|i| {
                let failed = i == 0;
                ObsOrchestrateRun {
                    run_id: format!("gate_{i:02}"),
                    lease_id: Some(format!("lease_gate_{i:02}")),
                    outcome: if failed {
                        ObsOrchestrateRunOutcome::Failure
                    } else {
                        ObsOrchestrateRunOutcome::Success
                    },
                    duration_ms: if failed { 1_003 } else { 40 },
                    exit_code: if failed { None } else { Some(10) },
                    failure_class: failed.then_some(ObsOrchestrateRunFailureClass::Timeout),
                    tool_calls: vec![
                        ObsOrchestrateRunToolCallsItem {
                            tool: "current_time".to_owned(),
                            capability: "tool:current_time".to_owned(),
                            decision: ObsOrchestrateRunToolCallsItemDecision::Allowed,
                            count: 1,
                        },
                        ObsOrchestrateRunToolCallsItem {
                            tool: "tokens.create".to_owned(),
                            capability: "scope:admin".to_owned(),
                            decision: ObsOrchestrateRunToolCallsItemDecision::Denied,
                            count: 1,
                        },
                    ],
                    result_refs: ObsOrchestrateRunResultRefs {
                        count: 1,
                        bytes: 31,
                    },
                    savings: None,
                }
            })
            .collect();
        turn(&mut f, &[Call("current_time", None, None)], "stop", None);
        f
    }

    fn budget_exceeded() -> SessionFacts {
        let mut f = session("agent:research/api#budget");
        f.agent_id = Some("research".to_owned());
        f.usage.input_tokens = 480_000;
        f.usage.output_tokens = 22_000;
        f.usage.cached_tokens = 0;
        f.usage.cost_usd = 1.734_999_999_7;
        turn(
            &mut f,
            &[Call("web_fetch", None, None), Call("read_file", None, None)],
            "budget_exceeded",
            None,
        );
        f
    }

    fn circuit_open() -> SessionFacts {
        let mut f = session("agent:ops/webhook#breaker");
        f.agent_id = Some("ops".to_owned());
        f.channel = Some("webhook".to_owned());
        turn(&mut f, &[Call("shell", None, None)], "stop", None);
        turn(
            &mut f,
            &[
                Call("shell", Some("timeout"), None),
                Call("shell", Some("timeout"), None),
                Call("shell", Some("failed"), None),
            ],
            "circuit_open",
            None,
        );
        // A synthetic failure of another tool right before the turn end does not name the
        // tool without includeSynthetic.
        let at = f.trace.len() - 2;
        let seq = f.trace[at].seq;
        f.trace.insert(
            at,
            TraceFact {
                synthetic: true,
                tool_name: Some("probe".to_owned()),
                status: Some("error".to_owned()),
                ..row(seq, f.updated_at, "tool_result")
            },
        );
        f
    }

    fn context_loop() -> SessionFacts {
        let mut f = session("agent:main/api#loop");
        let calls: Vec<Call<'_>> = (0..4).map(|_| Call("list_dir", None, None)).collect();
        turn(&mut f, &calls, "context_loop", None);
        f
    }

    fn error_rate_limited() -> SessionFacts {
        let mut f = session("agent:main/v1#rate-limited");
        f.channel = Some("v1".to_owned());
        f.usage.failed_calls = 3;
        turn(&mut f, &[], "error", Some("rate_limited"));
        f
    }

    fn error_timeout() -> SessionFacts {
        let mut f = session("agent:main/api#timeout");
        f.usage.failed_calls = 1;
        turn(&mut f, &[Call("web_search", None, None)], "stop", None);
        turn(&mut f, &[], "error", Some("timeout"));
        f
    }

    fn context_exhausted() -> SessionFacts {
        let mut f = session("agent:main/api#exhausted");
        f.context_budget = Some(budget(ObsContextBudgetVerdict::Exhausted, 32_000));
        turn(&mut f, &[Call("read_file", None, None)], "max_steps", None);
        f
    }

    fn recall_miss() -> SessionFacts {
        let mut f = session("agent:main/api#recall-miss");
        turn(
            &mut f,
            &[
                Call("memory_search", None, Some(0)),
                Call("memory_search", None, Some(0)),
            ],
            "stop",
            None,
        );
        f
    }

    /// 30 turns, each ending with the breaker open after 10 failures over 24 tools.
    fn huge() -> SessionFacts {
        let mut f = session("agent:crawler/api#huge");
        f.agent_id = Some("crawler".to_owned());
        let names: Vec<String> = (0..24)
            .map(|i| format!("fetch_remote_document_{i:02}"))
            .collect();
        let kinds = ["timeout", "not_found", "denied", "limit"];
        for t in 0..30 {
            // The ok call first, so that the turn ends on failures.
            let calls: Vec<Call<'_>> = [Call(&names[t % 24], None, None)]
                .into_iter()
                .chain((0..10).map(|i| {
                    let n = t * 10 + i;
                    Call(&names[n % 24], Some(kinds[(n / 7) % 4]), None)
                }))
                .collect();
            turn(&mut f, &calls, "circuit_open", None);
        }
        f
    }

    fn not_found() -> ExplainInput {
        ExplainInput {
            kind: RefKind::TraceId,
            value: "0af7651916cd43dd8448eb211c80319c".to_owned(),
            depth: Depth::Summary,
            session: None,
        }
    }

    fn all() -> Vec<(&'static str, ExplainInput)> {
        vec![
            ("explain_stop_clean", input(Depth::Summary, stop_clean())),
            (
                "explain_stop_tool_errors",
                input(Depth::Summary, stop_tool_errors()),
            ),
            ("explain_max_steps", input(Depth::Summary, max_steps())),
            (
                "explain_budget_exceeded",
                input(Depth::Summary, budget_exceeded()),
            ),
            (
                "explain_circuit_open",
                input(Depth::Summary, circuit_open()),
            ),
            (
                "explain_context_loop",
                input(Depth::Summary, context_loop()),
            ),
            (
                "explain_error_rate_limited",
                input(Depth::Summary, error_rate_limited()),
            ),
            (
                "explain_error_timeout",
                input(Depth::Summary, error_timeout()),
            ),
            (
                "explain_context_exhausted",
                input(Depth::Summary, context_exhausted()),
            ),
            ("explain_recall_miss", input(Depth::Summary, recall_miss())),
            (
                "explain_orchestrate_failed",
                input(Depth::Summary, gate_failed()),
            ),
            ("explain_session_not_found", not_found()),
            ("explain_huge_summary", input(Depth::Summary, huge())),
            ("explain_huge_full", input(Depth::Full, huge())),
        ]
    }

    #[test]
    fn reports_match_their_golden_files() {
        for (name, i) in all() {
            assert_golden(name, &explain(&i));
        }
    }

    #[test]
    fn equal_inputs_give_identical_bytes() {
        for (name, i) in all() {
            let a = serde_json::to_vec(&explain(&i)).unwrap();
            let b = serde_json::to_vec(&explain(&i.clone())).unwrap();
            assert_eq!(a, b, "{name}");
        }
    }

    #[test]
    fn no_content_reaches_a_report() {
        for (name, i) in all() {
            let text = serde_json::to_string(&explain(&i)).unwrap();
            assert!(!text.contains("CANARY"), "{name}: {text}");
        }
    }

    fn root_code(r: &ObsIncidentReport) -> Option<&str> {
        r.likely_root_cause.as_ref().map(|c| c.code.as_str())
    }

    #[test]
    fn each_outcome_has_its_end_reason_severity_and_root_cause() {
        use ObsIncidentReportOutcomeSeverity as S;
        for (f, end, sev, code) in [
            (stop_clean(), "stop", S::None, None),
            (
                stop_tool_errors(),
                "stop",
                S::None,
                Some("completed_with_tool_errors"),
            ),
            (max_steps(), "max_steps", S::Low, Some("max_steps")),
            (
                budget_exceeded(),
                "budget_exceeded",
                S::Medium,
                Some("budget_exceeded"),
            ),
            (
                circuit_open(),
                "circuit_open",
                S::High,
                Some("tool_circuit_open"),
            ),
            (context_loop(), "context_loop", S::Low, Some("context_loop")),
            (
                error_rate_limited(),
                "error",
                S::High,
                Some("provider_error"),
            ),
            (error_timeout(), "timeout", S::Medium, Some("timeout")),
            (
                context_exhausted(),
                "context_exhausted",
                S::Medium,
                Some("context_exhausted"),
            ),
            (recall_miss(), "stop", S::None, Some("recall_miss")),
            (huge(), "circuit_open", S::High, Some("tool_circuit_open")),
        ] {
            let r = explain(&input(Depth::Summary, f));
            assert_eq!(r.outcome.end_reason, end);
            assert_eq!(r.outcome.severity, sev, "{end}");
            assert_eq!(r.outcome.degraded, end != "stop");
            assert_eq!(root_code(&r), code, "{end}");
            assert!(r.summary.chars().count() <= SUMMARY_CHARS);
            assert!(r.reference.resolved);
        }
        let healthy = explain(&input(Depth::Summary, stop_clean()));
        assert!(healthy.suggested_next_steps.is_empty());
        assert!(healthy.truncations.is_empty());
    }

    #[test]
    fn a_tool_failure_cause_outranks_the_degradation_causes() {
        let mut f = session("agent:main/api#fail-then-max-steps");
        turn(
            &mut f,
            &[
                Call("web_fetch", Some("timeout"), None),
                Call("web_fetch", Some("timeout"), None),
            ],
            "max_steps",
            None,
        );
        let r = explain(&input(Depth::Summary, f));
        let c = r.likely_root_cause.unwrap();
        assert_eq!(c.code, "tool_failures");
        assert_eq!(
            c.detail,
            "2 tool calls failed (web_fetch: 2 × timeout) before the session ended with max_steps."
        );
        assert_eq!(c.suggested_next_steps.len(), 3);
    }

    #[test]
    fn the_breaker_names_the_last_failed_non_synthetic_tool() {
        let r = explain(&input(Depth::Summary, circuit_open()));
        assert_eq!(r.breaker_timeline.len(), 1);
        assert_eq!(r.breaker_timeline[0].tool_name, "shell");
        assert_eq!(r.breaker_timeline[0].event, ObsBreakerEventEvent::Opened);
        // With includeSynthetic the synthetic failure counts.
        let mut f = circuit_open();
        f.include_synthetic = true;
        let r = explain(&input(Depth::Summary, f));
        assert_eq!(r.breaker_timeline.len(), 1);
        assert_eq!(r.breaker_timeline[0].tool_name, "probe");
    }

    #[test]
    fn failures_are_newest_first_without_previews() {
        let r = explain(&input(Depth::Summary, stop_tool_errors()));
        let seqs: Vec<i64> = r.failures.iter().map(|f| f.seq).collect();
        assert_eq!(seqs, vec![4, 2, 1]);
        assert!(r.failures.iter().all(|f| f.error_preview.is_none()));
        assert!(r
            .failures
            .iter()
            .all(|f| f.result_digest.starts_with("sha256:")));
        let web = &r.tool_stats["web_fetch"];
        assert_eq!((web.ok, web.failed), (1, 2));
        assert_eq!(web.top_error_kind.as_deref(), Some("not_found"));
        assert_eq!(
            r.tool_stats["read_file"].top_error_kind.as_deref(),
            Some("denied")
        );
    }

    #[test]
    fn summary_depth_stays_within_its_bound_and_full_keeps_more() {
        let summary = explain(&input(Depth::Summary, huge()));
        let bytes = serde_json::to_vec(&summary).unwrap().len();
        assert!(bytes <= SUMMARY_MAX_BYTES, "{bytes} bytes");
        let failures = summary
            .truncations
            .iter()
            .find(|t| t.member == "failures")
            .unwrap();
        assert_eq!(failures.reason, ObsTruncationReason::SizeCap);
        assert_eq!(failures.kept + failures.dropped, 300);
        assert_eq!(failures.kept, summary.failures.len() as i64);
        assert!(summary.failures.len() < SUMMARY_FAILURES);
        let members: Vec<&str> = summary
            .truncations
            .iter()
            .map(|t| t.member.as_str())
            .collect();
        let mut sorted = members.clone();
        sorted.sort_unstable();
        assert_eq!(members, sorted);

        let full = explain(&input(Depth::Full, huge()));
        assert_eq!(full.failures.len(), FULL_FAILURES);
        assert_eq!(
            full.truncations,
            vec![ObsTruncation {
                member: "failures".to_owned(),
                kept: 200,
                dropped: 100,
                reason: ObsTruncationReason::DepthCap,
            }]
        );
        assert_eq!(full.breaker_timeline.len(), 30);
        assert!(full.failures.len() > summary.failures.len());
        assert!(serde_json::to_vec(&full).unwrap().len() > SUMMARY_MAX_BYTES);
        // Newest first: the first kept failure is the last one of the session.
        assert!(full.failures.windows(2).all(|w| w[0].seq > w[1].seq));
        assert_eq!(full.failures[0].seq, summary.failures[0].seq);
        // The breaker timeline keeps its newest events, in session order.
        assert_eq!(summary.breaker_timeline.len(), SUMMARY_BREAKER_EVENTS);
        assert_eq!(
            summary.breaker_timeline.last(),
            full.breaker_timeline.last()
        );
        assert!(summary
            .breaker_timeline
            .windows(2)
            .all(|w| w[0].seq < w[1].seq));
    }

    #[test]
    fn gate_runs_are_capped_by_depth_and_a_failed_newest_one_is_the_root_cause() {
        let summary = explain(&input(Depth::Summary, gate_failed()));
        let runs = summary.orchestrate.as_ref().unwrap();
        assert_eq!(runs.len(), SUMMARY_ORCHESTRATE);
        assert_eq!(runs[0].run_id, "gate_00", "newest first");
        let cut = summary
            .truncations
            .iter()
            .find(|t| t.member == "orchestrate")
            .unwrap();
        assert_eq!((cut.kept, cut.dropped), (5, 3));
        assert_eq!(cut.reason, ObsTruncationReason::DepthCap);
        let cause = summary.likely_root_cause.unwrap();
        assert_eq!(cause.code, "orchestrate_failed");
        assert!(cause.detail.contains("gate_00") && cause.detail.contains("timeout"));
        assert!(summary.cron_wake_gate.unwrap().wake);
        let full = explain(&input(Depth::Full, gate_failed()));
        assert_eq!(full.orchestrate.unwrap().len(), 8);
        // A newest run that succeeded is no root cause; none at all is no member.
        let mut ok = gate_failed();
        ok.orchestrate.remove(0);
        let r = explain(&input(Depth::Summary, ok));
        assert_ne!(
            r.likely_root_cause.map(|c| c.code).as_deref(),
            Some("orchestrate_failed")
        );
        let r = explain(&input(Depth::Summary, stop_clean()));
        assert!(r.orchestrate.is_none());
    }

    #[test]
    fn an_unresolved_reference_is_a_session_not_found_marker() {
        let r = explain(&not_found());
        assert!(!r.reference.resolved);
        assert_eq!(r.session_key, None);
        assert_eq!(r.outcome.end_reason, "session_not_found");
        assert_eq!(root_code(&r), Some("session_not_found"));
        assert!(r.tool_stats.is_empty() && r.failures.is_empty());

        let long = "k".repeat(300);
        let r = explain(&ExplainInput {
            kind: RefKind::SessionKey,
            value: long.clone(),
            depth: Depth::Full,
            session: None,
        });
        assert_eq!(r.reference.value, long);
        assert_eq!(
            r.summary,
            format!("No session matches sessionKey {}.", "k".repeat(128))
        );
    }

    #[test]
    fn end_reasons_map_finish_reasons() {
        assert_eq!(end_reason(None, None), "unknown");
        assert_eq!(end_reason(Some("error"), Some("timeout")), "timeout");
        assert_eq!(end_reason(Some("error"), Some("rate_limited")), "error");
        assert_eq!(end_reason(Some("max_steps"), None), "max_steps");
        let r = explain(&input(Depth::Summary, session("agent:main/api#new")));
        assert_eq!(r.outcome.end_reason, "unknown");
        assert_eq!(r.outcome.severity, ObsIncidentReportOutcomeSeverity::None);
        assert_eq!(root_code(&r), Some("outcome_unresolved"));
    }

    #[test]
    fn rounding_is_fixed() {
        assert_eq!(usd(0.012_345_678_9), 0.012_346);
        assert_eq!(usd(-1.0), 0.0);
        assert_eq!(usd(f64::NAN), 0.0);
        assert_eq!(ratio(1, 3), 0.3333);
        assert_eq!(ratio(5, 0), 0.0);
        assert_eq!(clip("héllo", 2), "hé");
        assert_eq!(where_value("web fetch"), "'web fetch'");
        assert_eq!(where_value("web_fetch"), "web_fetch");
    }
}
