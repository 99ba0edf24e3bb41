//! `autonomy`: the limits on run trees agents build themselves (sub-agents), and the denial
//! breaker of gate decisions. See `docs/orchestration.md`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Largest `autonomy.subagents.maxDepth`.
pub const MAX_DEPTH: u32 = 16;

/// `autonomy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct AutonomyConfig {
    /// Sub-agent runs: how deep, how many per run, how many at once.
    pub subagents: SubagentLimits,
    /// Consecutive gate refusals of one run that abort its whole tree (final status
    /// `completed`, counted as a denial-breaker trip).
    pub denial_breaker: DenialBreaker,
    /// Tool calls that wait for an operator's decision (`admin.approval.*`); none by default.
    pub approvals: ApprovalsConfig,
    /// What one run tree may spend in all (every run of it together); unlimited by default.
    /// It is the budget of the `default` profile.
    pub tree_budget: TreeBudgetConfig,
    /// Autonomy profiles by name: `default` (what every tree may do) and named profiles that
    /// add tools or budget for the trees of the agents they list (`autonomy.evict` drops a
    /// tree back to `default`).
    pub profiles: std::collections::BTreeMap<String, ProfileConfig>,
    /// `autonomy.durability`: run statuses and stops are always stored (see
    /// `docs/orchestration.md`, "Durability"); the key exists for configurations written for
    /// the spec, and only `enabled: true` is accepted.
    pub durability: DurabilityConfig,
}

/// `autonomy.durability`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct DurabilityConfig {
    /// Always true: a revoked or killed run stays so across a restart, and a queued run a
    /// stop ended is never started.
    pub enabled: bool,
}

impl Default for DurabilityConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// The name of the baseline profile.
pub const DEFAULT_PROFILE: &str = "default";

/// Most profiles, and most tool rules or agents in one.
pub const MAX_PROFILES: usize = 64;
pub const MAX_PROFILE_ENTRIES: usize = 256;

/// `autonomy.profiles.<name>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ProfileConfig {
    /// Agents whose run trees work under this profile (a tree takes its root agent's). Not on
    /// `default`, which every other tree works under.
    pub agents: Vec<String>,
    /// Tools: names, `*`/`?` patterns, or `group:<name>`. On `default`, the tools every tree
    /// may call (absent: every tool its lease allows); on a named profile, the tools it adds
    /// to `default`'s. A tool is still only called when the agent offers it.
    pub tools: Option<Vec<String>>,
    /// The tree budget under this profile, instead of `autonomy.treeBudget` (which is
    /// `default`'s; not on `default` itself).
    pub tree_budget: Option<TreeBudgetConfig>,
}

/// `autonomy.treeBudget`: the budget of a root, shared by every run of its tree. Once it is
/// spent, the tree's gate decisions refuse tool calls and its turns end `budget_exceeded`
/// after the model call that spent it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TreeBudgetConfig {
    /// Tokens (input and output) of every model call of the tree.
    #[schemars(range(min = 1))]
    pub max_tokens: Option<u64>,
    /// USD of every model call of the tree, at the configured prices.
    pub max_cost_usd: Option<f64>,
}

/// Largest `autonomy.approvals.timeoutSeconds` (a day).
pub const MAX_APPROVAL_SECONDS: u32 = 86_400;

/// `autonomy.approvals`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ApprovalsConfig {
    /// Tool name patterns (`*` any run of characters, `?` one) whose calls need approval, for
    /// every agent.
    pub tools: Vec<String>,
    /// More patterns per agent id.
    pub agents: std::collections::BTreeMap<String, Vec<String>>,
    /// Seconds a request waits for a decision; unanswered, it lapses as a denial.
    #[schemars(range(min = 1, max = MAX_APPROVAL_SECONDS))]
    pub timeout_seconds: u32,
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        Self {
            tools: Vec::new(),
            agents: Default::default(),
            timeout_seconds: 300,
        }
    }
}

/// `autonomy.subagents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SubagentLimits {
    /// Deepest run a tree may hold (a root is depth 0); a spawn below it is refused.
    #[schemars(range(min = 1, max = MAX_DEPTH))]
    pub max_depth: u32,
    /// Children one run may spawn over its life.
    #[schemars(range(min = 1, max = 1000))]
    pub max_children_per_run: u32,
    /// Sub-agent runs (depth 1 and below) live on this node at once.
    #[schemars(range(min = 1, max = 100_000))]
    pub max_concurrent: u32,
}

impl Default for SubagentLimits {
    fn default() -> Self {
        Self {
            max_depth: 3,
            max_children_per_run: 8,
            max_concurrent: 32,
        }
    }
}

/// `autonomy.denialBreaker`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct DenialBreaker {
    /// Consecutive refusals that trip it.
    #[schemars(range(min = 1, max = 1000))]
    pub threshold: u32,
}

impl Default for DenialBreaker {
    fn default() -> Self {
        Self { threshold: 3 }
    }
}

/// Checks the ranges the schema states.
pub fn validate(c: &AutonomyConfig) -> Result<(), ConfigError> {
    let s = &c.subagents;
    let bad =
        |what: &str, max: u64| ConfigError(format!("autonomy.{what} must be between 1 and {max}"));
    if s.max_depth == 0 || s.max_depth > MAX_DEPTH {
        return Err(bad("subagents.maxDepth", u64::from(MAX_DEPTH)));
    }
    if s.max_children_per_run == 0 || s.max_children_per_run > 1000 {
        return Err(bad("subagents.maxChildrenPerRun", 1000));
    }
    if s.max_concurrent == 0 || s.max_concurrent > 100_000 {
        return Err(bad("subagents.maxConcurrent", 100_000));
    }
    let t = c.approvals.timeout_seconds;
    if t == 0 || t > MAX_APPROVAL_SECONDS {
        return Err(bad(
            "approvals.timeoutSeconds",
            u64::from(MAX_APPROVAL_SECONDS),
        ));
    }
    if c.denial_breaker.threshold == 0 || c.denial_breaker.threshold > 1000 {
        return Err(bad("denialBreaker.threshold", 1000));
    }
    validate_budget("autonomy.treeBudget", &c.tree_budget)?;
    if !c.durability.enabled {
        return Err(ConfigError(
            "autonomy.durability.enabled cannot be false: run statuses and stops are always stored, so a revoked or killed run stays so across a restart".into(),
        ));
    }
    validate_profiles(&c.profiles)
}

fn validate_budget(at: &str, b: &TreeBudgetConfig) -> Result<(), ConfigError> {
    if b.max_tokens == Some(0) {
        return Err(ConfigError(format!("{at}.maxTokens must be at least 1")));
    }
    if let Some(usd) = b.max_cost_usd {
        if !usd.is_finite() || usd <= 0.0 {
            return Err(ConfigError(format!(
                "{at}.maxCostUsd must be a positive number"
            )));
        }
    }
    Ok(())
}

fn validate_profiles(
    profiles: &std::collections::BTreeMap<String, ProfileConfig>,
) -> Result<(), ConfigError> {
    if profiles.len() > MAX_PROFILES {
        return Err(ConfigError(format!(
            "autonomy.profiles holds at most {MAX_PROFILES} profiles"
        )));
    }
    let mut owner: std::collections::HashMap<&str, &str> = Default::default();
    for (name, p) in profiles {
        let at = format!("autonomy.profiles.{name}");
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid_name {
            return Err(ConfigError(format!(
                "{at}: a profile name is 1-64 letters, digits, '_' or '-'"
            )));
        }
        let tools = p.tools.as_deref().unwrap_or_default();
        if p.agents.len() > MAX_PROFILE_ENTRIES || tools.len() > MAX_PROFILE_ENTRIES {
            return Err(ConfigError(format!(
                "{at}: at most {MAX_PROFILE_ENTRIES} agents and {MAX_PROFILE_ENTRIES} tools"
            )));
        }
        if let Some(bad) = tools
            .iter()
            .find(|t| t.is_empty() || t.len() > 128 || t.as_str() == "group:")
        {
            return Err(ConfigError(format!(
                "{at}.tools: '{bad}' is not a tool name, pattern or group:<name>"
            )));
        }
        if name == DEFAULT_PROFILE {
            if !p.agents.is_empty() {
                return Err(ConfigError(format!(
                    "{at}.agents: every tree outside a named profile works under default; list agents in a named profile"
                )));
            }
            if p.tree_budget.is_some() {
                return Err(ConfigError(format!(
                    "{at}.treeBudget: default's budget is autonomy.treeBudget"
                )));
            }
            continue;
        }
        if let Some(b) = &p.tree_budget {
            validate_budget(&format!("{at}.treeBudget"), b)?;
        }
        for agent in &p.agents {
            if let Some(other) = owner.insert(agent, name) {
                return Err(ConfigError(format!(
                    "{at}.agents: agent '{agent}' is already in profile '{other}' (one profile per agent)"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durability_is_on_and_cannot_be_turned_off() {
        let mut c = AutonomyConfig::default();
        assert!(c.durability.enabled);
        assert!(validate(&c).is_ok());
        c.durability.enabled = false;
        assert!(validate(&c)
            .unwrap_err()
            .0
            .contains("autonomy.durability.enabled cannot be false"));
    }

    #[test]
    fn profiles_are_checked() {
        let mut c = AutonomyConfig::default();
        let named = |agents: &[&str]| ProfileConfig {
            agents: agents.iter().map(|a| (*a).to_owned()).collect(),
            tools: Some(vec!["save_file".into()]),
            tree_budget: None,
        };
        c.profiles.insert("builder".into(), named(&["planner"]));
        c.profiles
            .insert("default".into(), ProfileConfig::default());
        assert!(validate(&c).is_ok());
        c.profiles.insert("other".into(), named(&["planner"]));
        assert!(validate(&c)
            .unwrap_err()
            .0
            .contains("already in profile 'builder'"));
        c.profiles.remove("other");
        c.profiles.insert("default".into(), named(&["x"]));
        assert!(validate(&c)
            .unwrap_err()
            .0
            .contains("profiles.default.agents"));
        c.profiles.insert(
            "default".into(),
            ProfileConfig {
                tree_budget: Some(TreeBudgetConfig::default()),
                ..ProfileConfig::default()
            },
        );
        assert!(validate(&c).unwrap_err().0.contains("autonomy.treeBudget"));
        c.profiles.remove("default");
        c.profiles.insert("bad name".into(), named(&[]));
        assert!(validate(&c).unwrap_err().0.contains("profile name"));
        c.profiles.remove("bad name");
        let mut p = named(&[]);
        p.tree_budget = Some(TreeBudgetConfig {
            max_tokens: Some(0),
            max_cost_usd: None,
        });
        c.profiles.insert("zero".into(), p);
        assert!(validate(&c)
            .unwrap_err()
            .0
            .contains("autonomy.profiles.zero.treeBudget.maxTokens"));
        c.profiles.remove("zero");
        let mut p = named(&[]);
        p.tools = Some(vec!["group:".into()]);
        c.profiles.insert("empty-group".into(), p);
        assert!(validate(&c).unwrap_err().0.contains("group:<name>"));
        c.profiles.clear();
        for i in 0..MAX_PROFILES {
            c.profiles.insert(format!("p{i}"), named(&[]));
        }
        assert!(validate(&c).is_ok(), "at the limit");
        c.profiles.insert("one-more".into(), named(&[]));
        assert!(validate(&c).unwrap_err().0.contains("at most 64 profiles"));
    }

    #[test]
    fn a_tree_budget_is_unlimited_by_default_and_its_limits_are_checked() {
        let mut c = AutonomyConfig::default();
        assert_eq!(c.tree_budget, TreeBudgetConfig::default());
        assert!(validate(&c).is_ok());
        c.tree_budget.max_tokens = Some(1);
        c.tree_budget.max_cost_usd = Some(0.01);
        assert!(validate(&c).is_ok(), "the smallest limits");
        c.tree_budget.max_tokens = Some(0);
        assert!(validate(&c).unwrap_err().0.contains("treeBudget.maxTokens"));
        c.tree_budget.max_tokens = None;
        for usd in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            c.tree_budget.max_cost_usd = Some(usd);
            assert!(
                validate(&c)
                    .unwrap_err()
                    .0
                    .contains("treeBudget.maxCostUsd"),
                "{usd}"
            );
        }
    }
}
