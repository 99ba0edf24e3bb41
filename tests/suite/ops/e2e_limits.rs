//! End to end: every limit at the limit and one past it, heartbeats, close codes (1000, 1001,
//! 4001), restart, Origin, header deadline, server push.

use std::time::Duration;

use crate::common::*;
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

/// A request of exactly `chars` characters (not bytes): the method name is padded with 'é'.
fn request_of_chars(chars: usize) -> String {
    let head = r#"{"jsonrpc":"2.0","id":1,"method":""#;
    let tail = r#""}"#;
    let pad = chars - head.chars().count() - tail.chars().count();
    let s = format!("{head}{}{tail}", "é".repeat(pad));
    assert_eq!(s.chars().count(), chars);
    assert!(s.len() > chars, "multi-byte on purpose");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_message_size_is_counted_in_characters_before_parsing() {
    let gw = start("  wsMaxMessageBytes: 200\n").await;
    let mut ws = gw.ws(RPC).await;
    send(&mut ws, &request_of_chars(200)).await;
    let r = recv(&mut ws).await;
    assert_eq!(
        (code(&r), r["id"].clone()),
        (-32601, json!(1)),
        "parsed at the limit"
    );
    send(&mut ws, &request_of_chars(201)).await;
    let r = recv(&mut ws).await;
    assert_eq!(
        (code(&r), r["id"].clone()),
        (-32600, Value::Null),
        "refused one past it"
    );
    send(
        &mut ws,
        r#"{"jsonrpc":"2.0","id":2,"method":"system.ping"}"#,
    )
    .await;
    assert_eq!(
        recv(&mut ws).await["result"]["pong"],
        true,
        "connection stays open"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_message_rate_is_a_sliding_window_per_connection() {
    let gw = start("  wsMessageRateLimit: {maxMessages: 5, windowMs: 1500}\n").await;
    let mut ws = gw.ws(RPC).await;
    let ping = |i: u32| format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"system.ping"}}"#);
    // A binary frame counts too.
    ws.send(Message::binary(vec![1u8, 2, 3])).await.unwrap();
    let r = recv(&mut ws).await;
    assert_eq!((code(&r), r["id"].clone()), (-32700, Value::Null));
    for i in 1..=4 {
        send(&mut ws, &ping(i)).await;
        assert_eq!(recv(&mut ws).await["id"], i, "message {i} of 5 passes");
    }
    for _ in 0..3 {
        send(&mut ws, &ping(99)).await;
        let r = recv(&mut ws).await;
        assert_eq!(
            r,
            json!({"jsonrpc": "2.0", "error": {"code": -32000, "message": "Rate limit exceeded"}, "id": null})
        );
    }
    // Another connection has its own window.
    let mut other = gw.ws(RPC).await;
    send(&mut other, &ping(7)).await;
    assert_eq!(recv(&mut other).await["id"], 7);
    // Refused messages did not count: once the window slides, 5 fit again.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    for i in 10..15 {
        send(&mut ws, &ping(i)).await;
        assert_eq!(recv(&mut ws).await["id"], i);
    }
    send(&mut ws, &ping(15)).await;
    assert_eq!(code(&recv(&mut ws).await), -32000);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_frames_get_a_parse_error_and_the_connection_stays_open() {
    let gw = start("").await;
    let mut ws = gw.ws(RPC).await;
    ws.send(Message::binary(
        br#"{"jsonrpc":"2.0","id":1,"method":"system.ping"}"#.to_vec(),
    ))
    .await
    .unwrap();
    let r = recv(&mut ws).await;
    assert_eq!(
        r,
        json!({"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": null})
    );
    assert_ping(&mut ws, 2).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_carry_epoch_ms_and_zero_disables_them() {
    let gw = start("  wsHeartbeatMs: 100\n").await;
    let mut ws = gw.ws(RPC).await;
    let before = chrono::Utc::now().timestamp_millis();
    let frame = loop {
        let msg = tokio::time::timeout(STEP, futures_util::StreamExt::next(&mut ws))
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Message::Text(t) = msg {
            break serde_json::from_str::<Value>(&t).unwrap();
        }
    };
    assert_eq!(frame["method"], "heartbeat");
    assert!(frame.get("id").is_none(), "a notification");
    assert!(frame["params"]["ts"].as_i64().unwrap() >= before);
    gw.stop().await;

    let gw = start("  wsHeartbeatMs: 0\n").await;
    let mut ws = gw.ws(RPC).await;
    match tokio::time::timeout(
        Duration::from_millis(400),
        futures_util::StreamExt::next(&mut ws),
    )
    .await
    {
        Err(_) => {}
        Ok(m) => panic!("no heartbeat expected, got {m:?}"),
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_ws_auth_is_accepted_then_closed_with_4001() {
    let gw = start("").await;
    for url in [
        format!(
            "ws://{}/ws?token=wrong-token-value-of-some-length-000000",
            gw.addr
        ),
        format!("ws://{}/ws", gw.addr),
    ] {
        let (mut ws, resp) = tokio_tungstenite::connect_async(url).await.unwrap();
        assert_eq!(resp.status(), 101, "accepted at upgrade");
        assert_eq!(closed(&mut ws).await, (4001, "Unauthorized".to_owned()));
    }
    // The bearer header works as well as the query parameter.
    let mut ws = gw.ws_with_header(RPC).await;
    assert_ping(&mut ws, 1).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_close_is_answered_with_1000() {
    let gw = start("").await;
    let mut ws = gw.ws(RPC).await;
    ws.send(Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "bye".into(),
    })))
    .await
    .unwrap();
    assert_eq!(closed(&mut ws).await.0, 1000);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_every_websocket_with_1001_within_the_grace_period_even_with_stuck_clients()
{
    let gw = start("  shutdownGraceMs: 500\n").await;
    let mut a = gw.ws(RPC).await;
    let mut b = gw.ws(ADMIN).await;
    // A client that sent half a request and stalls, and one that never reads.
    let mut half = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    half.write_all(b"POST /rpc HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\"")
        .await
        .unwrap();
    let _never_reads = gw.ws(RPC).await;
    let started = std::time::Instant::now();
    gw.running.shutdown.cancel();
    assert_eq!(
        closed(&mut a).await,
        (1001, "Server shutting down".to_owned())
    );
    assert_eq!(
        closed(&mut b).await,
        (1001, "Server shutting down".to_owned())
    );
    tokio::time::timeout(STEP, gw.running.done)
        .await
        .expect("shutdown is bounded")
        .unwrap()
        .unwrap();
    eprintln!("shutdown took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_answers_then_closes_with_1001_and_keeps_the_port() {
    let gw = start("").await;
    let mut ws = gw.ws(ADMIN).await;
    send(
        &mut ws,
        r#"{"jsonrpc":"2.0","id":1,"method":"gateway.restart"}"#,
    )
    .await;
    let r = recv(&mut ws).await;
    assert_eq!(r["result"], json!({"restarting": true, "generation": 2}));
    assert_eq!(
        closed(&mut ws).await,
        (1001, "Server shutting down".to_owned())
    );
    // Same port, new generation.
    let mut status = None;
    for _ in 0..100 {
        let r = reqwest::Client::new()
            .post(gw.url("/rpc"))
            .bearer_auth(ADMIN)
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"gateway.status"}"#)
            .send()
            .await;
        if let Ok(r) = r {
            let v: Value = r.json().await.unwrap();
            if v["result"]["generation"] == 2 {
                status = Some(v);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = status.expect("the restarted gateway answers on the same port");
    assert_eq!(status["result"]["pid"], i64::from(std::process::id()));
    let mut ws = gw.ws(RPC).await;
    assert_ping(&mut ws, 2).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_origins_must_be_ours_or_listed() {
    let gw = start("  allowedOrigins: ['https://dash.example']\n").await;
    let try_origin = |origin: Option<String>| {
        let addr = gw.addr;
        async move {
            let mut req = format!("ws://{addr}/ws?token={RPC}")
                .into_client_request()
                .unwrap();
            if let Some(o) = origin {
                req.headers_mut().insert("origin", o.parse().unwrap());
            }
            match tokio_tungstenite::connect_async(req).await {
                Ok(_) => 101,
                Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => resp.status().as_u16(),
                Err(e) => panic!("{e}"),
            }
        }
    };
    assert_eq!(
        try_origin(None).await,
        101,
        "non-browser clients send no Origin"
    );
    assert_eq!(
        try_origin(Some(format!("http://{}", gw.addr))).await,
        101,
        "our own origin"
    );
    assert_eq!(
        try_origin(Some("https://dash.example".into())).await,
        101,
        "listed"
    );
    assert_eq!(try_origin(Some("https://evil.example".into())).await, 403);
    assert_eq!(try_origin(Some("null".into())).await, 403);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stalls_in_its_headers_is_dropped() {
    let gw = start("  headerReadTimeoutMs: 300\n").await;
    let mut tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    tcp.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(STEP, tcp.read(&mut buf))
        .await
        .expect("dropped in time")
        .unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(
        n == 0 || text.starts_with("HTTP/1.1 408"),
        "connection closed, got {text:?}"
    );
    // A prompt client is served.
    assert_eq!(reqwest::get(gw.url("/health")).await.unwrap().status(), 200);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_rate_limit_at_the_limit_and_one_past_it_with_health_exempt() {
    let gw = start("  rateLimit: {windowMs: 60000, maxRequests: 5}\n").await;
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"system.ping"}"#;
    for i in 0..5 {
        assert_eq!(gw.post_rpc(RPC, ping).await.0, 200, "request {i}");
        assert_eq!(reqwest::get(gw.url("/health")).await.unwrap().status(), 200);
    }
    let (status, body) = gw.post_rpc(RPC, ping).await;
    assert_eq!(status, 429);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"error": "Too many requests"})
    );
    let resp = reqwest::Client::new()
        .get(format!("http://{}/ws", gw.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429, "the upgrade request counts too");
    assert!(resp.headers().contains_key("retry-after"));
    let health: Value = reqwest::get(gw.url("/health"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    assert!(chrono::DateTime::parse_from_rfc3339(health["timestamp"].as_str().unwrap()).is_ok());
    gw.stop().await;
}

/// A JSON-RPC ping padded with spaces to exactly `n` bytes.
fn body_of(n: usize) -> String {
    let base = r#"{"jsonrpc":"2.0","id":1,"method":"system.ping"}"#;
    format!("{base}{}", " ".repeat(n - base.len()))
}

async fn raw_chunked_post(addr: std::net::SocketAddr, body: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("POST /rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {RPC}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    for chunk in body.as_bytes().chunks(64) {
        req.push_str(&format!(
            "{:x}\r\n{}\r\n",
            chunk.len(),
            std::str::from_utf8(chunk).unwrap()
        ));
    }
    req.push_str("0\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(STEP, tcp.read_to_end(&mut out))
        .await
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_body_limit_counts_bytes_read_including_chunked_bodies() {
    let gw = start("  httpBodyLimitBytes: 300\n").await;
    let (status, body) = gw.post_rpc(RPC, &body_of(300)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = gw.post_rpc(RPC, &body_of(301)).await;
    assert_eq!(status, 413);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["code"],
        -32600
    );
    let ok = raw_chunked_post(gw.addr, &body_of(300)).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let refused = raw_chunked_post(gw.addr, &body_of(301)).await;
    assert!(refused.starts_with("HTTP/1.1 413"), "{refused}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_over_http_needs_a_bearer_token() {
    let gw = start("").await;
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"system.ping"}"#;
    let no_token = reqwest::Client::new()
        .post(gw.url("/rpc"))
        .body(ping)
        .send()
        .await
        .unwrap();
    assert_eq!(no_token.status(), 401);
    assert_eq!(no_token.headers()["www-authenticate"], "Bearer");
    assert_eq!(
        gw.post_rpc("not-a-token-but-long-enough-000000000000", ping)
            .await
            .0,
        401
    );
    let query = reqwest::Client::new()
        .post(gw.url(&format!("/rpc?token={RPC}")))
        .body(ping)
        .send()
        .await
        .unwrap();
    assert_eq!(
        query.status(),
        401,
        "the query parameter is for /ws and SSE only"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_are_pushed_to_one_client_id_or_broadcast_when_unknown() {
    let gw = start("").await;
    let mut client = gw.ws(RPC).await;
    let mut admin = gw.ws(ADMIN).await;
    // Wait until both are registered.
    for ws in [&mut client, &mut admin] {
        send(ws, r#"{"jsonrpc":"2.0","id":0,"method":"system.ping"}"#).await;
        recv(ws).await;
    }
    let hub = &gw.running.control.hub;
    let sent = hub.notify(
        Some("client"),
        "session.completed",
        json!({"sessionKey": "k1", "result": {"response": "done"}}),
    );
    assert_eq!(sent, 1);
    let n = recv(&mut client).await;
    assert_eq!(
        n,
        json!({"jsonrpc": "2.0", "method": "session.completed", "params": {"sessionKey": "k1", "result": {"response": "done"}}})
    );
    silent(&mut admin, Duration::from_millis(200)).await;
    assert_eq!(
        hub.notify(
            Some("nobody-connected"),
            "session.completed",
            json!({"sessionKey": "k2"})
        ),
        2
    );
    assert_eq!(recv(&mut client).await["params"]["sessionKey"], "k2");
    assert_eq!(recv(&mut admin).await["params"]["sessionKey"], "k2");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stalls_in_its_body_gets_408() {
    let gw = start("  bodyReadTimeoutMs: 300\n").await;
    let mut tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let head = format!("POST /rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {RPC}\r\nContent-Length: 100\r\n\r\n{{\"jsonrpc\"");
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(STEP, tcp.read(&mut buf))
        .await
        .expect("answered in time")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    gw.stop().await;
}
