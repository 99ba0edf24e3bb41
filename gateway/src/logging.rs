//! The log filter of the process, changeable at run time (`daemon.setLogLevel`): the binary
//! installs a reloadable filter at start; the global level and per-module (tracing target)
//! levels are kept here and the filter is rebuilt from them on each change. Not persisted.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

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
        Some(m) => {
            next.modules.insert(m.to_owned(), level.to_owned());
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
mod tests {
    use super::*;

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
