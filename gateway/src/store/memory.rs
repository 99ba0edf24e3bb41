//! The `memories` and `session_notes` tables: what agents remember across sessions, and notes
//! kept within one session.

use sqlx::Row;

use super::{now_ms, Store};
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
        let done = sqlx::query(
            "INSERT INTO memories (tenant_id, agent_id, session_key, content, tags, created_at) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(owner)
        .bind(agent_id)
        .bind(session_key)
        .bind(content)
        .bind(tags)
        .bind(now_ms())
        .execute(self.pool())
        .await?;
        Ok(done.last_insert_rowid())
    }

    /// Deletes the memories stored from one session that `tenant` reaches; how many.
    pub async fn memory_delete_by_session(
        &self,
        tenant: &Tenant,
        session_key: &str,
    ) -> Result<i64, GatewayError> {
        let done = sqlx::query(
            "DELETE FROM memories WHERE session_key = ?1 AND (?2 IS NULL OR tenant_id = ?2)",
        )
        .bind(session_key)
        .bind(tenant.only())
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() as i64)
    }

    /// Adds a note to a session; its id.
    pub async fn note_add(&self, session_key: &str, note: &str) -> Result<i64, GatewayError> {
        let done = sqlx::query(
            "INSERT INTO session_notes (session_key, note, created_at) VALUES (?, ?, ?)",
        )
        .bind(session_key)
        .bind(note)
        .bind(now_ms())
        .execute(self.pool())
        .await?;
        Ok(done.last_insert_rowid())
    }

    /// A session's notes, oldest first.
    pub async fn notes_list(&self, session_key: &str) -> Result<Vec<NoteRow>, GatewayError> {
        let rows = sqlx::query(
            "SELECT id, note, created_at FROM session_notes WHERE session_key = ? ORDER BY id",
        )
        .bind(session_key)
        .fetch_all(self.pool())
        .await?;
        let mut notes = Vec::with_capacity(rows.len());
        for r in rows {
            notes.push(NoteRow {
                id: r.try_get("id")?,
                note: r.try_get("note")?,
                created_at: r.try_get("created_at")?,
            });
        }
        Ok(notes)
    }
}
