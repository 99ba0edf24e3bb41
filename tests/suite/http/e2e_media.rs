//! Media routes on loopback: every status of the spec (200, 404, 410, auth 401/403), the
//! headers (content type from the sidecar or the extension, nosniff, active content as an
//! attachment), and traversal attempts in every encoding sent as raw HTTP request lines
//! (clients would normalise them), none of which returns a byte from outside the media root.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use agent_gateway::media::MediaStore;

use crate::common::*;

/// Text that exists only outside the media root.
const OUTSIDE: &str = "outside-the-media-root-7f3a";

async fn store(gw: &Gateway) -> MediaStore {
    let root = gw.dir.path().join("data").join("media");
    MediaStore::open(root, Some(Duration::from_secs(60)), 1 << 20)
        .await
        .unwrap()
}

async fn get(gw: &Gateway, path: &str, token: Option<&str>) -> reqwest::Response {
    let mut req = reqwest::Client::new().get(gw.url(path)).timeout(STEP);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap()
}

/// Sends `target` verbatim as the request line's path; returns the status and the body.
async fn raw_get(gw: &Gateway, target: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {RPC}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(STEP, s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test]
async fn media_statuses_headers_and_auth() {
    let gw = start("media:\n  ttlSeconds: 60\n").await;
    let media = store(&gw).await;
    let png = media
        .save(
            Some("client"),
            b"\x89PNG fake",
            Some("image/png"),
            Some("png"),
            Some("shot.png"),
        )
        .await
        .unwrap();
    let html = media
        .save_as(
            Some("client"),
            "page.html",
            b"<script>alert(1)</script>",
            None,
            None,
        )
        .await
        .unwrap();

    let r = get(&gw, &format!("/media/{}", png.id), Some(RPC)).await;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "image/png");
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert_eq!(r.headers()["content-length"], "9");
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"\x89PNG fake");

    let r = get(&gw, &format!("/media/{}/meta", png.id), Some(ADMIN)).await;
    assert_eq!(r.status().as_u16(), 200);
    let meta: Value = r.json().await.unwrap();
    assert_eq!(meta["contentType"], "image/png");
    assert_eq!(meta["size"], 9);
    assert!(meta["savedAt"].as_i64().unwrap() > 0);
    assert_eq!(meta["fileName"], "shot.png");

    // Content type from the extension when no sidecar says it; active content downloads.
    let r = get(&gw, "/media/page.html", Some(RPC)).await;
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(r.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment"));
    assert_eq!(html.id, "page.html");

    // Auth: none -> 401, mcp-client -> 403.
    assert_eq!(
        get(&gw, &format!("/media/{}", png.id), None)
            .await
            .status()
            .as_u16(),
        401
    );
    assert_eq!(
        get(&gw, &format!("/media/{}", png.id), Some(MCP))
            .await
            .status()
            .as_u16(),
        403
    );
    assert_eq!(
        get(&gw, "/media/page.html/meta", Some(MCP))
            .await
            .status()
            .as_u16(),
        403
    );

    // Missing -> 404; expired (saved 61 s ago with a 60 s TTL) -> 410.
    assert_eq!(
        get(&gw, "/media/nope.png", Some(RPC))
            .await
            .status()
            .as_u16(),
        404
    );
    assert_eq!(
        get(&gw, "/media/nope.png/meta", Some(RPC))
            .await
            .status()
            .as_u16(),
        404
    );
    let old = media
        .save_as(Some("client"), "old.txt", b"old", Some("text/plain"), None)
        .await
        .unwrap();
    let sidecar = gw.dir.path().join("data/media/meta/old.txt.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&sidecar).unwrap()).unwrap();
    m["savedAt"] = Value::from(old.saved_at - 61_000);
    std::fs::write(&sidecar, serde_json::to_vec(&m).unwrap()).unwrap();
    assert_eq!(
        get(&gw, "/media/old.txt", Some(RPC))
            .await
            .status()
            .as_u16(),
        410
    );
    assert_eq!(
        get(&gw, "/media/old.txt/meta", Some(RPC))
            .await
            .status()
            .as_u16(),
        410
    );
    gw.stop().await;
}

#[tokio::test]
async fn traversal_in_every_encoding_never_leaves_the_media_root() {
    let gw = start("").await;
    let media = store(&gw).await;
    media
        .save_as(
            Some("client"),
            "inside.txt",
            b"inside",
            Some("text/plain"),
            None,
        )
        .await
        .unwrap();
    // Files beside and above the media root.
    let data = gw.dir.path().join("data");
    std::fs::write(data.join("secret.txt"), OUTSIDE).unwrap();
    std::fs::write(data.join("media").join("secret.txt"), OUTSIDE).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(data.join("secret.txt"), data.join("media/files/link.txt")).unwrap();

    let attempts = [
        "/media/../secret.txt",
        "/media/..%2fsecret.txt",
        "/media/..%2Fsecret.txt",
        "/media/%2e%2e%2fsecret.txt",
        "/media/%2e%2e/secret.txt",
        "/media/%252e%252e%252fsecret.txt",
        "/media/..%5csecret.txt",
        "/media/..\\secret.txt",
        "/media/....//secret.txt",
        "/media/%2e%2e%2f%2e%2e%2fgateway.yaml",
        "/media/..%2f..%2fgateway.yaml",
        "/media/%2e%2e",
        "/media/..",
        "/media/.",
        "/media/..%00secret.txt",
        "/media/%c0%ae%c0%ae%2fsecret.txt",
        "/media/..%2fsecret.txt/meta",
        "/media/files%2f..%2f..%2fsecret.txt",
        "/media/secret.txt",
        "/media/link.txt",
        "/media/link.txt/meta",
        "/media//etc/passwd",
        "/media/%2fetc%2fpasswd",
    ];
    for target in attempts {
        let (status, text) = raw_get(&gw, target).await;
        assert!(matches!(status, 400 | 404), "{target}: {status}");
        assert!(
            !text.contains(OUTSIDE),
            "{target} leaked a file outside the root"
        );
        assert!(!text.contains("root:"), "{target} leaked /etc/passwd");
        assert!(!text.contains(ADMIN), "{target} leaked the configuration");
    }
    let (status, text) = raw_get(&gw, "/media/inside.txt").await;
    assert_eq!(status, 200);
    assert!(text.ends_with("inside"));
    gw.stop().await;
}

#[tokio::test]
async fn a_file_an_agent_saves_is_served() {
    let gw = start(
        r#"
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "write the report"
        steps:
          - toolCalls: [{name: save_file, arguments: {fileName: report.md, content: "Report: all good"}}]
          - reply: "Saved."
agents:
  default: {model: script/m1, maxSteps: 3}
"#,
    )
    .await;
    let r = gw
        .call(
            RPC,
            "agent.execute",
            serde_json::json!({"message": "write the report"}),
        )
        .await;
    assert_eq!(r["result"]["response"], "Saved.", "{r}");
    let files: Vec<String> = std::fs::read_dir(gw.dir.path().join("data/media/files"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].ends_with(".md"));
    let resp = get(&gw, &format!("/media/{}", files[0]), Some(RPC)).await;
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/markdown"));
    assert_eq!(resp.text().await.unwrap(), "Report: all good");
    let meta: Value = get(&gw, &format!("/media/{}/meta", files[0]), Some(RPC))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(meta["fileName"], "report.md");
    gw.stop().await;
}

/// Media files belong to the tenant whose turn saved them (the files tool records the session's
/// owner): another tenant's file, and a file without an owner (saved before files had owners),
/// answer 404 as a missing one, on the file and its metadata; admin reaches every file.
#[tokio::test]
async fn a_media_file_is_reachable_by_its_tenant_and_admin_only() {
    let gw = start("").await;
    let media = store(&gw).await;
    let mine = media
        .save(
            Some("client"),
            b"mine",
            Some("text/plain"),
            Some("txt"),
            None,
        )
        .await
        .unwrap();
    let theirs = media
        .save(
            Some("mallory"),
            b"theirs",
            Some("text/plain"),
            Some("txt"),
            None,
        )
        .await
        .unwrap();
    let ownerless = media
        .save(None, b"old", Some("text/plain"), Some("txt"), None)
        .await
        .unwrap();
    for suffix in ["", "/meta"] {
        let path = |id: &str| format!("/media/{id}{suffix}");
        assert_eq!(
            get(&gw, &path(&mine.id), Some(RPC)).await.status().as_u16(),
            200
        );
        for id in [&theirs.id, &ownerless.id] {
            let r = get(&gw, &path(id), Some(RPC)).await;
            assert_eq!(r.status().as_u16(), 404, "{id}{suffix}");
            let missing = get(&gw, &path("no-such-file.txt"), Some(RPC)).await;
            assert_eq!(missing.status().as_u16(), 404);
            // Not yours reads exactly as missing.
            assert_eq!(r.text().await.unwrap(), missing.text().await.unwrap());
        }
        for id in [&mine.id, &theirs.id, &ownerless.id] {
            assert_eq!(
                get(&gw, &path(id), Some(ADMIN)).await.status().as_u16(),
                200
            );
        }
    }
    gw.stop().await;
}
