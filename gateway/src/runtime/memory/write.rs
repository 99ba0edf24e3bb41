//! The write path of memory: the injection validator decides (refuse, taint, or store as
//! asked), the entry is stored at once and embedded in the background, and a consolidation is
//! started when enough entries of the agent wait for one.

use serde_json::json;

use super::guard::{self, Verdict};
use super::Memory;
use crate::api::error::GatewayError;
use crate::api::tenancy::Tenant;
use crate::store::memory::NewMemory;

/// The tag a suspicious entry is stored with.
pub const TAINT_TAG: &str = "security-tainted";

/// Who wrote an entry, for the taint event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// memory.store (an operator).
    Operator,
    /// The memory_store tool (an agent, in a turn).
    Agent,
    /// memory.portability.import.
    Import,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Operator => "operator",
            Source::Agent => "agent",
            Source::Import => "import",
        }
    }
}

/// An entry after the validator: what will be stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    pub trust_level: &'static str,
    pub tags: Vec<String>,
    /// Rules that matched a suspicious entry (empty when clean).
    pub tainted_by: Vec<&'static str>,
}

/// Trust levels from most to least trusted.
fn rank(trust: &str) -> u8 {
    match trust {
        "system" => 0,
        "learned" => 1,
        _ => 2,
    }
}

/// The validator's decision for `content` asked to be stored at `trust` with `tags`:
/// -32602 for the clearly malicious; a suspicious entry is lowered to `external` and tagged.
/// Never raises trust.
pub fn check(content: &str, trust: &str, tags: &[String]) -> Result<Checked, GatewayError> {
    let mut tags: Vec<String> = tags.to_vec();
    let trust_level: &'static str = match trust {
        "system" => "system",
        "learned" => "learned",
        _ => "external",
    };
    match guard::check(content) {
        Verdict::Malicious(rules) => Err(GatewayError::InvalidParams(format!(
            "'content': refused by the memory write validator (prompt injection: {})",
            rules.join(", ")
        ))),
        Verdict::Suspicious(rules) => {
            if !tags.iter().any(|t| t == TAINT_TAG) {
                tags.push(TAINT_TAG.to_owned());
            }
            Ok(Checked {
                trust_level: "external",
                tags,
                tainted_by: rules,
            })
        }
        Verdict::Clean => Ok(Checked {
            trust_level,
            tags,
            tainted_by: Vec::new(),
        }),
    }
}

/// Whether `to` is a lower trust than `from`.
pub fn lowered(from: &str, to: &str) -> bool {
    rank(to) > rank(from)
}

impl Memory {
    /// Stores one entry of `owner` after the validator; its id and what was stored. The
    /// embedding is queued, never awaited.
    pub async fn write(
        &self,
        owner: &str,
        entry: NewMemory<'_>,
        source: Source,
    ) -> Result<(i64, Checked), GatewayError> {
        let checked = check(entry.content, entry.trust_level, entry.tags)?;
        let stored = NewMemory {
            tags: &checked.tags,
            trust_level: checked.trust_level,
            ..entry
        };
        let id = self
            .store
            .memory_insert(owner, &stored, self.state.config.max_entries_per_tenant)
            .await?;
        self.written(owner, stored.agent_id, &[id], source, &[&checked]);
        Ok((id, checked))
    }

    /// Stores already checked entries of `owner` (an import) in one transaction, all or none:
    /// refused whole (-32602 naming `memory.maxEntriesPerTenant`) when they would take the
    /// tenant past its limit. Their ids in order.
    pub async fn insert_checked(
        &self,
        owner: &str,
        entries: &[NewMemory<'_>],
    ) -> Result<Vec<i64>, GatewayError> {
        self.store
            .memory_insert_many(owner, entries, self.state.config.max_entries_per_tenant)
            .await
    }

    /// Refuses (-32602 naming the limit) when `adding` entries would take `owner` past
    /// `memory.maxEntriesPerTenant`: what a dry run of an import reports.
    pub async fn check_room(&self, owner: &str, adding: usize) -> Result<(), GatewayError> {
        self.store
            .memory_check_room(owner, adding, self.state.config.max_entries_per_tenant)
            .await
    }

    /// After entries were stored: queue their embeddings, report tainted ones, and start a
    /// consolidation when enough entries of the agent wait for one.
    pub fn written(
        &self,
        owner: &str,
        agent: &str,
        ids: &[i64],
        source: Source,
        checked: &[&Checked],
    ) {
        for id in ids {
            self.state.enqueue(*id);
        }
        let owner_arc: std::sync::Arc<str> = std::sync::Arc::from(owner);
        for (id, c) in ids.iter().zip(checked) {
            if !c.tainted_by.is_empty() {
                self.control.events.publish_to(
                    &owner_arc,
                    "security:memory_tainted",
                    json!({"id": id.to_string(), "agentId": agent, "source": source.as_str(),
                           "rules": c.tainted_by, "trustLevel": c.trust_level}),
                );
            }
        }
        if self.state.config.consolidate_after > 0 {
            self.maybe_consolidate(owner, agent);
        }
    }

    /// Deletes the entries of one conversation (and with `purge_derived` every observation
    /// derived from it); how many entries. Their vectors leave the index.
    pub async fn forget_session(
        &self,
        tenant: &Tenant,
        session_key: &str,
        purge_derived: bool,
    ) -> Result<i64, GatewayError> {
        let ids = self
            .store
            .memory_delete_by_session(tenant, session_key)
            .await?;
        self.state.unindex(&ids);
        if purge_derived {
            self.store
                .memory_purge_derived_by_session(tenant, session_key)
                .await?;
        }
        Ok(ids.len() as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_is_never_raised_and_taint_lowers_it() {
        let c = check("The user likes green tea.", "learned", &[]).unwrap();
        assert_eq!(c.trust_level, "learned");
        assert!(c.tainted_by.is_empty());
        let c = check("The user likes green tea.", "bogus", &[]).unwrap();
        assert_eq!(c.trust_level, "external");
        assert!(lowered("system", "learned"));
        assert!(!lowered("external", "learned"));
        assert!(lowered("learned", "external"));
    }
}
