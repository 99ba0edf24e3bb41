//! The `nodes` and `leases` tables: which gateway nodes share this database and are alive, and
//! work that one node of the fleet does at a time (sweeps). On SQLite there is one node, and
//! both still work (a lease is always this node's).

use super::{on_pool, Pool, Store};
use crate::api::error::GatewayError;

pub const CONTROL: &str = "gw_control";

impl Store {
    /// Records that this node is alive at `now` (registering it when new).
    pub async fn node_seen(&self, now: i64, started_at: i64) -> Result<(), GatewayError> {
        let host = std::env::var("HOSTNAME").ok();
        on_pool!(self.pool(), |p| {
            sqlx::query(
            "INSERT INTO nodes (node_id, started_at, seen_at, host, version) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (node_id) DO UPDATE SET seen_at = excluded.seen_at",
        )
        .bind(self.node())
        .bind(started_at)
        .bind(now)
        .bind(host)
        .bind(env!("CARGO_PKG_VERSION"))
        .execute(p)
        .await
        .map(drop)
        })?;
        Ok(())
    }

    /// This node leaves the fleet (clean shutdown): its runs may be taken over at once.
    pub async fn node_leave(&self) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM nodes WHERE node_id = $1"
        )
        .bind(self.node())
        .execute(p)
        .await
        .map(drop))?;
        Ok(())
    }

    /// The nodes seen after `since`, by id.
    pub async fn nodes_live(&self, since: i64) -> Result<Vec<String>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query_scalar(
            "SELECT node_id FROM nodes WHERE seen_at > $1 ORDER BY node_id"
        )
        .bind(since)
        .fetch_all(p)
        .await?))
    }

    /// Forgets nodes not seen since `before` (their rows only; what they held was swept).
    pub async fn nodes_forget(&self, before: i64) -> Result<u64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM nodes WHERE seen_at < $1"
        )
        .bind(before)
        .execute(p)
        .await?
        .rows_affected()))
    }

    /// Tells the other nodes that `what` (`agents`, `providers`) changed, so they reload it
    /// (`store::nodes::CONTROL`); nothing to tell on SQLite. Best effort: a node that misses it
    /// still reloads on its periodic resynchronisation.
    pub async fn announce(&self, what: &str) {
        let Pool::Postgres(p) = self.pool() else {
            return;
        };
        let body = serde_json::json!({"v": 1, "from": self.node(), "what": what}).to_string();
        if let Err(e) = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CONTROL)
            .bind(body)
            .execute(p)
            .await
        {
            tracing::warn!(what, error = %e, "registry change not announced to other nodes");
        }
    }

    /// Deletes spilled fan-out bodies older than `before`.
    pub async fn fanout_sweep(&self, before: i64) -> Result<u64, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM fanout WHERE created_at < $1"
        )
        .bind(before)
        .execute(p)
        .await?
        .rows_affected()))
    }

    /// Whether this node does the once-per-fleet work `name` now: always on a database of its
    /// own; on a shared one when it holds the lease. A lease error answers yes (doing the work
    /// twice is harmless, never doing it is not).
    pub async fn takes_turn(&self, name: &str, now: i64, ttl_ms: i64) -> bool {
        !self.is_shared() || !matches!(self.lease_claim(name, now, ttl_ms).await, Ok(false))
    }

    /// Takes the lease `name` for this node until `now + ttl_ms` when it is free, expired, or
    /// already this node's; whether this node holds it now. One node of the fleet wins.
    pub async fn lease_claim(
        &self,
        name: &str,
        now: i64,
        ttl_ms: i64,
    ) -> Result<bool, GatewayError> {
        let taken = on_pool!(self.pool(), |p| {
            sqlx::query(
            "INSERT INTO leases (name, holder, until_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until_ms = excluded.until_ms \
             WHERE leases.until_ms < $4 OR leases.holder = excluded.holder",
        )
        .bind(name)
        .bind(self.node())
        .bind(now + ttl_ms)
        .bind(now)
        .execute(p)
        .await?
        .rows_affected()
        });
        Ok(taken == 1)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn a_lease_has_one_holder_until_it_expires() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open(&dir.path().join("t.db")).await.unwrap();
        let b = a.clone().for_node("b".into());
        assert!(a.lease_claim("sweep", 1_000, 100).await.unwrap());
        assert!(!b.lease_claim("sweep", 1_050, 100).await.unwrap());
        assert!(
            a.lease_claim("sweep", 1_060, 100).await.unwrap(),
            "renewed by its holder"
        );
        assert!(
            !b.lease_claim("sweep", 1_160, 100).await.unwrap(),
            "renewed to 1160"
        );
        assert!(b.lease_claim("sweep", 1_161, 100).await.unwrap());
        assert!(!a.lease_claim("sweep", 1_200, 100).await.unwrap());
    }

    #[tokio::test]
    async fn nodes_are_alive_while_they_are_seen() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open(&dir.path().join("t.db"))
            .await
            .unwrap()
            .for_node("a".into());
        let b = a.clone().for_node("b".into());
        a.node_seen(100, 100).await.unwrap();
        b.node_seen(200, 200).await.unwrap();
        assert_eq!(a.nodes_live(50).await.unwrap(), ["a", "b"]);
        assert_eq!(a.nodes_live(150).await.unwrap(), ["b"]);
        a.node_seen(300, 100).await.unwrap();
        assert_eq!(a.nodes_live(250).await.unwrap(), ["a"]);
        b.node_leave().await.unwrap();
        assert_eq!(a.nodes_live(0).await.unwrap(), ["a"]);
        assert_eq!(a.nodes_forget(301).await.unwrap(), 1);
    }
}
