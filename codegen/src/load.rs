//! Reads `catalogue/` from disk into the raw model; every file that fails to parse is reported.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use serde_json::Value;

use crate::raw::{ErrorsFile, MethodsFile, OwnersFile, RawMethod, RawType, ScopesFile, TypesFile};

/// One thing wrong with the catalogue, named by file and (where known) method.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    pub file: String,
    pub method: Option<String>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.method {
            Some(m) => write!(f, "{} [{}]: {}", self.file, m, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// All problems of a catalogue, sorted; rendered one per line.
#[derive(Debug, Clone)]
pub struct Problems(pub Vec<Problem>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "the catalogue has {} problem(s):", self.0.len())?;
        for p in &self.0 {
            writeln!(f, "  - {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// The parsed files; file names are relative to the catalogue root (`methods/session.yaml`).
pub struct RawCatalogue {
    pub scopes: Option<(String, ScopesFile)>,
    pub errors: Option<(String, ErrorsFile)>,
    pub owners: Option<(String, OwnersFile)>,
    /// (file, type name, type)
    pub types: Vec<(String, String, RawType)>,
    /// (file, namespace file header, methods)
    pub methods: Vec<(String, MethodsFile, Vec<RawMethod>)>,
}

/// Parses what can be parsed; the problems of what could not are returned beside it so that
/// lowering can still report everything else.
pub fn load(root: &Path) -> (RawCatalogue, Vec<Problem>) {
    let mut problems = Vec::new();
    let scopes = parse_one(root, "scopes.yaml", &mut problems);
    let errors = parse_one(root, "errors.yaml", &mut problems);
    let owners = parse_one(root, "owners.yaml", &mut problems);
    let types = parse_dir::<TypesFile>(root, "types", &mut problems)
        .into_iter()
        .flat_map(|(file, f)| {
            f.types
                .into_iter()
                .map(move |(name, v)| (file.clone(), name, v))
        })
        .filter_map(|(file, name, v)| {
            convert::<RawType>(v, &file, Some(&name), &mut problems).map(|t| (file, name, t))
        })
        .collect();
    let methods = parse_dir::<MethodsFile>(root, "methods", &mut problems)
        .into_iter()
        .map(|(file, mut f)| {
            let raw = std::mem::take(&mut f.methods);
            let methods = raw
                .into_iter()
                .enumerate()
                .filter_map(|(i, v)| {
                    let label = v
                        .get("name")
                        .and_then(|n| n.as_str())
                        .map_or_else(|| format!("method #{}", i + 1), str::to_owned);
                    convert::<RawMethod>(v, &file, Some(&label), &mut problems)
                })
                .collect();
            (file, f, methods)
        })
        .collect();
    (
        RawCatalogue {
            scopes,
            errors,
            owners,
            types,
            methods,
        },
        problems,
    )
}

/// Every YAML file the catalogue consists of, for `rerun-if-changed`.
pub fn files(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![
        root.join("scopes.yaml"),
        root.join("errors.yaml"),
        root.join("owners.yaml"),
    ];
    for dir in ["types", "methods"] {
        out.extend(yaml_files(&root.join(dir)).unwrap_or_default());
    }
    out
}

fn yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

fn parse_one<T: DeserializeOwned>(
    root: &Path,
    rel: &str,
    problems: &mut Vec<Problem>,
) -> Option<(String, T)> {
    parse_file(&root.join(rel), rel.to_owned(), problems).map(|v| (rel.to_owned(), v))
}

fn parse_dir<T: DeserializeOwned>(
    root: &Path,
    dir: &str,
    problems: &mut Vec<Problem>,
) -> Vec<(String, T)> {
    let files = match yaml_files(&root.join(dir)) {
        Ok(f) => f,
        Err(e) => {
            problems.push(Problem {
                file: dir.to_owned(),
                method: None,
                message: format!("cannot list directory: {e}"),
            });
            return Vec::new();
        }
    };
    files
        .iter()
        .filter_map(|path| {
            let name = path.file_name()?.to_string_lossy().into_owned();
            let rel = format!("{dir}/{name}");
            parse_file(path, rel.clone(), problems).map(|v| (rel, v))
        })
        .collect()
}

fn parse_file<T: DeserializeOwned>(
    path: &Path,
    rel: String,
    problems: &mut Vec<Problem>,
) -> Option<T> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            problems.push(Problem {
                file: rel,
                method: None,
                message: format!("cannot read: {e}"),
            });
            return None;
        }
    };
    match serde_saphyr::from_str_with_options::<T>(&text, yaml_options()) {
        Ok(v) => Some(v),
        Err(e) => {
            problems.push(Problem {
                file: rel,
                method: None,
                message: format!("invalid YAML for the catalogue format: {e}"),
            });
            None
        }
    }
}

/// One entry of a file into its typed form; the message names the member path that is wrong.
fn convert<T: DeserializeOwned>(
    v: Value,
    file: &str,
    label: Option<&str>,
    problems: &mut Vec<Problem>,
) -> Option<T> {
    match serde_path_to_error::deserialize::<_, T>(v) {
        Ok(t) => Some(t),
        Err(e) => {
            let path = e.path().to_string();
            let at = if path == "." {
                String::new()
            } else {
                format!("at {path}: ")
            };
            problems.push(Problem {
                file: file.to_owned(),
                method: label.map(str::to_owned),
                message: format!("{at}{}", e.into_inner()),
            });
            None
        }
    }
}

/// YAML 1.2 core booleans only: `n`, `no`, `off` stay strings (catalogue enums use them).
pub fn yaml_options() -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    o.strict_booleans = true;
    o
}
