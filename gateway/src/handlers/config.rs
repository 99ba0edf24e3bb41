//! `config.*`: reading the configuration in force and its schema (file-only keys marked
//! `x-fileOnly`); changing the fleet's document (set, patch, apply, rollback:
//! `runtime::config_writes`), its history, diffs and audit log.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::Rpc;
use crate::api::error::GatewayError;
use crate::api::generated::handlers::ConfigApi;
use crate::api::generated::methods::METHODS;
use crate::api::generated::types::{
    ConfigApplyParams, ConfigApplyResult, ConfigAuditListParams, ConfigAuditListResult,
    ConfigAuditRecord, ConfigAuditRecordOrigin, ConfigAuditScrubParams, ConfigAuditScrubResult,
    ConfigDiffParams, ConfigDiffResult, ConfigGcParams, ConfigGcResult, ConfigGetParams,
    ConfigGetResult, ConfigHistoryParams, ConfigHistoryResult, ConfigHistoryResultEntriesItem,
    ConfigPatchParams, ConfigPatchResult, ConfigReadParams, ConfigReadResult, ConfigRollbackParams,
    ConfigRollbackResult, ConfigSchemaParams, ConfigSchemaResult, ConfigSetParams, ConfigSetResult,
};
use crate::api::CallContext;
use crate::app::config_writes::{self as writes, Change};
use crate::config;
use crate::config::agents;
use crate::store::control_plane::AuditFilter;

/// RFC 3339 (UTC, milliseconds) of epoch ms.
fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn epoch_ms(field: &str, text: &str) -> Result<i64, GatewayError> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|_| {
            GatewayError::InvalidParams(format!("'{field}' must be an RFC 3339 date-time"))
        })
}

fn params_object(extra: BTreeMap<String, Value>) -> Value {
    Value::Object(extra.into_iter().collect())
}

/// A stored document rendered for diffs (YAML, as the file reads).
fn render(document: &str) -> String {
    let v: Value = serde_json::from_str(document).unwrap_or(Value::Null);
    config::document::to_yaml(&v)
        .unwrap_or_else(|_| serde_json::to_string_pretty(&v).unwrap_or_default())
}

fn unified(old: &str, new: &str, from: &str, to: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(from, to)
        .to_string()
}

fn unknown_section(name: &str) -> GatewayError {
    GatewayError::not_found(
        "Configuration section",
        format_args!("{name} (sections: {})", config::sections().join(", ")),
    )
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
            config::redacted(&self.state.live_config()),
            params.section.as_deref(),
        )
    }

    async fn get(
        &self,
        _ctx: &CallContext,
        params: ConfigGetParams,
    ) -> Result<ConfigGetResult, GatewayError> {
        let live = self.state.live_config();
        match params.section.as_deref() {
            Some(name) => section_or_whole(config::raw(&live), Some(name)),
            None => section_or_whole(config::redacted(&live), None),
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

    async fn set(
        &self,
        ctx: &CallContext,
        params: ConfigSetParams,
    ) -> Result<ConfigSetResult, GatewayError> {
        let change = Change::Set {
            section: params.section,
            key: params.key,
            value: params.value,
        };
        let out = writes::write(&self.state, ctx, "config.set", change).await?;
        Ok(ConfigSetResult {
            ok: true,
            previous: out.previous,
            restarting: out.restarting,
            commit_sha: out.commit,
        })
    }

    async fn patch(
        &self,
        ctx: &CallContext,
        params: ConfigPatchParams,
    ) -> Result<ConfigPatchResult, GatewayError> {
        let change = Change::Patch(params_object(params.extra));
        let out = writes::write(&self.state, ctx, "config.patch", change).await?;
        Ok(ConfigPatchResult {
            patched: true,
            sections: out.sections,
            restarting: out.restarting,
            commit_sha: out.commit,
        })
    }

    async fn apply(
        &self,
        ctx: &CallContext,
        params: ConfigApplyParams,
    ) -> Result<ConfigApplyResult, GatewayError> {
        let change = Change::Apply(params_object(params.extra));
        let out = writes::write(&self.state, ctx, "config.apply", change).await?;
        Ok(ConfigApplyResult {
            applied: true,
            sections: out.sections,
            restarting: out.restarting,
            commit_sha: out.commit,
        })
    }

    async fn rollback(
        &self,
        ctx: &CallContext,
        params: ConfigRollbackParams,
    ) -> Result<ConfigRollbackResult, GatewayError> {
        let out = writes::write(
            &self.state,
            ctx,
            "config.rollback",
            Change::Rollback(params.sha.clone()),
        )
        .await?;
        let restored = out.restored.clone().unwrap_or(params.sha);
        // Nothing differed: the restored commit is what is in force; no new commit.
        let new_commit_sha = match out.commit {
            Some(c) => c,
            None => self
                .engine()
                .store
                .config_head()
                .await?
                .map(|h| h.sha)
                .unwrap_or_else(|| restored.clone()),
        };
        Ok(ConfigRollbackResult {
            rolled_back: true,
            sha: restored,
            new_commit_sha,
            restarting: out.restarting,
        })
    }

    async fn history(
        &self,
        _ctx: &CallContext,
        params: ConfigHistoryParams,
    ) -> Result<ConfigHistoryResult, GatewayError> {
        let rows = self
            .engine()
            .store
            .config_versions(params.limit, params.section.as_deref())
            .await?;
        Ok(ConfigHistoryResult {
            entries: rows
                .into_iter()
                .map(|v| ConfigHistoryResultEntriesItem {
                    sha: v.sha,
                    date: rfc3339(v.created_at),
                    message: v.message,
                    section: v.section,
                    key: v.key,
                    agent: None,
                    user: v.author,
                    trace_id: None,
                })
                .collect(),
        })
    }

    async fn diff(
        &self,
        _ctx: &CallContext,
        params: ConfigDiffParams,
    ) -> Result<ConfigDiffResult, GatewayError> {
        let store = &self.engine().store;
        let diff = match params.sha.as_deref() {
            // What the last change did: its parent against it.
            None => match store.config_head().await? {
                None => String::new(),
                Some(head) => {
                    let before = match head.parent.as_deref() {
                        Some(p) => render(&writes::version(store, p).await?.document),
                        None => String::new(),
                    };
                    let from = head.parent.as_deref().unwrap_or("/dev/null");
                    unified(&before, &render(&head.document), from, &head.sha)
                }
            },
            // That commit against the fleet's document in force (redacted).
            Some(sha) => {
                let v = writes::version(store, sha).await?;
                let (current, _) = writes::fleet_document(&self.state).await?;
                let now = config::document::redacted(&current);
                unified(
                    &render(&v.document),
                    &render(&now.to_string()),
                    &v.sha,
                    "current",
                )
            }
        };
        Ok(ConfigDiffResult { diff })
    }

    async fn gc(
        &self,
        _ctx: &CallContext,
        _params: ConfigGcParams,
    ) -> Result<ConfigGcResult, GatewayError> {
        let keep = i64::from(self.state.live_config().config_history.keep);
        let (squashed, root) = self.engine().store.config_gc(keep).await?;
        Ok(ConfigGcResult {
            gc: true,
            squashed: squashed as i64,
            new_root_sha: root,
        })
    }

    async fn audit_list(
        &self,
        _ctx: &CallContext,
        params: ConfigAuditListParams,
    ) -> Result<ConfigAuditListResult, GatewayError> {
        let filter = AuditFilter {
            since: params
                .since
                .as_deref()
                .map(|t| epoch_ms("since", t))
                .transpose()?,
            until: params
                .until
                .as_deref()
                .map(|t| epoch_ms("until", t))
                .transpose()?,
            suspicious_only: params.suspicious_only,
            pid: params.pid,
            tail: params.tail,
        };
        let rows = self.engine().store.audit_list(&filter).await?;
        let records = rows
            .into_iter()
            .map(|r| ConfigAuditRecord {
                ts: rfc3339(r.ts),
                pid: r.pid,
                origin: match r.origin.as_str() {
                    "cli" => ConfigAuditRecordOrigin::Cli,
                    "startup" => ConfigAuditRecordOrigin::Startup,
                    "external" => ConfigAuditRecordOrigin::External,
                    _ => ConfigAuditRecordOrigin::Rpc,
                },
                method: r.method,
                client_id: r.client_id,
                // A record whose paths do not parse is shown with none (audit.scrub counts it).
                paths: serde_json::from_str(&r.paths).unwrap_or_default(),
                commit_sha: r.commit_sha,
                suspicious: r.suspicious,
                reasons: serde_json::from_str(&r.reasons).unwrap_or_default(),
            })
            .collect();
        Ok(ConfigAuditListResult { records })
    }

    async fn audit_scrub(
        &self,
        _ctx: &CallContext,
        params: ConfigAuditScrubParams,
    ) -> Result<ConfigAuditScrubResult, GatewayError> {
        let store = &self.engine().store;
        let secrets = writes::known_secrets(&self.state);
        let records = store.audit_paths().await?;
        let newest = records.last().map(|r| r.0).unwrap_or(0);
        let mut malformed = 0;
        let mut rewrites = Vec::new();
        for (id, text) in &records {
            let Ok(paths) = serde_json::from_str::<Vec<String>>(text) else {
                malformed += 1;
                continue;
            };
            let scrubbed: Vec<String> = paths
                .iter()
                .map(|p| {
                    secrets.iter().fold(p.clone(), |acc, s| {
                        acc.replace(s.as_str(), config::REDACTED)
                    })
                })
                .collect();
            if scrubbed != paths {
                rewrites.push((*id, serde_json::to_string(&scrubbed).unwrap_or_default()));
            }
        }
        let aborted = if params.dry_run || rewrites.is_empty() {
            false
        } else {
            !store.audit_rewrite(newest, &rewrites).await?
        };
        Ok(ConfigAuditScrubResult {
            dry_run: params.dry_run,
            rewritten_records: if aborted { 0 } else { rewrites.len() as i64 },
            skipped_malformed: malformed,
            aborted,
        })
    }
}

/// The methods whose params schemas hold the catalogue's definitions of the types the
/// file's `providers` and `agents` entries convert to (each entry is checked against them
/// when the gateway starts).
const CATALOGUE_METHODS: &[&str] = &["providers.create", "agents.create"];

/// The configuration schema, with the catalogue's constraints on the `providers` and
/// `agents` entries. schemars derives the entries' schema from the domain types
/// (`runtime::domain`), which own the member names but carry none of the catalogue's
/// lengths, patterns, ranges and enums; since the file's entries are checked against the
/// catalogue at load, each member takes the schema of the catalogue member of the same name
/// (or the one `agents::CATALOGUE_MEMBER_RENAMES` names). A member the catalogue renamed
/// without a mapping keeps its own (unconstrained) schema, and
/// `every_domain_member_has_a_catalogue_member` fails until the mapping is added.
pub fn constrained_schema() -> Result<Value, GatewayError> {
    let mut root = config::schema();
    config::trust::mark_schema(&mut root);
    let catalogue = catalogue_defs().ok_or_else(|| {
        GatewayError::Internal("configuration schema: catalogue definitions unreadable".into())
    })?;
    for (ours, theirs) in agents::CATALOGUE_TYPES {
        overlay_catalogue_def(&mut root, ours, theirs, &catalogue).ok_or_else(|| {
            GatewayError::Internal(format!(
                "configuration schema: cannot take the constraints of `{theirs}` for `{ours}`"
            ))
        })?;
    }
    Ok(root)
}

/// The `$defs` of the catalogue methods' params schemas, merged.
fn catalogue_defs() -> Option<Map<String, Value>> {
    let mut defs = Map::new();
    for method in CATALOGUE_METHODS {
        let info = METHODS.iter().find(|m| m.name == *method)?;
        let params: Value = serde_json::from_str(info.params_schema).ok()?;
        for (name, schema) in params.get("$defs")?.as_object()? {
            defs.insert(name.clone(), schema.clone());
        }
    }
    Some(defs)
}

/// Gives the members of our definition `ours` the schema of the catalogue member of the same
/// name in `theirs` (its references pointed at our definitions); an enumeration takes the
/// catalogue's definition when both list the same values. None when either is missing.
fn overlay_catalogue_def(
    root: &mut Value,
    ours: &str,
    theirs: &str,
    catalogue: &Map<String, Value>,
) -> Option<()> {
    let their_def = catalogue.get(theirs)?;
    let our_def = root.pointer_mut(&format!("/$defs/{ours}"))?;
    if let Some(members) = our_def.get_mut("properties").and_then(Value::as_object_mut) {
        let their_members = their_def.get("properties")?.as_object()?;
        for (name, schema) in members.iter_mut() {
            let mut theirs = match their_members.get(agents::catalogue_member(ours, name)) {
                Some(s) => s.clone(),
                None => continue,
            };
            if to_our_refs(&mut theirs) {
                *schema = theirs;
            }
        }
    } else if our_def.get("enum").is_some() && our_def.get("enum") == their_def.get("enum") {
        *our_def = their_def.clone();
    }
    Some(())
}

/// Points every `$ref` of a catalogue schema at the domain definition converting to the
/// referenced catalogue type; false when one has no such definition.
fn to_our_refs(schema: &mut Value) -> bool {
    match schema {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get_mut("$ref") {
                let target = r.strip_prefix("#/$defs/").and_then(|t| {
                    agents::CATALOGUE_TYPES
                        .iter()
                        .find(|(_, theirs)| *theirs == t)
                        .map(|(ours, _)| *ours)
                });
                match target {
                    Some(ours) => *r = format!("#/$defs/{ours}"),
                    None => return false,
                }
            }
            m.iter_mut()
                .filter(|(k, _)| k.as_str() != "$ref")
                .all(|(_, v)| to_our_refs(v))
        }
        Value::Array(items) => items.iter_mut().all(to_our_refs),
        _ => true,
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
            // The whole document and the section alone both show it, on the definition of
            // the domain type the section's entries are (which converts to `def`).
            let ours = agents::CATALOGUE_TYPES
                .iter()
                .find(|(_, theirs)| *theirs == def)
                .unwrap()
                .0;
            assert_eq!(
                root["$defs"][ours]["properties"][member], want,
                "{def}.{member}"
            );
            assert_eq!(
                root["properties"][section]["additionalProperties"]["$ref"],
                format!("#/$defs/{ours}")
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

    /// Guards the schema's constraints against a catalogue rename: every member of every
    /// domain type must have a catalogue member of the same name, or `config.schema` would
    /// silently show it without the catalogue's constraints.
    #[test]
    fn every_domain_member_has_a_catalogue_member() {
        let ours = config::schema();
        let theirs = catalogue_defs().unwrap();
        for (our_def, their_def) in agents::CATALOGUE_TYPES {
            let o = &ours["$defs"][our_def];
            let t = &theirs[*their_def];
            assert!(o.is_object(), "the configuration schema has no `{our_def}`");
            assert!(t.is_object(), "the catalogue has no `{their_def}`");
            if let Some(values) = o.get("enum") {
                assert_eq!(
                    Some(values),
                    t.get("enum"),
                    "`{our_def}` and the catalogue's `{their_def}` list different values: \
                     map them in runtime/domain.rs or change the value deliberately (a data \
                     migration)"
                );
                continue;
            }
            let members = o["properties"].as_object().unwrap();
            assert!(!members.is_empty(), "`{our_def}` has no members");
            for name in members.keys() {
                if agents::FILE_ONLY_MEMBERS.contains(&(*our_def, name.as_str())) {
                    continue;
                }
                let theirs = agents::catalogue_member(our_def, name);
                assert!(
                    t["properties"].get(theirs).is_some(),
                    "`{our_def}.{name}` has no member `{theirs}` in the catalogue's \
                     `{their_def}`: add a mapping to CATALOGUE_MEMBER_RENAMES in \
                     runtime/domain.rs, or rename the member there deliberately (that is a \
                     data migration of the configuration file and the stored rows)"
                );
            }
            // The other way round is a compile error in the conversions of runtime/domain.rs.
            let names = |v: &Value, ours: bool| -> Vec<String> {
                v.as_array()
                    .into_iter()
                    .flatten()
                    .map(|n| n.as_str().unwrap())
                    .map(|n| {
                        if ours {
                            agents::catalogue_member(our_def, n)
                        } else {
                            n
                        }
                    })
                    .map(str::to_owned)
                    .collect()
            };
            assert_eq!(
                names(&o["required"], true),
                names(&t["required"], false),
                "`{our_def}` and `{their_def}` require different members"
            );
        }
    }

    /// Each domain member took the catalogue's schema, and no schema still points at a
    /// catalogue definition.
    #[test]
    fn every_domain_member_shows_the_catalogue_schema() {
        let root = constrained_schema().unwrap();
        let theirs = catalogue_defs().unwrap();
        for (our_def, their_def) in agents::CATALOGUE_TYPES {
            let o = &root["$defs"][our_def];
            let t = &theirs[*their_def];
            if o.get("enum").is_some() {
                assert_eq!(o, t, "{our_def}");
                continue;
            }
            for (name, schema) in o["properties"].as_object().unwrap() {
                if agents::FILE_ONLY_MEMBERS.contains(&(*our_def, name.as_str())) {
                    assert_eq!(schema["x-fileOnly"], true, "{our_def}.{name}");
                    continue;
                }
                let mut want = t["properties"][agents::catalogue_member(our_def, name)].clone();
                assert!(to_our_refs(&mut want), "{our_def}.{name}");
                assert_eq!(schema, &want, "{our_def}.{name}");
            }
            assert!(
                root["$defs"].get(*their_def).is_none() || our_def == their_def,
                "{their_def} left in the schema"
            );
        }
        let text = root.to_string();
        for (ours, theirs) in agents::CATALOGUE_TYPES {
            if ours != theirs {
                assert!(
                    !text.contains(&format!("\"#/$defs/{theirs}\"")),
                    "a reference to the catalogue's {theirs} remains"
                );
            }
        }
        // A constraint reached through a reference: a scripted step's failure status.
        let status = &root["$defs"]["ScriptFailure"]["properties"]["status"];
        assert_eq!(status["minimum"], 400);
        assert_eq!(
            root["$defs"]["ScriptStep"]["properties"]["error"]["$ref"],
            "#/$defs/ScriptFailure"
        );
    }
}
