//! `spawn_agent` and `wait_agents` (tool group `agents`, opt-in): a run's turn starts
//! sub-agent runs below it and waits for them (`docs/orchestration.md`).

use serde_json::{json, Value};

use super::{Tool, ToolContext, ToolResult};
use crate::api::generated::types::{
    CapabilitiesIntrospectResult, CapabilitiesIntrospectResultBudget,
    CapabilitiesIntrospectResultKind,
};
use crate::providers::BoxFuture;
use crate::runtime::runs::{SpawnFrom, Waited};

pub struct SpawnAgent;
pub struct WaitAgents;

/// The opt-in group of both tools.
const GROUP: &str = "agents";
/// Longest wait a tool call may ask for.
const MAX_WAIT_MS: u64 = 600_000;

impl Tool for SpawnAgent {
    fn name(&self) -> &'static str {
        "spawn_agent"
    }

    fn description(&self) -> &'static str {
        "Starts a sub-agent on a task in its own conversation and answers its run id at once; \
         wait_agents returns its answer."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "task": {"type": "string", "minLength": 1, "maxLength": 100_000, "description": "What the sub-agent should do."},
                "agent": {"type": "string", "minLength": 1, "maxLength": 128, "description": "The agent to run it; this agent when absent."}
            },
            "required": ["task"],
            "additionalProperties": false
        })
    }

    fn opt_in_group(&self) -> Option<&'static str> {
        Some(GROUP)
    }

    fn call<'a>(&'a self, ctx: &'a ToolContext<'a>, args: &'a Value) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let runs = ctx
                .runs()
                .ok_or_else(|| "the gateway is stopping".to_owned())?;
            let task = args.get("task").and_then(Value::as_str).unwrap_or_default();
            let agent = args.get("agent").and_then(Value::as_str);
            let row = runs
                .spawn_child(
                    SpawnFrom {
                        run: ctx.run,
                        agent: ctx.agent,
                        caller: ctx.caller,
                        scopes: ctx.scopes,
                    },
                    agent,
                    task.to_owned(),
                )
                .await
                .map_err(|e| e.to_string())?;
            Ok(json!({
                "runId": row.run_id,
                "rootRunId": row.root_run_id,
                "depth": row.depth,
                "agentId": row.agent_id,
                "status": row.status,
            })
            .to_string())
        })
    }
}

impl Tool for WaitAgents {
    fn name(&self) -> &'static str {
        "wait_agents"
    }

    fn description(&self) -> &'static str {
        "Waits until the given sub-agent runs end (every running child of this run when \
         runIds is absent), or until timeoutMs; answers each run's status and answer."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "runIds": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 128}, "minItems": 1, "maxItems": 100},
                "timeoutMs": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_MS, "description": "Longest wait (default 30000)."}
            },
            "additionalProperties": false
        })
    }

    fn opt_in_group(&self) -> Option<&'static str> {
        Some(GROUP)
    }

    fn call<'a>(&'a self, ctx: &'a ToolContext<'a>, args: &'a Value) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let runs = ctx
                .runs()
                .ok_or_else(|| "the gateway is stopping".to_owned())?;
            let ids: Option<Vec<String>> = args.get("runIds").and_then(Value::as_array).map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            });
            let ids = match ids {
                Some(ids) => ids,
                None => match ctx.run {
                    Some(run) => runs.live_children(&run.run_id),
                    None => return Err("runIds is required outside a background run".to_owned()),
                },
            };
            let timeout = args
                .get("timeoutMs")
                .and_then(Value::as_u64)
                .unwrap_or(30_000)
                .min(MAX_WAIT_MS);
            let waited = runs
                .wait(
                    ctx.caller.tenant(),
                    &ids,
                    std::time::Duration::from_millis(timeout),
                )
                .await
                .map_err(|e| e.to_string())?;
            let results: Vec<Value> = waited.iter().map(Waited::to_json).collect();
            Ok(json!({"results": results}).to_string())
        })
    }
}

/// `my_capabilities`: the turn's own capabilities and what it may still spend - the agent's
/// view of `capabilities.introspect`.
pub struct MyCapabilities;

/// The introspection answer of a turn (`capabilities.introspect` for an agent).
pub fn introspect(ctx: &ToolContext<'_>) -> CapabilitiesIntrospectResult {
    // What the gate would let through now: offered, within the lease, and allowed by the
    // tree's profile in effect.
    let within = |name: &str| {
        ctx.run.is_none_or(|r| {
            r.lease.tools.as_ref().is_none_or(|t| t.contains(name))
                && r.budget.profile.allows(name, ctx.tools.opt_in_group(name))
        })
    };
    let mut caps: Vec<String> = ctx
        .offered
        .iter()
        .filter(|t| within(&t.name))
        .map(|t| t.name.clone())
        .collect();
    caps.sort();
    let limits = ctx.agent.budget();
    let (tokens, usd) = ctx.spent.get();
    let wall = ctx.run.and_then(|r| r.deadline).map(|d| {
        d.saturating_duration_since(std::time::Instant::now())
            .as_millis() as i64
    });
    // The smaller of the turn's own budget (its agent's) and its tree's.
    let (tree_tokens, tree_usd) = ctx.run.map_or((None, None), |r| r.budget.remaining());
    let smaller_u = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let tokens_remaining = smaller_u(
        limits
            .tokens
            .map(|t| (t.max(0) as u64).saturating_sub(tokens)),
        tree_tokens,
    );
    let usd_remaining = match (limits.cost_usd.map(|c| (c - usd).max(0.0)), tree_usd) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let budget =
        (tokens_remaining.is_some() || usd_remaining.is_some() || wall.is_some()).then(|| {
            CapabilitiesIntrospectResultBudget {
                tokens_remaining: tokens_remaining.map(|t| t.min(i64::MAX as u64) as i64),
                wall_clock_ms_remaining: wall,
                usd_remaining,
            }
        });
    CapabilitiesIntrospectResult {
        kind: if ctx.run.is_some() {
            CapabilitiesIntrospectResultKind::Run
        } else {
            CapabilitiesIntrospectResultKind::Turn
        },
        agent_id: Some(ctx.agent_id.to_owned()),
        scopes: ctx.scopes.iter().map(|s| s.as_str().to_owned()).collect(),
        enabled: ctx.run.is_some(),
        caps,
        budget,
        outward_quota: None,
    }
}

impl Tool for MyCapabilities {
    fn name(&self) -> &'static str {
        "my_capabilities"
    }

    fn description(&self) -> &'static str {
        "Answers this turn's own capabilities: its tools, its scopes, and the tokens, time and \
         cost it may still spend."
    }

    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    }

    fn opt_in_group(&self) -> Option<&'static str> {
        Some(GROUP)
    }

    fn call<'a>(&'a self, ctx: &'a ToolContext<'a>, _args: &'a Value) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move { serde_json::to_string(&introspect(ctx)).map_err(|e| e.to_string()) })
    }
}
