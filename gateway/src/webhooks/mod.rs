//! Webhook ingestion: the strict signed endpoint (`<base>/webhook`) and the mapped endpoints
//! (`<base>/<path>`), which turn outside events into agent runs or heartbeat wakes. The
//! routes live in `http/webhooks.rs`; this module holds what one server generation needs: the
//! mappings in force, the verifiers, the replay window, and the run queue they feed (its home
//! is `runtime/queue.rs`). A delivery becomes a run request (`RunSpec`) here.

/// The `webhooks` configuration keys (owned by `config`, read here).
use crate::config::webhooks as settings;
pub mod template;
pub mod verify;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use settings::{MappingConfig, WebhooksConfig};
use verify::Verifier;

use crate::config::ConfigError;
use crate::runtime::queue::RunQueue;

/// Deliveries remembered for replay detection at most (rows of `webhook_deliveries`).
pub const REPLAY_CAPACITY: i64 = 100_000;
/// A rendered session key is cut to this many characters.
const SESSION_KEY_CHARS: usize = 200;

/// The webhook routes of one server generation.
pub struct Webhooks {
    /// The configured base path, e.g. `/hooks`.
    pub base: String,
    mappings: Vec<MappingConfig>,
    /// Checks mapped requests when `webhooks.token` is set.
    pub mapped: Option<Verifier>,
    /// Checks the strict endpoint (`hmac.secret`, else `webhooks.token`).
    pub strict: Option<Verifier>,
    pub max_body_bytes: u64,
    /// How long a signed delivery is remembered (replays within it are not run again).
    pub replay_window: Duration,
    /// The durable queue its agent runs wait in.
    pub queue: RunQueue,
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhooks")
            .field("base", &self.base)
            .field("mappings", &self.mappings.len())
            .finish_non_exhaustive()
    }
}

impl Webhooks {
    /// The routes in force for `c`; None when webhooks are disabled.
    pub fn new(c: &WebhooksConfig) -> Result<Option<Self>, ConfigError> {
        if !c.enabled {
            return Ok(None);
        }
        let h = &c.hmac;
        let verifier = |secret: String| {
            Verifier::new(
                secret.as_bytes(),
                h.algorithm,
                &h.header_name,
                &h.timestamp_header_name,
                h.max_age_sec,
                h.require_timestamp,
            )
        };
        let token = c
            .token
            .as_ref()
            .map(|t| t.resolve("webhooks.token"))
            .transpose()?;
        let strict_secret = match &c.hmac.secret {
            Some(s) => Some(s.resolve("webhooks.hmac.secret")?),
            None => token.clone(),
        };
        if strict_secret.is_none() {
            tracing::warn!("webhooks: neither webhooks.hmac.secret nor webhooks.token is set; the strict endpoint refuses every request");
        }
        if token.is_none() {
            tracing::warn!("webhooks: webhooks.token is not set; mapped webhook requests are not authenticated");
        }
        Ok(Some(Self {
            base: format!("/{}", settings::normalize(&c.path)),
            mappings: settings::effective_mappings(c),
            mapped: token.map(verifier),
            strict: strict_secret.map(verifier),
            max_body_bytes: c.max_body_bytes,
            // A timestamp is accepted maxAgeSec either side of ours, so one signed request
            // stays acceptable for twice that.
            replay_window: Duration::from_secs(2 * c.hmac.max_age_sec.max(1) + 1),
            queue: RunQueue::new(c.max_concurrent_runs, c.max_queued_runs),
        }))
    }

    /// The first mapping (in order) matching a normalized path and the payload.
    pub fn route(&self, path: &str, payload: &Value) -> Option<&MappingConfig> {
        let source = payload.get("source").and_then(Value::as_str);
        self.mappings.iter().find(|m| match &m.matches {
            None => true,
            Some(x) => {
                x.path
                    .as_deref()
                    .is_none_or(|p| settings::normalize(p) == path)
                    && x.source.as_deref().is_none_or(|s| source == Some(s))
            }
        })
    }
}

/// What the templates of one request read.
pub struct RequestContext {
    pub payload: Value,
    pub headers: BTreeMap<String, String>,
    pub query: BTreeMap<String, String>,
    pub path: String,
    pub now: String,
}

impl RequestContext {
    pub fn render(&self, template: &str) -> String {
        template::render(
            template,
            &template::Context {
                payload: &self.payload,
                headers: &self.headers,
                query: &self.query,
                path: &self.path,
                now: &self.now,
            },
        )
    }
}

/// The session key part a mapping's template rendered (cut, control characters dropped);
/// empty when the template is absent or renders empty.
pub fn session_part(rendered: &str) -> String {
    rendered
        .chars()
        .filter(|c| !c.is_control())
        .take(SESSION_KEY_CHARS)
        .collect::<String>()
        .trim()
        .to_owned()
}

/// The message a mapping sends: `messageTemplate`, else `textTemplate`, rendered.
pub fn message_of(m: &MappingConfig, ctx: &RequestContext) -> String {
    m.message_template
        .as_deref()
        .or(m.text_template.as_deref())
        .map(|t| ctx.render(t))
        .unwrap_or_default()
}
