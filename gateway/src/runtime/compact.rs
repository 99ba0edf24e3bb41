//! Session compaction: the conversation's summary tree is grown over everything but the recent
//! messages (through the agent's summarize model). The transcript itself is kept whole.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::api::error::GatewayError;
use crate::api::tenancy::Tenant;
use crate::runtime::agents::Agent;
use crate::runtime::context_tree::{max_raw, view, Builder, Goal};
use crate::runtime::turn::Turns;

/// What a compaction did; counts and tokens are of what the model would get (each top-level
/// summary one message, then the messages no summary covers).
pub struct Compaction {
    pub triggered: bool,
    pub previous_count: usize,
    pub count: usize,
    pub previous_tokens: u64,
    pub tokens: u64,
}

impl Turns {
    /// Compacts a session (holding its turn lock): leaves over the messages older than the
    /// last `keepRecentMessages`, and every condensation they make due. Not triggered when
    /// nothing is old enough.
    pub async fn compact(
        &self,
        tenant: &Tenant,
        owner: Option<&str>,
        agent: &Agent,
        key: &str,
        channel: &str,
        instructions: Option<&str>,
    ) -> Result<Compaction, GatewayError> {
        let lock = self.locks.lock_for(key);
        let _guard = lock.lock().await;
        let defaults = self.agents.defaults();
        let cfg = defaults.context.clone();
        let max_raw = max_raw(defaults.max_history_messages, &cfg);
        let (mut top, mut raw) = self.context_load(tenant, key).await?;
        let (previous_count, previous_tokens) = view(&top, &raw, max_raw);
        let owner: Option<Arc<str>> = owner.map(Arc::from);
        let cancel = CancellationToken::new();
        let mut b = Builder::new(
            self,
            agent,
            key,
            channel,
            owner.as_ref(),
            &cfg,
            instructions,
            &cancel,
        );
        let grown = b.grow(&mut top, &mut raw, Goal::All).await;
        let (count, tokens) = view(&top, &raw, max_raw);
        // Nodes stored before a failure stay (each is whole); the diagnostic says what was.
        b.record(&top, previous_tokens, tokens, "compact");
        grown.map_err(|e| e.into_gateway())?;
        Ok(Compaction {
            triggered: b.made_any(),
            previous_count,
            count,
            previous_tokens,
            tokens,
        })
    }
}
