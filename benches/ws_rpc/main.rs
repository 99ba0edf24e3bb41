//! ws_rpc: JSON-RPC `system.ping` over `/ws` at N connections (one call in flight each):
//! messages per second and the gateway's CPU per message, for a gateway binary and optionally
//! a baseline binary and a minimal echo floor (`--floor`) in the same run, alternating rounds.
//! README.md has the command.
#![allow(
    clippy::disallowed_methods,
    reason = "tests and benches own the tasks they start"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../ws_idle/gateway.rs"]
mod gateway;

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use gateway::*;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
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

/// What a round runs against: a gateway binary, or the floor (this bench re-executed with
/// `--serve-floor`).
enum Target {
    Gateway(PathBuf),
    Floor,
}

/// A served target: the gateway or the floor process (killed when dropped), and its port.
enum Served {
    Gateway(Gateway),
    Floor(FloorProcess),
}

impl Served {
    fn pid(&self) -> u32 {
        match self {
            Served::Gateway(g) => g.child.id(),
            Served::Floor(f) => f.child.id(),
        }
    }

    fn port(&self) -> u16 {
        match self {
            Served::Gateway(g) => g.port,
            Served::Floor(f) => f.port,
        }
    }
}

struct FloorProcess {
    child: Child,
    port: u16,
}

impl Drop for FloorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the floor in a process of its own, so that its CPU is read from /proc exactly like
/// the gateway's; it prints its port on its first line.
fn spawn_floor() -> FloorProcess {
    let exe = std::env::current_exe().expect("the bench's own executable");
    let mut child = Command::new(exe)
        .arg("--serve-floor")
        .stdout(Stdio::piped())
        .spawn()
        .expect("floor started");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("floor stdout"))
        .read_line(&mut line)
        .expect("floor port");
    let port = line.trim().parse().expect("floor printed its port");
    FloorProcess { child, port }
}

#[derive(Deserialize)]
struct FloorRequest<'a> {
    jsonrpc: &'a str,
    id: u64,
    method: &'a str,
}

#[derive(Serialize)]
struct FloorResponse {
    jsonrpc: &'static str,
    id: u64,
    result: FloorPong,
}

#[derive(Serialize)]
struct FloorPong {
    pong: bool,
    ts: u128,
}

/// The floor's connection: each text frame parsed with serde_json and answered with a pong;
/// no auth, no limits, nothing else (pings and the close handshake are tungstenite's).
async fn floor_connection(stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    while let Some(Ok(msg)) = ws.next().await {
        let Message::Text(text) = msg else { continue };
        let Ok(req) = serde_json::from_str::<FloorRequest>(text.as_str()) else {
            continue;
        };
        if req.jsonrpc != "2.0" || req.method != "system.ping" {
            continue;
        }
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let answer = FloorResponse {
            jsonrpc: "2.0",
            id: req.id,
            result: FloorPong { pong: true, ts },
        };
        let out = serde_json::to_string(&answer).expect("answer serialized");
        if ws.send(Message::text(out)).await.is_err() {
            break;
        }
    }
}

/// `--serve-floor`: the minimal JSON-RPC-over-WebSocket server, on tokio's default
/// multi-threaded runtime (one worker per core, as the gateway), until killed.
fn serve_floor() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("floor runtime");
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("floor bound");
        println!("{}", listener.local_addr().expect("floor address").port());
        loop {
            if let Ok((stream, _)) = listener.accept().await {
                // The floor process is killed at the end of its round, and its tasks with it.
                tokio::spawn(floor_connection(stream));
            }
        }
    });
}

async fn round(target: &Target, conns: usize, warmup: Duration, measure: Duration) -> Round {
    let served = match target {
        Target::Gateway(bin) => Served::Gateway(spawn(bin, "").await),
        Target::Floor => Served::Floor(spawn_floor()),
    };
    let pid = served.pid();
    let stop = Arc::new(AtomicBool::new(false));
    let counting = Arc::new(AtomicBool::new(false));
    let n = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let ws = connect(served.port()).await;
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

fn main() {
    if std::env::args().any(|a| a == "--serve-floor") {
        serve_floor();
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("bench runtime")
        .block_on(bench());
}

async fn bench() {
    let bin = arg("--gateway").unwrap_or_else(default_gateway);
    let baseline = arg("--baseline");
    let floor = std::env::args().any(|a| a == "--floor");
    let conns: usize = env_or("BENCH_CONNECTIONS", 16);
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let warmup = Duration::from_secs(env_or("BENCH_WARMUP_SECONDS", 1));
    let measure = Duration::from_secs(env_or("BENCH_SECONDS", 5));
    let mut targets = vec![("gateway", Target::Gateway(bin))];
    if let Some(b) = baseline {
        targets.insert(0, ("baseline", Target::Gateway(b)));
    }
    if floor {
        targets.insert(0, ("floor", Target::Floor));
    }
    let mut results: Vec<Vec<Round>> = targets.iter().map(|_| Vec::new()).collect();
    for r in 0..rounds {
        for (i, (name, target)) in targets.iter().enumerate() {
            let res = round(target, conns, warmup, measure).await;
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
    println!("| binary | messages/s | server CPU per message (us) |");
    println!("|---|---|---|");
    let mut medians = Vec::new();
    for ((name, target), rs) in targets.iter().zip(&results) {
        let m = median(rs.iter().map(|r| r.msgs_per_s).collect());
        let c = median(rs.iter().map(|r| r.cpu_us_per_msg).collect());
        let what = match target {
            Target::Gateway(bin) => format!("`{}`", bin.display()),
            Target::Floor => "minimal echo floor".to_owned(),
        };
        println!("| {name} ({what}) | {m:.0} | {c:.2} |");
        medians.push((*name, m, c));
    }
    let find = |n: &str| {
        medians
            .iter()
            .find(|(name, ..)| *name == n)
            .map(|&(_, m, c)| (m, c))
    };
    let gateway = find("gateway");
    if let (Some((bm, bc)), Some((gm, gc))) = (find("baseline"), gateway) {
        println!(
            "\ngateway vs baseline: messages/s {:+.1}%, CPU per message {:+.1}%",
            (gm / bm - 1.0) * 100.0,
            (gc / bc - 1.0) * 100.0
        );
    }
    if let (Some((fm, fc)), Some((gm, gc))) = (find("floor"), gateway) {
        let ratio = gc / fc;
        println!(
            "\ngateway vs floor: messages/s {:.1}% of the floor's, CPU per message {ratio:.2}x the floor's (issue 29: <= 1.5x: {})",
            gm / fm * 100.0,
            if ratio <= 1.5 { "PASS" } else { "FAIL" }
        );
    }
}
