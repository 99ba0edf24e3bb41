//! `generated/openrpc.json`: the OpenRPC 1.x document of every dispatchable method.

use serde_json::{json, Map, Value};

use crate::emit::{pretty, schema::SchemaBuilder};
use crate::ir::{Catalogue, TypeBody};

pub const OPENRPC_VERSION: &str = "1.3.2";

pub fn emit(cat: &Catalogue, version: &str) -> Result<String, String> {
    let mut b = SchemaBuilder::new(cat, "#/components/schemas/");
    let mut methods = Vec::new();
    for m in cat.methods.iter().filter(|m| !m.internal) {
        let params: Vec<Value> = match cat.type_def(&m.params_type).map(|d| &d.body) {
            Some(TypeBody::Object(o)) => o
                .fields
                .iter()
                .map(|f| {
                    json!({
                        "name": f.wire,
                        "description": f.description,
                        "required": f.required,
                        "schema": b.field(f),
                    })
                })
                .collect(),
            _ => Vec::new(),
        };
        let mut description = m.description.clone().unwrap_or_default();
        if m.stub {
            description.push_str(if description.is_empty() { "" } else { "\n\n" });
            description.push_str("Not implemented yet: answers -32004.");
        }
        let mut entry = Map::new();
        entry.insert("name".into(), m.name.clone().into());
        entry.insert("summary".into(), m.summary.clone().into());
        if !description.is_empty() {
            entry.insert("description".into(), description.into());
        }
        entry.insert("tags".into(), json!([{"name": m.namespace}]));
        entry.insert("paramStructure".into(), "by-name".into());
        entry.insert("params".into(), Value::Array(params));
        entry.insert(
            "result".into(),
            json!({"name": m.result_type, "schema": b.result(m)}),
        );
        entry.insert("x-scope".into(), m.scope.clone().into());
        if let Some(o) = &m.owner {
            let missing = match o.missing {
                crate::raw::Missing::NotFound => "not_found",
                crate::raw::Missing::Claim => "claim",
            };
            entry.insert(
                "x-owner".into(),
                json!({"param": o.param, "kind": o.kind, "missing": missing}),
            );
        }
        entry.insert("x-source".into(), m.source.as_str().into());
        methods.push(Value::Object(entry));
    }
    // Every shared type is a component, used or not, so SDK authors can find them all.
    let mut schemas = Map::new();
    for def in cat.types.iter().filter(|d| d.shared) {
        schemas.insert(def.name.clone(), b.type_body(def));
    }
    let errors: Vec<Value> = cat
        .errors
        .iter()
        .map(|e| json!({"code": e.code, "message": e.message, "data": e.description}))
        .collect();
    let doc = json!({
        "openrpc": OPENRPC_VERSION,
        "info": {
            "title": "agent-gateway JSON-RPC API",
            "version": version,
            "description": "Methods served over GET /ws (WebSocket) and POST /rpc. Every method needs a bearer token holding its scope (x-scope).",
        },
        "servers": [{"name": "local", "url": "ws://127.0.0.1:4766/ws"}],
        "methods": methods,
        "components": {"schemas": schemas, "x-errors": errors},
    });
    pretty(&doc)
}
