//! Billing under load: concurrent `/v1` completions on two priced scripted models, then the
//! billing methods against the sums of the answers (before and after a graceful restart), and a
//! kill -9 in the middle of the load, which may lose only the rows of the writer's last window
//! (`docs/observability.md`: usage rows are committed within about 100 ms of the answer).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

/// Limits far above the load (a 429 would be a call not billed, and not a loss).
const PRICED: &str = r#"  rateLimit: {windowMs: 1000, maxRequests: 1000000}
  limits: {maxConcurrentTurnsPerClient: 64, maxConcurrentTurns: 256}
providers:
  s1:
    type: scripted
    models: [m1]
    script:
      - steps:
          - reply: "one"
            usage: {input: 100, output: 10}
  s2:
    type: scripted
    models: [m2]
    script:
      - steps:
          - reply: "two"
            usage: {input: 50, output: 5}
models:
  - id: s1/m1
    inputPricePerMTok: 1.0
    outputPricePerMTok: 2.0
  - id: s2/m2
    inputPricePerMTok: 3.0
    outputPricePerMTok: 4.0
agents:
  default: {model: s1/m1}
"#;

/// Price of one call of each model, in USD.
fn price(model: &str) -> f64 {
    match model {
        "s1/m1" => (100.0 * 1.0 + 10.0 * 2.0) / 1e6,
        _ => (50.0 * 3.0 + 5.0 * 4.0) / 1e6,
    }
}

/// One non-streaming completion on `model`; its usage as the answer states it.
async fn complete(client: &reqwest::Client, base: &str, model: &str) -> (i64, i64) {
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(RPC)
        .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    (
        v["usage"]["prompt_tokens"].as_i64().unwrap(),
        v["usage"]["completion_tokens"].as_i64().unwrap(),
    )
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// The billing methods equal the sums of `answers` (model, input, output).
async fn check(gw: &Gateway, answers: &[(String, i64, i64)]) {
    let total = ok(gw, ADMIN, "obs.billing.total", json!({})).await;
    let cost: f64 = answers.iter().map(|(m, _, _)| price(m)).sum();
    let tokens: i64 = answers.iter().map(|(_, i, o)| i + o).sum();
    assert_eq!(total["callCount"], answers.len() as i64, "{total}");
    assert_eq!(total["totalTokens"], tokens, "{total}");
    assert!(close(total["totalCost"].as_f64().unwrap(), cost), "{total}");
    let by = ok(gw, ADMIN, "obs.billing.byProvider", json!({})).await;
    for (provider, model) in [("s1", "s1/m1"), ("s2", "s2/m2")] {
        let mine: Vec<_> = answers.iter().filter(|(m, _, _)| m == model).collect();
        let row = by["providers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["provider"] == provider)
            .unwrap_or_else(|| panic!("{provider} missing: {by}"));
        let input: i64 = mine.iter().map(|(_, i, _)| i).sum();
        let output: i64 = mine.iter().map(|(_, _, o)| o).sum();
        assert_eq!(row["inputTokens"], input, "{row}");
        assert_eq!(row["outputTokens"], output, "{row}");
        let cost: f64 = mine.iter().map(|(m, _, _)| price(m)).sum();
        assert!(
            close(row["estimatedCostUsd"].as_f64().unwrap(), cost),
            "{row}"
        );
    }
}

/// 400 completions from 16 concurrent clients: every figure of the billing methods is the sum
/// of the answers, and stays so after a graceful restart (the shutdown flushes every row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn billing_is_exact_under_concurrent_load_and_after_a_restart() {
    let gw = start(PRICED).await;
    let base = gw.url("");
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let (client, base) = (client.clone(), base.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..25 {
                let model = if (worker + i) % 3 == 0 {
                    "s2/m2"
                } else {
                    "s1/m1"
                };
                let (input, output) = complete(&client, &base, model).await;
                out.push((model.to_owned(), input, output));
            }
            out
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.extend(tokio::time::timeout(STEP * 6, t).await.unwrap().unwrap());
    }
    assert_eq!(answers.len(), 400);
    check(&gw, &answers).await;
    let gw = gw.restart().await;
    check(&gw, &answers).await;
    gw.stop().await;
}

/// How long before the kill an answered call may still be missing from the database: the
/// writer's window (50 ms) and its commit, with room for a loaded CI machine.
const LOSS_WINDOW: Duration = Duration::from_millis(1000);

/// kill -9 during load: every call answered more than the loss window before the kill is in
/// the database, nothing is billed that was not sent, and each stored row's hourly rollup
/// agrees with the rows (they are committed together).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_load_loses_at_most_the_writers_window() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.yaml");
    std::fs::write(&config, config_yaml(dir.path(), PRICED)).unwrap();
    let (mut child, port) = spawn_binary(dir.path(), &config, "gateway").await;
    let base = format!("http://127.0.0.1:{port}");
    let answered: Arc<std::sync::Mutex<Vec<Instant>>> = Arc::default();
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (client, base, answered, sent) =
            (client.clone(), base.clone(), answered.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let r = client
                    .post(format!("{base}/v1/chat/completions"))
                    .bearer_auth(RPC)
                    .json(
                        &json!({"model": "s1/m1", "messages": [{"role": "user", "content": "hi"}]}),
                    )
                    .send()
                    .await;
                // Only the kill ends a worker: a connection refused or cut, never an error
                // status while the gateway runs.
                let Ok(r) = r else { return };
                assert_eq!(r.status(), 200);
                if r.bytes().await.is_err() {
                    return;
                }
                answered.lock().unwrap().push(Instant::now());
            }
        }));
    }
    // Load for a while, then the kill in the middle of it.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    child.kill().unwrap();
    let killed = Instant::now();
    child.wait().unwrap();
    for t in tasks {
        tokio::time::timeout(STEP, t).await.unwrap().unwrap();
    }
    let answered = answered.lock().unwrap().clone();
    let sent = sent.load(std::sync::atomic::Ordering::SeqCst) as i64;
    let durable = answered
        .iter()
        .filter(|t| killed.duration_since(**t) > LOSS_WINDOW)
        .count() as i64;
    assert!(durable > 0, "the load answered nothing before the window");

    let db = dir.path().join("data").join("gateway.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let (rows, cost): (i64, f64) =
        sqlx::query_as("SELECT COUNT(*), COALESCE(SUM(cost_usd), 0) FROM usage")
            .fetch_one(&pool)
            .await
            .unwrap();
    eprintln!(
        "kill during load: {sent} sent, {} answered, {durable} answered before the window, {rows} stored",
        answered.len()
    );
    assert!(
        rows >= durable,
        "{rows} usage rows, but {durable} calls were answered more than {LOSS_WINDOW:?} before the kill"
    );
    assert!(rows <= sent, "{rows} usage rows for {sent} calls sent");
    assert!(
        close(cost, rows as f64 * price("s1/m1")),
        "{cost} for {rows} rows"
    );
    let (calls, hourly_cost): (i64, f64) = sqlx::query_as(
        "SELECT COALESCE(SUM(calls), 0), COALESCE(SUM(cost_usd), 0) FROM usage_hourly",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(calls, rows, "the hourly rollup counts every stored row");
    assert!(close(hourly_cost, cost), "{hourly_cost} against {cost}");
    pool.close().await;

    // The next start bills exactly what the database holds.
    let (mut child, port) = spawn_binary(dir.path(), &config, "gateway").await;
    let total = call_port(port, ADMIN, "obs.billing.total", json!({})).await;
    assert_eq!(total["result"]["callCount"], rows, "{total}");
    child.kill().unwrap();
    child.wait().unwrap();
}
