//! JSON Schema (draft 2020-12) of types, params and results; shared by the JSON Schema files,
//! the OpenRPC document and the schemas embedded in the Rust `METHODS` table.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use crate::ir::{Catalogue, Field, Method, ObjectDef, Ty, TypeBody, TypeDef};

pub const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

/// Builds schemas; shared types become `$ref`s under `ref_prefix`, minted types are inlined.
pub struct SchemaBuilder<'a> {
    cat: &'a Catalogue,
    ref_prefix: &'a str,
    used: BTreeSet<String>,
}

impl<'a> SchemaBuilder<'a> {
    pub fn new(cat: &'a Catalogue, ref_prefix: &'a str) -> Self {
        Self {
            cat,
            ref_prefix,
            used: BTreeSet::new(),
        }
    }

    pub fn ty(&mut self, ty: &Ty) -> Value {
        match ty {
            Ty::String => json!({"type": "string"}),
            Ty::Integer => json!({"type": "integer"}),
            Ty::Number => json!({"type": "number"}),
            Ty::Boolean => json!({"type": "boolean"}),
            Ty::Any => json!({}),
            Ty::Map(inner) if **inner == Ty::Any => json!({"type": "object"}),
            Ty::Map(inner) => json!({"type": "object", "additionalProperties": self.ty(inner)}),
            Ty::Array(inner) => json!({"type": "array", "items": self.ty(inner)}),
            Ty::Named(name) => match self.cat.type_def(name) {
                Some(def) if def.shared => {
                    self.used.insert(name.clone());
                    json!({"$ref": format!("{}{}", self.ref_prefix, name)})
                }
                Some(def) => self.type_body(def),
                None => json!({}),
            },
        }
    }

    /// The schema of a type definition's body (no title).
    pub fn type_body(&mut self, def: &TypeDef) -> Value {
        let mut v = match &def.body {
            TypeBody::Object(o) => self.object(o),
            TypeBody::Enum(values) => json!({
                "type": "string",
                "enum": values.iter().map(|v| v.wire.clone()).collect::<Vec<_>>(),
            }),
        };
        if let Value::Object(m) = &mut v {
            if !def.description.is_empty() {
                m.insert("description".into(), def.description.clone().into());
            }
        }
        v
    }

    pub fn object(&mut self, o: &ObjectDef) -> Value {
        let mut props = Map::new();
        let mut required = Vec::new();
        for f in &o.fields {
            props.insert(f.wire.clone(), self.field(f));
            if f.required {
                required.push(Value::String(f.wire.clone()));
            }
        }
        let mut m = Map::new();
        m.insert("type".into(), "object".into());
        m.insert("properties".into(), Value::Object(props));
        if !required.is_empty() {
            m.insert("required".into(), Value::Array(required));
        }
        match (&o.additional, o.strict) {
            (Some(t), _) => {
                let s = self.ty(t);
                m.insert("additionalProperties".into(), s);
            }
            (None, true) => {
                m.insert("additionalProperties".into(), false.into());
            }
            (None, false) => {}
        }
        Value::Object(m)
    }

    pub fn field(&mut self, f: &Field) -> Value {
        let mut s = self.ty(&f.ty);
        let c = &f.constraints;
        if let Value::Object(m) = &mut s {
            put_u(m, "minItems", c.min_items);
            put_u(m, "maxItems", c.max_items);
        }
        // Item-level constraints go to the innermost array item.
        if let Value::Object(m) = item_leaf(&mut s) {
            put_u(m, "minLength", c.min_length);
            put_u(m, "maxLength", c.max_length);
            if let Some(p) = &c.pattern {
                m.insert("pattern".into(), p.clone().into());
            }
            if let Some(p) = &c.format {
                m.insert("format".into(), p.clone().into());
            }
            let integer = m.get("type").and_then(Value::as_str) == Some("integer");
            put_n(m, "minimum", c.minimum, integer);
            put_n(m, "maximum", c.maximum, integer);
            put_n(m, "exclusiveMinimum", c.exclusive_minimum, integer);
            put_n(m, "exclusiveMaximum", c.exclusive_maximum, integer);
        }
        if f.nullable {
            s = nullable(s);
        }
        if let Value::Object(m) = &mut s {
            m.insert("description".into(), f.description.clone().into());
            if let Some(d) = &f.default {
                m.insert("default".into(), d.clone());
            }
            if f.sensitive {
                m.insert("x-sensitive".into(), true.into());
            }
        }
        s
    }

    /// Root schema of a method's params (always an object), with `$defs`.
    pub fn params_root(&mut self, m: &Method) -> Value {
        let body = match self.cat.type_def(&m.params_type) {
            Some(def) => self.type_body(def),
            None => json!({}),
        };
        self.root(&m.params_type, body)
    }

    /// Root schema of a method's result, with `$defs`.
    pub fn result_root(&mut self, m: &Method) -> Value {
        let mut body = self.result(m);
        if let (Value::Object(b), Some(d)) = (&mut body, &m.result_description) {
            b.insert("description".into(), d.clone().into());
        }
        self.root(&m.result_type, body)
    }

    /// The result schema without `$defs` (for OpenRPC, where shared types are components).
    pub fn result(&mut self, m: &Method) -> Value {
        let s = self.ty(&m.result);
        if m.result_nullable {
            nullable(s)
        } else {
            s
        }
    }

    fn root(&mut self, title: &str, body: Value) -> Value {
        let mut m = Map::new();
        m.insert("$schema".into(), DIALECT.into());
        m.insert("title".into(), title.into());
        if let Value::Object(b) = body {
            m.extend(b);
        }
        let defs = self.defs();
        if !defs.is_empty() {
            m.insert("$defs".into(), Value::Object(defs));
        }
        Value::Object(m)
    }

    /// Every shared type used so far, transitively, keyed by name (sorted).
    pub fn defs(&mut self) -> Map<String, Value> {
        let mut done = BTreeSet::new();
        let mut out = std::collections::BTreeMap::new();
        loop {
            let pending: Vec<String> = self.used.difference(&done).cloned().collect();
            if pending.is_empty() {
                break;
            }
            for name in pending {
                done.insert(name.clone());
                if let Some(def) = self.cat.type_def(&name) {
                    let body = self.type_body(def);
                    out.insert(name, body);
                }
            }
        }
        self.used.clear();
        out.into_iter().collect()
    }
}

/// The innermost item schema of nested arrays (the value itself when not an array).
fn item_leaf(v: &mut Value) -> &mut Value {
    let nested = v.get("type").and_then(Value::as_str) == Some("array") && v.get("items").is_some();
    if nested {
        item_leaf(&mut v["items"])
    } else {
        v
    }
}

fn put_u(m: &mut Map<String, Value>, key: &str, v: Option<u64>) {
    if let Some(v) = v {
        m.insert(key.into(), v.into());
    }
}

fn put_n(m: &mut Map<String, Value>, key: &str, v: Option<f64>, integer: bool) {
    if let Some(v) = v {
        let n = if integer && v.fract() == 0.0 {
            Value::from(v as i64)
        } else {
            Value::from(v)
        };
        m.insert(key.into(), n);
    }
}

fn nullable(s: Value) -> Value {
    let simple_type = s.get("type").and_then(Value::as_str).map(str::to_owned);
    match (s, simple_type) {
        (Value::Object(mut m), Some(t)) => {
            m.insert("type".into(), json!([t, "null"]));
            if let Some(Value::Array(values)) = m.get_mut("enum") {
                values.push(Value::Null);
            }
            Value::Object(m)
        }
        (s, _) if s == json!({}) => s,
        (s, _) => json!({"anyOf": [s, {"type": "null"}]}),
    }
}
