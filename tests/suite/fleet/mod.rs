//! Several nodes as one gateway, restarts, and the control plane.

mod e2e_control;
mod e2e_multinode;
mod e2e_orchestration_fleet;
mod e2e_restart;
