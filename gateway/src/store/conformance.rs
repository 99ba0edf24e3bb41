//! Every store operation on both backends with the same assertions: each test body runs once
//! on a SQLite file and once on a fresh PostgreSQL database (the suite's throwaway server).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use super::registry::Table;
use super::runs::{Delivery, RunRow};
use super::sessions::{MessageRow, NewSession, SessionFilter, TurnTotals};
use super::usage::UsageRow;
use super::Store;
use crate::config::store::StoreConfig;
use crate::tenancy::Tenant;

/// `name::sqlite` and `name::postgres`, each running `body(store)`.
macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                let dir = tempfile::tempdir().unwrap();
                let store = super::Store::open(&dir.path().join("t.db")).await.unwrap();
                super::$name(store).await;
            }

            #[tokio::test]
            async fn postgres() {
                let url = super::super::pg_harness::database().await;
                let store = super::Store::connect_postgres(&url, &super::StoreConfig::default())
                    .await
                    .unwrap();
                super::$name(store).await;
            }
        }
    )*};
}

both!(
    sessions_and_transcripts,
    concurrent_appends_get_distinct_seq_numbers,
    registry_rows,
    memories_notes_and_search,
    usage_batches_and_figures,
    runs_claims_and_sweeps,
    webhook_deliveries,
);

fn all() -> Tenant {
    Tenant::for_principal("admin", true)
}

fn only(t: &str) -> Tenant {
    Tenant::for_principal(t, false)
}

fn msg(role: &str, content: &str) -> MessageRow {
    MessageRow {
        role: role.into(),
        content: content.into(),
        ..MessageRow::default()
    }
}

async fn session(s: &Store, key: &str, tenant: &str) {
    s.session_ensure(&NewSession {
        key,
        agent_id: "bot",
        channel: "api",
        tenant_id: Some(tenant),
        user_id: Some("u"),
    })
    .await
    .unwrap();
}

async fn sessions_and_transcripts(s: Store) {
    // Keys that sort differently under a locale collation than in byte order.
    for key in ["b", "B", "a%3A", "a:z", "_x"] {
        session(&s, key, "alice").await;
    }
    session(&s, "m", "mallory").await;
    let totals = TurnTotals {
        input_tokens: 3,
        output_tokens: 4,
        cost_usd: 0.5,
        steps: 1,
        model: Some("p/m".into()),
    };
    let mut turn = vec![msg("user", "hello"), msg("assistant", "hi")];
    turn[1].is_error = Some(false);
    turn[1].tool_calls = Some("[]".into());
    s.session_append("a:z", &turn, &totals).await.unwrap();
    s.session_append("a:z", &[msg("user", "nul\0byte")], &totals)
        .await
        .unwrap();

    let got = s.session_get(&only("alice"), "a:z").await.unwrap().unwrap();
    assert_eq!(
        (got.message_count, got.input_tokens, got.output_tokens),
        (3, 6, 8)
    );
    assert_eq!(got.cost_usd, 1.0);
    assert_eq!(got.last_model.as_deref(), Some("p/m"));
    assert_eq!(s.session_get(&only("mallory"), "a:z").await.unwrap(), None);

    let (page, has_more) = s.session_messages(&all(), "a:z", None, 2).await.unwrap();
    assert!(has_more);
    assert_eq!(
        page.iter()
            .map(|m| (m.seq, m.content.as_str()))
            .collect::<Vec<_>>(),
        [(1, "hi"), (2, "nul\u{FFFD}byte")]
    );
    assert_eq!(page[0].is_error, Some(false));
    let (older, has_more) = s
        .session_messages(&all(), "a:z", Some(1), 10)
        .await
        .unwrap();
    assert!(!has_more);
    assert_eq!(older.len(), 1);
    assert!(s
        .session_messages(&only("mallory"), "a:z", None, 10)
        .await
        .unwrap()
        .0
        .is_empty());

    // Byte order among equal update times, newest first otherwise.
    let (list, total) = s
        .session_list(&SessionFilter::of(only("alice")), 10, 0)
        .await
        .unwrap();
    assert_eq!(total, 5);
    assert_eq!(list[0].key, "a:z", "updated last");
    let rest: Vec<&str> = list[1..].iter().map(|r| r.key.as_str()).collect();
    let mut sorted = rest.clone();
    sorted.sort_by(|a, b| {
        let at = |k: &str| list.iter().find(|r| r.key == k).unwrap().updated_at;
        at(b).cmp(&at(a)).then(a.as_bytes().cmp(b.as_bytes()))
    });
    assert_eq!(rest, sorted);
    let (_, total) = s
        .session_list(&SessionFilter::of(all()), 2, 4)
        .await
        .unwrap();
    assert_eq!(total, 6);

    s.session_replace_messages("a:z", &[msg("system", "summary")])
        .await
        .unwrap();
    let all_msgs = s.session_all_messages(&all(), "a:z").await.unwrap();
    assert_eq!(all_msgs.len(), 1);
    assert_eq!(all_msgs[0].seq, 0);
    s.session_append("a:z", &[msg("user", "again")], &totals)
        .await
        .unwrap();
    assert_eq!(
        s.session_all_messages(&all(), "a:z").await.unwrap()[1].seq,
        1
    );

    assert_eq!(
        s.session_clear(&only("mallory"), "a:z").await.unwrap(),
        None
    );
    assert_eq!(
        s.session_clear(&only("alice"), "a:z").await.unwrap(),
        Some(2)
    );
    assert_eq!(s.session_clear(&all(), "nope").await.unwrap(), None);
    s.note_add("a:z", "kept apart").await.unwrap();
    assert!(!s.session_delete(&only("mallory"), "a:z").await.unwrap());
    assert!(s.session_delete(&only("alice"), "a:z").await.unwrap());
    assert!(s.notes_list("a:z").await.unwrap().is_empty(), "cascade");
    assert!(!s.session_delete(&all(), "a:z").await.unwrap());
}

async fn concurrent_appends_get_distinct_seq_numbers(s: Store) {
    session(&s, "busy", "alice").await;
    let mut tasks = Vec::new();
    for t in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..5 {
                let turn = [msg("user", &format!("{t}-{i}")), msg("assistant", "ok")];
                s.session_append("busy", &turn, &TurnTotals::default())
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let msgs = s.session_all_messages(&all(), "busy").await.unwrap();
    let seqs: Vec<i64> = msgs.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (0..80).collect::<Vec<i64>>());
    // Each turn's two messages are adjacent.
    for pair in msgs.chunks(2) {
        assert_eq!(
            (pair[0].role.as_str(), pair[1].role.as_str()),
            ("user", "assistant")
        );
    }
}

async fn registry_rows(s: Store) {
    let cfg = r#"{"type":"openai","baseUrl":"http://x"}"#;
    assert!(s
        .registry_insert(Table::Providers, "p-B", cfg, None)
        .await
        .unwrap());
    assert!(s
        .registry_insert(Table::Providers, "p-a", cfg, None)
        .await
        .unwrap());
    assert!(!s
        .registry_insert(Table::Providers, "p-a", cfg, None)
        .await
        .unwrap());
    let ids: Vec<String> = s
        .registry_list(Table::Providers)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, ["p-B", "p-a"], "byte order");
    assert!(s
        .registry_update(Table::Providers, "p-a", "{}", Some("h"))
        .await
        .unwrap());
    assert!(!s
        .registry_update(Table::Providers, "zz", "{}", None)
        .await
        .unwrap());
    assert!(s.registry_delete(Table::Providers, "p-B").await.unwrap());
    assert!(!s.registry_delete(Table::Providers, "p-B").await.unwrap());

    s.registry_seed(Table::Agents, "bot", "{\"v\":1}", "h1")
        .await
        .unwrap();
    s.registry_update(Table::Agents, "bot", "{\"v\":2}", None)
        .await
        .unwrap();
    s.registry_seed(Table::Agents, "bot", "{\"v\":1}", "h1")
        .await
        .unwrap();
    let bot = &s.registry_list(Table::Agents).await.unwrap()[0];
    assert_eq!(
        bot.config, "{\"v\":2}",
        "an unchanged file entry keeps API edits"
    );
    s.registry_seed(Table::Agents, "bot", "{\"v\":3}", "h2")
        .await
        .unwrap();
    let bot = &s.registry_list(Table::Agents).await.unwrap()[0];
    assert_eq!(
        (bot.config.as_str(), bot.seed_hash.as_deref()),
        ("{\"v\":3}", Some("h2"))
    );

    assert_eq!(
        s.agent_set_suspended("bot", true).await.unwrap(),
        Some(true)
    );
    assert_eq!(
        s.agent_set_suspended("bot", true).await.unwrap(),
        Some(false)
    );
    assert!(s.registry_list(Table::Agents).await.unwrap()[0].suspended);
    assert_eq!(s.agent_set_suspended("ghost", true).await.unwrap(), None);
}

async fn memories_notes_and_search(s: Store) {
    session(&s, "k1", "alice").await;
    session(&s, "k2", "mallory").await;
    let docs = [
        "The weather in Paris is sunny",
        "weather weather weather report",
        "a much longer sentence that mentions the weather somewhere and Paris at its very end of it",
    ];
    let mut ids = Vec::new();
    for d in docs {
        ids.push(
            s.memory_insert("alice", "bot", Some("k1"), d, &["t".into()])
                .await
                .unwrap(),
        );
    }
    assert!(ids.windows(2).all(|w| w[1] > w[0]), "{ids:?}");
    s.memory_insert("mallory", "bot", Some("k2"), "Paris weather secret", &[])
        .await
        .unwrap();
    let hits = s
        .search_memories(&only("alice"), Some("bot"), "weather paris", 10)
        .await
        .unwrap();
    let order: Vec<i64> = hits.iter().map(|h| h.id).collect();
    assert_eq!(order, ids, "ranked as bm25 ranks them");
    assert!(hits.iter().all(|h| h.score >= 0.0 && h.tags == "[\"t\"]"));
    assert_eq!(
        s.search_memories(&all(), None, "secret", 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(s
        .search_memories(&only("alice"), None, "secret", 10)
        .await
        .unwrap()
        .is_empty());
    assert!(s
        .search_memories(&all(), None, "*** --", 10)
        .await
        .unwrap()
        .is_empty());
    assert!(s
        .search_memories(&all(), None, "OR NEAR ' | & ! :*", 10)
        .await
        .unwrap()
        .is_empty());

    let totals = TurnTotals::default();
    s.session_append("k1", &[msg("user", "Bonjour from Zürich")], &totals)
        .await
        .unwrap();
    s.session_append("k2", &[msg("user", "zürich is mine")], &totals)
        .await
        .unwrap();
    let hits = s
        .search_messages(&only("alice"), "ZÜRICH", 10)
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(
        (hits[0].session_key.as_str(), hits[0].agent_id.as_str()),
        ("k1", "bot")
    );
    assert!(hits[0].snippet.contains("Zürich"), "{}", hits[0].snippet);
    assert_eq!(
        s.search_messages(&all(), "zürich", 10).await.unwrap().len(),
        2
    );
    assert_eq!(
        s.search_messages(&all(), "zürich", 1).await.unwrap().len(),
        1
    );

    let n1 = s.note_add("k1", "first").await.unwrap();
    let n2 = s.note_add("k1", "second").await.unwrap();
    assert!(n2 > n1);
    let notes: Vec<String> = s
        .notes_list("k1")
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.note)
        .collect();
    assert_eq!(notes, ["first", "second"]);
    assert_eq!(s.memory_stats(&only("alice")).await.unwrap(), (3, 2, 1));
    assert_eq!(s.memory_stats(&all()).await.unwrap(), (4, 2, 2));
    assert_eq!(
        s.memory_delete_by_session(&only("mallory"), "k1")
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        s.memory_delete_by_session(&only("alice"), "k1")
            .await
            .unwrap(),
        3
    );
}

async fn usage_batches_and_figures(s: Store) {
    for i in 0..27i64 {
        s.usage_record(UsageRow {
            ts: i,
            agent_id: if i % 2 == 0 { "a" } else { "b" }.into(),
            provider: if i % 3 == 0 { "p1" } else { "p2" }.into(),
            model: format!("m{}", i % 2),
            operation: "chat".into(),
            cached_tokens: if i < 10 { 5 } else { 0 },
            ok: i != 26,
            ..UsageRow::default()
        })
        .unwrap();
    }
    let figures = s.usage_cache_figures(None, None).await.unwrap();
    let got: Vec<(String, i64, i64, i64)> = figures
        .into_iter()
        .map(|f| (f.provider, f.hits, f.misses, f.cached_tokens))
        .collect();
    // p1: i in {0,3,...,24} (9 rows; 26 is p2 and failed); hits i<10: 0,3,6,9.
    assert_eq!(got, [("p1".into(), 4, 5, 20), ("p2".into(), 6, 11, 30)]);
    let since = s.usage_cache_figures(Some("a"), Some(10)).await.unwrap();
    assert_eq!(since.iter().map(|f| f.hits).sum::<i64>(), 0);
    assert_eq!(
        s.usage_cached_by_model(None, None).await.unwrap(),
        [("m0".to_owned(), 25), ("m1".to_owned(), 25)]
    );
}

fn run(id: &str, at: i64) -> RunRow {
    RunRow {
        run_id: id.into(),
        root_run_id: id.into(),
        agent_id: "a".into(),
        session_key: "k".into(),
        task: "t".into(),
        status: "queued".into(),
        client_id: "webhook:m".into(),
        started_at: at,
        ..RunRow::default()
    }
}

async fn runs_claims_and_sweeps(s: Store) {
    let a = s.clone().for_node(Arc::from("node-a"));
    let b = s.clone().for_node(Arc::from("node-b"));
    let c = s.clone().for_node(Arc::from("node-c"));
    a.node_seen(1_000, 1_000).await.unwrap();
    b.node_seen(1_000, 1_000).await.unwrap();
    a.run_insert_queued(&run("qa", 1), "{}").await.unwrap();
    let mut busy = run("ra", 2);
    busy.status = "running".into();
    a.run_insert(&busy).await.unwrap();
    // node-a is alive: node-b takes nothing of it and sweeps nothing.
    assert!(b.runs_claim_queued(Some(500)).await.unwrap().is_empty());
    assert_eq!(
        b.runs_orphan_unresumable(2_000, Some(500)).await.unwrap(),
        0
    );
    // node-a is dead (not seen after 1_500): its queued run moves once, its running run ends.
    assert_eq!(
        b.runs_orphan_unresumable(2_000, Some(1_500)).await.unwrap(),
        1
    );
    let taken = b.runs_claim_queued(Some(1_500)).await.unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].row.run_id, "qa");
    b.node_seen(2_000, 1_000).await.unwrap();
    assert!(
        c.runs_claim_queued(Some(1_500)).await.unwrap().is_empty(),
        "b holds it and lives"
    );
    let ra = s.run_get(&all(), "ra").await.unwrap().unwrap();
    assert_eq!(ra.status, "orphaned");
    assert!(ra.error.is_some());
    b.run_mark_running("qa", 3_000).await.unwrap();
    let mut done = s.run_get(&all(), "qa").await.unwrap().unwrap();
    assert_eq!(done.status, "running");
    done.status = "completed".into();
    done.response = Some("fine\0".into());
    done.completed_at = Some(4_000);
    b.run_finish(&done).await.unwrap();
    let done = s.run_get(&only("webhook:m"), "qa").await.unwrap().unwrap();
    assert_eq!(done.response.as_deref(), Some("fine\u{FFFD}"));
    assert_eq!(s.run_get(&only("other"), "qa").await.unwrap(), None);
}

async fn webhook_deliveries(s: Store) {
    assert_eq!(
        s.webhook_delivery_seen("a", 0, 100, 3).await.unwrap(),
        Delivery::First
    );
    assert_eq!(
        s.webhook_delivery_seen("a", 99, 199, 3).await.unwrap(),
        Delivery::Repeat
    );
    assert_eq!(
        s.webhook_delivery_seen("a", 100, 200, 3).await.unwrap(),
        Delivery::First
    );
    for d in ["b", "c", "d"] {
        assert_eq!(
            s.webhook_delivery_seen(d, 101, 300, 3).await.unwrap(),
            Delivery::First
        );
    }
    assert_eq!(s.webhook_deliveries_count().await.unwrap(), 3, "bounded");
    s.webhook_delivery_forget("d").await.unwrap();
    assert_eq!(s.webhook_deliveries_count().await.unwrap(), 2);
    // Two recorders of one delivery at once: exactly one sees it first.
    let (x, y) = tokio::join!(
        s.webhook_delivery_seen("e", 101, 300, 10),
        s.webhook_delivery_seen("e", 101, 300, 10)
    );
    let mut got = [x.unwrap(), y.unwrap()];
    got.sort_by_key(|d| *d == Delivery::Repeat);
    assert_eq!(got, [Delivery::First, Delivery::Repeat]);
}
