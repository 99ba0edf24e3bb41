//! Placeholders in graph node config strings: `{{<nodeId>.output}}` (an upstream node's
//! output) and `{{<variable>}}` (a value the caller passes to `graph.execute`).

/// One piece of a config string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part<'a> {
    Text(&'a str),
    /// `{{<node>.output}}`.
    Output(&'a str),
    /// `{{<name>}}`.
    Var(&'a str),
}

/// Splits `s` into text and placeholders; the offending placeholder when one is neither form.
pub fn parse(s: &str) -> Result<Vec<Part<'_>>, String> {
    let mut parts = Vec::new();
    let mut rest = s;
    while let Some(open) = rest.find("{{") {
        let Some(close) = rest[open + 2..].find("}}") else {
            break;
        };
        if open > 0 {
            parts.push(Part::Text(&rest[..open]));
        }
        let inner = rest[open + 2..open + 2 + close].trim();
        let part = match inner.strip_suffix(".output") {
            Some(node) if is_node_id(node) => Part::Output(node),
            _ if is_variable(inner) => Part::Var(inner),
            _ => {
                return Err(format!(
                    "{{{{{inner}}}}} is neither {{{{<node>.output}}}} nor {{{{<variable>}}}}"
                ))
            }
        };
        parts.push(part);
        rest = &rest[open + 2 + close + 2..];
    }
    if !rest.is_empty() {
        parts.push(Part::Text(rest));
    }
    Ok(parts)
}

/// A node id: `[A-Za-z0-9_-]{1,64}`.
pub fn is_node_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A variable name: `[A-Za-z_][A-Za-z0-9_-]*`, at most 128 characters.
pub fn is_variable(s: &str) -> bool {
    let mut bytes = s.bytes();
    s.len() <= 128
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Renders `s`: node outputs from `output` (the empty string for a node without one),
/// variables from `var` (the empty string when absent; execute refuses missing ones first).
pub fn render<'o>(
    s: &str,
    output: impl Fn(&str) -> Option<&'o str>,
    var: impl Fn(&str) -> Option<&'o str>,
) -> String {
    let Ok(parts) = parse(s) else {
        return s.to_owned();
    };
    let mut out = String::with_capacity(s.len());
    for p in parts {
        match p {
            Part::Text(t) => out.push_str(t),
            Part::Output(n) => out.push_str(output(n).unwrap_or("")),
            Part::Var(v) => out.push_str(var(v).unwrap_or("")),
        }
    }
    out
}

/// Renders every string inside a JSON value (tool arguments).
pub fn render_json<'o>(
    v: &serde_json::Value,
    output: &impl Fn(&str) -> Option<&'o str>,
    var: &impl Fn(&str) -> Option<&'o str>,
) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        J::String(s) => J::String(render(s, output, var)),
        J::Array(items) => J::Array(items.iter().map(|i| render_json(i, output, var)).collect()),
        J::Object(map) => J::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), render_json(v, output, var)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Every string inside a JSON value.
pub fn strings(v: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value as J;
    match v {
        J::String(s) => out.push(s.clone()),
        J::Array(items) => items.iter().for_each(|i| strings(i, out)),
        J::Object(map) => map.values().for_each(|i| strings(i, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_outputs_or_variables() {
        assert_eq!(
            parse("Say {{ topic }} to {{a-1.output}}!").unwrap(),
            vec![
                Part::Text("Say "),
                Part::Var("topic"),
                Part::Text(" to "),
                Part::Output("a-1"),
                Part::Text("!"),
            ]
        );
        assert_eq!(parse("no {{ end").unwrap(), vec![Part::Text("no {{ end")]);
        assert!(parse("{{a b}}").is_err());
        assert!(parse("{{}}").is_err());
        assert!(parse("{{1x}}").is_err());
        assert_eq!(parse("{{1x.output}}").unwrap(), vec![Part::Output("1x")]);
    }

    #[test]
    fn rendering_fills_outputs_and_variables() {
        let out = |n: &str| (n == "a").then_some("A");
        let var = |v: &str| (v == "x").then_some("X");
        assert_eq!(render("{{a.output}}-{{x}}-{{b.output}}", out, var), "A-X-");
        let args = serde_json::json!({"k": ["{{x}}", 1, {"n": "{{a.output}}"}]});
        assert_eq!(
            render_json(&args, &out, &var),
            serde_json::json!({"k": ["X", 1, {"n": "A"}]})
        );
    }
}
