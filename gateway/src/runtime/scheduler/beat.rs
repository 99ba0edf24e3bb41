//! Heartbeats: a periodic agent turn that checks for pending work, per agent; the coalescer
//! that folds wakes (`scheduler.wake`, webhook wakes, `heartbeat.trigger`) into at most one
//! queued tick; error backoff and alerts.
//!
//! A tick runs in the agent's heartbeat session (`agent:<a>:heartbeat:system:main` unless the
//! settings name another heartbeat session of the agent) as the gateway's `heartbeat:system`
//! principal, which owns that session, with `rpc` tools only. Its message is the prompt, then
//! every pending wake event. Wake sources are short labels kept in the heartbeat state and the
//! `scheduler:heartbeat_check` event, never in the message: a caller of `scheduler.wake` must
//! not be able to add text to the operator's turn.

use std::sync::Arc;

use serde_json::json;

use super::Scheduler;
use crate::api::error::GatewayError;
use crate::api::generated::types as wire;
use crate::api::generated::types::FinishReason;
use crate::clock::now_ms;
use crate::config::agents::HeartbeatSettings;
use crate::config::scheduler::HEARTBEAT_PROMPT;
use crate::providers::ErrorKind;
use crate::runtime::scheduler::schedule::ActiveHours;
use crate::runtime::scheduler::{FireSlots, Slot};
use crate::runtime::sessions::SessionIdent;
use crate::store::scheduler::{BeatClaim, BeatFinish, BeatRow};
use crate::store::sessions::InternalChannel;

/// The principal heartbeat turns run as (the owner of every heartbeat session).
pub const HEARTBEAT_CALLER: &str = "heartbeat:system";

/// The acknowledgement a tick answers when nothing needs attention.
pub const ACK_TOKEN: &str = "HEARTBEAT_OK";

/// The channel and tenant of heartbeat sessions.
const CHANNEL: &str = InternalChannel::Heartbeat.label();
const TENANT: &str = "system";

/// Longest error backoff.
const MAX_BACKOFF_MS: i64 = 3_600_000;
/// First error backoff (doubled per consecutive error).
const FIRST_BACKOFF_MS: i64 = 30_000;

/// The settings in force for one agent: its own over `scheduler.heartbeat`, over the built-in
/// defaults. Every member the catalogue calls always present is set.
pub fn effective(
    defaults: &HeartbeatSettings,
    own: Option<&HeartbeatSettings>,
) -> HeartbeatSettings {
    let builtin = HeartbeatSettings {
        enabled: Some(false),
        interval_ms: Some(1_800_000),
        prompt: Some(HEARTBEAT_PROMPT.to_owned()),
        show_ok: Some(false),
        show_alerts: Some(true),
        allow_dm: Some(false),
        light_context: Some(false),
        ack_max_chars: Some(300),
        response_prefix: Some(String::new()),
        skip_heartbeat_only_delivery: Some(true),
        alert_threshold: Some(3),
        alert_cooldown_ms: Some(3_600_000),
        stale_ms: Some(0),
        ..HeartbeatSettings::default()
    };
    let out = builtin.overlaid(defaults.clone());
    match own {
        Some(own) => out.overlaid(own.clone()),
        None => out,
    }
}

/// The heartbeat session of `agent` the settings name (a key `agent:<agent>:heartbeat:system:
/// <name>`), or the agent's main one.
pub fn session_for(
    agent: &str,
    settings: &HeartbeatSettings,
) -> Result<SessionIdent, GatewayError> {
    let Some(key) = settings.session.as_deref() else {
        return Ok(SessionIdent::internal(
            InternalChannel::Heartbeat,
            agent,
            TENANT,
            "main",
        ));
    };
    match crate::store::sessions::key_parts(key) {
        Some([a, c, t, user]) if a == agent && c == CHANNEL && t == TENANT && !user.is_empty() => {
            Ok(SessionIdent::internal(
                InternalChannel::Heartbeat,
                agent,
                TENANT,
                &user,
            ))
        }
        _ => Err(GatewayError::InvalidParams(format!(
            "session: heartbeat turns run in a heartbeat session of the agent \
             (agent:{agent}:heartbeat:system:<name>), not {key}"
        ))),
    }
}

/// What heartbeat settings must pass beyond their schema, wherever they are written (the
/// file, agents.create/update, heartbeat.update): the session is a heartbeat session of the
/// agent, and the active hours' zone exists.
pub fn check(agent: &str, settings: &HeartbeatSettings) -> Result<(), GatewayError> {
    session_for(agent, settings)?;
    if let Some(h) = &settings.active_hours {
        ActiveHours::parse(&h.start, &h.end, h.tz.as_deref())
            .map_err(|e| GatewayError::InvalidParams(format!("{}: {}", e.member, e.why)))?;
    }
    Ok(())
}

/// The next scheduled tick after `after` (None: scheduled ticks are off), moved into the
/// active hours.
pub fn next_tick(settings: &HeartbeatSettings, after: i64) -> Option<i64> {
    if settings.enabled != Some(true) {
        return None;
    }
    let t = after.saturating_add(settings.interval_ms.unwrap_or(1_800_000).max(1_000));
    Some(match &settings.active_hours {
        Some(h) => match ActiveHours::parse(&h.start, &h.end, h.tz.as_deref()) {
            Ok(window) => window.next_open(t),
            Err(_) => t,
        },
        None => t,
    })
}

/// Longest wake source label.
pub const MAX_SOURCE_CHARS: usize = 64;

/// A wake source as a label `^[A-Za-z0-9_.:-]{1,64}$` (the pattern `scheduler.wake` requires):
/// other characters become `_`, the rest is cut, empty becomes `wake`. Labels from the API
/// already match; this holds the same shape for sources built inside the gateway
/// (`webhook:<mapping id>`, where a mapping id is free text).
pub fn source_label(raw: &str) -> String {
    let label: String = raw
        .chars()
        .take(MAX_SOURCE_CHARS)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if label.is_empty() {
        "wake".to_owned()
    } else {
        label
    }
}

/// The message of a tick: the prompt, then the pending events' texts (webhook events arrive
/// already marked as untrusted external content). The wake sources are not part of it.
pub fn tick_message(prompt: &str, claim: &BeatClaim) -> String {
    let mut out = prompt.to_owned();
    for (_, text) in &claim.events {
        out.push_str("\n\n");
        out.push_str(text);
    }
    out
}

/// Whether a reply only acknowledges: the token plus at most `max_other` other characters.
pub fn is_ack(reply: &str, max_other: i64) -> bool {
    reply.contains(ACK_TOKEN)
        && i64::try_from(reply.replace(ACK_TOKEN, "").trim().chars().count()).unwrap_or(i64::MAX)
            <= max_other
}

/// Error backoff after `n` consecutive errors.
pub fn backoff_ms(n: i64, interval: i64) -> i64 {
    let exp = u32::try_from((n - 1).clamp(0, 20)).unwrap_or(20);
    FIRST_BACKOFF_MS
        .saturating_mul(1_i64 << exp)
        .min(MAX_BACKOFF_MS)
        .min(interval.max(FIRST_BACKOFF_MS))
}

fn owner() -> Arc<str> {
    Arc::from(HEARTBEAT_CALLER)
}

impl Scheduler {
    /// One agent's heartbeat settings in force.
    pub fn heartbeat_of(&self, agent: &crate::runtime::agents::Agent) -> HeartbeatSettings {
        effective(&self.config.heartbeat, agent.config.heartbeat.as_ref())
    }

    /// Makes every agent's scheduled tick agree with its settings (at start and after the
    /// settings changed): an enabled heartbeat without a tick gets one an interval from now,
    /// unless a permanent error stopped it; a disabled one loses its tick.
    pub async fn sync_heartbeats(&self) -> Result<(), GatewayError> {
        let now = now_ms();
        let rows = self.beats_by_agent().await?;
        for agent in self.agents.all() {
            let settings = self.heartbeat_of(&agent);
            let row = rows.get(&agent.id);
            let has_tick = row.is_some_and(|r| r.next_due_at.is_some());
            let stopped = row.is_some_and(|r| r.last_error_kind.as_deref() == Some("permanent"));
            match (settings.enabled == Some(true), has_tick) {
                (true, false) if !stopped => {
                    self.store
                        .beat_schedule(&agent.id, next_tick(&settings, now), false, now)
                        .await?
                }
                (false, true) => {
                    self.store
                        .beat_schedule(&agent.id, None, false, now)
                        .await?
                }
                _ => {}
            }
        }
        super::rearm(&self.control);
        Ok(())
    }

    /// heartbeat.update: merges `change` into the agent's own settings and re-plans its tick;
    /// whether anything changed, and its own settings after.
    pub async fn heartbeat_update(
        &self,
        agent_id: &str,
        change: HeartbeatSettings,
    ) -> Result<(bool, HeartbeatSettings), GatewayError> {
        let agent = self.agents.require(agent_id)?;
        let own = agent.config.heartbeat.clone().unwrap_or_default();
        let mut merged = own.clone().overlaid(change);
        if merged
            .active_hours
            .as_ref()
            .is_some_and(|h| h.start == h.end || (h.start == "00:00" && h.end == "24:00"))
        {
            merged.active_hours = None;
        }
        check(&agent.id, &merged)?;
        if merged == own {
            return Ok((false, own));
        }
        let change = crate::config::agents::AgentSettings {
            heartbeat: Some(merged.clone()),
            ..Default::default()
        };
        let snap = self.providers.snapshot();
        self.agents.update(&agent.id, change, &snap, false).await?;
        let now = now_ms();
        let settings = effective(&self.config.heartbeat, Some(&merged));
        self.store
            .beat_schedule(&agent.id, next_tick(&settings, now), true, now)
            .await?;
        self.changed().await;
        Ok((true, merged))
    }

    /// The coalescer: queues one tick of the agent unless one is queued (true: this call
    /// queued it). `event` is kept for that tick's message.
    pub async fn heartbeat_wake(
        &self,
        agent_id: &str,
        source: &str,
        event: Option<&str>,
        bypass_backoff: bool,
    ) -> Result<bool, GatewayError> {
        let now = now_ms();
        let source = source_label(source);
        if let Some(text) = event {
            self.store.beat_event(agent_id, &source, text, now).await?;
        }
        let queued = self
            .store
            .beat_wake(agent_id, &source, bypass_backoff, now)
            .await?;
        // A folded trigger may have let the queued wake run now: the timer looks again.
        if queued || bypass_backoff {
            self.changed().await;
        }
        Ok(queued)
    }

    /// An event for the agent's next tick, without waking it (webhook `next-heartbeat`).
    pub async fn heartbeat_event(
        &self,
        agent_id: &str,
        source: &str,
        text: &str,
    ) -> Result<(), GatewayError> {
        self.store
            .beat_event(agent_id, &source_label(source), text, now_ms())
            .await
    }

    /// Claims and starts the due ticks (while slots are free); the earliest due time of the
    /// others.
    pub(super) async fn beat_pass(
        self: &Arc<Self>,
        now: i64,
        max: usize,
    ) -> Result<Option<i64>, GatewayError> {
        let mut earliest: Option<i64> = None;
        for row in self.store.beats().await? {
            let Some(due) = row.due() else { continue };
            let Some(agent) = self.agents.get(&row.agent_id) else {
                continue;
            };
            if due > now {
                earliest = Some(earliest.map_or(due, |e| e.min(due)));
                continue;
            }
            let Some(slot) = FireSlots::take(&self.control, max) else {
                earliest = Some(earliest.map_or(due, |e| e.min(due)));
                continue;
            };
            let settings = self.heartbeat_of(&agent);
            let scheduled = row.next_due_at.is_some_and(|n| n <= now);
            let next = if scheduled
                || (row.next_due_at.is_none()
                    && settings.enabled == Some(true)
                    && row.last_error_kind.as_deref() != Some("permanent"))
            {
                next_tick(&settings, now)
            } else {
                row.next_due_at
            };
            let reason = match (row.wake_at.is_some(), row.bypass_backoff) {
                (true, true) => "trigger",
                (true, false) => "wake",
                (false, _) => "scheduled",
            };
            if let Some(claim) = self.store.beat_claim(&row, next, now).await? {
                spawn_tick(self.clone(), agent, settings, row, claim, reason, slot);
            }
        }
        Ok(earliest)
    }

    /// Every heartbeat row, by agent.
    async fn beats_by_agent(
        &self,
    ) -> Result<std::collections::BTreeMap<String, BeatRow>, GatewayError> {
        Ok(self
            .store
            .beats()
            .await?
            .into_iter()
            .map(|r| (r.agent_id.clone(), r))
            .collect())
    }

    /// heartbeat.states.
    pub async fn heartbeat_states(&self) -> Result<Vec<wire::HeartbeatState>, GatewayError> {
        let rows = self.beats_by_agent().await?;
        Ok(self
            .agents
            .all()
            .into_iter()
            .map(|a| {
                let s = self.heartbeat_of(&a);
                let r = rows.get(&a.id).cloned().unwrap_or_default();
                wire::HeartbeatState {
                    agent_id: a.id.clone(),
                    enabled: s.enabled == Some(true),
                    interval_ms: s.interval_ms.unwrap_or(0),
                    last_run_ms: r.last_run_at,
                    next_due_ms: r.next_due_at,
                    consecutive_errors: r.consecutive_errors,
                    backoff_until_ms: r.backoff_until.filter(|b| *b > now_ms()),
                    tick_started_at_ms: r.running_since,
                    last_alert_ms: r.last_alert_at,
                    last_error_kind: match r.last_error_kind.as_deref() {
                        Some("transient") => Some(wire::HeartbeatStateLastErrorKind::Transient),
                        Some("permanent") => Some(wire::HeartbeatStateLastErrorKind::Permanent),
                        _ => None,
                    },
                }
            })
            .collect())
    }
}

fn spawn_tick(
    scheduler: Arc<Scheduler>,
    agent: Arc<crate::runtime::agents::Agent>,
    settings: HeartbeatSettings,
    row: BeatRow,
    claim: BeatClaim,
    reason: &'static str,
    slot: Slot,
) {
    #[allow(
        clippy::disallowed_methods,
        reason = "a heartbeat tick ends with its turn and holds its slot until then"
    )]
    tokio::spawn(async move {
        let _slot = slot;
        let owner = owner();
        scheduler.control.events.publish_to(
            &owner,
            "scheduler:heartbeat_check",
            json!({"agentId": agent.id, "reason": reason, "sources": claim.sources,
                   "pendingEvents": claim.events.len(), "node": scheduler.store.node()}),
        );
        let result = tick(&scheduler, &agent, &settings, &claim).await;
        let now = now_ms();
        let interval = settings.interval_ms.unwrap_or(1_800_000);
        let mut finish = BeatFinish {
            last_alert_at: row.last_alert_at,
            ..BeatFinish::default()
        };
        match result {
            Ok((run_id, reply)) => {
                let ack = is_ack(&reply, settings.ack_max_chars.unwrap_or(300));
                if !ack || settings.show_ok == Some(true) {
                    scheduler.control.events.publish_to(
                        &owner,
                        "scheduler:heartbeat_delivered",
                        json!({"agentId": agent.id, "runId": run_id, "ack": ack,
                               "chars": reply.chars().count()}),
                    );
                }
            }
            Err((permanent, error)) => {
                let n = row.consecutive_errors + 1;
                finish.consecutive_errors = n;
                finish.last_error_kind =
                    Some(if permanent { "permanent" } else { "transient" }.into());
                finish.last_error = Some(error.clone());
                finish.stop_schedule = permanent;
                if !permanent {
                    finish.backoff_until = Some(now + backoff_ms(n, interval));
                }
                let threshold = settings.alert_threshold.unwrap_or(3);
                let cooldown = settings.alert_cooldown_ms.unwrap_or(3_600_000);
                if n >= threshold && row.last_alert_at.is_none_or(|t| now - t >= cooldown) {
                    finish.last_alert_at = Some(now);
                    if settings.show_alerts != Some(false) {
                        scheduler.control.events.publish_to(
                            &owner,
                            "scheduler:heartbeat_alert",
                            json!({"agentId": agent.id, "consecutiveErrors": n,
                                   "threshold": threshold, "lastErrorKind": finish.last_error_kind,
                                   "error": error}),
                        );
                    }
                }
            }
        }
        if let Err(e) = scheduler
            .store
            .beat_finish(&agent.id, claim.tick_seq, &finish, now)
            .await
        {
            tracing::error!(agent = %agent.id, error = %e, "heartbeat outcome not recorded");
        }
    });
}

/// The tick's turn: its run id and reply, or whether the error is permanent and its text.
async fn tick(
    scheduler: &Arc<Scheduler>,
    agent: &Arc<crate::runtime::agents::Agent>,
    settings: &HeartbeatSettings,
    claim: &BeatClaim,
) -> Result<(String, String), (bool, String)> {
    let session = session_for(&agent.id, settings).map_err(|e| (true, e.to_string()))?;
    let prompt = settings.prompt.as_deref().unwrap_or(HEARTBEAT_PROMPT);
    let spec = scheduler.scheduled_run(
        agent.clone(),
        session,
        tick_message(prompt, claim),
        HEARTBEAT_CALLER,
        settings.model.clone(),
    );
    let started = scheduler.runs.start_run(spec).await.map_err(|e| {
        let permanent = matches!(
            e,
            GatewayError::NotFound(_) | GatewayError::Conflict(_) | GatewayError::InvalidParams(_)
        );
        (permanent, e.to_string())
    })?;
    let (row, turn) = started
        .done
        .await
        .map_err(|e| (false, format!("the tick's task ended: {e}")))?;
    match turn {
        Some(t) if t.finish != FinishReason::Error => Ok((row.run_id, t.response)),
        Some(t) => {
            let permanent = t.failure.is_some_and(|f| {
                matches!(
                    f.kind,
                    ErrorKind::Auth
                        | ErrorKind::NotFound
                        | ErrorKind::MissingKey
                        | ErrorKind::InvalidRequest
                )
            });
            Err((permanent, super::failure_text(&t)))
        }
        None => Err((false, row.error.unwrap_or_else(|| "the turn failed".into()))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn is_label(s: &str) -> bool {
        (1..=MAX_SOURCE_CHARS).contains(&s.chars().count())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'))
    }

    #[test]
    fn sources_become_labels() {
        assert_eq!(source_label("webhook:github-push"), "webhook:github-push");
        assert_eq!(
            source_label("webhook:my hook; ignore previous"),
            "webhook:my_hook__ignore_previous"
        );
        assert_eq!(source_label(""), "wake");
        let at = "a".repeat(MAX_SOURCE_CHARS);
        assert_eq!(source_label(&at), at);
        assert_eq!(source_label(&format!("{at}b")), at);
        for raw in ["webhook:é/x\n", "webhook:\u{202e}", &"ü".repeat(100)] {
            assert!(is_label(&source_label(raw)), "{raw:?}");
        }
    }

    #[test]
    fn the_tick_message_holds_no_source() {
        let claim = BeatClaim {
            sources: vec!["probe-label".into()],
            events: vec![("webhook:x".into(), "an event".into())],
            ..BeatClaim::default()
        };
        let m = tick_message("Heartbeat", &claim);
        assert_eq!(m, "Heartbeat\n\nan event");
    }
}
