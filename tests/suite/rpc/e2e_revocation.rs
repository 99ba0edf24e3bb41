//! Revoking, rotating or expiring an API token ends every open connection of it within a
//! second: its WebSockets close with 4001 and its SSE streams (`/api/events`,
//! `/api/chat/stream`, a streamed `/v1/chat/completions`) end, on every node sharing the
//! database; other tokens' connections stay. And events caused by unauthenticated webhook
//! requests (`audit:event` of a refused signature) or naming webhook deliveries
//! (`webhook:received`) reach operators only.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::common::*;

/// What the gateway promises: a connection ends within a second of its token's end.
const WITHIN: Duration = Duration::from_millis(1000);
/// Scheduling slack on a loaded two-core machine (the test and the gateway share it).
const SLACK: Duration = Duration::from_millis(400);

const HOOK_TOKEN: &str = "hook-token-0123456789abcdefghijklmnopqrstuv";

/// `slow` keeps a streamed turn open: a first delta, then a step that waits 30 s.
fn config() -> String {
    format!(
        r#"  rateLimit: {{windowMs: 60000, maxRequests: 100000}}
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "slow"
        steps:
          - reply: "Let me look. "
            toolCalls: [{{name: current_time}}]
          - reply: "Done."
            delayMs: 30000
agents:
  default: {{model: script/m1, maxSteps: 2}}
webhooks:
  enabled: true
  token: {HOOK_TOKEN}
  hmac:
    headerName: x-hub-signature-256
  mappings:
    - id: echo
      match: {{path: echo}}
      sessionKey: "{{{{payload.id}}}}"
      messageTemplate: "hello {{{{payload.name}}}}"
"#
    )
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// No overall timeout: streams stay open as long as the test wants; every read is bounded.
fn client() -> reqwest::Client {
    reqwest::Client::new()
}

/// A new API token with scope `rpc`: (id, secret).
async fn token(gw: &Gateway, expires_at: Option<i64>) -> (String, String) {
    let mut params = json!({"scopes": ["rpc"]});
    if let Some(at) = expires_at {
        params["expiresAt"] = json!(at);
    }
    let r = ok(gw, ADMIN, "tokens.create", params).await;
    (
        r["id"].as_str().unwrap().to_owned(),
        r["secret"].as_str().unwrap().to_owned(),
    )
}

/// The next chunk of `resp`, bounded by [`STEP`].
async fn chunk(resp: &mut reqwest::Response) -> String {
    let c = tokio::time::timeout(STEP, resp.chunk())
        .await
        .expect("no chunk in time")
        .unwrap()
        .expect("the stream ended");
    String::from_utf8_lossy(&c).into_owned()
}

/// `/api/events` of `secret`, its opening read.
async fn events(gw: &Gateway, secret: &str) -> reqwest::Response {
    let mut r = client()
        .get(gw.url("/api/events"))
        .bearer_auth(secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(chunk(&mut r).await.starts_with("retry: 3000"));
    r
}

/// A streamed turn answering `slow`, its first delta read (the turn is now waiting).
async fn turn_stream(gw: &Gateway, secret: &str, v1: bool) -> reqwest::Response {
    let req = if v1 {
        client().post(gw.url("/v1/chat/completions")).json(&json!({
            "model": "default", "stream": true,
            "messages": [{"role": "user", "content": "slow"}]
        }))
    } else {
        client().get(gw.url("/api/chat/stream?message=slow"))
    };
    let mut r = req.bearer_auth(secret).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut seen = String::new();
    while !seen.contains("look. ") {
        match tokio::time::timeout(STEP, r.chunk()).await {
            Ok(Ok(Some(c))) => seen.push_str(&String::from_utf8_lossy(&c)),
            other => panic!("no first delta (v1: {v1}): {other:?}; read {seen:?}"),
        }
    }
    r
}

/// The rest of `resp` until it ends, and when it ended (epoch ms); fails if still open at `by`.
async fn ends(mut resp: reqwest::Response, by: Instant) -> (String, i64) {
    let mut text = String::new();
    loop {
        match tokio::time::timeout_at(by, resp.chunk()).await {
            Err(_) => panic!("stream still open at its deadline; read so far: {text:?}"),
            Ok(Ok(Some(c))) => text.push_str(&String::from_utf8_lossy(&c)),
            Ok(Ok(None)) => return (text, now_ms()),
            Ok(Err(e)) => panic!("stream failed instead of ending: {e}"),
        }
    }
}

/// The close of `ws` (code, reason) and when it came; fails if still open at `by`.
async fn ws_ends(mut ws: Ws, by: Instant) -> ((u16, String), i64) {
    let close = tokio::time::timeout_at(by, closed(&mut ws))
        .await
        .expect("websocket still open at its deadline");
    (close, now_ms())
}

/// One connection of each kind of a token.
struct Open {
    ws: Ws,
    events: reqwest::Response,
    chat: reqwest::Response,
    v1: reqwest::Response,
}

async fn open_all(gw: &Gateway, secret: &str) -> Open {
    let mut ws = gw.ws(secret).await;
    assert_ping(&mut ws, 1).await;
    Open {
        ws,
        events: events(gw, secret).await,
        chat: turn_stream(gw, secret, false).await,
        v1: turn_stream(gw, secret, true).await,
    }
}

/// Waits for every connection of `open` to end by `by`: the WebSocket with 4001 and
/// `ws_reason`, each stream after a comment `: <sse_reason>` (and no normal ending); the
/// earliest end (epoch ms).
async fn all_end(open: Open, by: Instant, ws_reason: &str, sse_reason: &str) -> i64 {
    let (ws, events, chat, v1) = tokio::join!(
        ws_ends(open.ws, by),
        ends(open.events, by),
        ends(open.chat, by),
        ends(open.v1, by)
    );
    assert_eq!(ws.0, (4001, ws_reason.to_owned()));
    let last_words = format!(": {sse_reason}\n\n");
    for (what, (text, _)) in [("events", &events), ("chat", &chat), ("v1", &v1)] {
        assert!(text.ends_with(&last_words), "{what}: {text:?}");
    }
    assert!(!chat.0.contains("event: done"), "{:?}", chat.0);
    assert!(!v1.0.contains("[DONE]"), "{:?}", v1.0);
    [ws.1, events.1, chat.1, v1.1].into_iter().min().unwrap()
}

/// Another token's connections are untouched: its WebSocket answers, its stream is open.
async fn still_open(ws: &mut Ws, events: &mut reqwest::Response) {
    assert_ping(ws, 9).await;
    let read = tokio::time::timeout(Duration::from_millis(200), events.chunk()).await;
    assert!(
        read.is_err() || matches!(read, Ok(Ok(Some(_)))),
        "the other token's stream ended: {read:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_token_ends_its_websockets_and_streams_within_a_second() {
    let gw = start(&config()).await;
    let (id, secret) = token(&gw, None).await;
    let (_, other) = token(&gw, None).await;
    let open = open_all(&gw, &secret).await;
    let mut other_ws = gw.ws(&other).await;
    let mut other_events = events(&gw, &other).await;
    assert_eq!(gw.running.control.hub.streams(), 4);

    let asked = Instant::now();
    let r = ok(&gw, ADMIN, "tokens.revoke", json!({"id": id})).await;
    assert_eq!(r["revoked"], true);
    all_end(
        open,
        asked + WITHIN + SLACK,
        "Token revoked",
        "token revoked",
    )
    .await;

    still_open(&mut other_ws, &mut other_events).await;
    let mut again = gw.ws(&secret).await;
    assert_eq!(closed(&mut again).await, (4001, "Unauthorized".to_owned()));
    let r = client()
        .get(gw.url("/api/events"))
        .bearer_auth(&secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    drop(other_events);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_a_token_ends_the_old_secrets_connections_and_keeps_the_new_ones() {
    let gw = start(&config()).await;
    let (id, secret) = token(&gw, None).await;
    let open = open_all(&gw, &secret).await;

    let asked = Instant::now();
    let r = ok(&gw, ADMIN, "tokens.rotate", json!({"id": id})).await;
    let fresh = r["newSecret"].as_str().unwrap().to_owned();
    all_end(
        open,
        asked + WITHIN + SLACK,
        "Token revoked",
        "token revoked",
    )
    .await;

    // The new secret of the same client id connects, and stays connected.
    let mut ws = gw.ws(&fresh).await;
    let mut stream = events(&gw, &fresh).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    still_open(&mut ws, &mut stream).await;
    drop(stream);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_token_loses_its_connections_within_a_second_of_expires_at() {
    let gw = start(&config()).await;
    // Far enough ahead to open everything first; the streams are read while it expires.
    let at = now_ms() + 3_000;
    let (_, secret) = token(&gw, Some(at)).await;
    let (_, other) = token(&gw, Some(now_ms() + 600_000)).await;
    let open = open_all(&gw, &secret).await;
    let mut other_ws = gw.ws(&other).await;
    let mut other_events = events(&gw, &other).await;
    assert!(now_ms() < at - 500, "the connections took too long to open");

    let by = Instant::now() + Duration::from_millis((at - now_ms()) as u64) + WITHIN + SLACK;
    let first = all_end(open, by, "Token expired", "token expired").await;
    assert!(first >= at, "ended {} ms before expiresAt", at - first);

    still_open(&mut other_ws, &mut other_events).await;
    drop(other_events);
    gw.stop().await;
}

/// `check` until it holds, for at most [`STEP`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + STEP;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not in time");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_on_one_node_ends_the_tokens_connections_on_another() {
    let url = crate::pg::database().await;
    let a = start_on(&url, &config()).await;
    let b = start_on(&url, &config()).await;
    let (id, secret) = token(&a, None).await;
    eventually("node B knows the new token", || async {
        client()
            .get(b.url("/api/agents"))
            .bearer_auth(&secret)
            .send()
            .await
            .unwrap()
            .status()
            == 200
    })
    .await;
    let mut ws = b.ws(&secret).await;
    assert_ping(&mut ws, 1).await;
    let stream = events(&b, &secret).await;
    let chat = turn_stream(&b, &secret, false).await;

    let asked = Instant::now();
    ok(&a, ADMIN, "tokens.revoke", json!({"id": id})).await;
    let by = asked + WITHIN + SLACK;
    let (close, (text, _), (chat, _)) =
        tokio::join!(ws_ends(ws, by), ends(stream, by), ends(chat, by));
    assert_eq!(close.0, (4001, "Token revoked".to_owned()));
    assert!(text.ends_with(": token revoked\n\n"), "{text:?}");
    assert!(chat.ends_with(": token revoked\n\n"), "{chat:?}");
    b.stop().await;
    a.stop().await;
}

fn sign(body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(HOOK_TOKEN.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

async fn hook(gw: &Gateway, body: &[u8], signature: Option<&str>) -> u16 {
    let mut req = client()
        .post(gw.url("/hooks/echo"))
        .header("content-type", "application/json")
        .body(body.to_vec());
    if let Some(s) = signature {
        req = req.header("x-hub-signature-256", s);
    }
    req.send().await.unwrap().status().as_u16()
}

/// What `resp` sends until the marker event; bounded by [`STEP`].
async fn until_marker(resp: &mut reqwest::Response) -> String {
    let mut text = String::new();
    while !text.contains("\"marker\":true") {
        text.push_str(&chunk(resp).await);
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_events_reach_operators_only() {
    let gw = start(&config()).await;
    let mut tenant = events(&gw, RPC).await;
    let mut operator = events(&gw, ADMIN).await;
    let mut tenant_ws = gw.ws(RPC).await;
    assert_ping(&mut tenant_ws, 1).await;

    let body = br#"{"name":"Bo","id":"k1"}"#;
    assert_eq!(hook(&gw, body, None).await, 401, "unsigned");
    assert_eq!(
        hook(&gw, body, Some("sha256=00ff")).await,
        401,
        "badly signed"
    );
    let forged = sign(br#"{"name":"Eve","id":"k1"}"#);
    assert_eq!(
        hook(&gw, body, Some(&forged)).await,
        401,
        "signed for another body"
    );
    assert_eq!(hook(&gw, body, Some(&sign(body))).await, 200, "signed");
    // Everything above is published before this marker, which every subscriber may see.
    gw.running
        .control
        .events
        .publish("system:error", json!({"marker": true}));

    let seen = until_marker(&mut operator).await;
    assert_eq!(seen.matches("webhook.rejected").count(), 3, "{seen}");
    assert!(seen.contains("event: audit:event\n"), "{seen}");
    assert!(seen.contains("event: webhook:received\n"), "{seen}");

    let seen = until_marker(&mut tenant).await;
    for hidden in [
        "audit:event",
        "webhook.rejected",
        "webhook:received",
        "webhook:echo",
    ] {
        assert!(!seen.contains(hidden), "{hidden} reached a tenant: {seen}");
    }
    let activity: Value = client()
        .get(gw.url("/api/activity?limit=100"))
        .bearer_auth(RPC)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let activity = activity.to_string();
    assert!(activity.contains("\"marker\":true"), "{activity}");
    for hidden in ["audit:event", "webhook:received"] {
        assert!(!activity.contains(hidden), "{hidden}: {activity}");
    }
    // Nothing of it is pushed to a tenant's WebSocket either.
    while let Ok(Some(Ok(msg))) =
        tokio::time::timeout(Duration::from_millis(300), tenant_ws.next()).await
    {
        if let Message::Text(t) = msg {
            assert!(t.contains("\"heartbeat\""), "pushed to a tenant: {t}");
        }
    }
    drop((tenant, operator));
    gw.stop().await;
}
