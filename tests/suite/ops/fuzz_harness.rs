//! The fuzz targets in CI, on the stable toolchain and in bounded time: every target replays
//! its whole corpus (`fuzz/corpus/<target>/`), then a bounded number of random mutations of it,
//! under the same properties as `cargo fuzz` (`fuzz/src/props.rs`, included here).
//!
//! The mutation seed is random per run and printed with any failure; `FUZZ_SEED=<n>` replays a
//! run and `FUZZ_ITERATIONS=<n>` changes the number of mutations per target.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;

use futures_util::FutureExt;

#[path = "../../../fuzz/src/props.rs"]
mod props;

/// Mutations per target when `FUZZ_ITERATIONS` is not set: a few seconds in all (debug build).
const ITERATIONS: usize = 5_000;
/// The envelope runs real handlers, so it gets fewer.
const ENVELOPE_ITERATIONS: usize = 2_000;
/// Longest mutated input (libFuzzer's default `-max_len` is 4096 too).
const MAX_LEN: usize = 4096;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Byte strings that matter to the parsers under test; spliced in by the mutator.
const TOKENS: &[&[u8]] = &[
    b"{{",
    b"}}",
    b"[",
    b"]",
    b"{",
    b"}",
    b"\"",
    b".",
    b"..",
    b"/",
    b"\\",
    b",",
    b":",
    b"=",
    b"\xff",
    b"\x00",
    b"null",
    b"\"jsonrpc\":\"2.0\"",
    b"\"id\":",
    b"\"method\":\"system.ping\"",
    b"\"params\":",
    b"payload.",
    b"headers.",
    b"query.",
    b"sha256=",
    b"sha512=",
    b"1700000000",
    b"-9223372036854775808",
    b"18446744073709551616",
    b"\xc3\xa9",
    b"\xe2\x82\xac",
    b"\xf0\x9f\x98\x80",
    b" and ",
    b"'",
    b"<=",
    b"!=",
    // look-alike letters and invisibles, for the memory guard
    "ɪɢɴᴏʀᴇ".as_bytes(),
    "ⁱⁿˢᵗʳᵘᶜᵗⁱᵒⁿˢ".as_bytes(),
    "ⅰ".as_bytes(),
    "ո".as_bytes(),
    "ℯ".as_bytes(),
    "\u{200B}".as_bytes(),
    "\u{E000}".as_bytes(),
    b" previous instructions",
];

/// One mutation of a corpus item: a few random edits (libFuzzer's kinds, in small).
fn mutate(rng: &mut fastrand::Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut data = corpus[rng.usize(..corpus.len())].clone();
    for _ in 0..rng.usize(1..=4) {
        let len = data.len();
        match rng.u8(..7) {
            0 if len > 0 => {
                let i = rng.usize(..len);
                data[i] ^= 1 << rng.u8(..8);
            }
            1 => {
                let i = rng.usize(..=len);
                data.insert(i, rng.u8(..));
            }
            2 if len > 0 => {
                let start = rng.usize(..len);
                let end = rng.usize(start..=len.min(start + 16));
                data.drain(start..end);
            }
            3 if len > 0 => {
                let start = rng.usize(..len);
                let end = rng.usize(start..=len);
                let piece = data[start..end].to_vec();
                let at = rng.usize(..=len);
                data.splice(at..at, piece);
            }
            4 => {
                let other = &corpus[rng.usize(..corpus.len())];
                let start = rng.usize(..=other.len());
                let end = rng.usize(start..=other.len());
                let at = rng.usize(..=len);
                data.splice(at..at, other[start..end].iter().copied());
            }
            5 if len > 0 => {
                let i = rng.usize(..len);
                data[i] = *[b'0', b'9', b'a', b'f', b'"', b'{', b'[', 0x7f, 0x80, 0xff]
                    .get(rng.usize(..10))
                    .unwrap();
            }
            _ => {
                let token = TOKENS[rng.usize(..TOKENS.len())];
                let at = rng.usize(..=len);
                data.splice(at..at, token.iter().copied());
            }
        }
    }
    data.truncate(MAX_LEN);
    data
}

/// Runs `check` on every corpus item, then on `iterations` mutations; a failure names the
/// input (escaped) and the seed that replays it.
async fn run<F, Fut>(target: &str, iterations: usize, check: F)
where
    F: Fn(Vec<u8>) -> Fut,
    Fut: Future<Output = ()>,
{
    let items = corpus(target);
    assert!(
        items.len() >= 8,
        "fuzz/corpus/{target} has {} items",
        items.len()
    );
    let seed = env_number("FUZZ_SEED").unwrap_or_else(|| fastrand::u64(..));
    let iterations = env_number("FUZZ_ITERATIONS").map_or(iterations, |n| n as usize);
    let mut rng = fastrand::Rng::with_seed(seed);
    let inputs = items
        .iter()
        .cloned()
        .map(|i| (true, i))
        .chain((0..iterations).map(|_| (false, mutate(&mut rng, &items))));
    for (from_corpus, input) in inputs {
        let shown = input.escape_ascii().to_string();
        if let Err(panic) = AssertUnwindSafe(check(input)).catch_unwind().await {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let origin = if from_corpus {
                "a corpus item".to_owned()
            } else {
                format!("a mutation (FUZZ_SEED={seed})")
            };
            panic!(
                "{target}: {origin} broke a property: {message}\n input (escaped): b\"{shown}\""
            );
        }
    }
}

#[tokio::test]
async fn envelope_corpus_and_mutations() {
    let rig = props::EnvelopeRig::new().await.unwrap();
    let rig = &rig;
    run("envelope", ENVELOPE_ITERATIONS, |input| async move {
        rig.check(&input).await
    })
    .await;
}

#[tokio::test]
async fn template_corpus_and_mutations() {
    run("template", ITERATIONS, |input| async move {
        props::check_template(&input)
    })
    .await;
}

#[tokio::test]
async fn signature_corpus_and_mutations() {
    run("signature", ITERATIONS, |input| async move {
        props::check_signature(&input)
    })
    .await;
}

#[tokio::test]
async fn media_id_corpus_and_mutations() {
    let rig = props::MediaRig::new().await.unwrap();
    let rig = &rig;
    run("media_id", ITERATIONS, |input| async move {
        rig.check(&input).await
    })
    .await;
}

#[tokio::test]
async fn trace_where_corpus_and_mutations() {
    run("trace_where", ITERATIONS, |input| async move {
        props::check_trace_where(&input)
    })
    .await;
}

#[tokio::test]
async fn memory_guard_corpus_and_mutations() {
    run("memory_guard", ITERATIONS, |input| async move {
        props::check_guard(&input)
    })
    .await;
}

/// The `where` SQL oracle refuses anything but static columns, operators and numbered
/// placeholders (so the property above can fail).
#[test]
fn trace_where_sql_oracle_refuses_foreign_text() {
    assert_eq!(props::where_sql_problem("1 = 1", 1, 0), None);
    assert_eq!(
        props::where_sql_problem("kind = $4 AND duration_ms >= $5 AND synthetic = $6", 4, 3),
        None
    );
    for (sql, first, count) in [
        ("kind = $1", 2, 1),
        ("kind = $1 AND kind = $1", 1, 2),
        ("kind = $1", 1, 2),
        ("kind = 'x'", 1, 1),
        ("kind = $1 OR kind = $2", 1, 2),
        ("kind = $1 AND kind = $2 AND", 1, 2),
        ("kind LIKE $1", 1, 1),
        ("kind; = $1", 1, 1),
        ("toolName = $1", 1, 1),
        ("kind  = $1", 1, 1),
        ("TRUE", 1, 0),
    ] {
        assert!(
            props::where_sql_problem(sql, first, count).is_some(),
            "{sql:?} passed"
        );
    }
}

#[tokio::test]
async fn addr_classifier_corpus_and_mutations() {
    run("addr_classifier", ITERATIONS, |input| async move {
        props::check_addr_classifier(&input)
    })
    .await;
}

/// The envelope's oracle flags wrong replies (so the properties above can fail).
#[test]
fn envelope_oracle_refuses_wrong_replies() {
    use agent_gateway::rpc::envelope::Reply;
    use serde_json::json;
    let ping = r#"{"jsonrpc":"2.0","id":7,"method":"system.ping"}"#;
    let good = Reply::Some(json!({"jsonrpc": "2.0", "result": {"pong": true}, "id": 7}));
    assert_eq!(props::envelope_problem(ping, &good), None);
    let wrong = [
        Reply::None,
        Reply::Some(json!({"jsonrpc": "2.0", "result": {}, "id": 8})),
        Reply::Some(
            json!({"jsonrpc": "2.0", "result": {}, "error": {"code": 1, "message": ""}, "id": 7}),
        ),
        Reply::Some(json!({"jsonrpc": "1.0", "result": {}, "id": 7})),
        Reply::Some(json!([{"jsonrpc": "2.0", "result": {}, "id": 7}])),
        Reply::Some(json!({"jsonrpc": "2.0", "error": {"code": "x", "message": ""}, "id": 7})),
    ];
    for reply in &wrong {
        assert!(props::envelope_problem(ping, reply).is_some(), "{reply:?}");
    }
    // A notification is owed nothing; a parse error is owed -32700 with a null id.
    let note = r#"{"jsonrpc":"2.0","method":"system.ping"}"#;
    assert_eq!(props::envelope_problem(note, &Reply::None), None);
    assert!(props::envelope_problem(note, &good).is_some());
    let parse = Reply::Some(
        json!({"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": null}),
    );
    assert_eq!(props::envelope_problem("{", &parse), None);
    let invalid = Reply::Some(
        json!({"jsonrpc": "2.0", "error": {"code": -32600, "message": "x"}, "id": null}),
    );
    assert!(props::envelope_problem("{", &invalid).is_some());
    // A batch keeps order and skips notifications.
    let batch = r#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"},{"jsonrpc":"2.0","id":"x","method":"c"}]"#;
    let err = |id: serde_json::Value| json!({"jsonrpc": "2.0", "error": {"code": -32601, "message": "m"}, "id": id});
    let ordered = Reply::Some(json!([err(json!(1)), err(json!("x"))]));
    assert_eq!(props::envelope_problem(batch, &ordered), None);
    let swapped = Reply::Some(json!([err(json!("x")), err(json!(1))]));
    assert!(props::envelope_problem(batch, &swapped).is_some());
}

/// Same seed, same mutations; and they differ from the corpus.
#[test]
fn mutator_is_deterministic_and_mutates() {
    let items = corpus("template");
    let run = |seed| {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..200)
            .map(|_| mutate(&mut rng, &items))
            .collect::<Vec<_>>()
    };
    let a = run(42);
    assert_eq!(a, run(42));
    let novel = a.iter().filter(|m| !items.contains(m)).count();
    assert!(novel > 150, "only {novel} of 200 mutations are new inputs");
    assert!(a.iter().all(|m| m.len() <= MAX_LEN));
}
