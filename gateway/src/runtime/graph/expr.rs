//! Graph conditions: CEL expressions (the `cel` crate), compiled once per definition and
//! evaluated over a node's result (`output`, `json`, `outputs`, `vars`).
//!
//! The CEL parser recurses once per nesting level and per operator, so compiling runs on a
//! thread of its own with a stack sized for the longest expression a definition may hold
//! ([`MAX_EXPRESSION_CHARS`]); see [`on_compile_thread`].

use std::collections::HashMap;
use std::sync::Arc;

use cel::{Context, Program, Value};

use crate::api::error::GatewayError;

/// Longest expression a definition may hold (edge conditions and condition nodes).
pub const MAX_EXPRESSION_CHARS: usize = 1024;

/// Stack of the thread definitions are compiled on: the parser needs under 1 MiB for the
/// deepest 1,024-character expression when optimised (the dev profile optimises it too).
const COMPILE_STACK: usize = 8 << 20;

/// A compiled expression.
#[derive(Clone)]
pub struct Expr(Arc<Program>);

impl std::fmt::Debug for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Expr")
    }
}

/// Compiles `source`; the parser's message when it does not parse. Call it on the compile
/// thread ([`on_compile_thread`]).
pub fn compile(source: &str) -> Result<Expr, String> {
    if source.chars().count() > MAX_EXPRESSION_CHARS {
        return Err(format!("longer than {MAX_EXPRESSION_CHARS} characters"));
    }
    if source.trim().is_empty() {
        return Err("empty".to_owned());
    }
    Program::compile(source)
        .map(|p| Expr(Arc::new(p)))
        .map_err(|e| {
            // The parser's report spans lines (a caret under the source); one line is enough.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("does not parse");
            first.trim_start_matches("ERROR: <input>:").to_owned()
        })
}

/// Runs `work` (which compiles expressions) on a thread with a stack large enough for the
/// CEL parser, and answers its result without blocking the caller's runtime thread.
pub async fn on_compile_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, GatewayError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("graph-compile".into())
        .stack_size(COMPILE_STACK)
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| GatewayError::Internal(format!("compile thread not started: {e}")))?;
    rx.await
        .map_err(|_| GatewayError::Internal("the compile thread ended without a result".into()))
}

/// What an expression sees.
pub struct Scope<'a> {
    /// The source node's output text.
    pub output: &'a str,
    /// Every completed node's output by id.
    pub outputs: &'a HashMap<String, String>,
    /// The run's variables.
    pub vars: &'a HashMap<String, String>,
}

impl Expr {
    /// Evaluates to a bool; an error for any other result or a failed evaluation.
    pub fn holds(&self, scope: &Scope<'_>) -> Result<bool, String> {
        let mut ctx = Context::default();
        let json = serde_json::from_str::<serde_json::Value>(scope.output)
            .ok()
            .map_or(Value::Null, json_value);
        ctx.add_variable_from_value("output", scope.output);
        ctx.add_variable_from_value("json", json);
        ctx.add_variable_from_value("outputs", scope.outputs.clone());
        ctx.add_variable_from_value("vars", scope.vars.clone());
        match self.0.execute(&ctx) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!(
                "the expression yields {}, not a bool",
                kind_of(&other)
            )),
            Err(e) => Err(format!("the expression failed: {e}")),
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::List(_) => "a list",
        Value::Map(_) => "a map",
        Value::Int(_) | Value::UInt(_) | Value::Float(_) => "a number",
        Value::String(_) => "a string",
        Value::Null => "null",
        _ => "a value",
    }
}

/// A JSON value as CEL sees it (numbers: integers when they fit, else doubles).
fn json_value(v: serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::Null,
        J::Bool(b) => Value::Bool(b),
        J::Number(n) => n
            .as_i64()
            .map(Value::Int)
            .or_else(|| n.as_u64().map(Value::UInt))
            .unwrap_or_else(|| Value::Float(n.as_f64().unwrap_or(f64::NAN))),
        J::String(s) => Value::String(Arc::new(s)),
        J::Array(items) => Value::List(Arc::new(items.into_iter().map(json_value).collect())),
        J::Object(map) => {
            let entries: HashMap<cel::objects::Key, Value> = map
                .into_iter()
                .map(|(k, v)| (cel::objects::Key::String(Arc::new(k)), json_value(v)))
                .collect();
            Value::Map(cel::objects::Map {
                map: Arc::new(entries),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holds(src: &str, output: &str) -> Result<bool, String> {
        let outputs = HashMap::from([("a".to_owned(), "hello".to_owned())]);
        let vars = HashMap::from([("mode".to_owned(), "fast".to_owned())]);
        compile(src)?.holds(&Scope {
            output,
            outputs: &outputs,
            vars: &vars,
        })
    }

    #[test]
    fn expressions_see_output_json_outputs_and_vars() {
        assert_eq!(holds("output == 'x'", "x"), Ok(true));
        assert_eq!(holds("json.score > 3", r#"{"score": 5}"#), Ok(true));
        assert_eq!(
            holds("json.items.size() == 2", r#"{"items": [1, 2.5]}"#),
            Ok(true)
        );
        assert_eq!(holds("json == null", "not json"), Ok(true));
        assert_eq!(holds("outputs.a.startsWith('he')", ""), Ok(true));
        assert_eq!(
            holds("vars.mode == 'fast' && size(output) == 0", ""),
            Ok(true)
        );
        assert_eq!(holds("output.matches('^[0-9]+$')", "123"), Ok(true));
    }

    #[test]
    fn a_result_that_is_not_a_bool_or_a_failed_evaluation_is_an_error() {
        assert!(holds("output", "x").unwrap_err().contains("a string"));
        assert!(holds("1 + 2", "").unwrap_err().contains("a number"));
        assert!(holds("outputs.missing == 'x'", "").is_err());
        assert!(holds("json.score > 3", "[]").is_err());
    }

    #[test]
    fn sources_that_do_not_parse_or_are_too_long_are_refused() {
        assert!(compile("1 +").is_err());
        assert!(compile("").is_err());
        let long = format!("output == '{}'", "x".repeat(MAX_EXPRESSION_CHARS));
        assert!(compile(&long).unwrap_err().contains("1024"));
    }

    #[tokio::test]
    async fn the_deepest_expressions_compile_on_the_compile_thread() {
        // Each nests or chains as far as 1,024 characters allow: refused or compiled, never a
        // stack overflow.
        let cases: Vec<String> = vec![
            "(".repeat(511) + "1" + &")".repeat(511),
            "[".repeat(512) + &"]".repeat(512),
            "-".repeat(1023) + "1",
            "!".repeat(1020) + "true",
            "f(".repeat(340) + &")".repeat(340),
            "a[".repeat(340) + "1" + &"]".repeat(340),
            "{".repeat(300) + &"}".repeat(300),
            "1+".repeat(511) + "1",
        ];
        let results = on_compile_thread(move || {
            cases
                .iter()
                .map(|c| {
                    assert!(c.chars().count() <= MAX_EXPRESSION_CHARS);
                    compile(c).is_ok()
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        assert_eq!(results.len(), 8);
    }
}
