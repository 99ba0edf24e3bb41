//! Sessions belong to the principal that created them: tokens whose ids equal the names inside
//! the gateway's own sessions (`system`, a webhook mapping id) against real heartbeat, webhook
//! and cron sessions, through every way a caller names a session (agent.execute/agent.stream
//! parts, session.* keys, session.send creating one); token ids that would be internal
//! principals; control characters in session-key parts and keys.

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{json, Map, Value};
use sha2::Sha256;

use agent_gateway::api::generated::methods::{MethodId, Scope};

use crate::common::*;

const SYSTEM: &str = "system-secret-0123456789abcdefghijklmnopqrs";
const ECHO: &str = "echo-secret-0123456789abcdefghijklmnopqrstu";
const HOOK_TOKEN: &str = "hook-token-0123456789abcdefghijklmnopqrstuv";

/// Tokens `system` (the heartbeat's key part) and `echo` (a webhook mapping's id), both `rpc`.
fn config() -> String {
    format!(
        r##"    - {{id: system, secret: {SYSTEM}, scopes: [rpc]}}
    - {{id: echo, secret: {ECHO}, scopes: [rpc]}}
  rateLimit: {{windowMs: 60000, maxRequests: 100000}}
webhooks:
  enabled: true
  token: {HOOK_TOKEN}
  hmac:
    headerName: x-hub-signature-256
  mappings:
    - id: echo
      match: {{path: echo}}
      sessionKey: "{{{{payload.id}}}}"
      textTemplate: "hello from {{{{payload.id}}}}"
    - id: wake-now
      match: {{path: wake}}
      action: wake
      textTemplate: "urgent event"
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "Heartbeat"
        steps:
          - reply: "HEARTBEAT_OK"
      - steps:
          - reply: "Hello!"
agents:
  default: {{model: script/m1, maxSteps: 2}}
scheduler:
  maxConcurrentRuns: 8
  jobs:
    nightly:
      message: report
      enabled: false
      schedule: {{kind: interval, everyMs: 3600000}}
"##
    )
}

fn ok_result(v: &Value, what: &str) -> Value {
    v.get("result")
        .cloned()
        .unwrap_or_else(|| panic!("{what}: {v}"))
}

async fn hook(gw: &Gateway, path: &str, body: &[u8]) {
    let mut mac = Hmac::<Sha256>::new_from_slice(HOOK_TOKEN.as_bytes()).unwrap();
    mac.update(body);
    let sig = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    let r = reqwest::Client::new()
        .post(gw.url(path))
        .header("content-type", "application/json")
        .header("x-hub-signature-256", sig)
        .body(body.to_vec())
        .timeout(STEP)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{path}");
}

async fn messages(db: &sqlx::SqlitePool, key: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE session_key = ?")
        .bind(key)
        .fetch_one(db)
        .await
        .unwrap()
}

/// Waits until session `key` holds at least `n` messages.
async fn until_messages(db: &sqlx::SqlitePool, key: &str, n: i64) {
    let deadline = tokio::time::Instant::now() + STEP;
    while messages(db, key).await < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} never reached {n} messages"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no background run is queued or running.
async fn settled(db: &sqlx::SqlitePool) {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM runs WHERE status IN ('queued', 'running')")
                .fetch_one(db)
                .await
                .unwrap();
        let fires: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM cron_runs WHERE status = 'running'")
                .fetch_one(db)
                .await
                .unwrap();
        if n == 0 && fires == 0 {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "runs never settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every session of the gateway's own channels: key, owner, message count.
async fn internal_sessions(db: &sqlx::SqlitePool) -> Vec<(String, Option<String>, i64)> {
    sqlx::query_as(
        "SELECT s.session_key, s.tenant_id, \
         (SELECT COUNT(*) FROM messages m WHERE m.session_key = s.session_key) \
         FROM sessions s WHERE s.channel IN ('heartbeat', 'webhook', 'cron') \
         ORDER BY s.session_key",
    )
    .fetch_all(db)
    .await
    .unwrap()
}

/// A cron job of `token` named `name`, fired once; its id.
async fn fired_job(gw: &Gateway, token: &str, name: &str) -> String {
    let added = gw
        .call(
            token,
            "cron.add",
            json!({"name": name, "message": "report",
                   "schedule": {"kind": "interval", "everyMs": 3_600_000}}),
        )
        .await;
    let id = ok_result(&added, "cron.add")["id"]
        .as_str()
        .unwrap()
        .to_owned();
    ok_result(
        &gw.call(token, "cron.run", json!({"name": name})).await,
        "cron.run",
    );
    id
}

/// The gateway with one real session in each internal channel (a heartbeat tick, a webhook
/// run, cron fires of alice's, of `system`'s own and of the operator's job), all settled.
struct World {
    gw: Gateway,
    db: sqlx::SqlitePool,
    heartbeat: String,
    webhook: String,
    alice_cron: String,
    system_cron: String,
    config_cron: String,
    alice_job: String,
    system_job: String,
}

async fn world() -> World {
    let gw = start(&config()).await;
    let db = database(&gw).await;
    hook(&gw, "/hooks/echo", br#"{"id":"d1"}"#).await;
    hook(&gw, "/hooks/wake", br#"{"n":1}"#).await;
    let alice_job = fired_job(&gw, RPC, "alice-job").await;
    let system_job = fired_job(&gw, SYSTEM, "own-job").await;
    ok_result(
        &gw.call(ADMIN, "cron.run", json!({"name": "nightly"})).await,
        "cron.run nightly",
    );
    let jobs = ok_result(&gw.call(ADMIN, "cron.list", json!({})).await, "cron.list");
    let config_job = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["name"] == "nightly")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let w = World {
        heartbeat: "agent:default:heartbeat:system:main".into(),
        webhook: "agent:default:webhook:echo:d1".into(),
        alice_cron: format!("agent:default:cron:client:{alice_job}"),
        system_cron: format!("agent:default:cron:system:{system_job}"),
        config_cron: format!("agent:default:cron:cron%3Aconfig:{config_job}"),
        alice_job,
        system_job,
        gw,
        db,
    };
    for key in [
        &w.heartbeat,
        &w.webhook,
        &w.alice_cron,
        &w.system_cron,
        &w.config_cron,
    ] {
        until_messages(&w.db, key, 2).await;
    }
    settled(&w.db).await;
    w
}

impl World {
    fn internal_keys(&self) -> [&str; 5] {
        [
            &self.heartbeat,
            &self.webhook,
            &self.alice_cron,
            &self.system_cron,
            &self.config_cron,
        ]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_sessions_are_owned_by_the_gateway_and_their_jobs_owners() {
    let w = world().await;
    let owners: Vec<(String, Option<String>)> = internal_sessions(&w.db)
        .await
        .into_iter()
        .map(|(k, o, _)| (k, o))
        .collect();
    let owner = |key: &str| {
        owners
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, o)| o.clone())
    };
    assert_eq!(owner(&w.heartbeat).as_deref(), Some("heartbeat:system"));
    assert_eq!(owner(&w.webhook).as_deref(), Some("webhook:echo"));
    assert_eq!(owner(&w.alice_cron).as_deref(), Some("client"));
    assert_eq!(owner(&w.system_cron).as_deref(), Some("system"));
    assert_eq!(owner(&w.config_cron).as_deref(), Some("cron:config"));
    // A job's owner reads its job's turns; nobody else without admin does.
    let h = ok_result(
        &w.gw
            .call(RPC, "session.history", json!({"session_key": w.alice_cron}))
            .await,
        "owner reads",
    );
    assert_eq!(h["messages"].as_array().unwrap().len(), 2);
    w.gw.stop().await;
}

/// `agent.execute`/`agent.stream` with every combination of parts: an internal channel is
/// refused (-32602 naming `sessionKey.channelId`, or -32001 when another tenant is named, the
/// rule coming first); otherwise the turn runs in the caller's own session. No internal
/// session gains a message, and no session the callers create has another owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_combination_of_parts_reaches_an_internal_session() {
    let w = world().await;
    let before = internal_sessions(&w.db).await;
    let channels = [
        Some("heartbeat"),
        Some("webhook"),
        Some("cron"),
        Some("api"),
        None,
    ];
    let users = [
        None,
        Some("main"),
        Some("d1"),
        Some(w.alice_job.as_str()),
        Some(w.system_job.as_str()),
    ];
    let tenants = [
        None,
        Some("system"),
        Some("echo"),
        Some("client"),
        Some("heartbeat:system"),
        Some("webhook:echo"),
        Some("cron:config"),
    ];
    let mut ran = 0;
    for (token, me) in [(SYSTEM, "system"), (ECHO, "echo")] {
        for method in ["agent.execute", "agent.stream"] {
            for channel in channels {
                for user in users {
                    for tenant in tenants {
                        let mut parts = Map::new();
                        for (k, v) in [
                            ("channelId", channel),
                            ("userId", user),
                            ("tenantId", tenant),
                        ] {
                            if let Some(v) = v {
                                parts.insert(k.into(), json!(v));
                            }
                        }
                        let params = json!({"message": "hi", "sessionKey": parts});
                        let r = w.gw.call(token, method, params.clone()).await;
                        let other_tenant = tenant.is_some_and(|t| t != me);
                        let internal = matches!(channel, Some("heartbeat" | "webhook" | "cron"));
                        if other_tenant {
                            assert_eq!(code(&r), -32001, "{me} {method} {params}: {r}");
                        } else if internal {
                            assert_eq!(code(&r), -32602, "{me} {method} {params}: {r}");
                            let msg = r["error"]["message"].as_str().unwrap();
                            assert!(msg.contains("'sessionKey.channelId'"), "{msg}");
                        } else {
                            ok_result(&r, &format!("{me} {method} {params}"));
                            ran += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(ran, 2 * 2 * 2 * 5 * 2, "own-tenant turns on api channels");
    settled(&w.db).await;
    assert_eq!(
        internal_sessions(&w.db).await,
        before,
        "an internal session changed"
    );
    // Every session these tokens created is their own, in their own namespace.
    let made: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT session_key, tenant_id FROM sessions WHERE channel NOT IN ('heartbeat', 'webhook', 'cron') \
         AND session_key NOT LIKE 'agent:default:api:client:%'",
    )
    .fetch_all(&w.db)
    .await
    .unwrap();
    assert!(!made.is_empty());
    for (key, owner) in made {
        let owner = owner.unwrap();
        assert!(owner == "system" || owner == "echo", "{key}: {owner}");
        assert!(
            key.starts_with(&format!("agent:default:api:{owner}:")),
            "{key}"
        );
    }
    w.gw.stop().await;
}

fn admin_only(method: &str) -> bool {
    MethodId::from_name(method).unwrap().info().scope == Scope::Admin
}

/// Reading, changing or continuing an internal session by its key: -32001 for both tokens
/// (the same answer as a session that does not exist), except that `system` reads its own
/// job's session and is refused (-32602) continuing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_sessions_cannot_be_read_changed_or_continued_by_key() {
    let w = world().await;
    let before = internal_sessions(&w.db).await;
    let calls = |key: &str| -> Vec<(&'static str, Value)> {
        vec![
            ("session.history", json!({"session_key": key})),
            ("session.export", json!({"session_key": key})),
            ("session.status", json!({"session_key": key})),
            ("session.compact", json!({"key": key})),
            ("session.reset", json!({"session_key": key})),
            ("session.reset_conversation", json!({"session_key": key})),
            ("session.delete", json!({"session_key": key})),
            (
                "session.send",
                json!({"session_key": key, "text": "hi", "agent_id": "default"}),
            ),
        ]
    };
    for (token, me) in [(SYSTEM, "system"), (ECHO, "echo")] {
        for key in w.internal_keys() {
            let own = key == w.system_cron && me == "system";
            for (method, params) in calls(key) {
                let changes = !matches!(
                    method,
                    "session.history" | "session.export" | "session.status" | "session.send"
                );
                if own && changes {
                    // Its own record: managing it is the owner's right (not tested here).
                    continue;
                }
                let r = w.gw.call(token, method, params.clone()).await;
                if admin_only(method) {
                    // The scope comes first: an rpc token never reaches the rule.
                    assert_eq!(code(&r), -32603, "{me} {method}: {r}");
                } else if !own {
                    assert_eq!(code(&r), -32001, "{me} {method} {params}: {r}");
                    assert_eq!(
                        r["error"]["message"],
                        format!("Session not found: {key}"),
                        "{me} {method}"
                    );
                } else if method == "session.send" {
                    assert_eq!(code(&r), -32602, "{me} {method}: {r}");
                    assert!(r["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("'session_key'"));
                } else {
                    ok_result(
                        &r,
                        &format!("{me} reads its own job's session with {method}"),
                    );
                }
            }
        }
    }
    // An admin reads them all, and does not continue them either.
    for key in w.internal_keys() {
        ok_result(
            &w.gw
                .call(ADMIN, "session.history", json!({"session_key": key}))
                .await,
            "admin reads",
        );
        let r =
            w.gw.call(
                ADMIN,
                "session.send",
                json!({"session_key": key, "text": "hi", "agent_id": "default"}),
            )
            .await;
        assert_eq!(code(&r), -32602, "admin continues {key}: {r}");
    }
    settled(&w.db).await;
    assert_eq!(internal_sessions(&w.db).await, before);
    w.gw.stop().await;
}

/// Creating a session in an internal channel before the gateway does: a canonical key names
/// the gateway's namespace, whoever's tenant part it carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_sessions_cannot_be_created_ahead_of_the_gateway() {
    let w = world().await;
    let before = internal_sessions(&w.db).await;
    let fresh = [
        "agent:default:heartbeat:system:other",
        "agent:default:heartbeat:echo:main",
        "agent:default:webhook:echo:new",
        "agent:default:webhook:system:new",
        "agent:default:cron:system:job_future",
        "agent:default:cron:echo:job_future",
        "agent:default:cron:client:job_future",
        "agent:default:cron:cron%3Aconfig:job_future",
    ];
    for key in fresh {
        for (token, want) in [(SYSTEM, -32001), (ECHO, -32001), (ADMIN, -32602)] {
            let r =
                w.gw.call(
                    token,
                    "session.send",
                    json!({"session_key": key, "text": "hi", "agent_id": "default"}),
                )
                .await;
            assert_eq!(code(&r), want, "{key}: {r}");
        }
    }
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM sessions WHERE session_key LIKE '%job_future' \
         OR session_key IN ('agent:default:heartbeat:system:other', 'agent:default:heartbeat:echo:main', \
         'agent:default:webhook:echo:new', 'agent:default:webhook:system:new')",
    )
    .fetch_one(&w.db)
    .await
    .unwrap();
    assert_eq!(n, 0, "a refused key was created");
    // A canonical key of another channel in one's own namespace is still created as named.
    let r = ok_result(
        &w.gw
            .call(
                SYSTEM,
                "session.send",
                json!({"session_key": "agent:default:api:system:mine", "text": "hi",
                       "agent_id": "default"}),
            )
            .await,
        "own canonical key",
    );
    assert_eq!(r["sessionKey"], "agent:default:api:system:mine");
    // A canonical key must name the agent that runs it.
    let r =
        w.gw.call(
            SYSTEM,
            "session.send",
            json!({"session_key": "agent:other:api:system:x", "text": "hi", "agent_id": "default"}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    settled(&w.db).await;
    assert_eq!(internal_sessions(&w.db).await, before);
    w.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_ids_never_equal_an_internal_principal() {
    let gw = start(&config()).await;
    for id in ["heartbeat:system", "webhook:echo", "cron:config", "system:"] {
        let r = gw
            .call(ADMIN, "tokens.create", json!({"id": id, "scopes": ["rpc"]}))
            .await;
        assert_eq!(code(&r), -32602, "{id}: {r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains("'id'"),
            "{r}"
        );
    }
    // The bare names are ordinary token ids: their sessions are theirs, not the gateway's.
    let r = ok_result(
        &gw.call(
            ADMIN,
            "tokens.create",
            json!({"id": "heartbeat", "scopes": ["rpc"]}),
        )
        .await,
        "tokens.create heartbeat",
    );
    let secret = r["secret"].as_str().unwrap().to_owned();
    let t = gw
        .call(
            &secret,
            "agent.execute",
            json!({"message": "hi", "sessionKey": {"userId": "main"}}),
        )
        .await;
    ok_result(&t, "a token named heartbeat runs a turn");
    let db = database(&gw).await;
    let owner: Option<String> =
        sqlx::query_scalar("SELECT tenant_id FROM sessions WHERE session_key = ?")
            .bind("agent:default:api:heartbeat:main")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(owner.as_deref(), Some("heartbeat"));
    gw.stop().await;

    // The configuration file: refused at start.
    for id in ["heartbeat:system", "webhook:echo", "cron:config"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.yaml");
        let extra = format!("    - {{id: '{id}', secret: {SYSTEM}x, scopes: [rpc]}}\n");
        std::fs::write(&path, config_yaml(dir.path(), &extra)).unwrap();
        let err = match agent_gateway::server::start(Some(path)).await {
            Ok(running) => {
                running.shutdown.cancel();
                panic!("a token id {id} was accepted");
            }
            Err(e) => e.to_string(),
        };
        assert!(err.contains(id) && err.contains("':'"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_characters_in_session_keys_are_refused() {
    let gw = start(&config()).await;
    let db = database(&gw).await;
    for (member, value) in [
        ("userId", "a\r\nb"),
        ("userId", "a\nb"),
        ("channelId", "api\r"),
        ("tenantId", "client\n"),
        ("userId", "nul\u{0}"),
        ("userId", "del\u{7f}"),
        ("userId", "next-line\u{85}"),
        ("channelId", "csi\u{9b}"),
    ] {
        for method in ["agent.execute", "agent.stream"] {
            let params = json!({"message": "hi", "sessionKey": {member: value}});
            let r = gw.call(RPC, method, params.clone()).await;
            assert_eq!(code(&r), -32602, "{method} {params}: {r}");
            let msg = r["error"]["message"].as_str().unwrap();
            assert!(msg.contains(&format!("sessionKey.{member}")), "{msg}");
        }
    }
    let r = gw
        .call(
            RPC,
            "agent.execute",
            json!({"message": "hi", "agentId": "default\n"}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    // The parts' length limit: at it, and one past it.
    let at = "u".repeat(128);
    ok_result(
        &gw.call(
            RPC,
            "agent.execute",
            json!({"message": "hi", "sessionKey": {"userId": at}}),
        )
        .await,
        "userId of 128",
    );
    let past = "u".repeat(129);
    let r = gw
        .call(
            RPC,
            "agent.execute",
            json!({"message": "hi", "sessionKey": {"userId": past}}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    // Key strings of session.*: C0 controls and DEL are refused before anything is looked up.
    for key in [
        "agent:default:api:client:a\r\nb",
        "line\n",
        "del\u{7f}",
        "\u{0}",
    ] {
        for (method, params) in [
            ("session.history", json!({"session_key": key})),
            ("session.compact", json!({"key": key})),
            (
                "session.send",
                json!({"session_key": key, "text": "hi", "agent_id": "default"}),
            ),
        ] {
            let r = gw.call(ADMIN, method, params).await;
            assert_eq!(code(&r), -32602, "{method} {key:?}: {r}");
        }
    }
    // A C1 control in a key string is not refused by the schema (keys stored before stay
    // reachable), but never names a new session.
    let r = gw
        .call(
            RPC,
            "session.history",
            json!({"session_key": "next-line\u{85}"}),
        )
        .await;
    assert_eq!(code(&r), -32001, "{r}");
    let r = gw
        .call(
            RPC,
            "session.send",
            json!({"session_key": "next-line\u{85}", "text": "hi", "agent_id": "default"}),
        )
        .await;
    assert_eq!(code(&r), -32602, "{r}");
    // /api/chat: the key is a label in the caller's own tenant, and printable.
    let r = reqwest::Client::new()
        .post(gw.url("/api/chat"))
        .bearer_auth(RPC)
        .json(&json!({"message": "hello", "sessionKey": "a\r\nb"}))
        .timeout(STEP)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sessions")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(n, 1, "only the 128-character session was created");
    gw.stop().await;
}
