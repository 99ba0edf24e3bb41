//! The `providers` and `agents` tables: entities stored as JSON settings plus bookkeeping.
//! Both tables have the same shape, so one implementation serves both.

use super::{now_ms, on_pool, Store, StoreRow};
use crate::api::error::GatewayError;

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

fn decode(r: &impl StoreRow, table: Table) -> Result<RegistryRow, sqlx::Error> {
    Ok(RegistryRow {
        id: r.col("id")?,
        config: r.col("config")?,
        suspended: match table {
            Table::Agents => r.col::<i64>("suspended")? != 0,
            Table::Providers => false,
        },
        seed_hash: r.col("seed_hash")?,
        created_at: r.col("created_at")?,
        updated_at: r.col("updated_at")?,
    })
}

fn columns(table: Table) -> &'static str {
    match table {
        Table::Agents => "id, config, suspended, seed_hash, created_at, updated_at",
        Table::Providers => "id, config, seed_hash, created_at, updated_at",
    }
}

impl Store {
    /// Whether a write of one row changed it (`rows` affected); other nodes are told so they
    /// reload the table.
    async fn changed(&self, table: Table, rows: u64) -> bool {
        if rows == 1 {
            self.announce(table.name()).await;
        }
        rows == 1
    }

    /// Every row, sorted by id.
    pub async fn registry_list(&self, table: Table) -> Result<Vec<RegistryRow>, GatewayError> {
        let sql = format!(
            "SELECT {} FROM {} ORDER BY id",
            columns(table),
            table.name()
        );
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql).fetch_all(p).await?;
            rows.iter()
                .map(|r| decode(r, table))
                .collect::<Result<_, _>>()?
        }))
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
        // Providers also keep their kind (`$5`).
        let (sql, kind) = match table {
            Table::Providers => (
                "INSERT INTO providers (id, config, seed_hash, created_at, updated_at, kind) \
                 VALUES ($1, $2, $3, $4, $4, $5) ON CONFLICT (id) DO NOTHING",
                Some(kind_of(config)),
            ),
            Table::Agents => (
                "INSERT INTO agents (id, config, seed_hash, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $4) ON CONFLICT (id) DO NOTHING",
                None,
            ),
        };
        let done = on_pool!(self.pool(), |p| {
            let mut q = sqlx::query(sql)
                .bind(id)
                .bind(config)
                .bind(seed_hash)
                .bind(now);
            if let Some(kind) = &kind {
                q = q.bind(kind);
            }
            q.execute(p).await?.rows_affected()
        });
        Ok(self.changed(table, done).await)
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
            "UPDATE {} SET config = $1, seed_hash = COALESCE($2, seed_hash), updated_at = $3 WHERE id = $4",
            table.name()
        );
        let done = on_pool!(self.pool(), |p| sqlx::query(&sql)
            .bind(config)
            .bind(seed_hash)
            .bind(now_ms())
            .bind(id)
            .execute(p)
            .await?
            .rows_affected());
        Ok(self.changed(table, done).await)
    }

    /// Deletes a row; false when the id is unknown.
    pub async fn registry_delete(&self, table: Table, id: &str) -> Result<bool, GatewayError> {
        let sql = format!("DELETE FROM {} WHERE id = $1", table.name());
        let done = on_pool!(self.pool(), |p| sqlx::query(&sql)
            .bind(id)
            .execute(p)
            .await?
            .rows_affected());
        Ok(self.changed(table, done).await)
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
        let sql = format!("SELECT seed_hash FROM {} WHERE id = $1", table.name());
        let stored: Option<Option<String>> = on_pool!(self.pool(), |p| sqlx::query_scalar(&sql)
            .bind(id)
            .fetch_optional(p)
            .await?);
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
        let changed = on_pool!(self.pool(), |p| {
            sqlx::query(
            "UPDATE agents SET suspended = $1, updated_at = $2 WHERE id = $3 AND suspended <> $1",
        )
        .bind(flag)
        .bind(now_ms())
        .bind(id)
        .execute(p)
        .await?
        .rows_affected()
        });
        if self.changed(Table::Agents, changed).await {
            return Ok(Some(true));
        }
        let exists = on_pool!(self.pool(), |p| sqlx::query_scalar::<_, String>(
            "SELECT id FROM agents WHERE id = $1"
        )
        .bind(id)
        .fetch_optional(p)
        .await?);
        Ok(exists.map(|_| false))
    }
}

fn kind_of(config: &str) -> String {
    serde_json::from_str::<serde_json::Value>(config)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned))
        .unwrap_or_default()
}
