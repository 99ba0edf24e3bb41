//! `config.*`: reading the configuration in force and its schema.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::Rpc;
use crate::config;
use crate::error::GatewayError;
use crate::rpc::generated::handlers::ConfigApi;
use crate::rpc::generated::methods::METHODS;
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
        let root = constrained_schema()?;
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

/// The sections whose entries are catalogue types: the section, the method whose params
/// check every entry at load (so its schema is what the file must satisfy), and the type.
const CATALOGUE_SECTIONS: &[(&str, &str, &str)] = &[
    ("providers", "providers.create", "ProvidersConfig"),
    ("agents", "agents.create", "AgentsConfig"),
];

/// The configuration schema with the catalogue's definitions for `providers` and `agents`:
/// schemars derives their schema from the generated structs, which carry the members and
/// types but not the catalogue's constraints (lengths, patterns, ranges, enums). The file's
/// entries are checked against the catalogue's schema when the gateway starts, so that is
/// the schema a reader must see.
pub fn constrained_schema() -> Result<Value, GatewayError> {
    let mut root = config::schema();
    for (section, method, def) in CATALOGUE_SECTIONS {
        overlay_catalogue_def(&mut root, section, method, def).ok_or_else(|| {
            GatewayError::Internal(format!(
                "configuration schema: cannot take `{def}` from {method} for `{section}`"
            ))
        })?;
    }
    Ok(root)
}

/// Puts the catalogue's `def` (and every definition it uses) into `root`'s `$defs` and points
/// the section's entries at it, whatever the Rust type of the section is called.
fn overlay_catalogue_def(root: &mut Value, section: &str, method: &str, def: &str) -> Option<()> {
    let info = METHODS.iter().find(|m| m.name == method)?;
    let params: Value = serde_json::from_str(info.params_schema).ok()?;
    let catalogue_defs = params.get("$defs")?.as_object()?;
    catalogue_defs.get(def)?;
    let defs = root.get_mut("$defs")?.as_object_mut()?;
    for (name, schema) in catalogue_defs {
        defs.insert(name.clone(), schema.clone());
    }
    let entries = root.pointer_mut(&format!("/properties/{section}/additionalProperties"))?;
    *entries = json!({"$ref": format!("#/$defs/{def}")});
    Some(())
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    /// The constraints the catalogue declares for a few members (catalogue/types/).
    fn catalogue_member(def: &str, member: &str) -> Value {
        let info = METHODS
            .iter()
            .find(|m| {
                m.name
                    == if def == "ProvidersConfig" {
                        "providers.create"
                    } else {
                        "agents.create"
                    }
            })
            .unwrap();
        let params: Value = serde_json::from_str(info.params_schema).unwrap();
        params["$defs"][def]["properties"][member].clone()
    }

    #[test]
    fn config_schema_carries_the_catalogue_constraints() {
        let root = constrained_schema().unwrap();
        for (section, def, member, keyword) in [
            ("providers", "ProvidersConfig", "apiKeyEnv", "pattern"),
            ("providers", "ProvidersConfig", "timeoutMs", "minimum"),
            ("providers", "ProvidersConfig", "maxRetries", "maximum"),
            ("agents", "AgentsConfig", "maxSteps", "minimum"),
            ("agents", "AgentsConfig", "model", "pattern"),
        ] {
            let want = catalogue_member(def, member);
            assert!(
                want.get(keyword).is_some(),
                "the catalogue declares {keyword} on {def}.{member}: {want}"
            );
            // The whole document and the section alone both show it.
            assert_eq!(
                root["$defs"][def]["properties"][member], want,
                "{def}.{member}"
            );
            assert_eq!(
                root["properties"][section]["additionalProperties"]["$ref"],
                format!("#/$defs/{def}")
            );
            let alone = section_schema(&root, section).unwrap();
            let target = alone["additionalProperties"]["$ref"]
                .as_str()
                .unwrap()
                .trim_start_matches("#/$defs/")
                .to_owned();
            assert_eq!(
                alone["$defs"][&target]["properties"][member][keyword],
                want[keyword]
            );
        }
    }

    #[test]
    fn the_constrained_schema_compiles_and_applies_the_constraints() {
        let root = constrained_schema().unwrap();
        let v = jsonschema::validator_for(&root).unwrap();
        let ok = json!({"providers": {"o": {"type": "openai", "apiKeyEnv": "OPENAI_API_KEY"}}});
        assert!(v.is_valid(&ok));
        // A raw key where the variable's name belongs, and a negative timeout: refused.
        let key = json!({"providers": {"o": {"type": "openai", "apiKeyEnv": "sk-abc def"}}});
        assert!(!v.is_valid(&key));
        let timeout = json!({"providers": {"o": {"type": "openai", "timeoutMs": -1}}});
        assert!(!v.is_valid(&timeout));
        let steps = json!({"agents": {"a": {"maxSteps": 0}}});
        assert!(!v.is_valid(&steps));
    }
}
