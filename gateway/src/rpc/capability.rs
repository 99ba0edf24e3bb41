//! The capability socket: `<dataDir>/capability.sock`, an owner-only Unix socket (directory
//! 0700, socket 0600) where a local process holding a run's lease calls `tool.invoke`, one
//! newline-delimited JSON-RPC 2.0 request per line. One listener per server generation, tied
//! to its stop token; the rules (denylist, origin, trust) are in `runtime/capability.rs`, the
//! model in `docs/orchestration.md`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::generated::methods::{error_codes, MethodId, Scope};
use crate::api::generated::types::{ToolInvokeParams, ToolInvokeResult, ToolInvokeResultRoutedTo};
use crate::api::principal::{Principal, OPERATOR};
use crate::api::{invoke, RpcError};
use crate::app::state::AppState;
use crate::runtime::capability::{self as rules, Check, MAX_LINE};
use crate::runtime::tree::LiveRun;

/// Connections served at once; more wait for a slot.
const MAX_CONNECTIONS: usize = 64;
/// How long a connection may stay without a new request line (or take to read an answer)
/// before it is closed.
const IDLE: Duration = Duration::from_secs(60);
/// How long the stop waits for calls in flight before the file goes.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Serves the socket until `stop` is cancelled, then removes its file (when it is still this
/// listener's). A socket that cannot be bound is logged and not served: the gateway runs on.
pub async fn serve(state: Arc<AppState>, stop: CancellationToken) {
    let path = rules::socket_path(&state.data_dir);
    let listener = match bind(&state.data_dir, &path) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the capability socket is not served");
            return;
        }
    };
    let mine = std::fs::symlink_metadata(&path)
        .ok()
        .map(|m| (m.dev(), m.ino()));
    let tracker = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let slot = tokio::select! {
            _ = stop.cancelled() => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(s) => s,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, _)) => {
                let (state, stop) = (state.clone(), stop.clone());
                tracker.spawn(async move {
                    let _slot = slot;
                    connection(state, stream, stop).await;
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "capability socket: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop(listener);
    tracker.close();
    let _ = tokio::time::timeout(STOP_GRACE, tracker.wait()).await;
    // A later generation may have bound its own socket at the same path already.
    let now = std::fs::symlink_metadata(&path)
        .ok()
        .map(|m| (m.dev(), m.ino()));
    if now.is_some() && now == mine {
        let _ = std::fs::remove_file(&path);
    }
}

/// The data directory made 0700, a stale socket removed, the socket bound and made 0600.
fn bind(data_dir: &Path, path: &PathBuf) -> std::io::Result<UnixListener> {
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700))?;
    match std::fs::symlink_metadata(path) {
        Ok(_) => std::fs::remove_file(path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// One line read from a connection.
enum Line {
    Full,
    TooLong,
    Eof,
}

/// Reads one line (without its newline) into `out`, at most [`MAX_LINE`] bytes.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    out: &mut Vec<u8>,
) -> std::io::Result<Line> {
    out.clear();
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok(if out.is_empty() {
                Line::Eof
            } else {
                Line::Full
            });
        }
        let (take, newline) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        out.extend_from_slice(buf.get(..take).unwrap_or_default());
        r.consume(take + usize::from(newline));
        if out.len() > MAX_LINE {
            return Ok(Line::TooLong);
        }
        if newline {
            return Ok(Line::Full);
        }
    }
}

async fn connection(state: Arc<AppState>, stream: UnixStream, stop: CancellationToken) {
    let peer = stream.peer_cred().ok().map(|c| c.uid());
    let (rd, wr) = stream.into_split();
    let state = &state;
    serve_lines(rd, wr, &stop, IDLE, |line| async move {
        request(state, peer, &line).await
    })
    .await;
}

/// Serves newline-delimited requests of one connection: each line's answer (`answer`) in
/// order; a line over [`MAX_LINE`] is answered -32600 and closes; a connection with no new
/// line for `idle` (or whose answer cannot be written within `idle`) is closed, so a process
/// that connects and goes quiet never holds one of the [`MAX_CONNECTIONS`] slots for long.
async fn serve_lines<R, W, F, Fut>(
    rd: R,
    mut wr: W,
    stop: &CancellationToken,
    idle: Duration,
    answer: F,
) where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
    F: Fn(Vec<u8>) -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    let mut reader = BufReader::new(rd);
    let mut line = Vec::new();
    loop {
        let read = tokio::select! {
            _ = stop.cancelled() => break,
            r = tokio::time::timeout(idle, read_line(&mut reader, &mut line)) => match r {
                Ok(r) => r,
                Err(_) => break,
            },
        };
        let (answer, last) = match read {
            Ok(Line::Full) if line.iter().all(u8::is_ascii_whitespace) => continue,
            Ok(Line::Full) => (answer(std::mem::take(&mut line)).await, false),
            Ok(Line::TooLong) => (
                RpcError::invalid_request(&format!("a request line exceeds {MAX_LINE} bytes"))
                    .response(Value::Null),
                true,
            ),
            Ok(Line::Eof) | Err(_) => break,
        };
        let mut bytes = answer.to_string().into_bytes();
        bytes.push(b'\n');
        let written = tokio::time::timeout(idle, wr.write_all(&bytes)).await;
        if !matches!(written, Ok(Ok(()))) || last {
            break;
        }
    }
    let _ = wr.shutdown().await;
}

/// One request line: its response object.
async fn request(state: &Arc<AppState>, peer: Option<u32>, line: &[u8]) -> Value {
    let obj = match serde_json::from_slice::<Value>(line) {
        Ok(Value::Object(obj)) => obj,
        // One request per line: a batch is not served here.
        Ok(_) => {
            return RpcError::invalid_request("a request line holds one request object")
                .response(Value::Null)
        }
        Err(_) => return RpcError::parse_error().response(Value::Null),
    };
    let id = match obj.get("id") {
        None | Some(Value::Null) => Value::Null,
        Some(v @ (Value::String(_) | Value::Number(_))) => v.clone(),
        Some(_) => {
            return RpcError::invalid_request("id must be an integer or a string")
                .response(Value::Null)
        }
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return RpcError::invalid_request("jsonrpc must be \"2.0\"").response(id);
    }
    let Some(method) = obj.get("method").and_then(Value::as_str) else {
        return RpcError::invalid_request("method must be a string").response(id);
    };
    if method != "tool.invoke" {
        return RpcError::method_not_found(method).response(id);
    }
    let params = match obj.get("params") {
        None => None,
        Some(p @ Value::Object(_)) => Some(p.clone()),
        Some(_) => return RpcError::invalid_params("params must be an object").response(id),
    };
    let info = MethodId::ToolInvoke.info();
    let outcome = match invoke::parse_params::<ToolInvokeParams>(info, params) {
        Ok(p) => tool_invoke(state, peer, p).await,
        Err(e) => Err(e),
    };
    match outcome.and_then(|r| invoke::encode_result(&r)) {
        Ok(result) => json!({"jsonrpc": "2.0", "result": result, "id": id}),
        Err(e) => e.response(id),
    }
}

/// What the call targets.
enum Target {
    Method(MethodId),
    Builtin(Scope),
}

/// `tool.invoke`: the checks in the spec's order, then the route.
async fn tool_invoke(
    state: &Arc<AppState>,
    peer: Option<u32>,
    p: ToolInvokeParams,
) -> Result<ToolInvokeResult, RpcError> {
    let engine = &state.engine;
    let tree = &engine.control.tree;
    let Some(run) = tree
        .by_token(&p.lease)
        .filter(|r| r.lease.valid() && !r.has_ended())
    else {
        audit(state, None, &p.tool, None, Some(Check::Lease));
        return Err(refusal(
            Check::Lease,
            "no live run holds this lease (unknown, revoked or ended)",
        ));
    };
    let target = match MethodId::from_name(&p.tool) {
        Some(id) => Some(Target::Method(id)),
        None => engine.turns.tools().scope_of(&p.tool).map(Target::Builtin),
    };
    let (admin_scope, capability) = match &target {
        Some(Target::Method(id)) => (
            id.info().scope == Scope::Admin,
            rules::method_capability(id.info().scope.as_str()),
        ),
        Some(Target::Builtin(scope)) => (*scope == Scope::Admin, rules::tool_capability(&p.tool)),
        None => (false, "none".to_owned()),
    };
    let decided = Decided {
        state,
        run: &run,
        tool: &p.tool,
        capability: &capability,
    };
    let trusted = rules::admin_trust(&state.file_document, &run.agent_id);
    if let Some(why) = rules::denied(&p.tool, admin_scope, trusted) {
        decided.refused(Check::Denylist);
        return Err(refusal(Check::Denylist, &format!("{}: {why}", p.tool)));
    }
    let own = rustix::process::getuid().as_raw();
    if !rules::origin_ok(peer, own) {
        decided.refused(Check::Origin);
        return Err(refusal(
            Check::Origin,
            "the caller is not the gateway's own user",
        ));
    }
    let Some(target) = target else {
        decided.refused(Check::Capability);
        return Err(RpcError::method_not_found(&p.tool));
    };
    let caller = Principal::new(&run.client_id, run.scopes).context(None);
    let args = Value::Object(p.args.unwrap_or_default().into_iter().collect());
    match target {
        Target::Method(id) => {
            let info = id.info();
            if !run.scopes.allows(info.scope) {
                decided.refused(Check::Capability);
                return Err(refusal(
                    Check::Capability,
                    &format!(
                        "{} requires scope '{}', which the run's caller lacks",
                        p.tool,
                        info.scope.as_str()
                    ),
                ));
            }
            decided.allowed(ToolInvokeResultRoutedTo::Rpc);
            let rpc = crate::handlers::Rpc::new(state.clone());
            let result =
                crate::api::generated::dispatch::dispatch(&rpc, &caller, &p.tool, Some(args))
                    .await?;
            decided.returned(json_len(&result));
            Ok(ToolInvokeResult {
                tool: p.tool,
                routed_to: ToolInvokeResultRoutedTo::Rpc,
                result,
            })
        }
        Target::Builtin(scope) => {
            let tools = engine.turns.tools();
            let group = tools.opt_in_group(&p.tool);
            let agent = engine.agents.require(&run.agent_id).ok();
            let within = agent
                .as_ref()
                .is_some_and(|a| a.allows_tool_in(&p.tool, group) && run.scopes.allows(scope))
                && run.lease.tools.as_ref().is_none_or(|t| t.contains(&p.tool))
                && run.budget.profile.allows(&p.tool, group);
            let Some(agent) = agent.filter(|_| within) else {
                decided.refused(Check::Capability);
                return Err(refusal(
                    Check::Capability,
                    &format!("{} is not within this run's capabilities", p.tool),
                ));
            };
            // Arguments the tool's schema refuses: the call never ran (counted as denied).
            tools.check_args(&p.tool, &args).map_err(|e| {
                decided.count(false);
                RpcError::invalid_params(e)
            })?;
            decided.allowed(ToolInvokeResultRoutedTo::Builtin);
            let label = format!("capability:{}", run.run_id);
            let text = engine
                .turns
                .call_tool(crate::runtime::turn::ToolCallOf {
                    agent: &agent,
                    caller: &caller,
                    run: &run,
                    tool: &p.tool,
                    args: &args,
                    label: &label,
                    cancel: &run.kill,
                })
                .await
                .map_err(|why| {
                    RpcError::new(error_codes::INTERNAL_ERROR, format!("Tool failed: {why}"))
                })?;
            decided.returned(text.len());
            Ok(ToolInvokeResult {
                tool: p.tool,
                routed_to: ToolInvokeResultRoutedTo::Builtin,
                result: Value::String(text),
            })
        }
    }
}

/// Size of `v`'s JSON text, without keeping the text.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// A call some live lease authenticated: each decision is audited and counted on its run.
struct Decided<'a> {
    state: &'a AppState,
    run: &'a Arc<LiveRun>,
    tool: &'a str,
    capability: &'a str,
}

impl Decided<'_> {
    fn refused(&self, check: Check) {
        self.count(false);
        audit(self.state, Some(self.run), self.tool, None, Some(check));
    }

    fn allowed(&self, routed: ToolInvokeResultRoutedTo) {
        self.count(true);
        audit(self.state, Some(self.run), self.tool, Some(routed), None);
    }

    fn returned(&self, bytes: usize) {
        self.run
            .socket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .result(bytes);
    }

    fn count(&self, allowed: bool) {
        self.run
            .socket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(self.tool, self.capability, allowed);
    }
}

/// A check's refusal: -32603 with a message starting with the check's name.
fn refusal(check: Check, why: &str) -> RpcError {
    RpcError::new(
        error_codes::INTERNAL_ERROR,
        format!("{}: {why}", check.as_str()),
    )
}

/// `capability:audited`: counts and names only (never the lease, never the arguments), to
/// the run's owner; a call no live lease authenticates goes to operators.
fn audit(
    state: &AppState,
    run: Option<&Arc<LiveRun>>,
    tool: &str,
    routed: Option<ToolInvokeResultRoutedTo>,
    refused: Option<Check>,
) {
    let owner: Arc<str> = Arc::from(run.map_or(OPERATOR, |r| r.client_id.as_str()));
    let mut data = json!({
        "agentId": run.map(|r| r.agent_id.clone()),
        "tool": tool,
        "decision": if refused.is_some() { "refused" } else { "allowed" },
    });
    if let Some(r) = routed {
        data["routedTo"] = json!(r.as_str());
    }
    if let Some(c) = refused {
        data["check"] = json!(c.as_str());
    }
    state
        .engine
        .control
        .events
        .publish_owned(Some(owner), "capability:audited", data);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::io::AsyncReadExt;

    async fn echo(line: Vec<u8>) -> Value {
        json!({"echo": String::from_utf8_lossy(&line)})
    }

    /// Reads what the server side wrote until it closes.
    async fn drain(mut r: tokio::io::ReadHalf<tokio::io::DuplexStream>) -> String {
        let mut out = String::new();
        r.read_to_string(&mut out).await.unwrap();
        out
    }

    /// The idle rule at a test's scale (the daemon's is [`IDLE`]).
    #[tokio::test]
    async fn a_quiet_connection_is_closed_after_the_idle_time_and_not_before() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (srd, swr) = tokio::io::split(server);
        let (crd, mut cwr) = tokio::io::split(client);
        let stop = CancellationToken::new();
        let idle = Duration::from_millis(400);
        let serve = tokio::spawn(async move { serve_lines(srd, swr, &stop, idle, echo).await });
        // A line inside the idle time is answered, and restarts it.
        tokio::time::sleep(Duration::from_millis(250)).await;
        cwr.write_all(b"one\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(!serve.is_finished(), "closed before the idle time");
        cwr.write_all(b"two\n").await.unwrap();
        // Then nothing: closed at the idle time.
        tokio::time::timeout(Duration::from_secs(5), serve)
            .await
            .expect("closed after the idle time")
            .unwrap();
        let got = drain(crd).await;
        assert_eq!(got, "{\"echo\":\"one\"}\n{\"echo\":\"two\"}\n");
    }

    #[tokio::test]
    async fn a_line_over_the_limit_is_answered_and_closes() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (srd, swr) = tokio::io::split(server);
        let (crd, mut cwr) = tokio::io::split(client);
        let stop = CancellationToken::new();
        let serve = tokio::spawn(async move {
            serve_lines(srd, swr, &stop, Duration::from_secs(60), echo).await
        });
        let writer = tokio::spawn(async move {
            let _ = cwr.write_all(&vec![b'x'; MAX_LINE + 1]).await;
            let _ = cwr.write_all(b"\n").await;
        });
        serve.await.unwrap();
        let got = drain(crd).await;
        assert!(got.contains("-32600") && got.ends_with('\n'), "{got}");
        writer.abort();
    }
}
