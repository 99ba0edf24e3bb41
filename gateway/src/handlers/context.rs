//! `context.*`: the stored conversations and the summary tree of each.

use std::collections::{BTreeMap, BTreeSet};

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::ContextApi;
use crate::api::generated::types::*;
use crate::api::CallContext;
use crate::store::context::SummaryRow;

/// Characters of a node's text context.tree shows.
const PREVIEW_CHARS: usize = 200;

fn preview(text: &str) -> String {
    text.chars().take(PREVIEW_CHARS).collect()
}

/// The nodes of an answer with their links. Only links between nodes of the answer are
/// listed: a parent is never older than its children, so a truncated answer (the newest
/// nodes) holds the parent of every node it holds, and may lose some children of its oldest
/// condensed nodes, which are then left out of their childIds.
fn nodes(rows: Vec<SummaryRow>) -> Vec<ContextTreeResultNodesItem> {
    let present: BTreeSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    let mut children: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for r in &rows {
        if let Some(parent) = r.parent_id.as_deref().filter(|p| present.contains(p)) {
            children.entry(parent).or_default().push(r.id.clone());
        }
    }
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        out.push(ContextTreeResultNodesItem {
            summary_id: r.id.clone(),
            kind: if r.kind == "condensed" {
                ContextTreeResultNodesItemKind::Condensed
            } else {
                ContextTreeResultNodesItemKind::Leaf
            },
            depth: r.depth,
            token_count: r.token_count,
            content_preview: preview(&r.content),
            child_ids: children.remove(r.id.as_str()).unwrap_or_default(),
            parent_ids: r
                .parent_id
                .iter()
                .filter(|p| present.contains(p.as_str()))
                .cloned()
                .collect(),
            taint: if r.untrusted {
                ContextTreeResultNodesItemTaint::Untrusted
            } else {
                ContextTreeResultNodesItemTaint::Trusted
            },
            created_at: r.created_at,
        });
    }
    out
}

impl ContextApi for Rpc {
    async fn conversations(
        &self,
        ctx: &CallContext,
        p: ContextConversationsParams,
    ) -> Result<ContextConversationsResult, GatewayError> {
        let (rows, total) = self
            .engine()
            .store
            .context_conversations(ctx.tenant(), p.limit, p.offset)
            .await?;
        Ok(ContextConversationsResult {
            conversations: rows
                .into_iter()
                .map(|c| ContextConversationsResultConversationsItem {
                    conversation_id: c.session_key.clone(),
                    tenant_id: c.tenant_id.unwrap_or_default(),
                    agent_id: c.agent_id,
                    session_key: c.session_key,
                    title: c.title,
                    created_at: c.created_at,
                    updated_at: c.updated_at,
                    message_count: c.message_count,
                })
                .collect(),
            total,
        })
    }

    async fn tree(
        &self,
        ctx: &CallContext,
        p: ContextTreeParams,
    ) -> Result<ContextTreeResult, GatewayError> {
        let store = &self.engine().store;
        // The ownership rule let an unknown id through (it names nobody's record yet).
        let s = store
            .session_get(ctx.tenant(), &p.conversation_id)
            .await?
            .ok_or_else(|| GatewayError::not_found("Session", &p.conversation_id))?;
        let (rows, truncated) = store.context_tree(ctx.tenant(), &s.key, p.limit).await?;
        Ok(ContextTreeResult {
            conversation_id: s.key,
            nodes: nodes(rows),
            message_count: s.message_count,
            truncated,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn row(id: &str, depth: i64, parent: Option<&str>) -> SummaryRow {
        SummaryRow {
            id: id.into(),
            session_key: "k".into(),
            kind: if depth == 0 { "leaf" } else { "condensed" }.into(),
            depth,
            content: "é".repeat(300),
            token_count: 75,
            first_seq: 0,
            last_seq: 1,
            message_count: 2,
            untrusted: false,
            parent_id: parent.map(str::to_owned),
            created_at: 1,
        }
    }

    #[test]
    fn links_are_symmetric_within_the_answer_and_previews_short() {
        let all = nodes(vec![
            row("a", 0, Some("c")),
            row("b", 0, Some("c")),
            row("c", 1, None),
        ]);
        assert_eq!(all[2].child_ids, ["a", "b"]);
        assert_eq!(all[0].parent_ids, ["c"]);
        assert!(all[2].parent_ids.is_empty());
        assert_eq!(all[0].content_preview.chars().count(), 200);
        // A truncated answer lost child "a": the parent lists only what the answer holds.
        let cut = nodes(vec![row("b", 0, Some("c")), row("c", 1, None)]);
        assert_eq!(cut[1].child_ids, ["b"]);
    }
}
