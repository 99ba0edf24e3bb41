//! `config.*`: reading the configuration in force and its schema.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::Rpc;
use crate::config;
use crate::error::GatewayError;
use crate::rpc::generated::handlers::ConfigApi;
use crate::rpc::generated::types::{
    ConfigGetParams, ConfigGetResult, ConfigReadParams, ConfigReadResult, ConfigSchemaParams,
    ConfigSchemaResult,
};
use crate::rpc::CallContext;

fn unknown_section(name: &str) -> GatewayError {
    GatewayError::NotFound(format!(
        "Unknown configuration section '{name}' (sections: {})",
        config::sections().join(", ")
    ))
}

fn object(v: Value) -> BTreeMap<String, Value> {
    match v {
        Value::Object(m) => m.into_iter().collect(),
        other => BTreeMap::from([("value".to_owned(), other)]),
    }
}

/// `{config, sections}` or the named section of `whole`.
fn section_or_whole(
    whole: Value,
    section: Option<&str>,
) -> Result<BTreeMap<String, Value>, GatewayError> {
    match section {
        Some(name) => whole
            .get(name)
            .cloned()
            .map(object)
            .ok_or_else(|| unknown_section(name)),
        None => Ok(object(
            json!({"config": whole, "sections": config::sections()}),
        )),
    }
}

impl ConfigApi for Rpc {
    async fn read(
        &self,
        _ctx: &CallContext,
        params: ConfigReadParams,
    ) -> Result<ConfigReadResult, GatewayError> {
        section_or_whole(
            config::redacted(&self.state.config),
            params.section.as_deref(),
        )
    }

    async fn get(
        &self,
        _ctx: &CallContext,
        params: ConfigGetParams,
    ) -> Result<ConfigGetResult, GatewayError> {
        match params.section.as_deref() {
            Some(name) => section_or_whole(config::raw(&self.state.config), Some(name)),
            None => section_or_whole(config::redacted(&self.state.config), None),
        }
    }

    async fn schema(
        &self,
        _ctx: &CallContext,
        params: ConfigSchemaParams,
    ) -> Result<ConfigSchemaResult, GatewayError> {
        let root = config::schema();
        let schema = match params.section.as_deref() {
            None => root,
            Some(name) => section_schema(&root, name).ok_or_else(|| unknown_section(name))?,
        };
        let Value::Object(schema) = schema else {
            return Err(GatewayError::Internal(
                "configuration schema is not an object".into(),
            ));
        };
        Ok(ConfigSchemaResult {
            schema: schema.into_iter().collect(),
            sections: config::sections(),
            section: params.section,
        })
    }
}

/// A standalone schema for one top-level section: its definition inlined, `$defs` kept.
fn section_schema(root: &Value, name: &str) -> Option<Value> {
    let prop = root.get("properties")?.get(name)?;
    let defs = root
        .get("$defs")
        .cloned()
        .unwrap_or(Value::Object(Map::new()));
    let mut body = match prop.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let def = r.strip_prefix("#/$defs/")?;
            defs.get(def)?.clone()
        }
        None => prop.clone(),
    };
    if let Value::Object(m) = &mut body {
        if let Some(d) = root.get("$schema") {
            m.insert("$schema".into(), d.clone());
        }
        m.insert("$defs".into(), defs);
    }
    Some(body)
}
