"""GET /metrics against a live gateway, read with Prometheus' own parser
(`prometheus_client.parser`): who may read it, a valid exposition whose every label value is
from a bounded set, and counters and gauges that move by exactly what was done. The gateway is
its own process and the tests run one at a time, so deltas are exact."""

import json
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_gateway_sdk import Client, WsClient
from conftest import HELLO_REPLY

ROOT = Path(__file__).resolve().parents[2]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The route templates of `agentgw_http_*` (gateway/src/metrics.rs `ROUTES`).
ROUTES = {
    "other", "/", "/health", "/metrics", "/rpc", "/ws", "/api/health", "/api/agents",
    "/api/channels", "/api/activity", "/api/memory/search", "/api/memory/stats",
    "/api/chat/history", "/api/chat", "/api/chat/stream", "/api/events", "/v1/chat/completions",
    "/v1/models", "/v1/models/{model}", "/v1/embeddings", "/v1/responses", "/media/{id}",
    "/media/{id}/meta", "{webhooks}/webhook", "{webhooks}/{mapping}", "/openapi.json",
    "/openrpc.json", "/docs/rpc/{page}", "/docs/{file}", "/app/{file}",
}
HTTP_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "other"}
LIMITERS = {"http", "ws_messages", "turns_per_client", "turns_global", "rpc_method", "webhook_queue"}
# The public methods of the catalogue (the OpenRPC document lists exactly those).
CATALOGUE = {m["name"] for m in json.loads((ROOT / "generated" / "openrpc.json").read_text())["methods"]}


@pytest.fixture(scope="module")
def gw(scripted_gateway):
    return scripted_gateway


def auth(token):
    return {"Authorization": f"Bearer {token}"} if token else {}


def scrape(gw, token=None):
    r = httpx.get(f"{gw['base']}/metrics", headers=auth(token or gw["admin"]), timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == CONTENT_TYPE
    return r.text


def families(gw):
    return {f.name: f for f in text_string_to_metric_families(scrape(gw))}


def sample(gw, name, **labels):
    """The value of the sample `name{labels}` (exactly these labels); 0 when absent."""
    for family in text_string_to_metric_families(scrape(gw)):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def rpc(gw, body, token=None):
    r = httpx.post(f"{gw['base']}/rpc", content=json.dumps(body), headers={
        **auth(token or gw["rpc"]), "content-type": "application/json"}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_auth_and_content_type(gw):
    r = httpx.get(f"{gw['base']}/metrics", timeout=10)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert set(r.json()) == {"error"}
    for token in (gw["rpc"], gw["api"], gw["mcp"]):
        r = httpx.get(f"{gw['base']}/metrics", headers=auth(token), timeout=10)
        assert r.status_code == 403, r.text
        assert "metrics" in r.json()["error"]
    scraper = Client(gw["base"], gw["admin"]).tokens_create({"scopes": ["metrics"]})["secret"]
    assert scrape(gw, scraper).startswith("# ")
    # The scraper's token opens nothing else.
    r = httpx.get(f"{gw['base']}/api/agents", headers=auth(scraper), timeout=10)
    assert r.status_code == 403


def test_the_exposition_parses_and_every_label_is_bounded(gw):
    # Some of everything: known and unknown paths, methods and JSON-RPC names, an SSE stream.
    httpx.get(f"{gw['base']}/health", timeout=10)
    httpx.get(f"{gw['base']}/nope/abc123", timeout=10)
    httpx.request("BREW", f"{gw['base']}/health", timeout=10)
    httpx.get(f"{gw['base']}/v1/models/script/m1", headers=auth(gw["rpc"]), timeout=10)
    httpx.get(f"{gw['base']}/media/some-file-id", headers=auth(gw["rpc"]), timeout=10)
    rpc(gw, {"jsonrpc": "2.0", "id": 1, "method": "x.secretname"})
    rpc(gw, {"jsonrpc": "2.0", "id": 1, "method": "system.ping"})
    text = scrape(gw)
    for leak in ("abc123", "nope", "secretname", "some-file-id", "BREW"):
        assert leak not in text, leak
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["agentgw_http_requests"].type == "counter"
    assert fams["agentgw_rpc_requests"].type == "counter"
    # Histograms, with buckets (not summaries).
    for name in ("agentgw_http_request_duration_seconds", "agentgw_rpc_request_duration_seconds"):
        assert fams[name].type == "histogram", name
        assert any(s.name == f"{name}_bucket" and s.labels["le"] == "+Inf" for s in fams[name].samples)
    assert fams["agentgw_websocket_connections"].type == "gauge"
    assert fams["agentgw_sse_subscribers"].type == "gauge"
    seen_routes = set()
    for family in fams.values():
        assert family.name.startswith("agentgw_"), family.name
        for s in family.samples:
            labels = dict(s.labels)
            labels.pop("le", None)
            if "route" in labels:
                assert labels["route"] in ROUTES, s
                seen_routes.add(labels["route"])
            if family.name.startswith("agentgw_http_"):
                assert labels["method"] in HTTP_METHODS, s
                if "status" in labels:
                    assert labels["status"].isdigit() and len(labels["status"]) == 3, s
            if family.name.startswith("agentgw_rpc_"):
                assert labels["method"] == "unknown" or labels["method"] in CATALOGUE, s
                if "outcome" in labels:
                    o = labels["outcome"]
                    assert o == "ok" or (o.startswith("-") and o[1:].isdigit()), s
            if family.name == "agentgw_rate_limited":
                assert labels["limiter"] in LIMITERS, s
    assert {"/health", "other", "/v1/models/{model}", "/media/{id}", "/rpc", "/metrics"} <= seen_routes
    assert any(s.labels["method"] == "other" for s in fams["agentgw_http_requests"].samples)


def test_http_counters_move_by_exactly_the_requests_made(gw):
    n = 9
    labels = dict(route="/health", method="GET", status="200")
    before = sample(gw, "agentgw_http_requests_total", **labels)
    count_before = sample(gw, "agentgw_http_request_duration_seconds_count", route="/health", method="GET")
    for _ in range(n):
        assert httpx.get(f"{gw['base']}/health", timeout=10).status_code == 200
    assert sample(gw, "agentgw_http_requests_total", **labels) - before == n
    assert sample(gw, "agentgw_http_request_duration_seconds_count", route="/health", method="GET") - count_before == n

    other = dict(route="other", method="GET", status="404")
    before = sample(gw, "agentgw_http_requests_total", **other)
    for i in range(4):
        assert httpx.get(f"{gw['base']}/nope/abc{i}", timeout=10).status_code == 404
    assert sample(gw, "agentgw_http_requests_total", **other) - before == 4

    unauthorized = dict(route="/v1/chat/completions", method="POST", status="401")
    before = sample(gw, "agentgw_http_requests_total", **unauthorized)
    for _ in range(3):
        r = httpx.post(f"{gw['base']}/v1/chat/completions", json={}, timeout=10)
        assert r.status_code == 401
    assert sample(gw, "agentgw_http_requests_total", **unauthorized) - before == 3


def test_rpc_counters_move_by_exactly_the_calls_made_on_both_transports(gw):
    ok = dict(method="system.ping", outcome="ok")
    before = sample(gw, "agentgw_rpc_requests_total", **ok)
    duration_before = sample(gw, "agentgw_rpc_request_duration_seconds_count", method="system.ping")
    client = Client(gw["base"], gw["rpc"])
    for _ in range(5):
        assert client.system_ping()["pong"] is True
    # A batch counts each call.
    batch = [{"jsonrpc": "2.0", "id": i, "method": "system.ping"} for i in range(3)]
    assert len(rpc(gw, batch)) == 3
    with WsClient(gw["ws"], gw["rpc"]) as ws:
        for _ in range(4):
            assert ws.system_ping()["pong"] is True
    assert sample(gw, "agentgw_rpc_requests_total", **ok) - before == 12
    assert sample(gw, "agentgw_rpc_request_duration_seconds_count", method="system.ping") - duration_before == 12

    unknown = dict(method="unknown", outcome="-32601")
    before = sample(gw, "agentgw_rpc_requests_total", **unknown)
    for _ in range(2):
        assert rpc(gw, {"jsonrpc": "2.0", "id": 1, "method": "x.secretname"})["error"]["code"] == -32601
    assert sample(gw, "agentgw_rpc_requests_total", **unknown) - before == 2

    scope = dict(method="gateway.status", outcome="-32603")
    before = sample(gw, "agentgw_rpc_requests_total", **scope)
    assert rpc(gw, {"jsonrpc": "2.0", "id": 1, "method": "gateway.status"})["error"]["code"] == -32603
    assert sample(gw, "agentgw_rpc_requests_total", **scope) - before == 1


def wait_for(gw, name, want, **labels):
    deadline = time.time() + 10
    while True:
        got = sample(gw, name, **labels)
        if got == want or time.time() > deadline:
            return got
        time.sleep(0.05)


def test_the_websocket_and_sse_gauges_follow_open_streams(gw):
    ws_before = sample(gw, "agentgw_websocket_connections")
    with WsClient(gw["ws"], gw["rpc"]) as ws:
        ws.system_ping()
        assert sample(gw, "agentgw_websocket_connections") == ws_before + 1
    assert wait_for(gw, "agentgw_websocket_connections", ws_before) == ws_before

    sse_before = sample(gw, "agentgw_sse_subscribers")
    timeout = httpx.Timeout(10.0, read=8.0)
    with httpx.stream("GET", f"{gw['base']}/api/events", headers=auth(gw["rpc"]), timeout=timeout) as r:
        assert r.status_code == 200
        # The stream is open (its `retry:` line); the iterator is kept: dropping it closes
        # the response.
        lines = r.iter_lines()
        assert next(lines).startswith("retry:")
        assert sample(gw, "agentgw_sse_subscribers") == sse_before + 1
    assert wait_for(gw, "agentgw_sse_subscribers", sse_before) == sse_before


def test_model_calls_tokens_and_turns_are_counted(gw):
    def model_samples():
        out = {}
        for family in text_string_to_metric_families(scrape(gw)):
            for s in family.samples:
                if s.labels.get("provider") == "script" and not s.name.endswith(("_bucket", "_sum")):
                    key = (s.name, s.labels.get("outcome"), s.labels.get("kind"))
                    out[key] = out.get(key, 0.0) + s.value
        return out

    turns_before = sample(gw, "agentgw_turns_total", finish_reason="stop")
    before = model_samples()
    r = httpx.post(f"{gw['base']}/v1/chat/completions", headers=auth(gw["rpc"]), timeout=30,
                   json={"model": "script/m1", "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == HELLO_REPLY
    after = model_samples()

    def delta(name, outcome=None, kind=None):
        key = (name, outcome, kind)
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("agentgw_model_calls_total", outcome="ok") == 1
    assert delta("agentgw_model_tokens_total", kind="input") == 10
    assert delta("agentgw_model_tokens_total", kind="output") == 5
    assert delta("agentgw_model_call_duration_seconds_count") == 1
    assert sample(gw, "agentgw_turns_total", finish_reason="stop") - turns_before == 1
