//! The fleet's configuration document and the writes made to it through the API
//! (`config.set/patch/apply/rollback`). The document in force lives in the store with its
//! history and applies on every node sharing it; the configuration file is the bootstrap, read
//! at each start (read-only is fine, and the API never writes it). Which source wins:
//! - the first start on a database stores the file's document as the fleet's;
//! - a start that reads a file other than the one the fleet read last (an operator's edit, or
//!   a node with another file) records what the file changed since that one as a commit
//!   (origin `external`), and those changes win; the rest of the stored document stays;
//! - otherwise the stored document is in force, with each node's file-only keys
//!   (`config::trust`) always taken from its own file.
//!
//! A write is checked once (file-only keys unchanged, provider entries through the provider
//! policy, token entries never broader than the writer, then the checks of a start), stored
//! with its history commit in one transaction (compare-and-set on the previous commit, so two
//! nodes writing at once cannot both win), recorded in the audit log (paths only), applied here
//! (live for `agents` and `providers`, else by the in-process restart) and announced to the
//! other nodes, whose follower ([`follow`]) applies it the same way.

use std::path::PathBuf;
use std::sync::{Arc, Weak};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::api::error::GatewayError;
use crate::api::CallContext;
use crate::app::state::AppState;
use crate::clock::now_ms;
use crate::config::{self, document as doc, trust, Config, Loaded};
use crate::store::control_plane::{AuditRow, VersionRow};
use crate::store::Store;

/// What other nodes are told when the fleet's document changed (`store::nodes::CONTROL`).
pub const ANNOUNCE_CONFIG: &str = "config";
/// Sections a change applies to without a restart.
const LIVE_SECTIONS: &[&str] = &["agents", "providers"];
/// How often a node compares its document with the store's when no announcement came (a
/// missed notification heals within this time).
const RESYNC_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

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

/// The history row of `document` (redacted here) after the current history head.
async fn version_row(
    store: &Store,
    document: &Value,
    message: String,
    author: Option<&str>,
    section: Option<String>,
    key: Option<String>,
) -> Result<VersionRow, GatewayError> {
    let head = store.config_head().await?;
    let text = doc::redacted(document).to_string();
    let at = now_ms();
    let parent = head.map(|h| h.sha);
    let sha = sha_of(parent.as_deref(), &text, &message, at);
    Ok(VersionRow {
        sha,
        parent,
        message,
        author: author.map(str::to_owned),
        section,
        key,
        document: text,
        created_at: at,
    })
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

/// Reads a configuration file's document (a missing file is an empty document).
pub fn read_document(path: &std::path::Path) -> Result<Value, GatewayError> {
    match std::fs::read_to_string(path) {
        Ok(text) => doc::from_yaml(&text).map_err(|e| {
            GatewayError::Conflict(format!(
                "the configuration file {} does not parse ({e})",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Value::Object(Map::new())),
        Err(e) => Err(GatewayError::Internal(format!(
            "cannot read {}: {e}",
            path.display()
        ))),
    }
}

/// The document of the first configuration file read (an empty one without a file).
pub fn file_document(paths: &[PathBuf]) -> Result<Value, GatewayError> {
    match paths.first() {
        Some(p) => read_document(p),
        None => Ok(Value::Object(Map::new())),
    }
}

/// Hex SHA-256 of a document's JSON text: the identity of a configuration file's content.
fn digest(document: &Value) -> String {
    hex::encode(Sha256::digest(document.to_string().as_bytes()))
}

/// Stores `document` as the fleet's (with its history commit) if the document in force is
/// still `expected`, and audits it; None when another node wrote first.
#[allow(clippy::too_many_arguments)]
async fn store_document(
    store: &Store,
    expected: Option<&str>,
    document: &Value,
    message: String,
    origin: &str,
    method: Option<&str>,
    author: Option<&str>,
    paths: &[String],
    section_key: (Option<String>, Option<String>),
) -> Result<Option<String>, GatewayError> {
    let (section, key) = section_key;
    let row = version_row(store, document, message, author, section, key).await?;
    if !store
        .config_document_put(expected, &document.to_string(), &row)
        .await?
    {
        return Ok(None);
    }
    audit(store, origin, method, author, paths, Some(&row.sha)).await?;
    Ok(Some(row.sha))
}

/// The configuration a generation is built on, the file it was read from, and the fleet
/// document's commit it runs.
pub struct Reconciled {
    pub loaded: Loaded,
    pub file_document: Value,
    pub sha: Option<String>,
}

/// Settles which configuration a generation about to be built runs (the rules of the module
/// documentation). Should the store fail, or its document not load on this node, the
/// generation runs on the file alone and says so in the log.
pub async fn reconcile(store: &Store, file: Loaded) -> Reconciled {
    let file_doc = match file_document(&file.paths) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "configuration file unreadable after loading; running on it as loaded");
            return Reconciled {
                loaded: file,
                file_document: Value::Object(Map::new()),
                sha: None,
            };
        }
    };
    match reconcile_on(store, &file, &file_doc).await {
        Ok((loaded, sha)) => Reconciled {
            loaded,
            file_document: file_doc,
            sha,
        },
        Err(e) => {
            tracing::error!(error = %e, "the fleet's configuration could not be applied on this node; this generation runs on the configuration file alone");
            Reconciled {
                loaded: file,
                file_document: file_doc,
                sha: None,
            }
        }
    }
}

async fn reconcile_on(
    store: &Store,
    file: &Loaded,
    file_doc: &Value,
) -> Result<(Loaded, Option<String>), GatewayError> {
    let digest = digest(file_doc);
    let previous = store
        .config_file_read(&digest, &file_doc.to_string())
        .await?;
    // What the operator changed in the file since the fleet last read one (file-only keys are
    // each node's own and never part of it).
    let edits = match &previous {
        Some((d, base)) if *d != digest => {
            let base: Value = serde_json::from_str(base).unwrap_or(Value::Null);
            let mut found = doc::changed_members(&base, file_doc);
            found.retain(|p| !trust::is_file_only(&p.join(".")));
            found
        }
        _ => Vec::new(),
    };
    // Two nodes storing at once: the loser reads the winner's document and decides again.
    let (document, sha) = loop {
        match store.config_document().await? {
            None => {
                let first = store_document(
                    store,
                    None,
                    file_doc,
                    "configuration as first seen".to_owned(),
                    "startup",
                    None,
                    None,
                    &[],
                    (None, None),
                )
                .await?;
                if let Some(sha) = first {
                    break (file_doc.clone(), Some(sha));
                }
            }
            Some((text, head)) => {
                let document: Value = serde_json::from_str(&text).map_err(|e| {
                    GatewayError::Internal(format!("stored configuration unreadable: {e}"))
                })?;
                let mut next = document.clone();
                for path in &edits {
                    let at: Vec<&str> = path.iter().map(String::as_str).collect();
                    match path.iter().try_fold(file_doc, |v, k| v.get(k)) {
                        Some(v) => {
                            doc::set(&mut next, &at, v.clone()).map_err(invalid)?;
                        }
                        None => doc::remove(&mut next, &at),
                    }
                }
                if next == document {
                    break (document, head);
                }
                let paths: Vec<String> = edits.iter().map(|p| p.join(".")).collect();
                let edit = store_document(
                    store,
                    head.as_deref(),
                    &next,
                    "changed in the configuration file".to_owned(),
                    "external",
                    None,
                    None,
                    &paths,
                    (None, None),
                )
                .await?;
                if let Some(sha) = edit {
                    store.announce(ANNOUNCE_CONFIG).await;
                    tracing::warn!(paths = ?paths, "the configuration file changed since the fleet last read it: its changes are now in force (recorded in config.history)");
                    break (next, Some(sha));
                }
            }
        }
    };
    let cfg = effective(&document, file_doc).map_err(invalid)?;
    Ok((
        Loaded {
            config: cfg,
            paths: file.paths.clone(),
        },
        sha,
    ))
}

/// The configuration in force on a node: the fleet's `document` with the file-only keys of
/// this node's `file`, loaded like a file (environment overrides, validation).
pub fn effective(document: &Value, file: &Value) -> Result<Config, String> {
    let mut d = document.clone();
    trust::overlay_file_only(&mut d, file);
    let mut cfg = config::from_value(d).map_err(|e| e.0)?;
    config::apply_env(&mut cfg).map_err(|e| e.0)?;
    config::validate(&cfg).map_err(|e| e.0)?;
    Ok(cfg)
}

/// The fleet's document as stored and its commit; the file's when none is stored yet.
pub async fn fleet_document(state: &AppState) -> Result<(Value, Option<String>), GatewayError> {
    match state.engine.store.config_document().await? {
        Some((text, head)) => {
            let d = serde_json::from_str(&text).map_err(|e| {
                GatewayError::Internal(format!("stored configuration unreadable: {e}"))
            })?;
            Ok((d, head))
        }
        None => Ok((state.file_document.clone(), None)),
    }
}

/// Resolves a full or abbreviated sha to its version.
pub async fn version(store: &Store, sha: &str) -> Result<VersionRow, GatewayError> {
    let mut found = store.config_versions_by_prefix(sha).await?;
    match found.len() {
        0 => Err(GatewayError::not_found("Configuration commit", sha)),
        1 => Ok(found.remove(0)),
        _ => Err(invalid(format!(
            "'{sha}' names more than one commit; give more digits"
        ))),
    }
}

/// Loads a document like a file (the error names the key).
fn load(document: &Value) -> Result<Config, GatewayError> {
    let mut cfg = config::from_value(document.clone()).map_err(|e| invalid(e.0))?;
    config::apply_env(&mut cfg).map_err(|e| invalid(e.0))?;
    Ok(cfg)
}

/// Validates `next` as a whole configuration written by `ctx`'s principal: no file-only key
/// changed, provider entries through the provider policy, token entries never broader than
/// the writer, then loading rules, environment overrides, the checks of a start (providers,
/// agents, models, webhooks), and token ids against the store's.
async fn validate(
    state: &AppState,
    ctx: &CallContext,
    current: &Value,
    next: &Value,
) -> Result<Config, GatewayError> {
    let cfg = load(next)?;
    let before = load(current)?;
    trust::check_unchanged(&config::raw(&before), &config::raw(&cfg)).map_err(invalid)?;
    check_tokens(ctx, &before, &cfg)?;
    for (id, entry) in &cfg.providers {
        state
            .engine
            .providers
            .check_api_entry(id, entry, before.providers.get(id))
            .await?;
    }
    config::validate(&cfg).map_err(|e| invalid(e.0))?;
    crate::app::check::check(&cfg, Some(&state.engine.store))
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

/// The rule of `tokens.create` for token entries written through `config.*`: a new entry, or
/// one whose secret or scopes changed, lists its scopes (empty means every scope, which only
/// the file may grant) and holds none the writer lacks.
fn check_tokens(ctx: &CallContext, before: &Config, next: &Config) -> Result<(), GatewayError> {
    for (i, t) in next.gateway.tokens.iter().enumerate() {
        let unchanged = before
            .gateway
            .tokens
            .iter()
            .any(|b| b.id == t.id && b.secret == t.secret && b.scopes == t.scopes);
        if unchanged {
            continue;
        }
        if t.scopes.is_empty() {
            return Err(invalid(format!(
                "gateway.tokens[{i}].scopes: empty scopes grant every scope, which only the \
                 configuration file may do; list the scopes"
            )));
        }
        for name in &t.scopes {
            let held = crate::api::generated::methods::Scope::from_name(name)
                .is_some_and(|s| ctx.principal.allows(s));
            if !held {
                return Err(invalid(format!(
                    "gateway.tokens[{i}].scopes: scope '{name}' cannot be granted: the calling \
                     token does not hold it"
                )));
            }
        }
    }
    Ok(())
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

/// The document `change` makes of `current` (the fleet's document with this node's
/// file-only keys).
async fn changed(
    state: &AppState,
    current: &Value,
    change: &Change,
    out: &mut Outcome,
) -> Result<Value, GatewayError> {
    let mut next = current.clone();
    match change {
        Change::Set {
            section,
            key,
            value,
        } => {
            if !config::sections().iter().any(|s| s == section) {
                return Err(GatewayError::not_found(
                    "Configuration section",
                    format_args!("{section} (sections: {})", config::sections().join(", ")),
                ));
            }
            let mut at = vec![section.as_str()];
            at.extend(doc::segments(key).map_err(invalid)?);
            doc::set(&mut next, &at, value.clone()).map_err(invalid)?;
            doc::restore_redacted(&mut next, current).map_err(invalid)?;
            // The value in force before (the document's, else the default), as config.read
            // shows it.
            let shown = config::redacted(&state.live_config());
            out.previous = doc::get(&shown, &at).cloned();
        }
        Change::Patch(patch) => {
            if !patch.is_object() {
                return Err(invalid("the patch must be an object"));
            }
            doc::merge_patch(&mut next, patch);
            doc::restore_redacted(&mut next, current).map_err(invalid)?;
        }
        Change::Apply(whole) => {
            // File-only keys the caller leaves out are this node's (they are not the API's to
            // give); one it names must keep its value.
            next = whole.clone();
            trust::fill_missing(&mut next, current);
            doc::restore_redacted(&mut next, current).map_err(invalid)?;
        }
        Change::Rollback(sha) => {
            let v = version(&state.engine.store, sha).await?;
            next = serde_json::from_str(&v.document)
                .map_err(|e| GatewayError::Internal(format!("stored version unreadable: {e}")))?;
            // What is rolled back is the fleet's part: file-only keys stay this node's.
            trust::overlay_file_only(&mut next, &state.file_document);
            doc::restore_redacted(&mut next, current).map_err(|e| {
                GatewayError::Conflict(format!("commit {} cannot be restored: {e}", v.sha))
            })?;
            out.restored = Some(v.sha);
        }
    }
    Ok(next)
}

/// Makes one change (see the module documentation).
pub async fn write(
    state: &Arc<AppState>,
    ctx: &CallContext,
    method: &'static str,
    change: Change,
) -> Result<Outcome, GatewayError> {
    let _serial = state.control.config_writes.lock().await;
    let store = &state.engine.store;
    let (document, head) = fleet_document(state).await?;
    let mut current = document;
    trust::overlay_file_only(&mut current, &state.file_document);
    let mut out = Outcome::default();
    let next = changed(state, &current, &change, &mut out).await?;
    let paths = doc::changed_paths(&current, &next);
    if paths.is_empty() {
        return Ok(out);
    }
    let cfg = validate(state, ctx, &current, &next).await?;
    out.sections = doc::sections_of(&paths);
    let (message, section, key) = message_of(method, &change, &out.sections);
    let sha = store_document(
        store,
        head.as_deref(),
        &next,
        message,
        "rpc",
        Some(method),
        Some(&ctx.principal.client_id),
        &paths,
        (section, key),
    )
    .await?
    .ok_or_else(|| {
        GatewayError::Conflict(
            "the configuration was changed by another node at the same time; read it again and \
             retry"
                .into(),
        )
    })?;
    let live = apply(state, &cfg, &out.sections, &sha).await;
    store.announce(ANNOUNCE_CONFIG).await;
    state.engine.emit_operator(
        "audit:event",
        serde_json::json!({"kind": "config_changed", "method": method,
                           "clientId": ctx.principal.client_id, "paths": paths,
                           "commitSha": sha, "restarting": !live}),
    );
    tracing::info!(method, client = %ctx.principal.client_id, sections = ?out.sections, commit = %sha, live, "configuration changed");
    out.commit = Some(sha);
    out.restarting = !live;
    Ok(out)
}

/// Puts a stored document in force on this node: live when only live sections changed (and
/// applying them works), else by asking for the in-process restart, whose generation reads
/// the store again. True when applied live.
async fn apply(state: &AppState, cfg: &Config, sections: &[String], sha: &str) -> bool {
    let live = sections.iter().all(|s| LIVE_SECTIONS.contains(&s.as_str()));
    if live {
        match state.engine.seed_from(cfg).await {
            Ok(()) => {
                state.set_live_config(cfg.clone());
                state.set_config_sha(Some(sha.to_owned()));
                return true;
            }
            Err(e) => {
                // Checked by the dry run already; should seeding still fail, the restart
                // builds the next generation on the stored document (or keeps this one).
                tracing::error!(error = %e, "configuration change not applied live; restarting");
                let _ = state.engine.agents.reload().await;
                let _ = state.engine.providers.reload().await;
            }
        }
    }
    // The answer goes out first; the server loop then builds the next generation (and keeps
    // this one serving should that fail).
    let control = state.control.clone();
    #[allow(
        clippy::disallowed_methods,
        reason = "ends with the generation (stop token) or hands over to the server loop"
    )]
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        control.restart_requested.notify_one();
    });
    false
}

/// Follows the fleet's document for one generation: when another node stored a new one
/// (announced, or found by the periodic check), this node applies it as its own write would.
/// Ends with the generation.
pub fn follow(state: &Arc<AppState>) {
    let weak = Arc::downgrade(state);
    let mut changes = state.control.registry_epoch.subscribe();
    changes.mark_unchanged();
    let stop = state.stop.clone();
    #[allow(
        clippy::disallowed_methods,
        reason = "ends with the generation (stop token) or hands over to the server loop"
    )]
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(RESYNC_EVERY) => {}
            }
            if !catch_up(&weak).await {
                return;
            }
        }
    });
}

/// One comparison of this generation's document with the store's; false when the
/// generation is gone or has asked for its successor.
async fn catch_up(state: &Weak<AppState>) -> bool {
    let Some(state) = state.upgrade() else {
        return false;
    };
    let _serial = state.control.config_writes.lock().await;
    let stored = match state.engine.store.config_document().await {
        Ok(Some(s)) => s,
        Ok(None) => return true,
        Err(e) => {
            tracing::warn!(error = %e, "the fleet's configuration not read; retried later");
            return true;
        }
    };
    let (text, head) = stored;
    if head.is_none() || head == state.config_sha() {
        return true;
    }
    let next = serde_json::from_str::<Value>(&text)
        .map_err(|e| e.to_string())
        .and_then(|d| effective(&d, &state.file_document));
    let cfg = match next {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "the fleet's new configuration does not load on this node; keeping the one in force");
            state.set_config_sha(head);
            return true;
        }
    };
    let paths = doc::changed_paths(&config::raw(&state.live_config()), &config::raw(&cfg));
    let sha = head.unwrap_or_default();
    if paths.is_empty() {
        state.set_config_sha(Some(sha));
        return true;
    }
    let sections = doc::sections_of(&paths);
    tracing::info!(sections = ?sections, commit = %sha, "configuration changed on another node; applying it");
    apply(&state, &cfg, &sections, &sha).await
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
