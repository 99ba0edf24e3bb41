//! Observability reads at scale on the release binary: `obs.billing.*` over one million usage
//! rows (30 days, 20 agents, 3 providers, 10,000 sessions) and `obs.explain` of a 1,000-message
//! session, each answered over `POST /rpc` on loopback; p50 and p99 of the end-to-end time.
//! The data is generated through the store itself (the same writer and rollup as a running
//! gateway), then the gateway is started on it. See README.md.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Instant;

use agent_gateway::store::obs::TraceRow;
use agent_gateway::store::sessions::{MessageRow, NewSession, TurnTotals};
use agent_gateway::store::usage::UsageRow;
use agent_gateway::store::Store;
use serde_json::{json, Value};

#[path = "../common/mod.rs"]
mod common;
use common::{free_port, rpc, spawn, wait_healthy};

const DAY: i64 = 86_400_000;
const SESSION: &str = "agent:a0:api:bench:long";

/// One million usage rows over the last 30 days, written through the store's writer.
async fn usage(store: &Store, rows: i64, now: i64) {
    let started = Instant::now();
    let step = 30 * DAY / rows;
    for i in 0..rows {
        let provider = ["openai", "anthropic", "local"][(i % 3) as usize];
        store
            .usage_record(UsageRow {
                ts: now - 30 * DAY + i * step,
                agent_id: format!("a{}", i % 20),
                session_key: Some(format!("agent:a{}:api:bench:s{}", i % 20, i % 10_000)),
                provider: provider.to_owned(),
                model: format!("{provider}/m{}", i % 2),
                operation: "chat".to_owned(),
                input_tokens: 100 + i % 900,
                output_tokens: 10 + i % 90,
                cached_tokens: if i % 4 == 0 { 50 } else { 0 },
                cost_usd: 1e-4,
                cache_saved_usd: if i % 4 == 0 { 4.5e-5 } else { 0.0 },
                latency_ms: 200,
                ok: i % 50 != 0,
                ..UsageRow::default()
            })
            .unwrap();
        if i % 50_000 == 49_999 {
            store.usage_flush().await.unwrap();
        }
    }
    store.usage_flush().await.unwrap();
    println!(
        "generated {rows} usage rows in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// A session of `n` messages: user, assistant calling a tool, the tool's result (every
/// fifth one failed), ... with its index rows.
async fn long_session(store: &Store, n: i64, now: i64) {
    store
        .session_ensure(&NewSession {
            key: SESSION,
            agent_id: "a0",
            channel: "api",
            tenant_id: Some("bench"),
            user_id: Some("long"),
        })
        .await
        .unwrap();
    let mut messages = Vec::new();
    for i in 0..n {
        let (role, tool_name, is_error, content) = match i % 3 {
            0 => ("user", None, None, format!("question {i}")),
            1 => ("assistant", None, None, String::new()),
            _ => {
                let failed = i % 5 == 0;
                let content = if failed {
                    format!("tool failed: file not found: /tmp/{i}")
                } else {
                    format!("{{\"result\": \"{}\"}}", "x".repeat(200))
                };
                (
                    "tool",
                    Some(format!("tool{}", i % 7)),
                    Some(failed),
                    content,
                )
            }
        };
        messages.push(MessageRow {
            role: role.to_owned(),
            tool_calls: (role == "assistant").then(|| {
                json!([{"id": format!("c{i}"), "name": "tool", "arguments": {}}]).to_string()
            }),
            tool_call_id: tool_name.as_ref().map(|_| format!("c{}", i - 1)),
            tool_name,
            is_error,
            content,
            created_at: now,
            ..MessageRow::default()
        });
    }
    let first = store
        .session_append(
            SESSION,
            &messages,
            &TurnTotals {
                steps: 1,
                finish_reason: Some("circuit_open"),
                ..TurnTotals::default()
            },
        )
        .await
        .unwrap();
    for (i, m) in messages.iter().enumerate() {
        if m.role != "tool" {
            continue;
        }
        store.trace_record(TraceRow {
            ts: now,
            seq: first + i as i64,
            kind: "tool_result",
            session_key: SESSION.to_owned(),
            trace_id: format!("{:032x}", i / 30),
            tool_name: m.tool_name.clone(),
            status: Some(if m.is_error == Some(true) {
                "error"
            } else {
                "ok"
            }),
            error_kind: (m.is_error == Some(true)).then(|| "not_found".to_owned()),
            ..TraceRow::default()
        });
    }
    store.trace_record(TraceRow {
        ts: now,
        seq: first + n - 1,
        kind: "turn_end",
        session_key: SESSION.to_owned(),
        trace_id: "f".repeat(32),
        finish_reason: Some("circuit_open"),
        ..TraceRow::default()
    });
    store.usage_flush().await.unwrap();
}

fn percentiles(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    let at = |p: f64| ms[((ms.len() as f64 - 1.0) * p).round() as usize];
    (at(0.5), at(0.99))
}

async fn time(client: &reqwest::Client, port: u16, method: &str, params: Value, n: usize) {
    rpc(client, port, method, &params).await;
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        rpc(client, port, method, &params).await;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (p50, p99) = percentiles(ms);
    println!("{method:<24} {params:<60} p50 {p50:>7.2} ms  p99 {p99:>7.2} ms  ({n} calls)");
}

fn main() {
    let rows: i64 = std::env::var("OBS_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let calls: usize = std::env::var("OBS_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let now = agent_gateway::clock::now_ms();
        {
            let store = Store::open(&data.join(agent_gateway::store::DB_FILE))
                .await
                .unwrap();
            usage(&store, rows, now).await;
            long_session(&store, 1000, now).await;
        }
        let port = free_port();
        let mut child = spawn(dir.path(), port, "");
        wait_healthy(port).await;
        let client = reqwest::Client::new();
        let total = rpc(&client, port, "obs.billing.total", &json!({})).await;
        println!("obs.billing.total = {total}");
        let mid = now - 7 * DAY - 1_234_567;
        time(&client, port, "obs.billing.total", json!({}), calls).await;
        time(
            &client,
            port,
            "obs.billing.total",
            json!({"sinceMs": mid}),
            calls,
        )
        .await;
        time(
            &client,
            port,
            "obs.billing.byAgent",
            json!({"agentId": "a7"}),
            calls,
        )
        .await;
        time(
            &client,
            port,
            "obs.billing.bySession",
            json!({"sessionKey": "agent:a7:api:bench:s7"}),
            calls,
        )
        .await;
        time(&client, port, "obs.billing.byProvider", json!({}), calls).await;
        time(&client, port, "obs.billing.usage24h", json!({}), calls).await;
        time(&client, port, "obs.getCacheStats", json!({}), calls).await;
        time(
            &client,
            port,
            "obs.cacheStats.window",
            json!({"sinceMs": mid, "agent": "a3"}),
            calls,
        )
        .await;
        let report = rpc(
            &client,
            port,
            "obs.explain",
            &json!({"sessionKey": SESSION}),
        )
        .await;
        println!(
            "obs.explain: {} bytes, endReason {}, {} tools, truncations {}",
            report.to_string().len(),
            report["outcome"]["endReason"],
            report["toolStats"].as_object().map_or(0, |m| m.len()),
            report["truncations"]
        );
        time(
            &client,
            port,
            "obs.explain",
            json!({"sessionKey": SESSION}),
            calls,
        )
        .await;
        time(
            &client,
            port,
            "obs.explain",
            json!({"sessionKey": SESSION, "depth": "full"}),
            calls,
        )
        .await;
        time(&client, port, "obs.fleet.health", json!({}), calls).await;
        let _ = child.kill();
        let _ = child.wait();
    });
}
