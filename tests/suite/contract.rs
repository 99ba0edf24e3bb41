//! Contract tests: catalogue invariants, generated/ in sync, every schema compiles, the OpenRPC
//! document is well formed, and the compiled METHODS table agrees with the catalogue.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use agent_gateway::rpc::generated::methods::{Scope, METHODS, NAMESPACES};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn catalogue() -> gateway_codegen::Catalogue {
    gateway_codegen::load_catalogue(&root().join("catalogue")).unwrap_or_else(|p| panic!("{p}"))
}

#[test]
fn catalogue_has_every_in_scope_method_of_the_reference() {
    let cat = catalogue();
    assert_eq!(cat.methods.len(), 223);
    assert_eq!(cat.namespaces.len(), 44);
    let names: BTreeSet<&str> = cat.methods.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names.len(), cat.methods.len(), "method names are unique");
    for m in &cat.methods {
        assert!(
            matches!(m.scope.as_str(), "rpc" | "admin"),
            "{}: scope {}",
            m.name,
            m.scope
        );
        assert!(
            m.name.starts_with(&format!("{}.", m.namespace)),
            "{}",
            m.name
        );
        assert!(!m.summary.is_empty(), "{}: summary", m.name);
    }
    // An in-repo extract (its header says from where and when): a clone must pass on its own.
    let reference = root().join("tests/data/reference-methods.yaml");
    let text = std::fs::read_to_string(&reference)
        .unwrap_or_else(|e| panic!("{}: {e}", reference.display()));
    let doc: Value = serde_saphyr::from_str(&text).unwrap();
    let wanted: BTreeSet<&str> = doc["methods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["in_scope"] == Value::Bool(true))
        .map(|m| m["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        names, wanted,
        "catalogue methods == reference in_scope methods"
    );
}

#[test]
fn spec_scopes_win() {
    let cat = catalogue();
    let scope = |n: &str| {
        cat.methods
            .iter()
            .find(|m| m.name == n)
            .unwrap()
            .scope
            .clone()
    };
    for (m, s) in [
        ("system.ping", "rpc"),
        ("agent.execute", "rpc"),
        ("agent.cacheStats", "admin"),
        ("obs.diagnostics", "rpc"),
        ("obs.billing.total", "admin"),
        ("session.list", "rpc"),
        ("session.delete", "admin"),
        ("config.read", "admin"),
        ("gateway.status", "admin"),
        ("cron.add", "rpc"),
        ("browser.start", "rpc"),
    ] {
        assert_eq!(scope(m), s, "{m}");
    }
    let internal: Vec<_> = cat
        .methods
        .iter()
        .filter(|m| m.internal)
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(internal, vec!["tool.invoke"]);
}

#[test]
fn generated_directory_is_up_to_date() {
    let diffs = gateway_codegen::check(&catalogue(), &root().join("generated")).unwrap();
    assert!(
        diffs.is_empty(),
        "generated/ is stale ({} file(s)): {:?}\nrun: cargo run -p gateway-codegen -- generate",
        diffs.len(),
        &diffs[..diffs.len().min(10)]
    );
}

#[test]
fn compiled_table_matches_the_catalogue() {
    let cat = catalogue();
    assert_eq!(METHODS.len(), cat.methods.len());
    assert_eq!(NAMESPACES.len(), cat.namespaces.len());
    for (info, m) in METHODS.iter().zip(&cat.methods) {
        assert_eq!(info.name, m.name);
        assert_eq!(info.namespace, m.namespace);
        assert_eq!(info.scope.as_str(), m.scope);
        assert_eq!(info.stub, m.stub);
        assert_eq!(info.internal, m.internal);
        assert_eq!(info.id.info().name, info.name);
    }
    assert_eq!(Scope::from_name("*"), Some(Scope::All));
}

#[test]
fn the_declared_namespace_is_never_derived_from_dots() {
    let info = METHODS
        .iter()
        .find(|m| m.name == "obs.billing.total")
        .unwrap();
    assert_eq!(info.namespace, "obs");
    let info = METHODS
        .iter()
        .find(|m| m.name == "admin.approval.resolve")
        .unwrap();
    assert_eq!(info.namespace, "admin");
}

fn compile(schema_text: &str, what: &str) -> jsonschema::Validator {
    let schema: Value = serde_json::from_str(schema_text).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
        "{what}: dialect"
    );
    jsonschema::meta::validate(&schema)
        .unwrap_or_else(|e| panic!("{what}: not a valid schema: {e}"));
    jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{what}: does not compile: {e}"))
}

#[test]
fn every_params_and_result_schema_compiles() {
    for m in &METHODS {
        compile(m.params_schema, &format!("{} params", m.name));
        compile(m.result_schema, &format!("{} result", m.name));
    }
    let dir = root().join("generated/jsonschema");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), METHODS.len() * 2);
    for f in files {
        let text = std::fs::read_to_string(f.path()).unwrap();
        compile(&text, &f.path().display().to_string());
    }
}

#[test]
fn params_schemas_refuse_unknown_members_unless_declared_open() {
    let open: BTreeSet<&str> = ["config.apply", "config.patch"].into();
    for m in &METHODS {
        let v = compile(m.params_schema, m.name);
        let bogus = serde_json::json!({"definitelyNotAParam": 1});
        assert_eq!(v.is_valid(&bogus), open.contains(m.name), "{}", m.name);
    }
}

#[test]
fn no_result_is_left_as_a_bare_any() {
    // `any` is kept only where the value really is arbitrary; whole results never are.
    for m in &METHODS {
        let s: Value = serde_json::from_str(m.result_schema).unwrap();
        let keys: Vec<&String> = s
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| !["$schema", "title", "description"].contains(&k.as_str()))
            .collect();
        assert!(!keys.is_empty(), "{}: result schema says nothing", m.name);
    }
}

fn openrpc() -> Value {
    let text = std::fs::read_to_string(root().join("generated/openrpc.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn openrpc_document_is_well_formed() {
    let doc = openrpc();
    assert!(doc["openrpc"].as_str().unwrap().starts_with("1."));
    let methods = doc["methods"].as_array().unwrap();
    assert_eq!(
        methods.len(),
        METHODS.iter().filter(|m| !m.internal).count()
    );
    let mut names = BTreeSet::new();
    for m in methods {
        assert!(
            names.insert(m["name"].as_str().unwrap()),
            "duplicate {}",
            m["name"]
        );
        assert!(m["result"]["schema"].is_object());
        for p in m["params"].as_array().unwrap() {
            assert!(p["name"].is_string() && p["schema"].is_object());
        }
    }
    // Every $ref points at a component that exists.
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let text = doc.to_string();
    for piece in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = piece.split('"').next().unwrap();
        assert!(schemas.contains_key(name), "dangling $ref {name}");
    }
}

#[test]
fn methods_md_counts_stubs() {
    let text = std::fs::read_to_string(root().join("generated/METHODS.md")).unwrap();
    let stubs = METHODS.iter().filter(|m| m.stub && !m.internal).count();
    assert!(
        text.contains(&format!("{stubs} stubs")),
        "METHODS.md states the stub count"
    );
    assert!(text.contains("| gateway | 2 | 2 | 0 |"));
}

#[test]
fn a_malformed_catalogue_lists_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let src = root().join("catalogue");
    for f in ["scopes.yaml", "errors.yaml"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::create_dir_all(dir.path().join("types")).unwrap();
    std::fs::create_dir_all(dir.path().join("methods")).unwrap();
    std::fs::write(
        dir.path().join("methods/demo.yaml"),
        "namespace: demo\ndescription: d\nmethods:\n  - name: demo.one\n    scope: root\n    summary: s\n    source: spec\n    result: {type: object, fields: [{name: a, type: strin, description: x}]}\n  - name: other.two\n    scope: rpc\n    summary: s\n    source: designed\n    colour: red\n    result: {type: Missing}\n  - name: demo.three\n    scope: rpc\n    summary: s\n    source: spec\n    params: {fields: [{name: n, type: integer, minLength: 2, description: d}, {name: m, type: string, required: true, default: x, description: d}]}\n    result: {type: boolean}\n",
    )
    .unwrap();
    let err = gateway_codegen::load_catalogue(dir.path()).expect_err("must fail");
    let text = err.to_string();
    for needle in [
        "[demo.one]: scope `root`",
        "[demo.one]: `DemoOneResult.a`: unknown type expression `strin`",
        "[other.two]: at colour: unknown field `colour`",
        "[demo.three]: `DemoThreeParams.n`: `minLength/maxLength` does not apply",
        "[demo.three]: `DemoThreeParams.m`: a required member cannot have a `default`",
    ] {
        assert!(
            text.contains(needle),
            "missing problem {needle:?} in:\n{text}"
        );
    }
    assert!(Path::new(&dir.path().join("methods/demo.yaml")).exists());
}

#[test]
fn rendering_is_deterministic() {
    let a = gateway_codegen::render_all(&catalogue()).unwrap();
    let b = gateway_codegen::render_all(&catalogue()).unwrap();
    assert_eq!(a, b);
    let text: String = a.values().cloned().collect();
    assert!(
        !text.contains(env!("CARGO_MANIFEST_DIR")),
        "no absolute paths in generated files"
    );
}

#[test]
fn the_openapi_snapshot_is_in_sync() {
    let path = root().join("generated/openapi/openapi.json");
    let current = agent_gateway::http::openapi::document();
    let stored = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        stored == current,
        "generated/openapi/openapi.json is out of date; regenerate with:\n  cargo run -q --bin agent-gateway -- openapi > generated/openapi/openapi.json"
    );
}

#[test]
fn every_openapi_operation_declares_its_statuses() {
    let doc: Value = serde_json::from_str(&agent_gateway::http::openapi::document()).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for (path, ops) in paths {
        for (method, op) in ops.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            assert!(responses.contains_key("200"), "{method} {path}");
            if path != "/health" && path != "/api/health" {
                for status in ["400", "401", "403", "413", "415", "429", "500"] {
                    assert!(
                        responses.contains_key(status),
                        "{method} {path} lacks {status}"
                    );
                }
                assert!(
                    op["security"].is_array(),
                    "{method} {path} declares no security"
                );
            }
        }
    }
}
