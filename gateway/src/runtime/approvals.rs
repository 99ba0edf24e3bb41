//! Human approval of tool calls (`autonomy.approvals`, `admin.approval.*`): a call of a tool
//! the policy names waits for an operator's decision; a denial is remembered per (session,
//! tool, arguments) until `admin.approval.clearDenialCache` or `session.reset`. The request
//! is a row of `approvals`, so any node may resolve it; the waiting turn hears a decision made
//! on this node at once and one made elsewhere at its next look at the row.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::error::GatewayError;
use crate::config::autonomy::ApprovalsConfig;
use crate::runtime::control::Control;
use crate::store::approvals::ApprovalRow;
use crate::store::Store;

/// How often a waiting turn looks at its request's row (a decision made on another node).
const POLL: Duration = Duration::from_millis(500);
/// Longest summary of a call.
const MAX_SUMMARY: usize = 300;

/// An operator's answer to one tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Approved,
    /// Denied (by an operator, by lapse or from the denial cache): the text the model sees.
    Denied(String),
}

/// Decisions made on this node, by request id, for the turns waiting here (process-wide:
/// a request raised by one server generation is resolved through the next).
#[derive(Default)]
pub struct Waiters {
    map: Mutex<HashMap<String, watch::Sender<Option<Decision>>>>,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<Option<Decision>>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait(&self, id: &str) -> watch::Receiver<Option<Decision>> {
        self.lock()
            .entry(id.to_owned())
            .or_insert_with(|| watch::channel(None).0)
            .subscribe()
    }

    fn done(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Hands a decision to the turn waiting on this node, if one is.
    pub fn decide(&self, id: &str, d: Decision) {
        if let Some(tx) = self.lock().get(id) {
            tx.send_replace(Some(d));
        }
    }
}

/// A compiled policy: which tool calls wait for a decision.
pub struct Policy {
    all: Vec<wildmatch::WildMatch>,
    agents: HashMap<String, Vec<wildmatch::WildMatch>>,
    timeout: Duration,
}

impl Policy {
    pub fn new(c: &ApprovalsConfig) -> Self {
        let compile = |v: &[String]| v.iter().map(|p| wildmatch::WildMatch::new(p)).collect();
        Self {
            all: compile(&c.tools),
            agents: c
                .agents
                .iter()
                .map(|(a, v)| (a.clone(), compile(v)))
                .collect(),
            timeout: Duration::from_secs(u64::from(c.timeout_seconds.max(1))),
        }
    }

    /// Whether no call ever waits (the default): the turn skips the check entirely.
    pub fn is_empty(&self) -> bool {
        self.all.is_empty() && self.agents.is_empty()
    }

    /// Whether `agent`'s call of `tool` needs a decision.
    pub fn needs(&self, agent: &str, tool: &str) -> bool {
        self.all.iter().any(|p| p.matches(tool))
            || self
                .agents
                .get(agent)
                .is_some_and(|v| v.iter().any(|p| p.matches(tool)))
    }
}

/// The digest of a call's arguments: SHA-256 of the canonical JSON (keys sorted).
pub fn digest(tool: &str, args: &Value) -> String {
    let mut h = Sha256::new();
    h.update(tool.as_bytes());
    h.update([0]);
    h.update(crate::runtime::turn::canonical_json(args).as_bytes());
    hex::encode(h.finalize())
}

/// A content-free line about the call: the tool and the names of its arguments.
pub fn summary(tool: &str, args: &Value) -> String {
    let names: Vec<&str> = args
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let mut s = if names.is_empty() {
        format!("{tool} with no arguments")
    } else {
        format!("{tool} with arguments: {}", names.join(", "))
    };
    if s.len() > MAX_SUMMARY {
        let mut cut = MAX_SUMMARY;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// One tool call asking.
pub struct Ask<'a> {
    pub session_key: &'a str,
    pub agent_id: &'a str,
    pub tool: &'a str,
    pub args: &'a Value,
    pub owner: &'a str,
    pub run_id: Option<&'a str>,
    /// The turn going away (a kill, the caller leaving) stops the wait.
    pub cancel: &'a CancellationToken,
}

/// Approvals of tool calls: the policy of this generation, the store, the waiters.
pub struct Approvals {
    store: Store,
    control: Arc<Control>,
    policy: Policy,
}

impl Approvals {
    pub fn new(store: Store, control: Arc<Control>, c: &ApprovalsConfig) -> Self {
        Self {
            store,
            control,
            policy: Policy::new(c),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Raises a request for the call and waits for its decision (a remembered denial answers
    /// at once). Store failures deny: a call that needs approval never runs without one.
    pub async fn ask(&self, a: Ask<'_>) -> Decision {
        match self.ask_inner(&a).await {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(tool = a.tool, error = %e, "approval request failed; the call is denied");
                Decision::Denied("not run: the approval request could not be recorded".into())
            }
        }
    }

    async fn ask_inner(&self, a: &Ask<'_>) -> Result<Decision, GatewayError> {
        let digest = digest(a.tool, a.args);
        if let Some(reason) = self
            .store
            .denial_get(a.session_key, a.tool, &digest)
            .await?
        {
            return Ok(Decision::Denied(denied_text(reason.as_deref(), true)));
        }
        let now = crate::clock::now_ms();
        let row = ApprovalRow {
            id: format!("appr_{}", uuid::Uuid::new_v4().simple()),
            session_key: a.session_key.to_owned(),
            agent_id: a.agent_id.to_owned(),
            tool_name: a.tool.to_owned(),
            summary: summary(a.tool, a.args),
            args_digest: digest,
            owner: a.owner.to_owned(),
            run_id: a.run_id.map(str::to_owned),
            created_at: now,
            expires_at: now + self.policy.timeout.as_millis() as i64,
            status: "pending".into(),
            ..ApprovalRow::default()
        };
        let waiters = &self.control.approvals;
        let mut rx = waiters.wait(&row.id);
        self.store.approval_insert(&row).await?;
        self.control.events.publish_owned(
            Some(Arc::from(row.owner.as_str())),
            "approval:requested",
            json!({
                "id": row.id,
                "sessionKey": row.session_key,
                "agentId": row.agent_id,
                "toolName": row.tool_name,
                "summary": row.summary,
                "createdAt": row.created_at,
                "expiresAt": row.expires_at,
            }),
        );
        let decided = self.wait_for(&row, &mut rx, a.cancel).await;
        waiters.done(&row.id);
        decided
    }

    /// Waits for the decision of `row`: from this node's waiters, from the row (another
    /// node), or the lapse at `expires_at`.
    async fn wait_for(
        &self,
        row: &ApprovalRow,
        rx: &mut watch::Receiver<Option<Decision>>,
        cancel: &CancellationToken,
    ) -> Result<Decision, GatewayError> {
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis((row.expires_at - row.created_at).max(0) as u64);
        // Only a shared database has other nodes whose decisions must be read from the row;
        // on SQLite every decision arrives through this node's waiters.
        let poll = if self.store.is_shared() {
            POLL
        } else {
            Duration::from_secs(u64::from(crate::config::autonomy::MAX_APPROVAL_SECONDS))
        };
        loop {
            tokio::select! {
                changed = async { rx.wait_for(Option::is_some).await.map(|d| d.clone()) } => {
                    if let Ok(d) = changed {
                        return Ok(d.unwrap_or(Decision::Denied(denied_text(None, false))));
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    if self.store.approval_lapse(&row.id, crate::clock::now_ms()).await? {
                        self.publish_resolved(row, false, "lapsed", Some("no decision in time"));
                        return Ok(Decision::Denied(
                            "not run: the approval request lapsed unanswered".into(),
                        ));
                    }
                }
                () = cancel.cancelled() => {
                    self.store.approval_lapse(&row.id, crate::clock::now_ms()).await?;
                    return Ok(Decision::Denied("not run: the turn was stopped".into()));
                }
                () = tokio::time::sleep(poll) => {}
            }
            // Decided here or elsewhere: the row says how.
            if let Some(r) = self.store.approval_get(&row.id).await? {
                match r.status.as_str() {
                    "approved" => return Ok(Decision::Approved),
                    "denied" => {
                        return Ok(Decision::Denied(denied_text(r.reason.as_deref(), false)))
                    }
                    "expired" => {
                        return Ok(Decision::Denied(
                            "not run: the approval request lapsed unanswered".into(),
                        ))
                    }
                    _ => {}
                }
            }
        }
    }

    fn publish_resolved(&self, row: &ApprovalRow, approved: bool, by: &str, reason: Option<&str>) {
        self.control.events.publish_owned(
            Some(Arc::from(row.owner.as_str())),
            "approval:resolved",
            json!({
                "id": row.id,
                "sessionKey": row.session_key,
                "toolName": row.tool_name,
                "approved": approved,
                "approvedBy": by,
                "reason": reason,
            }),
        );
    }

    /// Decides one pending request (from any node). None when it is unknown, decided or
    /// lapsed. A denial is remembered for its (session, tool, arguments).
    pub async fn resolve(
        &self,
        id: &str,
        approved: bool,
        by: &str,
        reason: Option<&str>,
    ) -> Result<Option<ApprovalRow>, GatewayError> {
        let now = crate::clock::now_ms();
        let Some(row) = self
            .store
            .approval_decide(id, approved, by, reason, now)
            .await?
        else {
            return Ok(None);
        };
        if !approved {
            self.store
                .denial_remember(
                    &row.session_key,
                    &row.tool_name,
                    &row.args_digest,
                    reason,
                    now,
                )
                .await?;
        }
        let d = if approved {
            Decision::Approved
        } else {
            Decision::Denied(denied_text(reason, false))
        };
        self.control.approvals.decide(id, d);
        self.publish_resolved(&row, approved, by, reason);
        Ok(Some(row))
    }

    /// Requests waiting now (of one session when given), oldest first.
    pub async fn pending(
        &self,
        session_key: Option<&str>,
    ) -> Result<Vec<ApprovalRow>, GatewayError> {
        self.store
            .approvals_pending(crate::clock::now_ms(), session_key)
            .await
    }

    /// Forgets remembered denials (every one, or one session's).
    pub async fn clear_denials(&self, session_key: Option<&str>) -> Result<u64, GatewayError> {
        self.store.denials_clear(session_key).await
    }
}

/// What the model reads for a denied call.
fn denied_text(reason: Option<&str>, remembered: bool) -> String {
    let head = if remembered {
        "not run: an operator denied this call earlier in this session"
    } else {
        "not run: an operator denied this call"
    };
    match reason {
        Some(r) => format!("{head} ({r})"),
        None => head.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_matches_patterns_for_every_agent_and_per_agent() {
        let p = Policy::new(&ApprovalsConfig {
            tools: vec!["save_*".into()],
            agents: [("ops".to_owned(), vec!["memory_store".to_owned()])].into(),
            timeout_seconds: 5,
        });
        assert!(!p.is_empty());
        assert!(p.needs("any", "save_file"));
        assert!(!p.needs("any", "memory_store"));
        assert!(p.needs("ops", "memory_store"));
        assert!(!p.needs("ops", "current_time"));
        assert!(Policy::new(&ApprovalsConfig::default()).is_empty());
    }

    #[test]
    fn summaries_name_arguments_never_values_and_digests_ignore_key_order() {
        let args = json!({"path": "secret.txt", "content": "sk-live-123"});
        let s = summary("save_file", &args);
        assert!(s.contains("path") && s.contains("content"), "{s}");
        assert!(!s.contains("secret.txt") && !s.contains("sk-live"), "{s}");
        assert_eq!(
            summary("current_time", &json!({})),
            "current_time with no arguments"
        );
        let swapped = json!({"content": "sk-live-123", "path": "secret.txt"});
        assert_eq!(digest("save_file", &args), digest("save_file", &swapped));
        assert_ne!(digest("save_file", &args), digest("other", &args));
        let long: serde_json::Map<String, Value> = (0..100)
            .map(|i| (format!("argument_{i}"), json!(1)))
            .collect();
        assert!(summary("t", &Value::Object(long)).len() <= MAX_SUMMARY + 3);
    }
}
