//! Autonomy profiles (`autonomy.profiles`) and eviction (`autonomy.evict`): the profile a run
//! tree works under, what it adds to `default`, and the daemon-wide evicted set. A tree's
//! profile is its root agent's, shared by every run of the tree; evicting the root drops the
//! whole tree to `default` at its next gate decision, without stopping it. See
//! `docs/orchestration.md`, "Profiles and eviction".

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use wildmatch::WildMatch;

use crate::config::autonomy::{AutonomyConfig, TreeBudgetConfig};

use crate::config::autonomy::DEFAULT_PROFILE as DEFAULT;

/// Most root ids the evicted set remembers; past it the oldest mark is forgotten (a mark is
/// dropped anyway once its tree has no live run).
pub const MAX_EVICTED: usize = 10_000;

/// Tool rules of a profile: names, `*`/`?` patterns, and `group:<name>` for a tool group. As
/// in an agent's `tools` (`Agent::allows_tool_in`), a tool of an opt-in group is reached only
/// by its own name or its group, never by a wildcard.
#[derive(Debug)]
struct ToolRules {
    patterns: Vec<(String, WildMatch)>,
    groups: Vec<String>,
}

impl ToolRules {
    fn new(rules: &[String]) -> Self {
        let mut patterns = Vec::new();
        let mut groups = Vec::new();
        for r in rules {
            match r.strip_prefix("group:") {
                Some(g) => groups.push(g.to_owned()),
                None => patterns.push((r.clone(), WildMatch::new(r))),
            }
        }
        Self { patterns, groups }
    }

    fn allows(&self, tool: &str, group: Option<&str>) -> bool {
        match group {
            Some(g) => {
                self.groups.iter().any(|x| x == g) || self.patterns.iter().any(|(r, _)| r == tool)
            }
            None => self.patterns.iter().any(|(_, p)| p.matches(tool)),
        }
    }
}

/// One profile, compiled.
#[derive(Debug)]
pub struct Profile {
    pub name: String,
    /// None: every tool the lease allows (only `default` can have none).
    tools: Option<ToolRules>,
    pub budget: TreeBudgetConfig,
}

/// Every profile of the configuration, compiled once per configuration.
#[derive(Debug)]
pub struct Profiles {
    default: Arc<Profile>,
    /// The named profile of each agent listed in one.
    by_agent: HashMap<String, Arc<Profile>>,
}

impl Profiles {
    pub fn new(c: &AutonomyConfig) -> Self {
        let default = Arc::new(Profile {
            name: DEFAULT.to_owned(),
            tools: c
                .profiles
                .get(DEFAULT)
                .and_then(|p| p.tools.as_deref())
                .map(ToolRules::new),
            budget: c.tree_budget.clone(),
        });
        let mut by_agent = HashMap::new();
        for (name, p) in c.profiles.iter().filter(|(n, _)| *n != DEFAULT) {
            let profile = Arc::new(Profile {
                name: name.clone(),
                tools: Some(ToolRules::new(p.tools.as_deref().unwrap_or_default())),
                budget: p
                    .tree_budget
                    .clone()
                    .unwrap_or_else(|| c.tree_budget.clone()),
            });
            for agent in &p.agents {
                by_agent.insert(agent.clone(), profile.clone());
            }
        }
        Self { default, by_agent }
    }

    /// The profile a new tree whose root runs `agent` works under.
    pub fn for_root(&self, agent: &str) -> TreeProfile {
        TreeProfile {
            profile: self
                .by_agent
                .get(agent)
                .cloned()
                .unwrap_or_else(|| self.default.clone()),
            default: self.default.clone(),
            evicted: AtomicBool::new(false),
        }
    }
}

/// The profile of one run tree, shared by its runs.
#[derive(Debug)]
pub struct TreeProfile {
    profile: Arc<Profile>,
    default: Arc<Profile>,
    evicted: AtomicBool,
}

impl TreeProfile {
    /// A tree under `default` with `budget` (tests and trees without a configuration).
    pub fn plain(budget: &TreeBudgetConfig) -> Self {
        let default = Arc::new(Profile {
            name: DEFAULT.to_owned(),
            tools: None,
            budget: budget.clone(),
        });
        Self {
            profile: default.clone(),
            default,
            evicted: AtomicBool::new(false),
        }
    }

    /// The profile in effect: `default` once the tree is evicted.
    pub fn effective(&self) -> &Profile {
        if self.evicted() {
            &self.default
        } else {
            &self.profile
        }
    }

    /// The profile the tree was given (its root agent's).
    pub fn assigned(&self) -> &str {
        &self.profile.name
    }

    pub fn evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// Marks the tree evicted; true when it was not yet.
    pub fn evict(&self) -> bool {
        !self.evicted.swap(true, Ordering::AcqRel)
    }

    /// Whether the profile in effect lets the tree call `tool` (of opt-in `group`): what
    /// `default` allows, and what a named profile adds to it until the tree is evicted.
    pub fn allows(&self, tool: &str, group: Option<&str>) -> bool {
        let by_default = self
            .default
            .tools
            .as_ref()
            .is_none_or(|t| t.allows(tool, group));
        by_default
            || (!self.evicted()
                && self
                    .profile
                    .tools
                    .as_ref()
                    .is_some_and(|t| t.allows(tool, group)))
    }

    /// (tokens, USD) limits of the tree's budget under the profile in effect.
    pub fn limits(&self) -> (Option<u64>, Option<f64>) {
        let b = &self.effective().budget;
        (b.max_tokens, b.max_cost_usd)
    }
}

/// The daemon-wide evicted set: root run ids marked by `autonomy.evict`, kept until their
/// tree has no live run (a mark may precede its run), at most [`MAX_EVICTED`].
#[derive(Debug, Default)]
pub struct Evicted {
    inner: Mutex<EvictedInner>,
}

#[derive(Debug, Default)]
struct EvictedInner {
    set: HashSet<String>,
    order: VecDeque<String>,
}

impl Evicted {
    fn lock(&self) -> std::sync::MutexGuard<'_, EvictedInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks `root`; true when it was already marked.
    pub fn mark(&self, root: &str) -> bool {
        let mut inner = self.lock();
        if inner.set.contains(root) {
            return true;
        }
        if inner.order.len() >= MAX_EVICTED {
            if let Some(old) = inner.order.pop_front() {
                inner.set.remove(&old);
            }
        }
        inner.set.insert(root.to_owned());
        inner.order.push_back(root.to_owned());
        false
    }

    pub fn contains(&self, root: &str) -> bool {
        let inner = self.lock();
        !inner.set.is_empty() && inner.set.contains(root)
    }

    /// Forgets `root` (its tree has no live run left).
    pub fn forget(&self, root: &str) {
        let mut inner = self.lock();
        if inner.set.remove(root) {
            inner.order.retain(|r| r != root);
        }
    }

    /// How many roots are marked.
    #[cfg(test)]
    pub fn marked(&self) -> usize {
        self.lock().set.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::autonomy::ProfileConfig;

    fn config() -> AutonomyConfig {
        let mut c = AutonomyConfig::default();
        c.tree_budget.max_tokens = Some(100);
        c.profiles.insert(
            DEFAULT.to_owned(),
            ProfileConfig {
                tools: Some(vec!["current_time".into(), "memory_*".into()]),
                ..ProfileConfig::default()
            },
        );
        c.profiles.insert(
            "builder".to_owned(),
            ProfileConfig {
                agents: vec!["planner".into()],
                tools: Some(vec!["group:agents".into(), "save_file".into()]),
                tree_budget: Some(TreeBudgetConfig {
                    max_tokens: Some(10_000),
                    max_cost_usd: None,
                }),
            },
        );
        c
    }

    #[test]
    fn a_named_profile_adds_tools_and_budget_until_its_tree_is_evicted() {
        let profiles = Profiles::new(&config());
        let tree = profiles.for_root("planner");
        assert_eq!(tree.assigned(), "builder");
        assert!(tree.allows("current_time", None), "default's tools");
        assert!(tree.allows("memory_search", None), "default's patterns");
        assert!(
            tree.allows("spawn_agent", Some("agents")),
            "the added group"
        );
        assert!(tree.allows("save_file", None), "the added tool");
        assert!(
            !tree.allows("note_add", None),
            "neither default's nor the profile's"
        );
        assert_eq!(tree.limits(), (Some(10_000), None));

        assert!(tree.evict());
        assert!(!tree.evict(), "a second eviction changes nothing");
        assert_eq!(tree.effective().name, DEFAULT);
        assert!(tree.allows("current_time", None));
        assert!(!tree.allows("spawn_agent", Some("agents")));
        assert!(!tree.allows("save_file", None));
        assert_eq!(tree.limits(), (Some(100), None), "default's budget");
    }

    #[test]
    fn agents_in_no_profile_work_under_default_and_default_without_tools_allows_all() {
        let profiles = Profiles::new(&config());
        let tree = profiles.for_root("other");
        assert_eq!(tree.assigned(), DEFAULT);
        assert!(!tree.allows("save_file", None));

        // A wildcard does not reach an opt-in tool; its name or its group does.
        let mut c = config();
        c.profiles.get_mut("builder").unwrap().tools = Some(vec!["*".into(), "wait_agents".into()]);
        let star = Profiles::new(&c).for_root("planner");
        assert!(star.allows("save_file", None));
        assert!(!star.allows("spawn_agent", Some("agents")));
        assert!(star.allows("wait_agents", Some("agents")));

        let open = Profiles::new(&AutonomyConfig::default()).for_root("any");
        assert!(open.allows("save_file", None));
        assert!(open.allows("spawn_agent", Some("agents")));
        assert_eq!(open.limits(), (None, None));
    }

    #[test]
    fn the_evicted_set_is_bounded_and_forgets_ended_trees() {
        let set = Evicted::default();
        assert!(!set.mark("run_a"));
        assert!(set.mark("run_a"), "already marked");
        assert!(set.contains("run_a"));
        set.forget("run_a");
        assert!(!set.contains("run_a"));
        for i in 0..=MAX_EVICTED {
            set.mark(&format!("run_{i}"));
        }
        assert_eq!(set.marked(), MAX_EVICTED, "at the cap");
        assert!(!set.contains("run_0"), "the oldest mark went first");
        assert!(set.contains(&format!("run_{MAX_EVICTED}")));
    }
}
