//! The `usage` table: one row per model call (tokens, cost, latency, outcome) per agent,
//! session and provider; the observability methods read it.

use sqlx::Row;

use super::Store;
use crate::error::GatewayError;

/// One model call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageRow {
    pub ts: i64,
    pub agent_id: String,
    pub session_key: Option<String>,
    pub provider: String,
    pub model: String,
    /// chat, summarize, embed, test.
    pub operation: String,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cached_tokens: i64,
    pub cost_usd: f64,
    pub latency_ms: i64,
    pub ok: bool,
    pub error_kind: Option<String>,
}

/// Prompt-cache figures of one provider (or of all).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheFigures {
    pub provider: String,
    pub hits: i64,
    pub misses: i64,
    pub cached_tokens: i64,
}

impl Store {
    pub async fn usage_record(&self, u: &UsageRow) -> Result<(), GatewayError> {
        sqlx::query(
            "INSERT INTO usage (ts, agent_id, session_key, provider, model, operation, input_tokens, \
             output_tokens, cached_tokens, cost_usd, latency_ms, ok, error_kind) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(u.ts)
        .bind(&u.agent_id)
        .bind(&u.session_key)
        .bind(&u.provider)
        .bind(&u.model)
        .bind(&u.operation)
        .bind(u.input_tokens)
        .bind(u.output_tokens)
        .bind(u.cached_tokens)
        .bind(u.cost_usd)
        .bind(u.latency_ms)
        .bind(i64::from(u.ok))
        .bind(&u.error_kind)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Cache hits/misses per provider over successful calls, optionally for one agent and
    /// from a time on.
    pub async fn usage_cache_figures(
        &self,
        agent_id: Option<&str>,
        since_ms: Option<i64>,
    ) -> Result<Vec<CacheFigures>, GatewayError> {
        let rows = sqlx::query(
            "SELECT provider, SUM(CASE WHEN cached_tokens > 0 THEN 1 ELSE 0 END) AS hits, \
             SUM(CASE WHEN cached_tokens > 0 THEN 0 ELSE 1 END) AS misses, \
             SUM(cached_tokens) AS cached FROM usage \
             WHERE ok = 1 AND (? IS NULL OR agent_id = ?) AND (? IS NULL OR ts >= ?) \
             GROUP BY provider ORDER BY provider",
        )
        .bind(agent_id)
        .bind(agent_id)
        .bind(since_ms)
        .bind(since_ms)
        .fetch_all(self.pool())
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push(CacheFigures {
                provider: r.try_get("provider")?,
                hits: r.try_get("hits")?,
                misses: r.try_get("misses")?,
                cached_tokens: r.try_get("cached")?,
            });
        }
        Ok(out)
    }

    /// Cached tokens per model (for the saving estimate), same filters.
    pub async fn usage_cached_by_model(
        &self,
        agent_id: Option<&str>,
        since_ms: Option<i64>,
    ) -> Result<Vec<(String, i64)>, GatewayError> {
        let rows = sqlx::query(
            "SELECT model, SUM(cached_tokens) AS cached FROM usage \
             WHERE ok = 1 AND cached_tokens > 0 AND (? IS NULL OR agent_id = ?) AND (? IS NULL OR ts >= ?) \
             GROUP BY model ORDER BY model",
        )
        .bind(agent_id)
        .bind(agent_id)
        .bind(since_ms)
        .bind(since_ms)
        .fetch_all(self.pool())
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push((r.try_get("model")?, r.try_get("cached")?));
        }
        Ok(out)
    }
}
