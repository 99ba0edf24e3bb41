//! JSON-RPC 2.0 transports (/ws, /rpc): the envelope, the HTTP and WebSocket routes, and the
//! one mapping of the domain error to the wire error (`error.rs`).

pub mod envelope;
pub mod error;
pub mod http;
pub mod ws;
#[cfg(feature = "ws-echo")]
pub mod ws_echo;
