//! The `memories` and `session_notes` tables: what agents remember across sessions, and notes
//! kept within one session.

use super::{now_ms, on_pool, text, Store, StoreRow};
use crate::error::GatewayError;
use crate::tenancy::Tenant;

/// One session note.
#[derive(Debug, Clone, PartialEq)]
pub struct NoteRow {
    pub id: i64,
    pub note: String,
    pub created_at: i64,
}

impl Store {
    /// Stores a memory owned by `owner` (the tenant of the turn that stored it); its id.
    pub async fn memory_insert(
        &self,
        owner: &str,
        agent_id: &str,
        session_key: Option<&str>,
        content: &str,
        tags: &[String],
    ) -> Result<i64, GatewayError> {
        let tags = serde_json::to_string(tags).unwrap_or_else(|_| "[]".to_owned());
        Ok(on_pool!(self.pool(), |p| sqlx::query_scalar::<_, i64>(
            "INSERT INTO memories (tenant_id, agent_id, session_key, content, tags, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
        )
        .bind(owner)
        .bind(agent_id)
        .bind(session_key)
        .bind(text(content))
        .bind(&tags)
        .bind(now_ms())
        .fetch_one(p)
        .await?))
    }

    /// Deletes the memories stored from one session that `tenant` reaches; how many.
    pub async fn memory_delete_by_session(
        &self,
        tenant: &Tenant,
        session_key: &str,
    ) -> Result<i64, GatewayError> {
        let done = on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM memories WHERE session_key = $1 AND ($2 IS NULL OR tenant_id = $2)",
        )
        .bind(session_key)
        .bind(tenant.only())
        .execute(p)
        .await?
        .rows_affected());
        Ok(done as i64)
    }

    /// Adds a note to a session; its id.
    pub async fn note_add(&self, session_key: &str, note: &str) -> Result<i64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            sqlx::query_scalar::<_, i64>(
            "INSERT INTO session_notes (session_key, note, created_at) VALUES ($1, $2, $3) RETURNING id",
        )
        .bind(session_key)
        .bind(text(note))
        .bind(now_ms())
        .fetch_one(p)
        .await?
        }))
    }

    /// A session's notes, oldest first.
    pub async fn notes_list(&self, session_key: &str) -> Result<Vec<NoteRow>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(
                "SELECT id, note, created_at FROM session_notes WHERE session_key = $1 ORDER BY id",
            )
            .bind(session_key)
            .fetch_all(p)
            .await?;
            let mut notes = Vec::with_capacity(rows.len());
            for r in &rows {
                notes.push(NoteRow {
                    id: r.col("id")?,
                    note: r.col("note")?,
                    created_at: r.col("created_at")?,
                });
            }
            notes
        }))
    }
}
