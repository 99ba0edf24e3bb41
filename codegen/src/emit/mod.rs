//! Emitters: one module per output, each reading only the IR.

pub mod html;
pub mod jsonschema;
pub mod methods_md;
pub mod openrpc;
pub mod python;
pub mod rust;
pub mod schema;
pub mod typescript;

/// Pretty JSON with a trailing newline (the form of every checked-in JSON file).
pub fn pretty(v: &serde_json::Value) -> Result<String, String> {
    serde_json::to_string_pretty(v)
        .map(|s| format!("{s}\n"))
        .map_err(|e| e.to_string())
}
