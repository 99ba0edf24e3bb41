//! The run registry: every run live on this node, with its place in its tree, the tokens that
//! stop it, its lease, its steering inbox and the signal its waiters watch
//! (`docs/orchestration.md`). Process-wide (held by [`crate::runtime::control::Control`]), so a
//! server generation reaches the runs an earlier one started.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::profiles::{Evicted, TreeProfile};

/// Why a run was stopped from outside its turn (the first reason wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// `run.kill` / `subagent.kill` (or an ancestor's): the turn is dropped where it is.
    Killed,
    /// `lease.revoke`: the next gate decision refuses and the run ends.
    Revoked,
    /// The denial breaker tripped: the tree ends with status `completed`.
    DenialBreaker,
}

/// A run's lease: the capabilities it may use, revocable once.
pub struct Lease {
    pub id: String,
    /// The secret a local process the run starts presents on the capability socket
    /// (`lt_` + 64 hex digits). Never logged, never in an event or an API answer.
    token: String,
    revoked: AtomicBool,
    /// Tool names the run may call; None = what its agent allows (narrowed per turn).
    pub tools: Option<std::collections::BTreeSet<String>>,
}

impl Lease {
    /// Whether it still validates.
    pub fn valid(&self) -> bool {
        !self.revoked.load(Ordering::Acquire)
    }

    /// Revokes it; true when this call did.
    pub fn revoke(&self) -> bool {
        !self.revoked.swap(true, Ordering::AcqRel)
    }

    /// The lease's secret token, for the processes the run starts (a wake gate's
    /// environment) and nothing else.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Whether `presented` is this lease's token, compared in constant time.
    pub fn token_is(&self, presented: &str) -> bool {
        constant_time_eq(self.token.as_bytes(), presented.as_bytes())
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is left out on purpose.
        f.debug_struct("Lease")
            .field("id", &self.id)
            .field("valid", &self.valid())
            .finish_non_exhaustive()
    }
}

/// Byte equality whose time depends on the lengths only, not on where the bytes differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A new lease token: 32 bytes of the system's generator, hex, behind `lt_`. Without
/// randomness the token is empty, which [`RunTree::by_token`] never matches.
fn new_lease_token() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    match ring::rand::SystemRandom::new().fill(&mut bytes) {
        Ok(()) => format!("lt_{}", hex::encode(bytes)),
        Err(_) => String::new(),
    }
}

/// What a run tree has spent and may spend, shared by every run of the tree: each model call
/// of any of its runs adds to it. Its limits are those of the tree's profile in effect
/// (`autonomy.treeBudget` for `default`, or the named profile's), which also decides the
/// tools the tree may call.
#[derive(Debug)]
pub struct TreeBudget {
    tokens: std::sync::atomic::AtomicU64,
    usd_bits: std::sync::atomic::AtomicU64,
    pub profile: TreeProfile,
}

impl TreeBudget {
    pub fn new(profile: TreeProfile) -> Self {
        Self {
            tokens: std::sync::atomic::AtomicU64::new(0),
            usd_bits: std::sync::atomic::AtomicU64::new(0),
            profile,
        }
    }

    /// Adds one model call's tokens and cost.
    pub fn add(&self, tokens: u64, usd: f64) {
        self.tokens.fetch_add(tokens, Ordering::AcqRel);
        if usd > 0.0 {
            let _ = self
                .usd_bits
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |bits| {
                    Some((f64::from_bits(bits) + usd).to_bits())
                });
        }
    }

    /// (tokens, USD) the tree has spent.
    pub fn spent(&self) -> (u64, f64) {
        (
            self.tokens.load(Ordering::Acquire),
            f64::from_bits(self.usd_bits.load(Ordering::Acquire)),
        )
    }

    /// (tokens, USD) the tree may still spend; None where it has no limit.
    pub fn remaining(&self) -> (Option<u64>, Option<f64>) {
        let (tokens, usd) = self.spent();
        let (max_tokens, max_usd) = self.profile.limits();
        (
            max_tokens.map(|m| m.saturating_sub(tokens)),
            max_usd.map(|m| (m - usd).max(0.0)),
        )
    }

    /// Whether a limit is reached.
    pub fn spent_out(&self) -> bool {
        let (tokens, usd) = self.remaining();
        tokens == Some(0) || usd.is_some_and(|u| u <= 0.0)
    }
}

/// One live run.
pub struct LiveRun {
    pub run_id: String,
    pub root_run_id: String,
    pub parent_run_id: Option<String>,
    pub depth: u32,
    pub agent_id: String,
    /// Who started the tree (owns the runs).
    pub client_id: String,
    /// The scopes of the caller the run works for: what a gateway method called through
    /// `tool.invoke` with its lease may require.
    pub scopes: crate::api::scopes::Scopes,
    /// `tool.invoke` calls made with its lease (past the lease check), grouped by tool,
    /// capability and decision, and the results returned.
    pub socket: Mutex<crate::runtime::capability::SocketCalls>,
    /// Cancelled by a kill of this run or of any ancestor: the run's task drops its turn.
    pub kill: CancellationToken,
    pub lease: Lease,
    stop: Mutex<Option<Stop>>,
    /// Steering messages waiting for the next step boundary.
    inbox: Mutex<Vec<String>>,
    /// Children spawned over the run's life.
    pub children: AtomicU32,
    /// Consecutive gate refusals.
    pub refusals: AtomicU32,
    /// Refusals in a row that trip the denial breaker.
    pub denial_threshold: u32,
    /// When the run's wall-clock limit ends, if it has one.
    pub deadline: Option<std::time::Instant>,
    /// The tree's budget (its root's, shared with every run of the tree).
    pub budget: Arc<TreeBudget>,
    /// Set once the run ended: its final row as stored (None: it never started, or its row
    /// could not be written), waking its waiters.
    ended: watch::Sender<Option<Option<Arc<crate::store::runs::RunRow>>>>,
    /// Files its turn saved (`save_file`), at most [`MAX_SAVED_FILES`]: a graph's agent node
    /// lists them as its artifacts.
    saved: Mutex<Vec<SavedFile>>,
}

/// A file a run's turn saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedFile {
    pub file_name: String,
    pub media_id: String,
    pub size: u64,
}

/// Most saved files a run keeps track of.
pub const MAX_SAVED_FILES: usize = 64;

impl LiveRun {
    /// Records why the run is stopped; the first reason wins. True when this one did.
    pub fn stop(&self, why: Stop) -> bool {
        let mut s = self.stop.lock().unwrap_or_else(|p| p.into_inner());
        if s.is_some() {
            return false;
        }
        *s = Some(why);
        true
    }

    /// Why it was stopped, if it was.
    pub fn stopped(&self) -> Option<Stop> {
        *self.stop.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a steering message for the next step boundary.
    pub fn steer(&self, message: String) {
        self.inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(message);
    }

    /// Whether steering messages wait.
    pub fn has_steering(&self) -> bool {
        !self
            .inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Takes the steering messages waiting (at a step boundary).
    pub fn take_steering(&self) -> Vec<String> {
        std::mem::take(&mut *self.inbox.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Notes a file its turn saved (past [`MAX_SAVED_FILES`], no more are noted).
    pub fn record_saved(&self, file: SavedFile) {
        let mut saved = self.saved.lock().unwrap_or_else(|p| p.into_inner());
        if saved.len() < MAX_SAVED_FILES {
            saved.push(file);
        }
    }

    /// The files its turn saved, in order.
    pub fn saved_files(&self) -> Vec<SavedFile> {
        self.saved.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until the run has ended.
    pub async fn ended(&self) {
        let mut rx = self.ended.subscribe();
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// Whether the run has ended.
    pub fn has_ended(&self) -> bool {
        self.ended.borrow().is_some()
    }

    /// The run's final row once it has ended (read by waiters without a trip to the store).
    pub fn final_row(&self) -> Option<Arc<crate::store::runs::RunRow>> {
        self.ended.borrow().clone().flatten()
    }
}

/// A gate decision: what happens to one tool call of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// The call runs.
    Allowed,
    /// The call does not run; the model gets this reason.
    Refused(String),
    /// The lease is revoked: the call does not run and the run stops (`revoked`).
    Revoked,
    /// This refusal tripped the denial breaker: the tree stops (`completed`).
    Breaker(String),
}

impl LiveRun {
    /// The gate decision before a tool call: the lease is valid, the tool is within its
    /// capabilities (`offered`: the turn offers it; the lease and the tree's profile in
    /// effect may narrow further; `group`: the tool's opt-in group), the tree's budget is not
    /// spent. Refusals in a row trip the denial breaker.
    pub fn gate(&self, tool: &str, group: Option<&str>, offered: bool) -> Gate {
        if !self.lease.valid() {
            return Gate::Revoked;
        }
        let within = offered
            && self.lease.tools.as_ref().is_none_or(|t| t.contains(tool))
            && self.budget.profile.allows(tool, group);
        let funded = !self.budget.spent_out();
        if within && funded {
            self.refusals.store(0, Ordering::Release);
            return Gate::Allowed;
        }
        let why = if within {
            format!("refused: {tool} was not run, the run tree's budget is spent")
        } else {
            format!("refused: {tool} is not within this run's capabilities")
        };
        if self.refused() {
            Gate::Breaker(format!(
                "{why}; refusals in a row stopped the run tree (denial breaker)"
            ))
        } else {
            Gate::Refused(why)
        }
    }

    /// Counts one refusal (outside the lease, or an operator's denial); true when it trips
    /// the denial breaker.
    pub fn refused(&self) -> bool {
        self.refusals.fetch_add(1, Ordering::AcqRel) + 1 >= self.denial_threshold
    }
}

/// Why a spawn was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    Paused,
    TooDeep { max: u32 },
    TooManyChildren { max: u32 },
    TooManyLive { max: u32 },
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Paused => f.write_str("sub-agent spawning is paused (subagent.resume)"),
            Self::TooDeep { max } => write!(
                f,
                "the run tree would be deeper than autonomy.subagents.maxDepth ({max})"
            ),
            Self::TooManyChildren { max } => write!(
                f,
                "this run already spawned autonomy.subagents.maxChildrenPerRun ({max}) sub-agents"
            ),
            Self::TooManyLive { max } => write!(
                f,
                "autonomy.subagents.maxConcurrent ({max}) sub-agents are running"
            ),
        }
    }
}

impl Refused {
    /// The short code in `session:sub_agent_spawn_rejected`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Paused => "paused",
            Self::TooDeep { .. } => "max_depth",
            Self::TooManyChildren { .. } => "max_children",
            Self::TooManyLive { .. } => "max_concurrent",
        }
    }
}

/// Where a new run goes in its tree.
pub struct Placement<'a> {
    pub run_id: String,
    pub parent: Option<&'a Arc<LiveRun>>,
    pub agent_id: &'a str,
    pub client_id: &'a str,
    /// The caller's scopes (see [`LiveRun::scopes`]).
    pub scopes: crate::api::scopes::Scopes,
    pub tools: Option<std::collections::BTreeSet<String>>,
    /// Consecutive gate refusals that trip the denial breaker.
    pub denial_threshold: u32,
    /// The run's wall-clock limit, if it has one.
    pub timeout: Option<std::time::Duration>,
    /// A root's profile, which holds its budget (a child shares its parent's).
    pub profile: TreeProfile,
}

/// The registry of live runs, and the spawn pause.
#[derive(Default)]
pub struct RunTree {
    live: Mutex<HashMap<String, Arc<LiveRun>>>,
    /// Roots marked by `autonomy.evict` (daemon-wide).
    evicted: Evicted,
    paused: AtomicBool,
    breaker_trips: std::sync::atomic::AtomicU64,
}

impl RunTree {
    /// Whether spawning is paused (`subagent.pause`).
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Pauses or resumes spawning; true when this changed it.
    pub fn set_paused(&self, paused: bool) -> bool {
        self.paused.swap(paused, Ordering::AcqRel) != paused
    }

    /// Checks a spawn under `parent` against the pause and the limits (a root run started
    /// from outside is checked against the pause only when `subagent` is true).
    pub fn admit(
        &self,
        parent: Option<&LiveRun>,
        limits: &crate::config::autonomy::SubagentLimits,
    ) -> Result<(), Refused> {
        if self.paused() {
            return Err(Refused::Paused);
        }
        let Some(parent) = parent else {
            return Ok(());
        };
        if parent.depth + 1 > limits.max_depth {
            return Err(Refused::TooDeep {
                max: limits.max_depth,
            });
        }
        if parent.children.load(Ordering::Acquire) >= limits.max_children_per_run {
            return Err(Refused::TooManyChildren {
                max: limits.max_children_per_run,
            });
        }
        let live_children = self.lock().values().filter(|r| r.depth > 0).count();
        if live_children >= limits.max_concurrent as usize {
            return Err(Refused::TooManyLive {
                max: limits.max_concurrent,
            });
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<LiveRun>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new live run under its parent (a child's kill token and capabilities hang
    /// off its parent's).
    pub fn register(&self, p: Placement<'_>) -> Arc<LiveRun> {
        let (root, depth, kill, tools, budget) = match p.parent {
            Some(parent) => {
                parent.children.fetch_add(1, Ordering::AcqRel);
                let tools = match (&parent.lease.tools, p.tools) {
                    (Some(up), Some(mine)) => Some(mine.intersection(up).cloned().collect()),
                    (Some(up), None) => Some(up.clone()),
                    (None, mine) => mine,
                };
                (
                    parent.root_run_id.clone(),
                    parent.depth + 1,
                    parent.kill.child_token(),
                    tools,
                    parent.budget.clone(),
                )
            }
            None => (p.run_id.clone(), 0, CancellationToken::new(), p.tools, {
                let budget = TreeBudget::new(p.profile);
                if self.evicted.contains(&p.run_id) {
                    budget.profile.evict();
                }
                Arc::new(budget)
            }),
        };
        let run = Arc::new(LiveRun {
            lease: Lease {
                id: format!("lease_{}", p.run_id.trim_start_matches("run_")),
                token: new_lease_token(),
                revoked: AtomicBool::new(false),
                tools,
            },
            run_id: p.run_id,
            root_run_id: root,
            parent_run_id: p.parent.map(|r| r.run_id.clone()),
            depth,
            agent_id: p.agent_id.to_owned(),
            client_id: p.client_id.to_owned(),
            scopes: p.scopes,
            socket: Mutex::new(crate::runtime::capability::SocketCalls::default()),
            kill,
            stop: Mutex::new(None),
            inbox: Mutex::new(Vec::new()),
            children: AtomicU32::new(0),
            refusals: AtomicU32::new(0),
            denial_threshold: p.denial_threshold.max(1),
            deadline: p.timeout.map(|t| std::time::Instant::now() + t),
            budget,
            ended: watch::channel(None).0,
            saved: Mutex::new(Vec::new()),
        });
        self.lock().insert(run.run_id.clone(), run.clone());
        run
    }

    /// Removes an ended run and wakes its waiters with its final row (`row`: as stored; None
    /// when there is none).
    pub fn finish(&self, run: &LiveRun, row: Option<crate::store::runs::RunRow>) {
        run.lease.revoke();
        {
            let mut live = self.lock();
            live.remove(&run.run_id);
            // An evicted tree's mark goes with its last live run.
            if self.evicted.contains(&run.root_run_id)
                && !live.values().any(|r| r.root_run_id == run.root_run_id)
            {
                self.evicted.forget(&run.root_run_id);
            }
        }
        run.ended.send_replace(Some(row.map(Arc::new)));
    }

    /// Marks `root` in the evicted set (`autonomy.evict`): the live runs of its tree use the
    /// `default` profile from their next gate decision, and a root of that id registered
    /// later starts evicted. True when it was already marked.
    pub fn evict(&self, root: &str) -> bool {
        let already = self.evicted.mark(root);
        for run in self.tree(root) {
            run.budget.profile.evict();
        }
        already
    }

    /// Roots in the evicted set.
    #[cfg(test)]
    pub fn evicted(&self) -> usize {
        self.evicted.marked()
    }

    /// A live run.
    pub fn get(&self, run_id: &str) -> Option<Arc<LiveRun>> {
        self.lock().get(run_id).cloned()
    }

    /// The live run whose lease token is `presented` (every live run's token is compared, in
    /// constant time each, so the answer's time does not say how close a guess came).
    pub fn by_token(&self, presented: &str) -> Option<Arc<LiveRun>> {
        if presented.is_empty() {
            return None;
        }
        let mut found = None;
        for run in self.lock().values() {
            if !run.lease.token.is_empty() && run.lease.token_is(presented) {
                found = Some(run.clone());
            }
        }
        found
    }

    /// Live runs, in no order.
    pub fn all(&self) -> Vec<Arc<LiveRun>> {
        self.lock().values().cloned().collect()
    }

    /// The live run `run_id` and every live run below it.
    pub fn subtree(&self, run_id: &str) -> Vec<Arc<LiveRun>> {
        let live = self.lock();
        live.values()
            .filter(|r| {
                let mut at: Option<&Arc<LiveRun>> = Some(r);
                while let Some(run) = at {
                    if run.run_id == run_id {
                        return true;
                    }
                    at = run.parent_run_id.as_deref().and_then(|p| live.get(p));
                }
                false
            })
            .cloned()
            .collect()
    }

    /// Every live run of the tree under `root_run_id`.
    pub fn tree(&self, root_run_id: &str) -> Vec<Arc<LiveRun>> {
        self.lock()
            .values()
            .filter(|r| r.root_run_id == root_run_id)
            .cloned()
            .collect()
    }

    /// Trips the denial breaker of the tree under `root_run_id`: every live run of it stops
    /// with status `completed`.
    pub fn trip_denial_breaker(&self, root_run_id: &str) {
        let runs = self.tree(root_run_id);
        for r in &runs {
            r.stop(Stop::DenialBreaker);
            r.lease.revoke();
        }
        self.breaker_trips.fetch_add(1, Ordering::Relaxed);
        for r in &runs {
            r.kill.cancel();
        }
    }

    /// Denial-breaker trips since the process started.
    pub fn denial_breaker_trips(&self) -> u64 {
        self.breaker_trips.load(Ordering::Relaxed)
    }

    /// Kills `runs` (a subtree or a tree): each is marked killed and its lease revoked, and
    /// their tokens are cancelled (a child's follows its parent's). Answers (runs killed,
    /// leases revoked).
    pub fn kill(&self, runs: &[Arc<LiveRun>]) -> (usize, usize) {
        let (mut killed, mut revoked) = (0, 0);
        for r in runs {
            if r.stop(Stop::Killed) {
                killed += 1;
            }
            if r.lease.revoke() {
                revoked += 1;
            }
        }
        for r in runs {
            r.kill.cancel();
        }
        (killed, revoked)
    }
}

/// Waits until every run of `runs` has ended (its final status stored), at most `limit`.
pub async fn ended(runs: &[Arc<LiveRun>], limit: std::time::Duration) {
    let all = futures_util::future::join_all(runs.iter().map(|r| r.ended()));
    let _ = tokio::time::timeout(limit, all).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::autonomy::SubagentLimits;

    fn place(tree: &RunTree, id: &str, parent: Option<&Arc<LiveRun>>) -> Arc<LiveRun> {
        place_with(tree, id, parent, TreeProfile::plain(&Default::default()))
    }

    fn place_with(
        tree: &RunTree,
        id: &str,
        parent: Option<&Arc<LiveRun>>,
        profile: TreeProfile,
    ) -> Arc<LiveRun> {
        tree.register(Placement {
            run_id: id.to_owned(),
            parent,
            agent_id: "a",
            client_id: "c",
            scopes: Default::default(),
            tools: None,
            denial_threshold: 2,
            timeout: None,
            profile,
        })
    }

    /// Each lease has its own secret token, found by the registry while its run is live and
    /// never shown by the lease's Debug.
    #[test]
    fn a_live_run_is_found_by_its_lease_token_only() {
        let tree = RunTree::default();
        let a = place(&tree, "a", None);
        let b = place(&tree, "b", None);
        let token = a.lease.token().to_owned();
        assert!(token.starts_with("lt_") && token.len() == 67, "{token}");
        assert_ne!(token, b.lease.token());
        assert_eq!(tree.by_token(&token).unwrap().run_id, "a");
        assert!(tree.by_token("").is_none());
        assert!(tree.by_token(&token[..66]).is_none(), "a prefix");
        assert!(tree.by_token(&format!("{token}0")).is_none());
        assert!(!format!("{:?}", a.lease).contains(&token));
        tree.finish(&a, None);
        assert!(tree.by_token(&token).is_none(), "an ended run's lease");
        assert!(constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd"));
    }

    #[test]
    fn children_hang_off_their_parent_and_a_kill_reaches_the_subtree_only() {
        let tree = RunTree::default();
        let root = place(&tree, "r", None);
        let a = place(&tree, "a", Some(&root));
        let b = place(&tree, "b", Some(&a));
        let c = place(&tree, "c", Some(&root));
        assert_eq!((b.root_run_id.as_str(), b.depth), ("r", 2));
        assert_eq!(b.parent_run_id.as_deref(), Some("a"));
        let mut sub: Vec<String> = tree.subtree("a").iter().map(|r| r.run_id.clone()).collect();
        sub.sort();
        assert_eq!(sub, ["a", "b"]);
        assert_eq!(tree.tree("r").len(), 4);
        assert_eq!(tree.kill(&tree.subtree("a")), (2, 2));
        assert!(a.kill.is_cancelled() && b.kill.is_cancelled());
        assert!(!root.kill.is_cancelled() && !c.kill.is_cancelled());
        assert_eq!(b.stopped(), Some(Stop::Killed));
        // The first stop wins; a second kill kills nothing.
        assert!(!b.stop(Stop::Revoked));
        assert_eq!(tree.kill(&tree.subtree("a")), (0, 0));
        // A root's kill cancels every descendant's token, registered or not.
        tree.kill(std::slice::from_ref(&root));
        assert!(c.kill.is_cancelled());
        tree.finish(&b, None);
        assert!(tree.get("b").is_none());
        assert!(!b.lease.valid(), "an ended run's lease is revoked");
    }

    #[test]
    fn the_gate_refuses_outside_the_lease_and_trips_after_refusals_in_a_row() {
        let tree = RunTree::default();
        let root = tree.register(Placement {
            run_id: "r".into(),
            parent: None,
            agent_id: "a",
            client_id: "c",
            scopes: Default::default(),
            tools: Some(["t1".to_owned(), "t2".to_owned()].into()),
            denial_threshold: 2,
            timeout: None,
            profile: TreeProfile::plain(&Default::default()),
        });
        // A child's capabilities never exceed its parent's.
        let child = tree.register(Placement {
            run_id: "k".into(),
            parent: Some(&root),
            agent_id: "a",
            client_id: "c",
            scopes: Default::default(),
            tools: Some(["t2".to_owned(), "t3".to_owned()].into()),
            denial_threshold: 2,
            timeout: None,
            profile: TreeProfile::plain(&Default::default()),
        });
        assert_eq!(
            child
                .lease
                .tools
                .as_ref()
                .unwrap()
                .iter()
                .collect::<Vec<_>>(),
            ["t2"]
        );
        assert_eq!(root.gate("t1", None, true), Gate::Allowed);
        assert!(matches!(root.gate("t3", None, true), Gate::Refused(_)));
        assert_eq!(
            root.gate("t1", None, true),
            Gate::Allowed,
            "an allowed call resets"
        );
        assert!(matches!(root.gate("t1", None, false), Gate::Refused(_)));
        assert!(matches!(root.gate("t3", None, true), Gate::Breaker(_)));
        tree.trip_denial_breaker("r");
        assert_eq!(child.stopped(), Some(Stop::DenialBreaker));
        assert!(child.kill.is_cancelled());
        assert_eq!(tree.denial_breaker_trips(), 1);
        assert_eq!(root.gate("t1", None, true), Gate::Revoked);
    }

    /// A tree spends one budget: a child's calls count against its root's, and once a
    /// limit is reached every run of the tree is refused at its gate (at the limit, not one
    /// past it); a run of another tree is not.
    #[test]
    fn a_tree_shares_one_budget_and_its_gates_refuse_once_it_is_spent() {
        let tree = RunTree::default();
        let config = crate::config::autonomy::TreeBudgetConfig {
            max_tokens: Some(100),
            max_cost_usd: Some(1.0),
        };
        let place_in =
            |id: &str, parent| place_with(&tree, id, parent, TreeProfile::plain(&config));
        let root = place_in("r", None);
        let child = place_in("k", Some(&root));
        let other = place_in("o", None);
        child.budget.add(60, 0.25);
        root.budget.add(39, 0.25);
        assert_eq!(root.budget.remaining(), (Some(1), Some(0.5)));
        assert_eq!(child.gate("t", None, true), Gate::Allowed, "one token left");
        child.budget.add(1, 0.0);
        assert!(root.budget.spent_out());
        for run in [&root, &child] {
            match run.gate("t", None, true) {
                Gate::Refused(why) => assert!(why.contains("budget is spent"), "{why}"),
                g => panic!("{g:?}"),
            }
        }
        assert_eq!(
            other.gate("t", None, true),
            Gate::Allowed,
            "another tree's budget"
        );
        other.budget.add(0, 1.0);
        assert!(other.budget.spent_out(), "the cost limit alone");
        let unlimited = place(&tree, "u", None);
        unlimited.budget.add(u64::MAX / 2, 1e9);
        assert!(!unlimited.budget.spent_out());
        assert_eq!(unlimited.budget.remaining(), (None, None));
    }

    /// Eviction drops a whole live tree to `default` at its next gate decision without
    /// stopping it; a mark made before its root exists applies when the root registers, and
    /// the mark goes with the tree's last live run.
    #[test]
    fn an_evicted_tree_uses_default_from_its_next_gate_decision() {
        use crate::config::autonomy::{AutonomyConfig, ProfileConfig};
        let mut c = AutonomyConfig::default();
        c.profiles.insert(
            "default".into(),
            ProfileConfig {
                tools: Some(vec!["safe".into()]),
                ..ProfileConfig::default()
            },
        );
        c.profiles.insert(
            "builder".into(),
            ProfileConfig {
                agents: vec!["a".into()],
                tools: Some(vec!["group:agents".into()]),
                tree_budget: None,
            },
        );
        let profiles = crate::runtime::profiles::Profiles::new(&c);
        let tree = RunTree::default();
        let placed = |id: &str, parent: Option<&Arc<LiveRun>>| {
            place_with(&tree, id, parent, profiles.for_root("a"))
        };
        let root = placed("r", None);
        let child = placed("k", Some(&root));
        assert_eq!(
            child.gate("spawn_agent", Some("agents"), true),
            Gate::Allowed
        );
        assert!(!tree.evict("r"), "not marked before");
        assert!(tree.evict("r"), "already marked");
        for run in [&root, &child] {
            assert!(matches!(
                run.gate("spawn_agent", Some("agents"), true),
                Gate::Refused(_)
            ));
            assert_eq!(
                run.gate("safe", None, true),
                Gate::Allowed,
                "default's tool"
            );
            assert!(
                run.stopped().is_none() && !run.kill.is_cancelled(),
                "not aborted"
            );
        }
        // Marked before it exists: the root starts evicted.
        assert!(!tree.evict("later"));
        let later = placed("later", None);
        assert!(later.budget.profile.evicted());
        // The mark goes with the last live run of its tree.
        tree.finish(&root, None);
        assert_eq!(tree.evicted(), 2);
        tree.finish(&child, None);
        assert_eq!(tree.evicted(), 1);
        let again = placed("r", None);
        assert!(
            !again.budget.profile.evicted(),
            "a forgotten mark applies no more"
        );
    }

    #[test]
    fn spawns_are_refused_when_paused_and_past_each_limit() {
        let tree = RunTree::default();
        let limits = SubagentLimits {
            max_depth: 2,
            max_children_per_run: 2,
            max_concurrent: 3,
        };
        let root = place(&tree, "r", None);
        assert_eq!(tree.admit(None, &limits), Ok(()));
        let a = place(&tree, "a", Some(&root));
        assert_eq!(tree.admit(Some(&a), &limits), Ok(()));
        let b = place(&tree, "b", Some(&a));
        assert_eq!(
            tree.admit(Some(&b), &limits),
            Err(Refused::TooDeep { max: 2 })
        );
        place(&tree, "c", Some(&root));
        assert_eq!(
            tree.admit(Some(&root), &limits),
            Err(Refused::TooManyChildren { max: 2 })
        );
        place(&tree, "d", Some(&a));
        let other = place(&tree, "o", None);
        assert_eq!(
            tree.admit(Some(&other), &limits),
            Err(Refused::TooManyLive { max: 3 })
        );
        assert!(tree.set_paused(true));
        assert!(!tree.set_paused(true));
        assert_eq!(tree.admit(None, &limits), Err(Refused::Paused));
        assert!(tree.set_paused(false));
    }

    #[tokio::test]
    async fn steering_is_taken_once_and_waiters_wake_when_the_run_ends() {
        let tree = RunTree::default();
        let run = place(&tree, "r", None);
        run.steer("one".into());
        run.steer("two".into());
        assert!(run.has_steering());
        assert_eq!(run.take_steering(), ["one", "two"]);
        assert!(run.take_steering().is_empty());
        let waiter = {
            let run = run.clone();
            tokio::spawn(async move { run.ended().await })
        };
        tree.finish(&run, None);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        // A wait after the end returns at once.
        ended(&[run], std::time::Duration::from_secs(5)).await;
    }
}
