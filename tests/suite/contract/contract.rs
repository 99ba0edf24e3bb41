//! Contract tests: catalogue invariants, generated/ in sync, every schema compiles, the OpenRPC
//! document is well formed, and the compiled METHODS table agrees with the catalogue.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use agent_gateway::api::generated::methods::{Scope, METHODS, NAMESPACES};
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
    for f in ["scopes.yaml", "errors.yaml", "owners.yaml"] {
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

// ---- The contract over HTTP: /openrpc.json and the JSON-RPC pages under /docs/rpc/ ----

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(crate::common::STEP)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Status, headers and body of an unauthenticated GET.
async fn fetch(
    gw: &crate::common::Gateway,
    path: &str,
) -> (u16, reqwest::header::HeaderMap, String) {
    let r = http().get(gw.url(path)).send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openrpc_json_is_served_without_a_token_as_generated() {
    let gw = crate::common::start("").await;
    let (status, headers, body) = fetch(&gw, "/openrpc.json").await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    let file = std::fs::read_to_string(root().join("generated/openrpc.json")).unwrap();
    assert!(
        body == file,
        "/openrpc.json differs from generated/openrpc.json"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_docs_list_every_namespace_and_every_method_with_its_scope() {
    let gw = crate::common::start("").await;
    // The directory form, so the pages' relative links resolve.
    let (status, headers, _) = fetch(&gw, "/docs/rpc").await;
    assert_eq!(status, 308);
    assert_eq!(headers["location"], "/docs/rpc/");
    let (status, headers, index) = fetch(&gw, "/docs/rpc/").await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    assert!(headers["content-security-policy"]
        .to_str()
        .unwrap()
        .starts_with("default-src 'none'"));
    let linked = index.matches("<tr><td><a href=\"").count();
    assert_eq!(linked, NAMESPACES.len(), "one row per namespace");
    for e in [-32700, -32600, -32601, -32602, -32603, -32001, -32004] {
        assert!(index.contains(&format!("id=\"error{e}\"")), "error {e}");
    }
    let mut sections = 0;
    for ns in NAMESPACES {
        assert!(
            index.contains(&format!("<a href=\"{ns}.html\">{ns}</a>")),
            "{ns}"
        );
        let (status, _, page) = fetch(&gw, &format!("/docs/rpc/{ns}.html")).await;
        assert_eq!(status, 200, "{ns}");
        let methods: Vec<_> = METHODS.iter().filter(|m| m.namespace == ns).collect();
        assert_eq!(
            page.matches("<section class=\"method\"").count(),
            methods.len(),
            "{ns}: one section per method"
        );
        for m in methods {
            let row = format!(
                "<tr><td><a href=\"#{0}\"><code>{0}</code></a></td><td>{1}</td>",
                m.name,
                m.scope.as_str()
            );
            assert!(page.contains(&row), "{}: scope row", m.name);
            let section = page
                .split(&format!("<section class=\"method\" id=\"{}\">", m.name))
                .nth(1)
                .unwrap_or_else(|| panic!("{}: no section", m.name));
            let section = section.split("</section>").next().unwrap();
            assert!(
                section.contains(&format!("scope: {}", m.scope.as_str())),
                "{}",
                m.name
            );
            assert_eq!(
                section.contains("not implemented yet"),
                m.stub && !m.internal,
                "{}: stub marking",
                m.name
            );
            for h in ["<h3>Params</h3>", "<h3>Result</h3>", "<h3>Errors</h3>"] {
                assert!(section.contains(h), "{}: {h}", m.name);
            }
            sections += 1;
        }
    }
    assert_eq!(sections, METHODS.len());
    // A documented param with its type, required flag and constraints (catalogue: session.send).
    let (_, _, session) = fetch(&gw, "/docs/rpc/session.html").await;
    assert!(session.contains(
        "<tr><td class=\"member\"><code>timeout_ms</code></td><td>integer</td><td>no</td><td>minimum 1000; maximum 600000; default <code>60000</code></td>"
    ));
    let (status, _, types) = fetch(&gw, "/docs/rpc/types.html").await;
    assert_eq!(status, 200);
    assert!(types.contains("id=\"ProvidersConfig\""));
    for bad in [
        "/docs/rpc/nope.html",
        "/docs/rpc/session",
        "/docs/rpc/../openapi.json",
    ] {
        let (status, _, _) = fetch(&gw, bad).await;
        assert_eq!(status, 404, "{bad}");
    }
    // /docs (Swagger UI) reaches them through the document it renders.
    let doc: Value = serde_json::from_str(&agent_gateway::http::openapi::document()).unwrap();
    assert_eq!(doc["externalDocs"]["url"], "/docs/rpc/");
    assert!(doc["info"]["description"]
        .as_str()
        .unwrap()
        .contains("](/docs/rpc/)"));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_routes_are_off_when_docs_are_disabled() {
    let gw = crate::common::start("  docs: {enabled: false}\n").await;
    for path in [
        "/openrpc.json",
        "/docs/rpc",
        "/docs/rpc/",
        "/docs/rpc/session.html",
    ] {
        let (status, _, _) = fetch(&gw, path).await;
        assert_eq!(status, 404, "{path}");
    }
    gw.stop().await;
}

#[test]
fn rpc_docs_escape_catalogue_text() {
    let dir = tempfile::tempdir().unwrap();
    let src = root().join("catalogue");
    for f in ["scopes.yaml", "errors.yaml", "owners.yaml"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::create_dir_all(dir.path().join("types")).unwrap();
    std::fs::create_dir_all(dir.path().join("methods")).unwrap();
    std::fs::write(
        dir.path().join("methods/demo.yaml"),
        r#"namespace: demo
description: "Demo <b>bold</b> & more"
methods:
  - name: demo.one
    scope: rpc
    summary: "Runs <script>alert(1)</script>"
    description: "See `<script>x</script>` and \"quotes\" -32002"
    source: designed
    stub: true
    params:
      fields:
        - name: q
          type: string
          pattern: '^<a>$'
          description: "\"><img src=x onerror=alert(1)>"
    result: {type: boolean}
"#,
    )
    .unwrap();
    let cat = gateway_codegen::load_catalogue(dir.path()).unwrap_or_else(|p| panic!("{p}"));
    let pages = gateway_codegen::emit::html::emit(&cat, "0").unwrap();
    let (_, page) = pages.iter().find(|(n, _)| n == "demo.html").unwrap();
    for raw in ["<script", "<img", "<b>", "<a>"] {
        assert!(!page.contains(raw), "unescaped {raw} in the page");
    }
    for escaped in [
        "Runs &lt;script&gt;alert(1)&lt;/script&gt;",
        "<code>&lt;script&gt;x&lt;/script&gt;</code>",
        "&quot;quotes&quot;",
        "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;",
        "pattern <code>^&lt;a&gt;$</code>",
        "Demo &lt;b&gt;bold&lt;/b&gt; &amp; more",
    ] {
        assert!(page.contains(escaped), "missing {escaped}");
    }
    assert!(page.contains("not implemented yet"));
    for code in ["-32004", "-32002", "-32602", "-32603"] {
        assert!(page.contains(&format!("index.html#error{code}")), "{code}");
    }
    // The real pages: no script, nothing loaded from elsewhere.
    for (name, text) in gateway_codegen::render_all(&catalogue()).unwrap() {
        if name.starts_with("docs") {
            assert!(!text.contains("<script"), "{}", name.display());
            assert!(!text.contains("src=\"http"), "{}", name.display());
        }
    }
}

#[test]
fn the_drift_check_covers_generated_docs() {
    let cat = catalogue();
    let all = gateway_codegen::render_all(&cat).unwrap();
    let docs: BTreeSet<String> = all
        .keys()
        .filter(|p| p.starts_with("docs"))
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(
        docs.len(),
        NAMESPACES.len() + 2,
        "index, types, one per namespace"
    );
    assert!(docs.contains("docs/index.html") && docs.contains("docs/types.html"));
    let out = tempfile::tempdir().unwrap();
    gateway_codegen::generate(&cat, out.path()).unwrap();
    assert!(gateway_codegen::check(&cat, out.path()).unwrap().is_empty());
    let page = out.path().join("docs/session.html");
    let text = std::fs::read_to_string(&page).unwrap();
    std::fs::write(&page, text.replace("session.send", "session.sent")).unwrap();
    std::fs::write(out.path().join("docs/old.html"), "<p>gone</p>").unwrap();
    std::fs::remove_file(out.path().join("docs/types.html")).unwrap();
    let diffs = gateway_codegen::check(&cat, out.path()).unwrap();
    for want in [
        "stale: docs/session.html",
        "missing: docs/types.html",
        "not generated (remove it): docs/old.html",
    ] {
        assert!(diffs.iter().any(|d| d == want), "{want} not in {diffs:?}");
    }
    // What the server embeds is what generated/ holds.
    for (name, text) in agent_gateway::http::docs::RPC_PAGES {
        assert_eq!(
            all.get(&PathBuf::from("docs").join(name)),
            Some(&(*text).to_owned()),
            "{name}"
        );
    }
    assert_eq!(
        all.get(&PathBuf::from("openrpc.json")),
        Some(&agent_gateway::http::docs::OPENRPC_JSON.to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_schema_shows_the_catalogue_constraints_of_providers_and_agents() {
    // What the catalogue declares, read from its source.
    let cat = catalogue();
    let field = |ty: &str, member: &str| {
        let Some(gateway_codegen::ir::TypeDef {
            body: gateway_codegen::ir::TypeBody::Object(o),
            ..
        }) = cat.type_def(ty)
        else {
            panic!("{ty} is not an object type");
        };
        o.fields
            .iter()
            .find(|f| f.wire == member)
            .unwrap()
            .constraints
            .clone()
    };
    let api_key_pattern = field("ProvidersConfig", "apiKeyEnv").pattern.unwrap();
    let timeout_min = field("ProvidersConfig", "timeoutMs").minimum.unwrap();
    let steps_max = field("AgentsConfig", "maxSteps").maximum.unwrap();
    let model_pattern = field("AgentsConfig", "model").pattern.unwrap();

    let gw = crate::common::start("").await;
    let schema_of = |v: &Value| v["result"]["schema"].clone();
    let entry = |s: &Value| {
        let r = s["additionalProperties"]["$ref"].as_str().unwrap();
        s["$defs"][r.trim_start_matches("#/$defs/")].clone()
    };
    let providers = schema_of(
        &gw.call(
            crate::common::ADMIN,
            "config.schema",
            serde_json::json!({"section": "providers"}),
        )
        .await,
    );
    let p = entry(&providers);
    assert_eq!(
        p["properties"]["apiKeyEnv"]["pattern"],
        api_key_pattern.as_str()
    );
    assert_eq!(
        p["properties"]["timeoutMs"]["minimum"].as_f64(),
        Some(timeout_min)
    );
    let agents = schema_of(
        &gw.call(
            crate::common::ADMIN,
            "config.schema",
            serde_json::json!({"section": "agents"}),
        )
        .await,
    );
    let a = entry(&agents);
    assert_eq!(
        a["properties"]["maxSteps"]["maximum"].as_f64(),
        Some(steps_max)
    );
    assert_eq!(a["properties"]["model"]["pattern"], model_pattern.as_str());
    let whole = schema_of(
        &gw.call(crate::common::ADMIN, "config.schema", serde_json::json!({}))
            .await,
    );
    let r = whole["properties"]["providers"]["additionalProperties"]["$ref"]
        .as_str()
        .unwrap();
    assert_eq!(
        whole["$defs"][r.trim_start_matches("#/$defs/")]["properties"]["apiKeyEnv"]["pattern"],
        api_key_pattern.as_str()
    );
    // The schema the gateway shows refuses what the gateway refuses at load.
    let v = jsonschema::validator_for(&whole).unwrap();
    assert!(!v.is_valid(&serde_json::json!({"agents": {"a": {"maxSteps": steps_max + 1.0}}})));
    assert!(v.is_valid(&serde_json::json!({"agents": {"a": {"maxSteps": steps_max}}})));
    gw.stop().await;
}

#[test]
fn the_tests_and_the_build_read_only_files_of_the_repository() {
    // Built from pieces so this file does not match itself.
    let outside = ["..", "/shared"].concat();
    let mut stack: Vec<PathBuf> = [
        "tests",
        "scripts",
        ".ci",
        "benches",
        "codegen",
        "gateway",
        "catalogue",
    ]
    .iter()
    .map(|d| root().join(d))
    .collect();
    let mut files = vec![root().join("build.rs"), root().join("Cargo.toml")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "node_modules"
                || name == "target"
                || (name.starts_with('.') && name != ".ci")
            {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    // A comment or a Markdown text may cite the design documents; code may not open them.
    let mut readers = Vec::new();
    for f in files
        .iter()
        .filter(|f| f.extension().is_none_or(|e| e != "md"))
    {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            let comment = ["//", "#", "*", "--", "<!--"]
                .iter()
                .any(|c| code.starts_with(c));
            if line.contains(&outside) && !comment {
                readers.push(format!("{}:{}", f.display(), n + 1));
            }
        }
    }
    assert!(
        readers.is_empty(),
        "files reading outside the repository: {readers:?}"
    );
    assert!(
        files.len() > 50,
        "the walk found the repository ({} files)",
        files.len()
    );
}
