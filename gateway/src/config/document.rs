//! The configuration file as a JSON document (what `config.set/patch/apply/rollback` change):
//! merge patches, dot paths, secret redaction and its reverse (a `[REDACTED]` written back
//! keeps the current value), the paths two documents differ at, and the YAML text written.

use serde_json::{Map, Value};

use super::{store::without_password, REDACTED};

/// Members whose text values are secrets wherever they appear (token secrets, webhook
/// tokens and signing secrets); `{env: NAME}` references are not values and stay readable.
const SECRET_MEMBERS: &[&str] = &["secret", "token", "password", "apiKey"];

/// RFC 7396 merge patch: objects merge recursively, `null` removes a member, anything else
/// replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// Splits a dot path (`rateLimit.maxRequests`); empty segments are refused.
pub fn segments(path: &str) -> Result<Vec<&str>, String> {
    let parts: Vec<&str> = path.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(format!("'{path}' is not a dot path (an empty member name)"));
    }
    Ok(parts)
}

/// The value at `path` under `doc`, if any.
pub fn get<'a>(doc: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(doc, |v, k| v.get(*k))
}

/// Sets the value at `path` (creating objects on the way); the previous value, if any. A
/// segment that crosses a non-object value is an error naming it.
pub fn set(doc: &mut Value, path: &[&str], value: Value) -> Result<Option<Value>, String> {
    let mut at = doc;
    for (i, k) in path.iter().enumerate() {
        if at.is_null() {
            *at = Value::Object(Map::new());
        }
        let Value::Object(m) = at else {
            return Err(format!(
                "'{}' is not an object: cannot set a member under it",
                path[..i].join(".")
            ));
        };
        if i + 1 == path.len() {
            return Ok(m.insert((*k).to_owned(), value));
        }
        at = m.entry((*k).to_owned()).or_insert(Value::Null);
    }
    Ok(None)
}

/// Removes the member at `path`, if there is one.
pub fn remove(doc: &mut Value, path: &[&str]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut at = doc;
    for k in parent {
        match at.get_mut(*k) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Value::Object(m) = at {
        m.remove(*last);
    }
}

/// Replaces secret values by `[REDACTED]` (and the database URL's password).
pub fn redact(doc: &mut Value) {
    redact_members(doc);
    if let Some(Value::String(url)) = doc.pointer_mut("/store/url") {
        *url = without_password(url);
    }
}

fn redact_members(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, child) in m.iter_mut() {
                if SECRET_MEMBERS.contains(&k.as_str()) && child.is_string() {
                    *child = Value::String(REDACTED.to_owned());
                } else {
                    redact_members(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_members),
        _ => {}
    }
}

/// A copy of `doc`, redacted.
pub fn redacted(doc: &Value) -> Value {
    let mut d = doc.clone();
    redact(&mut d);
    d
}

/// Puts the current values back where `new` carries `[REDACTED]` (a redacted read edited and
/// written back). Array elements are matched by their `id` member when they have one (tokens),
/// by position otherwise. A placeholder with no current value to keep is an error naming its
/// path; so is a database URL left without its password.
pub fn restore_redacted(new: &mut Value, current: &Value) -> Result<(), String> {
    restore_at(new, Some(current), &mut Vec::new())?;
    if let (Some(Value::String(url)), Some(Value::String(cur))) = (
        new.pointer("/store/url").cloned(),
        current.pointer("/store/url"),
    ) {
        if url != *cur && url == without_password(cur) {
            if let Some(slot) = new.pointer_mut("/store/url") {
                *slot = Value::String(cur.clone());
            }
        }
    }
    Ok(())
}

fn restore_at(
    new: &mut Value,
    current: Option<&Value>,
    path: &mut Vec<String>,
) -> Result<(), String> {
    match new {
        Value::String(s) if s == REDACTED => match current {
            Some(c) if c.as_str().is_some_and(|c| c != REDACTED) => {
                *new = c.clone();
                Ok(())
            }
            _ => Err(format!(
                "{}: \"{REDACTED}\" keeps a current secret, and there is none here",
                path.join(".")
            )),
        },
        Value::Object(m) => {
            for (k, child) in m.iter_mut() {
                path.push(k.clone());
                restore_at(child, current.and_then(|c| c.get(k)), path)?;
                path.pop();
            }
            Ok(())
        }
        Value::Array(items) => {
            for (i, child) in items.iter_mut().enumerate() {
                let by_id = child.get("id").and_then(Value::as_str).and_then(|id| {
                    current?
                        .as_array()?
                        .iter()
                        .find(|c| c.get("id").and_then(Value::as_str) == Some(id))
                });
                let counterpart = match child.get("id") {
                    Some(_) => by_id,
                    None => current.and_then(|c| c.get(i)),
                };
                path.push(format!("{i}"));
                restore_at(child, counterpart, path)?;
                path.pop();
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The dot paths where `a` and `b` differ: objects are compared member by member, anything
/// else (arrays too) as a whole; a member on one side only is named by its leaves. Sorted.
pub fn changed_paths(a: &Value, b: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff_at(a, b, &mut Vec::new(), true, &mut out);
    let mut paths: Vec<String> = out.iter().map(|p| p.join(".")).collect();
    paths.sort();
    paths
}

/// The members (as path segments) where `b` differs from `a`, as [`changed_paths`] compares
/// them but with a member on one side only named whole: setting each to its value in `b`, or
/// removing it where `b` has none, turns `a` into `b`.
pub fn changed_members(a: &Value, b: &Value) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    diff_at(a, b, &mut Vec::new(), false, &mut out);
    out
}

fn diff_at(
    a: &Value,
    b: &Value,
    path: &mut Vec<String>,
    leaves_of_one_side: bool,
    out: &mut Vec<Vec<String>>,
) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                path.push(k.clone());
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => diff_at(p, q, path, leaves_of_one_side, out),
                    (Some(v), None) | (None, Some(v)) if leaves_of_one_side => leaves(v, path, out),
                    (Some(_), None) | (None, Some(_)) => out.push(path.clone()),
                    (None, None) => {}
                }
                path.pop();
            }
        }
        _ if a != b => out.push(path.clone()),
        _ => {}
    }
}

/// The leaf paths of a member present on one side only (an empty object is a leaf).
fn leaves(v: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                path.push(k.clone());
                leaves(child, path, out);
                path.pop();
            }
        }
        _ => out.push(path.clone()),
    }
}

/// The top-level sections among `paths`, sorted and unique.
pub fn sections_of(paths: &[String]) -> Vec<String> {
    let mut s: Vec<String> = paths
        .iter()
        .map(|p| p.split('.').next().unwrap_or_default().to_owned())
        .collect();
    s.sort();
    s.dedup();
    s
}

/// The document as YAML text. Checked to read back to the same document, so a value the
/// writer cannot represent faithfully is refused instead of changing meaning on disk.
pub fn to_yaml(doc: &Value) -> Result<String, String> {
    let text = if doc.as_object().is_some_and(Map::is_empty) {
        String::new()
    } else {
        serde_saphyr::to_string(doc).map_err(|e| format!("cannot write YAML: {e}"))?
    };
    let back: Value = if text.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_saphyr::from_str_with_options(&text, super::yaml_options())
            .map_err(|e| format!("the YAML written does not read back: {e}"))?
    };
    if back != *doc {
        return Err("the YAML written does not read back to the same configuration".into());
    }
    Ok(text)
}

/// The document of the file's YAML text (an empty file is an empty document).
pub fn from_yaml(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let v: Value = serde_saphyr::from_str_with_options(text, super::yaml_options())
        .map_err(|e| format!("invalid YAML: {e}"))?;
    Ok(match v {
        Value::Null => Value::Object(Map::new()),
        v => v,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7396() {
        let mut doc = json!({"a": {"b": 1, "c": [1, 2]}, "d": 1});
        merge_patch(
            &mut doc,
            &json!({"a": {"b": null, "c": [3], "e": {"f": true}}, "d": "x"}),
        );
        assert_eq!(doc, json!({"a": {"c": [3], "e": {"f": true}}, "d": "x"}));
    }

    #[test]
    fn set_creates_objects_and_returns_the_previous_value() {
        let mut doc = json!({"gateway": {"rateLimit": {"maxRequests": 5}}});
        let prev = set(&mut doc, &["gateway", "rateLimit", "maxRequests"], json!(9)).unwrap();
        assert_eq!(prev, Some(json!(5)));
        assert_eq!(
            set(&mut doc, &["agentDefaults", "maxSteps"], json!(3)).unwrap(),
            None
        );
        assert_eq!(doc["agentDefaults"]["maxSteps"], 3);
        assert!(set(
            &mut doc,
            &["gateway", "rateLimit", "maxRequests", "x"],
            json!(1)
        )
        .unwrap_err()
        .contains("gateway.rateLimit.maxRequests"));
    }

    #[test]
    fn redaction_and_restoration_round_trip() {
        let current = json!({
            "gateway": {"tokens": [
                {"id": "a", "secret": "s-a-0123456789012345678901234567890"},
                {"id": "b", "secret": "s-b-0123456789012345678901234567890"}
            ]},
            "webhooks": {"token": "w-0123456789012345678901234567890", "mappings": [{"id": "m", "secret": {"env": "X"}}]},
            "store": {"url": "postgres://u:pw@h/db"}
        });
        let shown = redacted(&current);
        assert_eq!(shown["gateway"]["tokens"][0]["secret"], REDACTED);
        assert_eq!(shown["webhooks"]["token"], REDACTED);
        assert_eq!(
            shown["webhooks"]["mappings"][0]["secret"],
            json!({"env": "X"})
        );
        assert!(!shown.to_string().contains("pw@"));
        // Reordered tokens keep their own secrets (matched by id), and the URL its password.
        let mut edited = shown.clone();
        edited["gateway"]["tokens"] =
            json!([shown["gateway"]["tokens"][1], shown["gateway"]["tokens"][0]]);
        restore_redacted(&mut edited, &current).unwrap();
        assert_eq!(
            edited["gateway"]["tokens"][0],
            current["gateway"]["tokens"][1]
        );
        assert_eq!(edited["store"]["url"], current["store"]["url"]);
        // A placeholder with nothing to keep is refused with its path.
        let mut new_token = shown.clone();
        new_token["gateway"]["tokens"][0]["id"] = json!("c");
        let e = restore_redacted(&mut new_token, &current).unwrap_err();
        assert!(e.starts_with("gateway.tokens.0.secret"), "{e}");
    }

    #[test]
    fn changed_paths_name_leaves_and_whole_arrays() {
        let a = json!({"x": {"y": 1, "z": 2}, "l": [1], "gone": true});
        let b = json!({"x": {"y": 1, "z": 3}, "l": [1, 2], "new": {"k": 1}});
        assert_eq!(changed_paths(&a, &b), vec!["gone", "l", "new.k", "x.z"]);
        assert_eq!(
            sections_of(&changed_paths(&a, &b)),
            vec!["gone", "l", "new", "x"]
        );
    }

    #[test]
    fn yaml_round_trips() {
        let doc = json!({"gateway": {"port": 8080, "host": "127.0.0.1", "tokens": [{"id": "on", "secret": "yes", "scopes": ["*"]}]}, "n": "0123"});
        let text = to_yaml(&doc).unwrap();
        assert_eq!(from_yaml(&text).unwrap(), doc);
        assert_eq!(to_yaml(&json!({})).unwrap(), "");
    }
}
