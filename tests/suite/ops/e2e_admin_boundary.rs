//! The admin boundary of the configuration (issue 27), from outside: an API token, `admin` or
//! `*`, never changes a file-only key through `config.set/patch/apply`; provider entries
//! written through `config.*` pass the provider policy (a key stays with its endpoint, so no
//! loopback listener ever sees it); `/app` serves nothing outside the dashboard's directory;
//! no API write makes a token broader than its writer; and the configuration is the fleet's
//! document: written on one node, in force on the other within moments, with read-only files,
//! across restarts, with an operator's edit of a file recorded in the history.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::common::*;

fn ok(v: &Value) -> &Value {
    assert!(v.get("error").is_none(), "{v}");
    &v["result"]
}

fn file(gw: &Gateway) -> String {
    std::fs::read_to_string(gw.dir.path().join("gateway.yaml")).unwrap()
}

/// `{a: {b: value}}` of the dot path `a.b`.
fn nested(path: &str, value: Value) -> Value {
    path.rsplit('.').fold(value, |inner, key| {
        let mut m = Map::new();
        m.insert(key.to_owned(), inner);
        Value::Object(m)
    })
}

fn set_at(doc: &mut Value, path: &str, value: Value) {
    let mut at = doc;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, key) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            at[*key] = value;
            return;
        }
        if at.get(*key).is_none_or(Value::is_null) {
            at[*key] = json!({});
        }
        at = &mut at[*key];
    }
}

fn refused_naming(r: &Value, path: &str) {
    assert_eq!(code(r), -32602, "{path}: {r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("'{path}'")) && message.contains("file-only"),
        "{path}: {message}"
    );
}

async fn history_len(gw: &Gateway) -> usize {
    let h = gw
        .call(ADMIN, "config.history", json!({"limit": 500}))
        .await;
    ok(&h)["entries"].as_array().unwrap().len()
}

/// The file-only keys, each with a value an attacker would like.
const FILE_ONLY: &[(&str, &str)] = &[
    ("gateway.enabled", "false"),
    ("gateway.host", "\"0.0.0.0\""),
    ("gateway.port", "1"),
    ("gateway.dataDir", "\"/tmp/elsewhere\""),
    ("gateway.trustedProxies", "[\"0.0.0.0/0\"]"),
    ("gateway.tls.requireClientCert", "false"),
    ("gateway.web.distDir", "\"/\""),
    ("local.python", "\"/bin/sh\""),
    ("local.cacheDir", "\"/etc\""),
    ("providerPolicy.allowLoopbackBaseUrl", "true"),
    (
        "providerPolicy.apiKeyEnvAllowlist",
        "[\"AGENT_GATEWAY_MASTER_KEY\"]",
    ),
    ("net.allowLoopback", "true"),
    ("net.allowCidrs", "[\"169.254.0.0/16\"]"),
    ("secrets.masterKeyFile", "\"/etc/passwd\""),
    ("store.url", "\"sqlite:///tmp/other.db\""),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_api_write_changes_a_file_only_key() {
    let gw = start("agents:\n  bot: {model: local/smollm2-135m-instruct}\n").await;
    let before_file = file(&gw);
    let before_history = history_len(&gw).await;
    let before_read = ok(&gw.call(ADMIN, "config.read", json!({})).await).clone();
    for (path, value) in FILE_ONLY {
        let value: Value = serde_json::from_str(value).unwrap();
        let (section, key) = path.split_once('.').unwrap();
        for token in [ADMIN_ONLY, ADMIN] {
            let r = gw
                .call(
                    token,
                    "config.set",
                    json!({"section": section, "key": key, "value": value}),
                )
                .await;
            refused_naming(&r, path);
        }
        let r = gw
            .call(ADMIN_ONLY, "config.patch", nested(path, value.clone()))
            .await;
        refused_naming(&r, path);
        let mut whole = before_read["config"].clone();
        set_at(&mut whole, path, value.clone());
        let r = gw.call(ADMIN_ONLY, "config.apply", whole).await;
        refused_naming(&r, path);
    }
    // A job declared through the API may not bring a wake gate (a program on the host).
    let job = json!({"scheduler": {"jobs": {"nightly": {
        "agentId": "bot", "message": "check", "schedule": {"kind": "interval", "everyMs": 60000},
        "wakeGate": {"script": "gate.sh"}}}}});
    let r = gw.call(ADMIN_ONLY, "config.patch", job).await;
    refused_naming(&r, "scheduler.jobs.nightly.wakeGate");
    // Nor may an agent be given administrator trust (tool.invoke's denylist).
    let trust = json!({"agents": {"bot": {"adminTrust": true}}});
    let r = gw.call(ADMIN_ONLY, "config.patch", trust).await;
    refused_naming(&r, "agents.bot.adminTrust");

    // Nothing was written anywhere; the configuration in force is the same.
    assert_eq!(file(&gw), before_file, "the file changed");
    assert_eq!(history_len(&gw).await, before_history, "a commit was made");
    let after_read = ok(&gw.call(ADMIN, "config.read", json!({})).await).clone();
    assert_eq!(after_read, before_read);
    // config.schema marks them.
    let schema = gw.call(ADMIN, "config.schema", json!({})).await;
    let listed: Vec<&str> = ok(&schema)["schema"]["x-fileOnly"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["path"].as_str().unwrap())
        .collect();
    for want in [
        "gateway.web.distDir",
        "providerPolicy",
        "local",
        "store",
        "secrets",
    ] {
        assert!(listed.contains(&want), "{listed:?}");
    }
    assert_eq!(
        ok(&schema)["schema"]["properties"]["providerPolicy"]["x-fileOnly"],
        true,
        "{schema}"
    );
    // The whole document given back without the file-only keys keeps this node's values.
    let mut whole = before_read["config"].clone();
    for section in ["local", "store", "secrets", "providerPolicy"] {
        whole.as_object_mut().unwrap().remove(section);
    }
    whole["gateway"].as_object_mut().unwrap().remove("port");
    whole["agentDefaults"]["maxSteps"] = json!(9);
    let r = gw.call(ADMIN_ONLY, "config.apply", whole).await;
    assert_eq!(ok(&r)["applied"], true, "{r}");
    wait_generation(&gw, 2).await;
    let read = ok(&gw.call(ADMIN, "config.read", json!({})).await).clone();
    assert_eq!(read["config"]["agentDefaults"]["maxSteps"], 9);
    for section in ["local", "store", "secrets", "providerPolicy"] {
        assert_eq!(
            read["config"][section], before_read["config"][section],
            "{section}"
        );
    }
    assert_eq!(file(&gw), before_file, "the file changed");
    gw.stop().await;
}

/// A loopback listener that counts the connections it accepts.
async fn listener() -> (String, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", l.local_addr().unwrap());
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while let Ok((_conn, _)) = l.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_keys_stay_with_their_endpoints_and_no_token_outgrows_its_writer() {
    let (leak, seen) = listener().await;
    let (home, home_seen) = listener().await;
    // The file sends FILE_PROVIDER_KEY to its own endpoint and lets the API reach loopback.
    std::env::set_var("FILE_PROVIDER_KEY", "file-provider-key-value-0123456789");
    let gw = start(&format!(
        "providerPolicy:\n  allowLoopbackBaseUrl: true\nproviders:\n  \
         home: {{type: openai, baseUrl: \"{home}\", apiKeyEnv: FILE_PROVIDER_KEY, models: [m]}}\n"
    ))
    .await;
    let history = history_len(&gw).await;
    // The master key's variable, anywhere: refused as providers.create refuses it.
    for var in ["AGENT_GATEWAY_MASTER_KEY", "HOME"] {
        let patch = json!({"providers": {"leak": {"type": "openai", "baseUrl": leak,
            "apiKeyEnv": var, "models": ["m"]}}});
        let r = gw.call(ADMIN_ONLY, "config.patch", patch).await;
        assert_eq!(code(&r), -32602, "{r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("apiKeyEnv"),
            "{r}"
        );
    }
    // The file's key sent elsewhere: by a new entry, by moving the file's entry, and through
    // providers.create/update (the same rule).
    let patch = json!({"providers": {"leak": {"type": "openai", "baseUrl": leak,
        "apiKeyEnv": "FILE_PROVIDER_KEY", "models": ["m"]}}});
    let r = gw.call(ADMIN_ONLY, "config.patch", patch).await;
    assert_eq!(code(&r), -32602, "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("bound"),
        "{r}"
    );
    let r = gw
        .call(
            ADMIN_ONLY,
            "config.set",
            json!({"section": "providers", "key": "home.baseUrl", "value": leak}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    let r = gw
        .call(
            ADMIN_ONLY,
            "providers.update",
            json!({"providerId": "home", "config": {"baseUrl": leak}}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    let r = gw
        .call(
            ADMIN_ONLY,
            "providers.create",
            json!({"providerId": "leak2", "config": {"type": "openai", "baseUrl": leak,
                "apiKeyEnv": "FILE_PROVIDER_KEY", "models": ["m"]}}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    // The same key at its own endpoint is fine; so is a keyless provider at the listener.
    let patch = json!({"providers": {"twin": {"type": "openai", "baseUrl": home,
        "apiKeyEnv": "FILE_PROVIDER_KEY", "models": ["m"]}}});
    let r = gw.call(ADMIN_ONLY, "config.patch", patch).await;
    assert_eq!(ok(&r)["restarting"], false, "{r}");
    for provider in ["leak", "leak2", "home"] {
        let _ = gw
            .call(
                ADMIN_ONLY,
                "models.test",
                json!({"provider": provider, "model": "m"}),
            )
            .await;
    }
    assert_eq!(
        seen.load(Ordering::SeqCst),
        0,
        "a request reached the listener"
    );
    // models.test does connect where the key is allowed to go: the check above can fail.
    assert!(
        home_seen.load(Ordering::SeqCst) > 0,
        "models.test never reached the file's own endpoint"
    );
    assert_eq!(history_len(&gw).await, history + 1);

    // Tokens: never a scope the writer lacks, never "every scope", never another's secret.
    let tokens = |extra: Value| {
        let mut list = vec![
            json!({"id": "admin", "secret": "[REDACTED]", "scopes": ["*"]}),
            json!({"id": "client", "secret": "[REDACTED]", "scopes": ["rpc"]}),
            json!({"id": "mcp", "secret": "[REDACTED]", "scopes": ["mcp-client"]}),
            json!({"id": "ops", "secret": "[REDACTED]", "scopes": ["admin"]}),
        ];
        list.push(extra);
        json!({"gateway": {"tokens": list}})
    };
    let secret = "new-token-secret-0123456789abcdefghijklmn";
    for (scopes, why) in [
        (json!([]), "empty scopes"),
        (json!(["*"]), "scope '*'"),
        (json!(["metrics"]), "scope 'metrics'"),
        (json!(["rpc", "api"]), "scope 'api'"),
    ] {
        let r = gw
            .call(
                ADMIN_ONLY,
                "config.patch",
                tokens(json!({"id": "x", "secret": secret, "scopes": scopes})),
            )
            .await;
        assert_eq!(code(&r), -32602, "{scopes}: {r}");
        let m = r["error"]["message"].as_str().unwrap();
        assert!(
            m.contains("gateway.tokens[4].scopes") && m.contains(why),
            "{m}"
        );
    }
    // Taking over the `*` token by giving it a secret the writer knows.
    let r = gw
        .call(
            ADMIN_ONLY,
            "config.patch",
            json!({"gateway": {"tokens": [
                {"id": "admin", "secret": secret, "scopes": ["*"]},
                {"id": "client", "secret": "[REDACTED]", "scopes": ["rpc"]},
                {"id": "mcp", "secret": "[REDACTED]", "scopes": ["mcp-client"]},
                {"id": "ops", "secret": "[REDACTED]", "scopes": ["admin"]}
            ]}}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    assert_eq!(
        history_len(&gw).await,
        history + 1,
        "a refused write left a commit"
    );
    // Within the writer's scopes it works (after the restart it asks for).
    let r = gw
        .call(
            ADMIN_ONLY,
            "config.patch",
            tokens(json!({"id": "x", "secret": secret, "scopes": ["rpc"]})),
        )
        .await;
    assert_eq!(ok(&r)["restarting"], true, "{r}");
    wait_generation(&gw, 2).await;
    let ping = gw.call(secret, "system.ping", json!({})).await;
    assert_eq!(ok(&ping)["pong"], true);
    let r = gw.call(secret, "config.read", json!({})).await;
    assert_eq!(code(&r), -32603, "{r}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_serves_nothing_outside_its_directory() {
    let outside = tempfile::tempdir().unwrap();
    let dist = outside.path().join("dist");
    std::fs::create_dir_all(&dist).unwrap();
    std::fs::write(dist.join("index.html"), "<!doctype html><title>app</title>").unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside-the-dashboard").unwrap();
    let gw = start(&format!("  web:\n    distDir: {}\n", dist.display())).await;
    let http = reqwest::Client::new();
    let get = |path: &str| {
        let url = gw.url(path);
        let http = http.clone();
        async move {
            let r = http.get(url).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (status, body) = get("/app/").await;
    assert_eq!(status, 200);
    assert!(body.contains("<title>app</title>"));
    for path in [
        "/app/../secret.txt",
        "/app/%2e%2e/secret.txt",
        "/app/..%2fsecret.txt",
        "/app/%2e%2e%2fsecret.txt",
        "/app/....//secret.txt",
        "/app//etc/passwd",
        "/app/%2fetc%2fpasswd",
    ] {
        let (status, body) = get(path).await;
        assert!(
            !body.contains("outside-the-dashboard") && !body.contains("root:"),
            "{path}: {status} {body}"
        );
    }
    // And the API cannot point it elsewhere.
    let r = gw
        .call(
            ADMIN_ONLY,
            "config.set",
            json!({"section": "gateway", "key": "web.distDir", "value": "/"}),
        )
        .await;
    refused_naming(&r, "gateway.web.distDir");
    let (_, body) = get("/app/etc/passwd").await;
    assert!(!body.contains("root:"), "{body}");
    gw.stop().await;
}

/// Polls `check` until it holds (up to 10 s); how long it took.
async fn eventually<F, Fut>(what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if check().await {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: not within 10 s"
        );
        // Slow enough for a node limited to 7 requests a second.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn read_only(gw: &Gateway) {
    use std::os::unix::fs::PermissionsExt;
    let path = gw.dir.path().join("gateway.yaml");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
}

const FLEET: &str = "  rateLimit: {windowMs: 60000, maxRequests: 1000}\n\
providers:\n  script:\n    type: scripted\n    models: [m1]\n    script:\n      - match: \"hello\"\n        steps:\n          - reply: \"Hello there.\"\n\
agents:\n  default: {model: script/m1, maxSteps: 2}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_write_applies_on_every_node_and_survives_restarts() {
    let url = crate::pg::database().await;
    let a = start_on(&url, FLEET).await;
    let b = start_on(&url, FLEET).await;
    read_only(&a);
    read_only(&b);
    let (file_a, file_b) = (file(&a), file(&b));

    // A live section and a restart section at once, written on node A.
    let r = a
        .call(
            ADMIN_ONLY,
            "config.patch",
            json!({"agents": {"added": {"model": "script/m1", "maxSteps": 3}},
                   "gateway": {"rateLimit": {"windowMs": 1000, "maxRequests": 7}}}),
        )
        .await;
    assert_eq!(ok(&r)["restarting"], true, "{r}");
    let took = eventually("node B applies A's write", || async {
        let r = b
            .call(ADMIN, "config.read", json!({"section": "gateway"}))
            .await;
        r["result"]["rateLimit"]["maxRequests"] == 7
    })
    .await;
    eprintln!("node B applied node A's configuration write in {took:?}");
    wait_generation(&b, 2).await;
    let agent = b
        .call(ADMIN, "agents.get", json!({"agentId": "added"}))
        .await;
    assert_eq!(ok(&agent)["maxSteps"], 3, "{agent}");
    let read = b
        .call(ADMIN, "config.read", json!({"section": "agents"}))
        .await;
    assert_eq!(ok(&read)["added"]["maxSteps"], 3, "{read}");
    // In effect on B: the eighth request of a one-second window is refused.
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..12 {
        let r = http
            .post(b.url("/rpc"))
            .bearer_auth(RPC)
            .header("content-type", "application/json")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"system.ping"}"#)
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // A live change alone is applied on B without a restart.
    let r = a
        .call(
            ADMIN_ONLY,
            "config.set",
            json!({"section": "agents", "key": "added.maxSteps", "value": 4}),
        )
        .await;
    assert_eq!(ok(&r)["restarting"], false, "{r}");
    eventually("node B reads the live change", || async {
        let r = b
            .call(ADMIN, "config.read", json!({"section": "agents"}))
            .await;
        r["result"]["added"]["maxSteps"] == 4
    })
    .await;
    let status = b.call(ADMIN, "gateway.status", json!({})).await;
    assert_eq!(ok(&status)["generation"], 2, "{status}");
    assert_eq!(file(&a), file_a, "the API wrote node A's file");
    assert_eq!(file(&b), file_b, "the API wrote node B's file");

    // Both nodes restarted (as processes): the change is still in force on each.
    let a = a.restart().await;
    let b = b.restart().await;
    for gw in [&a, &b] {
        let r = gw
            .call(ADMIN, "config.read", json!({"section": "agents"}))
            .await;
        assert_eq!(ok(&r)["added"]["maxSteps"], 4, "{r}");
        let r = gw
            .call(ADMIN, "config.read", json!({"section": "gateway"}))
            .await;
        assert_eq!(ok(&r)["rateLimit"]["maxRequests"], 7, "{r}");
    }

    // The operator edits node A's file between restarts: recorded, and it wins on every node.
    let path = a.dir.path().join("gateway.yaml");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let edited = file(&a).replace("maxSteps: 2", "maxSteps: 5");
    assert_ne!(edited, file(&a));
    std::fs::write(&path, edited).unwrap();
    let a = a.restart().await;
    let h = a.call(ADMIN, "config.history", json!({"limit": 5})).await;
    let newest = &ok(&h)["entries"][0];
    assert_eq!(
        newest["message"], "changed in the configuration file",
        "{h}"
    );
    let audit = a
        .call(ADMIN, "config.audit.list", json!({"suspiciousOnly": true}))
        .await;
    let last = ok(&audit)["records"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["origin"], "external", "{audit}");
    assert_eq!(last["paths"], json!(["agents.default.maxSteps"]), "{audit}");
    for gw in [&a, &b] {
        eventually("the file's edit is in force", || async {
            let r = gw
                .call(ADMIN, "agents.get", json!({"agentId": "default"}))
                .await;
            r["result"]["maxSteps"] == 5
        })
        .await;
    }
    // Only what the operator changed: the API's agent and rate limit stay.
    let r = a
        .call(ADMIN, "config.read", json!({"section": "agents"}))
        .await;
    assert_eq!(ok(&r)["added"]["maxSteps"], 4, "{r}");
    let r = b
        .call(ADMIN, "config.read", json!({"section": "gateway"}))
        .await;
    assert_eq!(ok(&r)["rateLimit"]["maxRequests"], 7, "{r}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_store_keeps_api_writes_across_restarts_with_a_read_only_file() {
    let gw = start("").await;
    read_only(&gw);
    let before = file(&gw);
    let r = gw
        .call(
            ADMIN_ONLY,
            "config.set",
            json!({"section": "agentDefaults", "key": "maxSteps", "value": 6}),
        )
        .await;
    assert_eq!(ok(&r)["restarting"], true, "{r}");
    wait_generation(&gw, 2).await;
    let gw = gw.restart().await;
    let r = gw
        .call(ADMIN, "config.read", json!({"section": "agentDefaults"}))
        .await;
    assert_eq!(ok(&r)["maxSteps"], 6, "{r}");
    assert_eq!(file(&gw), before);
    // An unchanged file at the next start records nothing.
    let h = gw.call(ADMIN, "config.history", json!({})).await;
    assert_eq!(ok(&h)["entries"].as_array().unwrap().len(), 2, "{h}");
    gw.stop().await;
}
