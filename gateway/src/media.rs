//! The media store: files saved by agents and tools, served by `GET /media/<id>`.
//!
//! Layout under the root: `files/<id>` holds the bytes and `meta/<id>.json` the sidecar
//! (content type, save time, size, original name). Temp files start with `~`, which no id
//! may contain, so they never collide with stored media. Every lookup validates the id,
//! then checks that the resolved path stays inside the root.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::fs;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::warn;

/// Longest accepted id, in bytes.
const ID_MAX: usize = 200;
/// Longest accepted extension for generated ids.
const EXT_MAX: usize = 16;
/// Longest accepted content type.
const TYPE_MAX: usize = 200;
/// Longest kept original file name, in characters.
const FILE_NAME_MAX: usize = 255;
/// Largest sidecar the store will read.
const SIDECAR_MAX: u64 = 64 * 1024;
/// Age after which a leftover temp file is swept.
const TEMP_MAX_AGE_MS: i64 = 60 * 60 * 1000;
/// First character of temp file names; never valid in an id.
const TEMP_PREFIX: char = '~';
/// Content type when nothing better is known.
const FALLBACK_TYPE: &str = "application/octet-stream";
const FILES_DIR: &str = "files";
const META_DIR: &str = "meta";

/// What a media store operation can fail with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MediaError {
    /// The id breaks the id rules; nothing was looked up.
    #[error("invalid media id")]
    InvalidId,
    /// No such file (or it resolves outside the root).
    #[error("media not found")]
    NotFound,
    /// The file is older than the store's TTL.
    #[error("media expired")]
    Expired,
    /// `save_as` was given an id that is already taken.
    #[error("a media file with this id already exists")]
    AlreadyExists,
    /// The bytes exceed the store's limit (the limit is given).
    #[error("media file exceeds {0} bytes")]
    TooLarge(u64),
    /// A filesystem operation failed; the text is for the log.
    #[error("media store I/O failed: {0}")]
    Io(String),
}

/// Facts about one stored file, as served by `GET /media/<id>/meta`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MediaMeta {
    /// The media id.
    pub id: String,
    /// The content type to serve the file with.
    pub content_type: String,
    /// When the file was saved, in unix milliseconds.
    pub saved_at: i64,
    /// Size in bytes.
    pub size: u64,
    /// The original file name, if the saver gave one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub file_name: Option<String>,
}

/// A stored file found by [`MediaStore::get`].
#[derive(Debug, Clone, PartialEq)]
pub struct MediaFile {
    /// Its metadata.
    pub meta: MediaMeta,
    /// Canonical path of the bytes, inside the root.
    pub path: PathBuf,
    /// The tenant it belongs to (None: admin only).
    pub owner: Option<String>,
}

impl MediaFile {
    /// False for active content (HTML, SVG, XML, scripts), which must be served as an
    /// attachment; true when the file may be shown inline.
    pub fn inline(&self) -> bool {
        !is_active(&self.meta.content_type)
    }
}

/// The sidecar stored in `meta/<id>.json`. Read leniently: missing fields fall back.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Sidecar {
    #[serde(skip_serializing_if = "Option::is_none")]
    content_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    saved_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    file_name: Option<String>,
    /// The tenant (client id) the file belongs to; absent: admin only (files saved before
    /// files had owners, or saved by the gateway itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
}

fn id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')
}

/// True when `id` is 1 to 200 of ASCII letters, digits, `.`, `-`, `_`, and not `.` or `..`.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= ID_MAX && id != "." && id != ".." && id.chars().all(id_char)
}

/// The extension for a generated id, or None when it breaks the rules.
fn clean_ext(raw: &str) -> Option<&str> {
    let ext = raw.strip_prefix('.').unwrap_or(raw);
    let ok = !ext.is_empty() && ext.len() <= EXT_MAX && ext.chars().all(id_char);
    ok.then_some(ext)
}

/// RFC 9110 token character.
fn token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// A caller's content type if it looks like `type/subtype[; params]`, trimmed.
fn clean_content_type(raw: &str) -> Option<String> {
    let s = raw.trim();
    if s.is_empty() || s.len() > TYPE_MAX || !s.chars().all(|c| (' '..='~').contains(&c)) {
        return None;
    }
    let essence = s.split_once(';').map_or(s, |(e, _)| e).trim();
    let (kind, sub) = essence.split_once('/')?;
    let ok = !kind.is_empty()
        && !sub.is_empty()
        && kind.chars().all(token_char)
        && sub.chars().all(token_char);
    ok.then(|| s.to_string())
}

/// The first content type guessed from a name's extension.
fn guess_type(name: &str) -> Option<String> {
    mime_guess::from_path(name)
        .first()
        .map(|m| m.essence_str().to_string())
}

/// Content that a browser could execute when shown inline.
fn is_active(content_type: &str) -> bool {
    let lower = content_type.to_ascii_lowercase();
    let essence = lower
        .split_once(';')
        .map_or(lower.as_str(), |(e, _)| e)
        .trim();
    matches!(
        essence,
        "text/html"
            | "application/xhtml+xml"
            | "image/svg+xml"
            | "text/xml"
            | "application/xml"
            | "text/xsl"
    ) || essence.ends_with("+xml")
        || lower.contains("javascript")
        || lower.contains("ecmascript")
}

/// Invisible characters used to disguise file names (bidi overrides, zero widths).
fn disguising_char(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
}

/// The last path component of a caller's file name, without control characters.
fn clean_file_name(raw: &str) -> Option<String> {
    let base = raw.rsplit(['/', '\\']).find(|p| !p.trim().is_empty())?;
    let cleaned: String = base
        .chars()
        .filter(|c| !c.is_control() && !disguising_char(*c))
        .take(FILE_NAME_MAX)
        .collect();
    let name = cleaned.trim();
    (!name.is_empty() && name != "." && name != "..").then(|| name.to_string())
}

fn system_time_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_millis()).map_or(i64::MIN, |v| -v),
    }
}

fn mtime_ms(md: &std::fs::Metadata) -> Option<i64> {
    md.modified().ok().map(system_time_ms)
}

fn older_than(saved_at: i64, now_ms: i64, max_age_ms: i64) -> bool {
    now_ms.saturating_sub(saved_at) > max_age_ms
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn missing(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory)
}

fn io_err(what: &str, e: std::io::Error) -> MediaError {
    MediaError::Io(format!("{what}: {e}"))
}

/// Removes a file or symlink (never its target); a missing one is not an error.
async fn remove_if_present(path: &Path) -> std::io::Result<bool> {
    match fs::remove_file(path).await {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

async fn create_private_dir(path: &Path) -> std::io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    builder.mode(0o700);
    builder.create(path).await
}

/// Writes `bytes` to a new private temp file in `dir` and returns its path.
async fn write_temp(dir: &Path, bytes: &[u8]) -> Result<PathBuf, MediaError> {
    let tmp = dir.join(format!(
        "{TEMP_PREFIX}{}.tmp",
        uuid::Uuid::new_v4().simple()
    ));
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let mut file = opts
        .open(&tmp)
        .await
        .map_err(|e| io_err("creating temp file", e))?;
    let written = async {
        file.write_all(bytes).await?;
        file.flush().await?;
        file.sync_all().await
    }
    .await;
    drop(file);
    if let Err(e) = written {
        discard(&tmp).await;
        return Err(io_err("writing temp file", e));
    }
    Ok(tmp)
}

/// Best-effort removal of a file the store no longer wants.
async fn discard(path: &Path) {
    if let Err(e) = remove_if_present(path).await {
        warn!(path = %path.display(), error = %e, "media: could not remove file");
    }
}

/// The media store. Cheap to share in an `Arc`.
#[derive(Debug)]
pub struct MediaStore {
    root: PathBuf,
    files: PathBuf,
    meta: PathBuf,
    ttl: Option<Duration>,
    max_bytes: u64,
}

impl MediaStore {
    /// Opens the store at `root`, creating `root/files` and `root/meta` (mode 0700) if
    /// missing. Fails when either is not a real directory (a symlink is refused).
    /// `ttl` None means files never expire; `max_bytes` caps each saved file.
    pub async fn open(
        root: PathBuf,
        ttl: Option<Duration>,
        max_bytes: u64,
    ) -> Result<Self, MediaError> {
        for dir in [FILES_DIR, META_DIR] {
            create_private_dir(&root.join(dir))
                .await
                .map_err(|e| io_err("creating media directory", e))?;
        }
        let root = fs::canonicalize(&root)
            .await
            .map_err(|e| io_err("resolving media root", e))?;
        let files = root.join(FILES_DIR);
        let meta = root.join(META_DIR);
        for dir in [&files, &meta] {
            let md = fs::symlink_metadata(dir)
                .await
                .map_err(|e| io_err("inspecting media directory", e))?;
            if !md.is_dir() {
                return Err(MediaError::Io(format!(
                    "{} is not a directory",
                    dir.display()
                )));
            }
        }
        Ok(Self {
            root,
            files,
            meta,
            ttl,
            max_bytes,
        })
    }

    /// The canonical media root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Saves `bytes` under a new id: a v4 uuid (simple form) plus `.<ext>` when `ext` is
    /// valid (id characters, at most 16; a leading dot is ignored), else no extension.
    /// The content type is the caller's if well-formed, else guessed from the extension
    /// or `file_name`, else `application/octet-stream`.
    pub async fn save(
        &self,
        owner: Option<&str>,
        bytes: &[u8],
        content_type: Option<&str>,
        ext: Option<&str>,
        file_name: Option<&str>,
    ) -> Result<MediaMeta, MediaError> {
        let mut id = uuid::Uuid::new_v4().simple().to_string();
        if let Some(ext) = ext.and_then(clean_ext) {
            id.push('.');
            id.push_str(ext);
        }
        self.write_new(id, owner, bytes, content_type, file_name)
            .await
    }

    /// Saves `bytes` under a caller-chosen id, which must be valid and not taken
    /// (an expired file that was not swept yet still takes its id).
    pub async fn save_as(
        &self,
        owner: Option<&str>,
        id: &str,
        bytes: &[u8],
        content_type: Option<&str>,
        file_name: Option<&str>,
    ) -> Result<MediaMeta, MediaError> {
        if !valid_id(id) {
            return Err(MediaError::InvalidId);
        }
        self.write_new(id.to_string(), owner, bytes, content_type, file_name)
            .await
    }

    /// Finds a file: validates the id, resolves the path and checks it stays inside
    /// `files/`, then checks the TTL against `now_ms` (unix ms).
    pub async fn get(&self, id: &str, now_ms: i64) -> Result<MediaFile, MediaError> {
        if !valid_id(id) {
            return Err(MediaError::InvalidId);
        }
        let path = match fs::canonicalize(self.files.join(id)).await {
            Ok(p) => p,
            Err(e) if missing(&e) => return Err(MediaError::NotFound),
            Err(e) => return Err(io_err("resolving media file", e)),
        };
        if !path.starts_with(&self.files) {
            warn!(id, "media: file resolves outside the media root; refused");
            return Err(MediaError::NotFound);
        }
        let md = match fs::metadata(&path).await {
            Ok(md) => md,
            Err(e) if missing(&e) => return Err(MediaError::NotFound),
            Err(e) => return Err(io_err("inspecting media file", e)),
        };
        if !md.is_file() {
            return Err(MediaError::NotFound);
        }
        let sidecar = self.read_sidecar(id).await;
        let saved_at = sidecar.saved_at.or_else(|| mtime_ms(&md)).unwrap_or(now_ms);
        if self.expired(saved_at, now_ms) {
            return Err(MediaError::Expired);
        }
        let content_type = sidecar
            .content_type
            .as_deref()
            .and_then(clean_content_type)
            .or_else(|| guess_type(id))
            .unwrap_or_else(|| FALLBACK_TYPE.to_string());
        let file_name = sidecar.file_name.as_deref().and_then(clean_file_name);
        Ok(MediaFile {
            meta: MediaMeta {
                id: id.to_string(),
                content_type,
                saved_at,
                size: md.len(),
                file_name,
            },
            path,
            owner: sidecar.owner,
        })
    }

    /// Like [`get`](Self::get), for a caller reaching `tenant`: a file of another tenant (or
    /// without an owner, unless the caller is admin) is NotFound, as a missing one.
    pub async fn get_for(
        &self,
        id: &str,
        now_ms: i64,
        tenant: &crate::api::tenancy::Tenant,
    ) -> Result<MediaFile, MediaError> {
        let file = self.get(id, now_ms).await?;
        if tenant.reaches(file.owner.as_deref()) {
            Ok(file)
        } else {
            Err(MediaError::NotFound)
        }
    }

    /// Removes expired files with their sidecars, orphan sidecars, and temp files older
    /// than an hour. Returns how many media files were removed. Problems with single
    /// entries are logged and skipped; only entries directly inside `files/` and `meta/`
    /// are touched, and symlinks are removed, never followed.
    pub async fn sweep(&self, now_ms: i64) -> Result<usize, MediaError> {
        let mut removed = 0;
        for name in list_names(&self.files).await? {
            match self.sweep_file(&name, now_ms).await {
                Ok(true) => removed += 1,
                Ok(false) => {}
                Err(e) => warn!(entry = %name, error = %e, "media: sweep skipped a file"),
            }
        }
        for name in list_names(&self.meta).await? {
            if let Err(e) = self.sweep_sidecar(&name, now_ms).await {
                warn!(entry = %name, error = %e, "media: sweep skipped a sidecar");
            }
        }
        Ok(removed)
    }

    fn expired(&self, saved_at: i64, now_ms: i64) -> bool {
        self.ttl
            .is_some_and(|ttl| older_than(saved_at, now_ms, duration_ms(ttl)))
    }

    fn sidecar_path(&self, id: &str) -> PathBuf {
        self.meta.join(format!("{id}.json"))
    }

    async fn write_new(
        &self,
        id: String,
        owner: Option<&str>,
        bytes: &[u8],
        content_type: Option<&str>,
        file_name: Option<&str>,
    ) -> Result<MediaMeta, MediaError> {
        let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        if size > self.max_bytes {
            return Err(MediaError::TooLarge(self.max_bytes));
        }
        let file_name = file_name.and_then(clean_file_name);
        let content_type = content_type
            .and_then(clean_content_type)
            .or_else(|| guess_type(&id))
            .or_else(|| file_name.as_deref().and_then(guess_type))
            .unwrap_or_else(|| FALLBACK_TYPE.to_string());
        let dest = self.files.join(&id);
        // Cheap early answer; the link below is what makes it race-free.
        if fs::symlink_metadata(&dest).await.is_ok() {
            return Err(MediaError::AlreadyExists);
        }
        let saved_at = chrono::Utc::now().timestamp_millis();
        let tmp = write_temp(&self.files, bytes).await?;
        let placed = place_new(&tmp, &dest).await;
        discard(&tmp).await;
        placed?;

        let sidecar = Sidecar {
            content_type: Some(content_type.clone()),
            saved_at: Some(saved_at),
            size: Some(size),
            file_name: file_name.clone(),
            owner: owner.map(str::to_owned),
        };
        if let Err(e) = self.write_sidecar(&id, &sidecar).await {
            discard(&dest).await;
            return Err(e);
        }
        Ok(MediaMeta {
            id,
            content_type,
            saved_at,
            size,
            file_name,
        })
    }

    async fn write_sidecar(&self, id: &str, sidecar: &Sidecar) -> Result<(), MediaError> {
        let json = serde_json::to_vec(sidecar)
            .map_err(|e| MediaError::Io(format!("encoding sidecar: {e}")))?;
        let tmp = write_temp(&self.meta, &json).await?;
        if let Err(e) = fs::rename(&tmp, self.sidecar_path(id)).await {
            discard(&tmp).await;
            return Err(io_err("placing sidecar", e));
        }
        Ok(())
    }

    /// The sidecar for `id`, or an empty one when it is missing, unreadable, malformed or
    /// resolves outside `meta/`.
    async fn read_sidecar(&self, id: &str) -> Sidecar {
        match self.try_read_sidecar(id).await {
            Ok(sidecar) => sidecar.unwrap_or_default(),
            Err(e) => {
                warn!(id, error = %e, "media: ignoring sidecar");
                Sidecar::default()
            }
        }
    }

    async fn try_read_sidecar(&self, id: &str) -> Result<Option<Sidecar>, String> {
        let path = match fs::canonicalize(self.sidecar_path(id)).await {
            Ok(p) => p,
            Err(e) if missing(&e) => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        if !path.starts_with(&self.meta) {
            return Err("sidecar resolves outside the media root".to_string());
        }
        // Checked before opening: opening a FIFO would block.
        let md = fs::metadata(&path).await.map_err(|e| e.to_string())?;
        if !md.is_file() {
            return Err("sidecar is not a regular file".to_string());
        }
        let file = fs::File::open(&path).await.map_err(|e| e.to_string())?;
        let mut bytes = Vec::new();
        file.take(SIDECAR_MAX + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| e.to_string())?;
        if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > SIDECAR_MAX {
            return Err("sidecar is too large".to_string());
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("malformed sidecar: {e}"))
    }

    /// Sweeps one entry of `files/`; true when a media file was removed.
    async fn sweep_file(&self, name: &str, now_ms: i64) -> std::io::Result<bool> {
        let path = self.files.join(name);
        let md = fs::symlink_metadata(&path).await?;
        if md.is_dir() {
            return Ok(false);
        }
        if name.starts_with(TEMP_PREFIX) {
            if stale_temp(&md, now_ms) {
                remove_if_present(&path).await?;
            }
            return Ok(false);
        }
        if !valid_id(name) || self.ttl.is_none() {
            return Ok(false);
        }
        let saved_at = self
            .read_sidecar(name)
            .await
            .saved_at
            .or_else(|| mtime_ms(&md))
            .unwrap_or(now_ms);
        if !self.expired(saved_at, now_ms) {
            return Ok(false);
        }
        // Sidecar first: while the file remains, its id stays taken, so a concurrent
        // save_as cannot slip in and lose its new sidecar.
        remove_if_present(&self.sidecar_path(name)).await?;
        remove_if_present(&path).await
    }

    /// Sweeps one entry of `meta/`: stale temp files and sidecars without a file.
    async fn sweep_sidecar(&self, name: &str, now_ms: i64) -> std::io::Result<()> {
        let path = self.meta.join(name);
        let md = fs::symlink_metadata(&path).await?;
        if md.is_dir() {
            return Ok(());
        }
        if name.starts_with(TEMP_PREFIX) {
            if stale_temp(&md, now_ms) {
                remove_if_present(&path).await?;
            }
            return Ok(());
        }
        let Some(id) = name.strip_suffix(".json").filter(|id| valid_id(id)) else {
            return Ok(());
        };
        match fs::symlink_metadata(self.files.join(id)).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => remove_if_present(&path).await.map(|_| ()),
            Err(e) => Err(e),
        }
    }
}

/// Puts the temp file at `dest` unless `dest` exists. A hard link refuses to replace an
/// existing name; where links are unsupported, falls back to check-then-rename.
async fn place_new(tmp: &Path, dest: &Path) -> Result<(), MediaError> {
    match fs::hard_link(tmp, dest).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(MediaError::AlreadyExists),
        Err(link_err) => match fs::symlink_metadata(dest).await {
            Ok(_) => Err(MediaError::AlreadyExists),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                tracing::debug!(error = %link_err, "media: hard link failed; renaming");
                fs::rename(tmp, dest)
                    .await
                    .map_err(|e| io_err("placing media file", e))
            }
            Err(e) => Err(io_err("inspecting media file", e)),
        },
    }
}

fn stale_temp(md: &std::fs::Metadata, now_ms: i64) -> bool {
    mtime_ms(md).is_some_and(|m| older_than(m, now_ms, TEMP_MAX_AGE_MS))
}

/// UTF-8 names of the entries directly inside `dir`; others are skipped.
async fn list_names(dir: &Path) -> Result<Vec<String>, MediaError> {
    let mut entries = fs::read_dir(dir)
        .await
        .map_err(|e| io_err("listing media directory", e))?;
    let mut names = Vec::new();
    loop {
        match entries.next_entry().await {
            Ok(Some(entry)) => {
                if let Ok(name) = entry.file_name().into_string() {
                    names.push(name);
                }
            }
            Ok(None) => break,
            Err(e) => {
                warn!(dir = %dir.display(), error = %e, "media: listing stopped early");
                break;
            }
        }
    }
    Ok(names)
}

/// Sweeps expired media files every `every`, until the store is dropped (its generation ended).
/// Nodes sharing a database (and a media volume) take turns: a sweep runs on the node holding
/// the `media_sweep` lease.
pub fn spawn_sweeper(
    store: std::sync::Weak<crate::media::MediaStore>,
    db: crate::store::Store,
    every: std::time::Duration,
) {
    #[allow(
        clippy::disallowed_methods,
        reason = "ends with its generation: it holds the media store weakly"
    )]
    tokio::spawn(async move {
        loop {
            {
                let Some(store) = store.upgrade() else { return };
                let now = crate::clock::now_ms();
                let ttl = i64::try_from(every.as_millis()).unwrap_or(i64::MAX) / 2;
                if db.takes_turn("media_sweep", now, ttl).await {
                    match store.sweep(now).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(removed = n, "expired media files swept"),
                        Err(e) => tracing::warn!(error = %e, "media sweep failed"),
                    }
                }
            }
            tokio::time::sleep(every).await;
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    const MB: u64 = 1024 * 1024;

    async fn store(ttl: Option<Duration>) -> (tempfile::TempDir, MediaStore) {
        let tmp = tempfile::tempdir().unwrap();
        let store = MediaStore::open(tmp.path().join("media"), ttl, MB)
            .await
            .unwrap();
        (tmp, store)
    }

    fn now() -> i64 {
        chrono::Utc::now().timestamp_millis()
    }

    fn put_raw(store: &MediaStore, id: &str, bytes: &[u8]) {
        std::fs::write(store.root().join("files").join(id), bytes).unwrap();
    }

    fn put_sidecar(store: &MediaStore, id: &str, json: &str) {
        std::fs::write(store.root().join("meta").join(format!("{id}.json")), json).unwrap();
    }

    fn set_mtime(path: &Path, ms_ago: u64) {
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() - Duration::from_millis(ms_ago))
            .unwrap();
    }

    #[test]
    fn store_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<MediaStore>();
    }

    #[tokio::test]
    async fn save_and_get_round_trip() {
        let (_tmp, store) = store(None).await;
        let saved = store
            .save(
                None,
                b"hello",
                Some("text/plain; charset=utf-8"),
                Some("txt"),
                Some("notes/hi.txt"),
            )
            .await
            .unwrap();
        assert_eq!(saved.content_type, "text/plain; charset=utf-8");
        assert_eq!(saved.size, 5);
        assert_eq!(saved.file_name.as_deref(), Some("hi.txt"));
        assert!(saved.id.ends_with(".txt"));
        assert_eq!(saved.id.len(), 32 + 4);
        assert!(valid_id(&saved.id));

        let got = store.get(&saved.id, now()).await.unwrap();
        assert_eq!(got.meta, saved);
        assert!(got.path.starts_with(store.root()));
        assert_eq!(std::fs::read(&got.path).unwrap(), b"hello");

        let sidecar: serde_json::Value = serde_json::from_slice(
            &std::fs::read(store.root().join("meta").join(format!("{}.json", saved.id))).unwrap(),
        )
        .unwrap();
        assert_eq!(sidecar["contentType"], "text/plain; charset=utf-8");
        assert_eq!(sidecar["savedAt"], saved.saved_at);
        assert_eq!(sidecar["size"], 5);
        assert_eq!(sidecar["fileName"], "hi.txt");

        let json = serde_json::to_value(&got.meta).unwrap();
        assert_eq!(json["contentType"], "text/plain; charset=utf-8");
        assert_eq!(json["savedAt"], saved.saved_at);
        let names: Vec<_> = std::fs::read_dir(store.root().join("files"))
            .unwrap()
            .collect();
        assert_eq!(names.len(), 1, "no temp file is left behind");
    }

    #[tokio::test]
    async fn sidecar_type_wins_over_extension() {
        let (_tmp, store) = store(None).await;
        store
            .save_as(None, "pic.png", b"x", Some("image/webp"), None)
            .await
            .unwrap();
        let got = store.get("pic.png", now()).await.unwrap();
        assert_eq!(got.meta.content_type, "image/webp");
        assert_eq!(got.meta.file_name, None);
        let json = serde_json::to_value(&got.meta).unwrap();
        assert!(json.get("fileName").is_none());
    }

    #[tokio::test]
    async fn generated_ids_drop_bad_extensions() {
        let (_tmp, store) = store(None).await;
        for ext in ["../x", "a/b", "", ".", "p ng", "é", "abcdefghijklmnopq"] {
            let meta = store.save(None, b"x", None, Some(ext), None).await.unwrap();
            assert_eq!(meta.id.len(), 32, "ext {ext:?} must be dropped");
            assert_eq!(meta.content_type, FALLBACK_TYPE);
        }
        let meta = store
            .save(None, b"x", None, Some(".png"), None)
            .await
            .unwrap();
        assert!(meta.id.ends_with(".png") && !meta.id.ends_with("..png"));
        assert_eq!(meta.content_type, "image/png");
        let meta = store
            .save(None, b"x", None, Some("abcdefghijklmnop"), None)
            .await
            .unwrap();
        assert!(meta.id.ends_with(".abcdefghijklmnop"));
        let meta = store.save(None, b"x", None, None, None).await.unwrap();
        assert_eq!(meta.id.len(), 32);
    }

    #[tokio::test]
    async fn content_type_falls_back_to_extension_then_file_name() {
        let (_tmp, store) = store(None).await;
        for bad in [
            "",
            "png",
            "text/",
            "/html",
            "text/html\r\nX-Evil: 1",
            "a/b/c",
            "tëxt/plain",
        ] {
            let meta = store
                .save(None, b"x", Some(bad), Some("png"), None)
                .await
                .unwrap();
            assert_eq!(meta.content_type, "image/png", "for {bad:?}");
        }
        let long = format!("text/{}", "a".repeat(200));
        let meta = store
            .save(None, b"x", Some(&long), None, None)
            .await
            .unwrap();
        assert_eq!(meta.content_type, FALLBACK_TYPE);
        let meta = store
            .save(None, b"x", None, None, Some("report.pdf"))
            .await
            .unwrap();
        assert_eq!(meta.content_type, "application/pdf");
    }

    #[tokio::test]
    async fn type_from_extension_without_sidecar() {
        let (_tmp, store) = store(None).await;
        store
            .save_as(None, "doc.pdf", b"%PDF", Some("application/x-custom"), None)
            .await
            .unwrap();
        std::fs::remove_file(store.root().join("meta/doc.pdf.json")).unwrap();
        let got = store.get("doc.pdf", now()).await.unwrap();
        assert_eq!(got.meta.content_type, "application/pdf");
        assert_eq!(got.meta.size, 4);
        // savedAt comes from the mtime
        assert!((now() - got.meta.saved_at).abs() < 60_000);

        put_raw(&store, "shot.png", b"png");
        let got = store.get("shot.png", now()).await.unwrap();
        assert_eq!(got.meta.content_type, "image/png");
    }

    #[tokio::test]
    async fn malformed_sidecar_is_ignored() {
        let (_tmp, store) = store(None).await;
        put_raw(&store, "a.png", b"png");
        put_sidecar(&store, "a.png", "{not json");
        let got = store.get("a.png", now()).await.unwrap();
        assert_eq!(got.meta.content_type, "image/png");
        put_sidecar(
            &store,
            "a.png",
            r#"{"contentType":"bogus\u0000/x","fileName":"../../x\u202egnp.exe"}"#,
        );
        let got = store.get("a.png", now()).await.unwrap();
        assert_eq!(got.meta.content_type, "image/png");
        assert_eq!(got.meta.file_name.as_deref(), Some("xgnp.exe"));
        let huge = format!(
            r#"{{"contentType":"text/plain","pad":"{}"}}"#,
            "a".repeat(70_000)
        );
        put_sidecar(&store, "a.png", &huge);
        let got = store.get("a.png", now()).await.unwrap();
        assert_eq!(got.meta.content_type, "image/png");
    }

    #[tokio::test]
    async fn octet_stream_fallback() {
        let (_tmp, store) = store(None).await;
        put_raw(&store, "blob", b"?");
        put_raw(&store, "x.notarealext", b"?");
        for id in ["blob", "x.notarealext"] {
            let got = store.get(id, now()).await.unwrap();
            assert_eq!(got.meta.content_type, FALLBACK_TYPE);
        }
        let meta = store.save_as(None, "raw", b"?", None, None).await.unwrap();
        assert_eq!(meta.content_type, FALLBACK_TYPE);
    }

    #[tokio::test]
    async fn ttl_edge() {
        let ttl = Duration::from_secs(60);
        let (_tmp, store) = store(Some(ttl)).await;
        let meta = store
            .save_as(None, "a.png", b"x", None, None)
            .await
            .unwrap();
        let edge = meta.saved_at + 60_000;
        assert!(store.get("a.png", edge).await.is_ok());
        assert_eq!(
            store.get("a.png", edge + 1).await.unwrap_err(),
            MediaError::Expired
        );
        // a clock behind savedAt is not an expiry
        assert!(store.get("a.png", meta.saved_at - 5_000).await.is_ok());
        // extreme clocks do not overflow
        assert_eq!(
            store.get("a.png", i64::MAX).await.unwrap_err(),
            MediaError::Expired
        );
        assert!(store.get("a.png", i64::MIN).await.is_ok());
    }

    #[tokio::test]
    async fn ttl_uses_mtime_without_sidecar() {
        let (_tmp, store) = store(Some(Duration::from_secs(60))).await;
        put_raw(&store, "old.bin", b"x");
        set_mtime(&store.root().join("files/old.bin"), 120_000);
        assert_eq!(
            store.get("old.bin", now()).await.unwrap_err(),
            MediaError::Expired
        );
    }

    #[tokio::test]
    async fn never_expiring_store() {
        let (_tmp, store) = store(None).await;
        let meta = store
            .save_as(None, "a.png", b"x", None, None)
            .await
            .unwrap();
        put_sidecar(
            &store,
            "a.png",
            r#"{"contentType":"image/png","savedAt":0,"size":1}"#,
        );
        assert!(store.get("a.png", i64::MAX).await.is_ok());
        assert_eq!(store.sweep(i64::MAX).await.unwrap(), 0);
        assert!(store.get(&meta.id, i64::MAX).await.is_ok());
    }

    #[tokio::test]
    async fn sweep_removes_expired_orphans_and_stale_temps() {
        let (_tmp, store) = store(Some(Duration::from_secs(60))).await;
        let t = now();
        let root = store.root().to_path_buf();
        store
            .save_as(None, "fresh.png", b"x", None, None)
            .await
            .unwrap();
        store
            .save_as(None, "old.png", b"x", None, None)
            .await
            .unwrap();
        put_sidecar(
            &store,
            "old.png",
            &format!(
                r#"{{"contentType":"image/png","savedAt":{},"size":1}}"#,
                t - 61_000
            ),
        );
        put_raw(&store, "old-nosidecar", b"x");
        set_mtime(&root.join("files/old-nosidecar"), 120_000);
        put_sidecar(
            &store,
            "ghost.png",
            r#"{"contentType":"image/png","savedAt":0,"size":1}"#,
        );
        put_raw(&store, "~stale.tmp", b"x");
        set_mtime(&root.join("files/~stale.tmp"), 2 * 3_600_000);
        put_raw(&store, "~busy.tmp", b"x");
        std::fs::write(root.join("meta/~stale.tmp"), b"x").unwrap();
        set_mtime(&root.join("meta/~stale.tmp"), 2 * 3_600_000);
        std::fs::write(root.join("meta/unrelated.txt"), b"x").unwrap();
        std::fs::create_dir(root.join("files/subdir")).unwrap();

        assert_eq!(store.sweep(t).await.unwrap(), 2);

        assert!(store.get("fresh.png", t).await.is_ok());
        assert!(root.join("meta/fresh.png.json").exists());
        for gone in [
            "files/old.png",
            "meta/old.png.json",
            "files/old-nosidecar",
            "meta/ghost.png.json",
            "files/~stale.tmp",
            "meta/~stale.tmp",
        ] {
            assert!(!root.join(gone).exists(), "{gone} should be swept");
        }
        for kept in ["files/~busy.tmp", "meta/unrelated.txt", "files/subdir"] {
            assert!(root.join(kept).exists(), "{kept} should be kept");
        }
        assert_eq!(
            store.get("old.png", t).await.unwrap_err(),
            MediaError::NotFound
        );
        assert_eq!(store.sweep(t).await.unwrap(), 0);
    }

    const INVALID_IDS: &[&str] = &[
        ".",
        "..",
        "",
        "a/b",
        "a\\b",
        "%2e%2e",
        "..%2f",
        "%252e%252e%252f",
        "../secret.txt",
        "..\\secret.txt",
        "/etc/passwd",
        "files/../../secret.txt",
        "..%2fsecret.txt",
        "ünïcode",
        "a b",
        " ",
        "a\0b",
        "a\nb",
        "~tmp",
        "a:b",
    ];

    #[test]
    fn valid_id_table() {
        for ok in [
            "a", "A.png", "0", "a-b_c.d", "...", "-", "_", ".hidden", "x.tar.gz",
        ] {
            assert!(valid_id(ok), "{ok:?} should be valid");
        }
        assert!(valid_id(&"a".repeat(200)));
        assert!(!valid_id(&"a".repeat(201)));
        assert!(!valid_id(&"é".repeat(100)));
        for bad in INVALID_IDS {
            assert!(!valid_id(bad), "{bad:?} should be invalid");
        }
    }

    #[tokio::test]
    async fn traversal_attempts_never_escape() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("secret.txt"), b"secret").unwrap();
        std::fs::write(tmp.path().join("media.json"), b"{}").unwrap();
        let store = MediaStore::open(tmp.path().join("media"), None, MB)
            .await
            .unwrap();
        let long = "a".repeat(201);
        let ids = INVALID_IDS.iter().copied().chain([
            long.as_str(),
            "secret.txt",
            "...",
            "meta",
            "files",
        ]);
        for id in ids {
            match store.get(id, now()).await {
                Err(MediaError::InvalidId | MediaError::NotFound) => {}
                other => panic!("{id:?} gave {other:?}"),
            }
            match store.save_as(None, id, b"x", None, None).await {
                Err(MediaError::InvalidId) => {}
                Ok(meta) => assert!(valid_id(&meta.id) && meta.id == id),
                Err(e) => panic!("{id:?} save gave {e:?}"),
            }
        }
        assert_eq!(
            std::fs::read(tmp.path().join("secret.txt")).unwrap(),
            b"secret"
        );
        assert_eq!(std::fs::read(tmp.path().join("media.json")).unwrap(), b"{}");
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn symlink_out_of_root_is_not_found() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside.png");
        std::fs::write(&outside, b"secret").unwrap();
        let store = MediaStore::open(tmp.path().join("media"), Some(Duration::from_secs(1)), MB)
            .await
            .unwrap();
        let link = store.root().join("files/link.png");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        assert_eq!(
            store.get("link.png", now()).await.unwrap_err(),
            MediaError::NotFound
        );
        // sweep removes the expired link itself, never the target
        assert_eq!(store.sweep(now() + 10_000).await.unwrap(), 1);
        assert!(std::fs::symlink_metadata(&link).is_err());
        assert_eq!(std::fs::read(&outside).unwrap(), b"secret");
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn symlink_inside_root_is_served() {
        let (_tmp, store) = store(None).await;
        store
            .save_as(None, "real.png", b"x", None, None)
            .await
            .unwrap();
        std::os::unix::fs::symlink("real.png", store.root().join("files/alias.png")).unwrap();
        let got = store.get("alias.png", now()).await.unwrap();
        assert_eq!(got.path, store.root().join("files/real.png"));
        // a link from files/ into meta/ stays refused
        std::os::unix::fs::symlink("../meta/real.png.json", store.root().join("files/m.json"))
            .unwrap();
        assert_eq!(
            store.get("m.json", now()).await.unwrap_err(),
            MediaError::NotFound
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn sidecar_symlink_out_of_root_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("evil.json");
        std::fs::write(&outside, r#"{"contentType":"text/html","savedAt":0}"#).unwrap();
        let store = MediaStore::open(tmp.path().join("media"), Some(Duration::from_secs(60)), MB)
            .await
            .unwrap();
        put_raw(&store, "a.png", b"x");
        std::os::unix::fs::symlink(&outside, store.root().join("meta/a.png.json")).unwrap();
        let got = store.get("a.png", now()).await.unwrap();
        assert_eq!(got.meta.content_type, "image/png");
        // saving over the orphan link replaces the link, not the target
        std::fs::remove_file(store.root().join("files/a.png")).unwrap();
        store
            .save_as(None, "a.png", b"y", None, None)
            .await
            .unwrap();
        assert!(std::fs::read_to_string(&outside)
            .unwrap()
            .contains("text/html"));
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn special_files_are_not_opened() {
        let (_tmp, store) = store(None).await;
        let root = store.root().to_path_buf();
        let mkfifo = |p: PathBuf| {
            std::process::Command::new("mkfifo")
                .arg(p)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !mkfifo(root.join("files/pipe.png")) || !mkfifo(root.join("meta/a.png.json")) {
            return; // no mkfifo here
        }
        put_raw(&store, "a.png", b"x");
        let wait = Duration::from_secs(5);
        let got = tokio::time::timeout(wait, store.get("a.png", now()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.meta.content_type, "image/png");
        let pipe = tokio::time::timeout(wait, store.get("pipe.png", now()))
            .await
            .unwrap();
        assert_eq!(pipe.unwrap_err(), MediaError::NotFound);
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn symlinked_files_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("x.png"), b"secret").unwrap();

        // at open
        let root = tmp.path().join("media1");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("files")).unwrap();
        assert!(matches!(
            MediaStore::open(root, None, MB).await,
            Err(MediaError::Io(_))
        ));

        // swapped in after open
        let store = MediaStore::open(tmp.path().join("media2"), None, MB)
            .await
            .unwrap();
        let files = store.root().join("files");
        std::fs::remove_dir(&files).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &files).unwrap();
        assert_eq!(
            store.get("x.png", now()).await.unwrap_err(),
            MediaError::NotFound
        );
        assert_eq!(store.sweep(now()).await.unwrap(), 0);
        assert!(elsewhere.join("x.png").exists());
    }

    #[tokio::test]
    async fn save_as_existing_id_is_refused() {
        let (_tmp, store) = store(None).await;
        store
            .save_as(None, "a.png", b"one", None, None)
            .await
            .unwrap();
        assert_eq!(
            store
                .save_as(None, "a.png", b"two", None, None)
                .await
                .unwrap_err(),
            MediaError::AlreadyExists
        );
        let got = store.get("a.png", now()).await.unwrap();
        assert_eq!(std::fs::read(got.path).unwrap(), b"one");
        assert_eq!(
            store
                .save_as(None, "../a.png", b"x", None, None)
                .await
                .unwrap_err(),
            MediaError::InvalidId
        );
    }

    #[tokio::test]
    async fn concurrent_save_as_has_one_winner() {
        let (_tmp, store) = store(None).await;
        let store = std::sync::Arc::new(store);
        let mut tasks = Vec::new();
        for i in 0..8u8 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                store.save_as(None, "race.bin", &[i], None, None).await
            }));
        }
        let mut wins = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(_) => wins += 1,
                Err(e) => assert_eq!(e, MediaError::AlreadyExists),
            }
        }
        assert_eq!(wins, 1);
    }

    #[tokio::test]
    async fn size_limit() {
        let tmp = tempfile::tempdir().unwrap();
        let store = MediaStore::open(tmp.path().to_path_buf(), None, 10)
            .await
            .unwrap();
        assert_eq!(
            store
                .save(None, &[0; 10], None, None, None)
                .await
                .unwrap()
                .size,
            10
        );
        assert_eq!(
            store
                .save(None, &[0; 11], None, None, None)
                .await
                .unwrap_err(),
            MediaError::TooLarge(10)
        );
        assert_eq!(
            store
                .save_as(None, "big", &[0; 11], None, None)
                .await
                .unwrap_err(),
            MediaError::TooLarge(10)
        );
        assert!(store.save(None, &[], None, None, None).await.is_ok());
    }

    #[test]
    fn inline_only_for_passive_types() {
        let file = |ct: &str| MediaFile {
            meta: MediaMeta {
                id: "x".into(),
                content_type: ct.into(),
                saved_at: 0,
                size: 0,
                file_name: None,
            },
            path: PathBuf::new(),
            owner: None,
        };
        for active in [
            "text/html",
            "TEXT/HTML; charset=utf-8",
            "image/svg+xml",
            "application/xhtml+xml",
            "text/xml",
            "application/xml",
            "application/javascript",
            "text/javascript",
            "application/x-javascript",
            "text/ecmascript",
            "application/rss+xml",
        ] {
            assert!(!file(active).inline(), "{active} must not be inline");
        }
        for passive in [
            "image/png",
            "image/jpeg",
            "application/pdf",
            "text/plain",
            "video/mp4",
        ] {
            assert!(file(passive).inline(), "{passive} should be inline");
        }
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn private_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let (_tmp, store) = store(None).await;
        let meta = store
            .save(None, b"x", None, Some("png"), None)
            .await
            .unwrap();
        let mode = |p: PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let root = store.root().to_path_buf();
        assert_eq!(mode(root.clone()), 0o700);
        assert_eq!(mode(root.join("files")), 0o700);
        assert_eq!(mode(root.join("meta")), 0o700);
        assert_eq!(mode(root.join("files").join(&meta.id)), 0o600);
        assert_eq!(
            mode(root.join("meta").join(format!("{}.json", meta.id))),
            0o600
        );
    }
}
