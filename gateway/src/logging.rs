//! The log filter of the process, changeable at run time (`daemon.setLogLevel`): the binary
//! installs a reloadable filter at start; the global level and per-module (tracing target)
//! levels are kept here and the filter is rebuilt from them on each change. Not persisted.
//!
//! Also what keeps secrets and forged lines out of the log: the libraries that log frames,
//! headers or bodies at debug/trace ([`QUIET_TARGETS`]) are capped at warn by a second,
//! fixed filter ([`below_cap`]) that no level change reaches, and untrusted text is written
//! through [`escaped`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};

/// Tracing targets (and their submodules) never logged below warn, whatever the level: at
/// debug/trace they write WebSocket frames (tungstenite: `secrets.set` values, `tokens.create`
/// secrets), HTTP/2 frames and headers (h2, hyper: `Authorization`), and TLS internals.
pub const QUIET_TARGETS: &[&str] = &[
    "tungstenite",
    "tokio_tungstenite",
    "h2",
    "rustls",
    "tokio_rustls",
    "hyper",
    "hyper_util",
    "hyper_rustls",
    "poem",
    "poem_openapi",
    "reqwest",
];

/// Whether `target` is one of [`QUIET_TARGETS`] or inside one.
fn is_quiet(target: &str) -> bool {
    QUIET_TARGETS.iter().any(|q| {
        target
            .strip_prefix(q)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// The fixed cap: false for a record of a quiet target below warn. The binary installs it as
/// a filter beside the reloadable one (both must pass), so neither `AGENT_GATEWAY_LOG` nor
/// `daemon.setLogLevel`, global or per module, nor a span directive can let those records
/// through. Decided once per call site (cached by tracing), so it costs nothing per event.
pub fn below_cap(meta: &tracing::Metadata<'_>) -> bool {
    *meta.level() <= tracing::Level::WARN || !is_quiet(meta.target())
}

/// The level a module may be set to: a quiet target (or a module inside one) at most warn.
/// The result of `daemon.setLogLevel` reports the directives in force, with the clamp.
fn clamped<'a>(module: &str, level: &'a str) -> &'a str {
    if is_quiet(module) && !matches!(level, "off" | "error" | "warn") {
        "warn"
    } else {
        level
    }
}

/// `text` for a log line: control characters escaped (see [`Escaped`]).
pub fn escaped(text: &str) -> Escaped<'_> {
    Escaped(text)
}

/// Untrusted text (session keys, client ids, upstream error bodies, webhook paths, tool names
/// from models) as a log field: written `%escaped(x)`, its C0 and C1 control characters
/// (CR and LF among them), DEL, the Unicode line and paragraph separators and the bidi
/// overrides come out as `\n`, `\r`, `\t` or `\u{..}` and a backslash as `\\`, so a
/// value can neither start a forged log line nor hide what it is. Nothing is allocated.
#[derive(Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some((i, c)) = rest.char_indices().find(|(_, c)| needs_escape(*c)) {
            f.write_str(&rest[..i])?;
            match c {
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                '\\' => f.write_str("\\\\")?,
                c => write!(f, "\\u{{{:x}}}", u32::from(c))?,
            }
            rest = &rest[i + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || c == '\\'
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

type Apply = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

struct Levels {
    /// The global directive(s): the starting filter until a global level is set.
    global: String,
    modules: BTreeMap<String, String>,
}

struct Control {
    levels: Mutex<Levels>,
    apply: Apply,
}

static CONTROL: OnceLock<Control> = OnceLock::new();

/// Called once by the binary with its starting directives and a function that replaces the
/// filter (tracing-subscriber's reload handle).
pub fn install(initial: &str, apply: impl Fn(&str) -> Result<(), String> + Send + Sync + 'static) {
    let _ = CONTROL.set(Control {
        levels: Mutex::new(Levels {
            global: initial.to_owned(),
            modules: BTreeMap::new(),
        }),
        apply: Box::new(apply),
    });
}

fn directives(l: &Levels) -> String {
    let mut d = l.global.clone();
    for (m, lvl) in &l.modules {
        d.push_str(&format!(",{m}={lvl}"));
    }
    d
}

/// Sets the global level (`module` None) or one module's; the directives now in force. An
/// error when this process does not manage its filter (the library embedded elsewhere).
pub fn set_level(module: Option<&str>, level: &str) -> Result<String, String> {
    let c = CONTROL
        .get()
        .ok_or_else(|| "this process does not manage its log filter".to_owned())?;
    let mut l = c.levels.lock().unwrap_or_else(|p| p.into_inner());
    let mut next = Levels {
        global: l.global.clone(),
        modules: l.modules.clone(),
    };
    match module {
        // A quiet library asked for by name is clamped to warn (the fixed cap would hold it
        // there anyway; the directives then say what is in force).
        Some(m) => {
            next.modules
                .insert(m.to_owned(), clamped(m, level).to_owned());
        }
        // A global level keeps the noisy HTTP internals at warn unless they were set alone.
        None => next.global = format!("{level},hyper=warn,poem=warn"),
    }
    let d = directives(&next);
    (c.apply)(&d)?;
    *l = next;
    Ok(d)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        let forged = "a\r\nINFO forged line\t\u{7}\u{85}\u{2028}\u{202e}\\ é";
        let shown = escaped(forged).to_string();
        assert_eq!(
            shown,
            "a\\r\\nINFO forged line\\t\\u{7}\\u{85}\\u{2028}\\u{202e}\\\\ é"
        );
        assert!(!shown.chars().any(char::is_control));
        assert_eq!(escaped("plain key").to_string(), "plain key");
        assert_eq!(format!("{:?}", escaped("a\nb")), "\"a\\nb\"");
    }

    #[test]
    fn quiet_targets_are_capped_at_warn_and_others_are_not() {
        for t in [
            "tungstenite",
            "tungstenite::protocol",
            "tokio_tungstenite",
            "h2::codec",
            "rustls::conn",
            "hyper::proto::h1",
            "hyper_util::client",
        ] {
            assert!(is_quiet(t), "{t}");
            assert_eq!(clamped(t, "trace"), "warn");
            assert_eq!(clamped(t, "debug"), "warn");
            assert_eq!(clamped(t, "error"), "error");
        }
        for t in [
            "agent_gateway::rpc",
            "h2x",
            "hyperion",
            "tokio",
            "sqlx::query",
        ] {
            assert!(!is_quiet(t), "{t}");
            assert_eq!(clamped(t, "trace"), "trace");
        }
    }

    #[test]
    fn directives_put_modules_after_the_global_level() {
        let mut modules = BTreeMap::new();
        modules.insert("agent_gateway::rpc".to_owned(), "debug".to_owned());
        let l = Levels {
            global: "info".into(),
            modules,
        };
        assert_eq!(directives(&l), "info,agent_gateway::rpc=debug");
    }
}
