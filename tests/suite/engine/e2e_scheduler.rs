//! The scheduler from outside: cron jobs firing real agent turns on the scripted provider,
//! the cron.* answers and their codes, wake gates, the heartbeat coalescer, heartbeats, and a
//! second tenant trying to reach the first one's jobs. No test waits for a wall-clock minute:
//! interval jobs of one second and six-field expressions stand in for real schedules.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

const MALLORY: &str = "mallory-secret-0123456789abcdefghijklmnopqrs";

fn config(extra_scheduler: &str) -> String {
    format!(
        r#"    - {{id: mallory, secret: {MALLORY}, scopes: [rpc]}}
  rateLimit: {{windowMs: 60000, maxRequests: 100000}}
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "slow"
        steps:
          - reply: "slow done"
            delayMs: 1500
      - match: "Heartbeat"
        steps:
          - reply: "HEARTBEAT_OK"
            delayMs: 2000
      - match: "report"
        steps:
          - reply: "Report: all tickets closed."
agents:
  default: {{model: script/m1, maxSteps: 2}}
scheduler:
  maxConcurrentRuns: 8
{extra_scheduler}"#
    )
}

fn result(v: &Value) -> &Value {
    assert!(v.get("error").is_none(), "{v}");
    &v["result"]
}

fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("no error: {v}"))
}

/// Waits until `cron.runs` of `name` (as `token`) lists at least `want` runs.
async fn runs(gw: &Gateway, token: &str, name: &str, want: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let v = gw.call(token, "cron.runs", json!({"jobName": name})).await;
        let runs = v["result"]["runs"].as_array().cloned().unwrap_or_default();
        if runs.len() >= want || tokio::time::Instant::now() > deadline {
            return runs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// cron.add of `name` as `token`, sending `message` on `schedule`; the whole response.
async fn add(gw: &Gateway, token: &str, name: &str, message: &str, schedule: Value) -> Value {
    gw.call(
        token,
        "cron.add",
        json!({"name": name, "message": message, "schedule": schedule}),
    )
    .await
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[tokio::test]
async fn an_interval_job_fires_real_turns_in_its_own_session() {
    let gw = start(&config("")).await;
    let added = add(
        &gw,
        RPC,
        "standup",
        "report please",
        json!({"kind": "interval", "everyMs": 1000}),
    )
    .await;
    let r = result(&added);
    assert_eq!(r["created"], true);
    let id = r["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("job_"), "{id}");
    assert_eq!(r["job"]["owner"], "client");
    assert_eq!(r["job"]["agentId"], "default");
    let first = r["job"]["nextRunAtMs"].as_i64().unwrap();
    assert!(
        first > now_ms() - 100 && first <= now_ms() + 1000,
        "{first}"
    );

    let fired = runs(&gw, RPC, "standup", 3).await;
    assert!(fired.len() >= 3, "{fired:?}");
    let ts: Vec<i64> = fired.iter().map(|r| r["ts"].as_i64().unwrap()).collect();
    assert!(ts.windows(2).all(|w| w[0] >= w[1]), "newest first: {ts:?}");
    let dues: Vec<i64> = fired
        .iter()
        .map(|r| r["dueAtMs"].as_i64().unwrap())
        .collect();
    let mut unique = dues.clone();
    unique.dedup();
    assert_eq!(unique.len(), dues.len(), "one fire per due time: {dues:?}");
    for r in &fired {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["jobId"], id.as_str());
        assert_eq!(r["summary"], "Report: all tickets closed.");
        assert!(r["rootRunId"].as_str().unwrap().starts_with("run_"));
        assert!(
            r["trigger"] == "schedule" || r["trigger"] == "catch_up",
            "{r}"
        );
    }
    // The turns are in the job's session, which belongs to its owner.
    let key = format!("agent:default:cron:client:{id}");
    let h = gw
        .call(RPC, "session.history", json!({"session_key": key}))
        .await;
    let msgs = result(&h)["messages"].as_array().unwrap().clone();
    assert!(msgs.len() >= 6, "{msgs:?}");
    assert_eq!(msgs[0]["content"], "report please");
    // The run of a fire is a run of the owner.
    let run = fired[0]["rootRunId"].as_str().unwrap();
    let st = gw
        .call(RPC, "session.run_status", json!({"run_id": run}))
        .await;
    assert_eq!(result(&st)["status"], "completed", "{st}");

    let list = gw.call(RPC, "cron.list", json!({})).await;
    let job = &result(&list)["jobs"][0];
    assert_eq!(job["name"], "standup");
    assert_eq!(job["lastStatus"], "ok");
    assert!(job["lastRunAtMs"].as_i64().unwrap() > 0);
    assert!(job["nextRunAtMs"].as_i64().unwrap() > now_ms() - 1500);

    // Paused: no fire after the pause (a fire already running may still end).
    let upd = gw
        .call(
            RPC,
            "cron.update",
            json!({"name": "standup", "enabled": false}),
        )
        .await;
    assert_eq!(result(&upd)["updated"], true);
    assert_eq!(result(&upd)["job"]["nextRunAtMs"], Value::Null);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = runs(&gw, RPC, "standup", 0).await.len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(runs(&gw, RPC, "standup", 0).await.len(), before);
    // The same values again change nothing.
    let again = gw
        .call(
            RPC,
            "cron.update",
            json!({"name": "standup", "enabled": false}),
        )
        .await;
    assert_eq!(result(&again)["updated"], false);

    // Removed: gone from the list and status, its runs stay readable by name.
    let rm = gw
        .call(RPC, "cron.remove", json!({"name": "standup"}))
        .await;
    assert_eq!(
        result(&rm).clone(),
        json!({"name": "standup", "id": id, "removed": true})
    );
    let st = gw
        .call(RPC, "cron.status", json!({"name": "standup"}))
        .await;
    assert_eq!(code(&st), -32001);
    assert_eq!(runs(&gw, RPC, "standup", 0).await.len(), before);
    let list = gw.call(RPC, "cron.list", json!({})).await;
    assert_eq!(result(&list)["jobs"], json!([]));

    // Scheduler events were published.
    let text = activity(&gw).await;
    assert!(text.contains("scheduler:job_started"), "{text}");
    assert!(text.contains("scheduler:job_completed"), "{text}");
    gw.stop().await;
}

#[tokio::test]
async fn bad_schedules_names_and_agents_get_exact_codes() {
    let gw = start(&config("  maxJobsPerOwner: 3\n")).await;
    let cases = [
        (
            json!({"kind": "cron", "expr": "61 * * * *"}),
            "schedule.expr",
        ),
        (
            json!({"kind": "cron", "expr": "0 0 30 2 *"}),
            "schedule.expr",
        ),
        (
            json!({"kind": "cron", "expr": "0 0 0 1 1 * 2030"}),
            "schedule.expr",
        ),
        (
            json!({"kind": "cron", "expr": "0 9 * * *", "tz": "Mars/Base"}),
            "schedule.tz",
        ),
        (
            json!({"kind": "interval", "everyMs": 1000, "expr": "* * * * *"}),
            "schedule.expr",
        ),
        (
            json!({"kind": "interval", "everyMs": 1000, "tz": "UTC"}),
            "schedule.tz",
        ),
        (
            json!({"kind": "once", "at": "2020-01-01T00:00:00Z"}),
            "schedule.at",
        ),
        (
            json!({"kind": "once", "at": "2099-01-01T00:00:00+01:00", "tz": "Europe/Paris"}),
            "schedule.tz",
        ),
        (json!({"kind": "cron"}), "schedule.expr"),
    ];
    for (schedule, member) in cases {
        let v = add(&gw, RPC, "x", "report", schedule.clone()).await;
        assert_eq!(code(&v), -32602, "{schedule}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(member),
            "{schedule}: {v}"
        );
    }
    // everyMs at its limits and past them.
    for (every, ok) in [
        (999, false),
        (1000, true),
        (31_536_000_000_i64, true),
        (31_536_000_001, false),
    ] {
        let v = add(
            &gw,
            RPC,
            &format!("e{every}"),
            "report",
            json!({"kind": "interval", "everyMs": every}),
        )
        .await;
        assert_eq!(v.get("error").is_none(), ok, "{every}: {v}");
        if ok {
            gw.call(RPC, "cron.remove", json!({"name": format!("e{every}")}))
                .await;
        }
    }
    let ok = add(
        &gw,
        RPC,
        "daily",
        "report",
        json!({"kind": "cron", "expr": "0 9 * * 1-5", "tz": "Europe/Paris"}),
    )
    .await;
    let job = &result(&ok)["job"];
    assert_eq!(job["tz"], "Europe/Paris");
    assert_eq!(job["scheduleKind"], "cron");
    let dup = add(
        &gw,
        RPC,
        "daily",
        "report",
        json!({"kind": "interval", "everyMs": 60000}),
    )
    .await;
    assert_eq!(code(&dup), -32002);
    let v = gw
        .call(
            RPC,
            "cron.add",
            json!({"name": "x", "message": "m", "agentId": "nobody",
                                      "schedule": {"kind": "interval", "everyMs": 60000}}),
        )
        .await;
    assert_eq!(code(&v), -32001);
    let v = add(
        &gw,
        RPC,
        "job_0123456789abcdef0123456789abcdef",
        "report",
        json!({"kind": "interval", "everyMs": 60000}),
    )
    .await;
    assert_eq!(code(&v), -32602);
    // The owner's job count at its limit (3) and past it.
    for n in ["b", "c"] {
        let v = add(
            &gw,
            RPC,
            n,
            "report",
            json!({"kind": "interval", "everyMs": 60000}),
        )
        .await;
        result(&v);
    }
    let v = add(
        &gw,
        RPC,
        "d",
        "report",
        json!({"kind": "interval", "everyMs": 60000}),
    )
    .await;
    assert_eq!(code(&v), -32002, "{v}");
    // Another owner has its own namespace: the same name is free for it.
    let v = add(
        &gw,
        MALLORY,
        "daily",
        "report",
        json!({"kind": "interval", "everyMs": 60000}),
    )
    .await;
    result(&v);
    // cron.run force needs a name; unknown names are -32001.
    let v = gw.call(RPC, "cron.run", json!({})).await;
    assert_eq!(code(&v), -32602);
    let v = gw.call(RPC, "cron.run", json!({"name": "nope"})).await;
    assert_eq!(code(&v), -32001);
    let v = gw.call(RPC, "cron.runs", json!({"jobName": "nope"})).await;
    assert_eq!(code(&v), -32001);
    let v = gw
        .call(
            RPC,
            "cron.update",
            json!({"name": "daily", "schedule": {"kind": "cron", "expr": "bad"}}),
        )
        .await;
    assert_eq!(code(&v), -32602);
    gw.stop().await;
}

#[tokio::test]
async fn force_fires_now_once_and_due_fires_only_overdue_jobs() {
    let gw = start(&config("")).await;
    let v = add(
        &gw,
        RPC,
        "slow",
        "slow job",
        json!({"kind": "interval", "everyMs": 3600000}),
    )
    .await;
    result(&v);
    let v = gw
        .call(RPC, "cron.run", json!({"name": "slow", "mode": "force"}))
        .await;
    assert_eq!(
        result(&v).clone(),
        json!({"triggered": true, "mode": "force", "jobName": "slow"})
    );
    // Never two fires of one job at once.
    let v = gw.call(RPC, "cron.run", json!({"name": "slow"})).await;
    assert_eq!(code(&v), -32002, "{v}");
    let fired = runs(&gw, RPC, "slow", 1).await;
    assert_eq!(fired.len(), 1);
    assert_eq!(fired[0]["trigger"], "force");
    assert_eq!(fired[0]["status"], "ok");
    assert!(fired[0]["durationMs"].as_i64().unwrap() >= 1500);
    // The schedule did not move: the job is not overdue, so due mode starts nothing.
    let st = gw.call(RPC, "cron.status", json!({"name": "slow"})).await;
    assert!(result(&st)["nextRunAtMs"].as_i64().unwrap() > now_ms() + 3_000_000);
    let v = gw.call(RPC, "cron.run", json!({"mode": "due"})).await;
    assert_eq!(
        result(&v).clone(),
        json!({"triggered": true, "mode": "due", "jobNames": []})
    );
    // A disabled job fires on force.
    gw.call(
        RPC,
        "cron.update",
        json!({"name": "slow", "enabled": false}),
    )
    .await;
    let v = gw.call(RPC, "cron.run", json!({"name": "slow"})).await;
    result(&v);
    assert_eq!(runs(&gw, RPC, "slow", 2).await.len(), 2);
    gw.stop().await;
}

#[tokio::test]
async fn a_six_field_expression_fires_every_second() {
    let gw = start(&config("")).await;
    let v = add(
        &gw,
        RPC,
        "tick",
        "report",
        json!({"kind": "cron", "expr": "*/1 * * * * *"}),
    )
    .await;
    result(&v);
    let fired = runs(&gw, RPC, "tick", 2).await;
    assert!(fired.len() >= 2, "{fired:?}");
    for r in &fired {
        assert_eq!(r["dueAtMs"].as_i64().unwrap() % 1000, 0, "{r}");
    }
    gw.stop().await;
}

#[tokio::test]
async fn a_second_tenant_cannot_see_or_change_the_first_tenants_jobs() {
    let gw = start(&config("")).await;
    let v = add(
        &gw,
        RPC,
        "secret",
        "report",
        json!({"kind": "interval", "everyMs": 1000}),
    )
    .await;
    let id = result(&v)["id"].as_str().unwrap().to_owned();
    runs(&gw, RPC, "secret", 1).await;
    for (method, params) in [
        ("cron.status", json!({"name": "secret"})),
        ("cron.update", json!({"name": "secret", "message": "pwned"})),
        ("cron.remove", json!({"name": "secret"})),
        ("cron.run", json!({"name": "secret"})),
        ("cron.runs", json!({"jobName": "secret"})),
        ("cron.status", json!({"name": id})),
        ("cron.runs", json!({"jobName": id})),
    ] {
        let v = gw.call(MALLORY, method, params.clone()).await;
        assert_eq!(code(&v), -32001, "{method} {params}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("Cron job not found"),
            "{v}"
        );
    }
    let v = gw.call(MALLORY, "cron.list", json!({})).await;
    assert_eq!(result(&v)["jobs"], json!([]));
    let v = gw.call(MALLORY, "cron.run", json!({"mode": "due"})).await;
    assert_eq!(result(&v)["jobNames"], json!([]));
    let key = format!("agent:default:cron:client:{id}");
    let v = gw
        .call(MALLORY, "session.history", json!({"session_key": key}))
        .await;
    assert_eq!(code(&v), -32001);
    // The owner's job is untouched; admin sees it with its owner.
    let v = gw.call(RPC, "cron.status", json!({"name": "secret"})).await;
    assert_eq!(result(&v)["message"], "report");
    let v = gw.call(ADMIN, "cron.list", json!({})).await;
    assert_eq!(result(&v)["jobs"][0]["owner"], "client");
    gw.stop().await;
}

#[tokio::test]
async fn wake_gates_skip_without_a_model_call_and_fail_open() {
    let gw = start(&config(
        r#"  jobs:
    quiet:
      message: report
      enabled: false
      schedule: {kind: interval, everyMs: 3600000}
      wakeGate: {script: gates/skip.sh}
    hanging:
      message: report
      enabled: false
      schedule: {kind: interval, everyMs: 3600000}
      wakeGate: {script: gates/hang.sh, timeoutSeconds: 1}
    loose:
      message: report
      enabled: false
      schedule: {kind: interval, everyMs: 3600000}
      wakeGate: {script: gates/loose.sh}
"#,
    ))
    .await;
    use std::os::unix::fs::PermissionsExt;
    let gates = gw.dir.path().join("data/workspaces/default/gates");
    std::fs::create_dir_all(&gates).unwrap();
    for (name, body, mode) in [
        (
            "skip.sh",
            "#!/bin/sh\necho '{\"wake\": false, \"toolCalls\": 2}'\n",
            0o755,
        ),
        ("hang.sh", "#!/bin/sh\nsleep 30\n", 0o755),
        ("loose.sh", "#!/bin/sh\nexit 10\n", 0o775),
    ] {
        let p = gates.join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    // File jobs belong to the operator: a client does not see them.
    let v = gw.call(RPC, "cron.list", json!({})).await;
    assert_eq!(result(&v)["jobs"], json!([]));
    let v = gw.call(ADMIN, "cron.list", json!({})).await;
    let jobs = result(&v)["jobs"].as_array().unwrap().clone();
    assert_eq!(jobs.len(), 3);
    assert!(jobs.iter().all(|j| j["owner"] == "cron:config"), "{jobs:?}");
    assert_eq!(jobs[0]["wakeGate"]["timeoutSeconds"], 1);

    for name in ["quiet", "hanging", "loose"] {
        let v = gw.call(ADMIN, "cron.run", json!({"name": name})).await;
        result(&v);
    }
    let quiet = runs(&gw, ADMIN, "quiet", 1).await;
    assert_eq!(quiet[0]["status"], "skipped", "{quiet:?}");
    assert_eq!(quiet[0]["summary"], "wake-gate: skipped");
    assert_eq!(quiet[0]["estTurnsSaved"], 1);
    // A self-reported toolCalls is not recorded: only tool.invoke calls made with the gate's
    // lease count (none here).
    assert_eq!(quiet[0]["toolCalls"], 0);
    assert_eq!(quiet[0]["gate"]["decision"], "skip");
    assert!(quiet[0].get("rootRunId").is_none(), "{quiet:?}");
    // No model call: the job's session was never written.
    let key = format!(
        "agent:default:cron:cron%3Aconfig:{}",
        quiet[0]["jobId"].as_str().unwrap()
    );
    let h = gw
        .call(ADMIN, "session.history", json!({"session_key": key}))
        .await;
    assert_eq!(code(&h), -32001, "{h}");

    let hanging = runs(&gw, ADMIN, "hanging", 1).await;
    assert_eq!(hanging[0]["status"], "ok", "{hanging:?}");
    assert_eq!(hanging[0]["gate"]["decision"], "failed_open");
    assert!(
        hanging[0]["gate"]["reason"]
            .as_str()
            .unwrap()
            .contains("timed out"),
        "{hanging:?}"
    );
    let loose = runs(&gw, ADMIN, "loose", 1).await;
    assert_eq!(loose[0]["status"], "ok", "{loose:?}");
    assert_eq!(loose[0]["gate"]["decision"], "failed_open");
    assert!(
        loose[0]["gate"]["reason"]
            .as_str()
            .unwrap()
            .contains("writable"),
        "{loose:?}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_thousand_concurrent_wakes_give_one_run_in_flight_and_one_queued() {
    let gw = start(&config("")).await;
    let client = reqwest::Client::new();
    let url = gw.url("/rpc");
    let calls = (0..1000).map(|i| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let body = json!({"jsonrpc": "2.0", "id": i, "method": "scheduler.wake",
                              "params": {"source": "burst"}});
            let r = client
                .post(url)
                .bearer_auth(ADMIN)
                .json(&body)
                .send()
                .await
                .unwrap();
            let v: Value = r.json().await.unwrap();
            v["result"]["woke"]
                .as_bool()
                .unwrap_or_else(|| panic!("{v}"))
        }
    });
    let started = std::time::Instant::now();
    let woke = futures_util::future::join_all(calls).await;
    let burst = started.elapsed();
    let queued = woke.iter().filter(|w| **w).count();
    // A tick takes 2 s. While one is queued every wake folds into it; while one runs the
    // first wake queues exactly one more. So a burst queues one tick, plus at most one per
    // tick that ran during it: at most 2 when the burst is shorter than a tick.
    let bound = 2 + usize::try_from(burst.as_millis() / 2000).unwrap();
    assert!(
        (1..=bound).contains(&queued),
        "{queued} wakes queued a tick in a burst of {burst:?}"
    );
    // Quiet again: every queued wake was served by exactly one tick, and no folded wake ran one.
    let user_turns = || async {
        let h = gw
            .call(
                ADMIN,
                "session.history",
                json!({"session_key": "agent:default:heartbeat:system:main"}),
            )
            .await;
        // Not found until the first tick has created it (a loaded machine may start it late).
        if h["error"]["code"] == -32001 {
            return 0;
        }
        result(&h)["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "user")
            .count()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while user_turns().await < queued && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // One tick longer than a tick takes: nothing more may start.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let v = gw.call(ADMIN, "heartbeat.states", json!({})).await;
    assert!(result(&v)["agents"][0]["tickStartedAtMs"].is_null(), "{v}");
    let ticks = user_turns().await;
    assert_eq!(ticks, queued, "{ticks} ticks for {queued} queued wakes");
    gw.stop().await;
}

#[tokio::test]
async fn heartbeats_are_configured_triggered_and_seen_in_their_state() {
    let gw = start(&config("")).await;
    let v = gw.call(ADMIN, "heartbeat.get", json!({})).await;
    let r = result(&v);
    assert_eq!(r["agentId"], "default");
    assert_eq!(r["perAgent"], json!({}));
    assert_eq!(r["effective"]["enabled"], false);
    assert_eq!(r["effective"]["intervalMs"], 1_800_000);
    let v = gw
        .call(
            ADMIN,
            "heartbeat.update",
            json!({"enabled": true, "intervalMs": 10000,
              "activeHours": {"start": "00:00", "end": "00:00"}}),
        )
        .await;
    let r = result(&v);
    assert_eq!(r["updated"], true);
    assert_eq!(r["config"], json!({"enabled": true, "intervalMs": 10000}));
    let v = gw
        .call(ADMIN, "heartbeat.update", json!({"enabled": true}))
        .await;
    assert_eq!(result(&v)["updated"], false);
    let v = gw
        .call(
            ADMIN,
            "heartbeat.update",
            json!({"session": "agent:other:heartbeat:system:x"}),
        )
        .await;
    assert_eq!(code(&v), -32602);
    let v = gw
        .call(
            ADMIN,
            "heartbeat.update",
            json!({"activeHours": {"start": "09:00", "end": "17:00", "tz": "Mars/Base"}}),
        )
        .await;
    assert_eq!(code(&v), -32602);
    let v = gw
        .call(ADMIN, "heartbeat.get", json!({"agentId": "nobody"}))
        .await;
    assert_eq!(code(&v), -32001);
    let v = gw.call(RPC, "heartbeat.states", json!({})).await;
    assert_eq!(code(&v), -32603, "admin only: {v}");

    let v = gw.call(ADMIN, "heartbeat.states", json!({})).await;
    let s = &result(&v)["agents"][0];
    assert_eq!(s["enabled"], true);
    assert_eq!(s["intervalMs"], 10000);
    let next = s["nextDueMs"].as_i64().unwrap();
    assert!(next > now_ms() && next <= now_ms() + 10_000, "{s}");

    // A next-heartbeat event waits for the tick that trigger starts now.
    let v = gw
        .call(ADMIN, "heartbeat.trigger", json!({"agentId": "default"}))
        .await;
    assert_eq!(
        result(&v).clone(),
        json!({"agentId": "default", "triggered": true})
    );
    let deadline = tokio::time::Instant::now() + STEP;
    let mut last = Value::Null;
    while tokio::time::Instant::now() < deadline {
        let v = gw.call(ADMIN, "heartbeat.states", json!({})).await;
        last = result(&v)["agents"][0].clone();
        if last["lastRunMs"].is_i64() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(last["lastRunMs"].is_i64(), "{last}");
    assert_eq!(last["consecutiveErrors"], 0);
    assert_eq!(last["lastErrorKind"], Value::Null);
    let h = gw
        .call(
            ADMIN,
            "session.history",
            json!({"session_key": "agent:default:heartbeat:system:main"}),
        )
        .await;
    let msgs = result(&h)["messages"].as_array().unwrap().clone();
    assert!(
        !msgs[0]["content"]
            .as_str()
            .unwrap()
            .contains("Wake sources"),
        "{msgs:?}"
    );
    gw.stop().await;
}

const FAILING: &str = r#"  rateLimit: {windowMs: 60000, maxRequests: 100000}
providers:
  script:
    type: scripted
    models: [m1]
    maxRetries: 0
    script:
      - match: "Heartbeat"
        steps:
          - error: {status: 503, message: down}
agents:
  default:
    model: script/m1
    heartbeat: {alertThreshold: 2, alertCooldownMs: 3600000}
"#;

/// The default agent's heartbeat state once its failed ticks reach `n` (or after a step).
async fn state_after_errors(gw: &Gateway, n: i64) -> Value {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let v = gw.call(ADMIN, "heartbeat.states", json!({})).await;
        let s = result(&v)["agents"][0].clone();
        if s["consecutiveErrors"] == n || tokio::time::Instant::now() > deadline {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn failing_heartbeats_back_off_and_alert_once_per_cooldown() {
    let gw = start(FAILING).await;
    let v = gw.call(ADMIN, "heartbeat.trigger", json!({})).await;
    assert_eq!(result(&v)["triggered"], true, "{v}");
    let s = state_after_errors(&gw, 1).await;
    assert_eq!(s["consecutiveErrors"], 1, "{s}");
    assert_eq!(s["lastErrorKind"], "transient");
    let backoff = s["backoffUntilMs"].as_i64().unwrap();
    assert!(backoff > now_ms() + 20_000, "{s}");
    assert_eq!(s["lastAlertMs"], Value::Null);
    // A wake waits out the backoff; a trigger does not, and lets the queued wake run now.
    let v = gw
        .call(ADMIN, "scheduler.wake", json!({"source": "ops"}))
        .await;
    assert_eq!(result(&v)["woke"], true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        state_after_errors(&gw, 1).await["consecutiveErrors"],
        1,
        "the wake waits"
    );
    let v = gw.call(ADMIN, "heartbeat.trigger", json!({})).await;
    assert_eq!(
        result(&v).clone(),
        json!({"agentId": "default", "triggered": false, "reason": "already_pending"})
    );
    let s = state_after_errors(&gw, 2).await;
    assert_eq!(s["consecutiveErrors"], 2, "{s}");
    // The threshold (2) is reached: one alert; a third failure within the cooldown raises none.
    assert!(s["lastAlertMs"].is_i64(), "{s}");
    let v = gw.call(ADMIN, "heartbeat.trigger", json!({})).await;
    assert_eq!(result(&v)["triggered"], true, "{v}");
    assert_eq!(state_after_errors(&gw, 3).await["consecutiveErrors"], 3);
    let alerts = activity(&gw)
        .await
        .matches("scheduler:heartbeat_alert")
        .count();
    assert_eq!(alerts, 1);
    gw.stop().await;
}

#[tokio::test]
async fn jobs_fire_on_across_an_in_process_restart_and_never_twice() {
    let gw = start(&config("")).await;
    let v = add(
        &gw,
        RPC,
        "steady",
        "report",
        json!({"kind": "interval", "everyMs": 1000}),
    )
    .await;
    result(&v);
    let before = runs(&gw, RPC, "steady", 2).await.len();
    assert!(before >= 2);
    let r = gw.call(ADMIN, "gateway.restart", json!({})).await;
    result(&r);
    // The next generation's timer fires on; the old one stopped with its generation.
    let after = runs(&gw, RPC, "steady", before + 3).await;
    assert!(after.len() >= before + 3, "{after:?}");
    let mut dues: Vec<i64> = after
        .iter()
        .map(|r| r["dueAtMs"].as_i64().unwrap())
        .collect();
    dues.sort_unstable();
    dues.dedup();
    assert_eq!(dues.len(), after.len(), "a due time fired twice: {after:?}");
    assert!(after.iter().all(|r| r["status"] == "ok"), "{after:?}");
    gw.stop().await;
}
