//! `GET /metrics` (Prometheus text format 0.0.4): who may read it, its content type, and that
//! the counters move by exactly the requests made, with bounded labels only (an unknown path
//! is `route="other"`, an unknown JSON-RPC method `method="unknown"`; neither name appears).
//!
//! The recorder is one per process and the suite's tests run in parallel, so every check reads
//! a delta (before, act, after); where another test may move the same series at the same
//! time, the round is repeated until one is undisturbed (a miscount is never undisturbed: a
//! double count shows in every round).

use std::time::Duration;

use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::common::*;

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Rounds of a delta check before concurrent tests are blamed no more.
const ROUNDS: usize = 8;

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(STEP).build().unwrap()
}

/// One sample line: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// A small parser of the text format's sample lines (label values with `\\`, `\"`, `\n`).
fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (head, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let (name, labels) = match head.split_once('{') {
            None => (head.to_owned(), Vec::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').unwrap();
                let mut labels = Vec::new();
                let mut chars = body.chars().peekable();
                loop {
                    let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
                    if key.is_empty() {
                        break;
                    }
                    assert_eq!(chars.next(), Some('"'), "{line}");
                    let mut v = String::new();
                    while let Some(c) = chars.next() {
                        match c {
                            '\\' => match chars.next() {
                                Some('n') => v.push('\n'),
                                Some(other) => v.push(other),
                                None => panic!("{line}"),
                            },
                            '"' => break,
                            c => v.push(c),
                        }
                    }
                    labels.push((key.trim_start_matches(',').to_owned(), v));
                    if chars.peek() == Some(&',') {
                        chars.next();
                    }
                }
                (name.to_owned(), labels)
            }
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

/// The value of the series `name{labels}` (exactly these labels); 0 when absent.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && s.labels.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(k2, v2)| k2 == k && v2 == v))
        })
        .map_or(0.0, |s| s.value)
}

/// Each scrape is a client of its own (a /64 named by X-Forwarded-For, believed only where
/// the test trusts the loopback proxy), so a test's tight rate limit never refuses it.
static SCRAPES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

async fn scrape(gw: &Gateway) -> String {
    let n = SCRAPES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 0xffff;
    let r = client()
        .get(gw.url("/metrics"))
        .bearer_auth(ADMIN)
        .header("x-forwarded-for", format!("2001:db8:{n:x}::1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

async fn read(gw: &Gateway, name: &str, labels: &[(&str, &str)]) -> f64 {
    value(&parse(&scrape(gw).await), name, labels)
}

/// Repeats `act` (which makes `n` requests of the series) until one round moved the series by
/// exactly `n`; every round must move it by at least `n`.
async fn moves_by_exactly<F, Fut>(gw: &Gateway, name: &str, labels: &[(&str, &str)], n: f64, act: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut seen = Vec::new();
    for _ in 0..ROUNDS {
        let before = read(gw, name, labels).await;
        act().await;
        let after = read(gw, name, labels).await;
        let delta = after - before;
        assert!(
            delta >= n,
            "{name}{labels:?} moved by {delta}, fewer than {n}"
        );
        if delta == n {
            return;
        }
        seen.push(delta);
    }
    panic!("{name}{labels:?} never moved by exactly {n}: {seen:?}");
}

#[tokio::test]
async fn only_metrics_admin_and_star_tokens_read_the_exposition() {
    let gw = start("").await;
    let c = client();
    let r = c.get(gw.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let body: Value = r.json().await.unwrap();
    assert!(body["error"].is_string(), "{body}");
    for token in [RPC, MCP] {
        let r = c
            .get(gw.url("/metrics"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);
        let body: Value = r.json().await.unwrap();
        assert!(
            body["error"].as_str().unwrap().contains("metrics"),
            "{body}"
        );
    }
    let r = c
        .get(gw.url("/metrics"))
        .bearer_auth("not-a-token-0123456789abcdefghijklmnopqrstuvwxyz")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // A token holding only `metrics` reads it, and nothing else.
    let created = gw
        .call(ADMIN, "tokens.create", json!({"scopes": ["metrics"]}))
        .await;
    let scraper = created["result"]["secret"].as_str().unwrap().to_owned();
    for token in [ADMIN, ADMIN_ONLY, scraper.as_str()] {
        let r = c
            .get(gw.url("/metrics"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], CONTENT_TYPE);
        let text = r.text().await.unwrap();
        assert!(
            text.contains("# TYPE agentgw_http_requests_total counter"),
            "{text}"
        );
        assert!(text.contains("agentgw_websocket_connections"), "{text}");
    }
    let r = gw.call(&scraper, "system.ping", json!({})).await;
    assert_eq!(code(&r), -32603, "{r}");
    let r = c
        .get(gw.url("/v1/models"))
        .bearer_auth(&scraper)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    gw.stop().await;
}

#[tokio::test]
async fn http_and_rpc_counters_move_by_the_requests_made() {
    let gw = start("  rateLimit: {windowMs: 60000, maxRequests: 1000000}\n").await;
    let c = client();
    const N: usize = 7;
    let health = [("route", "/health"), ("method", "GET"), ("status", "200")];
    moves_by_exactly(
        &gw,
        "agentgw_http_requests_total",
        &health,
        N as f64,
        || async {
            for _ in 0..N {
                let r = c.get(gw.url("/health")).send().await.unwrap();
                assert_eq!(r.status(), 200);
            }
        },
    )
    .await;
    // The duration histogram counts the same requests.
    let count = [("route", "/health"), ("method", "GET")];
    moves_by_exactly(
        &gw,
        "agentgw_http_request_duration_seconds_count",
        &count,
        N as f64,
        || async {
            for _ in 0..N {
                c.get(gw.url("/health")).send().await.unwrap();
            }
        },
    )
    .await;

    // JSON-RPC over HTTP and over WebSocket count in one place.
    let ping = [("method", "system.ping"), ("outcome", "ok")];
    moves_by_exactly(
        &gw,
        "agentgw_rpc_requests_total",
        &ping,
        N as f64,
        || async {
            for _ in 0..N {
                let r = gw.call(RPC, "system.ping", json!({})).await;
                assert_eq!(r["result"]["pong"], true, "{r}");
            }
        },
    )
    .await;
    moves_by_exactly(
        &gw,
        "agentgw_rpc_requests_total",
        &ping,
        N as f64,
        || async {
            let mut ws = gw.ws(RPC).await;
            for i in 0..N {
                assert_ping(&mut ws, i as u64).await;
            }
            ws.close(None).await.unwrap();
        },
    )
    .await;
    // An error outcome is its code.
    let bad = [("method", "system.ping"), ("outcome", "-32602")];
    moves_by_exactly(&gw, "agentgw_rpc_requests_total", &bad, 2.0, || async {
        for _ in 0..2 {
            let r = gw.call(RPC, "system.ping", json!({"nope": 1})).await;
            assert_eq!(code(&r), -32602, "{r}");
        }
    })
    .await;
    gw.stop().await;
}

#[tokio::test]
async fn unknown_paths_and_methods_never_become_labels() {
    let gw = start("  rateLimit: {windowMs: 60000, maxRequests: 1000000}\n").await;
    let c = client();
    let other = [("route", "other"), ("method", "GET"), ("status", "404")];
    moves_by_exactly(&gw, "agentgw_http_requests_total", &other, 3.0, || async {
        for _ in 0..3 {
            let r = c.get(gw.url("/nope/abc123")).send().await.unwrap();
            assert_eq!(r.status(), 404);
        }
    })
    .await;
    let unknown = [("method", "unknown"), ("outcome", "-32601")];
    moves_by_exactly(&gw, "agentgw_rpc_requests_total", &unknown, 2.0, || async {
        for _ in 0..2 {
            let r = gw.call(RPC, "x.secretname", json!({})).await;
            assert_eq!(code(&r), -32601, "{r}");
        }
    })
    .await;
    // Unparseable messages name no method at all.
    let (_, text) = gw.post_rpc(RPC, "{not json").await;
    assert!(text.contains("-32700"), "{text}");
    let text = scrape(&gw).await;
    assert!(!text.contains("abc123"), "a raw path leaked");
    assert!(!text.contains("nope"), "a raw path leaked");
    assert!(
        !text.contains("secretname"),
        "an unknown method name leaked"
    );
    // Every label value of the HTTP and JSON-RPC series is from the bounded sets.
    let routes = agent_gateway::metrics::ROUTES;
    for s in parse(&text) {
        for (k, v) in &s.labels {
            if s.name.starts_with("agentgw_http_") && k == "route" {
                assert!(routes.contains(&v.as_str()), "route {v}");
            }
            if s.name.starts_with("agentgw_rpc_") && k == "method" {
                assert!(
                    v == "unknown"
                        || agent_gateway::api::generated::methods::METHODS
                            .iter()
                            .any(|m| m.name == v && !m.internal),
                    "method {v}"
                );
            }
        }
    }
    gw.stop().await;
}

#[tokio::test]
async fn the_websocket_gauge_follows_open_connections() {
    // The wait for the gauge to come down scrapes every 20 ms for up to a STEP, more than the
    // default 100 requests a minute from one client on a loaded machine.
    let gw = start("  rateLimit: {windowMs: 60000, maxRequests: 1000000}\n").await;
    let name = "agentgw_websocket_connections";
    let mut seen = Vec::new();
    for _ in 0..ROUNDS {
        let before = read(&gw, name, &[]).await;
        let mut ws = gw.ws(RPC).await;
        // Answered: the connection is registered and counted.
        assert_ping(&mut ws, 1).await;
        let open = read(&gw, name, &[]).await;
        ws.send(Message::Close(None)).await.unwrap();
        let _ = closed(&mut ws).await;
        drop(ws);
        // Back down once the connection's task ended (bounded wait).
        let deadline = tokio::time::Instant::now() + STEP;
        let mut after = read(&gw, name, &[]).await;
        while after != open - 1.0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
            after = read(&gw, name, &[]).await;
        }
        if open == before + 1.0 && after == open - 1.0 {
            gw.stop().await;
            return;
        }
        seen.push((before, open, after));
    }
    panic!("the gauge never followed one connection undisturbed: {seen:?}");
}

#[tokio::test]
async fn refusals_of_the_global_rate_limit_are_counted() {
    // Two requests per client a minute; the test's clients are named by X-Forwarded-For (the
    // scrapes, without it, are another client).
    let gw =
        start("  rateLimit: {windowMs: 60000, maxRequests: 2}\n  trustedProxies: [127.0.0.1]\n")
            .await;
    let c = client();
    let round = std::sync::atomic::AtomicU8::new(1);
    let limited = [("limiter", "http")];
    moves_by_exactly(&gw, "agentgw_rate_limited_total", &limited, 3.0, || async {
        let client_ip = format!(
            "203.0.113.{}",
            round.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut statuses = Vec::new();
        for _ in 0..5 {
            let r = c
                .get(gw.url("/v1/models"))
                .bearer_auth(RPC)
                .header("x-forwarded-for", &client_ip)
                .send()
                .await
                .unwrap();
            statuses.push(r.status().as_u16());
        }
        assert_eq!(statuses, [200, 200, 429, 429, 429]);
    })
    .await;
    let text = scrape(&gw).await;
    let refused = [
        ("route", "/v1/models"),
        ("method", "GET"),
        ("status", "429"),
    ];
    assert!(value(&parse(&text), "agentgw_http_requests_total", &refused) >= 3.0);
    gw.stop().await;
}
