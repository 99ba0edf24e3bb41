//! `memory.maxEntriesPerTenant` as clients meet it over JSON-RPC on loopback: memory.store, the
//! agent's `memory_store` tool and `memory.portability.import` (counted whole, all or nothing)
//! are refused with -32602 naming the limit once a tenant holds it, another tenant is not
//! touched; and the per-tenant gauge of the in-memory vector index on `/metrics`, read with a
//! token holding only the `metrics` scope.
//!
//! The tenants here have ids no other test uses: the metrics recorder and the gauge's view of
//! the live indexes are per process, shared with every gateway the suite runs in parallel.

use std::time::Instant;

use serde_json::{json, Value};

use crate::common::*;

/// The limit every gateway here runs with.
const LIMIT: u64 = 3;

const ALICE: &str = "limits-alice-secret-0123456789abcdefghijklmnop";
const BOB: &str = "limits-bob-secret-0123456789abcdefghijklmnopqr";
const CAROL: &str = "limits-carol-secret-0123456789abcdefghijklmno";
const METRICS: &str = "limits-metrics-secret-0123456789abcdefghijklm";
/// The gauge test's own tenants: the gauge sums every live index in the process, so no other
/// test may write these ids.
const GAUGE_A: &str = "limits-gauge-a-secret-0123456789abcdefghijklm";
const GAUGE_B: &str = "limits-gauge-b-secret-0123456789abcdefghijklm";

/// Two admin tenants (memory.store and the import are admin methods and write the caller's own
/// tenant), an rpc tenant whose agent stores through its tool, and a metrics reader; entries
/// embedded by the scripted provider so that they reach the vector index.
fn config() -> String {
    format!(
        "    - {{id: limits-alice, secret: {ALICE}, scopes: [admin]}}\n    - {{id: limits-bob, secret: {BOB}, scopes: [admin]}}\n    - {{id: limits-carol, secret: {CAROL}, scopes: [rpc]}}\n    - {{id: limits-metrics, secret: {METRICS}, scopes: [metrics]}}\n    - {{id: limits-gauge-a, secret: {GAUGE_A}, scopes: [admin]}}\n    - {{id: limits-gauge-b, secret: {GAUGE_B}, scopes: [admin]}}\n  rateLimit: {{windowMs: 1000, maxRequests: 100000}}\n\
providers:\n  s1:\n    type: scripted\n    models: [m1]\n    maxRetries: 0\n    script:\n      - match: \"store it\"\n        steps:\n          - toolCalls: [{{name: memory_store, arguments: {{content: \"The user's cat is called Mochi\"}}}}]\n          - reply: \"done\"\n      - steps:\n          - reply: \"ok\"\n\
agents:\n  default: {{model: s1/m1, tools: ['*']}}\n\
memory:\n  maxEntriesPerTenant: {LIMIT}\n  embeddingModel: s1/m1\n  consolidateAfter: 0\n"
    )
}

fn refused_at_the_limit(r: &Value) {
    assert_eq!(code(r), -32602, "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "memory.maxEntriesPerTenant ({LIMIT}) reached for this tenant"
        )),
        "{message}"
    );
}

async fn store(gw: &Gateway, token: &str, content: &str) -> Value {
    gw.call(token, "memory.store", json!({"content": content}))
        .await
}

/// The tenant's entries, as memory.stats counts them (an admin may name any tenant).
async fn total(gw: &Gateway, tenant: &str) -> i64 {
    ok(gw, ADMIN, "memory.stats", json!({"tenant_id": tenant})).await["totalEntries"]
        .as_i64()
        .unwrap()
}

fn entries(n: usize, prefix: &str) -> Value {
    (0..n)
        .map(|i| json!({"content": format!("{prefix} fact number {i} about the garden")}))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_pass_up_to_the_limit_and_the_next_is_refused() {
    let gw = start(&config()).await;
    for i in 0..LIMIT {
        let r = store(&gw, ALICE, &format!("Alice's fact number {i}")).await;
        assert_eq!(r["result"]["stored"], true, "entry {i}: {r}");
    }
    assert_eq!(total(&gw, "limits-alice").await, LIMIT as i64);
    // One past the limit: refused, nothing stored.
    refused_at_the_limit(&store(&gw, ALICE, "one too many").await);
    assert_eq!(total(&gw, "limits-alice").await, LIMIT as i64);

    // Another tenant is not touched by Alice's full memory.
    let r = store(&gw, BOB, "Bob's first fact").await;
    assert_eq!(r["result"]["stored"], true, "{r}");
    assert_eq!(total(&gw, "limits-bob").await, 1);

    // Deleting one frees one place, and only one.
    let list = ok(
        &gw,
        ALICE,
        "memory.browse",
        json!({"limit": 10, "sort": "oldest"}),
    )
    .await;
    let first = list["entries"][0]["id"].as_str().unwrap().to_owned();
    ok(&gw, ALICE, "memory.delete", json!({"ids": [first]})).await;
    assert_eq!(
        store(&gw, ALICE, "back at the limit").await["result"]["stored"],
        true
    );
    refused_at_the_limit(&store(&gw, ALICE, "past it again").await);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_counts_whole_and_writes_all_or_nothing() {
    let gw = start(&config()).await;
    let import = |token: &'static str, n: usize, dry: bool| {
        let gw = &gw;
        async move {
            gw.call(
                token,
                "memory.portability.import",
                json!({"agent_id": "default", "entries": entries(n, "imported"), "dry_run": dry}),
            )
            .await
        }
    };
    // One entry already there; an import of LIMIT would make LIMIT + 1: refused whole, as its
    // dry run predicts, and nothing of it is written.
    assert_eq!(store(&gw, ALICE, "first").await["result"]["stored"], true);
    refused_at_the_limit(&import(ALICE, LIMIT as usize, true).await);
    refused_at_the_limit(&import(ALICE, LIMIT as usize, false).await);
    assert_eq!(total(&gw, "limits-alice").await, 1);
    // LIMIT - 1 fits exactly: all written, and the tenant is at its limit.
    let dry = import(ALICE, LIMIT as usize - 1, true).await;
    assert_eq!(dry["result"]["imported"], LIMIT - 1, "{dry}");
    assert_eq!(
        total(&gw, "limits-alice").await,
        1,
        "a dry run writes nothing"
    );
    let r = import(ALICE, LIMIT as usize - 1, false).await;
    assert_eq!(r["result"]["imported"], LIMIT - 1, "{r}");
    assert_eq!(total(&gw, "limits-alice").await, LIMIT as i64);
    refused_at_the_limit(&import(ALICE, 1, false).await);
    refused_at_the_limit(&store(&gw, ALICE, "and a store").await);
    // Bob imports his whole limit in one go; one more is refused.
    let r = import(BOB, LIMIT as usize, false).await;
    assert_eq!(r["result"]["imported"], LIMIT, "{r}");
    refused_at_the_limit(&import(BOB, 1, false).await);
    assert_eq!(total(&gw, "limits-bob").await, LIMIT as i64);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_tool_is_refused_at_the_limit_with_the_message() {
    let gw = start(&config()).await;
    let turn = json!({"message": "store it", "sessionKey": {"userId": "main"}});
    for _ in 0..LIMIT {
        ok(&gw, CAROL, "agent.execute", turn.clone()).await;
    }
    assert_eq!(total(&gw, "limits-carol").await, LIMIT as i64);
    // The next tool call is refused: the model reads the refusal, nothing is stored.
    ok(&gw, CAROL, "agent.execute", turn.clone()).await;
    assert_eq!(total(&gw, "limits-carol").await, LIMIT as i64);
    let h = ok(
        &gw,
        CAROL,
        "session.history",
        json!({"session_key": "agent:default:api:limits-carol:main", "limit": 4}),
    )
    .await;
    let tool = h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap_or_else(|| panic!("no tool message: {h}"));
    assert!(
        tool.to_string().contains(&format!(
            "memory.maxEntriesPerTenant ({LIMIT}) reached for this tenant"
        )),
        "{tool}"
    );
    gw.stop().await;
}

/// The value of `agentgw_memory_index_entries{tenant="<tenant>"}`, None when absent.
fn gauge(exposition: &str, tenant: &str) -> Option<f64> {
    let head = format!("agentgw_memory_index_entries{{tenant=\"{tenant}\"}} ");
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(head.as_str()))
        .map(|v| v.parse().unwrap())
}

async fn scrape(gw: &Gateway) -> String {
    let r = reqwest::Client::new()
        .get(gw.url("/metrics"))
        .bearer_auth(METRICS)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_gauge_counts_each_tenant_on_metrics() {
    let gw = start(&config()).await;
    for i in 0..LIMIT {
        store(&gw, GAUGE_A, &format!("A gauge fact {i}")).await;
    }
    store(&gw, GAUGE_B, "B gauge fact").await;
    // Embedding is in the background: the gauge follows within a step.
    let deadline = Instant::now() + STEP;
    let text = loop {
        let text = scrape(&gw).await;
        if gauge(&text, "limits-gauge-a") == Some(LIMIT as f64)
            && gauge(&text, "limits-gauge-b") == Some(1.0)
        {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the gauge never reached the entries: {:?} {:?}",
            gauge(&text, "limits-gauge-a"),
            gauge(&text, "limits-gauge-b")
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(text.contains("# TYPE agentgw_memory_index_entries gauge"));
    assert!(
        gauge(&text, "other").is_some(),
        "the bucket is always there"
    );
    // A deleted entry leaves the gauge.
    let list = ok(&gw, GAUGE_A, "memory.browse", json!({"limit": 10})).await;
    let id = list["entries"][0]["id"].as_str().unwrap().to_owned();
    ok(&gw, GAUGE_A, "memory.delete", json!({"ids": [id]})).await;
    assert_eq!(
        gauge(&scrape(&gw).await, "limits-gauge-a"),
        Some(LIMIT as f64 - 1.0)
    );
    // A stopped gateway's index is no longer reported (read through another gateway: the
    // exposition is the process's).
    gw.stop().await;
    let other = start(&config()).await;
    let deadline = Instant::now() + STEP;
    while gauge(&scrape(&other).await, "limits-gauge-a").is_some() {
        assert!(
            Instant::now() < deadline,
            "a stopped gateway's index is still reported"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    other.stop().await;
}
