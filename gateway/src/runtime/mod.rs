//! The agent engine: providers, the model catalogue, agents, tools and the agent turn.

pub mod admission;
pub mod agents;
pub mod approvals;
pub mod calls;
pub mod capability;
pub mod compact;
pub mod context_tree;
pub mod control;
pub mod engine;
pub mod graph;
pub mod memory;
pub mod method_limits;
pub mod profiles;
pub mod queue;
pub mod runs;
pub mod scheduler;
pub mod sessions;
pub mod tools;
pub mod tree;
pub mod turn;
pub mod untrusted;
pub mod workspace;
