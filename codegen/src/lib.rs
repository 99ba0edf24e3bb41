//! gateway-codegen: catalogue/ -> load (strict serde) -> lower (IR) -> emitters.
//! Shared by the root `build.rs` (Rust into OUT_DIR) and the CLI (everything into generated/).

pub mod emit;
pub mod ir;
pub mod load;
pub mod lower;
pub mod naming;
pub mod raw;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use ir::Catalogue;
pub use load::{Problem, Problems};

/// The version stamped into the SDKs and the OpenRPC document.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Directories under `generated/` that this generator owns entirely (stale files are removed).
pub const OWNED_DIRS: &[&str] = &["rust", "jsonschema", "sdk", "docs"];
/// Files directly under `generated/` that this generator owns.
pub const OWNED_FILES: &[&str] = &["openrpc.json", "METHODS.md"];

/// Loads and validates the catalogue; every problem is reported at once.
pub fn load_catalogue(root: &Path) -> Result<Catalogue, Problems> {
    let (raw, mut problems) = load::load(root);
    match lower::lower(raw) {
        Ok(cat) if problems.is_empty() => Ok(cat),
        Ok(_) => {
            problems.sort();
            Err(Problems(problems))
        }
        Err(Problems(more)) => {
            problems.extend(more);
            problems.sort();
            problems.dedup();
            Err(Problems(problems))
        }
    }
}

/// The Rust files for OUT_DIR (and `generated/rust/`).
pub fn render_rust(cat: &Catalogue) -> Result<Vec<(String, String)>, String> {
    emit::rust::emit(cat)
}

/// Every file of `generated/`, keyed by path relative to it.
pub fn render_all(cat: &Catalogue) -> Result<BTreeMap<PathBuf, String>, String> {
    let mut out = BTreeMap::new();
    for (name, text) in render_rust(cat)? {
        out.insert(Path::new("rust").join(name), text);
    }
    for (name, text) in emit::jsonschema::emit(cat)? {
        out.insert(Path::new("jsonschema").join(name), text);
    }
    for (name, text) in emit::typescript::emit(cat, VERSION) {
        out.insert(Path::new("sdk/typescript").join(name), text);
    }
    for (name, text) in emit::python::emit(cat, VERSION) {
        out.insert(Path::new("sdk/python").join(name), text);
    }
    out.insert(
        PathBuf::from("openrpc.json"),
        emit::openrpc::emit(cat, VERSION)?,
    );
    out.insert(PathBuf::from("METHODS.md"), emit::methods_md::emit(cat));
    for (name, text) in emit::html::emit(cat, VERSION)? {
        out.insert(Path::new("docs").join(name), text);
    }
    Ok(out)
}

/// Files currently on disk in the generator-owned parts of `generated/`.
fn owned_on_disk(out_dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for f in OWNED_FILES {
        if out_dir.join(f).is_file() {
            found.push(PathBuf::from(f));
        }
    }
    let mut stack: Vec<PathBuf> = OWNED_DIRS.iter().map(PathBuf::from).collect();
    while let Some(rel) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(out_dir.join(&rel)) else {
            continue;
        };
        for e in entries.flatten() {
            let child = rel.join(e.file_name());
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                // Tool caches inside the SDK folders are not ours to judge.
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name == "node_modules" || name == "__pycache__" || name.ends_with(".egg-info") {
                    continue;
                }
                stack.push(child);
            } else {
                found.push(child);
            }
        }
    }
    found.sort();
    found
}

/// Differences between what the catalogue renders and `generated/` on disk.
pub fn check(cat: &Catalogue, out_dir: &Path) -> Result<Vec<String>, String> {
    let want = render_all(cat)?;
    let mut diffs = Vec::new();
    for (rel, text) in &want {
        match std::fs::read_to_string(out_dir.join(rel)) {
            Ok(have) if &have == text => {}
            Ok(_) => diffs.push(format!("stale: {}", rel.display())),
            Err(_) => diffs.push(format!("missing: {}", rel.display())),
        }
    }
    for rel in owned_on_disk(out_dir) {
        if !want.contains_key(&rel) {
            diffs.push(format!("not generated (remove it): {}", rel.display()));
        }
    }
    Ok(diffs)
}

/// Writes every file of `generated/` and removes stale ones; returns how many were written.
pub fn generate(cat: &Catalogue, out_dir: &Path) -> Result<usize, String> {
    let want = render_all(cat)?;
    for rel in owned_on_disk(out_dir) {
        if !want.contains_key(&rel) {
            std::fs::remove_file(out_dir.join(&rel))
                .map_err(|e| format!("{}: {e}", rel.display()))?;
        }
    }
    let mut written = 0;
    for (rel, text) in &want {
        let path = out_dir.join(rel);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        written += 1;
    }
    Ok(written)
}
