//! The secret store: values encrypted at rest with AES-256-GCM under a key derived (HKDF-SHA256)
//! from the operator's master key, each bound to its name (associated data) with a fresh random
//! nonce per write; the fallback env file when no master key is configured; and the resolver
//! through which providers and webhooks read secrets by name (stored secrets first, then the
//! env file, then the process environment) without putting them into the environment.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};

use crate::api::error::GatewayError;
use crate::clock::now_ms;
use crate::config::secrets::{master_key, SecretsConfig};
use crate::store::control_plane::SecretRow;
use crate::store::Store;

/// The master key: base64 of 32 random bytes.
pub const ENV_MASTER_KEY: &str = "AGENT_GATEWAY_MASTER_KEY";
/// The fallback file (in the data directory) when no master key is configured.
pub const ENV_FILE: &str = "secrets.env";
/// A row only the store writes (lowercase: no secret name can be it): a known value encrypted
/// under the key, so a wrong master key is refused at start instead of failing at first use.
const KEY_CHECK: &str = "__key_check";
const KEY_CHECK_VALUE: &[u8] = b"agent-gateway key check v1";

/// AES-256-GCM with the derived key.
pub struct Cipher {
    key: LessSafeKey,
    rng: SystemRandom,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

impl Cipher {
    /// The cipher of a 32-byte master key: the AES key is HKDF-SHA256 of it (salted with the
    /// product name, info naming the use), so the master key itself never encrypts anything.
    pub fn new(master: &[u8; 32]) -> Result<Self, String> {
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"agent-gateway");
        let prk = salt.extract(master);
        let okm = prk
            .expand(&[b"secret store v1"], &AES_256_GCM)
            .map_err(|_| "key derivation failed".to_owned())?;
        let key: UnboundKey = okm.into();
        Ok(Self {
            key: LessSafeKey::new(key),
            rng: SystemRandom::new(),
        })
    }

    /// Encrypts `plain` bound to `aad`: (nonce, ciphertext with tag), both base64.
    pub fn seal(&self, aad: &str, plain: &[u8]) -> Result<(String, String), GatewayError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .map_err(|_| GatewayError::Internal("no randomness for a nonce".into()))?;
        let mut buf = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_bytes()),
                &mut buf,
            )
            .map_err(|_| GatewayError::Internal("encryption failed".into()))?;
        Ok((b64().encode(nonce), b64().encode(buf)))
    }

    /// Decrypts what [`Cipher::seal`] made for the same `aad`; None when the key, the
    /// associated data or the bytes differ.
    pub fn open(&self, aad: &str, nonce: &str, sealed: &str) -> Option<Vec<u8>> {
        let nonce: [u8; NONCE_LEN] = b64().decode(nonce).ok()?.try_into().ok()?;
        let mut buf = b64().decode(sealed).ok()?;
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_bytes()),
                &mut buf,
            )
            .ok()?;
        Some(plain.to_vec())
    }
}

/// Writes `text` to `path` atomically with mode 0600 (a temporary file in the same directory,
/// flushed, then renamed over it).
pub fn write_private_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let result = (|| {
        let mut f = opts.open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The fallback env file: `NAME="json string"` lines (a value may hold any character).
fn read_env_file(path: &Path) -> Vec<(String, String)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            let v: String = serde_json::from_str(v).ok()?;
            Some((k.trim().to_owned(), v))
        })
        .collect()
}

fn write_env_file(path: &Path, entries: &[(String, String)]) -> std::io::Result<()> {
    let mut text = String::from("# agent-gateway secrets (no master key configured); mode 0600\n");
    for (k, v) in entries {
        text.push_str(k);
        text.push('=');
        text.push_str(&serde_json::Value::String(v.clone()).to_string());
        text.push('\n');
    }
    write_private_atomic(path, &text)
}

/// Metadata of one stored name (never its value).
#[derive(Debug, Clone, PartialEq)]
pub struct SecretMeta {
    pub name: String,
    /// True for the encrypted store, false for the fallback env file.
    pub encrypted: bool,
    pub provider: Option<String>,
    pub description: Option<String>,
    pub expires_at: Option<i64>,
    pub created_at: Option<i64>,
    pub updated_at: Option<i64>,
}

/// Decrypted stored secrets and the env file's values, by name.
#[derive(Default)]
struct Values {
    stored: HashMap<String, String>,
    file: HashMap<String, String>,
}

/// The secrets of one server generation: the cipher (when a master key is configured), the
/// store, the fallback file, and the decrypted values kept in memory for the resolver.
pub struct Secrets {
    cipher: Option<Cipher>,
    store: Store,
    env_file: PathBuf,
    values: RwLock<Values>,
    /// Serialises writes of the env file.
    file_lock: tokio::sync::Mutex<()>,
}

impl Secrets {
    /// Opens the secret store: with a master key, checks it against the key-check row (a wrong
    /// key refuses to start); without one, warns when encrypted secrets exist. Then loads the
    /// values.
    pub async fn open(
        config: &SecretsConfig,
        store: Store,
        data_dir: &Path,
    ) -> Result<Self, GatewayError> {
        let key = master_key(config).map_err(|e| GatewayError::Internal(e.0))?;
        let cipher = match key {
            Some(k) => Some(Cipher::new(&k).map_err(GatewayError::Internal)?),
            None => None,
        };
        let secrets = Self {
            cipher,
            store,
            env_file: data_dir.join(ENV_FILE),
            values: RwLock::default(),
            file_lock: tokio::sync::Mutex::new(()),
        };
        let rows = secrets.store.secrets_all().await?;
        secrets.check_key(&rows).await?;
        // The key-check row is never a value: the rows read before it was written will do.
        secrets.load(rows);
        Ok(secrets)
    }

    /// Checks the master key against the key-check row of `rows` (writing one on a database
    /// without it).
    async fn check_key(&self, rows: &[SecretRow]) -> Result<(), GatewayError> {
        let check = rows.iter().find(|r| r.name == KEY_CHECK);
        match (&self.cipher, check) {
            (Some(c), Some(row)) => {
                if c.open(KEY_CHECK, &row.nonce, &row.ciphertext).as_deref()
                    != Some(KEY_CHECK_VALUE)
                {
                    return Err(GatewayError::Internal(format!(
                        "the master key ({ENV_MASTER_KEY} or secrets.masterKeyFile) does not \
                         decrypt the secrets stored in this database: it is not the key they \
                         were written with"
                    )));
                }
            }
            (Some(c), None) => {
                let (nonce, ciphertext) = c.seal(KEY_CHECK, KEY_CHECK_VALUE)?;
                let now = now_ms();
                self.store
                    .secret_put(&SecretRow {
                        name: KEY_CHECK.into(),
                        nonce,
                        ciphertext,
                        provider: None,
                        description: None,
                        expires_at: None,
                        created_at: now,
                        updated_at: now,
                    })
                    .await?;
            }
            (None, _) => {
                let stored = rows.iter().filter(|r| r.name != KEY_CHECK).count();
                if stored > 0 {
                    tracing::warn!(
                        stored,
                        "encrypted secrets are stored but no master key is configured \
                         ({ENV_MASTER_KEY} or secrets.masterKeyFile): they are not used"
                    );
                }
            }
        }
        Ok(())
    }

    /// Whether a master key is configured (secrets are encrypted in the store).
    pub fn encrypted(&self) -> bool {
        self.cipher.is_some()
    }

    /// The cipher (also for other encrypted records: auth profiles); -32003 without a master
    /// key.
    pub fn cipher(&self) -> Result<&Cipher, GatewayError> {
        self.cipher.as_ref().ok_or_else(|| {
            GatewayError::Unavailable(format!(
                "the secret store needs a master key: set {ENV_MASTER_KEY} (base64 of 32 random \
                 bytes) or secrets.masterKeyFile"
            ))
        })
    }

    /// Reads every value again (after a change here or on another node).
    pub async fn reload(&self) -> Result<(), GatewayError> {
        let rows = match self.cipher {
            Some(_) => self.store.secrets_all().await?,
            None => Vec::new(),
        };
        self.load(rows);
        Ok(())
    }

    /// Decrypts `rows` and reads the env file into the values the resolver serves.
    fn load(&self, rows: Vec<SecretRow>) {
        let mut values = Values {
            file: read_env_file(&self.env_file).into_iter().collect(),
            ..Values::default()
        };
        if let Some(c) = &self.cipher {
            for row in rows {
                if row.name == KEY_CHECK {
                    continue;
                }
                match c.open(&row.name, &row.nonce, &row.ciphertext) {
                    Some(plain) => match String::from_utf8(plain) {
                        Ok(v) => {
                            values.stored.insert(row.name, v);
                        }
                        Err(_) => {
                            tracing::warn!(name = %row.name, "stored secret is not text; ignored")
                        }
                    },
                    None => {
                        tracing::warn!(name = %row.name, "stored secret does not decrypt; ignored")
                    }
                }
            }
        }
        if let Ok(mut v) = self.values.write() {
            *v = values;
        }
    }

    /// The value of `name`: a stored secret, else the env file's, else the process
    /// environment's. What providers and webhooks call instead of `std::env::var`.
    pub fn resolve(&self, name: &str) -> Option<String> {
        let held = self
            .values
            .read()
            .ok()
            .and_then(|v| v.stored.get(name).or_else(|| v.file.get(name)).cloned());
        held.or_else(|| std::env::var(name).ok())
    }

    /// Every value this store holds (for leak scrubbing: the audit scrub looks for them).
    pub fn known_values(&self) -> Vec<String> {
        self.values
            .read()
            .map(|v| v.stored.values().chain(v.file.values()).cloned().collect())
            .unwrap_or_default()
    }

    /// Stores `value` under `name`: encrypted when a master key is configured, else in the
    /// env file. Returns (created, encrypted).
    pub async fn set(
        &self,
        name: &str,
        value: &str,
        provider: Option<String>,
        description: Option<String>,
        expires_at: Option<i64>,
    ) -> Result<(bool, bool), GatewayError> {
        if let Some(c) = &self.cipher {
            let (nonce, ciphertext) = c.seal(name, value.as_bytes())?;
            let now = now_ms();
            let created = self
                .store
                .secret_put(&SecretRow {
                    name: name.into(),
                    nonce,
                    ciphertext,
                    provider,
                    description,
                    expires_at,
                    created_at: now,
                    updated_at: now,
                })
                .await?;
            self.reload().await?;
            return Ok((created, true));
        }
        let _guard = self.file_lock.lock().await;
        let mut entries = read_env_file(&self.env_file);
        let created = match entries.iter_mut().find(|(k, _)| k == name) {
            Some(e) => {
                e.1 = value.to_owned();
                false
            }
            None => {
                entries.push((name.to_owned(), value.to_owned()));
                true
            }
        };
        write_env_file(&self.env_file, &entries).map_err(|e| {
            GatewayError::Internal(format!("cannot write {}: {e}", self.env_file.display()))
        })?;
        drop(_guard);
        self.reload().await?;
        Ok((created, false))
    }

    /// Reads one stored secret (the encrypted store only).
    pub async fn get(&self, name: &str) -> Result<Option<String>, GatewayError> {
        self.cipher()?;
        if name == KEY_CHECK {
            return Ok(None);
        }
        Ok(self
            .values
            .read()
            .ok()
            .and_then(|v| v.stored.get(name).cloned()))
    }

    /// Deletes a stored secret (the encrypted store only); whether one was deleted.
    pub async fn delete(&self, name: &str) -> Result<bool, GatewayError> {
        self.cipher()?;
        if name == KEY_CHECK {
            return Ok(false);
        }
        let deleted = self.store.secret_delete(name).await?;
        self.reload().await?;
        Ok(deleted)
    }

    /// Names and metadata: the encrypted store's (when a master key is configured) and the
    /// env file's, one entry per name (the store's wins), sorted by name.
    pub async fn list(&self, include_env_file: bool) -> Result<Vec<SecretMeta>, GatewayError> {
        let mut out: Vec<SecretMeta> = Vec::new();
        if self.cipher.is_some() {
            for r in self.store.secrets_all().await? {
                if r.name == KEY_CHECK {
                    continue;
                }
                out.push(SecretMeta {
                    name: r.name,
                    encrypted: true,
                    provider: r.provider,
                    description: r.description,
                    expires_at: r.expires_at,
                    created_at: Some(r.created_at),
                    updated_at: Some(r.updated_at),
                });
            }
        }
        if include_env_file {
            for (k, _) in read_env_file(&self.env_file) {
                if !out.iter().any(|m| m.name == k) {
                    out.push(SecretMeta {
                        name: k,
                        encrypted: false,
                        provider: None,
                        description: None,
                        expires_at: None,
                        created_at: None,
                        updated_at: None,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::secrets::decode_key;

    #[test]
    fn sealed_values_open_only_with_the_same_key_and_name() {
        let c = Cipher::new(&[7u8; 32]).unwrap();
        let (n, s) = c.seal("OPENAI_API_KEY", b"sk-value").unwrap();
        assert_eq!(c.open("OPENAI_API_KEY", &n, &s).unwrap(), b"sk-value");
        // Another name (a row copied over another secret's) does not open.
        assert!(c.open("OTHER", &n, &s).is_none());
        // Another key does not open.
        let other = Cipher::new(&[8u8; 32]).unwrap();
        assert!(other.open("OPENAI_API_KEY", &n, &s).is_none());
        // A fresh nonce per write: the same value seals differently.
        let (n2, s2) = c.seal("OPENAI_API_KEY", b"sk-value").unwrap();
        assert_ne!((n.clone(), s.clone()), (n2, s2));
        // The ciphertext never contains the plaintext.
        assert!(!String::from_utf8_lossy(&b64().decode(&s).unwrap()).contains("sk-value"));
    }

    #[test]
    fn master_keys_must_be_32_bytes_of_base64() {
        assert!(decode_key(&b64().encode([1u8; 32]), "k").is_ok());
        assert!(decode_key(&b64().encode([1u8; 31]), "k")
            .unwrap_err()
            .0
            .contains("32 bytes"));
        assert!(decode_key("not base64!!", "k").is_err());
    }

    #[test]
    fn env_file_values_survive_any_character() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(ENV_FILE);
        let entries = vec![
            ("A".to_owned(), "line1\nline2 = \"quoted\"".to_owned()),
            ("B".to_owned(), "plain".to_owned()),
        ];
        write_env_file(&p, &entries).unwrap();
        assert_eq!(read_env_file(&p), entries);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
    }
}
