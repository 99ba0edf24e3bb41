//! Built-in tools the model can call: the registry, argument validation against each tool's
//! JSON Schema, and the context a tool runs in. One module per tool.

mod agents;
mod files;
mod memory;
mod notes;
mod time;

use std::sync::{Arc, OnceLock};

use serde_json::Value;

use crate::api::generated::methods::Scope;
use crate::providers::{BoxFuture, ToolSpec};
use crate::store::Store;

/// What a tool call may touch.
pub struct ToolContext<'a> {
    pub store: &'a Store,
    /// Where files the agent saves go.
    pub media: &'a crate::media::MediaStore,
    pub agent_id: &'a str,
    /// The conversation, when the turn has a stored session.
    pub session_key: Option<&'a str>,
    /// Whose records the tools may read: the caller's tenant (admin: every tenant).
    pub tenant: &'a crate::api::tenancy::Tenant,
    /// Who owns what the tools store: the session's owner, or the caller of an ephemeral turn.
    pub owner: &'a str,
    /// Long-term memory, for the memory tools (recall and writes).
    pub memory: &'a crate::runtime::memory::Memory,
    /// The turn's trace id, for the records tools leave (memory recalls).
    pub trace_id: &'a str,
    /// The run this turn is, when it is a background run (the sub-agent tools spawn under
    /// it and wait for its children).
    pub run: Option<&'a Arc<crate::runtime::tree::LiveRun>>,
    /// The turn's agent, its caller and the scopes its tools may use (a spawn passes them on,
    /// never wider).
    pub agent: &'a Arc<crate::runtime::agents::Agent>,
    pub caller: &'a crate::api::principal::Principal,
    pub scopes: crate::api::scopes::Scopes,
    /// Background runs (the sub-agent tools), reached only when a tool needs them.
    pub runs: &'a OnceLock<std::sync::Weak<crate::runtime::runs::Runs>>,
    /// The tools this turn offers (what `my_capabilities` reports, narrowed by the run's
    /// lease and profile).
    pub offered: &'a [ToolSpec],
    /// Every registered tool (their opt-in groups).
    pub tools: &'a Tools,
    /// What the turn has spent so far.
    pub spent: &'a Spent,
}

/// Tokens and cost a turn has spent so far (updated after each model call).
#[derive(Default)]
pub struct Spent {
    tokens: std::sync::atomic::AtomicU64,
    usd_bits: std::sync::atomic::AtomicU64,
}

impl Spent {
    /// Records the turn's totals so far.
    pub fn set(&self, tokens: u64, usd: f64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.tokens.store(tokens, Relaxed);
        self.usd_bits.store(usd.to_bits(), Relaxed);
    }

    /// (tokens, USD) spent so far.
    pub fn get(&self) -> (u64, f64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.tokens.load(Relaxed),
            f64::from_bits(self.usd_bits.load(Relaxed)),
        )
    }
}

impl ToolContext<'_> {
    /// The runs service, while the engine lives.
    pub fn runs(&self) -> Option<Arc<crate::runtime::runs::Runs>> {
        self.runs.get().and_then(std::sync::Weak::upgrade)
    }
}

/// A tool's outcome: text for the model, or an error text (counted by the circuit breaker).
pub type ToolResult = Result<String, String>;

/// One built-in tool.
pub trait Tool: Send + Sync {
    fn name(&self) -> &'static str;
    fn description(&self) -> &'static str;
    /// JSON Schema of the arguments.
    fn parameters(&self) -> Value;
    /// The scope a caller must hold for a turn to offer this tool.
    fn scope(&self) -> Scope {
        Scope::Rpc
    }
    /// The tool group that must be named in an agent's `tools` (`group:<name>`, or the tool
    /// itself) for the agent to get this tool; `*` does not include it. None: `*` does.
    fn opt_in_group(&self) -> Option<&'static str> {
        None
    }
    fn call<'a>(&'a self, ctx: &'a ToolContext<'a>, args: &'a Value) -> BoxFuture<'a, ToolResult>;
}

struct Registered {
    tool: Arc<dyn Tool>,
    /// Compiled on the tool's first call: compiling costs megabytes of transient memory
    /// (jsonschema checks the schema against its meta-schema), which the process would
    /// otherwise carry from startup even when no tool is ever called.
    validator: OnceLock<Option<jsonschema::Validator>>,
}

impl Registered {
    fn validator(&self) -> Option<&jsonschema::Validator> {
        self.validator
            .get_or_init(|| {
                jsonschema::validator_for(&self.tool.parameters())
                    .map_err(|e| tracing::error!(tool = self.tool.name(), error = %e, "tool schema does not compile"))
                    .ok()
            })
            .as_ref()
    }
}

/// Every registered tool.
pub struct Tools {
    list: Vec<Registered>,
}

impl Tools {
    /// The built-in set.
    pub fn builtin() -> Self {
        let tools: Vec<Arc<dyn Tool>> = vec![
            Arc::new(time::CurrentTime),
            Arc::new(memory::MemoryStore),
            Arc::new(memory::MemorySearch),
            Arc::new(notes::NoteAdd),
            Arc::new(notes::NotesList),
            Arc::new(files::SaveFile),
            Arc::new(agents::SpawnAgent),
            Arc::new(agents::WaitAgents),
            Arc::new(agents::MyCapabilities),
        ];
        let list = tools
            .into_iter()
            .map(|tool| Registered {
                tool,
                validator: OnceLock::new(),
            })
            .collect();
        Self { list }
    }

    /// Names of every tool.
    pub fn names(&self) -> Vec<&'static str> {
        self.list.iter().map(|r| r.tool.name()).collect()
    }

    /// The opt-in group of a tool (see [`Tool::opt_in_group`]); None for unknown tools too.
    pub fn opt_in_group(&self, name: &str) -> Option<&'static str> {
        self.list
            .iter()
            .find(|r| r.tool.name() == name)
            .and_then(|r| r.tool.opt_in_group())
    }

    /// Specs of the tools `allowed` accepts (name, scope, opt-in group).
    pub fn specs(
        &self,
        allowed: impl Fn(&str, Scope, Option<&'static str>) -> bool,
    ) -> Vec<ToolSpec> {
        self.list
            .iter()
            .filter(|r| allowed(r.tool.name(), r.tool.scope(), r.tool.opt_in_group()))
            .map(|r| ToolSpec {
                name: r.tool.name().to_owned(),
                description: r.tool.description().to_owned(),
                parameters: r.tool.parameters(),
            })
            .collect()
    }

    /// The scope a tool requires; None for an unknown tool.
    pub fn scope_of(&self, name: &str) -> Option<Scope> {
        self.list
            .iter()
            .find(|r| r.tool.name() == name)
            .map(|r| r.tool.scope())
    }

    /// Checks a tool's arguments against its parameters' schema (as [`Tools::call`] does
    /// first), so a caller may refuse bad arguments before anything else happens.
    pub fn check_args(&self, name: &str, args: &Value) -> Result<(), String> {
        let Some(r) = self.list.iter().find(|r| r.tool.name() == name) else {
            return Err(format!("unknown tool: {name}"));
        };
        if let Some(v) = r.validator() {
            let problems: Vec<String> = v
                .iter_errors(args)
                .take(3)
                .map(|e| format!("{}: {e}", e.instance_path()))
                .collect();
            if !problems.is_empty() {
                return Err(problems.join("; "));
            }
        }
        Ok(())
    }

    /// Runs a tool by name after validating its arguments. Unknown tools and invalid
    /// arguments are errors the model sees (and the breaker counts).
    pub async fn call(&self, ctx: &ToolContext<'_>, name: &str, args: &Value) -> ToolResult {
        let Some(r) = self.list.iter().find(|r| r.tool.name() == name) else {
            return Err(format!("unknown tool: {name}"));
        };
        self.check_args(name, args)
            .map_err(|problems| format!("invalid arguments: {problems}"))?;
        r.tool.call(ctx, args).await
    }
}
