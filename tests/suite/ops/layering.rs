//! The floor plan of `gateway/src` as a test: every module sits on a floor, a module imports
//! only from its own floor or below, and the modules of one floor do not import each other in
//! a circle. It reads the sources (`use crate::...` statements, grouped or not, `pub use`
//! re-exports, inline `crate::` paths and `super::` paths that climb to the crate root) and
//! leaves test modules out. A failure names the file, the line and the broken rule.
//! ARCHITECTURE.md describes the floors; this table is the one that is enforced.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Bottom to top: (floor, top-level modules, what the floor is). A new top-level module must
/// be placed here before it builds into the crate.
const FLOORS: &[(u8, &[&str], &str)] = &[
    (
        1,
        &["api", "clock"],
        "the ground floor (generated surface, call context, principal, domain error, tenancy, scopes, the clock) knows no transport and no service",
    ),
    (
        2,
        &["config", "proc", "metrics", "events", "hub", "logging", "transport", "net"],
        "settings, the process runner, metrics, events, the push hub, logging, HTTP limits and the URL guard know no storage and no engine",
    ),
    (3, &["store"], "the store is a leaf over sqlx: it knows no service above it"),
    (
        4,
        &["providers", "auth", "secrets", "media", "fanout", "obs"],
        "services (providers, tokens, secrets, media, fan-out, observability) know no engine; they are told about changes through callbacks",
    ),
    (5, &["runtime"], "the engine knows no webhook, application state, handler or transport"),
    (6, &["webhooks"], "webhooks produce run requests; they know no application state, handler or route"),
    (7, &["app"], "application state and the config-write pipeline know no handler or transport"),
    (8, &["handlers"], "handlers know no transport"),
    (9, &["rpc", "http"], "transports know no composition root"),
    (10, &["server"], "only the composition root opens services and builds generations"),
    (11, &["lib", "main"], "the crate root and the binary sit on top"),
];

fn floor_of(module: &str) -> Option<(u8, &'static str)> {
    FLOORS
        .iter()
        .find(|(_, mods, _)| mods.contains(&module))
        .map(|(f, _, why)| (*f, *why))
}

/// One reference to another top-level module: the file, its line, the referenced path.
#[derive(Debug, Clone)]
struct Import {
    file: String,
    line: usize,
    target: String,
}

/// The module path of a source file relative to `src` (`runtime/memory/mod.rs` ->
/// `[runtime, memory]`, `lib.rs` -> `[lib]`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.last_mut() {
        *last = last.trim_end_matches(".rs").to_owned();
    }
    if parts.len() > 1 && parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// The source without its test modules: a `#[cfg(test)]` followed by an inline `mod x {`
/// starts a module that runs to its matching closing brace at the same indentation.
fn without_tests(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if l.trim() == "#[cfg(test)]" {
            let next = lines[i + 1..].iter().position(|x| !x.trim().is_empty());
            if let Some(off) = next {
                let n = lines[i + 1 + off];
                let t = n.trim_start();
                let t = ["pub(crate) ", "pub(super) ", "pub "]
                    .iter()
                    .find_map(|p| t.strip_prefix(p))
                    .unwrap_or(t);
                if t.starts_with("mod ") && t.trim_end().ends_with('{') {
                    let indent = n.len() - n.trim_start().len();
                    let close = format!("{}}}", " ".repeat(indent));
                    let end = lines[i + 1 + off..]
                        .iter()
                        .position(|x| *x == close)
                        .map_or(lines.len(), |p| i + 1 + off + p + 1);
                    i = end;
                    continue;
                }
            }
        }
        out.push((i + 1, l));
        i += 1;
    }
    out
}

/// The first segments after each `crate::` in a `use` tree text (`crate::{a::b, c}` -> a, c).
fn use_targets(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(rest) = tree.strip_prefix("crate::") else {
        return Vec::new();
    };
    if let Some(inner) = rest.strip_prefix('{') {
        let mut out = Vec::new();
        let (mut depth, mut cur) = (0i32, String::new());
        for ch in inner.chars() {
            match ch {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(std::mem::take(&mut cur));
                    continue;
                }
                _ => {}
            }
            cur.push(ch);
        }
        out.push(cur);
        return out
            .into_iter()
            .filter_map(|item| first_ident(&item))
            .collect();
    }
    first_ident(rest).into_iter().collect()
}

fn first_ident(s: &str) -> Option<String> {
    let id: String = s
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!id.is_empty() && id != "self").then_some(id)
}

/// Every reference from `module` (its path) in `text` to a top-level module.
fn imports_of(file: &str, module: &[String], text: &str) -> Vec<Import> {
    let mut out = Vec::new();
    let lines = without_tests(text);
    let mut pending: Option<(usize, String)> = None;
    for (no, raw) in &lines {
        let code = raw.trim();
        if code.starts_with("//") {
            continue;
        }
        // `use` statements, possibly over several lines.
        let starts_use = {
            let t = code.strip_prefix("pub ").unwrap_or(code);
            let t = t
                .strip_prefix("pub(crate) ")
                .or_else(|| t.strip_prefix("pub(super) "))
                .unwrap_or(t);
            t.strip_prefix("use ").map(str::to_owned)
        };
        if let Some((start, mut acc)) = pending.take() {
            acc.push_str(code);
            if acc.contains(';') {
                for t in use_targets(acc.split(';').next().unwrap_or("")) {
                    out.push(Import {
                        file: file.into(),
                        line: start,
                        target: t,
                    });
                }
            } else {
                pending = Some((start, acc));
            }
            continue;
        }
        if let Some(tree) = starts_use {
            let tree = resolve_super(module, &tree);
            if tree.contains(';') {
                for t in use_targets(tree.split(';').next().unwrap_or("")) {
                    out.push(Import {
                        file: file.into(),
                        line: *no,
                        target: t,
                    });
                }
            } else {
                pending = Some((*no, tree));
            }
            continue;
        }
        // Inline paths.
        let code = resolve_super(module, code);
        let mut from = 0;
        while let Some(pos) = code[from..].find("crate::") {
            let at = from + pos;
            let before = code[..at].chars().next_back();
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                if let Some(t) = first_ident(&code[at + "crate::".len()..]) {
                    out.push(Import {
                        file: file.into(),
                        line: *no,
                        target: t,
                    });
                }
            }
            from = at + "crate::".len();
        }
    }
    out
}

/// `super::super::x` climbing to the crate root from `module` becomes `crate::x`.
fn resolve_super(module: &[String], code: &str) -> String {
    let depth = module.len();
    let mut out = code.to_owned();
    for k in (depth..=depth + 2).rev() {
        if k == 0 {
            continue;
        }
        let chain = "super::".repeat(k);
        out = out.replace(&chain, "crate::");
    }
    out
}

fn sources(src: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read gateway/src") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The broken rules, one line each (empty: the floors hold).
fn violations(files: &[(String, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut same_floor: BTreeMap<String, BTreeMap<String, Import>> = BTreeMap::new();
    for (rel, text) in files {
        let module = module_path(Path::new(rel));
        let top = module[0].clone();
        let Some((floor, _)) = floor_of(&top) else {
            problems.push(format!(
                "{rel}: module `{top}` is on no floor: place it in FLOORS (tests/suite/ops/layering.rs) and ARCHITECTURE.md"
            ));
            continue;
        };
        for imp in imports_of(rel, &module, text) {
            if imp.target == top {
                continue;
            }
            let Some((to, _)) = floor_of(&imp.target) else {
                continue; // a crate-root item (none today) or a macro path
            };
            if to > floor {
                let why = FLOORS
                    .iter()
                    .find(|(f, _, _)| *f == floor)
                    .map_or("", |(_, _, w)| *w);
                problems.push(format!(
                    "{}:{}: `{top}` (floor {floor}) imports `crate::{}` (floor {to}): {why}",
                    imp.file, imp.line, imp.target
                ));
            } else if to == floor {
                same_floor
                    .entry(top.clone())
                    .or_default()
                    .entry(imp.target.clone())
                    .or_insert(imp);
            }
        }
    }
    // Modules of one floor: no circle.
    for (a, targets) in &same_floor {
        for (b, imp) in targets {
            if let Some(back) = same_floor.get(b).and_then(|t| t.get(a)) {
                if a < b {
                    problems.push(format!(
                        "{}:{} and {}:{}: `{a}` and `{b}` (one floor) import each other: modules of one floor do not import each other in a circle",
                        imp.file, imp.line, back.file, back.line
                    ));
                }
            }
        }
    }
    problems
}

/// Every source file of `gateway/src`: its path under `src` and its text.
fn source_files() -> (PathBuf, Vec<(String, String)>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway/src");
    let files = sources(&src)
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&src)
                .expect("under src")
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&p).expect("read source");
            (rel, text)
        })
        .collect();
    (src, files)
}

#[test]
fn no_import_runs_up_a_floor() {
    let (src, files) = source_files();
    assert!(
        files.len() > 100,
        "the sources were not found under {src:?}"
    );
    let counted: usize = files
        .iter()
        .map(|(rel, text)| imports_of(rel, &module_path(Path::new(rel)), text).len())
        .sum();
    assert!(
        counted > 500,
        "the scanner found only {counted} crate paths: it is broken"
    );
    let problems = violations(&files);
    let mut report = String::new();
    for p in &problems {
        let _ = writeln!(report, "  {p}");
    }
    assert!(problems.is_empty(), "the floor plan is broken:\n{report}");
}

/// The domain error reaches the wire in exactly two files: the JSON-RPC mapping
/// (`rpc/error.rs`) and the REST and `/v1` one (`transport/problem.rs`). A conversion of
/// `GatewayError` into a wire type (`RpcError`, `Problem`) anywhere else fails.
#[test]
fn the_domain_error_is_mapped_to_the_wire_in_two_files() {
    let (_, files) = source_files();
    let mut found = Vec::new();
    for (rel, text) in &files {
        for (no, line) in without_tests(text) {
            let l = line.trim();
            for wire in ["RpcError", "Problem"] {
                if l.starts_with("impl From<")
                    && l.contains("GatewayError>")
                    && l.contains(&format!(" for {wire} "))
                {
                    found.push(format!("{rel}:{no}: {wire}"));
                }
            }
        }
    }
    found.sort();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].starts_with("rpc/error.rs:") && found[0].ends_with("RpcError"),
        "{found:?}"
    );
    assert!(
        found[1].starts_with("transport/problem.rs:") && found[1].ends_with("Problem"),
        "{found:?}"
    );
}

/// Files outside `proc/` that start a child process in production code, each with why it is
/// not on the runner yet. A new spawn goes through `crate::proc`.
const SPAWNS_OUTSIDE_PROC: &[(&str, &str)] = &[(
    "providers/local/fetch.rs",
    "`pip download` for `fetch-models` inherits the operator's environment (proxies, pip's index and certificates), which the runner's fixed environment would drop",
)];

/// The daemon's own child processes are started in one place, `proc/` (its process group,
/// fixed environment, limits and reaping); test modules may use `std::process` freely.
#[test]
fn child_processes_are_started_by_the_runner_only() {
    let (_, files) = source_files();
    let mut found = Vec::new();
    for (rel, text) in &files {
        if rel.starts_with("proc/") || SPAWNS_OUTSIDE_PROC.iter().any(|(f, _)| f == rel) {
            continue;
        }
        for (no, line) in without_tests(text) {
            let l = line.trim_start();
            if l.starts_with("//") {
                continue;
            }
            if [
                "Command::new",
                "tokio::process",
                "process::Command",
                "CommandExt",
            ]
            .iter()
            .any(|p| l.contains(p))
            {
                found.push(format!("{rel}:{no}: {l}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "start child processes through crate::proc:\n{}",
        found.join("\n")
    );
}

/// The scanner is not blind: planted upward imports of every shape are reported, and test
/// modules and downward imports are not.
#[test]
fn the_scanner_reports_planted_upward_imports() {
    let plant = |rel: &str, text: &str| violations(&[(rel.to_owned(), text.to_owned())]);
    assert_eq!(
        plant("store/x.rs", "use crate::runtime::engine::Engine;\n").len(),
        1
    );
    assert_eq!(
        plant(
            "store/x.rs",
            "use crate::{api::error::GatewayError, obs::digest};\n"
        )
        .len(),
        1
    );
    assert_eq!(
        plant(
            "store/x.rs",
            "use crate::{\n    clock::now_ms,\n    handlers::X,\n};\n"
        )
        .len(),
        1
    );
    assert_eq!(plant("api/mod.rs", "pub use crate::rpc::error;\n").len(), 1);
    assert_eq!(
        plant("config/a/b.rs", "use super::super::super::server::X;\n").len(),
        1
    );
    assert_eq!(plant("hub.rs", "fn f() { crate::app::go(); }\n").len(), 1);
    let p = plant("store/mod.rs", "use crate::app::state::AppState;\n");
    assert!(
        p[0].starts_with("store/mod.rs:1: `store` (floor 3) imports `crate::app`"),
        "{p:?}"
    );
    assert!(plant(
        "store/x.rs",
        "use crate::api::error::GatewayError;\nuse crate::config::X;\n"
    )
    .is_empty());
    assert!(plant("handlers/x.rs", "use super::super::store::Store;\n").is_empty());
    assert!(plant(
        "store/x.rs",
        "fn f() {}\n\n#[cfg(test)]\nmod tests {\n    use crate::server::start;\n}\n"
    )
    .is_empty());
    assert!(plant(
        "store/x.rs",
        "#[cfg(test)]\npub(crate) mod tests {\n    use crate::server::start;\n}\n"
    )
    .is_empty());
    // Code after a test module is read again.
    assert_eq!(
        plant(
            "store/x.rs",
            "#[cfg(test)]\nmod tests {\n}\nuse crate::http::X;\n"
        )
        .len(),
        1
    );
    assert_eq!(
        plant("newroom.rs", "fn f() {}\n").len(),
        1,
        "an unplaced module is reported"
    );
}

/// Two modules of one floor importing each other are a circle.
#[test]
fn the_scanner_reports_a_circle_within_a_floor() {
    let files = vec![
        (
            "hub.rs".to_owned(),
            "use crate::events::Event;\n".to_owned(),
        ),
        ("events.rs".to_owned(), "use crate::hub::Hub;\n".to_owned()),
    ];
    let p = violations(&files);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].contains("import each other"), "{p:?}");
}
