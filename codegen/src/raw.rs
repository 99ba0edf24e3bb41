//! The catalogue exactly as written in YAML: strict serde shapes, no interpretation.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopesFile {
    pub scopes: Vec<RawScope>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawScope {
    pub name: String,
    pub description: String,
    pub method_scope: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorsFile {
    pub errors: Vec<RawError>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawError {
    pub code: i64,
    pub name: String,
    pub message: String,
    pub description: String,
}

/// `owners.yaml`: the kinds of owned record an ownership rule can name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OwnersFile {
    pub owners: Vec<RawOwnerKind>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOwnerKind {
    pub kind: String,
    pub description: String,
    /// What a caller is told when the record is not its own (or does not exist).
    pub not_found: String,
    /// Whether the store is asked who owns the record (false: the param is a tenant id).
    pub lookup: bool,
    /// How a caller the rule refuses is answered (default `not_found`).
    #[serde(default)]
    pub refusal: Refusal,
}

/// How an ownership rule answers a caller it refuses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// -32001 with the kind's `not_found` text: the record's existence is not revealed.
    #[default]
    NotFound,
    /// -32603 `Insufficient scope: requires 'admin'`: naming another tenant is an admin power.
    Scope,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypesFile {
    /// Each entry is converted on its own so that every bad type is reported.
    pub types: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Spec,
    Reference,
    Designed,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Spec => "spec",
            Source::Reference => "reference",
            Source::Designed => "designed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TypeKind {
    Object,
    Enum,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawType {
    pub description: String,
    pub source: Source,
    pub kind: TypeKind,
    pub strict: Option<bool>,
    pub fields: Option<Vec<RawField>>,
    pub values: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodsFile {
    pub namespace: String,
    pub description: String,
    /// Each entry is converted on its own so that every bad method is reported.
    pub methods: Vec<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMethod {
    pub name: String,
    pub scope: String,
    pub summary: String,
    pub description: Option<String>,
    pub source: Source,
    #[serde(default)]
    pub stub: bool,
    #[serde(default)]
    pub internal: bool,
    /// Which param names an owned record (the ownership rule, checked before the handler).
    pub owner: Option<RawOwner>,
    pub params: Option<RawParams>,
    pub result: RawResult,
}

/// A method's ownership rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOwner {
    /// The member of params naming the record (`a.b` for a member of an object member).
    pub param: String,
    /// A kind of `owners.yaml`.
    pub kind: String,
    /// What a record that does not exist means (default `not_found`).
    pub missing: Option<Missing>,
}

/// What a named record that does not exist means to the ownership check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Missing {
    /// The method needs the record: -32001 before the handler runs.
    NotFound,
    /// The method may create it, but only in the caller's own tenant.
    Claim,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawParams {
    pub strict: Option<bool>,
    pub additional: Option<String>,
    #[serde(default)]
    pub fields: Vec<RawField>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawResult {
    #[serde(rename = "type")]
    pub ty: String,
    pub description: Option<String>,
    pub strict: Option<bool>,
    pub nullable: Option<bool>,
    pub fields: Option<Vec<RawField>>,
}

/// One member of an object. Constraints keep their JSON Schema names.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawField {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
    #[serde(default)]
    pub required: bool,
    #[serde(default)]
    pub nullable: bool,
    pub description: Option<String>,
    #[serde(default)]
    pub sensitive: bool,
    pub default: Option<Value>,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    pub pattern: Option<String>,
    pub format: Option<String>,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
    pub exclusive_minimum: Option<f64>,
    pub exclusive_maximum: Option<f64>,
    pub min_items: Option<u64>,
    pub max_items: Option<u64>,
    #[serde(rename = "enum")]
    pub enum_values: Option<Vec<String>>,
    pub strict: Option<bool>,
    pub fields: Option<Vec<RawField>>,
}
