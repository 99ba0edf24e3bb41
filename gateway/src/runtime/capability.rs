//! The rules of the capability socket (`tool.invoke`), apart from its transport
//! (`rpc/capability.rs`): where the socket lives, the denylist, the origin check and the
//! administrator-trust flag (`docs/orchestration.md`, "The capability socket").

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The socket's file name in the data directory.
pub const SOCKET_FILE: &str = "capability.sock";
/// Longest request line (bytes, the newline excluded); a longer one is answered with an
/// error and the connection closes.
pub const MAX_LINE: usize = 1 << 20;
/// Environment variable naming the socket for a process a run starts (a wake gate).
pub const ENV_SOCKET: &str = "AGENT_GATEWAY_CAPABILITY_SOCKET";
/// Environment variable holding the run's lease token for that process.
pub const ENV_LEASE: &str = "AGENT_GATEWAY_LEASE";

/// Most (tool, capability, decision) groups a run keeps of its socket calls; calls of a new
/// group past them are only counted ([`SocketCalls::dropped`]).
pub const MAX_CALL_GROUPS: usize = 32;
/// Longest tool or capability name a group keeps (characters); longer ones are cut.
const MAX_GROUP_NAME: usize = 128;

/// Calls with one tool, capability and decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallGroup {
    pub tool: String,
    /// What the call required: `scope:<scope>` for a gateway method, `tool:<name>` for a
    /// built-in tool, `none` for a name that is neither.
    pub capability: String,
    /// Past every check (the gate's decision `allowed`), or refused by one (`denied`).
    pub allowed: bool,
    pub count: u64,
}

/// What a run's process did on the socket: its calls grouped (in first-call order) and the
/// results returned to it. Kept on the live run and recorded with a wake gate's fire
/// (`obs.explain`'s `orchestrate` entries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketCalls {
    pub groups: Vec<CallGroup>,
    /// Calls of groups past [`MAX_CALL_GROUPS`].
    pub dropped: u64,
    /// Results returned, and their size in bytes (the JSON of a method's result, the text of
    /// a built-in tool's).
    pub results: u64,
    pub result_bytes: u64,
}

impl SocketCalls {
    /// Counts one decided call.
    pub fn add(&mut self, tool: &str, capability: &str, allowed: bool) {
        let tool = clip(tool);
        let capability = clip(capability);
        if let Some(g) = self
            .groups
            .iter_mut()
            .find(|g| g.allowed == allowed && g.tool == tool && g.capability == capability)
        {
            g.count += 1;
        } else if self.groups.len() < MAX_CALL_GROUPS {
            self.groups.push(CallGroup {
                tool: tool.to_owned(),
                capability: capability.to_owned(),
                allowed,
                count: 1,
            });
        } else {
            self.dropped += 1;
        }
    }

    /// Counts one result returned to the process.
    pub fn result(&mut self, bytes: usize) {
        self.results += 1;
        self.result_bytes = self.result_bytes.saturating_add(bytes as u64);
    }

    /// Calls refused by a check.
    pub fn denied(&self) -> u64 {
        self.groups
            .iter()
            .filter(|g| !g.allowed)
            .map(|g| g.count)
            .sum()
    }

    /// Every call its lease authenticated (allowed, denied, and those of dropped groups).
    pub fn total(&self) -> u64 {
        self.allowed() + self.denied() + self.dropped
    }

    /// Calls past every check.
    pub fn allowed(&self) -> u64 {
        self.groups
            .iter()
            .filter(|g| g.allowed)
            .map(|g| g.count)
            .sum()
    }
}

fn clip(s: &str) -> &str {
    match s.char_indices().nth(MAX_GROUP_NAME) {
        Some((at, _)) => &s[..at],
        None => s,
    }
}

/// The capability a gateway method requires: its scope.
pub fn method_capability(scope: &str) -> String {
    format!("scope:{scope}")
}

/// The capability a built-in tool requires: the tool itself (a lease's capabilities are the
/// tools its agent allows, narrowed by the caller and the profile).
pub fn tool_capability(tool: &str) -> String {
    format!("tool:{tool}")
}

/// The socket of the data directory `data_dir`.
pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SOCKET_FILE)
}

/// The checks of `tool.invoke`, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Lease,
    Denylist,
    Origin,
    Capability,
}

impl Check {
    /// The check's name: the first word of its refusal and `check` in `capability:audited`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lease => "lease",
            Self::Denylist => "denylist",
            Self::Origin => "origin",
            Self::Capability => "capability",
        }
    }
}

/// The autonomy control methods: only an agent with administrator trust may call them
/// through `tool.invoke`.
pub const CONTROL_METHODS: &[&str] = &[
    "run.kill",
    "lease.revoke",
    "subagent.kill",
    "subagent.steer",
    "subagent.pause",
    "subagent.resume",
    "autonomy.evict",
];

/// Why `target` is on the denylist for an agent (`trusted`: it has administrator trust;
/// `admin_scope`: the target requires scope admin), or None. `tool.invoke` itself is always
/// denied (no call through the socket reaches the socket again).
pub fn denied(target: &str, admin_scope: bool, trusted: bool) -> Option<&'static str> {
    if target == "tool.invoke" {
        return Some("tool.invoke cannot be called through tool.invoke");
    }
    if trusted {
        return None;
    }
    if CONTROL_METHODS.contains(&target) || target.starts_with("admin.approval.") {
        return Some("an autonomy control method needs the agent's adminTrust");
    }
    if admin_scope {
        return Some("an admin method needs the agent's adminTrust");
    }
    None
}

/// Whether the peer is the daemon's own user (`peer`: the uid of the socket's peer
/// credentials; None when they could not be read, which refuses).
pub fn origin_ok(peer: Option<u32>, own: u32) -> bool {
    peer == Some(own)
}

/// Whether `agent_id` has administrator trust in the configuration file `file_document` (as
/// read for the generation: an API write never reaches it). Only `true` counts.
pub fn admin_trust(file_document: &Value, agent_id: &str) -> bool {
    file_document
        .get("agents")
        .and_then(|a| a.get(agent_id))
        .and_then(|a| a.get("adminTrust"))
        .and_then(Value::as_bool)
        == Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_denylist_keeps_control_and_admin_methods_from_untrusted_agents() {
        assert!(denied("tool.invoke", false, true).is_some(), "always");
        for m in CONTROL_METHODS {
            assert!(denied(m, false, false).is_some(), "{m}");
            assert!(denied(m, false, true).is_none(), "{m} trusted");
        }
        assert!(denied("admin.approval.resolve", true, false).is_some());
        assert!(
            denied("tokens.create", true, false).is_some(),
            "admin scope"
        );
        assert!(denied("tokens.create", true, true).is_none());
        assert!(denied("memory.search", false, false).is_none());
        assert!(denied("current_time", false, false).is_none());
    }

    #[test]
    fn socket_calls_group_by_tool_capability_and_decision_within_a_bound() {
        let mut c = SocketCalls::default();
        c.add("current_time", "tool:current_time", true);
        c.add("current_time", "tool:current_time", true);
        c.add("current_time", "tool:current_time", false);
        c.add("tokens.create", "scope:admin", false);
        assert_eq!(c.groups.len(), 3);
        assert_eq!((c.allowed(), c.denied()), (2, 2));
        assert_eq!(c.total(), 4);
        assert_eq!(c.groups[0].count, 2);
        for i in 0..(MAX_CALL_GROUPS + 5) {
            c.add(&format!("t{i}"), "none", false);
        }
        assert_eq!(c.groups.len(), MAX_CALL_GROUPS, "at the bound");
        assert_eq!(c.dropped, 8, "past it: counted only");
        assert_eq!(
            c.total(),
            4 + MAX_CALL_GROUPS as u64 + 5,
            "dropped calls still count"
        );
        let long = "x".repeat(300);
        let mut d = SocketCalls::default();
        d.add(&long, &long, true);
        assert_eq!(d.groups[0].tool.chars().count(), MAX_GROUP_NAME);
        d.result(10);
        d.result(5);
        assert_eq!((d.results, d.result_bytes), (2, 15));
    }

    #[test]
    fn the_origin_is_the_daemons_own_user_only() {
        assert!(origin_ok(Some(1000), 1000));
        assert!(!origin_ok(Some(0), 1000), "another uid, root included");
        assert!(!origin_ok(None, 1000), "no credentials");
    }

    #[test]
    fn admin_trust_is_only_a_true_in_the_file() {
        let doc = json!({"agents": {"a": {"adminTrust": true}, "b": {"adminTrust": "true"},
                                    "c": {}}});
        assert!(admin_trust(&doc, "a"));
        assert!(!admin_trust(&doc, "b"));
        assert!(!admin_trust(&doc, "c"));
        assert!(!admin_trust(&doc, "d"));
        assert!(!admin_trust(&json!({}), "a"));
    }
}
