//! What handlers and routes share above the engine: the application state of a server
//! generation, the configuration-write pipeline and the "would this configuration build"
//! check, and the node follower of the fleet.

pub mod check;
pub mod config_writes;
pub mod fleet;
pub mod state;
