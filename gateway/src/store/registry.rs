//! The `providers` and `agents` tables: entities stored as JSON settings plus bookkeeping.
//! Both tables have the same shape, so one implementation serves both.

use sqlx::Row;

use super::{now_ms, Store};
use crate::error::GatewayError;

/// Which registry table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Providers,
    Agents,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Self::Providers => "providers",
            Self::Agents => "agents",
        }
    }
}

/// One stored entity.
#[derive(Debug, Clone, PartialEq)]
pub struct RegistryRow {
    pub id: String,
    /// The settings, as JSON text.
    pub config: String,
    /// Agents only; always false for providers.
    pub suspended: bool,
    /// Hash of the configuration-file entry this row was last seeded from.
    pub seed_hash: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

fn decode(r: &sqlx::sqlite::SqliteRow, table: Table) -> Result<RegistryRow, sqlx::Error> {
    Ok(RegistryRow {
        id: r.try_get("id")?,
        config: r.try_get("config")?,
        suspended: match table {
            Table::Agents => r.try_get::<i64, _>("suspended")? != 0,
            Table::Providers => false,
        },
        seed_hash: r.try_get("seed_hash")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

fn columns(table: Table) -> &'static str {
    match table {
        Table::Agents => "id, config, suspended, seed_hash, created_at, updated_at",
        Table::Providers => "id, config, seed_hash, created_at, updated_at",
    }
}

impl Store {
    /// Every row, sorted by id.
    pub async fn registry_list(&self, table: Table) -> Result<Vec<RegistryRow>, GatewayError> {
        let sql = format!(
            "SELECT {} FROM {} ORDER BY id",
            columns(table),
            table.name()
        );
        let rows = sqlx::query(&sql).fetch_all(self.pool()).await?;
        Ok(rows
            .iter()
            .map(|r| decode(r, table))
            .collect::<Result<_, _>>()?)
    }

    /// Inserts a new row; false when the id exists.
    pub async fn registry_insert(
        &self,
        table: Table,
        id: &str,
        config: &str,
        seed_hash: Option<&str>,
    ) -> Result<bool, GatewayError> {
        let now = now_ms();
        let sql = format!(
            "INSERT INTO {} (id, {}config, seed_hash, created_at, updated_at) VALUES (?, {}?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            table.name(),
            if table == Table::Providers { "kind, " } else { "" },
            if table == Table::Providers { "?, " } else { "" },
        );
        let mut q = sqlx::query(&sql).bind(id);
        if table == Table::Providers {
            q = q.bind(kind_of(config));
        }
        let done = q
            .bind(config)
            .bind(seed_hash)
            .bind(now)
            .bind(now)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Replaces a row's settings (and seed hash when given); false when the id is unknown.
    pub async fn registry_update(
        &self,
        table: Table,
        id: &str,
        config: &str,
        seed_hash: Option<&str>,
    ) -> Result<bool, GatewayError> {
        let sql = format!(
            "UPDATE {} SET config = ?, seed_hash = COALESCE(?, seed_hash), updated_at = ? WHERE id = ?",
            table.name()
        );
        let done = sqlx::query(&sql)
            .bind(config)
            .bind(seed_hash)
            .bind(now_ms())
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes a row; false when the id is unknown.
    pub async fn registry_delete(&self, table: Table, id: &str) -> Result<bool, GatewayError> {
        let sql = format!("DELETE FROM {} WHERE id = ?", table.name());
        let done = sqlx::query(&sql).bind(id).execute(self.pool()).await?;
        Ok(done.rows_affected() == 1)
    }

    /// Writes a configuration-file entry: inserted when new, replaced when the file's entry
    /// changed since it was last seeded (`hash` differs), kept otherwise (with the changes
    /// made through the API).
    pub async fn registry_seed(
        &self,
        table: Table,
        id: &str,
        config: &str,
        hash: &str,
    ) -> Result<(), GatewayError> {
        let stored: Option<Option<String>> = sqlx::query_scalar(&format!(
            "SELECT seed_hash FROM {} WHERE id = ?",
            table.name()
        ))
        .bind(id)
        .fetch_optional(self.pool())
        .await?;
        match stored {
            None => {
                self.registry_insert(table, id, config, Some(hash)).await?;
            }
            Some(h) if h.as_deref() != Some(hash) => {
                self.registry_update(table, id, config, Some(hash)).await?;
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Sets an agent's suspended flag; None when unknown, Some(changed) otherwise.
    pub async fn agent_set_suspended(
        &self,
        id: &str,
        suspended: bool,
    ) -> Result<Option<bool>, GatewayError> {
        let flag = i64::from(suspended);
        let done = sqlx::query(
            "UPDATE agents SET suspended = ?, updated_at = ? WHERE id = ? AND suspended <> ?",
        )
        .bind(flag)
        .bind(now_ms())
        .bind(id)
        .bind(flag)
        .execute(self.pool())
        .await?;
        if done.rows_affected() == 1 {
            return Ok(Some(true));
        }
        let exists = sqlx::query("SELECT 1 FROM agents WHERE id = ?")
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        Ok(exists.map(|_| false))
    }
}

fn kind_of(config: &str) -> String {
    serde_json::from_str::<serde_json::Value>(config)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned))
        .unwrap_or_default()
}
