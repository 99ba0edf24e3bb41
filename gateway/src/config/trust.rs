//! Trust classes of configuration keys. An API token is never the machine's owner: the keys
//! that reach the host (addresses it binds, paths it reads or serves, programs it runs, the
//! database, the secret store, what the API may set for providers) are *file-only*: only the
//! configuration file sets them. `config.set/patch/apply/rollback` refuse a change of one
//! (-32602 naming the path), and every node takes them from its own file, never from the
//! document stored for the fleet. Every other key may be changed through the API; provider
//! and token entries then pass the same policy as `providers.*` and `tokens.*`.
//!
//! The list is declared once, here; `config.schema` marks these keys (`x-fileOnly`) and the
//! README lists them.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::document as doc;

/// One file-only key: its dot path (`*` matches any member of a map) and why.
#[derive(Debug, Clone, Copy)]
pub struct FileOnly {
    pub path: &'static str,
    pub why: &'static str,
}

/// The file-only keys. A path covers everything below it.
pub const FILE_ONLY: &[FileOnly] = &[
    FileOnly {
        path: "gateway.enabled",
        why: "it turns the server itself off",
    },
    FileOnly {
        path: "gateway.host",
        why: "the address the process binds",
    },
    FileOnly {
        path: "gateway.port",
        why: "the port the process binds",
    },
    FileOnly {
        path: "gateway.dataDir",
        why: "where the database, the secrets and the files live",
    },
    FileOnly {
        path: "gateway.trustedProxies",
        why: "which peers may name the client's address (rate limits and logs rely on it)",
    },
    FileOnly {
        path: "gateway.tls",
        why: "certificates and keys on the host",
    },
    FileOnly {
        path: "gateway.web.distDir",
        why: "a host directory served over HTTP without a token",
    },
    FileOnly {
        path: "local",
        why: "programs and model files on the host (local.python names an executable)",
    },
    FileOnly {
        path: "providerPolicy",
        why: "what the API may set for providers",
    },
    FileOnly {
        path: "net",
        why: "which addresses the gateway's own fetches may reach (loopback, private networks)",
    },
    FileOnly {
        path: "secrets",
        why: "the secret store's master key file",
    },
    FileOnly {
        path: "store",
        why: "the database itself",
    },
    FileOnly {
        path: "scheduler.jobs.*.wakeGate",
        why: "a program the gateway runs on the host",
    },
    FileOnly {
        path: "agents.*.adminTrust",
        why: "lets an agent's runs call admin and autonomy control methods through tool.invoke",
    },
    FileOnly {
        path: "workspaces.privatePaths",
        why: "workspace files (credentials, gate scripts) no API caller may read",
    },
];

fn segments(pattern: &str) -> Vec<&str> {
    pattern.split('.').collect()
}

/// Every concrete path (as segments, so member names holding dots stay whole) under `doc`
/// that `pattern` names, with its value; a `*` segment walks the members of an object.
fn matches<'a>(
    doc: &'a Value,
    pattern: &[&str],
    at: &mut Vec<String>,
    out: &mut BTreeMap<Vec<String>, &'a Value>,
) {
    let Some((first, rest)) = pattern.split_first() else {
        out.insert(at.clone(), doc);
        return;
    };
    let Value::Object(m) = doc else {
        return;
    };
    for (k, v) in m {
        if *first == "*" || first == k {
            at.push(k.clone());
            matches(v, rest, at, out);
            at.pop();
        }
    }
}

fn matched<'a>(doc: &'a Value, pattern: &str) -> BTreeMap<Vec<String>, &'a Value> {
    let mut out = BTreeMap::new();
    matches(doc, &segments(pattern), &mut Vec::new(), &mut out);
    out
}

/// The first file-only key whose value differs between two configurations (each as the JSON
/// of a whole `Config`, defaults included, so a key left out and a key set to its default are
/// the same); the error names the path and says where to change it.
pub fn check_unchanged(current: &Value, next: &Value) -> Result<(), String> {
    for key in FILE_ONLY {
        let (before, after) = (matched(current, key.path), matched(next, key.path));
        if before == after {
            continue;
        }
        let path = before
            .iter()
            .find(|(p, v)| after.get(*p) != Some(*v))
            .map(|(p, _)| p)
            .or_else(|| after.keys().find(|p| !before.contains_key(*p)));
        // Named down to the member that changed (`gateway.tls.requireClientCert`).
        let path = match path {
            Some(p) => {
                let leaf = match (before.get(p), after.get(p)) {
                    (Some(a), Some(b)) => super::document::changed_paths(a, b)
                        .into_iter()
                        .find(|l| !l.is_empty()),
                    _ => None,
                };
                let mut name = p.join(".");
                if let Some(leaf) = leaf {
                    name = format!("{name}.{leaf}");
                }
                name
            }
            None => key.path.to_owned(),
        };
        return Err(format!(
            "'{path}' is file-only ({}): an API token cannot change it; change it in the \
             configuration file",
            key.why
        ));
    }
    Ok(())
}

/// Whether a dot path lies at or under a file-only key.
pub fn is_file_only(path: &str) -> bool {
    let parts: Vec<&str> = path.split('.').collect();
    FILE_ONLY.iter().any(|key| {
        let pattern = segments(key.path);
        parts.len() >= pattern.len()
            && pattern
                .iter()
                .zip(&parts)
                .all(|(want, got)| *want == "*" || want == got)
    })
}

/// `document` (the fleet's) with every file-only key taken from `file` (this node's own
/// configuration file): removed where the file does not set it, copied where it does. A key
/// under a `*` member is copied only onto a member the document still has (a job deleted
/// through the API does not come back as a bare wake gate).
pub fn overlay_file_only(document: &mut Value, file: &Value) {
    if !document.is_object() {
        *document = Value::Object(Map::new());
    }
    for key in FILE_ONLY {
        for path in matched(document, key.path).into_keys().collect::<Vec<_>>() {
            doc::remove(
                document,
                &path.iter().map(String::as_str).collect::<Vec<_>>(),
            );
        }
    }
    fill_missing(document, file);
}

/// Copies into `next` the file-only keys of `from` that `next` leaves out (under a `*`
/// member only onto a member `next` has), so that a whole document given without them keeps
/// this node's values; a file-only key `next` names is left for [`check_unchanged`] to judge.
pub fn fill_missing(next: &mut Value, from: &Value) {
    if !next.is_object() {
        return;
    }
    for key in FILE_ONLY {
        let wild = key.path.contains('*');
        for (path, value) in matched(from, key.path) {
            let parts: Vec<&str> = path.iter().map(String::as_str).collect();
            let parent_there =
                doc::get(next, &parts[..parts.len() - 1]).is_some_and(Value::is_object);
            if doc::get(next, &parts).is_some() || (wild && !parent_there) {
                continue;
            }
            // A member crossing a non-object is a document the load refuses anyway.
            let _ = doc::set(next, &parts, value.clone());
        }
    }
}

/// Marks the file-only keys in the configuration's JSON Schema: `x-fileOnly: true` on each
/// key's own schema, and the whole list (paths and reasons) at the root.
pub fn mark_schema(root: &mut Value) {
    for key in FILE_ONLY {
        let Some(pointer) = pointer_of(root, key.path) else {
            continue;
        };
        if let Some(Value::Object(m)) = root.pointer_mut(&pointer) {
            m.insert("x-fileOnly".into(), Value::Bool(true));
        }
    }
    let list: Vec<Value> = FILE_ONLY
        .iter()
        .map(|k| serde_json::json!({"path": k.path, "why": k.why}))
        .collect();
    if let Value::Object(m) = root {
        m.insert("x-fileOnly".into(), Value::Array(list));
    }
}

/// The JSON pointer of the schema of the key at `path`, through `$ref`s into `$defs`.
fn pointer_of(root: &Value, path: &str) -> Option<String> {
    let mut pointer = String::new();
    for seg in segments(path) {
        let base = resolved(root, &pointer)?;
        pointer = if seg == "*" {
            format!("{base}/additionalProperties")
        } else {
            format!("{base}/properties/{seg}")
        };
        root.pointer(&pointer)?;
    }
    Some(pointer)
}

/// The pointer of the schema at `pointer`, following a `$ref` (or one inside an
/// `allOf`/`anyOf`, as schemars writes optional references) into `$defs`.
fn resolved(root: &Value, pointer: &str) -> Option<String> {
    let node = root.pointer(pointer)?;
    let reference = node.get("$ref").and_then(Value::as_str).or_else(|| {
        ["allOf", "anyOf"].iter().find_map(|k| {
            node.get(*k)?
                .as_array()?
                .iter()
                .find_map(|s| s.get("$ref").and_then(Value::as_str))
        })
    });
    match reference {
        Some(r) => {
            let name = r.strip_prefix("#/$defs/")?;
            root.pointer(&format!("/$defs/{name}"))?;
            Some(format!("/$defs/{name}"))
        }
        None => Some(pointer.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use serde_json::json;

    use super::*;

    #[test]
    fn a_changed_file_only_key_is_named() {
        let a = json!({"gateway": {"port": 1, "web": {"distDir": null}}, "store": {"url": "x"}});
        let mut b = a.clone();
        assert!(check_unchanged(&a, &b).is_ok());
        b["gateway"]["web"]["distDir"] = json!("/");
        let e = check_unchanged(&a, &b).unwrap_err();
        assert!(e.contains("'gateway.web.distDir' is file-only"), "{e}");
        let mut c = a.clone();
        c["scheduler"] = json!({"jobs": {"j": {"wakeGate": {"script": "x"}}}});
        let e = check_unchanged(&a, &c).unwrap_err();
        assert!(e.contains("'scheduler.jobs.j.wakeGate'"), "{e}");
        // A job whose name holds a dot is named whole.
        let mut dotted = a.clone();
        dotted["scheduler"] = json!({"jobs": {"v1.2": {"wakeGate": {"script": "x"}}}});
        let e = check_unchanged(&a, &dotted).unwrap_err();
        assert!(e.contains("'scheduler.jobs.v1.2.wakeGate'"), "{e}");
        let mut kept = json!({"scheduler": {"jobs": {"v1.2": {"message": "m"}}}});
        overlay_file_only(&mut kept, &dotted);
        assert_eq!(kept["scheduler"]["jobs"]["v1.2"]["wakeGate"]["script"], "x");
        // A job without a gate is not a file-only change.
        let mut d = a.clone();
        d["scheduler"] = json!({"jobs": {"j": {"message": "m"}}});
        assert!(check_unchanged(&a, &d).is_ok());
    }

    #[test]
    fn paths_under_file_only_keys_are_file_only() {
        assert!(is_file_only("local.python"));
        assert!(is_file_only("store"));
        assert!(is_file_only("scheduler.jobs.x.wakeGate.script"));
        assert!(!is_file_only("scheduler.jobs.x.message"));
        assert!(!is_file_only("gateway.rateLimit.maxRequests"));
        assert!(!is_file_only("localx"));
    }

    #[test]
    fn the_overlay_takes_file_only_keys_from_the_file() {
        let mut doc = json!({
            "gateway": {"port": 1, "rateLimit": {"maxRequests": 5}},
            "local": {"python": "/bin/evil"},
            "scheduler": {"jobs": {"a": {"message": "m", "wakeGate": {"script": "doc"}}}}
        });
        let file = json!({
            "gateway": {"port": 2, "web": {"distDir": "/srv/app"}},
            "scheduler": {"jobs": {"a": {"wakeGate": {"script": "file"}},
                                   "gone": {"wakeGate": {"script": "g"}}}}
        });
        overlay_file_only(&mut doc, &file);
        assert_eq!(doc["gateway"]["port"], 2);
        assert_eq!(doc["gateway"]["rateLimit"]["maxRequests"], 5);
        assert_eq!(doc["gateway"]["web"]["distDir"], "/srv/app");
        assert!(doc.get("local").is_none(), "{doc}");
        assert_eq!(doc["scheduler"]["jobs"]["a"]["wakeGate"]["script"], "file");
        assert_eq!(doc["scheduler"]["jobs"]["a"]["message"], "m");
        assert!(doc["scheduler"]["jobs"].get("gone").is_none(), "{doc}");
    }

    #[test]
    fn the_schema_marks_every_file_only_key() {
        let mut root = crate::config::schema();
        mark_schema(&mut root);
        assert_eq!(
            root["x-fileOnly"].as_array().unwrap().len(),
            FILE_ONLY.len()
        );
        for key in FILE_ONLY {
            let p = pointer_of(&root, key.path).unwrap_or_else(|| panic!("{}", key.path));
            assert_eq!(
                root.pointer(&p).unwrap()["x-fileOnly"],
                true,
                "{}",
                key.path
            );
        }
    }
}
