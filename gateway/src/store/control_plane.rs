//! The control plane's tables (migration 0007): API tokens, encrypted secrets and auth
//! profiles, and the configuration's version history and audit log. Values arrive here
//! already encrypted or redacted: nothing in these rows is a plaintext secret.

use super::{now_ms, on_pool, Store, StoreRow};
use crate::api::error::GatewayError;

/// What other nodes are told to reload when a token changes (`store::nodes::CONTROL`).
pub const ANNOUNCE_TOKENS: &str = "tokens";
/// ... and when a secret changes.
pub const ANNOUNCE_SECRETS: &str = "secrets";

/// One API token. `digest` is None once revoked (the id stays reserved).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRow {
    pub id: String,
    pub digest: Option<String>,
    /// JSON array of scope names.
    pub scopes: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

/// One stored secret (or auth profile credentials): ciphertext and metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct SecretRow {
    pub name: String,
    pub nonce: String,
    pub ciphertext: String,
    pub provider: Option<String>,
    pub description: Option<String>,
    pub expires_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// One auth profile.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthRow {
    pub profile_id: String,
    pub provider: String,
    pub nonce: String,
    pub ciphertext: String,
    pub expires: i64,
    pub account_id: Option<String>,
    pub email: Option<String>,
    pub display_name: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// One configuration version (a commit of the history).
#[derive(Debug, Clone, PartialEq)]
pub struct VersionRow {
    pub sha: String,
    pub parent: Option<String>,
    pub message: String,
    pub author: Option<String>,
    pub section: Option<String>,
    pub key: Option<String>,
    /// The configuration file's document as JSON, secrets redacted.
    pub document: String,
    pub created_at: i64,
}

/// One audit record of a configuration write.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRow {
    pub id: i64,
    pub ts: i64,
    pub pid: i64,
    pub origin: String,
    pub method: Option<String>,
    pub client_id: Option<String>,
    /// JSON array of dot paths.
    pub paths: String,
    pub commit_sha: Option<String>,
    pub suspicious: bool,
    /// JSON array of reasons.
    pub reasons: String,
}

/// Which audit records `config.audit.list` wants.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub since: Option<i64>,
    pub until: Option<i64>,
    pub suspicious_only: bool,
    pub pid: Option<i64>,
    pub tail: i64,
}

fn token_row(r: &impl StoreRow) -> Result<TokenRow, sqlx::Error> {
    Ok(TokenRow {
        id: r.col("id")?,
        digest: r.col("digest")?,
        scopes: r.col("scopes")?,
        created_at: r.col("created_at")?,
        expires_at: r.col("expires_at")?,
        last_used_at: r.col("last_used_at")?,
        revoked_at: r.col("revoked_at")?,
    })
}

fn secret_row(r: &impl StoreRow) -> Result<SecretRow, sqlx::Error> {
    Ok(SecretRow {
        name: r.col("name")?,
        nonce: r.col("nonce")?,
        ciphertext: r.col("ciphertext")?,
        provider: r.col("provider")?,
        description: r.col("description")?,
        expires_at: r.col("expires_at")?,
        created_at: r.col("created_at")?,
        updated_at: r.col("updated_at")?,
    })
}

fn auth_row(r: &impl StoreRow) -> Result<AuthRow, sqlx::Error> {
    Ok(AuthRow {
        profile_id: r.col("profile_id")?,
        provider: r.col("provider")?,
        nonce: r.col("nonce")?,
        ciphertext: r.col("ciphertext")?,
        expires: r.col("expires")?,
        account_id: r.col("account_id")?,
        email: r.col("email")?,
        display_name: r.col("display_name")?,
        created_at: r.col("created_at")?,
        updated_at: r.col("updated_at")?,
    })
}

/// The insert of one history version, bound (one statement for both backends and for the
/// write of the fleet's document, which records its version in the same transaction).
macro_rules! insert_version {
    ($v:expr) => {
        sqlx::query(
            "INSERT INTO config_versions (sha, parent, message, author, section, key, document, \
             created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&$v.sha)
        .bind(&$v.parent)
        .bind(&$v.message)
        .bind(&$v.author)
        .bind(&$v.section)
        .bind(&$v.key)
        .bind(&$v.document)
        .bind($v.created_at)
    };
}
fn version_row(r: &impl StoreRow) -> Result<VersionRow, sqlx::Error> {
    Ok(VersionRow {
        sha: r.col("sha")?,
        parent: r.col("parent")?,
        message: r.col("message")?,
        author: r.col("author")?,
        section: r.col("section")?,
        key: r.col("key")?,
        document: r.col("document")?,
        created_at: r.col("created_at")?,
    })
}

fn audit_row(r: &impl StoreRow) -> Result<AuditRow, sqlx::Error> {
    Ok(AuditRow {
        id: r.col("id")?,
        ts: r.col("ts")?,
        pid: r.col("pid")?,
        origin: r.col("origin")?,
        method: r.col("method")?,
        client_id: r.col("client_id")?,
        paths: r.col("paths")?,
        commit_sha: r.col("commit_sha")?,
        suspicious: r.col::<i64>("suspicious")? != 0,
        reasons: r.col("reasons")?,
    })
}

const TOKEN_COLS: &str = "id, digest, scopes, created_at, expires_at, last_used_at, revoked_at";
const SECRET_COLS: &str =
    "name, nonce, ciphertext, provider, description, expires_at, created_at, updated_at";
const AUTH_COLS: &str = "profile_id, provider, nonce, ciphertext, expires, account_id, email, \
                         display_name, created_at, updated_at";
const VERSION_COLS: &str = "sha, parent, message, author, section, key, document, created_at";
const AUDIT_COLS: &str =
    "id, ts, pid, origin, method, client_id, paths, commit_sha, suspicious, reasons";

impl Store {
    // ------------------------------------------------------------------ tokens

    /// Every API token, revoked ones included, sorted by id.
    pub async fn tokens_all(&self) -> Result<Vec<TokenRow>, GatewayError> {
        let sql = format!("SELECT {TOKEN_COLS} FROM api_tokens ORDER BY id");
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql).fetch_all(p).await?;
            rows.iter().map(token_row).collect::<Result<_, _>>()?
        }))
    }

    /// Inserts a new token; false when the id exists (live or revoked).
    pub async fn token_insert(&self, t: &TokenRow) -> Result<bool, GatewayError> {
        let done = on_pool!(self.pool(), |p| sqlx::query(
            "INSERT INTO api_tokens (id, digest, scopes, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING"
        )
        .bind(&t.id)
        .bind(&t.digest)
        .bind(&t.scopes)
        .bind(t.created_at)
        .bind(t.expires_at)
        .execute(p)
        .await?
        .rows_affected());
        if done == 1 {
            self.announce(ANNOUNCE_TOKENS).await;
        }
        Ok(done == 1)
    }

    /// Gives a live token a new secret digest (rotation); false when it is unknown or revoked.
    pub async fn token_rotate(
        &self,
        id: &str,
        digest: &str,
        now: i64,
    ) -> Result<Option<TokenRow>, GatewayError> {
        let sql = format!(
            "UPDATE api_tokens SET digest = $1, created_at = $2, last_used_at = NULL \
             WHERE id = $3 AND digest IS NOT NULL RETURNING {TOKEN_COLS}"
        );
        let row = on_pool!(self.pool(), |p| {
            match sqlx::query(&sql)
                .bind(digest)
                .bind(now)
                .bind(id)
                .fetch_optional(p)
                .await?
            {
                Some(r) => Some(token_row(&r)?),
                None => None,
            }
        });
        if row.is_some() {
            self.announce(ANNOUNCE_TOKENS).await;
        }
        Ok(row)
    }

    /// Revokes a live token; false when it is unknown or already revoked.
    pub async fn token_revoke(&self, id: &str, now: i64) -> Result<bool, GatewayError> {
        let done = on_pool!(self.pool(), |p| {
            sqlx::query(
            "UPDATE api_tokens SET digest = NULL, revoked_at = $1 WHERE id = $2 AND digest IS NOT NULL"
        )
        .bind(now)
        .bind(id)
        .execute(p)
        .await?
        .rows_affected()
        });
        if done == 1 {
            self.announce(ANNOUNCE_TOKENS).await;
        }
        Ok(done == 1)
    }

    /// Records last-use times (only moving them forward).
    pub async fn tokens_touch(&self, used: &[(String, i64)]) -> Result<(), GatewayError> {
        if used.is_empty() {
            return Ok(());
        }
        on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            for (id, at) in used {
                sqlx::query(
                    "UPDATE api_tokens SET last_used_at = $1 \
                     WHERE id = $2 AND (last_used_at IS NULL OR last_used_at < $1)",
                )
                .bind(*at)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    // ------------------------------------------------------------------ secrets

    /// Every stored secret (ciphertext included), sorted by name.
    pub async fn secrets_all(&self) -> Result<Vec<SecretRow>, GatewayError> {
        let sql = format!("SELECT {SECRET_COLS} FROM secrets ORDER BY name");
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql).fetch_all(p).await?;
            rows.iter().map(secret_row).collect::<Result<_, _>>()?
        }))
    }

    /// Stores a secret, replacing the value and metadata of an existing one (its creation
    /// time kept); true when the name was new.
    pub async fn secret_put(&self, s: &SecretRow) -> Result<bool, GatewayError> {
        let created = on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            let existed: Option<i64> =
                sqlx::query_scalar("SELECT created_at FROM secrets WHERE name = $1")
                    .bind(&s.name)
                    .fetch_optional(&mut *tx)
                    .await?;
            sqlx::query(
                "INSERT INTO secrets (name, nonce, ciphertext, provider, description, expires_at, \
                 created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7) \
                 ON CONFLICT (name) DO UPDATE SET nonce = excluded.nonce, \
                 ciphertext = excluded.ciphertext, provider = excluded.provider, \
                 description = excluded.description, expires_at = excluded.expires_at, \
                 updated_at = excluded.updated_at",
            )
            .bind(&s.name)
            .bind(&s.nonce)
            .bind(&s.ciphertext)
            .bind(&s.provider)
            .bind(&s.description)
            .bind(s.expires_at)
            .bind(s.updated_at)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            existed.is_none()
        });
        self.announce(ANNOUNCE_SECRETS).await;
        Ok(created)
    }

    /// Deletes a secret; false when there was none.
    pub async fn secret_delete(&self, name: &str) -> Result<bool, GatewayError> {
        let done = on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM secrets WHERE name = $1"
        )
        .bind(name)
        .execute(p)
        .await?
        .rows_affected());
        if done == 1 {
            self.announce(ANNOUNCE_SECRETS).await;
        }
        Ok(done == 1)
    }

    // ------------------------------------------------------------------ auth profiles

    /// Auth profiles (of one provider, or all), sorted by provider then id.
    pub async fn auth_list(&self, provider: Option<&str>) -> Result<Vec<AuthRow>, GatewayError> {
        let sql = format!(
            "SELECT {AUTH_COLS} FROM auth_profiles WHERE ($1 IS NULL OR provider = $1) \
             ORDER BY provider, profile_id"
        );
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql).bind(provider).fetch_all(p).await?;
            rows.iter().map(auth_row).collect::<Result<_, _>>()?
        }))
    }

    /// Stores (or replaces) an auth profile.
    pub async fn auth_put(&self, a: &AuthRow) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| {
            sqlx::query(
            "INSERT INTO auth_profiles (profile_id, provider, nonce, ciphertext, expires, account_id, \
             email, display_name, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9) \
             ON CONFLICT (profile_id) DO UPDATE SET provider = excluded.provider, \
             nonce = excluded.nonce, ciphertext = excluded.ciphertext, expires = excluded.expires, \
             account_id = excluded.account_id, email = excluded.email, \
             display_name = excluded.display_name, updated_at = excluded.updated_at"
        )
        .bind(&a.profile_id)
        .bind(&a.provider)
        .bind(&a.nonce)
        .bind(&a.ciphertext)
        .bind(a.expires)
        .bind(&a.account_id)
        .bind(&a.email)
        .bind(&a.display_name)
        .bind(a.updated_at)
        .execute(p)
        .await?
        .rows_affected()
        });
        Ok(())
    }

    /// Deletes an auth profile; false when there was none.
    pub async fn auth_delete(&self, profile_id: &str) -> Result<bool, GatewayError> {
        let done = on_pool!(self.pool(), |p| sqlx::query(
            "DELETE FROM auth_profiles WHERE profile_id = $1"
        )
        .bind(profile_id)
        .execute(p)
        .await?
        .rows_affected());
        Ok(done == 1)
    }

    // ------------------------------------------------------------------ config history

    /// The newest version, if any.
    pub async fn config_head(&self) -> Result<Option<VersionRow>, GatewayError> {
        let sql = format!("SELECT {VERSION_COLS} FROM config_versions ORDER BY id DESC LIMIT 1");
        Ok(on_pool!(self.pool(), |p| {
            match sqlx::query(&sql).fetch_optional(p).await? {
                Some(r) => Some(version_row(&r)?),
                None => None,
            }
        }))
    }

    /// Records a version.
    pub async fn config_commit(&self, v: &VersionRow) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| insert_version!(v)
            .execute(p)
            .await?
            .rows_affected());
        Ok(())
    }

    /// Versions newest first (of one section when given), at most `limit`.
    pub async fn config_versions(
        &self,
        limit: i64,
        section: Option<&str>,
    ) -> Result<Vec<VersionRow>, GatewayError> {
        let sql = format!(
            "SELECT {VERSION_COLS} FROM config_versions WHERE ($1 IS NULL OR section = $1) \
             ORDER BY id DESC LIMIT $2"
        );
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql)
                .bind(section)
                .bind(limit)
                .fetch_all(p)
                .await?;
            rows.iter().map(version_row).collect::<Result<_, _>>()?
        }))
    }

    /// The versions whose sha starts with `prefix` (at most two: enough to tell an
    /// ambiguous prefix).
    pub async fn config_versions_by_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<VersionRow>, GatewayError> {
        let sql = format!(
            "SELECT {VERSION_COLS} FROM config_versions WHERE sha LIKE $1 \
             ORDER BY id DESC LIMIT 2"
        );
        // Callers pass hex digits only (the params' pattern), so no LIKE wildcard is in it.
        let pattern = format!("{}%", prefix.replace(['%', '_'], ""));
        Ok(on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql).bind(pattern).fetch_all(p).await?;
            rows.iter().map(version_row).collect::<Result<_, _>>()?
        }))
    }

    /// Keeps the newest `keep` versions: older ones are deleted and the oldest kept one
    /// becomes the root. Returns how many were deleted and the new root's sha.
    pub async fn config_gc(&self, keep: i64) -> Result<(u64, Option<String>), GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            let root: Option<(i64, String)> = sqlx::query_as(
                "SELECT id, sha FROM config_versions ORDER BY id DESC LIMIT 1 OFFSET $1",
            )
            .bind(keep - 1)
            .fetch_optional(&mut *tx)
            .await?;
            let Some((root_id, root_sha)) = root else {
                return Ok((0, None));
            };
            let deleted = sqlx::query("DELETE FROM config_versions WHERE id < $1")
                .bind(root_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            sqlx::query("UPDATE config_versions SET parent = NULL WHERE id = $1")
                .bind(root_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            if deleted == 0 {
                (0, None)
            } else {
                (deleted, Some(root_sha))
            }
        }))
    }

    // ------------------------------------------------------------------ the fleet's document

    /// The configuration document in force for the fleet and the history commit it is, if
    /// one was stored (the text is the JSON object, secrets included).
    pub async fn config_document(&self) -> Result<Option<(String, Option<String>)>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            sqlx::query_as::<_, (String, Option<String>)>(
                "SELECT document, head_sha FROM config_document WHERE id = 1",
            )
            .fetch_optional(p)
            .await?
        }))
    }

    /// Replaces the document with `document` (its history commit `v`, recorded in the same
    /// transaction) if the document in force is still the commit `expected` (None: no
    /// document yet). False when another writer got there first: nothing was written.
    pub async fn config_document_put(
        &self,
        expected: Option<&str>,
        document: &str,
        v: &VersionRow,
    ) -> Result<bool, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            let written = match expected {
                None => sqlx::query(
                    "INSERT INTO config_document (id, document, head_sha, updated_at) \
                     VALUES (1, $1, $2, $3) ON CONFLICT (id) DO NOTHING",
                )
                .bind(document)
                .bind(&v.sha)
                .bind(v.created_at)
                .execute(&mut *tx)
                .await?
                .rows_affected(),
                Some(head) => sqlx::query(
                    "UPDATE config_document SET document = $1, head_sha = $2, updated_at = $3 \
                     WHERE id = 1 AND head_sha = $4",
                )
                .bind(document)
                .bind(&v.sha)
                .bind(v.created_at)
                .bind(head)
                .execute(&mut *tx)
                .await?
                .rows_affected(),
            };
            if written != 1 {
                return Ok(false);
            }
            insert_version!(v).execute(&mut *tx).await?;
            tx.commit().await?;
            true
        }))
    }

    /// Records a configuration file read at a start (its digest and document) as the newest
    /// one read; returns the one that was newest before (digest, document), if any.
    pub async fn config_file_read(
        &self,
        digest: &str,
        document: &str,
    ) -> Result<Option<(String, String)>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            let before: Option<(String, String, i64)> = sqlx::query_as(
                "SELECT digest, document, seen_at FROM config_files_seen \
                 ORDER BY seen_at DESC, digest LIMIT 1",
            )
            .fetch_optional(&mut *tx)
            .await?;
            // Strictly newer than every earlier read, whatever the clocks of the nodes say.
            let at = before.as_ref().map_or(now_ms(), |b| now_ms().max(b.2 + 1));
            sqlx::query(
                "INSERT INTO config_files_seen (digest, document, seen_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (digest) DO UPDATE SET seen_at = EXCLUDED.seen_at",
            )
            .bind(digest)
            .bind(document)
            .bind(at)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            before.map(|b| (b.0, b.1))
        }))
    }

    // ------------------------------------------------------------------ audit

    /// Appends an audit record (its id and time are the store's).
    pub async fn audit_insert(&self, a: &AuditRow) -> Result<(), GatewayError> {
        on_pool!(self.pool(), |p| sqlx::query(
            "INSERT INTO config_audit (ts, pid, origin, method, client_id, paths, commit_sha, \
             suspicious, reasons) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        )
        .bind(if a.ts > 0 { a.ts } else { now_ms() })
        .bind(a.pid)
        .bind(&a.origin)
        .bind(&a.method)
        .bind(&a.client_id)
        .bind(&a.paths)
        .bind(&a.commit_sha)
        .bind(i64::from(a.suspicious))
        .bind(&a.reasons)
        .execute(p)
        .await?
        .rows_affected());
        Ok(())
    }

    /// The newest `tail` records matching `f`, oldest first.
    pub async fn audit_list(&self, f: &AuditFilter) -> Result<Vec<AuditRow>, GatewayError> {
        let sql = format!(
            "SELECT {AUDIT_COLS} FROM config_audit WHERE ($1 IS NULL OR ts >= $1) \
             AND ($2 IS NULL OR ts < $2) AND ($3 = 0 OR suspicious = 1) \
             AND ($4 IS NULL OR pid = $4) ORDER BY id DESC LIMIT $5"
        );
        let mut rows: Vec<AuditRow> = on_pool!(self.pool(), |p| {
            let rows = sqlx::query(&sql)
                .bind(f.since)
                .bind(f.until)
                .bind(i64::from(f.suspicious_only))
                .bind(f.pid)
                .bind(f.tail)
                .fetch_all(p)
                .await?;
            rows.iter().map(audit_row).collect::<Result<_, _>>()?
        });
        rows.reverse();
        Ok(rows)
    }

    /// Every audit record's id and raw paths text, oldest first.
    pub async fn audit_paths(&self) -> Result<Vec<(i64, String)>, GatewayError> {
        Ok(on_pool!(self.pool(), |p| sqlx::query_as(
            "SELECT id, paths FROM config_audit ORDER BY id"
        )
        .fetch_all(p)
        .await?))
    }

    /// Rewrites the paths of the given records in one transaction, unless a record was added
    /// since `newest` was read (then nothing is written and false is returned).
    pub async fn audit_rewrite(
        &self,
        newest: i64,
        rewrites: &[(i64, String)],
    ) -> Result<bool, GatewayError> {
        Ok(on_pool!(self.pool(), |p| {
            let mut tx = p.begin().await?;
            let now_newest: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM config_audit")
                .fetch_one(&mut *tx)
                .await?;
            if now_newest.unwrap_or(0) != newest {
                return Ok(false);
            }
            for (id, paths) in rewrites {
                sqlx::query("UPDATE config_audit SET paths = $1 WHERE id = $2")
                    .bind(paths)
                    .bind(*id)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            true
        }))
    }
}
