//! The validated, resolved, sorted model every emitter reads.

use serde_json::Value;

use crate::raw::Source;

#[derive(Debug, Clone)]
pub struct Catalogue {
    pub scopes: Vec<Scope>,
    pub errors: Vec<ErrorCode>,
    /// The kinds of owned record (`owners.yaml`), in file order.
    pub owners: Vec<OwnerKind>,
    /// Every named Rust type: shared types, params, results, inline objects and enums; sorted.
    pub types: Vec<TypeDef>,
    /// Sorted by name.
    pub namespaces: Vec<Namespace>,
    /// Sorted by name.
    pub methods: Vec<Method>,
}

#[derive(Debug, Clone)]
pub struct Scope {
    pub name: String,
    pub variant: String,
    pub description: String,
    pub method_scope: bool,
}

#[derive(Debug, Clone)]
pub struct ErrorCode {
    pub code: i64,
    pub name: String,
    pub constant: String,
    pub message: String,
    pub description: String,
}

/// A kind of owned record.
#[derive(Debug, Clone)]
pub struct OwnerKind {
    pub kind: String,
    pub variant: String,
    pub description: String,
    pub not_found: String,
    pub lookup: bool,
    /// A refused caller gets -32603 (admin scope needed) rather than -32001.
    pub refuse_as_scope: bool,
}

/// A method's ownership rule, resolved against its params type.
#[derive(Debug, Clone)]
pub struct OwnerRule {
    /// As written: `session_key`, `sessionKey.tenantId`.
    pub param: String,
    /// The path through the params struct, outermost first.
    pub path: Vec<PathStep>,
    pub kind: String,
    pub missing: crate::raw::Missing,
}

/// One member on an ownership rule's path.
#[derive(Debug, Clone)]
pub struct PathStep {
    pub ident: String,
    /// Whether the Rust field is an `Option` (not required, or nullable).
    pub optional: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Ty {
    String,
    Integer,
    Number,
    Boolean,
    Any,
    Map(Box<Ty>),
    Array(Box<Ty>),
    Named(String),
}

#[derive(Debug, Clone)]
pub struct TypeDef {
    pub name: String,
    pub description: String,
    pub source: Source,
    /// Whether the type is one of `types/` (shown in schemas' `$defs`), or minted for one place.
    pub shared: bool,
    pub body: TypeBody,
}

#[derive(Debug, Clone)]
pub enum TypeBody {
    Object(ObjectDef),
    Enum(Vec<EnumValue>),
}

#[derive(Debug, Clone)]
pub struct EnumValue {
    pub wire: String,
    pub variant: String,
}

#[derive(Debug, Clone)]
pub struct ObjectDef {
    pub strict: bool,
    pub fields: Vec<Field>,
    /// Members not listed in `fields` (only when not strict).
    pub additional: Option<Ty>,
}

#[derive(Debug, Clone, Default)]
pub struct Constraints {
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
}

#[derive(Debug, Clone)]
pub struct Field {
    pub wire: String,
    pub ident: String,
    pub ty: Ty,
    pub required: bool,
    pub nullable: bool,
    pub description: String,
    pub sensitive: bool,
    pub default: Option<Value>,
    pub constraints: Constraints,
}

#[derive(Debug, Clone)]
pub struct Namespace {
    pub name: String,
    pub description: String,
    pub trait_name: String,
}

#[derive(Debug, Clone)]
pub struct Method {
    pub name: String,
    pub namespace: String,
    pub scope: String,
    pub summary: String,
    pub description: Option<String>,
    pub source: Source,
    pub stub: bool,
    pub internal: bool,
    /// The ownership rule, when the method names an owned record.
    pub owner: Option<OwnerRule>,
    /// `SessionDelete`: the MethodId variant and the stem of the params/result names.
    pub variant: String,
    pub handler_fn: String,
    /// Always an object type named `<Variant>Params`.
    pub params_type: String,
    /// `<Variant>Result`: a struct when the catalogue gave an object, else an alias of `result`.
    pub result_type: String,
    pub result: Ty,
    pub result_nullable: bool,
    pub result_description: Option<String>,
}

impl Method {
    /// Dispatchable methods that need a handler.
    pub fn has_handler(&self) -> bool {
        !self.stub && !self.internal
    }
}

impl Catalogue {
    pub fn type_def(&self, name: &str) -> Option<&TypeDef> {
        self.types
            .binary_search_by(|t| t.name.as_str().cmp(name))
            .ok()
            .and_then(|i| self.types.get(i))
    }

    pub fn methods_of<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a Method> + 'a {
        self.methods
            .iter()
            .filter(move |m| m.namespace == namespace)
    }
}
