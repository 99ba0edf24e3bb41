//! The scheduler at 10,000 jobs on the release binary: time to add and remove a job as the
//! count grows, memory and database bytes per job, idle CPU of the timer with every job far
//! from due, and the lateness of fires (due time to fire start) with 100 jobs due in the same
//! second. See README.md.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");
const TOKEN: &str = "bench-secret-0123456789abcdefghijklmnopqrstuv";

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn(dir: &std::path::Path, port: u16, slots: u32) -> Child {
    let config = format!(
        "gateway:\n  port: {port}\n  dataDir: {data}\n  tokens: [{{id: bench, secret: {TOKEN}, scopes: ['*']}}]\n  \
         rateLimit: {{windowMs: 1000, maxRequests: 100000000}}\n  wsMessageRateLimit: {{maxMessages: 100000000, windowMs: 1000}}\n  limits: {{maxConcurrentTurnsPerClient: 100000, maxConcurrentTurns: 100000}}\n\
         local: {{autoFetch: false}}\nproviders:\n  s: {{type: scripted, models: [m]}}\nagents:\n  default: {{model: s/m}}\n\
         scheduler:\n  maxConcurrentRuns: {slots}\n  maxJobsPerOwner: 100000\n",
        data = dir.join("data").display()
    );
    let path = dir.join("bench.yaml");
    std::fs::write(&path, config).unwrap();
    Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&path)
        .env("AGENT_GATEWAY_LOG", "warn")
        .env("AGENT_GATEWAY_NO_FETCH", "1")
        .spawn()
        .unwrap()
}

async fn wait_healthy(port: u16) {
    for _ in 0..200 {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/health")).await {
            if r.status() == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("gateway did not start");
}

async fn connect(port: u16) -> Ws {
    tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{port}/ws?token={TOKEN}"))
        .await
        .unwrap()
        .0
}

/// One call on `ws`; its result and latency.
async fn call(ws: &mut Ws, method: &str, params: Value) -> (Value, Duration) {
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let t = Instant::now();
    ws.send(Message::Text(req.to_string().into()))
        .await
        .unwrap();
    loop {
        if let Message::Text(text) = ws.next().await.unwrap().unwrap() {
            let v: Value = serde_json::from_str(&text).unwrap();
            if v.get("id").is_some() {
                let took = t.elapsed();
                assert!(v.get("error").is_none(), "{method}: {v}");
                return (v["result"].clone(), took);
            }
        }
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn ms(d: &[Duration]) -> Vec<f64> {
    d.iter().map(|d| d.as_secs_f64() * 1000.0).collect()
}

/// Resident set size of `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap()
}

/// utime + stime of `pid` in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn db_bytes(dir: &std::path::Path) -> u64 {
    ["gateway.db", "gateway.db-wal"]
        .iter()
        .map(|f| std::fs::metadata(dir.join("data").join(f)).map_or(0, |m| m.len()))
        .sum()
}

/// 100 jobs due in the same second, fired with `slots` fire slots: lateness p50/p99/max (ms).
async fn lateness(slots: u32) -> (f64, f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = spawn(dir.path(), port, slots);
    wait_healthy(port).await;
    let mut ws = connect(port).await;
    // The same UTC second for all: at least 3 s ahead, so every add lands before it.
    let at = chrono::Utc::now() + chrono::Duration::seconds(4);
    let expr = at.format("%S %M %H %d %m *").to_string();
    let mut names = Vec::new();
    for i in 0..100 {
        let name = format!("late{i}");
        call(
            &mut ws,
            "cron.add",
            json!({"name": name, "message": "hello", "schedule": {"kind": "cron", "expr": expr}}),
        )
        .await;
        names.push(name);
    }
    tokio::time::sleep(Duration::from_secs(7)).await;
    let mut late = Vec::new();
    for name in &names {
        let (r, _) = call(&mut ws, "cron.runs", json!({"jobName": name})).await;
        let run = &r["runs"][0];
        assert_eq!(run["status"], "ok", "{name}: {r}");
        late.push((run["ts"].as_i64().unwrap() - run["dueAtMs"].as_i64().unwrap()) as f64);
    }
    child.kill().ok();
    child.wait().ok();
    let max = late.iter().cloned().fold(0.0, f64::max);
    (pct(&mut late, 0.5), pct(&mut late, 0.99), max)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let jobs: usize = std::env::var("JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let idle_secs: u64 = std::env::var("IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = spawn(dir.path(), port, 4);
    wait_healthy(port).await;
    let pid = child.id();
    let mut ws = connect(port).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss0, db0) = (rss_kib(pid), db_bytes(dir.path()));

    // 60 % cron, 40 % interval, all due between 1 and 24 hours from now.
    let hour = chrono::Utc::now()
        .format("%H")
        .to_string()
        .parse::<u32>()
        .unwrap();
    let mut adds = Vec::with_capacity(jobs);
    for i in 0..jobs {
        let schedule = if i % 5 < 3 {
            let h = (hour + 1 + (i as u32 % 22)) % 24;
            json!({"kind": "cron", "expr": format!("{} {h} * * *", i % 60), "tz": "Europe/Paris"})
        } else {
            json!({"kind": "interval", "everyMs": 3_600_000 + (i as i64 % 23) * 3_600_000})
        };
        let (_, took) = call(
            &mut ws,
            "cron.add",
            json!({"name": format!("job{i}"), "message": "hello", "schedule": schedule}),
        )
        .await;
        adds.push(took);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss1, db1) = (rss_kib(pid), db_bytes(dir.path()));
    let tail = adds.len().saturating_sub(1000);
    let (mut first, mut last) = (ms(&adds[..1000.min(adds.len())]), ms(&adds[tail..]));
    println!(
        "cron.add, first 1000 jobs: p50 {:.3} ms  p99 {:.3} ms",
        pct(&mut first, 0.5),
        pct(&mut first, 0.99)
    );
    println!(
        "cron.add, last 1000 (to {jobs}): p50 {:.3} ms  p99 {:.3} ms",
        pct(&mut last, 0.5),
        pct(&mut last, 0.99)
    );
    println!(
        "memory per job: {:.0} bytes RSS, {:.0} bytes database (RSS {} -> {} KiB)",
        (rss1.saturating_sub(rss0) * 1024) as f64 / jobs as f64,
        db1.saturating_sub(db0) as f64 / jobs as f64,
        rss0,
        rss1
    );

    // Idle: every job is an hour or more away, so the timer sleeps.
    let ticks0 = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let ticks = cpu_ticks(pid) - ticks0;
    println!("idle CPU with {jobs} jobs over {idle_secs} s: {ticks} clock ticks (1 tick = 10 ms)");

    let mut removes = Vec::new();
    for i in 0..1000.min(jobs) {
        let (_, took) = call(&mut ws, "cron.remove", json!({"name": format!("job{i}")})).await;
        removes.push(took);
    }
    let mut rm = ms(&removes);
    println!(
        "cron.remove at {jobs} jobs: p50 {:.3} ms  p99 {:.3} ms",
        pct(&mut rm, 0.5),
        pct(&mut rm, 0.99)
    );
    child.kill().ok();
    child.wait().ok();

    for slots in [100, 4] {
        let (p50, p99, max) = lateness(slots).await;
        println!("lateness, 100 jobs due in one second, maxConcurrentRuns {slots}: p50 {p50:.0} ms  p99 {p99:.0} ms  max {max:.0} ms");
    }
}
