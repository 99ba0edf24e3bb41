//! Writes of the configuration file through the API (`config.set/patch/apply/rollback`): the
//! change is made on the file's document, validated like a start (loading, then the engine's
//! dry run), written atomically, applied (live for `agents` and `providers`, else by the
//! in-process restart), recorded in the history (secrets redacted) and the audit log (paths
//! only). Writes are serialised process-wide; a change that fails anywhere before the file is
//! replaced leaves everything as it was, and one that fails to apply live puts the file back.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::{self, document as doc, Config};
use crate::error::GatewayError;
use crate::rpc::CallContext;
use crate::state::AppState;
use crate::store::control::{AuditRow, VersionRow};
use crate::store::{now_ms, Store};

/// The file written when the gateway runs without one (read at the next start too).
pub const DEFAULT_FILE: &str = "config.yaml";
/// Owner of operator-only events (`audit:event`, `secret:*`): an id no token can have, so
/// only admin subscribers see them.
pub const OPERATOR: &str = "gateway:operator";
/// Sections a change applies to without a restart.
const LIVE_SECTIONS: &[&str] = &["agents", "providers"];

/// What a write asks for.
pub enum Change {
    Set {
        section: String,
        key: String,
        value: Value,
    },
    Patch(Value),
    Apply(Value),
    Rollback(String),
}

/// What a write did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// config.set: the value before (redacted).
    pub previous: Option<Value>,
    /// Top-level sections that changed.
    pub sections: Vec<String>,
    pub restarting: bool,
    pub commit: Option<String>,
    /// config.rollback: the full sha restored.
    pub restored: Option<String>,
}

/// The file config writes go to: the one loaded, else `<dataDir>/config.yaml`.
pub fn file_path(state: &AppState) -> PathBuf {
    state
        .config_paths
        .first()
        .cloned()
        .unwrap_or_else(|| state.data_dir.join(DEFAULT_FILE))
}

fn invalid(e: impl std::fmt::Display) -> GatewayError {
    GatewayError::InvalidParams(e.to_string())
}

fn sha_of(parent: Option<&str>, document: &str, message: &str, at: i64) -> String {
    let mut h = Sha256::new();
    for part in [parent.unwrap_or(""), document, message, &at.to_string()] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
}

/// One history commit of `document` (already redacted) after the current head.
pub async fn commit(
    store: &Store,
    document: &Value,
    message: String,
    author: Option<&str>,
    section: Option<String>,
    key: Option<String>,
) -> Result<String, GatewayError> {
    let head = store.config_head().await?;
    let text = document.to_string();
    let at = now_ms();
    let parent = head.map(|h| h.sha);
    let sha = sha_of(parent.as_deref(), &text, &message, at);
    store
        .config_commit(&VersionRow {
            sha: sha.clone(),
            parent,
            message,
            author: author.map(str::to_owned),
            section,
            key,
            document: text,
            created_at: at,
        })
        .await?;
    Ok(sha)
}

/// Paths whose change makes a write suspicious, and why.
fn suspicion(paths: &[String], origin: &str) -> Vec<String> {
    let mut reasons = Vec::new();
    if origin == "external" {
        reasons.push("changed outside the gateway".to_owned());
    }
    if paths.iter().any(|p| p.starts_with("gateway.tokens")) {
        reasons.push("touches gateway.tokens (credentials and scopes)".to_owned());
    }
    if paths.iter().any(|p| {
        p.starts_with("webhooks.token") || p.starts_with("secrets") || p.ends_with(".secret")
    }) {
        reasons.push("touches a secret".to_owned());
    }
    if paths.iter().any(|p| p.starts_with("providerPolicy")) {
        reasons.push("touches providerPolicy".to_owned());
    }
    reasons
}

/// Appends an audit record (paths only, never values).
pub async fn audit(
    store: &Store,
    origin: &str,
    method: Option<&str>,
    client_id: Option<&str>,
    paths: &[String],
    commit_sha: Option<&str>,
) -> Result<(), GatewayError> {
    let reasons = suspicion(paths, origin);
    store
        .audit_insert(&AuditRow {
            id: 0,
            ts: now_ms(),
            pid: i64::from(std::process::id()),
            origin: origin.to_owned(),
            method: method.map(str::to_owned),
            client_id: client_id.map(str::to_owned),
            paths: serde_json::to_string(paths).unwrap_or_else(|_| "[]".into()),
            commit_sha: commit_sha.map(str::to_owned),
            suspicious: !reasons.is_empty(),
            reasons: serde_json::to_string(&reasons).unwrap_or_else(|_| "[]".into()),
        })
        .await
}

/// Reads the file's document (a missing file is an empty document).
pub fn read_document(path: &std::path::Path) -> Result<(Option<String>, Value), GatewayError> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let d = doc::from_yaml(&text).map_err(|e| {
                GatewayError::Conflict(format!(
                    "the configuration file {} does not parse any more ({e}); fix it by hand",
                    path.display()
                ))
            })?;
            Ok((Some(text), d))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok((None, Value::Object(Default::default())))
        }
        Err(e) => Err(GatewayError::Internal(format!(
            "cannot read {}: {e}",
            path.display()
        ))),
    }
}

/// Makes the history's head the file's document: a first root when there is no history yet
/// (origin `startup`), an `external` commit and a suspicious audit record when the file was
/// changed outside the gateway since the last commit.
pub async fn observe_file(
    store: &Store,
    current: &Value,
    origin: &str,
) -> Result<(), GatewayError> {
    let shown = doc::redacted(current);
    let (message, origin, paths) = match store.config_head().await? {
        None => ("configuration as first seen", origin, Vec::new()),
        Some(head) => {
            let before: Value = serde_json::from_str(&head.document).unwrap_or(Value::Null);
            let paths = doc::changed_paths(&before, &shown);
            if paths.is_empty() {
                return Ok(());
            }
            ("changed outside the gateway", "external", paths)
        }
    };
    let sha = commit(store, &shown, message.to_owned(), None, None, None).await?;
    audit(store, origin, None, None, &paths, Some(&sha)).await
}

/// The history's first commit, at the first start on a database without history. A file
/// changed outside the gateway is recorded (as `external`) by the next write through the API,
/// not at start: a node of a fleet, or a store imported elsewhere, starts on its own file
/// without rewriting the shared history.
pub async fn observe_at_start(state: &AppState) {
    let path = file_path(state);
    let store = &state.engine.store;
    let result = match (store.config_head().await, read_document(&path)) {
        (Ok(None), Ok((_, current))) => observe_file(store, &current, "startup").await,
        (Err(e), _) | (_, Err(e)) => Err(e),
        _ => Ok(()),
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, "configuration history not updated at start");
    }
}

/// Resolves a full or abbreviated sha to its version.
pub async fn version(store: &Store, sha: &str) -> Result<VersionRow, GatewayError> {
    let mut found = store.config_versions_by_prefix(sha).await?;
    match found.len() {
        0 => Err(GatewayError::NotFound(format!(
            "Configuration commit not found: {sha}"
        ))),
        1 => Ok(found.remove(0)),
        _ => Err(invalid(format!(
            "'{sha}' names more than one commit; give more digits"
        ))),
    }
}

/// Validates `next` as a whole configuration: loading rules, environment overrides, the
/// checks of a start (providers, agents, models, webhooks), and token ids against the store's.
async fn validate(state: &AppState, next: &Value) -> Result<Config, GatewayError> {
    let mut cfg = config::from_value(next.clone()).map_err(|e| invalid(e.0))?;
    config::apply_env(&mut cfg).map_err(|e| invalid(e.0))?;
    config::validate(&cfg).map_err(|e| invalid(e.0))?;
    crate::server::check(&cfg, Some(&state.engine.store))
        .await
        .map_err(invalid)?;
    let stored = state.engine.store.tokens_all().await?;
    if let Some(t) = cfg
        .gateway
        .tokens
        .iter()
        .find(|t| stored.iter().any(|s| s.id == t.id))
    {
        return Err(invalid(format!(
            "gateway.tokens: id '{}' is an API token's (tokens.*); choose another id",
            t.id
        )));
    }
    Ok(cfg)
}

fn message_of(
    method: &str,
    change: &Change,
    sections: &[String],
) -> (String, Option<String>, Option<String>) {
    match change {
        Change::Set { section, key, .. } => (
            format!("{method} {section}.{key}"),
            Some(section.clone()),
            Some(key.clone()),
        ),
        Change::Rollback(sha) => (
            format!("rollback to {}", &sha[..sha.len().min(12)]),
            (sections.len() == 1).then(|| sections[0].clone()),
            None,
        ),
        _ => (
            format!("{method}: {}", sections.join(", ")),
            (sections.len() == 1).then(|| sections[0].clone()),
            None,
        ),
    }
}

/// Makes one change (see the module documentation).
pub async fn write(
    state: &Arc<AppState>,
    ctx: &CallContext,
    method: &'static str,
    change: Change,
) -> Result<Outcome, GatewayError> {
    let control = state.control.clone();
    let _serial = state.control.config_writes.lock().await;
    let store = &state.engine.store;
    let path = file_path(state);
    let (old_text, current) = read_document(&path)?;
    observe_file(store, &current, "external").await?;
    let mut next = current.clone();
    let mut out = Outcome::default();
    match &change {
        Change::Set {
            section,
            key,
            value,
        } => {
            if !config::sections().iter().any(|s| s == section) {
                return Err(GatewayError::NotFound(format!(
                    "Unknown configuration section '{section}' (sections: {})",
                    config::sections().join(", ")
                )));
            }
            let mut at = vec![section.as_str()];
            at.extend(doc::segments(key).map_err(invalid)?);
            doc::set(&mut next, &at, value.clone()).map_err(invalid)?;
            doc::restore_redacted(&mut next, &current).map_err(invalid)?;
            // The value in force before (the file's, else the default), as config.read shows it.
            let shown = config::redacted(&state.live_config());
            out.previous = doc::get(&shown, &at).cloned();
        }
        Change::Patch(patch) => {
            if !patch.is_object() {
                return Err(invalid("the patch must be an object"));
            }
            doc::merge_patch(&mut next, patch);
            doc::restore_redacted(&mut next, &current).map_err(invalid)?;
        }
        Change::Apply(whole) => {
            next = whole.clone();
            doc::restore_redacted(&mut next, &current).map_err(invalid)?;
        }
        Change::Rollback(sha) => {
            let v = version(store, sha).await?;
            next = serde_json::from_str(&v.document)
                .map_err(|e| GatewayError::Internal(format!("stored version unreadable: {e}")))?;
            doc::restore_redacted(&mut next, &current).map_err(|e| {
                GatewayError::Conflict(format!("commit {} cannot be restored: {e}", v.sha))
            })?;
            out.restored = Some(v.sha);
        }
    }
    let paths = doc::changed_paths(&current, &next);
    if paths.is_empty() {
        return Ok(out);
    }
    let cfg = validate(state, &next).await?;
    let text = doc::to_yaml(&next).map_err(invalid)?;
    crate::secrets::write_private_atomic(&path, &text)
        .map_err(|e| GatewayError::Internal(format!("cannot write {}: {e}", path.display())))?;
    out.sections = doc::sections_of(&paths);
    let live = out
        .sections
        .iter()
        .all(|s| LIVE_SECTIONS.contains(&s.as_str()));
    if live {
        if let Err(e) = state.engine.seed_from(&cfg).await {
            // Put the file back: the running configuration stays the one in force.
            let restored = match &old_text {
                Some(t) => crate::secrets::write_private_atomic(&path, t),
                None => std::fs::remove_file(&path),
            };
            if let Err(re) = restored {
                tracing::error!(error = %re, path = %path.display(), "configuration file not restored after a failed change");
            }
            let _ = state.engine.agents.reload().await;
            let _ = state.engine.providers.reload().await;
            return Err(invalid(e));
        }
        state.set_live_config(cfg);
    }
    let (message, section, key) = message_of(method, &change, &out.sections);
    let sha = commit(
        store,
        &doc::redacted(&next),
        message,
        Some(&ctx.principal.client_id),
        section,
        key,
    )
    .await?;
    audit(
        store,
        "rpc",
        Some(method),
        Some(&ctx.principal.client_id),
        &paths,
        Some(&sha),
    )
    .await?;
    state.engine.emit_operator(
        "audit:event",
        serde_json::json!({"kind": "config_changed", "method": method,
                           "clientId": ctx.principal.client_id, "paths": paths,
                           "commitSha": sha, "restarting": !live}),
    );
    tracing::info!(method, client = %ctx.principal.client_id, sections = ?out.sections, commit = %sha, live, "configuration changed");
    out.commit = Some(sha);
    out.restarting = !live;
    if !live {
        // The answer goes out first; the server loop then builds the next generation on the
        // file just written (and keeps this one serving should that fail).
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            control.restart_requested.notify_one();
        });
    }
    Ok(out)
}

/// Known secret values (for the audit scrub): the configuration's and the secret store's.
pub fn known_secrets(state: &AppState) -> Vec<String> {
    let mut out = state.engine.secrets.known_values();
    let raw = config::raw(&state.live_config());
    collect_secret_strings(&raw, &mut out);
    out.retain(|s| s.len() >= 8);
    out.sort();
    out.dedup();
    out
}

fn collect_secret_strings(v: &Value, out: &mut Vec<String>) {
    let shown = doc::redacted(v);
    walk_pair(v, &shown, out);
}

fn walk_pair(raw: &Value, shown: &Value, out: &mut Vec<String>) {
    match (raw, shown) {
        (Value::String(r), Value::String(s)) if r != s => out.push(r.clone()),
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                if let Some(w) = b.get(k) {
                    walk_pair(v, w, out);
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (v, w) in a.iter().zip(b) {
                walk_pair(v, w, out);
            }
        }
        _ => {}
    }
}
