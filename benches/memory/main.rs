//! Memory recall at scale, in process on the release build: 100,000 entries of one agent in a
//! real SQLite file (generated text over two vocabularies, unit 384-dimensional vectors), then
//! hybrid recall as the gateway runs it - the keyword lane (FTS5 bm25) and the vector lane (the
//! in-memory index) together through `memory::recall::run_lanes`, rank fusion, and reading the
//! chosen rows - timed per query (p50, p99). Also: the cost of storing
//! an entry (which never waits for its embedding), memory per entry, and the local embedding
//! model's throughput when its files are in the model cache. See README.md.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use agent_gateway::api::tenancy::Tenant;
use agent_gateway::config::memory::MEMORY_RANK_WINDOW;
use agent_gateway::runtime::memory::index::VectorIndex;
use agent_gateway::runtime::memory::recall::{run_lanes, LaneQuery};
use agent_gateway::runtime::memory::{fuse, keyword_text};
use agent_gateway::store::memory::NewMemory;
use agent_gateway::store::Store;

const DIMS: usize = 384;
const WORDS: &[&str] = &[
    "cat",
    "dog",
    "flight",
    "train",
    "lisbon",
    "porto",
    "coffee",
    "tea",
    "meeting",
    "doctor",
    "dentist",
    "birthday",
    "sister",
    "brother",
    "garden",
    "piano",
    "guitar",
    "laptop",
    "phone",
    "invoice",
    "budget",
    "project",
    "holiday",
    "recipe",
    "allergy",
    "running",
    "yoga",
    "book",
    "movie",
    "music",
    "office",
    "manager",
    "deadline",
    "password",
    "bank",
    "insurance",
    "car",
    "bicycle",
    "weather",
    "snow",
    "beach",
    "mountain",
    "hotel",
    "museum",
    "restaurant",
    "pizza",
    "sushi",
    "salad",
    "vitamin",
    "appointment",
];

fn unit(rng: &mut fastrand::Rng) -> Vec<f32> {
    let mut v: Vec<f32> = (0..DIMS).map(|_| rng.f32() - 0.5).collect();
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= n);
    v
}

/// Where the words of generated text come from.
enum Vocabulary {
    /// The 50 words of [`WORDS`], equally likely: every word is in about 15% of the entries,
    /// the worst case for the keyword lane.
    Uniform,
    /// 20,000 made-up words with Zipf frequencies (the k-th most common word 1/k as likely as
    /// the first), as words are spread in natural text; cumulative weights.
    Zipf(Vec<String>, Vec<f64>),
}

impl Vocabulary {
    fn zipf(n: usize) -> Self {
        const SYLLABLES: &[&str] = &[
            "ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "be", "da", "fi", "go", "hu", "ja",
            "pe", "zo",
        ];
        let words = (0..n)
            .map(|i| {
                let (a, b, c) = (i % 16, (i / 16) % 16, i / 256);
                format!("{}{}{}{c}", SYLLABLES[a], SYLLABLES[b], SYLLABLES[c % 16])
            })
            .collect();
        let mut acc = 0.0;
        let cumulative = (1..=n)
            .map(|k| {
                acc += 1.0 / k as f64;
                acc
            })
            .collect();
        Vocabulary::Zipf(words, cumulative)
    }

    fn word<'a>(&'a self, rng: &mut fastrand::Rng) -> &'a str {
        match self {
            Vocabulary::Uniform => WORDS[rng.usize(..WORDS.len())],
            Vocabulary::Zipf(words, cumulative) => {
                let x = rng.f64() * cumulative[cumulative.len() - 1];
                let i = cumulative.partition_point(|c| *c < x);
                &words[i.min(words.len() - 1)]
            }
        }
    }

    fn sentence(&self, rng: &mut fastrand::Rng, n: usize) -> String {
        let mut s = String::from("The user");
        for _ in 0..n {
            s.push(' ');
            s.push_str(self.word(rng));
        }
        s
    }
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e3
}

fn p50_p99(v: &mut [Duration]) -> String {
    format!("p50 {:.2} ms, p99 {:.2} ms", pct(v, 0.5), pct(v, 0.99))
}

/// Loads `n` entries of one agent drawn from `vocab` (with random unit vectors), then times
/// storing and recall as the gateway runs them.
async fn corpus(label: &str, vocab: &Vocabulary, n: usize, queries: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("gateway.db")).await.unwrap();
    let mut rng = fastrand::Rng::with_seed(7);
    let tenant = Tenant::offline("bench");
    let mut index = VectorIndex::new();

    let t = Instant::now();
    let mut done = 0;
    while done < n {
        let batch = (n - done).min(1000);
        let texts: Vec<String> = (0..batch).map(|_| vocab.sentence(&mut rng, 8)).collect();
        let tags: Vec<String> = Vec::new();
        let news: Vec<NewMemory<'_>> = texts
            .iter()
            .map(|c| NewMemory {
                agent_id: "a0",
                session_key: None,
                content: c,
                tags: &tags,
                memory_type: "semantic",
                trust_level: "learned",
                pinned: false,
                created_at: 1,
            })
            .collect();
        let ids = store
            .memory_insert_many("bench", &news, u64::MAX)
            .await
            .unwrap();
        let vectors: Vec<(i64, Vec<f32>)> = ids.iter().map(|id| (*id, unit(&mut rng))).collect();
        store
            .memory_set_embeddings("bench/vec", &vectors)
            .await
            .unwrap();
        for (id, v) in &vectors {
            index.upsert("bench", "a0", *id, v);
        }
        done += batch;
    }
    let load = t.elapsed();
    let db_bytes = store.size_bytes().await.unwrap();
    println!("\n## {label}");
    println!(
        "generated {n} entries in {:.1} s; database {:.0} B/entry; vector index {:.0} B/entry",
        load.as_secs_f64(),
        db_bytes as f64 / n as f64,
        index.approx_bytes() as f64 / n as f64
    );

    // Storing one entry: the row and its full-text index; the embedding is queued, never
    // awaited (the gateway's write path).
    let mut store_times = Vec::new();
    for _ in 0..200 {
        let c = vocab.sentence(&mut rng, 8);
        let t = Instant::now();
        store
            .memory_insert(
                "bench",
                &NewMemory {
                    agent_id: "a0",
                    session_key: None,
                    content: &c,
                    tags: &[],
                    memory_type: "semantic",
                    trust_level: "learned",
                    pinned: false,
                    created_at: 1,
                },
                u64::MAX,
            )
            .await
            .unwrap();
        store_times.push(t.elapsed());
    }
    println!("store one entry: {}", p50_p99(&mut store_times));

    // Hybrid recall as Engine::memory_recall runs it (the query's vector given, as the
    // embedding cache gives a repeated query's): both lanes concurrently, fusion, the rows.
    let index = std::sync::RwLock::new(index);
    let (mut total, mut keyword_only) = (Vec::new(), Vec::new());
    let mut found = 0usize;
    for _ in 0..queries {
        let q = keyword_text(&vocab.sentence(&mut rng, 3));
        let qv = std::sync::Arc::new(unit(&mut rng));
        let t0 = Instant::now();
        let hybrid = LaneQuery {
            tenant_id: "bench",
            agent: Some("a0"),
            words: &q,
            candidates: 50,
            rank_window: MEMORY_RANK_WINDOW,
            min_similarity: -1.0,
            strict: true,
        };
        let (hits, vector) = run_lanes(&store, &index, &hybrid, async { Some(qv) })
            .await
            .unwrap();
        let fts: Vec<i64> = hits.iter().map(|h| h.id).collect();
        let vector: Vec<i64> = vector.unwrap().into_iter().map(|(id, _)| id).collect();
        let fused = fuse::rrf(&[&fts, &vector]);
        let ids: Vec<i64> = fused.iter().take(10).map(|(id, _)| *id).collect();
        let rows = store.memory_rows(&tenant, &ids).await.unwrap();
        assert!(!rows.is_empty());
        total.push(t0.elapsed());
        found += fts.len();

        // Keyword-only recall (no embedding model loaded): every entry with any word ranks.
        let t0 = Instant::now();
        let keyword = LaneQuery {
            strict: false,
            ..hybrid
        };
        let (hits, _) = run_lanes(&store, &index, &keyword, async { None })
            .await
            .unwrap();
        let ids: Vec<i64> = hits.iter().take(10).map(|h| h.id).collect();
        store.memory_rows(&tenant, &ids).await.unwrap();
        keyword_only.push(t0.elapsed());
    }
    println!(
        "hybrid recall over {n} entries ({queries} queries of 3 words): {} \
         ({:.1} keyword candidates per query)",
        p50_p99(&mut total),
        found as f64 / queries as f64
    );
    println!("keyword-only recall: {}", p50_p99(&mut keyword_only));
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("MEMORY_BENCH_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let queries: usize = std::env::var("MEMORY_BENCH_QUERIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    corpus(
        "Zipf vocabulary of 20,000 words",
        &Vocabulary::zipf(20_000),
        n,
        queries,
    )
    .await;
    corpus(
        "uniform vocabulary of 50 words (worst case)",
        &Vocabulary::Uniform,
        n,
        queries,
    )
    .await;
    let mut rng = fastrand::Rng::with_seed(11);

    // The local embedding model, when its files are in the cache (no download here).
    use agent_gateway::providers::local::{
        default_cache_dir, LocalOptions, LocalProvider, EMBED_MODEL_ID,
    };
    use agent_gateway::providers::Provider;
    let opts = LocalOptions {
        cache_dir: default_cache_dir(),
        auto_fetch: false,
        python: "python3".into(),
        threads: None,
    };
    if agent_gateway::providers::local::fetch::find_all_installed(&opts.cache_dir).is_err() {
        println!("local embedding model not in the cache: throughput not measured");
        return;
    }
    let provider = LocalProvider::new(opts);
    provider.start();
    provider.wait_ready(Duration::from_secs(600)).await.unwrap();
    let texts: Vec<String> = (0..512)
        .map(|_| Vocabulary::Uniform.sentence(&mut rng, 12))
        .collect();
    let cancel = tokio_util::sync::CancellationToken::new();
    let t = Instant::now();
    provider
        .embed(EMBED_MODEL_ID, &texts[..16], &cancel)
        .await
        .unwrap();
    let warm = t.elapsed();
    let t = Instant::now();
    provider
        .embed(EMBED_MODEL_ID, &texts, &cancel)
        .await
        .unwrap();
    let el = t.elapsed();
    let mut one = Vec::new();
    for q in texts.iter().take(50) {
        let t = Instant::now();
        provider
            .embed(EMBED_MODEL_ID, std::slice::from_ref(q), &cancel)
            .await
            .unwrap();
        one.push(t.elapsed());
    }
    println!(
        "local embeddings ({EMBED_MODEL_ID}): {:.0} entries/s in batches (512 entries in {:.2} s, warm-up {:.0} ms); one query p50 {:.1} ms, p99 {:.1} ms",
        texts.len() as f64 / el.as_secs_f64(),
        el.as_secs_f64(),
        warm.as_secs_f64() * 1e3,
        pct(&mut one, 0.5),
        pct(&mut one, 0.99)
    );
}
