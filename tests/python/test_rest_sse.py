"""The REST API under /api and its two server-sent event streams (`/api/events`,
`/api/chat/stream`), against a gateway whose scripted provider gives known answers."""

import contextlib
import json
import time
import uuid

import httpx
import pytest

from conftest import HELLO_REPLY

SSE_TIMEOUT = httpx.Timeout(10.0, read=8.0)


@pytest.fixture(scope="module")
def gw(scripted_gateway):
    return scripted_gateway


def auth(token):
    return {"Authorization": f"Bearer {token}"}


def get(gw, path, token=None, **params):
    headers = auth(token) if token else {}
    return httpx.get(f"{gw['base']}{path}", params=params, headers=headers, timeout=30)


def api_chat(gw, body, token=None):
    return httpx.post(f"{gw['base']}/api/chat", json=body, headers=auth(token or gw["rpc"]), timeout=30)


def assert_rest_error(resp, status):
    """The REST error body: exactly {error: <message>}."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    return body["error"]


class Sse:
    """Reads an event stream block by block: {event, data, comments, retry}."""

    def __init__(self, resp: httpx.Response):
        self.resp = resp
        self.lines = resp.iter_lines()

    def next(self) -> dict:
        block = {"event": None, "data": None, "comments": [], "retry": None}
        data = []
        seen = False
        for line in self.lines:
            if line == "":
                if seen:
                    break
                continue
            seen = True
            if line.startswith(":"):
                block["comments"].append(line[1:].lstrip(" "))
            elif line.startswith("retry:"):
                block["retry"] = int(line[len("retry:"):].strip())
            elif line.startswith("event:"):
                block["event"] = line[len("event:"):].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:"):].lstrip(" "))
        else:
            if not seen:
                raise EOFError("stream ended")
        if data:
            block["data"] = "\n".join(data)
        return block

    def until(self, predicate, seconds=8.0):
        """Blocks until one satisfies `predicate`; returns every block read."""
        seen = []
        deadline = time.time() + seconds
        while time.time() < deadline:
            b = self.next()
            seen.append(b)
            if predicate(b):
                return seen
        raise AssertionError(f"not seen within {seconds}s: {seen}")

    def events(self):
        while True:
            try:
                yield self.next()
            except EOFError:
                return


@contextlib.contextmanager
def stream(gw, path, bearer=None, client=None, **params):
    """GET an event stream; `bearer` goes in the Authorization header, `params` in the query
    (`token=` included)."""
    headers = auth(bearer) if bearer else {}
    c = client or httpx.Client(timeout=SSE_TIMEOUT)
    try:
        with c.stream("GET", f"{gw['base']}{path}", params=params, headers=headers) as r:
            yield r
    finally:
        if client is None:
            c.close()


# --- /api/events -------------------------------------------------------------------------------


def test_events_open_with_the_retry_line(gw):
    with stream(gw, "/api/events", gw["rpc"]) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers.get("cache-control") == "no-cache"
        lines = r.iter_lines()
        assert next(lines) == "retry: 3000"
        assert next(lines) == ""


def test_events_keep_alive_comment(start_gateway):
    fast = start_gateway("  web: {sseKeepAliveMs: 300}\n")
    with stream(fast, "/api/events", fast["rpc"]) as r:
        sse = Sse(r)
        assert sse.next()["retry"] == 3000
        started = time.time()
        blocks = sse.until(lambda b: b["comments"] == ["keep-alive"], seconds=5)
        assert time.time() - started < 3
        assert blocks[-1]["data"] is None and blocks[-1]["event"] is None
        sse.until(lambda b: b["comments"] == ["keep-alive"], seconds=3)  # and again
    # the raw frame is the comment line `: keep-alive`
    with stream(fast, "/api/events", fast["rpc"]) as r:
        lines = r.iter_lines()
        assert next(lines) == "retry: 3000"
        assert next(lines) == ""
        assert next(lines) == ": keep-alive"


def read_turn_events(sse, session_marker=None):
    got = {}

    def seen_both(b):
        if b["event"] in ("message:received", "message:sent"):
            payload = json.loads(b["data"])
            if session_marker is None or session_marker in json.dumps(payload):
                got[b["event"]] = payload
        return {"message:received", "message:sent"} <= set(got)

    sse.until(seen_both)
    return got


def test_events_after_a_chat_turn(gw):
    key = f"events-{uuid.uuid4().hex[:8]}"
    with stream(gw, "/api/events", gw["rpc"]) as r:
        sse = Sse(r)
        assert sse.next()["retry"] == 3000
        before = int(time.time() * 1000)
        resp = api_chat(gw, {"message": "hello", "sessionKey": key})
        assert resp.status_code == 200, resp.text
        got = read_turn_events(sse, key)
    received, sent = got["message:received"], got["message:sent"]
    for name, ev in got.items():
        assert set(ev) == {"seq", "event", "ts", "data"}
        assert ev["event"] == name
        assert isinstance(ev["seq"], int)
        assert before - 5000 <= ev["ts"] <= int(time.time() * 1000) + 5000
    assert received["seq"] < sent["seq"]
    assert received["data"]["agentId"] == "default"
    assert sent["data"]["finishReason"] == "stop"
    assert sent["data"]["tokensUsed"] == {"input": 10, "output": 5, "total": 15}


def test_events_with_a_query_token(gw):
    with stream(gw, "/api/events", None, token=gw["rpc"]) as r:
        assert r.status_code == 200
        sse = Sse(r)
        assert sse.next()["retry"] == 3000
        assert api_chat(gw, {"message": "hello"}).status_code == 200
        read_turn_events(sse)


def test_events_without_a_valid_token(gw):
    with stream(gw, "/api/events") as r:
        r.read()
        assert_rest_error(r, 401)
    with stream(gw, "/api/events", None, token="not-a-token-0123456789abcdefghijklmnop") as r:
        r.read()
        assert_rest_error(r, 401)


def test_events_refuse_an_mcp_client_token(gw):
    with stream(gw, "/api/events", gw["mcp"]) as r:
        r.read()
        assert_rest_error(r, 403)
    with stream(gw, "/api/events", None, token=gw["mcp"]) as r:
        r.read()
        assert_rest_error(r, 403)
    # an `api` token is for /v1 only
    with stream(gw, "/api/events", gw["api"]) as r:
        r.read()
        assert_rest_error(r, 403)


def _rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_fifty_subscribers_come_and_go(gw):
    rss_before = _rss_kb(gw["pid"])
    for round_ in range(3):
        with httpx.Client(timeout=SSE_TIMEOUT, limits=httpx.Limits(max_connections=60)) as client:
            with contextlib.ExitStack() as stack:
                readers = []
                for _ in range(50):
                    r = stack.enter_context(stream(gw, "/api/events", gw["rpc"], client=client))
                    assert r.status_code == 200
                    sse = Sse(r)
                    assert sse.next()["retry"] == 3000
                    readers.append(sse)
                if round_ == 0:
                    # every subscriber gets the events of one turn
                    key = f"fanout-{uuid.uuid4().hex[:8]}"
                    assert api_chat(gw, {"message": "hello", "sessionKey": key}).status_code == 200
                    for sse in readers:
                        read_turn_events(sse, key)
    # the gateway still answers, and a new subscriber still gets events
    assert get(gw, "/api/health").status_code == 200
    r = get(gw, "/api/activity", gw["rpc"], limit=5)
    assert r.status_code == 200 and len(r.json()["events"]) == 5
    with stream(gw, "/api/events", gw["rpc"]) as r:
        sse = Sse(r)
        assert sse.next()["retry"] == 3000
        assert api_chat(gw, {"message": "hello"}).status_code == 200
        read_turn_events(sse)
    rss_after = _rss_kb(gw["pid"])
    if rss_before:
        assert rss_after - rss_before < 64 * 1024, (rss_before, rss_after)


# --- /api/chat/stream --------------------------------------------------------------------------


def check_chat_stream(r):
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    blocks = list(Sse(r).events())
    tokens = [b for b in blocks if b["event"] == "token"]
    done = [b for b in blocks if b["event"] == "done"]
    assert tokens and len(done) == 1 and blocks[-1] is done[0], blocks
    acc = ""
    for t in tokens:
        d = json.loads(t["data"])
        assert set(d) == {"delta", "accumulated"}
        assert d["delta"]
        assert d["accumulated"] == acc + d["delta"]
        assert len(d["accumulated"]) > len(acc)
        acc = d["accumulated"]
    result = json.loads(done[0]["data"])
    assert result["response"] == acc == HELLO_REPLY
    assert result["tokensUsed"] == {"input": 10, "output": 5, "total": 15}
    assert result["finishReason"] == "stop"


def test_chat_stream_tokens_then_done(gw):
    with stream(gw, "/api/chat/stream", gw["rpc"], message="hello") as r:
        check_chat_stream(r)


def test_chat_stream_with_a_query_token_and_session(gw):
    key = f"stream-{uuid.uuid4().hex[:8]}"
    with stream(gw, "/api/chat/stream", None, token=gw["rpc"], message="hello", sessionKey=key) as r:
        check_chat_stream(r)
    sessions = get(gw, "/api/chat/history", gw["rpc"]).json()["sessions"]
    assert any(s["sessionKey"].endswith(f":{key}") for s in sessions)


def test_chat_stream_errors(gw):
    with stream(gw, "/api/chat/stream", gw["rpc"]) as r:
        r.read()
        assert_rest_error(r, 400)
    with stream(gw, "/api/chat/stream", gw["mcp"], message="hello") as r:
        r.read()
        assert_rest_error(r, 403)
    with stream(gw, "/api/chat/stream", None, token=gw["mcp"], message="hello") as r:
        r.read()
        assert_rest_error(r, 403)
    with stream(gw, "/api/chat/stream", message="hello") as r:
        r.read()
        assert_rest_error(r, 401)
    with stream(gw, "/api/chat/stream", gw["rpc"], message="hello", agentId="no-such-agent") as r:
        r.read()
        assert_rest_error(r, 404)


# --- REST routes -------------------------------------------------------------------------------


def test_health_without_a_token(gw):
    for path in ("/api/health", "/health"):
        r = get(gw, path)
        assert r.status_code == 200
        body = r.json()
        assert body["status"] == "ok" and body["timestamp"].endswith("Z")


def test_agents(gw):
    r = get(gw, "/api/agents", gw["rpc"])
    assert r.status_code == 200
    agents = {a["id"]: a for a in r.json()["agents"]}
    d = agents["default"]
    assert (d["provider"], d["model"], d["isDefault"], d["suspended"]) == ("script", "m1", True, False)
    assert d["name"]


def test_admin_token_reads_the_rest_api(gw):
    assert get(gw, "/api/agents", gw["admin"]).status_code == 200


def test_channels(gw):
    r = get(gw, "/api/channels", gw["rpc"])
    assert r.status_code == 200 and isinstance(r.json()["channels"], list)


def test_activity_limits(gw):
    assert api_chat(gw, {"message": "hello"}).status_code == 200
    r = get(gw, "/api/activity", gw["rpc"], limit=1)
    assert r.status_code == 200, r.text
    events = r.json()["events"]
    assert len(events) == 1
    assert set(events[0]) == {"seq", "event", "ts", "data"}
    r = get(gw, "/api/activity", gw["rpc"], limit=100)
    assert r.status_code == 200 and 1 <= len(r.json()["events"]) <= 100
    seqs = [e["seq"] for e in r.json()["events"]]
    assert seqs == sorted(seqs, reverse=True)  # newest first
    assert get(gw, "/api/activity", gw["rpc"]).status_code == 200
    for bad in (0, 101, -1, "abc"):
        assert_rest_error(get(gw, "/api/activity", gw["rpc"], limit=bad), 400)


def test_memory_search_limits(gw):
    for ok in (1, 100):
        r = get(gw, "/api/memory/search", gw["rpc"], q="hello", limit=ok)
        assert r.status_code == 200, r.text
        assert isinstance(r.json()["results"], list)
    assert get(gw, "/api/memory/search", gw["rpc"], q="hello").status_code == 200
    for bad in (0, 101):
        assert_rest_error(get(gw, "/api/memory/search", gw["rpc"], q="hello", limit=bad), 400)
    assert_rest_error(get(gw, "/api/memory/search", gw["rpc"]), 400)
    assert_rest_error(get(gw, "/api/memory/search", gw["rpc"], q=""), 400)


def test_memory_stats(gw):
    r = get(gw, "/api/memory/stats", gw["rpc"])
    assert r.status_code == 200
    body = r.json()
    assert body["ftsIndexed"] is True
    assert body["totalEntries"] >= 0 and body["agentId"] is None


def test_chat_with_a_session_key_continues(gw):
    key = f"rest-{uuid.uuid4().hex[:8]}"
    r = api_chat(gw, {"message": "hello", "sessionKey": key})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "response": HELLO_REPLY,
        "tokensUsed": {"input": 10, "output": 5, "total": 15},
        "finishReason": "stop",
    }

    def session():
        sessions = get(gw, "/api/chat/history", gw["rpc"]).json()["sessions"]
        mine = [s for s in sessions if s["sessionKey"].endswith(f":{key}")]
        assert len(mine) == 1, sessions
        return mine[0]

    first = session()
    assert first["channel"] == "api" and first["agentId"] == "default"
    r = api_chat(gw, {"message": "and again", "sessionKey": key})
    assert r.status_code == 200
    second = session()
    assert second["sessionKey"] == first["sessionKey"]
    assert second["messageCount"] > first["messageCount"] >= 2
    assert second["inputTokens"] > first["inputTokens"]
    # channel filter
    filtered = get(gw, "/api/chat/history", gw["rpc"], channelId="api").json()["sessions"]
    assert any(s["sessionKey"] == first["sessionKey"] for s in filtered)
    assert all(s["channel"] == "api" for s in filtered)
    # an admin token sees every tenant's sessions
    everyone = get(gw, "/api/chat/history", gw["admin"]).json()["sessions"]
    assert any(s["sessionKey"] == first["sessionKey"] for s in everyone)


def test_chat_without_a_session_key(gw):
    r = api_chat(gw, {"message": "anything"})
    assert r.status_code == 200
    assert r.json()["finishReason"] == "stop"


def test_rest_errors(gw):
    base = gw["base"]
    msg = assert_rest_error(get(gw, "/api/agents"), 401)
    assert "token" in msg.lower()
    assert_rest_error(get(gw, "/api/agents", "not-a-token-0123456789abcdefghijklmnop"), 401)
    assert_rest_error(get(gw, "/api/agents", gw["mcp"]), 403)
    assert_rest_error(get(gw, "/api/agents", gw["api"]), 403)
    assert_rest_error(get(gw, "/api/no-such-route", gw["rpc"]), 404)
    assert_rest_error(api_chat(gw, {"message": "hello", "bogus": 1}), 400)
    assert_rest_error(api_chat(gw, {"message": ""}), 400)
    assert_rest_error(api_chat(gw, {}), 400)
    assert_rest_error(api_chat(gw, {"message": "hello", "agentId": "no-such-agent"}), 404)
    assert_rest_error(api_chat(gw, {"message": "hello", "sessionKey": "k" * 201}), 400)
    r = httpx.post(
        f"{base}/api/chat", content=b"{not json", headers={**auth(gw["rpc"]), "Content-Type": "application/json"},
        timeout=10,
    )
    assert_rest_error(r, 400)
    r = httpx.delete(f"{base}/api/agents", headers=auth(gw["rpc"]), timeout=10)
    assert_rest_error(r, 405)
