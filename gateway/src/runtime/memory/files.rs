//! The one judgement of which workspace files count as an agent's memory files (`MEMORY.md`
//! and `memory/**`), and the bounded read of one, shared by `memory.get_file` and every tool
//! that reads memory files.
//!
//! An agent's workspace holds the operator's content for that agent (instructions, templates,
//! skills, memory files) next to things that must never leave it (`.git/`, `.netrc`, a gate's
//! files). Only the memory files are readable through the API, so the rule is an allow-list
//! judged twice: on the requested path as written, and again on the path the file system
//! resolves it to (so a symlink, even one inside `memory/`, cannot lead anywhere else).

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::api::error::GatewayError;

/// The memory file at the top of a workspace.
pub const MEMORY_FILE: &str = "MEMORY.md";
/// The directory of further memory files (any depth).
pub const MEMORY_DIR: &str = "memory";
/// Largest memory file read, in bytes.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// Why a request names no readable memory file (the text goes after `'path': `).
fn refused(why: &str) -> GatewayError {
    GatewayError::InvalidParams(format!("'path': {why}"))
}

fn missing(path: &str) -> GatewayError {
    let shown: String = path.chars().take(200).filter(|c| !c.is_control()).collect();
    GatewayError::not_found("File", shown)
}

/// Whether `segments` (a relative path split on `/`) name a memory file: `MEMORY.md`, or a
/// path below `memory/`, with no empty segment and no segment starting with `.` (which also
/// refuses `.` and `..`, so nothing here depends on how a path is normalised).
fn allowed<'a>(mut segments: impl Iterator<Item = &'a str>) -> bool {
    let Some(first) = segments.next() else {
        return false;
    };
    let mut rest = 0usize;
    for s in segments {
        if s.is_empty() || s.starts_with('.') {
            return false;
        }
        rest += 1;
    }
    match first {
        MEMORY_FILE => rest == 0,
        MEMORY_DIR => rest > 0,
        _ => false,
    }
}

/// The judgement on the path as requested: relative, no NUL, no dot segment, `MEMORY.md` or
/// under `memory/`. -32602 naming `path` otherwise.
pub fn check_requested(path: &str) -> Result<(), GatewayError> {
    if path.contains('\0') {
        return Err(refused("must not contain a NUL character"));
    }
    if path.starts_with('/') {
        return Err(refused(
            "must be relative to the agent workspace, not absolute",
        ));
    }
    if path.split('/').any(|s| s.starts_with('.')) {
        return Err(refused(
            "must not contain a segment starting with '.' (no '..', no dotfiles)",
        ));
    }
    if !allowed(path.split('/')) {
        return Err(refused(
            "only MEMORY.md and files under memory/ can be read",
        ));
    }
    Ok(())
}

/// Resolves a requested memory file to its canonical path inside `workspace`: the requested
/// path passes [`check_requested`], and the resolved file (every symlink followed) is itself
/// a memory file of the same workspace (-32602 naming `path` otherwise). A workspace or file
/// that does not exist is -32001.
pub async fn resolve(workspace: &Path, path: &str) -> Result<PathBuf, GatewayError> {
    check_requested(path)?;
    let root = tokio::fs::canonicalize(workspace)
        .await
        .map_err(|_| missing(path))?;
    let full = tokio::fs::canonicalize(root.join(path))
        .await
        .map_err(|_| missing(path))?;
    let inside = full
        .strip_prefix(&root)
        .ok()
        .and_then(|rel| {
            rel.components()
                .map(|c| c.as_os_str().to_str())
                .collect::<Option<Vec<&str>>>()
        })
        .is_some_and(|segments| allowed(segments.into_iter()));
    if !inside {
        return Err(refused(
            "resolves to a file that is not one of the agent's memory files",
        ));
    }
    Ok(full)
}

/// Reads one memory file as UTF-8 text: [`resolve`], then a regular file of at most
/// [`MAX_FILE_BYTES`] (-32602 naming `path` otherwise), read through the handle that was
/// checked.
pub async fn read(workspace: &Path, path: &str) -> Result<String, GatewayError> {
    let full = resolve(workspace, path).await?;
    let shown = path.to_owned();
    tokio::task::spawn_blocking(move || -> Result<String, GatewayError> {
        let file = std::fs::File::open(&full).map_err(|_| missing(&shown))?;
        let meta = file.metadata().map_err(|_| missing(&shown))?;
        if !meta.is_file() {
            return Err(missing(&shown));
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(refused(&format!(
                "the file is larger than {MAX_FILE_BYTES} bytes"
            )));
        }
        // Bounded by the limit, whatever the file grew to since the check above.
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|_| missing(&shown))?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(refused(&format!(
                "the file is larger than {MAX_FILE_BYTES} bytes"
            )));
        }
        String::from_utf8(bytes).map_err(|_| refused("the file is not UTF-8 text"))
    })
    .await
    .map_err(|e| GatewayError::Internal(format!("memory file read: {e}")))?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn code(r: Result<String, GatewayError>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(GatewayError::InvalidParams(m)) => {
                assert!(m.starts_with("'path':"), "{m}");
                "invalid"
            }
            Err(GatewayError::NotFound(_)) => "missing",
            Err(e) => panic!("unexpected {e:?}"),
        }
    }

    /// A workspace with memory files, secrets beside them, and a secret outside it.
    fn workspace() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        std::fs::create_dir_all(ws.join("memory/deep")).unwrap();
        std::fs::create_dir_all(ws.join(".git")).unwrap();
        std::fs::create_dir_all(ws.join("a")).unwrap();
        std::fs::write(ws.join("MEMORY.md"), "top\nsecond").unwrap();
        std::fs::write(ws.join("memory/notes.md"), "notes").unwrap();
        std::fs::write(ws.join("memory/deep/x.md"), "deep").unwrap();
        std::fs::write(ws.join("memory/.hidden"), "hidden").unwrap();
        std::fs::write(ws.join(".netrc"), "machine x password y").unwrap();
        std::fs::write(ws.join(".git/config"), "[credential]").unwrap();
        std::fs::write(ws.join("AGENTS.md"), "instructions").unwrap();
        std::fs::write(tmp.path().join("outside.txt"), "outside").unwrap();
        let link = |target: &Path, at: &str| std::os::unix::fs::symlink(target, ws.join(at));
        link(&tmp.path().join("outside.txt"), "memory/out.md").unwrap();
        link(&ws.join(".netrc"), "memory/netrc.md").unwrap();
        link(&ws.join("memory/notes.md"), "memory/alias.md").unwrap();
        link(tmp.path(), "memory/up").unwrap();
        (tmp, ws)
    }

    #[tokio::test]
    async fn memory_files_are_read() {
        let (_t, ws) = workspace();
        assert_eq!(read(&ws, "MEMORY.md").await.unwrap(), "top\nsecond");
        assert_eq!(read(&ws, "memory/notes.md").await.unwrap(), "notes");
        assert_eq!(read(&ws, "memory/deep/x.md").await.unwrap(), "deep");
        // A symlink from one memory file to another stays a memory file.
        assert_eq!(read(&ws, "memory/alias.md").await.unwrap(), "notes");
    }

    #[tokio::test]
    async fn everything_else_is_refused() {
        let (_t, ws) = workspace();
        for p in [
            ".netrc",
            ".git/config",
            "a/../.git/x",
            "memory/../.netrc",
            "memory/../MEMORY.md",
            "./MEMORY.md",
            "memory/./notes.md",
            "memory/.hidden",
            "memory//notes.md",
            "memory/",
            "memory",
            "AGENTS.md",
            "/etc/passwd",
            "memory/out.md",
            "memory/netrc.md",
            "memory/up/outside.txt",
            "memory/notes.md\0",
            "",
        ] {
            assert_eq!(code(read(&ws, p).await), "invalid", "{p:?}");
        }
    }

    #[tokio::test]
    async fn missing_memory_files_are_not_found() {
        let (_t, ws) = workspace();
        assert_eq!(code(read(&ws, "memory/none.md").await), "missing");
        assert_eq!(code(read(&ws, "memory/deep").await), "missing");
        assert_eq!(code(read(&ws.join("gone"), "MEMORY.md").await), "missing");
    }

    #[tokio::test]
    async fn size_limit_at_and_past() {
        let (_t, ws) = workspace();
        let at = "a".repeat(MAX_FILE_BYTES as usize);
        std::fs::write(ws.join("memory/at.md"), &at).unwrap();
        assert_eq!(read(&ws, "memory/at.md").await.unwrap().len(), at.len());
        std::fs::write(ws.join("memory/past.md"), format!("{at}a")).unwrap();
        assert_eq!(code(read(&ws, "memory/past.md").await), "invalid");
        std::fs::write(ws.join("memory/bin.md"), [0xff, 0xfe]).unwrap();
        assert_eq!(code(read(&ws, "memory/bin.md").await), "invalid");
    }
}
