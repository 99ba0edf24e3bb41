//! End to end over /ws and /rpc on loopback: the JSON-RPC 2.0 section 7 examples, the spec's
//! error table, scopes and params table-driven over METHODS, and results against their schemas.

use crate::common::*;
use agent_gateway::api::generated::methods::{Scope, METHODS};
use serde_json::{json, Value};

/// Reduces a response to what the contract fixes: id plus result-or-code.
fn shape(v: &Value) -> Value {
    match v {
        Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
        Value::Object(o) => {
            assert_eq!(o["jsonrpc"], "2.0", "{v}");
            match o.get("error") {
                Some(e) => json!({"id": o["id"], "code": e["code"]}),
                None => json!({"id": o["id"], "result": true}),
            }
        }
        other => panic!("not a response: {other}"),
    }
}

/// (request text, expected shape; Null = no response at all)
fn section7_examples() -> Vec<(&'static str, Value)> {
    vec![
        // rpc call with positional parameters: unknown method first, then our by-name rule
        (
            r#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1}"#,
            json!({"id": 1, "code": -32601}),
        ),
        (
            r#"{"jsonrpc":"2.0","method":"system.ping","params":[42,23],"id":2}"#,
            json!({"id": 2, "code": -32602}),
        ),
        // named parameters
        (
            r#"{"jsonrpc":"2.0","method":"system.ping","params":{},"id":3}"#,
            json!({"id": 3, "result": true}),
        ),
        (
            r#"{"jsonrpc":"2.0","method":"system.ping","id":"abc"}"#,
            json!({"id": "abc", "result": true}),
        ),
        // notifications
        (
            r#"{"jsonrpc":"2.0","method":"update","params":[1,2,3,4,5]}"#,
            Value::Null,
        ),
        (r#"{"jsonrpc":"2.0","method":"system.ping"}"#, Value::Null),
        // non-existent method
        (
            r#"{"jsonrpc":"2.0","method":"foobar","id":"1"}"#,
            json!({"id": "1", "code": -32601}),
        ),
        // invalid JSON
        (
            r#"{"jsonrpc":"2.0","method":"foobar, "params":"bar", "baz]"#,
            json!({"id": null, "code": -32700}),
        ),
        // invalid request object
        (
            r#"{"jsonrpc":"2.0","method":1,"params":"bar"}"#,
            json!({"id": null, "code": -32600}),
        ),
        // batch, invalid JSON
        (
            r#"[{"jsonrpc":"2.0","method":"sum","params":[1,2,4],"id":"1"},{"jsonrpc":"2.0","method""#,
            json!({"id": null, "code": -32700}),
        ),
        // empty array
        ("[]", json!({"id": null, "code": -32600})),
        // invalid batch, but not empty
        ("[1]", json!([{"id": null, "code": -32600}])),
        (
            "[1,2,3]",
            json!([{"id": null, "code": -32600}, {"id": null, "code": -32600}, {"id": null, "code": -32600}]),
        ),
        // mixed batch: answers in request order, notifications omitted
        (
            r#"[{"jsonrpc":"2.0","method":"system.ping","id":"1"},{"jsonrpc":"2.0","method":"notify_hello","params":[7]},{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":"2"},{"foo":"boo"},{"jsonrpc":"2.0","method":"foo.get","params":{"name":"myself"},"id":"5"},{"jsonrpc":"2.0","method":"get_data","id":"9"}]"#,
            json!([{"id": "1", "result": true}, {"id": "2", "code": -32601}, {"id": null, "code": -32600}, {"id": "5", "code": -32601}, {"id": "9", "code": -32601}]),
        ),
        // all notifications: nothing at all
        (
            r#"[{"jsonrpc":"2.0","method":"notify_sum","params":[1,2,4]},{"jsonrpc":"2.0","method":"notify_hello","params":[7]}]"#,
            Value::Null,
        ),
        // DESIGN section 7: id and params rules
        (
            r#"{"jsonrpc":"2.0","method":"system.ping","id":1.5}"#,
            json!({"id": null, "code": -32600}),
        ),
        (
            r#"{"jsonrpc":"2.0","method":"system.ping","id":null}"#,
            json!({"id": null, "code": -32600}),
        ),
        (
            r#"{"jsonrpc":"2.0","method":"system.ping","id":{"a":1}}"#,
            json!({"id": null, "code": -32600}),
        ),
        (
            r#"{"jsonrpc":"2.0","method":"system.ping","params":"x","id":7}"#,
            json!({"id": 7, "code": -32600}),
        ),
        (
            r#"{"jsonrpc":"1.0","method":"system.ping","id":8}"#,
            json!({"id": 8, "code": -32600}),
        ),
        (
            r#"{"jsonrpc":"2.0","method":"system.ping","params":[],"id":[1]}"#,
            json!({"id": null, "code": -32600}),
        ),
        (
            r#"[{"jsonrpc":"2.0","method":"system.ping","id":1}]"#,
            json!([{"id": 1, "result": true}]),
        ),
        ("42", json!({"id": null, "code": -32600})),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsonrpc_section7_examples_over_http() {
    let gw = start("  rateLimit: {windowMs: 60000, maxRequests: 10000}\n").await;
    for (req, want) in section7_examples() {
        let (status, body) = gw.post_rpc(RPC, req).await;
        if want.is_null() {
            assert_eq!((status, body.as_str()), (204, ""), "{req}");
        } else {
            assert_eq!(status, 200, "{req}");
            assert_eq!(
                shape(&serde_json::from_str(&body).unwrap()),
                want,
                "{req} -> {body}"
            );
        }
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsonrpc_section7_examples_over_websocket() {
    let gw = start("  wsMessageRateLimit: {maxMessages: 1000, windowMs: 60000}\n").await;
    let mut ws = gw.ws(RPC).await;
    for (req, want) in section7_examples() {
        send(&mut ws, req).await;
        if want.is_null() {
            silent(&mut ws, std::time::Duration::from_millis(150)).await;
        } else {
            let got = recv(&mut ws).await;
            assert_eq!(shape(&got), want, "{req} -> {got}");
        }
    }
    gw.stop().await;
}

fn dispatchable(
) -> impl Iterator<Item = &'static agent_gateway::api::generated::methods::MethodInfo> {
    METHODS.iter().filter(|m| !m.internal)
}

/// Sends calls as HTTP batches of at most 50; returns responses in order.
async fn batch_calls(gw: &Gateway, token: &str, calls: &[(String, Value)]) -> Vec<Value> {
    let mut out = Vec::new();
    for (n, chunk) in calls.chunks(50).enumerate() {
        let reqs: Vec<Value> = chunk
            .iter()
            .enumerate()
            .map(
                |(i, (m, p))| json!({"jsonrpc": "2.0", "id": n * 50 + i, "method": m, "params": p}),
            )
            .collect();
        let (status, body) = gw.post_rpc(token, &Value::Array(reqs).to_string()).await;
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        out.extend(v.as_array().unwrap().iter().cloned());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_method_refuses_an_rpc_token_before_params_and_handler() {
    let gw = start("  rateLimit: {windowMs: 60000, maxRequests: 10000}\n").await;
    let admin: Vec<_> = dispatchable().filter(|m| m.scope == Scope::Admin).collect();
    assert!(admin.len() > 50);
    // Garbage params: the scope answer must come before any params check.
    let calls: Vec<(String, Value)> = admin
        .iter()
        .map(|m| (m.name.to_owned(), json!({"bogus": [1, 2]})))
        .collect();
    for (m, r) in admin.iter().zip(batch_calls(&gw, RPC, &calls).await) {
        assert_eq!(code(&r), -32603, "{}: {r}", m.name);
        assert_eq!(
            r["error"]["message"], "Insufficient scope: requires 'admin'",
            "{}",
            m.name
        );
    }
    // The restart handler did not run: still the first generation.
    let status = gw.call(ADMIN, "gateway.status", json!({})).await;
    assert_eq!(status["result"]["generation"], 1);
    // mcp-client grants no method; admin includes rpc.
    let rpc_methods: Vec<(String, Value)> = dispatchable()
        .filter(|m| m.scope == Scope::Rpc)
        .map(|m| (m.name.to_owned(), json!({})))
        .collect();
    for r in batch_calls(&gw, MCP, &rpc_methods).await {
        assert_eq!(
            r["error"]["message"], "Insufficient scope: requires 'rpc'",
            "{r}"
        );
    }
    assert_eq!(
        gw.call(ADMIN_ONLY, "system.ping", json!({})).await["result"]["pong"],
        true
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn params_that_violate_the_schema_get_invalid_params_for_every_method() {
    let gw = start("  rateLimit: {windowMs: 60000, maxRequests: 10000}\n").await;
    let mut calls = Vec::new();
    let mut names = Vec::new();
    for m in dispatchable() {
        let schema: Value = serde_json::from_str(m.params_schema).unwrap();
        let required = schema["required"].as_array().map_or(0, Vec::len);
        let bad = if required > 0 {
            json!({})
        } else if schema["additionalProperties"] == false {
            json!({"definitelyNotAParam": 1})
        } else {
            // Open params (the configuration itself): nothing can violate their schema.
            assert!(
                ["config.apply", "config.patch"].contains(&m.name),
                "{}",
                m.name
            );
            continue;
        };
        names.push(m.name);
        calls.push((m.name.to_owned(), bad));
    }
    for (name, r) in names.iter().zip(batch_calls(&gw, ADMIN, &calls).await) {
        assert_eq!(code(&r), -32602, "{name}: {r}");
        assert!(r["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Invalid params: "));
    }
    // The message names the offending member.
    let r = gw
        .call(ADMIN, "session.delete", json!({"key": "abc"}))
        .await;
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("session_key") && msg.contains("'key' was unexpected"),
        "{msg}"
    );
    let r = gw.call(ADMIN, "config.read", json!({"section": 5})).await;
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'section'"),
        "{r}"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn implemented_methods_answer_what_their_result_schemas_say() {
    let gw = start("").await;
    for (method, params) in [
        ("system.ping", json!({})),
        ("gateway.status", json!({})),
        ("config.read", json!({})),
        ("config.read", json!({"section": "gateway"})),
        ("config.get", json!({})),
        ("config.get", json!({"section": "gateway"})),
        ("config.schema", json!({})),
        ("config.schema", json!({"section": "gateway"})),
    ] {
        let r = gw.call(ADMIN, method, params.clone()).await;
        let result = r
            .get("result")
            .unwrap_or_else(|| panic!("{method} {params}: {r}"));
        validate_result(method, result);
    }
    // Redaction: read hides secrets, get of the section shows them (admin only).
    let read = gw
        .call(ADMIN, "config.read", json!({"section": "gateway"}))
        .await;
    assert_eq!(read["result"]["tokens"][0]["secret"], "[REDACTED]");
    assert!(!read.to_string().contains(ADMIN));
    let whole = gw.call(ADMIN, "config.get", json!({})).await;
    assert!(!whole.to_string().contains(ADMIN));
    assert_eq!(
        whole["result"]["sections"],
        json!(agent_gateway::config::sections())
    );
    let raw = gw
        .call(ADMIN, "config.get", json!({"section": "gateway"}))
        .await;
    assert_eq!(raw["result"]["tokens"][0]["secret"], ADMIN);
    // config.schema describes the configuration and validates it.
    let schema = gw
        .call(ADMIN, "config.schema", json!({"section": "gateway"}))
        .await;
    let v = jsonschema::validator_for(&schema["result"]["schema"]).unwrap();
    assert!(v.is_valid(&raw["result"]));
    assert!(!v.is_valid(&json!({"port": "not a number"})));
    let unknown = gw
        .call(ADMIN, "config.read", json!({"section": "nope"}))
        .await;
    assert_eq!(code(&unknown), -32001);
    // Stubs validate params, then answer -32004; internal methods do not exist here.
    let stub = gw.call(ADMIN, "browser.console", json!({})).await;
    assert_eq!(
        stub["error"],
        json!({"code": -32004, "message": "Not implemented: browser.console"})
    );
    assert_eq!(code(&gw.call(RPC, "skills.list", json!({})).await), -32004);
    assert_eq!(
        code(&gw.call(ADMIN, "tool.invoke", json!({})).await),
        -32601
    );
    // Restart last: its answer validates too.
    let r = gw.call(ADMIN, "gateway.restart", json!({})).await;
    validate_result("gateway.restart", &r["result"]);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_size_at_the_limit_and_one_past_it() {
    let gw = start("  maxBatchSize: 3\n").await;
    let batch = |n: usize| {
        let items: Vec<Value> = (0..n)
            .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "system.ping"}))
            .collect();
        Value::Array(items).to_string()
    };
    let (_, body) = gw.post_rpc(RPC, &batch(3)).await;
    assert_eq!(
        serde_json::from_str::<Value>(&body)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        3
    );
    let (_, body) = gw.post_rpc(RPC, &batch(4)).await;
    assert_eq!(
        shape(&serde_json::from_str(&body).unwrap()),
        json!({"id": null, "code": -32600})
    );
    let mut ws = gw.ws(RPC).await;
    send(&mut ws, &batch(3)).await;
    assert_eq!(recv(&mut ws).await.as_array().unwrap().len(), 3);
    send(&mut ws, &batch(4)).await;
    assert_eq!(
        shape(&recv(&mut ws).await),
        json!({"id": null, "code": -32600})
    );
    gw.stop().await;
}
