//! The `context_summaries` table (the summary tree of each conversation) and the listing of
//! conversations behind `context.conversations`.

use super::sessions::{message_row, MessageRow, SessionFilter, MESSAGE_COLUMNS};
use super::{now_ms, on_pool, text, Store, StoreRow};
use crate::api::error::GatewayError;
use crate::api::tenancy::Tenant;

/// One stored summary node.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRow {
    pub id: String,
    pub session_key: String,
    /// `leaf` (summarises messages) or `condensed` (summarises nodes one level down).
    pub kind: String,
    /// 0 for leaves; a condensed node is one above its children.
    pub depth: i64,
    pub content: String,
    pub token_count: i64,
    /// The covered message range, inclusive.
    pub first_seq: i64,
    pub last_seq: i64,
    pub message_count: i64,
    /// Whether any content under the node came from outside (`taint = 'untrusted'`).
    pub untrusted: bool,
    /// The condensed node over this one; None at the top.
    pub parent_id: Option<String>,
    pub created_at: i64,
}

/// A node to store.
#[derive(Debug, Clone)]
pub struct NewSummary<'a> {
    pub session_key: &'a str,
    pub depth: i64,
    pub content: &'a str,
    pub token_count: i64,
    pub first_seq: i64,
    pub last_seq: i64,
    pub message_count: i64,
    pub untrusted: bool,
}

impl NewSummary<'_> {
    fn row(&self, kind: &str) -> SummaryRow {
        SummaryRow {
            id: format!("sum_{}", uuid::Uuid::new_v4().simple()),
            session_key: self.session_key.to_owned(),
            kind: kind.to_owned(),
            depth: self.depth,
            content: self.content.to_owned(),
            token_count: self.token_count,
            first_seq: self.first_seq,
            last_seq: self.last_seq,
            message_count: self.message_count,
            untrusted: self.untrusted,
            parent_id: None,
            created_at: now_ms(),
        }
    }
}

/// One conversation of `context.conversations`.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationRow {
    pub session_key: String,
    pub agent_id: String,
    pub tenant_id: Option<String>,
    /// The session's label.
    pub title: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub message_count: i64,
}

const COLUMNS: &str = "id, session_key, kind, depth, content, token_count, first_seq, last_seq, \
                       message_count, taint, parent_id, created_at";

fn summary_row(r: &impl StoreRow) -> Result<SummaryRow, sqlx::Error> {
    Ok(SummaryRow {
        id: r.col("id")?,
        session_key: r.col("session_key")?,
        kind: r.col("kind")?,
        depth: r.col("depth")?,
        content: r.col("content")?,
        token_count: r.col("token_count")?,
        first_seq: r.col("first_seq")?,
        last_seq: r.col("last_seq")?,
        message_count: r.col("message_count")?,
        untrusted: r.col::<String>("taint")? == "untrusted",
        parent_id: r.col("parent_id")?,
        created_at: r.col("created_at")?,
    })
}

/// Inserts `$row` within the transaction `$tx` (a macro: the body is the same for both
/// backends' connection types).
macro_rules! insert_summary {
    ($tx:expr, $row:expr) => {
        sqlx::query(
            "INSERT INTO context_summaries (id, session_key, kind, depth, content, token_count, \
             first_seq, last_seq, message_count, taint, parent_id, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, $11)",
        )
        .bind(&$row.id)
        .bind(&$row.session_key)
        .bind(&$row.kind)
        .bind($row.depth)
        .bind(text(&$row.content))
        .bind($row.token_count)
        .bind($row.first_seq)
        .bind($row.last_seq)
        .bind($row.message_count)
        .bind(if $row.untrusted {
            "untrusted"
        } else {
            "trusted"
        })
        .bind($row.created_at)
        .execute(&mut *$tx)
        .await?
    };
}

/// Takes the session row's lock within `$tx` (a no-op update), so that two nodes of a fleet
/// building the same conversation's tree take turns; the number of sessions touched (0: gone).
macro_rules! lock_session {
    ($tx:expr, $key:expr) => {
        sqlx::query("UPDATE sessions SET next_seq = next_seq WHERE session_key = $1")
            .bind($key)
            .execute(&mut *$tx)
            .await?
            .rows_affected()
    };
}

impl Store {
    /// Stores a leaf over the messages `first_seq..=last_seq`. None when the range overlaps a
    /// leaf already stored (another node summarised it first) or the session is gone.
    pub async fn context_insert_leaf(
        &self,
        s: &NewSummary<'_>,
    ) -> Result<Option<SummaryRow>, GatewayError> {
        let row = s.row("leaf");
        Ok(on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            if lock_session!(tx, s.session_key) == 0 {
                return Ok(None);
            }
            let taken: Option<i64> = sqlx::query_scalar(
                "SELECT MAX(last_seq) FROM context_summaries WHERE session_key = $1 AND kind = 'leaf'",
            )
            .bind(s.session_key)
            .fetch_one(&mut *tx)
            .await?;
            if taken.is_some_and(|t| t >= s.first_seq) {
                return Ok(None);
            }
            insert_summary!(tx, row);
            tx.commit().await?;
            Some(row)
        }))
    }

    /// Stores a condensed node over `children` (top-level nodes of the session) and makes it
    /// their parent, in one transaction. None when a child is gone or already has a parent.
    pub async fn context_insert_condensed(
        &self,
        s: &NewSummary<'_>,
        children: &[String],
    ) -> Result<Option<SummaryRow>, GatewayError> {
        let row = s.row("condensed");
        Ok(on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            if lock_session!(tx, s.session_key) == 0 {
                return Ok(None);
            }
            for child in children {
                let done = sqlx::query(
                    "UPDATE context_summaries SET parent_id = $1 \
                     WHERE id = $2 AND session_key = $3 AND parent_id IS NULL",
                )
                .bind(&row.id)
                .bind(child)
                .bind(s.session_key)
                .execute(&mut *tx)
                .await?;
                if done.rows_affected() != 1 {
                    return Ok(None);
                }
            }
            insert_summary!(tx, row);
            tx.commit().await?;
            Some(row)
        }))
    }

    /// The top-level nodes of a session (those without a parent), oldest range first.
    pub async fn context_top(&self, key: &str) -> Result<Vec<SummaryRow>, GatewayError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM context_summaries WHERE session_key = $1 AND parent_id IS NULL \
             ORDER BY first_seq, depth DESC"
        );
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql).bind(key).fetch_all(p).await?;
            rows.iter().map(summary_row).collect::<Result<_, _>>()?
        }))
    }

    /// The newest `limit` nodes of a session `tenant` reaches, oldest first (every child
    /// before its parent), and whether older ones were left out.
    pub async fn context_tree(
        &self,
        tenant: &Tenant,
        key: &str,
        limit: i64,
    ) -> Result<(Vec<SummaryRow>, bool), GatewayError> {
        // A parent is never older than its children and is one level higher, so the newest
        // nodes include the parent of every node they include.
        let sql = format!(
            "SELECT {COLUMNS} FROM context_summaries c WHERE c.session_key = $1 \
             AND EXISTS (SELECT 1 FROM sessions s WHERE s.session_key = $1 \
                         AND ($2 IS NULL OR s.tenant_id = $2)) \
             ORDER BY c.created_at DESC, c.depth DESC, c.first_seq DESC LIMIT $3"
        );
        let mut list: Vec<SummaryRow> = on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql)
                .bind(key)
                .bind(tenant.only())
                .bind(limit.saturating_add(1))
                .fetch_all(p)
                .await?;
            rows.iter().map(summary_row).collect::<Result<_, _>>()?
        });
        let truncated = list.len() as i64 > limit;
        list.truncate(limit.max(0) as usize);
        list.reverse();
        Ok((list, truncated))
    }

    /// Deletes a session's nodes; how many there were.
    pub async fn context_delete(&self, key: &str) -> Result<i64, GatewayError> {
        let done = on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM context_summaries WHERE session_key = $1"
        )
        .bind(key)
        .execute(p)
        .await
        .map(|d| d.rows_affected()))?;
        Ok(done as i64)
    }

    /// The highest message seq the session's tree covers; None without nodes.
    pub async fn context_covered(&self, key: &str) -> Result<Option<i64>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            sqlx::query_scalar("SELECT MAX(last_seq) FROM context_summaries WHERE session_key = $1")
                .bind(key)
                .fetch_one(p)
                .await?
        }))
    }

    /// The session's messages after seq `after` (all when None), oldest first, when `tenant`
    /// reaches the session: the part of a transcript its tree does not cover.
    pub async fn context_messages_after(
        &self,
        tenant: &Tenant,
        key: &str,
        after: Option<i64>,
    ) -> Result<Vec<MessageRow>, GatewayError> {
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_key = $1 \
             AND ($2 IS NULL OR seq > $2) \
             AND EXISTS (SELECT 1 FROM sessions s WHERE s.session_key = $1 \
                         AND ($3 IS NULL OR s.tenant_id = $3)) ORDER BY seq"
        );
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql)
                .bind(key)
                .bind(after)
                .bind(tenant.only())
                .fetch_all(p)
                .await?;
            rows.iter().map(message_row).collect::<Result<_, _>>()?
        }))
    }

    /// How many nodes a session's tree has and the depth of its deepest node (None without
    /// nodes).
    pub async fn context_shape(&self, key: &str) -> Result<(i64, Option<i64>), GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let row = sqlx::query(
                "SELECT COUNT(*) AS nodes, MAX(depth) AS depth FROM context_summaries \
                 WHERE session_key = $1",
            )
            .bind(key)
            .fetch_one(p)
            .await?;
            (row.col::<i64>("nodes")?, row.col::<Option<i64>>("depth")?)
        }))
    }

    /// A page of the conversations `tenant` reaches, most recently updated first, and the
    /// total. A conversation is a session's stored transcript; its title is the session's
    /// label.
    pub async fn context_conversations(
        &self,
        tenant: &Tenant,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<ConversationRow>, i64), GatewayError> {
        let (rows, total) = self
            .session_list(&SessionFilter::of(tenant.clone()), limit, offset)
            .await?;
        let list = rows
            .into_iter()
            .map(|s| ConversationRow {
                session_key: s.key,
                agent_id: s.agent_id,
                tenant_id: s.tenant_id,
                title: s.label,
                created_at: s.created_at,
                updated_at: s.updated_at,
                message_count: s.message_count,
            })
            .collect();
        Ok((list, total))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::store::sessions::{MessageRow, TurnTotals};

    crate::store::conformance::both!(summary_tree_rows);

    fn leaf(key: &str, first: i64, last: i64) -> NewSummary<'_> {
        NewSummary {
            session_key: key,
            depth: 0,
            content: "a summary",
            token_count: 3,
            first_seq: first,
            last_seq: last,
            message_count: last - first + 1,
            untrusted: first == 0,
        }
    }

    async fn summary_tree_rows(s: Store) {
        for (key, tenant) in [("k1", "t1"), ("k2", "t2")] {
            crate::store::conformance::session(&s, key, tenant).await;
        }
        let rows: Vec<MessageRow> = (0..6)
            .map(|i| MessageRow {
                role: if i % 2 == 0 { "user" } else { "assistant" }.into(),
                content: format!("m{i}"),
                ..MessageRow::default()
            })
            .collect();
        s.session_append("k1", &rows, &TurnTotals::default())
            .await
            .unwrap();
        assert_eq!(s.context_covered("k1").await.unwrap(), None);
        let a = s
            .context_insert_leaf(&leaf("k1", 0, 1))
            .await
            .unwrap()
            .unwrap();
        let b = s
            .context_insert_leaf(&leaf("k1", 2, 3))
            .await
            .unwrap()
            .unwrap();
        assert!(a.untrusted && !b.untrusted);
        // An overlapping leaf (another node got there first) is refused.
        assert!(s
            .context_insert_leaf(&leaf("k1", 1, 3))
            .await
            .unwrap()
            .is_none());
        assert!(s
            .context_insert_leaf(&leaf("gone", 0, 1))
            .await
            .unwrap()
            .is_none());
        assert_eq!(s.context_covered("k1").await.unwrap(), Some(3));
        let after = s
            .context_messages_after(&Tenant::owner("t1"), "k1", Some(3))
            .await
            .unwrap();
        assert_eq!(after.iter().map(|m| m.seq).collect::<Vec<_>>(), [4, 5]);
        let other = s
            .context_messages_after(&Tenant::owner("t2"), "k1", None)
            .await
            .unwrap();
        assert!(other.is_empty());
        let top = s.context_top("k1").await.unwrap();
        assert_eq!(
            top.iter().map(|n| &n.id).collect::<Vec<_>>(),
            [&a.id, &b.id]
        );
        let over = NewSummary {
            depth: 1,
            first_seq: 0,
            last_seq: 3,
            message_count: 4,
            ..leaf("k1", 0, 3)
        };
        let children = [a.id.clone(), b.id.clone()];
        let c = s
            .context_insert_condensed(&over, &children)
            .await
            .unwrap()
            .unwrap();
        // The children have a parent now: a second condensation over them is refused whole.
        assert!(s
            .context_insert_condensed(&over, &children)
            .await
            .unwrap()
            .is_none());
        let top = s.context_top("k1").await.unwrap();
        assert_eq!(top.iter().map(|n| &n.id).collect::<Vec<_>>(), [&c.id]);
        assert_eq!(s.context_shape("k1").await.unwrap(), (3, Some(1)));
        let (tree, truncated) = s
            .context_tree(&Tenant::owner("t1"), "k1", 10)
            .await
            .unwrap();
        assert!(!truncated);
        assert_eq!(tree.len(), 3);
        assert_eq!(tree[2].id, c.id);
        assert!(tree[..2]
            .iter()
            .all(|n| n.parent_id.as_deref() == Some(&*c.id)));
        let (newest, truncated) = s.context_tree(&Tenant::owner("t1"), "k1", 1).await.unwrap();
        assert!(truncated);
        assert_eq!(newest[0].id, c.id);
        let (none, _) = s
            .context_tree(&Tenant::owner("t2"), "k1", 10)
            .await
            .unwrap();
        assert!(none.is_empty());
        let (list, total) = s
            .context_conversations(&Tenant::owner("t1"), 10, 0)
            .await
            .unwrap();
        assert_eq!(total, 1);
        assert_eq!(list[0].session_key, "k1");
        assert_eq!(list[0].message_count, 6);
        assert_eq!(list[0].title, None);
        // Clearing the transcript restarts seq numbers, so the tree goes with it.
        s.session_clear(&Tenant::owner("t1"), "k1").await.unwrap();
        assert_eq!(s.context_shape("k1").await.unwrap(), (0, None));
        s.context_insert_leaf(&leaf("k1", 0, 1))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(s.context_delete("k1").await.unwrap(), 1);
        assert_eq!(s.context_delete("k1").await.unwrap(), 0);
    }
}
