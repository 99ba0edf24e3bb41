//! The `net` section end to end, from the outside: parsed from YAML by the configuration
//! loader (strict, closed by default, ranges checked), in the schema and file-only, and the
//! fetcher built from it against a real loopback server: refused while loopback is closed,
//! fetched when the file opens it, the body capped at `maxBytes`, a redirect to the metadata
//! address refused.

use agent_gateway::config;
use agent_gateway::net::{Class, Fetcher, NetError, NetPolicy};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Answers every request: `/meta` with a redirect to the metadata address, anything else with
/// `body`.
async fn server(body: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                let answer = if head.starts_with("GET /meta ") {
                    "HTTP/1.1 302 Found\r\nlocation: http://169.254.169.254/latest/\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned()
                } else {
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                };
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    port
}

fn fetcher(yaml: &str) -> Fetcher {
    let c = config::parse(yaml).unwrap();
    config::validate(&c).unwrap();
    Fetcher::new(NetPolicy::new(&c.net))
}

#[test]
fn the_section_is_strict_closed_by_default_and_file_only() {
    let c = config::parse("").unwrap();
    assert!(!c.net.allow_loopback && !c.net.allow_private && c.net.allow_cidrs.is_empty());
    for bad in [
        "net:\n  allowLocalhost: true\n",
        "net:\n  allowCidrs: [nonsense]\n",
    ] {
        assert!(config::parse(bad).is_err(), "{bad}");
    }
    let c = config::parse("net:\n  maxRedirects: 21\n").unwrap();
    let err = config::validate(&c).unwrap_err();
    assert!(err.0.contains("net.maxRedirects"), "{}", err.0);
    let schema = config::schema();
    assert_eq!(
        schema["properties"]["net"]["$ref"],
        Value::from("#/$defs/NetConfig"),
        "net is not in the schema"
    );
    assert!(config::trust::FILE_ONLY.iter().any(|k| k.path == "net"));
}

#[tokio::test]
async fn the_fetcher_follows_the_file() {
    let port = server("12345").await;
    let url = format!("http://127.0.0.1:{port}/");
    let closed = fetcher("");
    assert!(matches!(
        closed.get(&url).await,
        Err(NetError::Refused {
            class: Class::Loopback,
            ..
        })
    ));
    let open = fetcher("net:\n  allowLoopback: true\n  maxBytes: 5\n");
    assert_eq!(open.get(&url).await.unwrap().body, "12345");
    let small = fetcher("net:\n  allowCidrs: [127.0.0.0/8]\n  maxBytes: 4\n");
    assert!(matches!(
        small.get(&url).await,
        Err(NetError::TooLarge { max: 4, .. })
    ));
    let wide = fetcher(
        "net:\n  allowLoopback: true\n  allowPrivate: true\n  allowCidrs: [0.0.0.0/0, '::/0']\n",
    );
    let err = wide
        .get(&format!("http://127.0.0.1:{port}/meta"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            NetError::Refused {
                class: Class::Metadata,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("169.254.169.254"), "{err}");
}
