//! The fuzzing properties, shared by the cargo-fuzz targets (`fuzz/fuzz_targets/`) and the
//! bounded CI harness (`tests/suite/ops/fuzz_harness.rs`): each check takes raw fuzzer bytes and
//! panics, naming the broken promise, when the code under test breaks it.
//!
//! One file serves both so that the properties cannot drift apart: the harness includes it with
//! `#[path]`, the fuzz crate as a module. It uses only what both have: the gateway library,
//! serde_json, tokio, http and tempfile.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use agent_gateway::api::CallContext;
use agent_gateway::config::webhooks::Algorithm;
use agent_gateway::handlers::Rpc;
use agent_gateway::media::{self, MediaError, MediaStore};
use agent_gateway::rpc::envelope::{handle_text, Reply};
use agent_gateway::store::filter::{self, Column, Filter};
use agent_gateway::webhooks::template::{self, Context, MAX_OUTPUT_BYTES};
use agent_gateway::webhooks::verify::{Rejection, Verifier};
use http::{HeaderMap, HeaderValue};
use serde_json::Value;

/// Splits one fuzzer input into fields. 0xFF never occurs in UTF-8, so a text field never
/// contains it by accident.
pub const SEP: u8 = 0xFF;

/// Splits `data` into at most `n` fields at [`SEP`]; missing fields are empty.
pub fn fields(data: &[u8], n: usize) -> Vec<&[u8]> {
    let mut out: Vec<&[u8]> = data.splitn(n, |b| *b == SEP).collect();
    out.resize(n, &[]);
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// ---------------------------------------------------------------------------------------------
// JSON-RPC envelope

/// `gateway.maxBatchSize` of the rig (the default).
pub const MAX_BATCH: usize = 50;

/// A real handler set on a temp data directory (no provider reachable; the local model never
/// fetched, and never loaded from the user's model cache: a turn would take seconds), called as an `rpc` client: admin methods (restart, config writes) are refused by
/// the scope check, so random input cannot stop or reconfigure the rig.
pub struct EnvelopeRig {
    rpc: Rpc,
    ctx: CallContext,
    _dir: tempfile::TempDir,
}

impl EnvelopeRig {
    pub async fn new() -> Result<Self, String> {
        use agent_gateway::{app::state, auth, config};
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let data = dir.path().join("data");
        let yaml = format!(
            "local:\n  autoFetch: false\n  preload: false\n  cacheDir: {}\ngateway:\n  host: 127.0.0.1\n  port: 0\n  dataDir: {}\n  tokens:\n    - {{id: client, secret: fuzz-secret-0123456789abcdefghijklmnopq, scopes: [rpc]}}\n",
            dir.path().join("models").display(),
            data.display()
        );
        let path = dir.path().join("gateway.yaml");
        std::fs::write(&path, yaml).map_err(|e| e.to_string())?;
        let loaded = config::load(Some(&path)).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
        let control = Arc::new(agent_gateway::runtime::control::Control::new());
        let engine =
            agent_gateway::server::open_engine_at(&loaded.config, data.clone(), control.clone())
                .await
                .map_err(|e| e.to_string())?;
        let tokens = auth::TokenStore::new(&loaded.config.gateway.tokens);
        let ctx = tokens
            .verify("fuzz-secret-0123456789abcdefghijklmnopq")
            .map(|p| p.context(None))
            .ok_or("the rig's token is not configured")?;
        let state = state::AppState::new(
            loaded.config,
            loaded.paths,
            data,
            tokens,
            1,
            control,
            Arc::new(engine),
        );
        Ok(Self {
            rpc: Rpc::new(Arc::new(state)),
            ctx,
            _dir: dir,
        })
    }

    /// The envelope answers any text with valid JSON-RPC responses, one per request that is
    /// owed one, in order, and nothing for notifications.
    pub async fn check(&self, data: &[u8]) {
        let text = text(data);
        let reply = handle_text(&self.rpc, &self.ctx, &text, MAX_BATCH).await;
        if let Some(problem) = envelope_problem(&text, &reply) {
            panic!("envelope: {problem}\n input: {text:?}\n reply: {reply:?}");
        }
    }
}

/// What one request item is owed: no response (a valid notification), or a response with this
/// id; `code` is the error code the envelope itself must give, when it decides alone.
#[derive(Debug, Clone, PartialEq)]
pub struct Owed {
    pub id: Value,
    pub code: Option<i64>,
}

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;

/// JSON-RPC 2.0 section 4 to 6, written from the spec rather than from the envelope's code.
fn owed_for(item: &Value) -> Option<Owed> {
    let invalid = |id: Value| {
        Some(Owed {
            id,
            code: Some(INVALID_REQUEST),
        })
    };
    let Value::Object(obj) = item else {
        return invalid(Value::Null);
    };
    let id = match obj.get("id") {
        None => None,
        Some(v @ Value::String(_)) => Some(v.clone()),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Some(Value::Number(n.clone())),
        Some(_) => return invalid(Value::Null),
    };
    let well_formed = obj.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
        && obj.get("method").is_some_and(Value::is_string)
        && matches!(
            obj.get("params"),
            None | Some(Value::Object(_) | Value::Array(_))
        );
    match (id, well_formed) {
        (id, false) => invalid(id.unwrap_or(Value::Null)),
        (None, true) => None,
        (Some(id), true) => Some(Owed { id, code: None }),
    }
}

/// What `text` is owed: `None` for nothing at all, else the responses in order.
pub fn owed(text: &str, max_batch: usize) -> Option<Vec<Owed>> {
    let whole = |code| {
        Some(vec![Owed {
            id: Value::Null,
            code: Some(code),
        }])
    };
    let Ok(parsed) = serde_json::from_str::<Value>(text) else {
        return whole(PARSE_ERROR);
    };
    match parsed {
        Value::Array(items) if items.is_empty() || items.len() > max_batch => {
            whole(INVALID_REQUEST)
        }
        Value::Array(items) => {
            let owed: Vec<Owed> = items.iter().filter_map(owed_for).collect();
            (!owed.is_empty()).then_some(owed)
        }
        item => owed_for(&item).map(|o| vec![o]),
    }
}

/// Why one response object is not a valid JSON-RPC 2.0 response, if it is not.
fn response_problem(v: &Value) -> Option<String> {
    let Value::Object(obj) = v else {
        return Some("a response is not an object".into());
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some("jsonrpc is not \"2.0\"".into());
    }
    match obj.get("id") {
        Some(Value::String(_) | Value::Null) => {}
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => {}
        _ => return Some("id is missing or of a wrong type".into()),
    }
    match (obj.get("result"), obj.get("error")) {
        (Some(_), None) => {}
        (None, Some(Value::Object(e))) => {
            if !e.get("code").is_some_and(|c| c.is_i64()) {
                return Some("error.code is not an integer".into());
            }
            if !e.get("message").is_some_and(Value::is_string) {
                return Some("error.message is not a string".into());
            }
        }
        _ => return Some("not exactly one of result and error (an object)".into()),
    }
    let extra: Vec<&String> = obj
        .keys()
        .filter(|k| !matches!(k.as_str(), "jsonrpc" | "id" | "result" | "error"))
        .collect();
    (!extra.is_empty()).then(|| format!("unexpected members {extra:?}"))
}

/// Why `reply` is not what the JSON-RPC 2.0 spec owes `text`, if it is not.
pub fn envelope_problem(text: &str, reply: &Reply) -> Option<String> {
    let owed = owed(text, MAX_BATCH);
    let batch = matches!(serde_json::from_str::<Value>(text), Ok(Value::Array(ref a)) if !a.is_empty() && a.len() <= MAX_BATCH);
    let got: Vec<&Value> = match (reply, &owed) {
        (Reply::None, None) => return None,
        (Reply::None, Some(_)) => return Some("no reply where responses are owed".into()),
        (Reply::Some(_), None) => return Some("a reply to notifications only".into()),
        (Reply::Some(Value::Array(items)), Some(_)) if batch => items.iter().collect(),
        (Reply::Some(Value::Array(_)), Some(_)) => {
            return Some("an array answers a request that is not a batch".into())
        }
        (Reply::Some(_), Some(_)) if batch => {
            return Some("a batch answered by a single object".into())
        }
        (Reply::Some(v), Some(_)) => vec![v],
    };
    let owed = owed.unwrap_or_default();
    if got.len() != owed.len() {
        return Some(format!(
            "{} responses where {} are owed",
            got.len(),
            owed.len()
        ));
    }
    for (response, owed) in got.iter().zip(&owed) {
        if let Some(problem) = response_problem(response) {
            return Some(problem);
        }
        if response["id"] != owed.id {
            return Some(format!("id {} where {} is owed", response["id"], owed.id));
        }
        if let Some(code) = owed.code {
            if response["error"]["code"].as_i64() != Some(code) {
                return Some(format!("{} where error {code} is owed", response));
            }
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Webhook templates

const NOW: &str = "2024-01-02T03:04:05Z";

fn template_headers(secret: &str) -> BTreeMap<String, String> {
    [
        ("authorization", format!("Bearer {secret}")),
        ("cookie", format!("session={secret}")),
        ("x-hub-signature-256", format!("sha256={secret}")),
        ("x-gitlab-token", secret.to_owned()),
        ("x-api-key", secret.to_owned()),
        ("x-github-event", "push".to_owned()),
        ("content-type", "application/json".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Input: template, [`SEP`], payload (JSON, or else taken as one string).
///
/// Rendering never panics; the output is at most MAX_OUTPUT_BYTES; it does not depend on the
/// values of secret-bearing headers; a template without `{{` renders as itself (cut at the cap).
pub fn check_template(data: &[u8]) {
    let parts = fields(data, 2);
    let tpl = text(parts[0]);
    let payload: Value =
        serde_json::from_slice(parts[1]).unwrap_or_else(|_| Value::String(text(parts[1])));
    let query: BTreeMap<String, String> = [("ref".to_owned(), "main".to_owned())]
        .into_iter()
        .collect();
    let render = |secret: &str| {
        let headers = template_headers(secret);
        let ctx = Context {
            payload: &payload,
            headers: &headers,
            query: &query,
            path: "github/push",
            now: NOW,
        };
        template::render(&tpl, &ctx)
    };
    let out = render("s3cr3t-A");
    assert!(
        out.len() <= MAX_OUTPUT_BYTES,
        "template: output of {} bytes exceeds the cap\n template: {tpl:?}",
        out.len()
    );
    let other = render("another-much-longer-secret-value-B");
    assert!(
        out == other,
        "template: the output depends on a secret header\n template: {tpl:?}"
    );
    if !tpl.contains("{{") {
        let mut cut = tpl.len().min(MAX_OUTPUT_BYTES);
        while !tpl.is_char_boundary(cut) {
            cut -= 1;
        }
        assert!(
            out == tpl[..cut],
            "template: text without placeholders changed\n template: {tpl:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Webhook signature header

const SIG_SECRET: &[u8] = b"fuzz webhook secret";
const SIG_NOW: i64 = 1_700_000_000;
const SIG_MAX_AGE: u64 = 300;

/// What the timestamp header alone decides: `Ok` when it lets a well-signed request through.
fn timestamp_verdict(raw: Option<&HeaderValue>, required: bool) -> Result<(), Rejection> {
    let Some(raw) = raw else {
        return if required {
            Err(Rejection::MissingTimestamp)
        } else {
            Ok(())
        };
    };
    let text = std::str::from_utf8(raw.as_bytes()).map_err(|_| Rejection::MalformedTimestamp)?;
    let at: i64 = text
        .trim()
        .parse()
        .map_err(|_| Rejection::MalformedTimestamp)?;
    if SIG_NOW.abs_diff(at) > SIG_MAX_AGE {
        return Err(Rejection::StaleTimestamp);
    }
    Ok(())
}

/// Input: one flags byte (algorithm, timestamp required), then signature header, [`SEP`],
/// timestamp header (absent when empty), [`SEP`], body.
///
/// `verify` never panics; it accepts a header only when it carries this body's HMAC (hex, any
/// case, optionally prefixed with this algorithm); the true HMAC is refused only for the
/// timestamp, and exactly as the timestamp rules say.
pub fn check_signature(data: &[u8]) {
    let (flags, rest) = data.split_first().map_or((0, data), |(f, r)| (*f, r));
    let algorithm = match flags % 3 {
        0 => Algorithm::Sha256,
        1 => Algorithm::Sha384,
        _ => Algorithm::Sha512,
    };
    let required = flags & 0x80 != 0;
    let parts = fields(rest, 3);
    let (sig, ts, body) = (parts[0], parts[1], parts[2]);
    let v = Verifier::new(
        SIG_SECRET,
        algorithm,
        "X-Signature",
        "x-timestamp",
        SIG_MAX_AGE,
        required,
    );
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_bytes(sig) {
        headers.insert("x-signature", value);
    }
    let ts_value = (!ts.is_empty())
        .then(|| HeaderValue::from_bytes(ts).ok())
        .flatten();
    if let Some(value) = &ts_value {
        headers.insert("x-timestamp", value.clone());
    }
    let expected = v.sign(body);
    assert_eq!(
        expected.len(),
        algorithm.hex_len(),
        "signature: sign length"
    );
    if v.verify(&headers, body, SIG_NOW).is_ok() {
        let claimed = std::str::from_utf8(sig).unwrap_or_default().trim();
        let digits = claimed.split_once('=').map_or(claimed, |(_, d)| d);
        assert!(
            digits.eq_ignore_ascii_case(&expected),
            "signature: accepted a header that is not the body's HMAC: {claimed:?}"
        );
        assert_eq!(timestamp_verdict(ts_value.as_ref(), required), Ok(()));
    }
    let spellings = [
        expected.clone(),
        expected.to_uppercase(),
        format!("{}={expected}", algorithm.as_str()),
        format!(" {}={} ", algorithm.as_str().to_uppercase(), expected),
    ];
    let spelling = &spellings[usize::from(flags >> 2) % spellings.len()];
    let Ok(good) = HeaderValue::from_str(spelling) else {
        panic!("signature: a hex header value is refused by http");
    };
    headers.insert("x-signature", good);
    let got = v.verify(&headers, body, SIG_NOW).map(|_| ());
    assert_eq!(
        got,
        timestamp_verdict(ts_value.as_ref(), required),
        "signature: the true HMAC {spelling:?} with timestamp {ts_value:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Media ids

/// A media store with one file, and escape hatches beside it: a symlink to a file outside the
/// root and one to the directory above it.
pub struct MediaRig {
    store: MediaStore,
    files: PathBuf,
    _dir: tempfile::TempDir,
}

/// The id of the one real file in the rig's store.
pub const MEDIA_FILE: &str = "inside.txt";

impl MediaRig {
    pub async fn new() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let root = dir.path().join("media");
        let store = MediaStore::open(root, None, 1024 * 1024)
            .await
            .map_err(|e| e.to_string())?;
        store
            .save_as(None, MEDIA_FILE, b"inside", Some("text/plain"), None)
            .await
            .map_err(|e| e.to_string())?;
        let files = store.root().join("files");
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, b"outside").map_err(|e| e.to_string())?;
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&outside, files.join("escape"))
                .map_err(|e| e.to_string())?;
            std::os::unix::fs::symlink(dir.path(), files.join("up")).map_err(|e| e.to_string())?;
        }
        Ok(Self {
            store,
            files,
            _dir: dir,
        })
    }

    /// Input: an id (lossy UTF-8).
    ///
    /// An accepted id is exactly one normal path component (so joining it to the root cannot
    /// leave the root), `get` refuses every other id before touching the filesystem, and a
    /// found file is a regular file inside `files/`.
    pub async fn check(&self, data: &[u8]) {
        let id = text(data);
        let valid = media::valid_id(&id);
        if valid {
            let components: Vec<Component<'_>> = Path::new(&id).components().collect();
            assert!(
                matches!(components.as_slice(), [Component::Normal(c)] if *c == OsStr::new(&id)),
                "media: accepted id {id:?} is not one plain path component: {components:?}"
            );
        }
        match self.store.get(&id, 0).await {
            Err(MediaError::InvalidId) => {
                assert!(!valid, "media: valid id {id:?} refused as invalid")
            }
            Err(_) => assert!(valid, "media: invalid id {id:?} was looked up"),
            Ok(file) => {
                assert!(valid, "media: invalid id {id:?} found a file");
                assert!(
                    file.path.starts_with(&self.files) && file.path.is_file(),
                    "media: id {id:?} resolved to {} outside the store",
                    file.path.display()
                );
                assert_eq!(id, MEDIA_FILE, "media: id {id:?} found a file never saved");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The `where` filter of obs.trace.search

/// The catalogue's `maxLength` of `where`, in characters.
pub const WHERE_MAX_CHARS: usize = 1024;

/// The SQL column names of `trace_rows` a filter may use, and the SQL operators: written out
/// here rather than taken from the filter module, so a fragment is checked against the
/// vocabulary and not against itself.
const WHERE_SQL_COLUMNS: &[&str] = &[
    "kind",
    "session_key",
    "chat_id",
    "message_id",
    "trace_id",
    "agent_id",
    "channel",
    "tool_name",
    "status",
    "finish_reason",
    "error_kind",
    "seq",
    "ts",
    "duration_ms",
    "tokens",
    "cost_usd",
    "synthetic",
];
const WHERE_SQL_OPS: &[&str] = &["=", "<>", "<", ">", "<=", ">="];

/// Why `sql` is not `col op $n AND col op $n+1 ...` over the static vocabulary, with `count`
/// placeholders numbered from `first`, if it is not. Nothing else may appear in it: no byte of
/// the user's expression can reach the SQL.
pub fn where_sql_problem(sql: &str, first: usize, count: usize) -> Option<String> {
    if count == 0 {
        return (sql != "1 = 1").then(|| format!("{sql:?} for an empty filter"));
    }
    let words: Vec<&str> = sql.split(' ').collect();
    if words.len() != count * 4 - 1 {
        return Some(format!("{sql:?} is not {count} comparisons joined by AND"));
    }
    for (i, term) in words.chunks(4).enumerate() {
        let placeholder = format!("${}", first + i);
        let joined = term.get(3).is_none_or(|w| *w == "AND");
        if !(WHERE_SQL_COLUMNS.contains(&term[0])
            && WHERE_SQL_OPS.contains(&term[1])
            && term[2] == placeholder
            && joined)
        {
            return Some(format!(
                "{sql:?}: comparison {} is {term:?}, not `column op {placeholder}`",
                i + 1
            ));
        }
    }
    None
}

/// Input: a `where` expression (lossy UTF-8).
///
/// `parse` never panics; an accepted expression has 1 to 16 terms, each value of its column's
/// type (text at most 256 characters, numbers finite); `to_sql` is the static vocabulary and one
/// placeholder per value, the values in term order (a boolean bound as 0/1); and the canonical
/// form parses back to the same filter (when it is too long to, every term alone does).
pub fn check_trace_where(data: &[u8]) {
    use agent_gateway::store::filter::Value as V;
    let input = text(data);
    let Ok(f) = filter::parse(&input) else {
        return;
    };
    assert!(
        (1..=16).contains(&f.terms.len()),
        "where: {} terms from {input:?}",
        f.terms.len()
    );
    for term in &f.terms {
        let typed = match (&term.value, term.column) {
            (V::Int(_), Column::Seq | Column::Ts | Column::DurationMs | Column::Tokens) => true,
            (V::Num(x), Column::CostUsd) => x.is_finite(),
            (V::Bool(_), Column::Synthetic) => true,
            (V::Text(s), _) => s.chars().count() <= 256,
            _ => false,
        };
        let text_column = !matches!(
            term.column,
            Column::Seq
                | Column::Ts
                | Column::DurationMs
                | Column::Tokens
                | Column::CostUsd
                | Column::Synthetic
        );
        assert!(
            typed && matches!(term.value, V::Text(_)) == text_column,
            "where: {term:?} from {input:?}"
        );
    }
    for first in [1, 7] {
        let (sql, values) = f.to_sql(first);
        assert_eq!(
            sql.matches('$').count(),
            values.len(),
            "where: placeholders and values of {sql:?}"
        );
        if let Some(problem) = where_sql_problem(&sql, first, f.terms.len()) {
            panic!("where: {problem}\n input: {input:?}");
        }
        for (term, value) in f.terms.iter().zip(&values) {
            let expected = match &term.value {
                V::Bool(b) => V::Int(i64::from(*b)),
                other => other.clone(),
            };
            assert!(
                *value == expected,
                "where: {term:?} binds {value:?}\n input: {input:?}"
            );
        }
    }
    let canonical = f.to_string();
    if canonical.chars().count() <= WHERE_MAX_CHARS {
        assert!(
            filter::parse(&canonical).as_ref() == Ok(&f),
            "where: the canonical form {canonical:?} does not parse back\n input: {input:?}"
        );
    } else {
        assert!(
            filter::parse(&canonical).is_err(),
            "where: a canonical form over the limit parsed\n input: {input:?}"
        );
        let mut parts = Vec::new();
        for term in &f.terms {
            let single = Filter {
                terms: vec![term.clone()],
            };
            let one = single.to_string();
            assert!(
                filter::parse(&one).as_ref() == Ok(&single),
                "where: the canonical term {one:?} does not parse back\n input: {input:?}"
            );
            parts.push(one);
        }
        assert_eq!(
            canonical,
            parts.join(" and "),
            "where: the canonical form is not its terms joined by and"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The memory write guard

/// Longest input the time bound is promised for (libFuzzer's default `-max_len`).
pub const GUARD_MAX_INPUT: usize = 4096;
/// Time one judgement of a [`GUARD_MAX_INPUT`]-byte input may take. The guard is a few linear
/// passes (well under a millisecond in a release build); the bound is loose because the CI
/// harness runs a debug build on two shared cores, and tight enough to catch a quadratic path.
pub const GUARD_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

fn guard_severity(v: &agent_gateway::runtime::memory::guard::Verdict) -> u8 {
    use agent_gateway::runtime::memory::guard::Verdict;
    match v {
        Verdict::Clean => 0,
        Verdict::Suspicious(_) => 1,
        Verdict::Malicious(_) => 2,
    }
}

/// Input: a memory text (lossy UTF-8).
///
/// `check` never panics; its verdict is deterministic; it is never less strict than the raw
/// judgement (`check_raw`) nor than the judgement of the folded copy (`fold_lookalikes`), and
/// keeps every rule the raw judgement matched; the fold leaves ASCII alone; a verdict's rule list
/// is non-empty exactly when it is not clean; an input of at most [`GUARD_MAX_INPUT`] bytes is
/// judged within [`GUARD_TIME_LIMIT`].
pub fn check_guard(data: &[u8]) {
    use agent_gateway::runtime::memory::guard::{check, check_raw, fold_lookalikes, Verdict};
    let input = text(data);
    let started = std::time::Instant::now();
    let verdict = check(&input);
    let took = started.elapsed();
    if data.len() <= GUARD_MAX_INPUT {
        assert!(
            took <= GUARD_TIME_LIMIT,
            "guard: {took:?} for {} bytes",
            data.len()
        );
    }
    assert_eq!(check(&input), verdict, "guard: two verdicts for one text");
    assert_eq!(
        verdict == Verdict::Clean,
        verdict.rules().is_empty(),
        "guard: {verdict:?}"
    );
    let raw = check_raw(&input);
    assert!(
        guard_severity(&verdict) >= guard_severity(&raw),
        "guard: {verdict:?} is less strict than the raw {raw:?}"
    );
    for rule in raw.rules() {
        assert!(
            verdict.rules().contains(rule),
            "guard: {verdict:?} lost the raw rule {rule}"
        );
    }
    if let Some(folded) = fold_lookalikes(&input) {
        assert!(!input.is_ascii(), "guard: an ASCII text was folded");
        assert_ne!(folded, input, "guard: a fold that changed nothing");
        let seen = check_raw(&folded);
        assert!(
            guard_severity(&verdict) >= guard_severity(&seen),
            "guard: {verdict:?} is less strict than the folded {seen:?} ({folded:?})"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Address classifier and URL check (net)

/// The policies every input is judged under: closed, each allowance, and everything opened
/// (`allowCidrs` of the whole address space).
fn net_policies() -> Vec<agent_gateway::net::NetPolicy> {
    use agent_gateway::config::net::NetConfig;
    let configs = [
        serde_json::json!({}),
        serde_json::json!({"allowLoopback": true}),
        serde_json::json!({"allowPrivate": true}),
        serde_json::json!({"allowLoopback": true, "allowPrivate": true,
                           "allowCidrs": ["0.0.0.0/0", "::/0"]}),
    ];
    configs
        .into_iter()
        .map(|c| {
            let c: NetConfig = serde_json::from_value(c).unwrap();
            agent_gateway::net::NetPolicy::new(&c)
        })
        .collect()
}

/// The metadata endpoints as IPv4 addresses.
const METADATA_V4: [[u8; 4]; 3] = [
    [169, 254, 169, 254],
    [169, 254, 170, 2],
    [100, 100, 100, 200],
];

/// Input: any bytes, read as an IPv4 address (first 4 bytes), an IPv6 address (first 16), and
/// a URL (lossy UTF-8, as it is and as the host of `http://<text>/`).
///
/// Never panics; a metadata address (in any IPv6 spelling that carries it: mapped, compatible,
/// NAT64, 6to4) is classed metadata and refused by every policy, however open; an IPv6 address
/// carrying an IPv4 address is classed as that address (or stricter, for local-use NAT64); a
/// URL the check accepts names a literal address no policy-refused class, never metadata.
pub fn check_addr_classifier(data: &[u8]) {
    use agent_gateway::net::addr::{classify, classify_v4, classify_v6, embedded_v4, Class};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let policies = net_policies();
    let mut b16 = [0u8; 16];
    for (d, s) in b16.iter_mut().zip(data) {
        *d = *s;
    }
    let v4 = Ipv4Addr::new(b16[0], b16[1], b16[2], b16[3]);
    let v6 = Ipv6Addr::from(b16);
    let mut addresses = vec![IpAddr::V4(v4), IpAddr::V6(v6)];
    let [a, b, c, d] = v4.octets();
    let (hi, lo) = (u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d]));
    let spellings = [
        v4.to_ipv6_mapped(),
        v4.to_ipv6_compatible(),
        Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo),
        Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, hi, lo),
        Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, 1),
    ];
    let v4_class = classify_v4(v4);
    for s in spellings {
        let class = classify_v6(s);
        if v4_class == Class::Metadata {
            assert_eq!(class, Class::Metadata, "addr: {s} carries metadata {v4}");
        }
        addresses.push(IpAddr::V6(s));
    }
    if METADATA_V4.contains(&v4.octets()) {
        assert_eq!(
            v4_class,
            Class::Metadata,
            "addr: {v4} is a metadata address"
        );
    }
    if let Some(inner) = embedded_v4(v6) {
        let inner_class = classify_v4(inner);
        let class = classify_v6(v6);
        let nat64_local = v6.segments()[..3] == [0x64, 0xff9b, 1];
        assert!(
            class == inner_class || (nat64_local && inner_class == Class::Public),
            "addr: {v6} carries {inner} ({inner_class:?}) but is classed {class:?}"
        );
    }
    for ip in addresses {
        let class = classify(ip);
        for p in &policies {
            let refused = p.refused(ip);
            if class == Class::Metadata || class == Class::Unspecified {
                assert_eq!(refused, Some(class), "addr: {ip} ({class:?}) allowed");
            }
            if class == Class::Public {
                assert_eq!(refused, None, "addr: public {ip} refused");
            }
        }
    }
    let raw = text(data);
    for url in [raw.clone(), format!("http://{raw}/")] {
        for p in &policies {
            let Ok(target) = p.check_url(&url) else {
                continue;
            };
            assert!(
                matches!(target.url.scheme(), "http" | "https"),
                "url: {url:?} accepted with scheme {}",
                target.url.scheme()
            );
            assert!(
                target.url.username().is_empty() && target.url.password().is_none(),
                "url: {url:?} accepted with user information"
            );
            if let Some(ip) = target.literal {
                assert_ne!(
                    classify(ip),
                    Class::Metadata,
                    "url: {url:?} reaches metadata"
                );
                assert_eq!(p.refused(ip), None, "url: {url:?} reaches a refused {ip}");
            }
        }
    }
}
