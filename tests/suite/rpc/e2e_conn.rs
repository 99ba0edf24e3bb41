//! End to end: what a client can do to the server's connections - send nothing, half an
//! HTTP/2 preface, hundreds of idle connections, more connections than the cap, a WebSocket
//! message past the byte cap, never read its replies, or POST a huge body without a token.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

const BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");

/// Everything the server sends until it closes the connection (bounded by STEP).
async fn read_until_closed(tcp: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(STEP, async {
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the server did not close the connection in time"
    );
    String::from_utf8_lossy(&out).into_owned()
}

async fn health(gw: &Gateway) -> u16 {
    tokio::time::timeout(STEP, reqwest::get(gw.url("/health")))
        .await
        .expect("health answered in time")
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_send_nothing_are_closed_after_the_header_deadline() {
    let gw = start("  headerReadTimeoutMs: 300\n").await;
    let mut silent = Vec::new();
    for _ in 0..5 {
        silent.push(TcpStream::connect(gw.addr).await.unwrap());
    }
    for tcp in &mut silent {
        let got = read_until_closed(tcp).await;
        assert!(
            got.is_empty() || got.starts_with("HTTP/1.1 408"),
            "closed without an answer or with 408, got {got:?}"
        );
    }
    assert_eq!(health(&gw).await, 200, "the server keeps serving");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_http2_preface_is_closed_after_the_deadline_and_h2c_is_not_spoken() {
    let gw = start("  headerReadTimeoutMs: 300\n").await;
    let mut partial = TcpStream::connect(gw.addr).await.unwrap();
    partial.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let got = read_until_closed(&mut partial).await;
    assert!(
        got.is_empty() || got.starts_with("HTTP/1.1 4") || got.starts_with("HTTP/1.1 5"),
        "{got:?}"
    );
    // The whole preface and a SETTINGS frame: HTTP/1.1 only, so no HTTP/2 frame comes back.
    let mut full = TcpStream::connect(gw.addr).await.unwrap();
    full.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let got = read_until_closed(&mut full).await;
    assert!(
        got.is_empty() || got.starts_with("HTTP/1.1 "),
        "an HTTP/1.1 refusal or nothing, got {got:?}"
    );
    assert_eq!(health(&gw).await, 200);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_answered_while_three_hundred_connections_idle() {
    let gw = start("  rateLimit: {windowMs: 60000, maxRequests: 1000}\n").await;
    let mut idle_tcp = Vec::new();
    for _ in 0..200 {
        idle_tcp.push(TcpStream::connect(gw.addr).await.unwrap());
    }
    let mut idle_ws = Vec::new();
    for _ in 0..100 {
        idle_ws.push(gw.ws(RPC).await);
    }
    for _ in 0..10 {
        assert_eq!(health(&gw).await, 200);
    }
    let status = gw.call(ADMIN, "gateway.status", json!({})).await;
    assert_eq!(
        status["result"]["connections"], 100,
        "every WebSocket is open"
    );
    assert_ping(&mut idle_ws[0], 1).await;
    drop(idle_tcp);
    gw.stop().await;
}

/// `GET /health` on a raw keep-alive connection; the status line.
async fn raw_health(tcp: &mut TcpStream) -> String {
    tcp.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(STEP, tcp.read(&mut buf))
        .await
        .expect("answered in time")
        .unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_at_the_limit_and_one_past_it() {
    let gw = start("  maxConnections: 3\n").await;
    // Upgraded WebSockets keep their slot.
    let mut a = gw.ws(RPC).await;
    let b = gw.ws(RPC).await;
    assert_ping(&mut a, 1).await;
    let mut third = TcpStream::connect(gw.addr).await.unwrap();
    assert_eq!(
        raw_health(&mut third).await,
        "HTTP/1.1 200 OK",
        "at the limit"
    );
    let mut fourth = TcpStream::connect(gw.addr).await.unwrap();
    let refused = read_until_closed(&mut fourth).await;
    let (head, body) = refused.split_once("\r\n\r\n").unwrap();
    let head: Vec<&str> = head.lines().collect();
    assert_eq!(head[0], "HTTP/1.1 503 Service Unavailable");
    for h in [
        "Connection: close",
        "Retry-After: 5",
        "Content-Type: application/json",
    ] {
        assert!(head.contains(&h), "{h} in {head:?}");
    }
    assert_eq!(
        serde_json::from_str::<Value>(body).unwrap(),
        json!({"error": "Too many open connections"})
    );
    // A closed WebSocket gives its slot back.
    drop(b);
    let deadline = Instant::now() + STEP;
    loop {
        let mut next = TcpStream::connect(gw.addr).await.unwrap();
        let line = raw_health(&mut next).await;
        if line == "HTTP/1.1 200 OK" {
            break;
        }
        assert_eq!(line, "HTTP/1.1 503 Service Unavailable");
        assert!(Instant::now() < deadline, "the slot was not given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(raw_health(&mut third).await, "HTTP/1.1 200 OK");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ws_byte_cap_is_four_bytes_per_character_then_1009() {
    let gw = start("  wsMaxMessageBytes: 1000\n").await;
    let mut ws = gw.ws(RPC).await;
    // 4000 bytes that are 1000 characters: read, counted, then parsed (not JSON: -32700).
    let at = "😀".repeat(1000);
    assert_eq!((at.len(), at.chars().count()), (4000, 1000));
    send(&mut ws, &at).await;
    let r = recv(&mut ws).await;
    assert_eq!((code(&r), r["id"].clone()), (-32700, Value::Null));
    // 1001 characters in fewer than 4000 bytes: the character check answers.
    send(&mut ws, &"y".repeat(1001)).await;
    assert_eq!(code(&recv(&mut ws).await), -32600);
    assert_ping(&mut ws, 2).await;
    // One byte past the cap: closed with 1009.
    send(&mut ws, &"z".repeat(4001)).await;
    assert_eq!(closed(&mut ws).await, (1009, "Message too big".to_owned()));
    assert_eq!(health(&gw).await, 200);
    gw.stop().await;
}

/// The gateway binary as a child on a free port, healthy.
async fn spawn_gateway(dir: &Path, extra: &str) -> (GatewayChild, u16) {
    let port = free_port();
    let config = dir.join("gateway.yaml");
    std::fs::write(
        &config,
        config_yaml(dir, extra).replace("port: 0", &format!("port: {port}")),
    )
    .unwrap();
    let mut child = GatewayChild::from(
        Command::new(BIN)
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .env_remove("AGENT_GATEWAY_CONFIG")
            .env_remove("AGENT_GATEWAY_PORT")
            .env("AGENT_GATEWAY_NO_FETCH", "1")
            .stdout(std::fs::File::create(dir.join("out.log")).unwrap())
            .stderr(std::fs::File::create(dir.join("err.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    if !healthy(port).await {
        let _ = child.kill();
        let _ = child.wait();
        panic!("gateway did not become healthy");
    }
    (child, port)
}

async fn healthy(port: u16) -> bool {
    let deadline = Instant::now() + STEP;
    while Instant::now() < deadline {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/health")).await {
            if r.status() == 200 {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Peak resident memory of a process, in KiB.
fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_8_mib_message_against_a_1_mib_limit_is_closed_with_1009_without_being_buffered() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, port) = spawn_gateway(dir.path(), "  wsMaxMessageBytes: 1048576\n").await;
    let url = format!("ws://127.0.0.1:{port}/ws?token={RPC}");
    let (mut ws, _) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
        .await
        .unwrap()
        .unwrap();
    assert_ping(&mut ws, 1).await;
    let before = vm_hwm_kib(child.id());
    let (mut tx, mut rx) = ws.split();
    let big = "a".repeat(8 << 20);
    // The server stops reading at the frame header: this write may fail once it closes.
    let sender = tokio::spawn(async move {
        let _ = tx.send(Message::text(big)).await;
        tx
    });
    let close = tokio::time::timeout(STEP, async {
        loop {
            match rx.next().await {
                Some(Ok(Message::Close(Some(f)))) => {
                    break (u16::from(f.code), f.reason.to_string())
                }
                Some(Ok(_)) => continue,
                other => break (1006, format!("{other:?}")),
            }
        }
    })
    .await
    .expect("closed in time");
    assert_eq!(close, (1009, "Message too big".to_owned()));
    let _ = tokio::time::timeout(STEP, sender).await;
    let after = vm_hwm_kib(child.id());
    assert!(
        after.saturating_sub(before) < 1024,
        "peak RSS grew by {} KiB for an 8 MiB message",
        after.saturating_sub(before)
    );
    // Still serving.
    let r = reqwest::get(format!("http://127.0.0.1:{port}/health"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = child.kill();
    let _ = child.wait();
}

/// A ping whose id is `len` bytes: its answer is as big, and cheap to make.
fn big_ping(len: usize) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":"{}","method":"system.ping"}}"#,
        "x".repeat(len)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_dropped_and_others_are_served() {
    let gw = start("  wsMessageRateLimit: {maxMessages: 100000, windowMs: 1000}\n").await;
    let mut reader = gw.ws(RPC).await;
    let mut stuck = gw.ws(RPC).await;
    assert_ping(&mut reader, 1).await;
    let hub = &gw.running.control.hub;
    assert_eq!(hub.count(), 2);
    // Big answers that are never read: the sockets fill, then the queue, then the server
    // drops the connection.
    let ping = big_ping(200_000);
    let deadline = Instant::now() + STEP;
    let mut sent = 0;
    while hub.count() == 2 {
        assert!(
            Instant::now() < deadline,
            "the client that never reads was not dropped ({sent} sent)"
        );
        if stuck.send(Message::text(ping.clone())).await.is_err() {
            break;
        }
        sent += 1;
    }
    assert!(
        sent > 128,
        "more answers than the queue holds were needed: {sent}"
    );
    // The other connection is served.
    assert_ping(&mut reader, 2).await;
    let deadline = Instant::now() + STEP;
    while hub.count() != 1 {
        assert!(Instant::now() < deadline, "{} connections", hub.count());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_in_time_with_a_client_whose_socket_is_full() {
    let gw = start(
        "  shutdownGraceMs: 500\n  wsMessageRateLimit: {maxMessages: 100000, windowMs: 1000}\n",
    )
    .await;
    let mut reader = gw.ws(RPC).await;
    let mut stuck = gw.ws(RPC).await;
    // Fewer answers than the queue holds (so it is not dropped for that), more bytes than
    // the sockets buffer (so its writes are stuck).
    let ping = big_ping(200_000);
    for _ in 0..60 {
        send(&mut stuck, &ping).await;
    }
    assert_ping(&mut reader, 1).await;
    assert_eq!(gw.running.control.hub.count(), 2);
    gw.running.shutdown.cancel();
    assert_eq!(
        closed(&mut reader).await,
        (1001, "Server shutting down".to_owned())
    );
    tokio::time::timeout(STEP, gw.running.done)
        .await
        .expect("shutdown is bounded by the grace period")
        .unwrap()
        .unwrap();
    // The stuck client's connection is gone: what it reads ends.
    let ended = tokio::time::timeout(STEP, async {
        while let Some(Ok(_)) = stuck.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the stuck connection was not closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_without_a_valid_token_gets_401_before_its_body_is_read() {
    let gw = start("").await;
    for (path, auth, kind) in [
        ("/v1/chat/completions", "", "authentication_error"),
        (
            "/v1/chat/completions",
            "Authorization: Bearer not-a-token-but-long-enough-000000000000\r\n",
            "authentication_error",
        ),
        ("/api/chat", "", "Missing or invalid bearer token"),
    ] {
        let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
        // A gigabyte announced, a few bytes sent: an answer proves the body was not awaited.
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n{{\"model\":"
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let got = read_until_closed(&mut tcp).await;
        assert!(got.starts_with("HTTP/1.1 401"), "{path}: {got}");
        assert!(got.contains(kind), "{path}: {got}");
        assert!(
            got.to_ascii_lowercase()
                .contains("www-authenticate: bearer"),
            "{got}"
        );
    }
    // A valid token still reaches the body limit (the body is read as before).
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {RPC}\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(STEP, tcp.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 413"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    gw.stop().await;
}
