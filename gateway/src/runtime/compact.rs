//! Session compaction: the transcript is summarised by the agent's summarize model and
//! replaced by one system message holding the summary.

use tokio_util::sync::CancellationToken;

use crate::error::GatewayError;
use crate::runtime::agents::Agent;
use crate::runtime::engine::Engine;
use crate::runtime::providers::{ChatMessage, ChatRequest};
use crate::runtime::sessions;
use crate::runtime::turn::CallFor;
use crate::store::sessions::MessageRow;
use crate::tenancy::Tenant;

/// Messages below which a history is not worth compacting.
pub const MIN_MESSAGES: usize = 4;

const PROMPT: &str = "You summarise conversations. Write a concise summary of the conversation \
below that keeps every fact, decision, name, number and open question needed to continue it. \
Answer with the summary only.";

/// What a compaction did.
pub struct Compaction {
    pub triggered: bool,
    pub previous_count: usize,
    pub count: usize,
    pub previous_tokens: u64,
    pub tokens: u64,
}

fn estimate(rows: &[MessageRow]) -> u64 {
    rows.iter()
        .map(|r| match sessions::to_chat(r) {
            Some(m) => sessions::message_tokens(&m),
            None => 4 + crate::runtime::providers::scripted::estimate_tokens(&r.content),
        })
        .sum()
}

impl Engine {
    /// Compacts a session's transcript (holding its turn lock).
    pub async fn compact(
        &self,
        tenant: &Tenant,
        owner: Option<&str>,
        agent: &Agent,
        key: &str,
        instructions: Option<&str>,
    ) -> Result<Compaction, GatewayError> {
        let lock = self.locks.lock_for(key);
        let _guard = lock.lock().await;
        let rows = self.store.session_all_messages(tenant, key).await?;
        let owner: Option<std::sync::Arc<str>> = owner.map(std::sync::Arc::from);
        let previous_tokens = estimate(&rows);
        if rows.len() < MIN_MESSAGES {
            return Ok(Compaction {
                triggered: false,
                previous_count: rows.len(),
                count: rows.len(),
                previous_tokens,
                tokens: previous_tokens,
            });
        }
        let mut text = String::new();
        for r in &rows {
            text.push_str(&format!("[{}] {}\n", r.role, r.content));
        }
        let system = match instructions {
            Some(i) => format!("{PROMPT}\n\nAlso: {i}"),
            None => PROMPT.to_owned(),
        };
        let model = agent
            .operation_model("summarize")
            .unwrap_or(agent.model())
            .to_owned();
        let request = ChatRequest {
            model: String::new(),
            system: Some(system),
            messages: vec![ChatMessage::user(text)],
            tools: Vec::new(),
            max_tokens: Some(1024),
            temperature: None,
        };
        let called = self
            .call_chain(
                &[model],
                request,
                None,
                &CancellationToken::new(),
                CallFor {
                    agent_id: &agent.id,
                    session_key: Some(key),
                    owner: owner.as_ref(),
                    operation: "summarize",
                },
            )
            .await
            .map_err(|e| {
                GatewayError::Unavailable(format!(
                    "The summary could not be made ({}): {}",
                    e.kind.as_str(),
                    e.message
                ))
            })?;
        let summary = MessageRow {
            role: "system".to_owned(),
            content: called.response.content,
            model: Some(called.model.id()),
            input_tokens: Some(called.response.usage.input as i64),
            output_tokens: Some(called.response.usage.output as i64),
            created_at: crate::store::now_ms(),
            ..MessageRow::default()
        };
        let kept = vec![summary];
        self.store.session_replace_messages(key, &kept).await?;
        let tokens = estimate(&kept);
        // For obs.context.dag's compaction history.
        crate::obs::recorder::session_event(
            &self.store,
            "session.compacted",
            owner.as_deref(),
            key,
            serde_json::json!({"depth": 1, "nodesCompacted": rows.len(),
                               "tokensBefore": previous_tokens, "tokensAfter": tokens}),
        );
        Ok(Compaction {
            triggered: true,
            previous_count: rows.len(),
            count: kept.len(),
            previous_tokens,
            tokens,
        })
    }
}
