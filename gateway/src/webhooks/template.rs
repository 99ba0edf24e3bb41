//! `{{expr}}` templates that turn a webhook request into text (for example an agent prompt).
//!
//! The payload and headers come from the sender, so rendering must be cheap and bounded on any
//! input: one pass over the template, no re-scanning of substituted text, an output cap, a cap on
//! expression size, no recursion on the payload, and no panics. Secret-bearing headers always
//! render empty so that a template cannot copy a credential into the output.

use std::collections::BTreeMap;
use std::io;

use serde_json::Value;

/// What a template may read.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    /// The request body parsed as JSON.
    pub payload: &'a Value,
    /// Request headers, keys lowercased.
    pub headers: &'a BTreeMap<String, String>,
    /// Query string parameters.
    pub query: &'a BTreeMap<String, String>,
    /// The path after the webhook base path (normalized: no leading/trailing slash, lowercased).
    pub path: &'a str,
    /// Current time, ISO 8601.
    pub now: &'a str,
}

/// Largest rendered output, in bytes; longer output is cut at a char boundary.
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// Longer expressions render empty: no legitimate path needs more, and it caps the work.
const MAX_EXPR_BYTES: usize = 512;

/// Paths with more steps (keys plus indexes) render empty.
const MAX_PATH_STEPS: usize = 64;

/// Header names that always render empty (secrets).
pub fn is_sensitive_header(name: &str) -> bool {
    let name = name.trim().to_ascii_lowercase();
    matches!(
        name.as_str(),
        "authorization" | "proxy-authorization" | "cookie" | "set-cookie"
    ) || ["signature", "token", "secret", "api-key", "apikey"]
        .iter()
        .any(|word| name.contains(word))
}

/// Renders `template` once: `{{expr}}` placeholders replaced, everything else copied. Output
/// bounded by MAX_OUTPUT_BYTES (cut at a char boundary).
///
/// Expressions: `payload` (the whole body), `payload.a.b[0]`, `headers.<name>`, `query.<key>`,
/// `path`, `now`; anything else is a path into the payload (`{{action}}`). Unresolvable or null
/// values render empty; strings as-is; numbers and booleans as JSON; objects and arrays as
/// compact JSON. An unclosed `{{` is copied literally.
pub fn render(template: &str, ctx: &Context<'_>) -> String {
    let mut out = Output::default();
    let mut rest = template;
    while !out.is_full() {
        let Some(open) = rest.find("{{") else {
            out.push_str(rest);
            break;
        };
        out.push_str(&rest[..open]);
        let inside = &rest[open + 2..];
        let Some(close) = inside.find("}}") else {
            out.push_str(&rest[open..]);
            break;
        };
        expand(inside[..close].trim(), ctx, &mut out);
        rest = &inside[close + 2..];
    }
    out.into_string()
}

/// Writes the value of one trimmed expression.
fn expand(expr: &str, ctx: &Context<'_>, out: &mut Output) {
    if expr.is_empty() || expr.len() > MAX_EXPR_BYTES {
        return;
    }
    match expr {
        "path" => out.push_str(ctx.path),
        "now" => out.push_str(ctx.now),
        "payload" => write_value(ctx.payload, out),
        _ => {
            if let Some(name) = expr.strip_prefix("headers.") {
                let name = name.to_ascii_lowercase();
                if !is_sensitive_header(&name) {
                    if let Some(value) = ctx.headers.get(&name) {
                        out.push_str(value);
                    }
                }
            } else if let Some(key) = expr.strip_prefix("query.") {
                if let Some(value) = ctx.query.get(key) {
                    out.push_str(value);
                }
            } else {
                // `payload.a`, `payload[0]`, or a bare path such as `action`.
                let path = expr
                    .strip_prefix("payload.")
                    .or_else(|| expr.strip_prefix("payload").filter(|p| p.starts_with('[')))
                    .unwrap_or(expr);
                if let Some(value) = lookup(ctx.payload, path) {
                    write_value(value, out);
                }
            }
        }
    }
}

/// Follows `a.b[0][1].c` from `root`. A key on an array is read as an index (`items.0`).
/// Returns `None` for anything missing or malformed, or for more than MAX_PATH_STEPS steps.
fn lookup<'v>(root: &'v Value, path: &str) -> Option<&'v Value> {
    let mut current = root;
    let mut steps = 0usize;
    let mut step = |current: &'v Value, key: Key<'_>| -> Option<&'v Value> {
        steps += 1;
        if steps > MAX_PATH_STEPS {
            return None;
        }
        match (current, key) {
            (Value::Object(map), Key::Name(name)) => map.get(name),
            (Value::Array(items), Key::Name(name)) => items.get(parse_index(name)?),
            (Value::Array(items), Key::Index(index)) => items.get(index),
            _ => None,
        }
    };
    for segment in path.split('.') {
        let (name, mut indexes) = segment.split_at(segment.find('[').unwrap_or(segment.len()));
        if name.is_empty() && indexes.is_empty() {
            return None;
        }
        if !name.is_empty() {
            current = step(current, Key::Name(name))?;
        }
        while !indexes.is_empty() {
            let inner = indexes.strip_prefix('[')?;
            let end = inner.find(']')?;
            current = step(current, Key::Index(parse_index(&inner[..end])?))?;
            indexes = &inner[end + 1..];
        }
    }
    Some(current)
}

/// One step of a path.
#[derive(Clone, Copy)]
enum Key<'p> {
    Name(&'p str),
    Index(usize),
}

/// Plain decimal digits only (no sign, no spaces); `None` on overflow.
fn parse_index(text: &str) -> Option<usize> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A value as placeholder text: null is empty, strings are raw, the rest is compact JSON.
fn write_value(value: &Value, out: &mut Output) {
    match value {
        Value::Null => {}
        Value::String(text) => out.push_str(text),
        other => write_json(other, out),
    }
}

/// Compact JSON, same text as `serde_json::to_string`, written with an explicit stack so that
/// depth costs heap (bounded by the output cap) rather than call stack, and stopping as soon as
/// the output is full.
fn write_json(value: &Value, out: &mut Output) {
    enum Open<'v> {
        Array(std::slice::Iter<'v, Value>),
        Object(serde_json::map::Iter<'v>),
    }
    let mut stack: Vec<Open<'_>> = Vec::new();
    let mut next = Some(value);
    let mut first = true;
    while !out.is_full() {
        if let Some(value) = next.take() {
            match value {
                Value::Array(items) => {
                    out.push_str("[");
                    stack.push(Open::Array(items.iter()));
                    first = true;
                }
                Value::Object(map) => {
                    out.push_str("{");
                    stack.push(Open::Object(map.iter()));
                    first = true;
                }
                // Scalars are not recursive; a write error only means the output is full.
                scalar => {
                    let _ = serde_json::to_writer(&mut *out, scalar);
                }
            }
            continue;
        }
        let Some(top) = stack.last_mut() else {
            return;
        };
        let item = match top {
            Open::Array(items) => items.next().map(|item| (None, item)),
            Open::Object(entries) => entries.next().map(|(key, item)| (Some(key), item)),
        };
        match item {
            Some((key, item)) => {
                if !first {
                    out.push_str(",");
                }
                if let Some(key) = key {
                    let _ = serde_json::to_writer(&mut *out, key);
                    out.push_str(":");
                }
                first = false;
                next = Some(item);
            }
            None => {
                out.push_str(match top {
                    Open::Array(_) => "]",
                    Open::Object(_) => "}",
                });
                stack.pop();
                first = false;
            }
        }
    }
}

/// Output buffer that silently stops at MAX_OUTPUT_BYTES. Bytes, not `String`, because the JSON
/// writer may be cut mid-character; `into_string` drops any partial character at the end.
#[derive(Default)]
struct Output {
    bytes: Vec<u8>,
}

impl Output {
    fn is_full(&self) -> bool {
        self.bytes.len() >= MAX_OUTPUT_BYTES
    }

    /// Appends what fits and returns how many bytes that was.
    fn push_bytes(&mut self, bytes: &[u8]) -> usize {
        let room = MAX_OUTPUT_BYTES.saturating_sub(self.bytes.len());
        let taken = bytes.get(..room).unwrap_or(bytes);
        self.bytes.extend_from_slice(taken);
        taken.len()
    }

    fn push_str(&mut self, text: &str) {
        self.push_bytes(text.as_bytes());
    }

    fn into_string(self) -> String {
        match String::from_utf8(self.bytes) {
            Ok(text) => text,
            // Every piece written was UTF-8, so only the cut at the end can be invalid.
            Err(err) => {
                let valid = err.utf8_error().valid_up_to();
                let mut bytes = err.into_bytes();
                bytes.truncate(valid);
                String::from_utf8(bytes).unwrap_or_default()
            }
        }
    }
}

impl io::Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        match self.push_bytes(buf) {
            0 => Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "template output is full",
            )),
            taken => Ok(taken),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::{Duration, Instant};

    struct Fixture {
        payload: Value,
        headers: BTreeMap<String, String>,
        query: BTreeMap<String, String>,
    }

    impl Fixture {
        fn new(payload: Value) -> Self {
            let headers = [
                ("x-github-event", "push"),
                ("content-type", "application/json"),
                ("authorization", "Bearer top-secret"),
                ("proxy-authorization", "Basic c2VjcmV0"),
                ("cookie", "session=abc"),
                ("set-cookie", "session=abc"),
                ("x-hub-signature-256", "sha256=abcdef"),
                ("x-webhook-signature", "abcdef"),
                ("x-gitlab-token", "glpat-123"),
                ("x-api-key", "key-1"),
                ("x-apikey", "key-2"),
                ("x-client-secret", "shh"),
            ];
            let query = [("ref", "main"), ("a.b", "dotted")];
            Self {
                payload,
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                query: query
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }
        }

        fn render(&self, template: &str) -> String {
            let ctx = Context {
                payload: &self.payload,
                headers: &self.headers,
                query: &self.query,
                path: "github/push",
                now: "2024-01-02T03:04:05Z",
            };
            render(template, &ctx)
        }
    }

    fn sample() -> Fixture {
        Fixture::new(json!({
            "action": "opened",
            "number": 42,
            "ratio": 1.5,
            "draft": false,
            "missing": null,
            "repository": { "full_name": "octo/hello", "private": true },
            "items": [ { "name": "first" }, { "name": "second" } ],
            "a": { "b": [ [ 0, { "c": "deep" } ] ] },
            "text": "say \"hi\"\n{{headers.authorization}} {{now}}",
            "headers": { "x": "payload headers" },
            "€": "euro",
        }))
    }

    #[test]
    fn payload_paths_and_indexes() {
        let f = sample();
        assert_eq!(f.render("{{payload.action}}"), "opened");
        assert_eq!(f.render("{{payload.repository.full_name}}"), "octo/hello");
        assert_eq!(f.render("{{payload.items[1].name}}"), "second");
        assert_eq!(f.render("{{payload.items.0.name}}"), "first");
        assert_eq!(f.render("{{payload.a.b[0][1].c}}"), "deep");
        assert_eq!(f.render("{{payload.a.b[0][0]}}"), "0");
        assert_eq!(f.render("{{payload.€}}"), "euro");
    }

    #[test]
    fn root_array_index() {
        let f = Fixture::new(json!([10, [20, 30]]));
        assert_eq!(f.render("{{payload[1][0]}}"), "20");
        assert_eq!(f.render("{{[0]}}"), "10");
        assert_eq!(f.render("{{payload}}"), "[10,[20,30]]");
    }

    #[test]
    fn bare_expressions_read_the_payload() {
        let f = sample();
        assert_eq!(f.render("{{action}}"), "opened");
        assert_eq!(f.render("{{repository.full_name}}"), "octo/hello");
        assert_eq!(f.render("{{items[0].name}}"), "first");
        // Only `headers.` is the header map; a bare `headers` is a payload key.
        assert_eq!(f.render("{{headers.x}}"), "");
        assert_eq!(f.render("{{payload.headers.x}}"), "payload headers");
        assert_eq!(f.render("{{headers}}"), r#"{"x":"payload headers"}"#);
    }

    #[test]
    fn value_kinds() {
        let f = sample();
        assert_eq!(f.render("{{number}}"), "42");
        assert_eq!(f.render("{{ratio}}"), "1.5");
        assert_eq!(f.render("{{draft}}"), "false");
        assert_eq!(f.render("{{repository.private}}"), "true");
        assert_eq!(f.render("[{{missing}}]"), "[]");
        assert_eq!(
            f.render("{{repository}}"),
            r#"{"full_name":"octo/hello","private":true}"#
        );
        assert_eq!(
            f.render("{{items}}"),
            r#"[{"name":"first"},{"name":"second"}]"#
        );
        // Strings are raw: no quotes, no escaping.
        assert_eq!(
            f.render("{{text}}"),
            "say \"hi\"\n{{headers.authorization}} {{now}}"
        );
    }

    #[test]
    fn compact_json_matches_serde_json() {
        let values = [
            json!({}),
            json!([]),
            json!({"a": [], "b": {}, "c": [null, true, -1, 2.5e-8, "q\"\\\u{1}é"]}),
            json!([[[[1]]], {"x": {"y": [{"z": null}]}}]),
            json!({"k\"ey": "v\nal", "€": [1, 2, 3]}),
            sample().payload,
        ];
        for value in values {
            let mut out = Output::default();
            write_json(&value, &mut out);
            assert_eq!(
                out.into_string(),
                serde_json::to_string(&value).unwrap(),
                "{value}"
            );
        }
    }

    #[test]
    fn headers_query_path_now() {
        let f = sample();
        assert_eq!(f.render("{{headers.x-github-event}}"), "push");
        assert_eq!(f.render("{{headers.X-GitHub-Event}}"), "push");
        assert_eq!(f.render("{{headers.content-type}}"), "application/json");
        assert_eq!(f.render("{{headers.x-absent}}"), "");
        assert_eq!(f.render("{{query.ref}}"), "main");
        assert_eq!(f.render("{{query.a.b}}"), "dotted");
        assert_eq!(f.render("{{query.REF}}"), "");
        assert_eq!(f.render("{{path}}"), "github/push");
        assert_eq!(f.render("{{now}}"), "2024-01-02T03:04:05Z");
        assert_eq!(
            f.render("Event {{headers.x-github-event}} on {{path}} at {{now}}."),
            "Event push on github/push at 2024-01-02T03:04:05Z."
        );
    }

    #[test]
    fn whitespace_inside_braces_is_trimmed() {
        let f = sample();
        assert_eq!(f.render("{{ payload.action }}"), "opened");
        assert_eq!(f.render("{{\tnow\n}}"), "2024-01-02T03:04:05Z");
        assert_eq!(f.render("{{  headers.x-github-event }}"), "push");
        assert_eq!(f.render("{{ }}"), "");
    }

    #[test]
    fn unresolvable_is_empty() {
        let f = sample();
        for expr in [
            "payload.nope",
            "payload.action.more",
            "payload.repository[0]",
            "payload.items[2]",
            "payload.items[-1]",
            "payload.items[x]",
            "payload.items[]",
            "payload.items[0",
            "payload.items[0]x",
            "payload.items[ 0]",
            "payload.items[+0]",
            "payload.items[99999999999999999999]",
            "payload.items.99999999999999999999",
            "payload.items.-1",
            "payload.",
            "payload..action",
            "payload.action.",
            ".action",
            "nope",
            "query.nope",
        ] {
            assert_eq!(f.render(&format!("<{{{{{expr}}}}}>")), "<>", "{expr}");
        }
    }

    #[test]
    fn substituted_text_is_not_expanded_again() {
        let f = sample();
        let out = f.render("{{text}}|{{now}}");
        assert_eq!(
            out,
            "say \"hi\"\n{{headers.authorization}} {{now}}|2024-01-02T03:04:05Z"
        );
        let f = Fixture::new(json!({"a": "{{b}}", "b": "{{a}}"}));
        assert_eq!(f.render("{{a}}{{b}}"), "{{b}}{{a}}");
    }

    #[test]
    fn unclosed_braces_are_literal() {
        let f = sample();
        assert_eq!(f.render("a {{ b"), "a {{ b");
        assert_eq!(f.render("{{action}} and {{action"), "opened and {{action");
        assert_eq!(f.render("{{"), "{{");
        assert_eq!(f.render("}}"), "}}");
        assert_eq!(f.render("}}{{"), "}}{{");
        assert_eq!(f.render("{ {action} }"), "{ {action} }");
    }

    #[test]
    fn sensitive_headers_render_empty() {
        let f = sample();
        for name in [
            "authorization",
            "Authorization",
            "proxy-authorization",
            "cookie",
            "set-cookie",
            "x-hub-signature-256",
            "x-webhook-signature",
            "x-gitlab-token",
            "x-api-key",
            "x-apikey",
            "x-client-secret",
        ] {
            assert_eq!(
                f.render(&format!("[{{{{headers.{name}}}}}]")),
                "[]",
                "{name}"
            );
            assert!(is_sensitive_header(name), "{name}");
        }
        for name in [
            "x-github-event",
            "content-type",
            "user-agent",
            "x-request-id",
        ] {
            assert!(!is_sensitive_header(name), "{name}");
        }
        assert!(is_sensitive_header("X-Hub-Signature"));
        assert!(is_sensitive_header(" Cookie "));
        assert!(!is_sensitive_header("cookies-enabled"));
    }

    #[test]
    fn odd_brace_sequences_do_not_panic() {
        let f = sample();
        assert_eq!(f.render("{{}}"), "");
        assert_eq!(f.render("{{{x}}}"), "}");
        assert_eq!(f.render("{{{action}}}"), "}");
        assert_eq!(f.render("{{{{}}}}"), "}}");
        assert_eq!(f.render("é{{action}}é"), "éopenedé");
        assert_eq!(f.render("€{{€}}€"), "€euro€");
        assert_eq!(f.render("{{é"), "{{é");
        assert_eq!(f.render("é}}{{é"), "é}}{{é");
        assert_eq!(f.render("{{ 日本 }}"), "");
        assert_eq!(f.render(""), "");
        assert_eq!(f.render("plain text"), "plain text");
        // Every prefix of a tricky template renders without panicking.
        let tricky = "a{{é}}b{{{€}}}}{{ {{x}} }}{{payload.items[0}}";
        for (i, _) in tricky.char_indices() {
            let _ = f.render(&tricky[..i]);
        }
    }

    #[test]
    fn long_expressions_render_empty() {
        // A key such that `payload.<key>` is exactly the limit resolves; one byte more does not.
        let key = "k".repeat(MAX_EXPR_BYTES - "payload.".len());
        let longer = "k".repeat(key.len() + 1);
        let f = Fixture::new(json!({ key.clone(): "fits", longer.clone(): "too long" }));
        assert_eq!(f.render(&format!("{{{{payload.{key}}}}}")), "fits");
        assert_eq!(f.render(&format!("{{{{payload.{longer}}}}}")), "");
        assert_eq!(f.render(&format!("{{{{ payload.{key} }}}}")), "fits");
    }

    /// Builds `{"a": {"a": ... "leaf" ...}}` `depth` levels deep without recursion.
    fn nested(depth: usize) -> Value {
        // Not `json!({"a": value})`: that serializes `value` by reference, recursively.
        let mut value = json!("leaf");
        for _ in 0..depth {
            let mut map = serde_json::Map::new();
            map.insert("a".to_string(), value);
            value = Value::Object(map);
        }
        value
    }

    /// Takes a deep value apart one level at a time (`Value`'s own drop is recursive).
    fn dismantle(mut value: Value) {
        loop {
            value = match value {
                Value::Object(mut map) => match map.remove("a") {
                    Some(inner) => inner,
                    None => return,
                },
                _ => return,
            };
        }
    }

    #[test]
    fn deep_payload_and_path_limits() {
        let f = Fixture::new(nested(2000));
        let path = |n: usize| vec!["a"; n].join(".");
        assert_eq!(f.render(&format!("{{{{payload.{}}}}}", path(100))), "");
        assert_eq!(f.render(&format!("{{{{payload.{}}}}}", path(65))), "");
        assert_eq!(f.render(&format!("{{{{{}}}}}", path(65))), "");
        let at_64 = f.render(&format!("{{{{payload.{}}}}}", path(64)));
        assert!(at_64.starts_with(r#"{"a":{"a":"#));
        assert!(at_64.ends_with(&format!("\"leaf\"{}", "}".repeat(2000 - 64))));
        assert_eq!(at_64.len(), (2000 - 64) * 6 + "\"leaf\"".len());
        // Indexes count as steps too.
        let g = Fixture::new(json!({ "x": (0..100).map(|_| json!([])).collect::<Vec<_>>() }));
        let mut arr = json!(1);
        for _ in 0..65 {
            arr = Value::Array(vec![arr]);
        }
        let g2 = Fixture::new(arr);
        assert_eq!(
            g2.render(&format!("{{{{payload{}}}}}", "[0]".repeat(64))),
            "[1]"
        );
        assert_eq!(
            g2.render(&format!("{{{{payload{}}}}}", "[0]".repeat(63))),
            "[[1]]"
        );
        assert_eq!(
            g2.render(&format!("{{{{payload{}}}}}", "[0]".repeat(65))),
            ""
        );
        assert_eq!(g.render("{{x[99]}}"), "[]");
        dismantle(f.payload);
    }

    #[test]
    fn very_deep_payload_renders_without_recursion() {
        let f = Fixture::new(nested(100_000));
        let out = f.render("{{payload}}");
        assert_eq!(out.len(), MAX_OUTPUT_BYTES);
        assert!(out.starts_with(r#"{"a":{"a":"#));
        dismantle(f.payload);
    }

    #[test]
    fn huge_array_is_cut_quickly() {
        let f = Fixture::new(json!({ "n": (0..1_000_000u32).collect::<Vec<_>>() }));
        let start = Instant::now();
        let out = f.render("{{payload}}");
        let elapsed = start.elapsed();
        assert_eq!(out.len(), MAX_OUTPUT_BYTES);
        assert!(out.starts_with(r#"{"n":[0,1,2,3,"#));
        let again = f.render("{{n}}");
        assert!(again.starts_with("[0,1,2"));
        assert!(again.len() <= MAX_OUTPUT_BYTES);
        assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    }

    #[test]
    fn output_is_cut_at_a_char_boundary() {
        // 3-byte chars: 64 KiB is not a multiple of 3, so the cut lands mid-character.
        let f = Fixture::new(json!({ "s": "€".repeat(30_000), "arr": ["€".repeat(30_000)] }));
        let out = f.render("{{s}}");
        assert_eq!(out.len(), MAX_OUTPUT_BYTES / 3 * 3);
        assert!(out.chars().all(|c| c == '€'));
        let out = f.render("{{arr}}");
        assert!(out.len() <= MAX_OUTPUT_BYTES && out.len() > MAX_OUTPUT_BYTES - 3);
        assert!(out.starts_with("[\"€€"));
        let out = f.render(&"é".repeat(40_000));
        assert_eq!(out.len(), MAX_OUTPUT_BYTES);
        let out = f.render(&format!("x{}", "€".repeat(30_000)));
        assert_eq!(out.len(), 1 + (MAX_OUTPUT_BYTES - 1) / 3 * 3);
    }

    #[test]
    fn many_placeholders_are_bounded() {
        let f = Fixture::new(json!({ "s": "x".repeat(100) }));
        let template = "{{s}}".repeat(10_000);
        let out = f.render(&template);
        assert_eq!(out.len(), MAX_OUTPUT_BYTES);
        let few = "{{ s }}-".repeat(10);
        assert_eq!(f.render(&few).len(), 10 * 101);
        // Many empty placeholders: output stays small.
        let out = f.render(&"{{nope}}".repeat(10_000));
        assert_eq!(out, "");
    }
}
