//! JSON-RPC 2.0 transports (/ws, /rpc, the local capability socket): the envelope, the HTTP and
//! WebSocket routes, the capability socket (`tool.invoke` only, `capability.rs`), and the
//! one mapping of the domain error to the wire error (`error.rs`).

pub mod capability;
pub mod envelope;
pub mod error;
pub mod http;
pub mod ws;
#[cfg(feature = "ws-echo")]
pub mod ws_echo;
