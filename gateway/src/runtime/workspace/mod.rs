//! Agents' workspaces through the API (`workspace.listDir/readFile/writeFile/deleteFile`):
//! `<dataDir>/workspaces/<agentId>/`, the operator's content for that agent. Every path is
//! relative, checked segment by segment (no empty, `.` or `..` segment, no NUL, no `.git`
//! anywhere, not one of the operator's private paths), then opened from the workspace's
//! descriptor without following any link ([`confined`]). The model is in `docs/workspaces.md`.

pub mod confined;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::api::error::GatewayError;
use crate::runtime::agents::Agents;

use confined::{Entry, Error, Root};

/// Largest file `readFile` answers (the catalogue's 10 MiB).
pub const MAX_READ_BYTES: u64 = 10 << 20;
/// Most segments a path may have.
const MAX_SEGMENTS: usize = 64;
/// The repository directory: never listed, read or written.
const GIT_DIR: &str = ".git";

/// A path the caller named, checked: its directories and its last segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsPath {
    pub segments: Vec<String>,
}

impl WsPath {
    fn dirs(&self) -> Vec<&str> {
        let n = self.segments.len().saturating_sub(1);
        self.segments[..n].iter().map(String::as_str).collect()
    }

    fn name(&self) -> &str {
        self.segments.last().map_or("", String::as_str)
    }

    fn all(&self) -> Vec<&str> {
        self.segments.iter().map(String::as_str).collect()
    }

    /// The path as the API shows it.
    pub fn shown(&self) -> String {
        self.segments.join("/")
    }
}

/// Checks `raw` (the parameter `param`): relative, at most [`MAX_SEGMENTS`] segments, none
/// empty, `.`, `..` or `.git` (any case), no NUL or backslash, not private. -32602 otherwise.
pub fn check_path(raw: &str, param: &str, private: &[String]) -> Result<WsPath, GatewayError> {
    let bad = |why: &str| GatewayError::InvalidParams(format!("'{param}': {why}"));
    if raw.contains('\0') {
        return Err(bad("must not contain a NUL character"));
    }
    if raw.starts_with('/') {
        return Err(bad("must be relative to the workspace (no leading '/')"));
    }
    if raw.contains('\\') {
        return Err(bad("must not contain a backslash"));
    }
    // A trailing slash names the same directory.
    let trimmed = raw.strip_suffix('/').unwrap_or(raw);
    let segments: Vec<&str> = trimmed.split('/').collect();
    if segments.len() > MAX_SEGMENTS {
        return Err(bad(&format!("has more than {MAX_SEGMENTS} segments")));
    }
    for s in &segments {
        match *s {
            "" => return Err(bad("has an empty segment")),
            "." | ".." => return Err(bad("must not contain '.' or '..' segments")),
            s if s.eq_ignore_ascii_case(GIT_DIR) => {
                return Err(bad("the .git directory is never reachable"))
            }
            _ => {}
        }
    }
    if is_private(&segments, private) {
        return Err(bad("is a private path of the workspace"));
    }
    Ok(WsPath {
        segments: segments.into_iter().map(str::to_owned).collect(),
    })
}

/// Whether `segments` fall under one of the operator's private paths: an entry with a `/` is
/// a path from the workspace root (it and everything below it); one without names any
/// segment anywhere (`.netrc`, `.ssh`).
pub fn is_private(segments: &[&str], private: &[String]) -> bool {
    private.iter().any(|p| {
        let p = p.trim_end_matches('/');
        if p.contains('/') {
            let parts: Vec<&str> = p.split('/').collect();
            segments.len() >= parts.len() && segments[..parts.len()] == parts[..]
        } else {
            segments.contains(&p)
        }
    })
}

/// The workspaces of one engine.
pub struct Workspaces {
    data_dir: PathBuf,
    agents: Arc<Agents>,
    private: Vec<String>,
}

fn map(e: Error, path: &WsPath) -> GatewayError {
    match e {
        Error::NotFound => GatewayError::not_found("File", path.shown()),
        Error::Symlink => GatewayError::InvalidParams(format!(
            "'{}' leads through a symbolic link, which the workspace methods never follow",
            path.shown()
        )),
        Error::WrongKind(what) => {
            GatewayError::InvalidParams(format!("'{}' is {what}", path.shown()))
        }
        Error::TooLarge(n) => GatewayError::InvalidParams(format!(
            "'{}' is {n} bytes, more than the {MAX_READ_BYTES} a read answers",
            path.shown()
        )),
        Error::Io(why) => GatewayError::Internal(format!("workspace: {why}")),
    }
}

/// A file read.
pub struct Read {
    pub bytes: Vec<u8>,
    pub modified_ms: i64,
}

impl Workspaces {
    pub fn new(data_dir: PathBuf, agents: Arc<Agents>, private: Vec<String>) -> Self {
        Self {
            data_dir,
            agents,
            private,
        }
    }

    /// The operator's private paths (configuration `workspaces.privatePaths`).
    pub fn private(&self) -> &[String] {
        &self.private
    }

    /// The workspace of a configured agent (-32001 for an unknown one).
    pub fn dir(&self, agent_id: &str) -> Result<PathBuf, GatewayError> {
        self.agents.require(agent_id)?;
        Ok(crate::runtime::agents::workspace_dir(
            &self.data_dir,
            agent_id,
        ))
    }

    async fn blocking<T: Send + 'static>(
        f: impl FnOnce() -> Result<T, GatewayError> + Send + 'static,
    ) -> Result<T, GatewayError> {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| GatewayError::Internal(format!("workspace: {e}")))?
    }

    /// The entries of `dir` (the root when None): `.git` left out, directories first, then
    /// by name. A missing workspace or directory is -32001.
    pub async fn list(
        &self,
        agent_id: &str,
        dir: Option<WsPath>,
    ) -> Result<Vec<Entry>, GatewayError> {
        let root = self.dir(agent_id)?;
        let private = self.private.clone();
        Self::blocking(move || {
            let shown = dir.clone().unwrap_or(WsPath {
                segments: Vec::new(),
            });
            let r = open_root(&root, &shown)?;
            let mut entries = r.list(&shown.all()).map_err(|e| map(e, &shown))?;
            entries.retain(|e| {
                let mut segs = shown.all();
                segs.push(&e.name);
                !e.name.eq_ignore_ascii_case(GIT_DIR) && !is_private(&segs, &private)
            });
            entries.sort_by(|a, b| {
                let dir = |e: &Entry| e.kind != confined::Kind::Directory;
                dir(a).cmp(&dir(b)).then_with(|| a.name.cmp(&b.name))
            });
            Ok(entries)
        })
        .await
    }

    /// One file's bytes (at most [`MAX_READ_BYTES`]).
    pub async fn read(&self, agent_id: &str, path: WsPath) -> Result<Read, GatewayError> {
        let root = self.dir(agent_id)?;
        Self::blocking(move || {
            let r = open_root(&root, &path)?;
            let (bytes, meta) = r
                .read(&path.dirs(), path.name(), MAX_READ_BYTES)
                .map_err(|e| map(e, &path))?;
            Ok(Read {
                bytes,
                modified_ms: confined::modified_ms(&meta),
            })
        })
        .await
    }

    /// Writes one file atomically, creating the workspace and missing directories.
    pub async fn write(
        &self,
        agent_id: &str,
        path: WsPath,
        bytes: Vec<u8>,
    ) -> Result<(), GatewayError> {
        let root = self.dir(agent_id)?;
        Self::blocking(move || {
            std::fs::create_dir_all(&root)
                .map_err(|e| GatewayError::Internal(format!("workspace: {e}")))?;
            let r = open_root(&root, &path)?;
            r.write(&path.dirs(), path.name(), &bytes)
                .map_err(|e| map(e, &path))
        })
        .await
    }

    /// Deletes one regular file.
    pub async fn delete(&self, agent_id: &str, path: WsPath) -> Result<(), GatewayError> {
        let root = self.dir(agent_id)?;
        Self::blocking(move || {
            let r = open_root(&root, &path)?;
            r.delete(&path.dirs(), path.name())
                .map_err(|e| map(e, &path))
        })
        .await
    }
}

/// The workspace root; a workspace that does not exist yet has no file (-32001).
fn open_root(root: &Path, path: &WsPath) -> Result<Root, GatewayError> {
    Root::open(root).map_err(|e| match e {
        Error::NotFound => GatewayError::not_found("File", path.shown()),
        e => map(e, path),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn paths_are_checked_segment_by_segment() {
        let private = vec![".netrc".to_owned(), "gates/".to_owned()];
        let ok = |p: &str| check_path(p, "filePath", &private).map(|w| w.shown());
        assert_eq!(ok("a/b.txt").unwrap(), "a/b.txt");
        assert_eq!(ok("dir/").unwrap(), "dir");
        for bad in [
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a/.",
            ".git/config",
            "x/.GIT/HEAD",
            "a\0b",
            "a\\b",
            ".netrc",
            "deep/.netrc",
            "gates/check.sh",
            "gates",
        ] {
            assert!(ok(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            ok("notgates/x").unwrap(),
            "notgates/x",
            "a root path, not a segment"
        );
        let deep = vec!["d"; MAX_SEGMENTS].join("/");
        assert!(ok(&deep).is_ok(), "at the limit");
        assert!(ok(&format!("{deep}/d")).is_err(), "past it");
    }
}
