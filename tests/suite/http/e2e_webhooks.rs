//! Webhooks on loopback: every row of the spec's webhook response table on the strict and the
//! mapped endpoints, the signature and timestamp window at the edge and one past it, replays,
//! routing and presets, agent runs landing in their namespaced session (marked untrusted),
//! heartbeat wakes, and the body limit (also chunked).

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::common::*;

const HOOK_TOKEN: &str = "hook-token-0123456789abcdefghijklmnopqrstuv";
const STRICT_SECRET: &str = "strict-secret-0123456789abcdefghijklmnopqrs";

const SCRIPT: &str = r#"
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "hello"
        steps:
          - reply: "Hello there, friend."
      - match: "Heartbeat"
        steps:
          - reply: "HEARTBEAT_OK"
agents:
  default: {model: script/m1, maxSteps: 2}
"#;

fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

struct Sent {
    status: u16,
    body: Value,
}

async fn post_raw(gw: &Gateway, path: &str, headers: &[(&str, String)], body: Vec<u8>) -> Sent {
    let mut req = reqwest::Client::builder()
        .timeout(STEP)
        .build()
        .unwrap()
        .post(gw.url(path))
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, v.as_str());
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    Sent {
        status,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

async fn history(gw: &Gateway, key: &str, want: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let h = gw
            .call(ADMIN, "session.history", json!({"session_key": key}))
            .await;
        let msgs = h["result"]["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if msgs.len() >= want || tokio::time::Instant::now() > deadline {
            return msgs;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn texts(msgs: &[Value]) -> Vec<String> {
    msgs.iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn strict_endpoint_answers_every_row_of_the_table() {
    let gw = start(&format!(
        "  httpBodyLimitBytes: 4096\nwebhooks:\n  enabled: true\n  hmac:\n    secret: {STRICT_SECRET}\n    maxAgeSec: 300\n{SCRIPT}"
    ))
    .await;
    let sig = |b: &[u8]| vec![("x-webhook-signature", sign(STRICT_SECRET, b))];
    let good = br#"{"event":"build.finished","source":"ci","data":{"ok":true},"timestamp":"2026-01-31T12:00:00Z"}"#.to_vec();

    let r = post_raw(&gw, "/hooks/webhook", &sig(&good), good.clone()).await;
    assert_eq!((r.status, r.body.clone()), (200, json!({"received": true})));
    // Missing, wrong, malformed, other algorithm, other length.
    let r = post_raw(&gw, "/hooks/webhook", &[], good.clone()).await;
    assert_eq!(r.status, 401);
    assert!(r.body["error"].as_str().is_some());
    let mut wrong = sign(STRICT_SECRET, &good);
    wrong.replace_range(0..1, if wrong.starts_with('0') { "1" } else { "0" });
    for bad in [
        wrong,
        "zz".repeat(32),
        format!("sha1={}", sign(STRICT_SECRET, &good)),
        sign(STRICT_SECRET, &good)[..40].to_owned(),
        format!("{}00", sign(STRICT_SECRET, &good)),
    ] {
        let r = post_raw(
            &gw,
            "/hooks/webhook",
            &[("x-webhook-signature", bad.clone())],
            good.clone(),
        )
        .await;
        assert_eq!(r.status, 401, "{bad}");
    }
    // GitHub's prefix and upper-case hex are accepted.
    let prefixed = format!("sha256={}", sign(STRICT_SECRET, &good).to_uppercase());
    let r = post_raw(
        &gw,
        "/hooks/webhook",
        &[("x-webhook-signature", prefixed)],
        good.clone(),
    )
    .await;
    assert_eq!(r.status, 200);
    // Not JSON -> 400; schema violations -> 422 with issues.
    let junk = b"{not json".to_vec();
    let r = post_raw(&gw, "/hooks/webhook", &sig(&junk), junk).await;
    assert_eq!(
        (r.status, r.body.clone()),
        (400, json!({"error": "Invalid JSON body"}))
    );
    let invalid = br#"{"event":"e","data":[],"timestamp":"yesterday","extra":1}"#.to_vec();
    let r = post_raw(&gw, "/hooks/webhook", &sig(&invalid), invalid).await;
    assert_eq!(r.status, 422);
    assert_eq!(r.body["error"], "Validation failed");
    let paths: Vec<&str> = r.body["issues"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["path"].as_str())
        .collect();
    assert_eq!(paths, ["source", "data", "timestamp", "extra"]);
    // The timestamp window: at the edge and one second past it, both directions.
    for (offset, want) in [(-300, 200), (-301, 401), (300, 200), (301, 401)] {
        let body = format!(r#"{{"event":"e","source":"s","data":{{"n":{offset}}}}}"#).into_bytes();
        let headers = vec![
            ("x-webhook-signature", sign(STRICT_SECRET, &body)),
            ("x-webhook-timestamp", (now() + offset).to_string()),
        ];
        let r = post_raw(&gw, "/hooks/webhook", &headers, body).await;
        assert_eq!(r.status, want, "timestamp offset {offset}");
    }
    let headers = vec![
        ("x-webhook-signature", sign(STRICT_SECRET, &good)),
        ("x-webhook-timestamp", "12.5".to_owned()),
    ];
    assert_eq!(
        post_raw(&gw, "/hooks/webhook", &headers, good.clone())
            .await
            .status,
        401
    );
    // Body limit of POST endpoints: at the limit is read, one byte more is 413.
    let pad = |n: usize| {
        let head = br#"{"event":"e","source":"s","data":{"p":""#.to_vec();
        let tail = br#""}}"#.to_vec();
        let fill = n - head.len() - tail.len();
        [head, vec![b'a'; fill], tail].concat()
    };
    let at = pad(4096);
    assert_eq!(
        post_raw(&gw, "/hooks/webhook", &sig(&at), at).await.status,
        200
    );
    let over = pad(4097);
    assert_eq!(
        post_raw(&gw, "/hooks/webhook", &sig(&over), over)
            .await
            .status,
        413
    );
    // Other methods are not served.
    let r = reqwest::get(gw.url("/hooks/webhook")).await.unwrap();
    assert_eq!(r.status().as_u16(), 405);
    gw.stop().await;
}

fn mapped_config() -> String {
    format!(
        r##"webhooks:
  enabled: true
  token: {HOOK_TOKEN}
  maxBodyBytes: 2048
  presets: [github, gmail, no-such-preset]
  hmac:
    headerName: x-hub-signature-256
  mappings:
    - id: echo
      match: {{path: /Echo/}}
      sessionKey: "{{{{payload.id}}}}"
      messageTemplate: "hello {{{{payload.name}}}} auth=[{{{{headers.authorization}}}}] sig=[{{{{headers.x-hub-signature-256}}}}] q={{{{query.q}}}} path={{{{path}}}}"
      deliver: true
      channel: slack
      to: "#ops"
    - id: ci
      match: {{source: ci}}
      textTemplate: "hello from ci {{{{payload.data}}}}"
    - id: mymail
      match: {{path: gmail}}
      textTemplate: "hello mail {{{{payload.messages[0].subject}}}}"
    - id: wake-later
      match: {{path: later}}
      action: wake
      wakeMode: next-heartbeat
      textTemplate: "queued event {{{{payload.n}}}}"
    - id: wake-now
      match: {{path: wake}}
      action: wake
      textTemplate: "urgent event {{{{payload.n}}}}"
{SCRIPT}"##
    )
}

fn hub(body: &[u8]) -> Vec<(&'static str, String)> {
    vec![(
        "x-hub-signature-256",
        format!("sha256={}", sign(HOOK_TOKEN, body)),
    )]
}

#[tokio::test]
async fn mapped_endpoints_route_run_and_acknowledge() {
    let gw = start(&mapped_config()).await;

    // Unsigned requests are refused before routing (paths cannot be probed).
    let body = br#"{"name":"Ann","id":"d1"}"#.to_vec();
    for path in ["/hooks/echo", "/hooks/no-such-path"] {
        let r = post_raw(&gw, path, &[], body.clone()).await;
        assert_eq!(r.status, 401, "{path}");
    }
    // Matched: acknowledged at once, the run lands in the mapping's namespaced session.
    let mut headers = hub(&body);
    headers.push(("authorization", format!("Bearer {RPC}")));
    let r = post_raw(&gw, "/hooks/ECHO/?q=42", &headers, body.clone()).await;
    assert_eq!(
        (r.status, r.body.clone()),
        (200, json!({"received": true, "mapping": "echo"}))
    );
    let key = "agent:default:webhook:echo:d1";
    let msgs = history(&gw, key, 2).await;
    let t = texts(&msgs);
    assert_eq!(t.len(), 2, "{msgs:?}");
    assert!(t[0].contains("EXTERNAL_UNTRUSTED_CONTENT"), "{}", t[0]);
    assert!(
        t[0].contains("hello Ann auth=[] sig=[] q=42 path=echo"),
        "{}",
        t[0]
    );
    assert!(!t[0].contains(RPC));
    assert_eq!(t[1], "Hello there, friend.");
    // A redelivery of the same signed body is acknowledged but not run again.
    let r = post_raw(&gw, "/hooks/echo?q=42", &headers, body.clone()).await;
    assert_eq!(r.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(history(&gw, key, 2).await.len(), 2);

    // The run is recorded with its delivery settings.
    let pool = database(&gw).await;
    let rows: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT status, delivery FROM runs WHERE client_id = 'webhook:echo'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 1);
    let delivery: Value = serde_json::from_str(rows[0].1.as_deref().unwrap()).unwrap();
    assert_eq!(
        delivery,
        json!({"deliver": true, "channel": "slack", "to": "#ops"})
    );

    // Source match on any path; first match wins; no match -> 404.
    let ci = br#"{"source":"ci","data":"build 7"}"#.to_vec();
    let r = post_raw(&gw, "/hooks/anything", &hub(&ci), ci).await;
    assert_eq!(r.body, json!({"received": true, "mapping": "ci"}));
    let other = br#"{"source":"elsewhere"}"#.to_vec();
    let r = post_raw(&gw, "/hooks/anything", &hub(&other), other).await;
    assert_eq!(
        (r.status, r.body),
        (404, json!({"error": "No matching webhook mapping"}))
    );
    // A configured mapping of the same path overrides the gmail preset.
    let mail = br#"{"messages":[{"id":"m1","subject":"Hi"}]}"#.to_vec();
    let r = post_raw(&gw, "/hooks/gmail", &hub(&mail), mail).await;
    assert_eq!(r.body["mapping"], "mymail");

    // Bad JSON and the body limit (also chunked, without Content-Length).
    let junk = b"not json".to_vec();
    let r = post_raw(&gw, "/hooks/echo", &hub(&junk), junk).await;
    assert_eq!(
        (r.status, r.body),
        (400, json!({"error": "Invalid JSON body"}))
    );
    let fill = |n: usize| {
        let mut b = br#"{"id":"big","name":""#.to_vec();
        let fill = n - b.len() - 2;
        b.extend(std::iter::repeat_n(b'x', fill));
        b.extend_from_slice(br#""}"#);
        b
    };
    let at = fill(2048);
    assert_eq!(
        post_raw(&gw, "/hooks/echo", &hub(&at), at).await.status,
        200
    );
    let over = fill(2049);
    let r = post_raw(&gw, "/hooks/echo", &hub(&over), over.clone()).await;
    assert_eq!(
        (r.status, r.body),
        (400, json!({"error": "Request body exceeds maximum size"}))
    );
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        over.chunks(100).map(|c| Ok(c.to_vec())).collect();
    let r = reqwest::Client::new()
        .post(gw.url("/hooks/echo"))
        .header(
            "x-hub-signature-256",
            format!("sha256={}", sign(HOOK_TOKEN, &over)),
        )
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);

    // Wakes: next-heartbeat waits; now runs a heartbeat turn with every pending event.
    let later = br#"{"n":1}"#.to_vec();
    let r = post_raw(&gw, "/hooks/later", &hub(&later), later).await;
    assert_eq!(r.body["mapping"], "wake-later");
    let now_body = br#"{"n":2}"#.to_vec();
    let r = post_raw(&gw, "/hooks/wake", &hub(&now_body), now_body).await;
    assert_eq!(r.body["mapping"], "wake-now");
    let msgs = history(&gw, "agent:default:heartbeat:system:main", 2).await;
    let t = texts(&msgs);
    assert!(t[0].starts_with("Heartbeat"), "{t:?}");
    assert!(
        t[0].contains("queued event 1") && t[0].contains("urgent event 2"),
        "{t:?}"
    );
    assert_eq!(t[1], "HEARTBEAT_OK");
    // Refused signatures and accepted deliveries are system events.
    let activity: Value = reqwest::Client::new()
        .get(gw.url("/api/activity?limit=100"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let events = activity.to_string();
    assert!(
        events.contains("\"webhook:received\"") && events.contains("\"audit:event\""),
        "{events}"
    );
    assert!(events.contains("webhook.rejected"), "{events}");
    // The same deliveries as diagnostic events, content-free, for the operator only.
    let diag = gw
        .call(
            ADMIN,
            "obs.diagnostics",
            json!({"category": "webhook", "limit": 1000}),
        )
        .await;
    let kinds: Vec<&str> = diag["result"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    for kind in ["webhook.rejected", "webhook.received", "webhook.unmatched"] {
        assert!(kinds.contains(&kind), "{kind}: {diag}");
    }
    assert!(diag["result"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "webhook.received")
        .all(|e| e["channelId"].as_str().unwrap().starts_with("webhook:")));
    let own = gw
        .call(RPC, "obs.diagnostics", json!({"category": "webhook"}))
        .await;
    assert_eq!(own["result"]["events"], json!([]), "{own}");
    gw.stop().await;
}

#[tokio::test]
async fn github_preset_takes_a_github_delivery_without_a_template() {
    let gw = start(&mapped_config()).await;
    // The shape GitHub sends for a push (trimmed), signed with the shared secret.
    let body = br#"{"ref":"refs/heads/main","action":"hello","repository":{"full_name":"octo/hello-world"},"sender":{"login":"octocat"}}"#.to_vec();
    let mut headers = hub(&body);
    headers.push(("x-github-event", "push".to_owned()));
    headers.push((
        "x-github-delivery",
        "72d3162e-cc78-11e3-81ab-4c9367dc0958".to_owned(),
    ));
    headers.push(("user-agent", "GitHub-Hookshot/044aadd".to_owned()));
    let r = post_raw(&gw, "/hooks/github", &headers, body).await;
    assert_eq!(
        (r.status, r.body),
        (200, json!({"received": true, "mapping": "github"}))
    );
    let key = "agent:default:webhook:github:72d3162e-cc78-11e3-81ab-4c9367dc0958";
    let t = texts(&history(&gw, key, 2).await);
    assert!(
        t[0].contains("GitHub event 'push' on octo/hello-world: action 'hello' by octocat"),
        "{t:?}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn short_secrets_and_a_shadowing_base_path_refuse_to_start() {
    for extra in [
        "webhooks:\n  enabled: true\n  token: short\n",
        "webhooks:\n  enabled: true\n  hmac:\n    secret: short\n",
        "webhooks:\n  enabled: true\n  path: /api\n",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.yaml");
        std::fs::write(&path, config_yaml(dir.path(), extra)).unwrap();
        let err = agent_gateway::server::start(Some(path)).await.err();
        assert!(err.is_some(), "{extra}");
    }
}

#[tokio::test]
async fn without_a_token_mapped_requests_are_unsigned_and_strict_ones_refused() {
    let gw = start(&format!(
        "webhooks:\n  enabled: true\n  mappings:\n    - id: open\n      match: {{path: open}}\n      textTemplate: \"hello {{{{payload.x}}}}\"\n    - id: ghost\n      match: {{path: ghost}}\n      agentId: nobody\n      textTemplate: x\n{SCRIPT}"
    ))
    .await;
    let body = br#"{"x":1}"#.to_vec();
    let r = post_raw(&gw, "/hooks/open", &[], body.clone()).await;
    assert_eq!(
        (r.status, r.body),
        (200, json!({"received": true, "mapping": "open"}))
    );
    // The spec's 500 row: a mapping whose agent does not exist.
    let r = post_raw(&gw, "/hooks/ghost", &[], body.clone()).await;
    assert_eq!(
        (r.status, r.body),
        (500, json!({"error": "Internal error"}))
    );
    let strict = br#"{"event":"e","source":"s","data":{}}"#.to_vec();
    let r = post_raw(&gw, "/hooks/webhook", &[], strict).await;
    assert_eq!(r.status, 401);
    // Disabled webhooks: the routes do not exist.
    let off = start(SCRIPT).await;
    assert_eq!(post_raw(&off, "/hooks/open", &[], body).await.status, 404);
    off.stop().await;
    gw.stop().await;
}

#[tokio::test]
async fn gmail_preset_model_override_and_run_timeout() {
    let gw = start(
        r#"webhooks:
  enabled: true
  presets: [gmail]
  mappings:
    - id: slow
      match: {path: slow}
      textTemplate: "slow {{payload.n}}"
      model: script/m2
      timeoutSeconds: 1
providers:
  script:
    type: scripted
    models: [m1, m2]
    script:
      - match: "New email from"
        steps:
          - reply: "Noted the email."
      - match: "slow"
        steps:
          - reply: "too late"
            delayMs: 30000
agents:
  default: {model: script/m1, maxSteps: 2}
"#,
    )
    .await;
    // A Gmail-style push: the preset builds the message and a session per first message id.
    let mail = br#"{"messages":[{"id":"18c2f","from":"ann@example.com","subject":"Invoice","snippet":"Please find","body":"Please find the invoice attached."}]}"#.to_vec();
    let r = post_raw(&gw, "/hooks/gmail", &[], mail).await;
    assert_eq!(r.body, json!({"received": true, "mapping": "gmail"}));
    let t = texts(&history(&gw, "agent:default:webhook:gmail:18c2f", 2).await);
    assert!(
        t[0].contains("New email from ann@example.com\nSubject: Invoice\nPlease find"),
        "{t:?}"
    );
    assert!(t[0].contains("Please find the invoice attached."), "{t:?}");
    assert_eq!(t[1], "Noted the email.");

    // The mapping's model runs, and its timeout ends the run (the step would take 30 s).
    let started = std::time::Instant::now();
    let slow = br#"{"n":1}"#.to_vec();
    let r = post_raw(&gw, "/hooks/slow", &[], slow).await;
    assert_eq!(r.body["mapping"], "slow");
    let pool = database(&gw).await;
    let row = loop {
        let row: Option<(String, Option<String>)> = sqlx::query_as(
            "SELECT status, finish_reason FROM runs WHERE client_id = 'webhook:slow' AND completed_at IS NOT NULL",
        )
        .fetch_optional(&pool)
        .await
        .unwrap();
        if let Some(r) = row {
            break r;
        }
        assert!(
            started.elapsed() < STEP,
            "the run did not end at its timeout"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(row.1.as_deref(), Some("error"), "{row:?}");
    let model: Option<String> = sqlx::query_scalar(
        "SELECT last_model FROM sessions WHERE session_key LIKE 'agent:default:webhook:slow:%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(model.as_deref(), Some("script/m2"));
    gw.stop().await;
}

#[tokio::test]
async fn a_full_run_queue_answers_503_until_a_slot_frees() {
    let gw = start(
        r#"webhooks:
  enabled: true
  maxConcurrentRuns: 1
  maxQueuedRuns: 1
  mappings:
    - id: slow
      textTemplate: "slow {{payload.n}}"
      timeoutSeconds: 1
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "slow"
        steps:
          - reply: "too late"
            delayMs: 30000
agents:
  default: {model: script/m1, maxSteps: 2}
"#,
    )
    .await;
    let send = |n: u32| {
        let body = format!(r#"{{"n":{n}}}"#).into_bytes();
        post_raw(&gw, "/hooks/any", &[], body)
    };
    // One runs, one waits: both acknowledged; the third finds the queue full.
    assert_eq!(send(1).await.status, 200);
    assert_eq!(send(2).await.status, 200);
    let r = send(3).await;
    assert_eq!(
        (r.status, r.body),
        (503, json!({"error": "Webhook run queue is full"}))
    );
    // Each run ends at its 1 s timeout; then the queue takes requests again.
    let deadline = std::time::Instant::now() + STEP;
    loop {
        let r = send(4).await;
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503);
        assert!(
            std::time::Instant::now() < deadline,
            "the queue never drained"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gw.stop().await;
}

// ---------------------------------------------------------------- durability

/// Stops a gateway but keeps its data directory (and configuration file) for the next one.
async fn stop_keeping_data(gw: Gateway) -> tempfile::TempDir {
    let Gateway { running, dir, .. } = gw;
    running.shutdown.cancel();
    tokio::time::timeout(STEP, running.done)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    dir
}

/// A gateway on the configuration file and data directory a previous one left.
async fn start_again(dir: tempfile::TempDir) -> Gateway {
    let running = agent_gateway::server::start(Some(dir.path().join("gateway.yaml")))
        .await
        .unwrap();
    Gateway {
        addr: running.addr,
        running,
        dir,
    }
}

/// The replay guard is keyed on what the signature covers (path and body), not on the
/// unsigned timestamp header, and it survives a restart: the same signed body is run once.
#[tokio::test]
async fn the_replay_guard_survives_a_restart_and_ignores_the_unsigned_timestamp() {
    let gw = start(&mapped_config()).await;
    let body = br#"{"name":"Bo","id":"r1"}"#.to_vec();
    let key = "agent:default:webhook:echo:r1";
    let with_ts = |ts: i64| {
        let mut h = hub(&body);
        h.push(("x-webhook-timestamp", ts.to_string()));
        h
    };
    let r = post_raw(&gw, "/hooks/echo", &with_ts(now()), body.clone()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(history(&gw, key, 2).await.len(), 2);
    // Another (unsigned) timestamp does not make it a new delivery.
    let r = post_raw(&gw, "/hooks/echo", &with_ts(now() - 5), body.clone()).await;
    assert_eq!(r.status, 200);
    let dir = stop_keeping_data(gw).await;

    let gw = start_again(dir).await;
    let r = post_raw(&gw, "/hooks/echo", &hub(&body), body.clone()).await;
    assert_eq!(
        (r.status, r.body.clone()),
        (200, json!({"received": true, "mapping": "echo"}))
    );
    let other = br#"{"name":"Bo","id":"r2"}"#.to_vec();
    let r = post_raw(&gw, "/hooks/echo", &hub(&other), other).await;
    assert_eq!(r.status, 200);
    // r2 ran (so the queue works); r1 ran once only, across both processes' lifetimes.
    assert_eq!(
        history(&gw, "agent:default:webhook:echo:r2", 2).await.len(),
        2
    );
    assert_eq!(history(&gw, key, 2).await.len(), 2);
    let pool = database(&gw).await;
    let (runs,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM runs WHERE client_id = 'webhook:echo' AND session_key = ?",
    )
    .bind(key)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(runs, 1);
    let (remembered,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM webhook_deliveries")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(remembered, 2);
    gw.stop().await;
}

/// Polls the run rows of the mapping until `done` says they are as expected.
async fn runs_until(
    pool: &sqlx::SqlitePool,
    done: impl Fn(&[(String, String, Option<String>)]) -> bool,
) -> Vec<(String, String, Option<String>)> {
    let deadline = std::time::Instant::now() + STEP;
    loop {
        let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
            "SELECT task, status, response FROM runs WHERE client_id = 'webhook:job' ORDER BY started_at",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        if done(&rows) || std::time::Instant::now() > deadline {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An acknowledged run that had not started when the process was killed (kill -9) is
/// written as queued before the 200, and runs to completion after the next start; the run
/// that was running is marked orphaned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_webhook_run_survives_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let config = one_slot_config(dir.path());
    let (first, port, pool) = start_with_the_slot_held(dir.path(), &config).await;
    assert_eq!(hook(port, "quick").await, 200);
    // The slow run holds the only slot; the quick one was written as queued before its 200.
    let rows = runs_until(&pool, |r| {
        r.len() == 2 && r.iter().any(|(_, s, _)| s == "running")
    })
    .await;
    assert_eq!(status_of(&rows, "slow").0, "running", "{rows:?}");
    assert_eq!(
        status_of(&rows, "quick"),
        ("queued".to_owned(), None),
        "{rows:?}"
    );
    let (mut second, rows) = restart_until_done(first, dir.path(), &config, &pool, "quick").await;
    assert_eq!(status_of(&rows, "slow").0, "orphaned", "{rows:?}");
    assert_eq!(rows.len(), 2, "{rows:?}");
    second.kill().unwrap();
    second.wait().unwrap();
}

/// Webhook mapping `job` with one run slot: a `slow` job holds it for `slow_ms`, any other
/// job answers `done`.
pub(crate) fn one_slot_jobs(slow_ms: u64) -> String {
    r#"webhooks:
  enabled: true
  maxConcurrentRuns: 1
  mappings:
    - id: job
      textTemplate: "{{payload.kind}} job"
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "slow"
        steps:
          - reply: "too late"
            delayMs: SLOW_MS
      - match: "job"
        steps:
          - reply: "done"
agents:
  default: {model: script/m1, maxSteps: 2}
"#
    .replace("SLOW_MS", &slow_ms.to_string())
}

/// The configuration file of a gateway with [`one_slot_jobs`], the slow job a minute long.
fn one_slot_config(dir: &std::path::Path) -> std::path::PathBuf {
    let config = dir.join("gateway.yaml");
    std::fs::write(&config, config_yaml(dir, &one_slot_jobs(60_000))).unwrap();
    config
}

/// Starts the gateway of `config` and has a `slow` job take its only slot, so that the jobs
/// delivered next stay queued; answers the process, its port and its database.
async fn start_with_the_slot_held(
    dir: &std::path::Path,
    config: &std::path::Path,
) -> (GatewayChild, u16, sqlx::SqlitePool) {
    let (first, port) = spawn_binary(dir, config, "first").await;
    let db = dir.join("data").join("gateway.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    assert_eq!(hook(port, "slow").await, 200);
    let rows = runs_until(&pool, |r| r.iter().any(|(_, s, _)| s == "running")).await;
    assert_eq!(status_of(&rows, "slow").0, "running", "{rows:?}");
    (first, port, pool)
}

/// Kills `first` (kill -9), starts the gateway again and waits until its queued `kind` job
/// has completed with `done`; answers the new process and the rows then.
async fn restart_until_done(
    mut first: GatewayChild,
    dir: &std::path::Path,
    config: &std::path::Path,
    pool: &sqlx::SqlitePool,
    kind: &str,
) -> (GatewayChild, Vec<(String, String, Option<String>)>) {
    first.kill().unwrap();
    first.wait().unwrap();
    let (second, _) = spawn_binary(dir, config, "second").await;
    let job = format!("{kind} job");
    let rows = runs_until(pool, |r| {
        r.iter()
            .any(|(t, s, _)| t.contains(&job) && s == "completed")
    })
    .await;
    assert_eq!(
        status_of(&rows, kind),
        ("completed".to_owned(), Some("done".to_owned())),
        "{rows:?}"
    );
    (second, rows)
}

/// Delivers a `kind` job to the mapping; answers the status.
async fn hook(port: u16, kind: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/hooks/any"))
        .header("content-type", "application/json")
        .body(format!(r#"{{"kind":"{kind}"}}"#))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The status and response of the `kind` job's run.
fn status_of(rows: &[(String, String, Option<String>)], kind: &str) -> (String, Option<String>) {
    rows.iter()
        .find(|(t, _, _)| t.contains(&format!("{kind} job")))
        .map(|(_, s, r)| (s.clone(), r.clone()))
        .unwrap_or_else(|| panic!("no {kind} job in {rows:?}"))
}

/// A queued run (acknowledged, waiting for a slot) that `run.kill` or `lease.revoke` stops
/// never starts: not when the slot frees, not after a restart (kill -9) that resumes the other
/// queued runs. Its row keeps the final status the stop gave it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_queued_run_never_starts_even_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = one_slot_config(dir.path());
    let (first, port, pool) = start_with_the_slot_held(dir.path(), &config).await;
    for kind in ["killed", "revoked", "kept"] {
        assert_eq!(hook(port, kind).await, 200, "{kind}");
    }
    let rows = runs_until(&pool, |r| {
        r.len() == 4 && r.iter().filter(|(_, s, _)| s == "queued").count() == 3
    })
    .await;
    assert_eq!(status_of(&rows, "slow").0, "running", "{rows:?}");
    let id_of = |kind: &'static str| {
        let pool = pool.clone();
        async move {
            let (id,): (String,) = sqlx::query_as(
                "SELECT run_id FROM runs WHERE task LIKE ? AND client_id = 'webhook:job'",
            )
            .bind(format!("%{kind} job%"))
            .fetch_one(&pool)
            .await
            .unwrap();
            id
        }
    };
    // run.kill answers {killed}, lease.revoke {revoked}: the status each gives the run.
    for (method, kind) in [("run.kill", "killed"), ("lease.revoke", "revoked")] {
        let r = call_port(port, ADMIN, method, json!({"rootRunId": id_of(kind).await})).await;
        assert_eq!(r["result"][kind], 1, "{method}: {r}");
    }
    let stopped = |rows: &[(String, String, Option<String>)]| {
        for kind in ["killed", "revoked"] {
            assert_eq!(status_of(rows, kind), (kind.to_owned(), None), "{rows:?}");
        }
    };
    let rows = runs_until(&pool, |_| true).await;
    stopped(&rows);
    assert_eq!(status_of(&rows, "kept").0, "queued", "{rows:?}");
    // The restart resumes the queued run that was not stopped, and only that one.
    let (mut second, rows) = restart_until_done(first, dir.path(), &config, &pool, "kept").await;
    stopped(&rows);
    second.kill().unwrap();
    second.wait().unwrap();
}
