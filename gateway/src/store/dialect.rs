//! The statement text each backend runs, from the one text written with `$N` parameters.
//!
//! SQLite accepts `$N`, but as a *named* parameter: preparing a statement looks every name up
//! in a list (a linear scan per parameter, so quadratic in the parameter count), and sqlx asks
//! SQLite for each parameter's name at every execution (another linear scan per parameter). A
//! 64-row usage INSERT has 960 parameters: about 10M instructions to prepare and tens of
//! thousands per execution went to those scans. Anonymous `?` parameters are bound by
//! position with no name at all. [`sql`] hands SQLite the `?` form of a statement whose
//! parameters appear exactly once each, in order (`$1`, `$2`, ...), and PostgreSQL the text as
//! written; a statement that repeats or reorders its parameters keeps `$N` on both.

use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};

/// A backend's pool type, which knows the statement text its backend runs.
pub trait Dialect {
    /// The text of `sql` (written with `$N` parameters) for this backend.
    fn text(sql: &'static str) -> &'static str;
}

impl Dialect for sqlx::SqlitePool {
    fn text(sql: &'static str) -> &'static str {
        positional(sql)
    }
}

impl Dialect for sqlx::PgPool {
    fn text(sql: &'static str) -> &'static str {
        sql
    }
}

/// The text of `sql` for the backend of `pool` (inside [`super::on_pool!`], `pool` is the
/// arm's pool, so one body gets each backend's text).
pub fn sql<P: Dialect>(_pool: &P, sql: &'static str) -> &'static str {
    P::text(sql)
}

/// Translations made so far, by the address and length of the `$N` text (statement texts are
/// constants or built once, so the map holds a handful of entries).
static POSITIONAL: LazyLock<RwLock<HashMap<(usize, usize), &'static str>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// `sql` with `?` for `$1`, `$2`, ... when they appear once each in that order; else `sql`.
fn positional(sql: &'static str) -> &'static str {
    let key = (sql.as_ptr() as usize, sql.len());
    if let Some(found) = POSITIONAL
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
    {
        return found;
    }
    let text: &'static str = match to_positional(sql) {
        Some(t) => Box::leak(t.into_boxed_str()),
        None => sql,
    };
    POSITIONAL
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, text);
    text
}

/// The `?` form of `sql`, or None when its `$N` parameters are not `$1..$k` in order, once
/// each. Text inside quotes (`'...'`, `"..."`) is left as it is.
fn to_positional(sql: &str) -> Option<String> {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut expected = 1u64;
    let mut quote: Option<u8> = None;
    let mut i = 0;
    let mut copied = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'\'' || b == b'"' => quote = Some(b),
            None if b == b'$' => {
                let digits = bytes[i + 1..]
                    .iter()
                    .take_while(|c| c.is_ascii_digit())
                    .count();
                if digits > 0 {
                    let n: u64 = sql[i + 1..i + 1 + digits].parse().ok()?;
                    if n != expected {
                        return None;
                    }
                    expected += 1;
                    out.push_str(&sql[copied..i]);
                    out.push('?');
                    i += 1 + digits;
                    copied = i;
                    continue;
                }
            }
            None => {}
        }
        i += 1;
    }
    out.push_str(&sql[copied..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_in_order_become_anonymous() {
        assert_eq!(
            to_positional("INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4)").as_deref(),
            Some("INSERT INTO t (a, b) VALUES (?, ?), (?, ?)")
        );
        // Ten and more: the whole number is one parameter.
        let ten: Vec<String> = (1..=12).map(|n| format!("${n}")).collect();
        assert_eq!(
            to_positional(&ten.join(",")).as_deref(),
            Some("?,?,?,?,?,?,?,?,?,?,?,?")
        );
        assert_eq!(to_positional("SELECT 1").as_deref(), Some("SELECT 1"));
    }

    #[test]
    fn repeated_or_reordered_parameters_keep_their_names() {
        assert_eq!(to_positional("SELECT $1 WHERE a = $1"), None);
        assert_eq!(to_positional("SELECT $2, $1"), None);
        assert_eq!(to_positional("SELECT $1, $3"), None);
    }

    #[test]
    fn quoted_text_is_not_a_parameter() {
        assert_eq!(
            to_positional("SELECT '$5', \"$x\", $1").as_deref(),
            Some("SELECT '$5', \"$x\", ?")
        );
        // A bare `$` followed by no digit is left alone.
        assert_eq!(
            to_positional("SELECT '$', $1").as_deref(),
            Some("SELECT '$', ?")
        );
    }

    #[test]
    fn translations_are_made_once_per_text() {
        static TEXT: &str = "UPDATE t SET a = $1 WHERE b = $2";
        let first = positional(TEXT);
        assert_eq!(first, "UPDATE t SET a = ? WHERE b = ?");
        assert!(std::ptr::eq(first, positional(TEXT)));
        static KEPT: &str = "SELECT $1 WHERE a = $1";
        assert!(std::ptr::eq(positional(KEPT), KEPT));
    }
}
