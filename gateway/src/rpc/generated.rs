//! The code generated from catalogue/ by build.rs (mirrored in generated/rust/).
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// Params, result and shared types of every method.
pub mod types {
    include!(concat!(env!("OUT_DIR"), "/types.rs"));
}
/// `MethodId`, `METHODS`, scopes and error codes.
pub mod methods {
    include!(concat!(env!("OUT_DIR"), "/methods.rs"));
}
/// One trait per namespace; `Handlers` bundles them.
pub mod handlers {
    include!(concat!(env!("OUT_DIR"), "/handlers.rs"));
}
/// lookup -> scope -> typed params -> handler.
pub mod dispatch {
    include!(concat!(env!("OUT_DIR"), "/dispatch.rs"));
}
