//! ws_idle: resident memory per idle authenticated `/ws` connection of a gateway binary
//! (RSS with N connections open minus RSS with one, divided by N). README.md has the command.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod gateway;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use gateway::*;
use tokio_tungstenite::tungstenite::Message;

async fn ping(ws: &mut Ws) {
    ws.send(Message::text(
        r#"{"jsonrpc":"2.0","id":1,"method":"system.ping"}"#,
    ))
    .await
    .unwrap();
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) if t.contains("\"pong\"") => return,
            Some(Ok(_)) => continue,
            other => panic!("no pong: {other:?}"),
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bin = arg("--gateway").unwrap_or_else(default_gateway);
    let n: usize = env_or("BENCH_CONNECTIONS", 10_000);
    let settle = Duration::from_secs(env_or("BENCH_SETTLE_SECONDS", 3));
    // The default cap (16384) takes 10,000; a binary from before the key would refuse it.
    let extra = if n + 64 > 16_384 {
        format!("  maxConnections: {}\n", n + 64)
    } else {
        String::new()
    };
    let gw = spawn(&bin, &extra).await;
    let pid = gw.child.id();
    // One connection first, so what every connection shares (lazy statics, the hub's map,
    // the allocator's first pages) is in the baseline.
    let mut first = connect(gw.port).await;
    ping(&mut first).await;
    tokio::time::sleep(settle).await;
    let before = rss_kib(pid);
    let mut open: Vec<Ws> = Vec::with_capacity(n);
    let started = std::time::Instant::now();
    let mut pending = futures_util::stream::iter(0..n)
        .map(|_| async {
            let mut ws = connect(gw.port).await;
            // Answered: the connection is upgraded, authenticated and registered.
            ping(&mut ws).await;
            ws
        })
        .buffer_unordered(64);
    while let Some(ws) = pending.next().await {
        open.push(ws);
    }
    drop(pending);
    let opened_in = started.elapsed();
    tokio::time::sleep(settle).await;
    let after = rss_kib(pid);
    let per = (after.saturating_sub(before)) as f64 / n as f64;
    println!("gateway: {}", bin.display());
    println!(
        "{n} idle authenticated WebSockets (each answered one system.ping), opened in {:.1} s",
        opened_in.as_secs_f64()
    );
    println!(
        "RSS with 1 connection: {:.1} MiB; with {}: {:.1} MiB; peak {:.1} MiB",
        before as f64 / 1024.0,
        n + 1,
        after as f64 / 1024.0,
        hwm_kib(pid) as f64 / 1024.0
    );
    println!("resident memory per idle connection: {per:.1} KiB (target <= 16 KiB)");
    drop(open);
    drop(first);
}
