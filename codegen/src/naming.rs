//! The one place that mints identifiers for every output language.

use heck::{ToSnakeCase, ToUpperCamelCase};

const RUST_KEYWORDS: &[&str] = &[
    "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate",
    "do", "dyn", "else", "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl",
    "in", "let", "loop", "macro", "match", "mod", "move", "mut", "override", "priv", "pub", "ref",
    "return", "self", "static", "struct", "super", "trait", "true", "try", "type", "typeof",
    "unsafe", "unsized", "use", "virtual", "where", "while", "yield",
];

const PYTHON_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// `obs.billing.total` -> `ObsBillingTotal`.
pub fn method_type_stem(method: &str) -> String {
    method.to_upper_camel_case()
}

/// `obs.billing.total` in namespace `obs` -> `billing_total`.
pub fn handler_fn(namespace: &str, method: &str) -> String {
    let rest = method
        .strip_prefix(namespace)
        .and_then(|r| r.strip_prefix('.'))
        .unwrap_or(method);
    rust_ident(&rest.to_snake_case())
}

/// `session` -> `SessionApi`.
pub fn namespace_trait(namespace: &str) -> String {
    format!("{}Api", namespace.to_upper_camel_case())
}

/// A struct field for a wire name: `sessionKey` -> `session_key`, `type` -> `type_`.
pub fn field_ident(wire: &str) -> String {
    let snake = wire.to_snake_case();
    let snake = if snake.is_empty() {
        "field".to_owned()
    } else {
        snake
    };
    let snake = if snake.starts_with(|c: char| c.is_ascii_digit()) {
        format!("f_{snake}")
    } else {
        snake
    };
    rust_ident(&snake)
}

fn rust_ident(s: &str) -> String {
    if RUST_KEYWORDS.contains(&s) {
        format!("{s}_")
    } else {
        s.to_owned()
    }
}

/// An inline object or enum: parent type + field, `CronRunParams` + `mode` -> `CronRunParamsMode`.
pub fn inline_type(parent: &str, field_wire: &str) -> String {
    format!("{parent}{}", field_wire.to_upper_camel_case())
}

/// An enum variant for a wire value: `next-heartbeat` -> `NextHeartbeat`, `*` -> `All`.
pub fn enum_variant(value: &str) -> String {
    if value == "*" {
        return "All".to_owned();
    }
    let v = value.to_upper_camel_case();
    if v.is_empty() {
        "Empty".to_owned()
    } else if v.starts_with(|c: char| c.is_ascii_digit()) {
        format!("V{v}")
    } else {
        v
    }
}

/// `error.name` snake -> `SCREAMING` constant.
pub fn constant(name: &str) -> String {
    name.to_snake_case().to_uppercase()
}

/// Python method name on the SDK client: `agent.getOperationModels` -> `agent_get_operation_models`.
pub fn python_method(method: &str) -> String {
    let s = method.to_snake_case();
    if PYTHON_KEYWORDS.contains(&s.as_str()) {
        format!("{s}_")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_minted_from_the_declared_namespace() {
        assert_eq!(method_type_stem("obs.billing.total"), "ObsBillingTotal");
        assert_eq!(handler_fn("obs", "obs.billing.total"), "billing_total");
        assert_eq!(
            handler_fn("agent", "agent.getOperationModels"),
            "get_operation_models"
        );
        assert_eq!(handler_fn("session", "session.run_status"), "run_status");
        assert_eq!(namespace_trait("session"), "SessionApi");
    }

    #[test]
    fn wire_names_become_valid_identifiers() {
        assert_eq!(field_ident("sessionKey"), "session_key");
        assert_eq!(field_ident("session_key"), "session_key");
        assert_eq!(field_ident("type"), "type_");
        assert_eq!(field_ident("24h"), "f_24h");
        assert_eq!(enum_variant("next-heartbeat"), "NextHeartbeat");
        assert_eq!(enum_variant("*"), "All");
        assert_eq!(enum_variant("1m"), "V1m");
        assert_eq!(
            python_method("agent.getOperationModels"),
            "agent_get_operation_models"
        );
    }
}
