//! Every store operation on both backends with the same assertions: each test body runs once
//! on a SQLite file and once on a fresh PostgreSQL database (the suite's throwaway server).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use super::graphs::{GraphRow, GraphRunRow, RunDeletion};
use super::obs::UsageWindow;
use super::registry::Table;
use super::runs::{Delivery, RunRow};
use super::sessions::{MessageRow, NewSession, SessionFilter, TurnTotals};
use super::usage::UsageRow;
use super::Store;
use crate::api::tenancy::Tenant;

/// `name::sqlite` and `name::postgres`, each running `name(store)` on a fresh database of
/// that backend (the store's other test modules use it too).
macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                let dir = tempfile::tempdir().unwrap();
                let store = $crate::store::Store::open(&dir.path().join("t.db")).await.unwrap();
                super::$name(store).await;
            }

            #[tokio::test]
            async fn postgres() {
                let url = $crate::store::pg_harness::database().await;
                let config = $crate::config::store::StoreConfig::default();
                let store = $crate::store::Store::connect_postgres(&url, &config)
                    .await
                    .unwrap();
                super::$name(store).await;
            }
        }
    )*};
}
pub(super) use both;

both!(
    sessions_and_transcripts,
    concurrent_appends_get_distinct_seq_numbers,
    registry_rows,
    memories_notes_and_search,
    usage_batches_and_figures,
    runs_claims_and_sweeps,
    webhook_deliveries,
    cron_claims_finish_and_release,
    heartbeat_coalescer,
    graphs_and_graph_runs,
    graph_owner_lookups,
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

/// A session `key` of agent `bot` owned by `tenant` (shared with the other store tests).
pub(super) async fn session(s: &Store, key: &str, tenant: &str) {
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
        ..TurnTotals::default()
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
            s.memory_insert_plain("alice", "bot", Some("k1"), d, &["t".into()])
                .await
                .unwrap(),
        );
    }
    assert!(ids.windows(2).all(|w| w[1] > w[0]), "{ids:?}");
    s.memory_insert_plain("mallory", "bot", Some("k2"), "Paris weather secret", &[])
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
    // Covering search: only entries holding at least `need` of the distinct words.
    let mut covering = Vec::new();
    for d in [
        "quokka wombat numbat",
        "Quokka numbat",
        "numbat only",
        "wombat",
    ] {
        covering.push(
            s.memory_insert_plain("carol", "bot", None, d, &[])
                .await
                .unwrap(),
        );
    }
    let ids = |hits: Vec<super::search::MemoryHit>| {
        let mut v: Vec<i64> = hits.iter().map(|h| h.id).collect();
        v.sort_unstable();
        v
    };
    let two = s
        .search_memories_covering(
            &only("carol"),
            None,
            "numbat QUOKKA wombat quokka",
            2,
            10,
            100,
        )
        .await
        .unwrap();
    assert_eq!(ids(two), covering[..2].to_vec(), "two of three words");
    let three = s
        .search_memories_covering(
            &only("carol"),
            Some("bot"),
            "numbat quokka wombat",
            3,
            10,
            100,
        )
        .await
        .unwrap();
    assert_eq!(ids(three), covering[..1].to_vec(), "all three words");
    let any = s
        .search_memories_covering(&only("carol"), None, "numbat quokka wombat", 1, 10, 100)
        .await
        .unwrap();
    assert_eq!(ids(any), covering, "any word");
    // The rank window: only the newest `window` matches are ranked (at it, and one short).
    let carol = only("carol");
    let window =
        |w: usize| s.search_memories_covering(&carol, None, "numbat quokka wombat", 1, 10, w);
    assert_eq!(ids(window(4).await.unwrap()), covering, "window = matches");
    assert_eq!(
        ids(window(3).await.unwrap()),
        covering[1..].to_vec(),
        "the oldest match is past the window"
    );

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
    assert_eq!(
        s.memory_stats(&all()).await.unwrap(),
        (8, 2, 2),
        "with carol's four"
    );
    assert_eq!(
        s.memory_delete_by_session(&only("mallory"), "k1")
            .await
            .unwrap()
            .len(),
        0
    );
    assert_eq!(
        s.memory_delete_by_session(&only("alice"), "k1")
            .await
            .unwrap()
            .len(),
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
    let window = |agent, since| UsageWindow {
        since,
        agent,
        ..UsageWindow::default()
    };
    let figures = s.usage_sums(window(None, None)).await.unwrap();
    let got: Vec<(String, i64, i64, i64)> = figures
        .into_iter()
        .map(|(p, f)| (p, f.cache_hits, f.calls - f.cache_hits, f.cached_tokens))
        .collect();
    // p1: i in {0,3,...,24} (9 rows; 26 is p2 and failed); hits i<10: 0,3,6,9.
    assert_eq!(got, [("p1".into(), 4, 5, 20), ("p2".into(), 6, 11, 30)]);
    let since = s.usage_sums(window(Some("a"), Some(10))).await.unwrap();
    assert_eq!(since.values().map(|f| f.cache_hits).sum::<i64>(), 0);
    assert_eq!(since.values().map(|f| f.calls).sum::<i64>(), 8);
    assert_eq!(
        s.usage_sums_of_session("none", None).await.unwrap().calls,
        0
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

fn job(id: &str, owner: &str, name: &str, due: i64) -> super::scheduler::JobRow {
    super::scheduler::JobRow {
        job_id: id.into(),
        owner: owner.into(),
        name: name.into(),
        agent_id: "bot".into(),
        message: "m".into(),
        kind: "interval".into(),
        schedule: r#"{"kind":"interval","everyMs":1000}"#.into(),
        anchor_at: 0,
        enabled: true,
        next_due_at: Some(due),
        created_at: 1,
        updated_at: 1,
        ..Default::default()
    }
}

async fn cron_claims_finish_and_release(s: Store) {
    use super::scheduler::{ClaimKind, FireOutcome};
    let a = s.clone().for_node("node-a".into());
    let b = s.clone().for_node("node-b".into());
    a.cron_insert(&job("job_1", "alice", "daily", 1000), 10)
        .await
        .unwrap();
    // Names are unique per owner, not across owners; the owner's job count is bounded.
    let dup = a
        .cron_insert(&job("job_2", "alice", "daily", 1000), 10)
        .await;
    assert!(
        matches!(dup, Err(crate::api::error::GatewayError::Conflict(_))),
        "{dup:?}"
    );
    a.cron_insert(&job("job_3", "bob", "daily", 5000), 10)
        .await
        .unwrap();
    let full = a.cron_insert(&job("job_4", "bob", "other", 5000), 1).await;
    assert!(
        matches!(full, Err(crate::api::error::GatewayError::Conflict(_))),
        "{full:?}"
    );
    assert_eq!(s.cron_earliest().await.unwrap(), Some(1000));
    assert_eq!(s.cron_list(&only("alice")).await.unwrap().len(), 1);
    assert_eq!(s.cron_list(&all()).await.unwrap().len(), 2);
    // Admin names a job by name (several owners: -32002 unless one is the admin's) or id.
    let several = s.cron_job(&all(), "root", "daily").await;
    assert!(matches!(
        several,
        Err(crate::api::error::GatewayError::Conflict(_))
    ));
    assert_eq!(
        s.cron_job(&all(), "bob", "daily")
            .await
            .unwrap()
            .unwrap()
            .job_id,
        "job_3"
    );
    assert_eq!(
        s.cron_job(&all(), "root", "job_1")
            .await
            .unwrap()
            .unwrap()
            .owner,
        "alice"
    );
    assert!(s
        .cron_job(&only("bob"), "bob", "job_1")
        .await
        .unwrap()
        .is_none());

    // Two nodes claim the same due time: exactly one wins.
    let j = s
        .cron_job(&only("alice"), "alice", "daily")
        .await
        .unwrap()
        .unwrap();
    let claim = ClaimKind::Scheduled {
        due: 1000,
        next: Some(2000),
    };
    let (ra, rb) = tokio::join!(
        a.cron_claim(&j, claim, "schedule", 1001),
        b.cron_claim(&j, claim, "schedule", 1001)
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert!(ra.is_some() != rb.is_some(), "{ra:?} {rb:?}");
    let won = ra.or(rb).unwrap();
    assert_eq!(won.due_at, 1000);
    // Firing: neither a second scheduled claim nor a force.
    assert!(a
        .cron_claim(&j, ClaimKind::Manual, "force", 1002)
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        s.cron_due(5000, None, 10).await.unwrap().len(),
        1,
        "only bob's is claimable"
    );
    // A stale finish (an older fencing token) does not release the job; the right one does.
    let stale = super::scheduler::Claimed {
        fire_seq: won.fire_seq - 1,
        ..won
    };
    let ok = FireOutcome {
        status: "ok",
        duration_ms: 5,
        ..Default::default()
    };
    a.cron_finish("job_1", stale, &ok, 200).await.unwrap();
    assert!(s
        .cron_job(&only("alice"), "alice", "daily")
        .await
        .unwrap()
        .unwrap()
        .running_since
        .is_some());
    a.cron_finish("job_1", won, &ok, 200).await.unwrap();
    let after = s
        .cron_job(&only("alice"), "alice", "daily")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((after.running_since, after.next_due_at), (None, Some(2000)));
    assert_eq!(after.last_status.as_deref(), Some("ok"));
    // The same due time never fires twice, even through a forced record of that instant.
    let again = ClaimKind::Scheduled {
        due: 1000,
        next: Some(2000),
    };
    assert!(a
        .cron_claim(&after, again, "schedule", 1003)
        .await
        .unwrap()
        .is_none());

    // A node that stops mid-fire: its claim is released and its record ends as an error.
    let c = a
        .cron_claim(
            &after,
            ClaimKind::Scheduled {
                due: 2000,
                next: Some(3000),
            },
            "schedule",
            2001,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.due_at, 2000);
    assert_eq!(
        b.scheduler_release_dead(2500, None).await.unwrap(),
        1,
        "on one node, only b is alive"
    );
    let fires = s.cron_fires_of("job_1").await.unwrap();
    assert_eq!(fires.len(), 2);
    assert_eq!(fires[1].status, "error");
    assert_eq!(fires[1].error.as_deref(), Some(super::scheduler::STOPPED));
    assert_eq!(fires[1].duration_ms, Some(499));
    // Finished fires are listed newest first; retention keeps the newest per job.
    let listed = s
        .cron_runs(&only("alice"), "daily", None, 10)
        .await
        .unwrap();
    assert_eq!(
        listed.iter().map(|f| f.due_at).collect::<Vec<_>>(),
        [2000, 1000]
    );
    assert!(s
        .cron_runs(&only("bob"), "daily", None, 10)
        .await
        .unwrap()
        .is_empty());
    let j = s
        .cron_job(&only("alice"), "alice", "daily")
        .await
        .unwrap()
        .unwrap();
    let c = a
        .cron_claim(&j, ClaimKind::Manual, "force", 2600)
        .await
        .unwrap()
        .unwrap();
    a.cron_finish("job_1", c, &ok, 2).await.unwrap();
    assert_eq!(
        s.cron_fires_of("job_1").await.unwrap().len(),
        2,
        "kept the newest 2"
    );
    // Removing the job keeps its runs.
    assert!(a.cron_delete("job_1").await.unwrap());
    assert_eq!(
        s.cron_runs(&only("alice"), "daily", None, 10)
            .await
            .unwrap()
            .len(),
        2
    );
    assert_eq!(s.cron_prune(10_000).await.unwrap(), 2);
}

async fn heartbeat_coalescer(s: Store) {
    let a = s.clone().for_node("node-a".into());
    // Wake, wake again (folded), claim, wake while running (queued), wake (folded).
    assert!(a.beat_wake("bot", "one", false, 100).await.unwrap());
    assert!(!a.beat_wake("bot", "two", false, 101).await.unwrap());
    a.beat_event("bot", "webhook:x", "event 1", 102)
        .await
        .unwrap();
    let row = a.beat("bot").await.unwrap().unwrap();
    assert_eq!(row.due(), Some(100));
    let claim = a.beat_claim(&row, None, 110).await.unwrap().unwrap();
    assert_eq!(claim.sources, ["one"]);
    assert_eq!(
        claim.events,
        [("webhook:x".to_owned(), "event 1".to_owned())]
    );
    // The row as read before the claim can no longer be claimed.
    assert!(a.beat_claim(&row, None, 111).await.unwrap().is_none());
    assert!(a.beat_wake("bot", "three", false, 112).await.unwrap());
    assert!(!a.beat_wake("bot", "four", false, 113).await.unwrap());
    let running = a.beat("bot").await.unwrap().unwrap();
    assert_eq!(running.due(), None, "not claimable while running");
    let failed = super::scheduler::BeatFinish {
        consecutive_errors: 1,
        backoff_until: Some(10_000),
        last_error_kind: Some("transient".into()),
        ..Default::default()
    };
    a.beat_finish("bot", claim.tick_seq, &failed, 120)
        .await
        .unwrap();
    let row = a.beat("bot").await.unwrap().unwrap();
    assert_eq!(
        row.due(),
        Some(10_000),
        "the queued wake waits out the backoff"
    );
    // A trigger bypasses the backoff, but one is queued already.
    assert!(!a.beat_wake("bot", "trigger", true, 130).await.unwrap());
    // Events are bounded per agent.
    for i in 0..(super::scheduler::MAX_EVENTS + 5) {
        a.beat_event("bot", "s", &format!("e{i}"), 200 + i)
            .await
            .unwrap();
    }
    let claim = a
        .beat_claim(&row, Some(50_000), 20_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claim.events.len() as i64, super::scheduler::MAX_EVENTS);
    assert_eq!(claim.events[0].1, "e5");
    // Scheduled ticks: a schedule change clears a permanent stop.
    a.beat_schedule("bot", Some(60_000), true, 20_001)
        .await
        .unwrap();
    let row = a.beat("bot").await.unwrap().unwrap();
    assert_eq!(row.next_due_at, Some(60_000));
    assert!(row.running_since.is_some());
    assert_eq!(s.scheduler_release_dead(30_000, None).await.unwrap(), 0);
    let row = a.beat("bot").await.unwrap().unwrap();
    assert!(
        row.running_since.is_none(),
        "a dead node's tick is released"
    );
    assert_eq!(row.due(), Some(60_000));
}

fn graph(owner: &str, id: &str, at: i64) -> GraphRow {
    GraphRow {
        owner: owner.into(),
        id: id.into(),
        label: format!("{owner} {id}"),
        agent_id: None,
        definition: r#"{"nodes":[],"edges":[]}"#.into(),
        node_count: 0,
        created_at: at,
        updated_at: at,
    }
}

fn graph_run(id: &str, owner: &str, status: &str, created_at: i64) -> GraphRunRow {
    GraphRunRow {
        run_id: id.into(),
        owner: owner.into(),
        definition_id: Some("g1".into()),
        label: Some("nightly".into()),
        status: status.into(),
        node_count: 2,
        created_at,
        nodes: "{}".into(),
        ..GraphRunRow::default()
    }
}

async fn graphs_and_graph_runs(s: Store) {
    // A save creates, a second save of (owner, id) updates and keeps created_at.
    let mut g = graph("alice", "g1", 100);
    assert!(s.graph_save(&g).await.unwrap());
    g.label = "renamed\0".into();
    g.agent_id = Some("bot".into());
    g.definition = r#"{"nodes":[{"id":"n1"}],"edges":[]}"#.into();
    g.node_count = 1;
    g.created_at = 999;
    g.updated_at = 200;
    assert!(!s.graph_save(&g).await.unwrap());
    let got = s.graph_get("alice", "g1").await.unwrap().unwrap();
    assert_eq!(
        got,
        GraphRow {
            label: "renamed\u{FFFD}".into(),
            created_at: 100,
            ..g.clone()
        }
    );
    // Ids are per owner: bob's g1 is another graph, and saving it leaves alice's alone.
    assert!(s.graph_save(&graph("bob", "g1", 50)).await.unwrap());
    assert_eq!(
        s.graph_get("bob", "g1").await.unwrap().unwrap().label,
        "bob g1"
    );
    assert_eq!(s.graph_get("alice", "g1").await.unwrap().unwrap(), got);
    assert_eq!(s.graph_get("carol", "g1").await.unwrap(), None);

    // Most recently updated first; equal times in byte order of the id.
    for (id, at) in [("g2", 300), ("g0", 200), ("G3", 200)] {
        assert!(s.graph_save(&graph("alice", id, at)).await.unwrap());
    }
    let ids = |rows: &[GraphRow]| rows.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
    let (page, total) = s.graph_list("alice", 10, 0).await.unwrap();
    assert_eq!(
        (ids(&page), total),
        (
            vec!["g2", "G3", "g0", "g1"]
                .into_iter()
                .map(String::from)
                .collect(),
            4
        )
    );
    let (page, total) = s.graph_list("alice", 2, 1).await.unwrap();
    assert_eq!(ids(&page), ["G3", "g0"]);
    assert_eq!(total, 4);
    let (page, total) = s.graph_list("alice", 10, 10).await.unwrap();
    assert!(page.is_empty());
    assert_eq!(total, 4);
    let (page, total) = s.graph_list("bob", 10, 0).await.unwrap();
    assert_eq!((ids(&page), total), (vec!["g1".to_owned()], 1));
    assert_eq!(s.graph_count("bob").await.unwrap(), 1);
    assert_eq!(s.graph_count("carol").await.unwrap(), 0);

    assert!(s.graph_delete("alice", "g0").await.unwrap());
    assert!(!s.graph_delete("alice", "g0").await.unwrap());
    assert!(!s.graph_delete("carol", "g1").await.unwrap());
    assert_eq!(s.graph_count("alice").await.unwrap(), 3);
    assert!(s.graph_get("bob", "g1").await.unwrap().is_some());

    // Runs, held by the node that inserts them.
    let me = s.clone().for_node(Arc::from("node-a"));
    let other = s.clone().for_node(Arc::from("node-b"));
    me.node_seen(1_000, 1_000).await.unwrap();
    other.node_seen(1_000, 1_000).await.unwrap();
    let gr1 = graph_run("gr1", "alice", "running", 10);
    me.graph_run_insert(&gr1).await.unwrap();
    other
        .graph_run_insert(&graph_run("gr2", "alice", "pending", 20))
        .await
        .unwrap();
    let mut gr3 = graph_run("gr3", "bob", "completed", 30);
    gr3.completed_at = Some(35);
    me.graph_run_insert(&gr3).await.unwrap();
    let mut gr4 = graph_run("gr4", "alice", "failed", 20);
    gr4.completed_at = Some(5);
    gr4.error = Some("n1 failed".into());
    me.graph_run_insert(&gr4).await.unwrap();

    // Reach: the owner and admin; another tenant gets nothing.
    assert_eq!(
        s.graph_run_get(&only("alice"), "gr1").await.unwrap(),
        Some(gr1.clone())
    );
    assert_eq!(
        s.graph_run_get(&all(), "gr1").await.unwrap(),
        Some(gr1.clone())
    );
    assert_eq!(s.graph_run_get(&only("bob"), "gr1").await.unwrap(), None);
    assert_eq!(s.graph_run_get(&all(), "nope").await.unwrap(), None);

    // An update writes progress, never the owner or the cancel flag; a final status is kept.
    let mut u = gr1.clone();
    u.started_at = Some(11);
    u.completed_nodes = 1;
    u.artifact_count = 2;
    u.nodes = r#"{"n1":"completed"}"#.into();
    u.owner = "mallory".into();
    u.cancel_requested = true;
    assert!(me.graph_run_update(&u).await.unwrap());
    let got = s.graph_run_get(&all(), "gr1").await.unwrap().unwrap();
    assert_eq!(
        got,
        GraphRunRow {
            owner: "alice".into(),
            cancel_requested: false,
            ..u.clone()
        }
    );
    u.status = "completed".into();
    u.completed_nodes = 2;
    u.completed_at = Some(40);
    assert!(me.graph_run_update(&u).await.unwrap());
    let mut late = u.clone();
    late.status = "failed".into();
    late.error = Some("too late".into());
    assert!(!me.graph_run_update(&late).await.unwrap());
    let got = s.graph_run_get(&all(), "gr1").await.unwrap().unwrap();
    assert_eq!((got.status.as_str(), got.error), ("completed", None));
    assert!(!me
        .graph_run_update(&graph_run("nope", "alice", "running", 1))
        .await
        .unwrap());

    // Listings: newest first, ties by run id descending, with the total within reach.
    let run_ids = |rows: &[GraphRunRow]| rows.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>();
    let (page, total) = s.graph_runs_list(&all(), 10, 0).await.unwrap();
    assert_eq!(run_ids(&page), ["gr3", "gr4", "gr2", "gr1"]);
    assert_eq!(total, 4);
    let (page, total) = s.graph_runs_list(&only("alice"), 10, 0).await.unwrap();
    assert_eq!(run_ids(&page), ["gr4", "gr2", "gr1"]);
    assert_eq!(total, 3);
    let (page, total) = s.graph_runs_list(&only("alice"), 1, 1).await.unwrap();
    assert_eq!(run_ids(&page), ["gr2"]);
    assert_eq!(total, 3);
    let (page, total) = s.graph_runs_list(&only("carol"), 10, 0).await.unwrap();
    assert!(page.is_empty());
    assert_eq!(total, 0);
    // Recent: the live ones, and those that ended at or after `since`.
    let recent = |t: Tenant, since: i64| {
        let s = s.clone();
        async move { run_ids(&s.graph_runs_recent(&t, since).await.unwrap()) }
    };
    assert_eq!(recent(all(), 36).await, ["gr2", "gr1"]);
    assert_eq!(recent(all(), 35).await, ["gr3", "gr2", "gr1"]);
    assert_eq!(recent(all(), 41).await, ["gr2"]);
    assert_eq!(recent(only("bob"), 35).await, ["gr3"]);
    assert_eq!(recent(only("alice"), 0).await, ["gr4", "gr2", "gr1"]);

    // Deletion: a live run stays; another tenant's or an unknown run is Missing.
    assert_eq!(
        s.graph_run_delete(&only("alice"), "gr2").await.unwrap(),
        RunDeletion::Live
    );
    assert!(s.graph_run_get(&all(), "gr2").await.unwrap().is_some());
    assert_eq!(
        s.graph_run_delete(&only("bob"), "gr1").await.unwrap(),
        RunDeletion::Missing
    );
    assert_eq!(
        s.graph_run_delete(&all(), "nope").await.unwrap(),
        RunDeletion::Missing
    );
    assert_eq!(
        s.graph_run_delete(&only("alice"), "gr1").await.unwrap(),
        RunDeletion::Deleted
    );
    assert_eq!(s.graph_run_get(&all(), "gr1").await.unwrap(), None);
    assert_eq!(
        s.graph_run_delete(&only("alice"), "gr1").await.unwrap(),
        RunDeletion::Missing
    );
    assert_eq!(
        s.graph_run_delete(&all(), "gr3").await.unwrap(),
        RunDeletion::Deleted
    );

    // A cancel request reaches a live run and names its holder; an ended run has none.
    assert!(!s.graph_run_cancel_requested("gr2").await.unwrap());
    assert_eq!(
        s.graph_run_request_cancel("gr2").await.unwrap(),
        Some(Some("node-b".to_owned()))
    );
    assert!(s.graph_run_cancel_requested("gr2").await.unwrap());
    assert!(
        s.graph_run_get(&all(), "gr2")
            .await
            .unwrap()
            .unwrap()
            .cancel_requested
    );
    assert_eq!(s.graph_run_request_cancel("gr4").await.unwrap(), None);
    assert!(!s.graph_run_cancel_requested("gr4").await.unwrap());
    assert_eq!(s.graph_run_request_cancel("nope").await.unwrap(), None);
    assert!(!s.graph_run_cancel_requested("nope").await.unwrap());

    assert_eq!(s.graph_runs_live_count("alice").await.unwrap(), 1);
    assert_eq!(s.graph_runs_live_count("bob").await.unwrap(), 0);

    // Orphans: node-b is alive, then dead; a run this node holds is never swept.
    me.graph_run_insert(&graph_run("gr5", "alice", "running", 50))
        .await
        .unwrap();
    assert_eq!(s.graph_runs_live_count("alice").await.unwrap(), 2);
    assert_eq!(me.graph_runs_orphan(2_000, Some(500)).await.unwrap(), 0);
    assert_eq!(me.graph_runs_orphan(2_000, Some(1_500)).await.unwrap(), 1);
    let gr2 = s.graph_run_get(&all(), "gr2").await.unwrap().unwrap();
    assert_eq!(gr2.status, "failed");
    assert_eq!(gr2.completed_at, Some(2_000));
    assert_eq!(
        gr2.error.as_deref(),
        Some("the gateway stopped before the run ended")
    );
    assert_eq!(s.graph_run_request_cancel("gr2").await.unwrap(), None);
    let gr5 = s.graph_run_get(&all(), "gr5").await.unwrap().unwrap();
    assert_eq!(gr5.status, "running");
    // One process (SQLite): only this node counts as alive, so node-a's run is swept.
    assert_eq!(other.graph_runs_orphan(3_000, None).await.unwrap(), 1);
    assert_eq!(
        s.graph_run_get(&all(), "gr5")
            .await
            .unwrap()
            .unwrap()
            .status,
        "failed"
    );
    assert_eq!(s.graph_runs_live_count("alice").await.unwrap(), 0);
    assert_eq!(other.graph_runs_orphan(3_000, None).await.unwrap(), 0);
}

async fn graph_owner_lookups(s: Store) {
    use crate::api::generated::methods::RecordKind;
    use crate::api::tenancy::{Lookup, Owners};
    s.graph_save(&graph("alice", "g1", 1)).await.unwrap();
    s.graph_run_insert(&graph_run("gr1", "alice", "running", 1))
        .await
        .unwrap();
    let missing = Lookup::Missing { namespace: None };
    // A graph run is found within its owner's runs only: another tenant's is missing, as
    // one nobody has (graph.deleteRun claims both alike).
    assert_eq!(
        s.lookup(RecordKind::GraphRun, "gr1", &only("alice"))
            .await
            .unwrap(),
        Lookup::Exists(Some("alice".into()))
    );
    assert_eq!(
        s.lookup(RecordKind::GraphRun, "gr1", &only("bob"))
            .await
            .unwrap(),
        missing
    );
    assert_eq!(
        s.lookup(RecordKind::GraphRun, "nope", &only("bob"))
            .await
            .unwrap(),
        missing
    );
    // A graph id names the caller's own graph only.
    assert_eq!(
        s.lookup(RecordKind::Graph, "g1", &only("alice"))
            .await
            .unwrap(),
        Lookup::Exists(Some("alice".into()))
    );
    assert_eq!(
        s.lookup(RecordKind::Graph, "g1", &only("bob"))
            .await
            .unwrap(),
        missing
    );
    s.graph_save(&graph("bob", "g1", 2)).await.unwrap();
    assert_eq!(
        s.lookup(RecordKind::Graph, "g1", &only("bob"))
            .await
            .unwrap(),
        Lookup::Exists(Some("bob".into()))
    );
    assert_eq!(
        s.lookup(RecordKind::Graph, "g2", &only("alice"))
            .await
            .unwrap(),
        missing
    );
}
