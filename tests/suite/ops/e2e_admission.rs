//! Limits per caller on loopback: the concurrent-turn caps (per client id and global) on every
//! surface, batch items counted against the HTTP and WebSocket rate limits, and the rate
//! limit's client address behind trusted proxies.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

/// "slow" turns wait (cancellable) long enough to be counted; everything else answers at once.
const SCRIPT: &str = r#"
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "slow"
        steps:
          - reply: "Finally."
            delayMs: 60000
      - steps:
          - reply: "Fast."
agents:
  bot: {model: script/m1}
"#;

async fn gateway(limits: &str) -> Gateway {
    start(&format!("  shutdownGraceMs: 300\n{limits}{SCRIPT}")).await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(STEP).build().unwrap()
}

fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("no error: {v}"))
}

/// Starts a slow `agent.execute` of `token` in the background (its client waits up to 120 s).
fn slow_turn(gw: &Gateway, token: &'static str) -> tokio::task::JoinHandle<()> {
    let url = gw.url("/rpc");
    tokio::spawn(async move {
        let _ = reqwest::Client::new()
            .post(url)
            .bearer_auth(token)
            .timeout(Duration::from_secs(120))
            .json(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "agent.execute",
                          "params": {"message": "slow", "agentId": "bot"}}),
            )
            .send()
            .await;
    })
}

/// Waits until `client` holds `n` turns and the gateway `total`.
async fn running(gw: &Gateway, client: &str, total: u32, n: u32) {
    tokio::time::timeout(STEP, async {
        while gw.running.control.admission.running(client) != (total, n) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{client}: expected ({total}, {n}), got {:?}",
            gw.running.control.admission.running(client)
        )
    });
}

async fn execute(gw: &Gateway, token: &str, message: &str) -> Value {
    gw.call(
        token,
        "agent.execute",
        json!({"message": message, "agentId": "bot"}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_client_cap_at_the_limit_and_one_past_it_on_every_surface() {
    let gw = gateway("  limits: {maxConcurrentTurnsPerClient: 2, maxConcurrentTurns: 10}\n").await;
    // At the limit: one turn and one background run (whose own turn is not counted twice).
    let turn = slow_turn(&gw, RPC);
    let spawned = gw
        .call(
            RPC,
            "session.spawn",
            json!({"task": "slow job", "agent": "bot", "async": true}),
        )
        .await;
    assert_eq!(spawned["result"]["status"], "running", "{spawned}");
    running(&gw, "client", 2, 2).await;

    // One past it, on every surface: JSON-RPC -32003 naming the limit...
    let refused = execute(&gw, RPC, "hello").await;
    assert_eq!(code(&refused), -32003);
    let msg = refused["error"]["message"].as_str().unwrap();
    assert!(msg.contains("maxConcurrentTurnsPerClient"), "{msg}");
    assert!(msg.contains("at most 2"), "{msg}");
    let run = gw
        .call(
            RPC,
            "session.spawn",
            json!({"task": "another", "agent": "bot", "async": true}),
        )
        .await;
    assert_eq!(code(&run), -32003, "{run}");
    // ... /v1 429 rate_limit_error (streaming or not) ...
    for stream in [false, true] {
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(RPC)
            .json(&json!({"model": "bot", "stream": stream,
                          "messages": [{"role": "user", "content": "hello"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429, "stream {stream}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maxConcurrentTurnsPerClient"));
    }
    // ... REST 429.
    let r = client()
        .post(gw.url("/api/chat"))
        .bearer_auth(RPC)
        .json(&json!({"message": "hello", "agentId": "bot"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]
        .as_str()
        .unwrap()
        .contains("maxConcurrentTurnsPerClient"));

    // Refusals hold nothing; another client is not affected.
    running(&gw, "client", 2, 2).await;
    let other = execute(&gw, ADMIN, "hello").await;
    assert_eq!(other["result"]["response"], "Fast.", "{other}");

    // The turn's client goes away: its permit is released and the client may run again.
    turn.abort();
    running(&gw, "client", 1, 1).await;
    let again = execute(&gw, RPC, "hello").await;
    assert_eq!(again["result"]["response"], "Fast.", "{again}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_cap_refuses_every_client_once_reached() {
    let gw = gateway("  limits: {maxConcurrentTurnsPerClient: 5, maxConcurrentTurns: 2}\n").await;
    let a = slow_turn(&gw, RPC);
    let b = slow_turn(&gw, ADMIN);
    running(&gw, "admin", 2, 1).await;
    for token in [RPC, ADMIN, ADMIN_ONLY] {
        let refused = execute(&gw, token, "hello").await;
        assert_eq!(code(&refused), -32003);
        let msg = refused["error"]["message"].as_str().unwrap();
        assert!(msg.contains("(gateway.limits.maxConcurrentTurns)"), "{msg}");
    }
    a.abort();
    running(&gw, "client", 1, 0).await;
    let ok = execute(&gw, ADMIN_ONLY, "hello").await;
    assert_eq!(ok["result"]["response"], "Fast.", "{ok}");
    b.abort();
    gw.stop().await;
}

fn pings(n: usize) -> String {
    let items: Vec<Value> = (0..n)
        .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "system.ping"}))
        .collect();
    Value::Array(items).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_rpc_counts_each_item_against_the_http_rate_limit() {
    let gw = start("  rateLimit: {windowMs: 600000, maxRequests: 5}\n").await;
    // Past the limit: 6 items against 5 are refused whole (429, the usual body, Retry-After);
    // only the request itself was counted.
    let r = client()
        .post(gw.url("/rpc"))
        .bearer_auth(RPC)
        .body(pings(6))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "Too many requests"})
    );
    // At the limit: 1 already counted + 4 items = 5.
    let (status, body) = gw.post_rpc(RPC, &pings(4)).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        4
    );
    let (status, _) = gw.post_rpc(RPC, &pings(1)).await;
    assert_eq!(status, 429, "the budget is spent");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_ws_counts_each_item_against_the_connection_window() {
    let gw = start("  wsMessageRateLimit: {maxMessages: 5, windowMs: 600000}\n").await;
    let limited = json!({"jsonrpc": "2.0", "error": {"code": -32000, "message": "Rate limit exceeded"}, "id": null});
    let mut ws = gw.ws(RPC).await;
    // Past the limit: refused whole, nothing counted.
    send(&mut ws, &pings(6)).await;
    assert_eq!(recv(&mut ws).await, limited);
    // At the limit.
    send(&mut ws, &pings(5)).await;
    assert_eq!(recv(&mut ws).await.as_array().unwrap().len(), 5);
    send(&mut ws, &pings(1)).await;
    assert_eq!(recv(&mut ws).await, limited);
    // A single call after a batch of 4 on a fresh connection: 4 + 1 = 5 fits, then no more.
    let mut ws = gw.ws(RPC).await;
    send(&mut ws, &pings(4)).await;
    assert_eq!(recv(&mut ws).await.as_array().unwrap().len(), 4);
    send(
        &mut ws,
        r#"{"jsonrpc":"2.0","id":9,"method":"system.ping"}"#,
    )
    .await;
    assert_eq!(recv(&mut ws).await["id"], 9);
    send(
        &mut ws,
        r#"{"jsonrpc":"2.0","id":10,"method":"system.ping"}"#,
    )
    .await;
    assert_eq!(recv(&mut ws).await, limited);
    gw.stop().await;
}

async fn agents_status(gw: &Gateway, header: Option<(&str, &str)>) -> u16 {
    let mut req = client().get(gw.url("/api/agents")).bearer_auth(RPC);
    if let Some((k, v)) = header {
        req = req.header(k, v);
    }
    req.send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_from_an_untrusted_peer_change_nothing() {
    let gw = start("  rateLimit: {windowMs: 600000, maxRequests: 2}\n").await;
    let spoofed = ["198.51.100.1", "198.51.100.2", "198.51.100.3"];
    assert_eq!(
        agents_status(&gw, Some(("x-forwarded-for", spoofed[0]))).await,
        200
    );
    assert_eq!(
        agents_status(&gw, Some(("forwarded", "for=198.51.100.2"))).await,
        200
    );
    // Every request came from 127.0.0.1, whatever the headers claim.
    assert_eq!(
        agents_status(&gw, Some(("x-forwarded-for", spoofed[2]))).await,
        429
    );
    assert_eq!(agents_status(&gw, None).await, 429);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_from_a_trusted_proxy_separate_clients() {
    let gw = start(
        "  rateLimit: {windowMs: 600000, maxRequests: 2}\n  trustedProxies: [127.0.0.0/8, '::1']\n",
    )
    .await;
    let one = ("x-forwarded-for", "198.51.100.1");
    assert_eq!(agents_status(&gw, Some(one)).await, 200);
    assert_eq!(
        agents_status(&gw, Some(("forwarded", r#"for="198.51.100.1:4711""#))).await,
        200
    );
    assert_eq!(
        agents_status(&gw, Some(one)).await,
        429,
        "client one is spent"
    );
    // Another client behind the same proxy has its own budget...
    let two = ("x-forwarded-for", "203.0.113.9, 198.51.100.2");
    assert_eq!(agents_status(&gw, Some(two)).await, 200);
    // ... and so has another address of an IPv6 client's /64, shared by the whole /64.
    let v6a = ("forwarded", r#"for="[2001:db8:1:2::a]""#);
    let v6b = ("forwarded", r#"for="[2001:db8:1:2::b]""#);
    assert_eq!(agents_status(&gw, Some(v6a)).await, 200);
    assert_eq!(agents_status(&gw, Some(v6b)).await, 200);
    assert_eq!(agents_status(&gw, Some(v6a)).await, 429);
    // The proxy's own requests (no header) are keyed on the proxy.
    assert_eq!(agents_status(&gw, None).await, 200);
    gw.stop().await;
}
