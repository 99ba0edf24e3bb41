//! The agent engine: providers, the model catalogue, agents, tools and the agent turn.

pub mod providers;
