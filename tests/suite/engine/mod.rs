//! The agent engine: turns, context, scheduler, workspaces, memory, graphs, session ownership
//! and tenancy, and the in-process local model.

mod e2e_agents;
mod e2e_approvals;
mod e2e_capability;
mod e2e_context;
mod e2e_graphs;
mod e2e_local;
mod e2e_memory;
mod e2e_memory_limits;
pub(crate) mod e2e_orchestration;
mod e2e_owners;
mod e2e_scheduler;
mod e2e_tenancy;
mod e2e_workspace;
mod e2e_workspace_files;
mod local_model;
