//! ws_rpc: JSON-RPC `system.ping` over `/ws` at N connections (one call in flight each):
//! messages per second and the gateway's CPU per message, for a gateway binary and optionally
//! a baseline binary in the same run, alternating rounds. README.md has the command.
#![allow(
    clippy::disallowed_methods,
    reason = "tests and benches own the tasks they start"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../ws_idle/gateway.rs"]
mod gateway;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use gateway::*;
use tokio_tungstenite::tungstenite::Message;

struct Round {
    msgs_per_s: f64,
    cpu_us_per_msg: f64,
}

/// Pings back to back on one connection until `stop`; counts answers while `counting`.
async fn worker(mut ws: Ws, stop: Arc<AtomicBool>, counting: Arc<AtomicBool>, n: Arc<AtomicU64>) {
    let mut id = 0u64;
    while !stop.load(Ordering::Relaxed) {
        id += 1;
        let req = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"system.ping"}}"#);
        ws.send(Message::text(req)).await.unwrap();
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) if t.contains("\"pong\"") => break,
                Some(Ok(_)) => continue,
                other => panic!("no pong: {other:?}"),
            }
        }
        if counting.load(Ordering::Relaxed) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn round(bin: &Path, conns: usize, warmup: Duration, measure: Duration) -> Round {
    let gw = spawn(bin, "").await;
    let pid = gw.child.id();
    let stop = Arc::new(AtomicBool::new(false));
    let counting = Arc::new(AtomicBool::new(false));
    let n = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let ws = connect(gw.port).await;
        tasks.push(tokio::spawn(worker(
            ws,
            stop.clone(),
            counting.clone(),
            n.clone(),
        )));
    }
    tokio::time::sleep(warmup).await;
    let cpu0 = cpu_ticks(pid);
    let t0 = Instant::now();
    counting.store(true, Ordering::Relaxed);
    tokio::time::sleep(measure).await;
    counting.store(false, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = (cpu_ticks(pid) - cpu0) as f64 / ticks_per_second();
    let msgs = n.load(Ordering::Relaxed) as f64;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    Round {
        msgs_per_s: msgs / elapsed,
        cpu_us_per_msg: cpu / msgs * 1e6,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bin = arg("--gateway").unwrap_or_else(default_gateway);
    let baseline = arg("--baseline");
    let conns: usize = env_or("BENCH_CONNECTIONS", 16);
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let warmup = Duration::from_secs(env_or("BENCH_WARMUP_SECONDS", 1));
    let measure = Duration::from_secs(env_or("BENCH_SECONDS", 5));
    let mut targets = vec![("gateway", bin)];
    if let Some(b) = baseline {
        targets.insert(0, ("baseline", b));
    }
    let mut results: Vec<Vec<Round>> = targets.iter().map(|_| Vec::new()).collect();
    for r in 0..rounds {
        for (i, (name, bin)) in targets.iter().enumerate() {
            let res = round(bin, conns, warmup, measure).await;
            println!(
                "round {} {name:<8} {:>9.0} msg/s {:>7.1} us CPU/msg",
                r + 1,
                res.msgs_per_s,
                res.cpu_us_per_msg
            );
            results[i].push(res);
        }
    }
    println!(
        "\nsystem.ping over /ws, {conns} connections, median of {rounds} rounds of {}s:",
        measure.as_secs()
    );
    println!("| binary | messages/s | gateway CPU per message (us) |");
    println!("|---|---|---|");
    let mut medians = Vec::new();
    for ((name, bin), rs) in targets.iter().zip(&results) {
        let m = median(rs.iter().map(|r| r.msgs_per_s).collect());
        let c = median(rs.iter().map(|r| r.cpu_us_per_msg).collect());
        println!("| {name} (`{}`) | {m:.0} | {c:.1} |", bin.display());
        medians.push((m, c));
    }
    if let [(bm, bc), (gm, gc)] = medians[..] {
        println!(
            "\ngateway vs baseline: messages/s {:+.1}%, CPU per message {:+.1}%",
            (gm / bm - 1.0) * 100.0,
            (gc / bc - 1.0) * 100.0
        );
    }
}
