//! JSON-RPC over /ws and /rpc, the connections under it, token revocation, and RFC 6455
//! conformance (Autobahn).

mod autobahn;
mod e2e_conn;
mod e2e_revocation;
mod e2e_rpc;
