//! Raw catalogue -> IR: resolves type expressions and references, validates every rule of
//! `catalogue/README.md`, mints names (through `naming`), and sorts. Collects all problems.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::ir::{
    Catalogue, Constraints, EnumValue, ErrorCode, Field, Method, Namespace, ObjectDef, OwnerKind,
    OwnerRule, PathStep, Scope, Ty, TypeBody, TypeDef,
};
use crate::load::{Problem, Problems, RawCatalogue};
use crate::naming;
use crate::raw::{Missing, RawField, RawMethod, RawOwner, RawType, Source, TypeKind};

/// A parsed type expression before inline objects are named.
#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Ty(Ty),
    /// `object` (inline object: needs `fields`)
    Object,
    Array(Box<Expr>),
    Map(Box<Expr>),
}

fn parse_expr(s: &str) -> Result<Expr, String> {
    let s = s.trim();
    if let Some(inner) = generic(s, "array") {
        return Ok(Expr::Array(Box::new(parse_expr(inner)?)));
    }
    if let Some(inner) = generic(s, "map") {
        return Ok(Expr::Map(Box::new(parse_expr(inner)?)));
    }
    Ok(match s {
        "string" => Expr::Ty(Ty::String),
        "integer" => Expr::Ty(Ty::Integer),
        "number" => Expr::Ty(Ty::Number),
        "boolean" => Expr::Ty(Ty::Boolean),
        "any" => Expr::Ty(Ty::Any),
        "object" => Expr::Object,
        name if is_type_name(name) => Expr::Ty(Ty::Named(name.to_owned())),
        other => {
            return Err(format!(
                "unknown type expression `{other}` (expected string, integer, number, boolean, \
                 any, object, array<T>, map<T> or a PascalCase type name)"
            ))
        }
    })
}

fn generic<'a>(s: &'a str, head: &str) -> Option<&'a str> {
    s.strip_prefix(head)?.strip_prefix('<')?.strip_suffix('>')
}

fn is_type_name(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_uppercase()) && s.chars().all(|c| c.is_ascii_alphanumeric())
}

struct Ctx<'a> {
    file: &'a str,
    label: &'a str,
    source: Source,
}

struct Lowerer {
    problems: Vec<Problem>,
    types: BTreeMap<String, TypeDef>,
    shared_names: BTreeSet<String>,
    owners: Vec<OwnerKind>,
}

impl Lowerer {
    fn problem(&mut self, ctx: &Ctx<'_>, message: impl Into<String>) {
        self.problems.push(Problem {
            file: ctx.file.to_owned(),
            method: Some(ctx.label.to_owned()),
            message: message.into(),
        });
    }

    fn add_type(&mut self, ctx: &Ctx<'_>, def: TypeDef) {
        if self.types.contains_key(&def.name) {
            self.problem(
                ctx,
                format!(
                    "type name `{}` is minted twice (rename a field or type)",
                    def.name
                ),
            );
            return;
        }
        self.types.insert(def.name.clone(), def);
    }

    /// Resolves an expression; an inline object becomes a minted struct named `name`.
    fn resolve(
        &mut self,
        ctx: &Ctx<'_>,
        expr: &Expr,
        name: &str,
        description: &str,
        strict: Option<bool>,
        fields: Option<&[RawField]>,
    ) -> Ty {
        match expr {
            Expr::Ty(Ty::Named(n)) => {
                if !self.shared_names.contains(n) {
                    self.problem(ctx, format!("unknown type `{n}` (not defined in types/)"));
                }
                Ty::Named(n.clone())
            }
            Expr::Ty(t) => t.clone(),
            Expr::Array(inner) => {
                let item_name = if matches!(**inner, Expr::Object) {
                    format!("{name}Item")
                } else {
                    name.to_owned()
                };
                Ty::Array(Box::new(self.resolve(
                    ctx,
                    inner,
                    &item_name,
                    description,
                    strict,
                    fields,
                )))
            }
            Expr::Map(inner) => {
                let item_name = format!("{name}Value");
                Ty::Map(Box::new(self.resolve(
                    ctx,
                    inner,
                    &item_name,
                    description,
                    strict,
                    fields,
                )))
            }
            Expr::Object => {
                let Some(fields) = fields else {
                    self.problem(
                        ctx,
                        format!(
                            "`{name}`: type object needs `fields` (use map<any> for an open object)"
                        ),
                    );
                    return Ty::Any;
                };
                let obj = self.object(ctx, name, strict.unwrap_or(true), None, fields);
                self.add_type(
                    ctx,
                    TypeDef {
                        name: name.to_owned(),
                        description: description.to_owned(),
                        source: ctx.source,
                        shared: false,
                        body: TypeBody::Object(obj),
                    },
                );
                Ty::Named(name.to_owned())
            }
        }
    }

    fn object(
        &mut self,
        ctx: &Ctx<'_>,
        name: &str,
        strict: bool,
        additional: Option<Ty>,
        raw: &[RawField],
    ) -> ObjectDef {
        let mut wires = BTreeSet::new();
        let mut idents = BTreeSet::new();
        let mut fields = Vec::new();
        for f in raw {
            if !wires.insert(f.name.clone()) {
                self.problem(
                    ctx,
                    format!("`{name}`: member `{}` is listed twice", f.name),
                );
                continue;
            }
            let field = self.field(ctx, name, f);
            if !idents.insert(field.ident.clone()) {
                self.problem(
                    ctx,
                    format!(
                        "`{name}`: members map to the same Rust name `{}` (`{}`)",
                        field.ident, f.name
                    ),
                );
            }
            fields.push(field);
        }
        ObjectDef {
            strict,
            fields,
            additional,
        }
    }

    fn field(&mut self, ctx: &Ctx<'_>, parent: &str, f: &RawField) -> Field {
        let at = format!("`{parent}.{}`", f.name);
        let description = match &f.description {
            Some(d) if !d.trim().is_empty() => d.trim().to_owned(),
            _ => {
                self.problem(ctx, format!("{at}: `description` is required"));
                String::new()
            }
        };
        if f.name.is_empty() {
            self.problem(ctx, format!("{at}: empty member name"));
        }
        let expr = match parse_expr(&f.ty) {
            Ok(e) => e,
            Err(e) => {
                self.problem(ctx, format!("{at}: {e}"));
                Expr::Ty(Ty::Any)
            }
        };
        let has_object = contains_object(&expr);
        if !has_object && (f.fields.is_some() || f.strict.is_some()) {
            self.problem(
                ctx,
                format!("{at}: `fields`/`strict` need type object or array<object>"),
            );
        }
        let inline_name = naming::inline_type(parent, &f.name);
        let mut ty = self.resolve(
            ctx,
            &expr,
            &inline_name,
            &description,
            f.strict,
            f.fields.as_deref(),
        );
        if let Some(values) = &f.enum_values {
            ty = self.enum_field(ctx, &at, &inline_name, &description, ty, values);
        }
        self.check_constraints(ctx, &at, &ty, f);
        if let Some(d) = &f.default {
            self.check_default(ctx, &at, &ty, f.required, d);
        }
        Field {
            wire: f.name.clone(),
            ident: naming::field_ident(&f.name),
            ty,
            required: f.required,
            nullable: f.nullable,
            description,
            sensitive: f.sensitive,
            default: f.default.clone(),
            constraints: Constraints {
                min_length: f.min_length,
                max_length: f.max_length,
                pattern: f.pattern.clone(),
                format: f.format.clone(),
                minimum: f.minimum,
                maximum: f.maximum,
                exclusive_minimum: f.exclusive_minimum,
                exclusive_maximum: f.exclusive_maximum,
                min_items: f.min_items,
                max_items: f.max_items,
            },
        }
    }

    fn enum_field(
        &mut self,
        ctx: &Ctx<'_>,
        at: &str,
        name: &str,
        description: &str,
        ty: Ty,
        values: &[String],
    ) -> Ty {
        let values = self.enum_values(ctx, at, values);
        let def = |source| TypeDef {
            name: name.to_owned(),
            description: description.to_owned(),
            source,
            shared: false,
            body: TypeBody::Enum(values.clone()),
        };
        match ty {
            Ty::String => {
                self.add_type(ctx, def(ctx.source));
                Ty::Named(name.to_owned())
            }
            Ty::Array(inner) if *inner == Ty::String => {
                self.add_type(ctx, def(ctx.source));
                Ty::Array(Box::new(Ty::Named(name.to_owned())))
            }
            other => {
                self.problem(
                    ctx,
                    format!("{at}: `enum` needs type string or array<string>"),
                );
                other
            }
        }
    }

    fn enum_values(&mut self, ctx: &Ctx<'_>, at: &str, values: &[String]) -> Vec<EnumValue> {
        if values.is_empty() {
            self.problem(ctx, format!("{at}: an enum needs at least one value"));
        }
        let mut seen_wire = BTreeSet::new();
        let mut seen_variant = BTreeSet::new();
        let mut out = Vec::new();
        for v in values {
            let variant = naming::enum_variant(v);
            if !seen_wire.insert(v.clone()) || !seen_variant.insert(variant.clone()) {
                self.problem(ctx, format!("{at}: enum value `{v}` repeats or collides"));
                continue;
            }
            out.push(EnumValue {
                wire: v.clone(),
                variant,
            });
        }
        out
    }

    fn check_constraints(&mut self, ctx: &Ctx<'_>, at: &str, ty: &Ty, f: &RawField) {
        // Item constraints apply to the innermost type of an array; item counts to the array.
        let mut leaf = ty;
        while let Ty::Array(inner) = leaf {
            leaf = inner;
        }
        let is_array = matches!(ty, Ty::Array(_));
        let is_string = *leaf == Ty::String;
        let is_numeric = matches!(leaf, Ty::Integer | Ty::Number);
        let bad = |this: &mut Self, name: &str, ok: bool| {
            if !ok {
                this.problem(
                    ctx,
                    format!("{at}: `{name}` does not apply to type `{}`", f.ty),
                );
            }
        };
        if f.min_length.is_some() || f.max_length.is_some() {
            bad(self, "minLength/maxLength", is_string);
        }
        if f.pattern.is_some() || f.format.is_some() {
            bad(self, "pattern/format", is_string);
        }
        if f.minimum.is_some()
            || f.maximum.is_some()
            || f.exclusive_minimum.is_some()
            || f.exclusive_maximum.is_some()
        {
            bad(self, "minimum/maximum", is_numeric);
        }
        if f.min_items.is_some() || f.max_items.is_some() {
            bad(self, "minItems/maxItems", is_array);
        }
        let ordered = |lo: Option<f64>, hi: Option<f64>| match (lo, hi) {
            (Some(lo), Some(hi)) => lo <= hi,
            _ => true,
        };
        let as_f = |v: Option<u64>| v.map(|x| x as f64);
        if !ordered(as_f(f.min_length), as_f(f.max_length))
            || !ordered(as_f(f.min_items), as_f(f.max_items))
            || !ordered(f.minimum, f.maximum)
        {
            self.problem(ctx, format!("{at}: a lower bound is above its upper bound"));
        }
        if *leaf == Ty::Integer {
            for v in [f.minimum, f.maximum].into_iter().flatten() {
                if v.fract() != 0.0 {
                    self.problem(ctx, format!("{at}: integer bound {v} is not whole"));
                }
            }
        }
        if let Some(p) = &f.pattern {
            if let Err(e) = regex::Regex::new(p) {
                self.problem(ctx, format!("{at}: pattern does not compile: {e}"));
            }
        }
    }

    fn check_default(&mut self, ctx: &Ctx<'_>, at: &str, ty: &Ty, required: bool, d: &Value) {
        if required {
            self.problem(
                ctx,
                format!("{at}: a required member cannot have a `default`"),
            );
        }
        let ok = match (ty, d) {
            (Ty::String, Value::String(_)) | (Ty::Boolean, Value::Bool(_)) => true,
            (Ty::Integer, Value::Number(n)) => n.is_i64(),
            (Ty::Number, Value::Number(_)) => true,
            (Ty::Named(n), Value::String(s)) => match self.types.get(n).map(|t| &t.body) {
                Some(TypeBody::Enum(values)) => values.iter().any(|v| &v.wire == s),
                _ => false,
            },
            _ => false,
        };
        if !ok {
            self.problem(
                ctx,
                format!(
                    "{at}: default {d} is not a value of this type (only scalars and enum values)"
                ),
            );
        }
    }

    fn shared_type(&mut self, file: &str, name: &str, t: &RawType) {
        let label = format!("type {name}");
        let ctx = Ctx {
            file,
            label: &label,
            source: t.source,
        };
        if !is_type_name(name) {
            self.problem(&ctx, "type names are PascalCase ASCII letters and digits");
        }
        if t.description.trim().is_empty() {
            self.problem(&ctx, "`description` is required");
        }
        let body = match t.kind {
            TypeKind::Object => {
                if t.values.is_some() {
                    self.problem(&ctx, "`values` is for kind enum");
                }
                let fields = t.fields.as_deref().unwrap_or_default();
                if fields.is_empty() {
                    self.problem(&ctx, "an object type needs `fields`");
                }
                TypeBody::Object(self.object(&ctx, name, t.strict.unwrap_or(true), None, fields))
            }
            TypeKind::Enum => {
                if t.fields.is_some() || t.strict.is_some() {
                    self.problem(&ctx, "`fields`/`strict` are for kind object");
                }
                let values = t.values.as_deref().unwrap_or_default();
                TypeBody::Enum(self.enum_values(&ctx, "values", values))
            }
        };
        self.add_type(
            &ctx,
            TypeDef {
                name: name.to_owned(),
                description: t.description.trim().to_owned(),
                source: t.source,
                shared: true,
                body,
            },
        );
    }

    fn method(
        &mut self,
        file: &str,
        namespace: &str,
        method_scopes: &BTreeSet<String>,
        m: &RawMethod,
    ) -> Method {
        let ctx = Ctx {
            file,
            label: &m.name,
            source: m.source,
        };
        let prefix = format!("{namespace}.");
        match m.name.strip_prefix(&prefix) {
            Some(rest) if !rest.is_empty() && rest.split('.').all(valid_segment) => {}
            _ => self.problem(
                &ctx,
                format!("the name must be `{namespace}.<method>` with non-empty segments"),
            ),
        }
        if !method_scopes.contains(&m.scope) {
            self.problem(
                &ctx,
                format!(
                    "scope `{}` is not a method scope (one of: {})",
                    m.scope,
                    method_scopes.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            );
        }
        if m.summary.trim().is_empty() {
            self.problem(&ctx, "`summary` is required");
        }
        let variant = naming::method_type_stem(&m.name);
        let params_type = format!("{variant}Params");
        let result_type = format!("{variant}Result");

        let (strict, additional, fields) = match &m.params {
            None => (true, None, &[][..]),
            Some(p) => {
                let strict = p.strict.unwrap_or(true);
                let additional = p.additional.as_deref().map(|a| {
                    if strict {
                        self.problem(&ctx, "params: `additional` needs `strict: false`");
                    }
                    let name = format!("{params_type}Additional");
                    match parse_expr(a) {
                        Ok(e) => self.resolve(&ctx, &e, &name, "", None, None),
                        Err(e) => {
                            self.problem(&ctx, format!("params.additional: {e}"));
                            Ty::Any
                        }
                    }
                });
                (strict, additional, p.fields.as_slice())
            }
        };
        let params = self.object(&ctx, &params_type, strict, additional, fields);
        let owner = m
            .owner
            .as_ref()
            .and_then(|o| self.owner_rule(&ctx, &params, o));
        self.add_type(
            &ctx,
            TypeDef {
                name: params_type.clone(),
                description: format!("Parameters of `{}`.", m.name),
                source: m.source,
                shared: false,
                body: TypeBody::Object(params),
            },
        );

        let r = &m.result;
        let result_desc = r
            .description
            .clone()
            .unwrap_or_else(|| format!("Result of `{}`.", m.name));
        let result = match parse_expr(&r.ty) {
            Ok(Expr::Object) => self.resolve(
                &ctx,
                &Expr::Object,
                &result_type,
                &result_desc,
                r.strict,
                r.fields.as_deref(),
            ),
            Ok(e) => {
                if r.strict.is_some() || (r.fields.is_some() && !contains_object(&e)) {
                    self.problem(
                        &ctx,
                        "result: `fields`/`strict` need type object or array<object>",
                    );
                }
                self.resolve(
                    &ctx,
                    &e,
                    &result_type,
                    &result_desc,
                    r.strict,
                    r.fields.as_deref(),
                )
            }
            Err(e) => {
                self.problem(&ctx, format!("result: {e}"));
                Ty::Any
            }
        };

        Method {
            name: m.name.clone(),
            namespace: namespace.to_owned(),
            scope: m.scope.clone(),
            summary: m.summary.trim().to_owned(),
            description: m.description.as_ref().map(|d| d.trim().to_owned()),
            source: m.source,
            stub: m.stub,
            internal: m.internal,
            owner,
            handler_fn: naming::handler_fn(namespace, &m.name),
            variant,
            params_type,
            result_type,
            result,
            result_nullable: r.nullable.unwrap_or(false),
            result_description: r.description.clone(),
        }
    }

    /// Resolves an ownership rule: the kind exists, and the path leads through object members
    /// (of the params, then of named object types) to a string.
    fn owner_rule(&mut self, ctx: &Ctx<'_>, params: &ObjectDef, o: &RawOwner) -> Option<OwnerRule> {
        let Some(kind) = self.owners.iter().find(|k| k.kind == o.kind).cloned() else {
            let known: Vec<&str> = self.owners.iter().map(|k| k.kind.as_str()).collect();
            self.problem(
                ctx,
                format!(
                    "owner: unknown kind `{}` (owners.yaml has: {})",
                    o.kind,
                    known.join(", ")
                ),
            );
            return None;
        };
        let missing = o.missing.unwrap_or(Missing::NotFound);
        if missing == Missing::Claim && !kind.lookup {
            self.problem(
                ctx,
                format!(
                    "owner: `missing: claim` needs a kind the store looks up (`{}` is not)",
                    kind.kind
                ),
            );
        }
        let mut path = Vec::new();
        let mut object = params.clone();
        let segments: Vec<&str> = o.param.split('.').collect();
        for (i, seg) in segments.iter().enumerate() {
            let Some(f) = object.fields.iter().find(|f| f.wire == *seg).cloned() else {
                self.problem(
                    ctx,
                    format!("owner: `{}` is not a member of the params", o.param),
                );
                return None;
            };
            path.push(PathStep {
                ident: f.ident.clone(),
                optional: (f.required && f.nullable) || (!f.required && f.default.is_none()),
            });
            let last = i + 1 == segments.len();
            match (&f.ty, last) {
                (Ty::String, true) => {}
                (Ty::Named(n), false) => match self.types.get(n).map(|t| &t.body) {
                    Some(TypeBody::Object(inner)) => object = inner.clone(),
                    _ => {
                        self.problem(
                            ctx,
                            format!("owner: `{seg}` of `{}` is not an object", o.param),
                        );
                        return None;
                    }
                },
                _ => {
                    self.problem(
                        ctx,
                        format!(
                            "owner: `{}` must lead through objects to a string member",
                            o.param
                        ),
                    );
                    return None;
                }
            }
        }
        Some(OwnerRule {
            param: o.param.clone(),
            path,
            kind: kind.kind,
            missing,
        })
    }

    /// A struct may contain itself only behind an array or map (Rust needs the indirection).
    fn check_recursion(&mut self) {
        let mut found = Vec::new();
        for def in self.types.values() {
            let mut stack = vec![def.name.clone()];
            let mut seen = BTreeSet::new();
            while let Some(n) = stack.pop() {
                let Some(TypeBody::Object(o)) = self.types.get(&n).map(|t| &t.body) else {
                    continue;
                };
                for f in &o.fields {
                    if let Ty::Named(child) = &f.ty {
                        if child == &def.name {
                            found.push(def.name.clone());
                        } else if seen.insert(child.clone()) {
                            stack.push(child.clone());
                        }
                    }
                }
            }
        }
        found.sort();
        found.dedup();
        for name in found {
            self.problems.push(Problem {
                file: "types".to_owned(),
                method: Some(format!("type {name}")),
                message: "contains itself directly; recursion must go through array<> or map<>"
                    .to_owned(),
            });
        }
    }
}

fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn contains_object(e: &Expr) -> bool {
    match e {
        Expr::Object => true,
        Expr::Array(i) | Expr::Map(i) => contains_object(i),
        Expr::Ty(_) => false,
    }
}

pub fn lower(raw: RawCatalogue) -> Result<Catalogue, Problems> {
    let mut l = Lowerer {
        problems: Vec::new(),
        types: BTreeMap::new(),
        shared_names: raw.types.iter().map(|(_, n, _)| n.clone()).collect(),
        owners: Vec::new(),
    };
    if let Some((file, o)) = &raw.owners {
        let mut seen = BTreeSet::new();
        for k in &o.owners {
            if !seen.insert(k.kind.clone()) {
                l.problems.push(file_problem(
                    file,
                    format!("owner kind `{}` repeats", k.kind),
                ));
            }
            if !valid_segment(&k.kind) || k.kind.chars().any(|c| c.is_ascii_uppercase()) {
                l.problems.push(file_problem(
                    file,
                    format!("owner kind `{}` must be lowercase snake_case", k.kind),
                ));
            }
            if k.description.trim().is_empty() || k.not_found.trim().is_empty() {
                l.problems.push(file_problem(
                    file,
                    format!("owner kind `{}` needs a description and not_found", k.kind),
                ));
            }
            l.owners.push(OwnerKind {
                kind: k.kind.clone(),
                variant: naming::enum_variant(&k.kind),
                description: k.description.trim().to_owned(),
                not_found: k.not_found.trim().to_owned(),
                lookup: k.lookup,
                refuse_as_scope: k.refusal == crate::raw::Refusal::Scope,
            });
            if k.lookup && k.refusal == crate::raw::Refusal::Scope {
                l.problems.push(file_problem(
                    file,
                    format!(
                        "owner kind `{}`: `refusal: scope` is for tenant-id params (lookup false); \
                         a looked-up record must not reveal that it exists",
                        k.kind
                    ),
                ));
            }
        }
    }

    let mut scopes = Vec::new();
    if let Some((file, s)) = &raw.scopes {
        let mut seen = BTreeSet::new();
        for sc in &s.scopes {
            if !seen.insert(sc.name.clone()) {
                l.problems
                    .push(file_problem(file, format!("scope `{}` repeats", sc.name)));
            }
            scopes.push(Scope {
                name: sc.name.clone(),
                variant: naming::enum_variant(&sc.name),
                description: sc.description.trim().to_owned(),
                method_scope: sc.method_scope,
            });
        }
    }
    let method_scopes: BTreeSet<String> = scopes
        .iter()
        .filter(|s| s.method_scope)
        .map(|s| s.name.clone())
        .collect();

    let mut errors = Vec::new();
    if let Some((file, e)) = &raw.errors {
        let mut codes = BTreeSet::new();
        for err in &e.errors {
            if !codes.insert(err.code) {
                l.problems.push(file_problem(
                    file,
                    format!("error code {} repeats", err.code),
                ));
            }
            errors.push(ErrorCode {
                code: err.code,
                name: err.name.clone(),
                constant: naming::constant(&err.name),
                message: err.message.clone(),
                description: err.description.trim().to_owned(),
            });
        }
    }

    let mut seen_types = BTreeSet::new();
    for (file, name, t) in &raw.types {
        if !seen_types.insert(name.clone()) {
            l.problems.push(Problem {
                file: file.clone(),
                method: Some(format!("type {name}")),
                message: "type name already defined in another types/ file".to_owned(),
            });
            continue;
        }
        l.shared_type(file, name, t);
    }

    let mut namespaces = Vec::new();
    let mut methods = Vec::new();
    let mut method_names = BTreeSet::new();
    for (file, header, raw_methods) in &raw.methods {
        let stem = file
            .strip_prefix("methods/")
            .and_then(|f| f.strip_suffix(".yaml"))
            .unwrap_or(file);
        if header.namespace != stem {
            l.problems.push(file_problem(
                file,
                format!(
                    "namespace `{}` must equal the file name `{stem}`",
                    header.namespace
                ),
            ));
        }
        if raw_methods.is_empty() {
            l.problems.push(file_problem(
                file,
                "a namespace needs at least one method".to_owned(),
            ));
        }
        namespaces.push(Namespace {
            name: header.namespace.clone(),
            description: header.description.trim().to_owned(),
            trait_name: naming::namespace_trait(&header.namespace),
        });
        for m in raw_methods {
            if !method_names.insert(m.name.clone()) {
                l.problems.push(Problem {
                    file: file.clone(),
                    method: Some(m.name.clone()),
                    message: "method name repeats".to_owned(),
                });
                continue;
            }
            methods.push(l.method(file, &header.namespace, &method_scopes, m));
        }
    }
    l.check_recursion();

    if raw.scopes.is_none() || raw.errors.is_none() || raw.owners.is_none() {
        l.problems.push(file_problem(
            "catalogue",
            "scopes.yaml, errors.yaml and owners.yaml are required".to_owned(),
        ));
    }

    if !l.problems.is_empty() {
        let mut p = l.problems;
        p.sort();
        p.dedup();
        return Err(Problems(p));
    }
    namespaces.sort_by(|a, b| a.name.cmp(&b.name));
    methods.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Catalogue {
        scopes,
        errors,
        owners: l.owners,
        types: l.types.into_values().collect(),
        namespaces,
        methods,
    })
}

fn file_problem(file: &str, message: String) -> Problem {
    Problem {
        file: file.to_owned(),
        method: None,
        message,
    }
}
