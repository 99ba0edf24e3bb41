//! Local model benchmark: time to first token and generation speed of the chat model
//! (greedy), load times, and embedding throughput, on the models in the model cache.
//!
//! `cargo bench --bench local_model` (release) or `cargo bench --profile dev --bench local_model`.
//! `LOCAL_BENCH_WEIGHTS=q4_1|q8_0|f32` picks how the chat weights are held (default f32).

use std::path::Path;
use std::time::{Duration, Instant};

use agent_gateway::providers::local::chat::{ChatModel, WeightFormat};
use agent_gateway::providers::local::default_cache_dir;
use agent_gateway::providers::local::embed::EmbedModel;
use agent_gateway::providers::local::fetch::{find_all_installed, CHAT_GGUF};
use agent_gateway::providers::{ChatMessage, ChatRequest};
use tokio_util::sync::CancellationToken;

const RUNS: usize = 3;

struct Run {
    prompt_tokens: usize,
    output_tokens: u64,
    ttft: Duration,
    decode_tps: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn run_once(model: &ChatModel, req: &ChatRequest) -> Result<Run, String> {
    let max_new = ChatModel::max_new_tokens(req);
    let prompt = model
        .build_prompt(req, max_new)
        .map_err(|e| e.to_string())?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let cancel = CancellationToken::new();
    let start = Instant::now();
    let (resp, first, last) = std::thread::scope(|s| {
        let gen = s.spawn(|| {
            let mut weights = model.weights.blocking_lock();
            let r = model.generate(
                &mut weights,
                &prompt,
                max_new,
                None,
                Some(&tx.clone().into()),
                &cancel,
            );
            drop(tx);
            r
        });
        let mut first = None;
        let mut last = start;
        while rx.blocking_recv().is_some() {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
        }
        (gen.join(), first, last)
    });
    let resp = resp
        .map_err(|_| "generation thread panicked".to_string())?
        .map_err(|e| e.to_string())?;
    let first = first.ok_or("no text was generated")?;
    let decode_secs = (last - first).as_secs_f64();
    let decode_tps = if resp.usage.output > 1 && decode_secs > 0.0 {
        (resp.usage.output - 1) as f64 / decode_secs
    } else {
        0.0
    };
    Ok(Run {
        prompt_tokens: prompt.len(),
        output_tokens: resp.usage.output,
        ttft: first - start,
        decode_tps,
    })
}

fn main() -> Result<(), String> {
    let cache = default_cache_dir();
    let [chat_pkg, embed_pkg] = find_all_installed(&cache).map_err(|e| {
        format!(
            "{e}: fill the cache first (cargo test --test suite engine::local_model:: -- --ignored fetch_models)"
        )
    })?;
    let format = match std::env::var("LOCAL_BENCH_WEIGHTS").as_deref() {
        Ok("q4_1") => WeightFormat::AsStored,
        Ok("q8_0") => WeightFormat::Q8_0,
        _ => WeightFormat::F32,
    };
    let profile = if cfg!(debug_assertions) {
        "dev"
    } else {
        "release"
    };
    println!(
        "profile {profile}, weights {format:?}, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let t = Instant::now();
    let model = ChatModel::load_with(&chat_pkg.file(CHAT_GGUF), format)?;
    println!("chat model load: {:.2} s", t.elapsed().as_secs_f64());

    let req = ChatRequest {
        model: String::new(),
        system: Some("You are a storyteller.".to_string()),
        messages: vec![ChatMessage::user(
            "Tell me a long story about a knight and a dragon.",
        )],
        tools: Vec::new(),
        max_tokens: Some(128),
        temperature: None,
    };
    run_once(&model, &req)?; // warm-up
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        runs.push(run_once(&model, &req)?);
    }
    let ttft_ms = median(runs.iter().map(|r| r.ttft.as_secs_f64() * 1000.0).collect());
    let tps = median(runs.iter().map(|r| r.decode_tps).collect());
    println!(
        "chat: prompt {} tokens, {} output tokens; time to first token {ttft_ms:.0} ms, generation {tps:.1} tokens/s (median of {RUNS})",
        runs.first().map_or(0, |r| r.prompt_tokens),
        runs.first().map_or(0, |r| r.output_tokens),
    );

    let t = Instant::now();
    let embed = EmbedModel::load(Path::new(&embed_pkg.dir))?;
    println!("embedding model load: {:.2} s", t.elapsed().as_secs_f64());
    let inputs: Vec<String> = (0..64)
        .map(|i| format!("Sentence number {i} talks about the weather, the sea and a small boat."))
        .collect();
    let cancel = CancellationToken::new();
    embed
        .embed(&inputs[..8], &cancel)
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    embed.embed(&inputs, &cancel).map_err(|e| e.to_string())?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "embeddings: {} short inputs in {:.0} ms ({:.0} inputs/s)",
        inputs.len(),
        secs * 1000.0,
        inputs.len() as f64 / secs
    );
    Ok(())
}
