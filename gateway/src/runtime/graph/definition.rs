//! Checking a graph definition (`graph.define`, and before `save` and `execute`): unique ids,
//! edges between existing nodes, no cycle, known agents and tools, each kind's config,
//! expressions that compile and placeholders that name upstream nodes. A valid definition is
//! compiled into a [`Def`] the executor runs.

use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::expr::{self, Expr};
use super::template::{self, Part};
use crate::api::generated::types::{
    GraphBudget, GraphEdge, GraphNode, GraphNodeKind, GraphOnFailure, GraphSettings,
    GraphValidationIssue,
};

/// A definition as a client sends or saves it.
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub label: Option<String>,
    pub agent_id: Option<String>,
    pub nodes: Vec<GraphNode>,
    pub edges: Vec<GraphEdge>,
    pub on_failure: Option<GraphOnFailure>,
    pub timeout_ms: Option<i64>,
    pub budget: Option<GraphBudget>,
    pub settings: Option<GraphSettings>,
}

/// What a definition may refer to, for the caller checking it.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// Configured agents.
    pub agents: HashSet<String>,
    /// The agent of nodes and graphs that name none.
    pub default_agent: Option<String>,
    /// The built-in tools each (referenced) agent offers the caller.
    pub offered: HashMap<String, HashSet<String>>,
    /// `graphs.nodeTimeoutMs` and `graphs.runTimeoutMs`.
    pub node_timeout_ms: u64,
    pub run_timeout_ms: u64,
}

/// What one node does.
#[derive(Debug, Clone)]
pub enum Work {
    Agent { agent_id: String, prompt: String },
    Tool { tool: String, args: Value },
    Condition { expression: Expr },
    Transform { template: String },
    Merge,
}

/// One node of a compiled definition.
#[derive(Debug, Clone)]
pub struct NodeDef {
    pub id: String,
    pub kind: GraphNodeKind,
    pub work: Work,
}

/// One edge of a compiled definition (node indexes).
#[derive(Debug, Clone)]
pub struct EdgeDef {
    pub from: usize,
    pub to: usize,
    pub condition: Option<Expr>,
}

/// A valid definition, compiled.
#[derive(Debug, Clone)]
pub struct Def {
    pub label: Option<String>,
    pub agent_id: Option<String>,
    /// In the definition's order.
    pub nodes: Vec<NodeDef>,
    pub edges: Vec<EdgeDef>,
    /// Node indexes in execution order.
    pub order: Vec<usize>,
    /// Incoming and outgoing edge indexes per node, in the edges' order.
    pub incoming: Vec<Vec<usize>>,
    pub outgoing: Vec<Vec<usize>>,
    pub on_failure: GraphOnFailure,
    pub run_timeout: Duration,
    pub node_timeout: Duration,
    pub max_retries: u32,
    pub max_concurrency: usize,
    pub budget: Option<GraphBudget>,
    /// The `{{variable}}` names, in order of first use.
    pub variables: Vec<String>,
}

/// The outcome of a check.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    pub node_count: usize,
    /// Node ids in execution order; empty when there is a cycle.
    pub order: Vec<String>,
    pub warnings: Vec<GraphValidationIssue>,
    pub errors: Vec<GraphValidationIssue>,
    pub variables: Vec<String>,
    /// Present when `errors` is empty.
    pub def: Option<Arc<Def>>,
}

fn issue(code: &str, message: String, node: Option<&str>) -> GraphValidationIssue {
    GraphValidationIssue {
        code: code.to_owned(),
        message,
        node_id: node.map(str::to_owned),
    }
}

/// The config members each kind uses.
fn members(kind: GraphNodeKind) -> &'static [&'static str] {
    match kind {
        GraphNodeKind::Agent => &["prompt"],
        GraphNodeKind::Tool => &["tool", "args"],
        GraphNodeKind::Condition => &["expression"],
        GraphNodeKind::Transform => &["template"],
        GraphNodeKind::Merge => &[],
    }
}

/// Checks `src` against `env`. Compiles expressions: call it on the compile thread
/// ([`expr::on_compile_thread`]).
pub fn check(src: &Source, env: &Env) -> Checked {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let n = src.nodes.len();
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(n);
    for (i, node) in src.nodes.iter().enumerate() {
        if index.insert(node.id.as_str(), i).is_some() {
            errors.push(issue(
                "duplicate_node_id",
                format!("node id {} is used more than once", node.id),
                Some(&node.id),
            ));
        }
    }
    // Edges between existing nodes (the first node of a duplicated id counts).
    let mut incoming: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut outgoing: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut edges: Vec<(usize, usize)> = Vec::with_capacity(src.edges.len());
    for e in &src.edges {
        let from = index.get(e.from.as_str()).copied();
        let to = index.get(e.to.as_str()).copied();
        for (end, name) in [(from, &e.from), (to, &e.to)] {
            if end.is_none() {
                errors.push(issue(
                    "unknown_node",
                    format!("an edge names node {name}, which does not exist"),
                    None,
                ));
            }
        }
        if let (Some(f), Some(t)) = (from, to) {
            outgoing[f].push(edges.len());
            incoming[t].push(edges.len());
            edges.push((f, t));
        }
    }
    // Execution order: Kahn's, the definition's order among nodes that could go either way.
    let first = |i: usize| index.get(src.nodes[i].id.as_str()) == Some(&i);
    let mut indegree: Vec<usize> = incoming.iter().map(Vec::len).collect();
    let mut ready: BinaryHeap<std::cmp::Reverse<usize>> = (0..n)
        .filter(|&i| indegree[i] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        order.push(i);
        for &e in &outgoing[i] {
            let t = edges[e].1;
            indegree[t] -= 1;
            if indegree[t] == 0 {
                ready.push(std::cmp::Reverse(t));
            }
        }
    }
    let acyclic = order.len() == n;
    if !acyclic {
        let cycle = find_cycle(n, &edges, &incoming, &indegree);
        let names: Vec<&str> = cycle.iter().map(|&i| src.nodes[i].id.as_str()).collect();
        errors.push(issue(
            "cycle",
            format!("the edges form a cycle: {}", names.join(" -> ")),
            names.first().copied(),
        ));
    }
    // Upstream sets (bit sets over node indexes), for the placeholders' references.
    let words = n.div_ceil(64);
    let mut upstream: Vec<Vec<u64>> = vec![vec![0; words]; n];
    if acyclic {
        for &i in &order {
            for &e in &incoming[i] {
                let f = edges[e].0;
                let (a, b) = if f < i {
                    let (lo, hi) = upstream.split_at_mut(i);
                    (&lo[f], &mut hi[0])
                } else {
                    let (lo, hi) = upstream.split_at_mut(f);
                    (&hi[0], &mut lo[i])
                };
                for (dst, src) in b.iter_mut().zip(a) {
                    *dst |= src;
                }
                b[f / 64] |= 1 << (f % 64);
            }
        }
    }
    let is_upstream = |of: usize, node: usize| upstream[of][node / 64] & (1 << (node % 64)) != 0;
    // The graph's own agent.
    let graph_agent = src.agent_id.clone().or_else(|| env.default_agent.clone());
    if let Some(a) = &src.agent_id {
        if !env.agents.contains(a) {
            errors.push(issue(
                "unknown_agent",
                format!("the graph's agent {a} is not configured"),
                None,
            ));
        }
    }
    let mut variables: Vec<String> = Vec::new();
    let mut seen_vars: HashSet<String> = HashSet::new();
    let mut nodes = Vec::with_capacity(n);
    for (i, node) in src.nodes.iter().enumerate() {
        let id = node.id.as_str();
        let empty = BTreeMap::new();
        let config = node.config.as_ref().unwrap_or(&empty);
        let string = |key: &str| config.get(key).and_then(Value::as_str);
        let missing = |key: &str, what: &str, errors: &mut Vec<GraphValidationIssue>| {
            errors.push(issue(
                "missing_config",
                format!(
                    "{} node {id} needs config.{key} ({what})",
                    node.type_.as_str()
                ),
                Some(id),
            ));
        };
        for key in config.keys() {
            if !members(node.type_).contains(&key.as_str()) {
                warnings.push(issue(
                    "ignored_config",
                    format!("config.{key} is not used by a {} node", node.type_.as_str()),
                    Some(id),
                ));
            }
        }
        // The strings that may hold placeholders.
        let mut texts: Vec<String> = Vec::new();
        let work = match node.type_ {
            GraphNodeKind::Agent => {
                let agent = node.agent_id.clone().or_else(|| graph_agent.clone());
                match &agent {
                    Some(a) if env.agents.contains(a) => {}
                    Some(a) => errors.push(issue(
                        "unknown_agent",
                        format!("agent {a} of node {id} is not configured"),
                        Some(id),
                    )),
                    None => errors.push(issue(
                        "unknown_agent",
                        format!("node {id} names no agent and no agent is configured"),
                        Some(id),
                    )),
                }
                match string("prompt") {
                    Some(p) if !p.trim().is_empty() => {
                        texts.push(p.to_owned());
                        Some(Work::Agent {
                            agent_id: agent.unwrap_or_default(),
                            prompt: p.to_owned(),
                        })
                    }
                    _ => {
                        missing("prompt", "a non-empty string", &mut errors);
                        None
                    }
                }
            }
            GraphNodeKind::Tool => {
                let args = config.get("args").cloned();
                let args_ok = args.as_ref().is_none_or(Value::is_object);
                if !args_ok {
                    missing("args", "an object", &mut errors);
                }
                if let Some(a) = &args {
                    template::strings(a, &mut texts);
                }
                match string("tool") {
                    Some(t) => {
                        let offered = graph_agent
                            .as_ref()
                            .and_then(|a| env.offered.get(a))
                            .is_some_and(|tools| tools.contains(t));
                        if !offered {
                            errors.push(issue(
                                "unknown_tool",
                                format!(
                                    "tool {t} of node {id} is not a built-in tool the graph's agent offers"
                                ),
                                Some(id),
                            ));
                        }
                        args_ok.then(|| Work::Tool {
                            tool: t.to_owned(),
                            args: args.unwrap_or_else(|| Value::Object(Default::default())),
                        })
                    }
                    None => {
                        missing("tool", "a tool name", &mut errors);
                        None
                    }
                }
            }
            GraphNodeKind::Condition => match string("expression") {
                Some(e) => match expr::compile(e) {
                    Ok(expression) => Some(Work::Condition { expression }),
                    Err(why) => {
                        errors.push(issue(
                            "invalid_expression",
                            format!("the expression of node {id}: {why}"),
                            Some(id),
                        ));
                        None
                    }
                },
                None => {
                    missing("expression", "a CEL expression", &mut errors);
                    None
                }
            },
            GraphNodeKind::Transform => match string("template") {
                Some(t) => {
                    texts.push(t.to_owned());
                    Some(Work::Transform {
                        template: t.to_owned(),
                    })
                }
                None => {
                    missing("template", "a string", &mut errors);
                    None
                }
            },
            GraphNodeKind::Merge => {
                if incoming[i].len() < 2 {
                    warnings.push(issue(
                        "merge_inputs",
                        format!("merge node {id} has fewer than two inputs"),
                        Some(id),
                    ));
                }
                Some(Work::Merge)
            }
        };
        for text in &texts {
            let parts = match template::parse(text) {
                Ok(p) => p,
                Err(why) => {
                    errors.push(issue(
                        "invalid_template",
                        format!("node {id}: {why}"),
                        Some(id),
                    ));
                    continue;
                }
            };
            for part in parts {
                match part {
                    Part::Output(other) => {
                        let up = index.get(other).copied();
                        if acyclic && !up.is_some_and(|u| is_upstream(i, u)) {
                            errors.push(issue(
                                "invalid_reference",
                                format!(
                                    "node {id} uses {{{{{other}.output}}}}, but {other} is not upstream of it"
                                ),
                                Some(id),
                            ));
                        }
                    }
                    Part::Var(v) => {
                        if seen_vars.insert(v.to_owned()) {
                            variables.push(v.to_owned());
                        }
                    }
                    Part::Text(_) => {}
                }
            }
        }
        if !src.edges.is_empty() && incoming[i].is_empty() && outgoing[i].is_empty() && first(i) {
            warnings.push(issue(
                "isolated_node",
                format!("node {id} has no edge in a graph whose other nodes have"),
                Some(id),
            ));
        }
        if let Some(work) = work {
            nodes.push(NodeDef {
                id: node.id.clone(),
                kind: node.type_,
                work,
            });
        }
    }
    let mut compiled_edges = Vec::with_capacity(edges.len());
    let mut ei = 0;
    for e in &src.edges {
        let (Some(_), Some(_)) = (index.get(e.from.as_str()), index.get(e.to.as_str())) else {
            continue;
        };
        let (from, to) = edges[ei];
        ei += 1;
        let condition = match &e.condition {
            None => None,
            Some(c) => match expr::compile(c) {
                Ok(x) => Some(x),
                Err(why) => {
                    errors.push(issue(
                        "invalid_expression",
                        format!("the condition of edge {} -> {}: {why}", e.from, e.to),
                        Some(&e.from),
                    ));
                    None
                }
            },
        };
        compiled_edges.push(EdgeDef {
            from,
            to,
            condition,
        });
    }
    let order_ids = if acyclic {
        order.iter().map(|&i| src.nodes[i].id.clone()).collect()
    } else {
        Vec::new()
    };
    let def = errors.is_empty().then(|| {
        let settings = src.settings.clone().unwrap_or(GraphSettings {
            max_concurrency: 4,
            node_timeout_ms: None,
            max_retries: 0,
        });
        Arc::new(Def {
            label: src.label.clone(),
            agent_id: src.agent_id.clone(),
            nodes,
            edges: compiled_edges,
            order,
            incoming,
            outgoing,
            on_failure: src.on_failure.unwrap_or(GraphOnFailure::Stop),
            run_timeout: Duration::from_millis(
                src.timeout_ms
                    .map_or(env.run_timeout_ms, |t| u64::try_from(t).unwrap_or(0)),
            ),
            node_timeout: Duration::from_millis(
                settings
                    .node_timeout_ms
                    .map_or(env.node_timeout_ms, |t| u64::try_from(t).unwrap_or(0)),
            ),
            max_retries: u32::try_from(settings.max_retries).unwrap_or(0),
            max_concurrency: usize::try_from(settings.max_concurrency)
                .unwrap_or(1)
                .max(1),
            budget: src.budget.clone(),
            variables: variables.clone(),
        })
    });
    Checked {
        node_count: n,
        order: order_ids,
        warnings,
        errors,
        variables,
        def,
    }
}

/// One cycle among the nodes Kahn's algorithm left (`indegree` > 0), as node indexes in edge
/// order with the first repeated at the end. Every node left has an incoming edge from
/// another node left, so walking backwards along such edges must come back to a node.
fn find_cycle(
    n: usize,
    edges: &[(usize, usize)],
    incoming: &[Vec<usize>],
    indegree: &[usize],
) -> Vec<usize> {
    let Some(start) = (0..n).find(|&i| indegree[i] > 0) else {
        return Vec::new();
    };
    let mut seen: HashMap<usize, usize> = HashMap::new();
    let mut path = Vec::new();
    let mut at = start;
    loop {
        if let Some(&pos) = seen.get(&at) {
            // path[pos..] walked backwards from `at` back to it: reverse it into edge order.
            let mut cycle: Vec<usize> = path[pos..].to_vec();
            cycle.reverse();
            cycle.insert(0, at);
            return cycle;
        }
        seen.insert(at, path.len());
        path.push(at);
        let Some(prev) = incoming[at]
            .iter()
            .map(|&e| edges[e].0)
            .find(|&f| indegree[f] > 0)
        else {
            return path;
        };
        at = prev;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, kind: GraphNodeKind, config: Value) -> GraphNode {
        GraphNode {
            id: id.to_owned(),
            type_: kind,
            label: None,
            agent_id: None,
            config: serde_json::from_value(config).unwrap(),
        }
    }

    fn edge(from: &str, to: &str) -> GraphEdge {
        GraphEdge {
            from: from.to_owned(),
            to: to.to_owned(),
            condition: None,
        }
    }

    fn env() -> Env {
        Env {
            agents: HashSet::from(["bot".to_owned()]),
            default_agent: Some("bot".to_owned()),
            offered: HashMap::from([(
                "bot".to_owned(),
                HashSet::from(["current_time".to_owned()]),
            )]),
            node_timeout_ms: 1000,
            run_timeout_ms: 1000,
        }
    }

    fn t(id: &str, template: &str) -> GraphNode {
        node(
            id,
            GraphNodeKind::Transform,
            serde_json::json!({"template": template}),
        )
    }

    fn codes(c: &Checked) -> Vec<&str> {
        c.errors.iter().map(|e| e.code.as_str()).collect()
    }

    #[test]
    fn a_valid_graph_has_an_order_and_its_variables() {
        let src = Source {
            nodes: vec![
                t("c", "{{a.output}} {{b.output}}"),
                t("a", "{{topic}}"),
                t("b", "{{ tone }} {{topic}}"),
            ],
            edges: vec![edge("a", "c"), edge("b", "c")],
            ..Source::default()
        };
        let c = check(&src, &env());
        assert!(c.errors.is_empty(), "{:?}", c.errors);
        assert_eq!(c.order, ["a", "b", "c"]);
        assert_eq!(c.variables, ["topic", "tone"]);
        assert!(c.def.is_some());
    }

    #[test]
    fn a_cycle_is_named() {
        let src = Source {
            nodes: vec![t("s", "x"), t("a", "x"), t("b", "x"), t("c", "x")],
            edges: vec![
                edge("s", "a"),
                edge("a", "b"),
                edge("b", "c"),
                edge("c", "a"),
            ],
            ..Source::default()
        };
        let c = check(&src, &env());
        assert_eq!(codes(&c), ["cycle"]);
        assert!(
            c.errors[0].message.ends_with("a -> b -> c -> a"),
            "{}",
            c.errors[0].message
        );
        assert!(c.order.is_empty());
        let self_loop = Source {
            nodes: vec![t("a", "x")],
            edges: vec![edge("a", "a")],
            ..Source::default()
        };
        assert!(check(&self_loop, &env()).errors[0]
            .message
            .ends_with("a -> a"));
    }

    #[test]
    fn each_problem_has_its_code() {
        let src = Source {
            nodes: vec![
                t("a", "{{b.output}}"),
                t("b", "x"),
                t("b", "dup"),
                node("ag", GraphNodeKind::Agent, serde_json::json!({})),
                node(
                    "tl",
                    GraphNodeKind::Tool,
                    serde_json::json!({"tool": "rm_rf"}),
                ),
                node(
                    "cd",
                    GraphNodeKind::Condition,
                    serde_json::json!({"expression": "1 +"}),
                ),
                t("bad", "{{ no way }}"),
            ],
            edges: vec![edge("a", "b"), edge("a", "ghost")],
            agent_id: Some("nobody".to_owned()),
            ..Source::default()
        };
        let c = check(&src, &env());
        let mut got = codes(&c);
        got.sort_unstable();
        assert_eq!(
            got,
            [
                "duplicate_node_id",
                "invalid_expression",
                "invalid_reference",
                "invalid_template",
                "missing_config",
                "unknown_agent",
                "unknown_agent",
                "unknown_node",
                "unknown_tool",
            ]
        );
        assert!(c.def.is_none());
    }
}
