"""The OpenAI-compatible API (`/v1`) through the official `openai` Python SDK, and its error
mapping through raw HTTP where the SDK hides the details. Replies come from a scripted provider,
so text and token counts are known."""

import base64
import json
import math
import struct
import time

import httpx
import openai
import pytest

from conftest import BODY_LIMIT, DEFAULT_REPLY, HELLO_REPLY

MODEL = "script/m1"
HELLO = [{"role": "user", "content": "hello"}]
EMBEDDING_DIMS = 16  # the scripted provider's vectors


@pytest.fixture(scope="module")
def gw(scripted_gateway):
    return scripted_gateway


def sdk(gw, token=None, **kw) -> openai.OpenAI:
    return openai.OpenAI(
        api_key=token or gw["rpc"], base_url=f"{gw['base']}/v1", max_retries=0, timeout=30, **kw
    )


def auth(token):
    return {"Authorization": f"Bearer {token}"}


def post(gw, path, body=None, *, token=None, content=None, headers=None):
    h = auth(token or gw["rpc"])
    h.update(headers or {})
    if content is not None:
        h.setdefault("Content-Type", "application/json")
        return httpx.post(f"{gw['base']}{path}", content=content, headers=h, timeout=30)
    return httpx.post(f"{gw['base']}{path}", json=body, headers=h, timeout=30)


def chat(gw, **fields):
    body = {"model": MODEL, "messages": HELLO}
    body.update(fields)
    return post(gw, "/v1/chat/completions", body)


def assert_v1_error(resp, status, kind, message=None, contains=None):
    """The spec's body: exactly {error: {message, type, param, code: null}}."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == kind, err
    assert err["code"] is None
    assert isinstance(err["message"], str) and err["message"]
    assert err["param"] is None or isinstance(err["param"], str)
    if message is not None:
        assert err["message"] == message
    if contains is not None:
        assert contains.lower() in err["message"].lower(), err["message"]
    return err


def sse_data(text):
    """The `data:` payloads of an event stream, in order."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = [ln[len("data:"):].lstrip(" ") for ln in block.split("\n") if ln.startswith("data:")]
        if lines:
            out.append("\n".join(lines))
    return out


# --- models -------------------------------------------------------------------------------


def test_models_list(gw):
    page = sdk(gw).models.list()
    ids = [m.id for m in page.data]
    assert MODEL in ids
    for m in page.data:
        assert "/" in m.id
        assert m.object == "model"
        assert m.created == 0
        assert m.owned_by == m.id.split("/", 1)[0]


def test_models_retrieve_with_the_sdk(gw):
    # The SDK percent-encodes the path parameter: GET /v1/models/script%2Fm1.
    m = sdk(gw).models.retrieve(MODEL)
    assert m.id == MODEL
    assert m.owned_by == "script"
    assert m.object == "model"


def test_models_retrieve_with_a_literal_slash(gw):
    r = httpx.get(f"{gw['base']}/v1/models/{MODEL}", headers=auth(gw["rpc"]), timeout=10)
    assert r.status_code == 200, r.text
    assert r.json() == {"id": MODEL, "object": "model", "created": 0, "owned_by": "script"}


# --- chat completions -----------------------------------------------------------------------


def test_chat_completion(gw):
    c = sdk(gw).chat.completions.create(model=MODEL, messages=HELLO)
    assert c.id.startswith("chatcmpl-")
    assert c.object == "chat.completion"
    assert c.model == MODEL
    assert abs(c.created - time.time()) < 120
    assert len(c.choices) == 1
    choice = c.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert choice.message.content == HELLO_REPLY
    assert choice.finish_reason == "stop"
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) == (10, 5, 15)


def test_chat_completion_joins_text_blocks_and_takes_the_last_user_message(gw):
    c = sdk(gw).chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "something else"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "say"}, {"type": "text", "text": "hello"}]},
        ],
    )
    assert c.choices[0].message.content == HELLO_REPLY
    c = sdk(gw).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}, {"role": "user", "content": "bye"}],
    )
    assert c.choices[0].message.content == DEFAULT_REPLY


def test_chat_completion_model_as_bare_id_or_agent_id(gw):
    for model in ("m1", "default", "stepper"):
        c = sdk(gw).chat.completions.create(model=model, messages=HELLO)
        assert c.model == model
        assert c.choices[0].message.content == HELLO_REPLY


def test_finish_reason_length_when_the_agent_runs_out_of_steps(gw):
    keep_going = [{"role": "user", "content": "keep going"}]
    c = sdk(gw).chat.completions.create(model="stepper", messages=keep_going)
    assert c.choices[0].finish_reason == "length"
    chunks = list(sdk(gw).chat.completions.create(model="stepper", messages=keep_going, stream=True))
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    resp = sdk(gw).responses.create(model="stepper", input="keep going")
    assert resp.status == "incomplete"


def test_chat_completion_with_an_api_scope_token(gw):
    c = sdk(gw, gw["api"]).chat.completions.create(model=MODEL, messages=HELLO)
    assert c.choices[0].message.content == HELLO_REPLY


def test_chat_stream_with_usage(gw):
    chunks = list(
        sdk(gw).chat.completions.create(
            model=MODEL, messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
    )
    assert len(chunks) >= 4
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].id.startswith("chatcmpl-")
    for c in chunks:
        assert c.object == "chat.completion.chunk"
        assert c.model == MODEL
    first, *middle, finish, usage = chunks
    assert len(first.choices) == 1
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].finish_reason is None
    assert first.usage is None
    assert middle, "no content chunks"
    for c in middle:
        assert len(c.choices) == 1 and c.choices[0].index == 0
        assert c.choices[0].delta.role is None
        assert c.choices[0].finish_reason is None
        assert c.choices[0].delta.content
        assert c.usage is None
    assert "".join(c.choices[0].delta.content for c in middle) == HELLO_REPLY
    assert finish.choices[0].finish_reason == "stop"
    assert finish.choices[0].delta.content is None and finish.choices[0].delta.role is None
    assert finish.usage is None
    assert usage.choices == []
    assert (usage.usage.prompt_tokens, usage.usage.completion_tokens, usage.usage.total_tokens) == (10, 5, 15)


def test_chat_stream_wire_format(gw):
    r = chat(gw, stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    data = sse_data(r.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    # usage appears in the usage chunk only
    assert all("usage" not in c for c in chunks[:-1])


def test_chat_stream_without_usage(gw):
    chunks = list(sdk(gw).chat.completions.create(model=MODEL, messages=HELLO, stream=True))
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == HELLO_REPLY
    for fields in ({"stream": True}, {"stream": True, "stream_options": {"include_usage": False}}):
        r = chat(gw, **fields)
        data = sse_data(r.text)
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        assert all("usage" not in c and c["choices"] for c in chunks), chunks
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_client_disconnecting_mid_stream_leaves_the_gateway_healthy(gw):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a long one"}], "stream": True}
    for _ in range(3):
        with httpx.stream(
            "POST", f"{gw['base']}/v1/chat/completions", json=body, headers=auth(gw["rpc"]), timeout=30
        ) as r:
            assert r.status_code == 200
            first = next(r.iter_raw())
            assert first.startswith(b"data: ")
        # leaving the block closes the connection with the rest of the stream unread
    assert httpx.get(f"{gw['base']}/health", timeout=10).status_code == 200
    c = sdk(gw).chat.completions.create(model=MODEL, messages=HELLO)
    assert c.choices[0].message.content == HELLO_REPLY
    streamed = list(sdk(gw).chat.completions.create(model=MODEL, messages=HELLO, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == HELLO_REPLY


# --- embeddings ------------------------------------------------------------------------------


def test_embeddings_default_encoding(gw):
    # The SDK asks for base64 and decodes it into floats.
    e = sdk(gw).embeddings.create(model=MODEL, input="some text to embed")
    assert e.object == "list"
    assert e.model == MODEL
    assert len(e.data) == 1
    vec = e.data[0].embedding
    assert isinstance(vec, list) and len(vec) == EMBEDDING_DIMS
    assert all(isinstance(x, float) and math.isfinite(x) for x in vec)
    assert e.usage.prompt_tokens == math.ceil(len("some text to embed") / 4)
    assert e.usage.total_tokens == e.usage.prompt_tokens


def test_embeddings_float(gw):
    inputs = ["first", "second input", "third"]
    e = sdk(gw).embeddings.create(model=MODEL, input=inputs, encoding_format="float")
    assert [d.index for d in e.data] == [0, 1, 2]
    for d in e.data:
        assert d.object == "embedding"
        assert len(d.embedding) == EMBEDDING_DIMS
        assert all(isinstance(x, float) for x in d.embedding)
    assert e.usage.prompt_tokens == sum(math.ceil(len(s) / 4) for s in inputs)
    # the SDK's base64 path decodes to the same vectors
    again = sdk(gw).embeddings.create(model=MODEL, input=inputs)
    for a, b in zip(e.data, again.data):
        assert a.embedding == pytest.approx(b.embedding, abs=1e-7)


def test_embeddings_base64_wire_format(gw):
    r = post(gw, "/v1/embeddings", {"model": MODEL, "input": "abc", "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    b64 = r.json()["data"][0]["embedding"]
    assert isinstance(b64, str)
    raw = base64.b64decode(b64)
    assert len(raw) == 4 * EMBEDDING_DIMS
    floats = list(struct.unpack(f"<{EMBEDDING_DIMS}f", raw))
    r = post(gw, "/v1/embeddings", {"model": MODEL, "input": "abc"})
    assert r.json()["data"][0]["embedding"] == pytest.approx(floats, abs=1e-7)


# --- responses -------------------------------------------------------------------------------


def test_responses_non_streaming(gw):
    resp = sdk(gw).responses.create(model=MODEL, input="hello", instructions="Be brief.")
    assert resp.output_text == HELLO_REPLY
    assert resp.status == "completed"
    assert resp.object == "response"
    assert resp.model == MODEL
    assert resp.instructions == "Be brief."
    assert resp.usage.input_tokens == 10 and resp.usage.output_tokens == 5
    assert resp.usage.total_tokens == 15


def test_responses_with_message_input(gw):
    resp = sdk(gw).responses.create(
        model=MODEL,
        input=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
        ],
    )
    assert resp.output_text == HELLO_REPLY


def test_responses_streaming(gw):
    events = list(sdk(gw).responses.create(model=MODEL, input="hello", stream=True))
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas
    n = len(deltas)
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * n,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(d.delta for d in deltas)
    assert text == HELLO_REPLY
    assert events[-4].type == "response.output_text.done" and events[-4].text == HELLO_REPLY
    completed = events[-1].response
    assert completed.status == "completed"
    assert completed.output_text == HELLO_REPLY
    assert completed.usage.total_tokens == 15
    assert events[0].response.status == "in_progress"
    assert len({e.response.id for e in (events[0], events[1], events[-1])}) == 1


# --- errors: one test per row ------------------------------------------------------------------


def test_400_unknown_field(gw):
    r = chat(gw, frobnicate=1)
    assert_v1_error(r, 400, "invalid_request_error", contains="frobnicate")


def test_400_unknown_field_in_a_message(gw):
    r = chat(gw, messages=[{"role": "user", "content": "hello", "name_of_thing": "x"}])
    assert_v1_error(r, 400, "invalid_request_error")


@pytest.mark.parametrize("temperature", [2.5, -0.1, 2.0000001])
def test_400_temperature_out_of_range(gw, temperature):
    assert_v1_error(chat(gw, temperature=temperature), 400, "invalid_request_error", contains="temperature")


@pytest.mark.parametrize("temperature", [0, 2, 0.0, 2.0, 1.3])
def test_temperature_at_the_limits_accepted(gw, temperature):
    r = chat(gw, temperature=temperature)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == HELLO_REPLY


def test_400_max_tokens_zero(gw):
    assert_v1_error(chat(gw, max_tokens=0), 400, "invalid_request_error", contains="max_tokens")


def test_400_max_tokens_negative(gw):
    assert_v1_error(chat(gw, max_tokens=-1), 400, "invalid_request_error")


def test_400_max_tokens_not_an_integer(gw):
    assert_v1_error(chat(gw, max_tokens=1.5), 400, "invalid_request_error")


def test_max_tokens_one_accepted(gw):
    r = chat(gw, max_tokens=1)
    assert r.status_code == 200, r.text


def test_400_no_user_message(gw):
    r = chat(gw, messages=[{"role": "system", "content": "x"}, {"role": "assistant", "content": "y"}])
    err = assert_v1_error(r, 400, "invalid_request_error", contains="user message")
    assert err["param"] == "messages"


def test_400_image_url_block(gw):
    content = [
        {"type": "text", "text": "hello, what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    r = chat(gw, messages=[{"role": "user", "content": content}])
    err = assert_v1_error(r, 400, "invalid_request_error", contains="vision")
    assert "not supported" in err["message"].lower()
    assert err["param"] == "messages[0].content[1]"


def test_400_malformed_json(gw):
    r = post(gw, "/v1/chat/completions", content=b'{"model": "script/m1", "messages": [')
    assert_v1_error(r, 400, "invalid_request_error")


def test_400_empty_messages(gw):
    assert_v1_error(chat(gw, messages=[]), 400, "invalid_request_error", contains="messages")


def test_400_missing_model(gw):
    r = post(gw, "/v1/chat/completions", {"messages": HELLO})
    assert_v1_error(r, 400, "invalid_request_error")


def test_400_bad_role(gw):
    assert_v1_error(chat(gw, messages=[{"role": "wizard", "content": "hello"}]), 400, "invalid_request_error")


def test_400_empty_embedding_input(gw):
    r = post(gw, "/v1/embeddings", {"model": MODEL, "input": []})
    err = assert_v1_error(r, 400, "invalid_request_error")
    assert err["param"] == "input"


def test_401_missing_token(gw):
    r = httpx.post(f"{gw['base']}/v1/chat/completions", json={"model": MODEL, "messages": HELLO}, timeout=10)
    assert_v1_error(r, 401, "authentication_error")
    assert r.headers.get("www-authenticate", "").lower().startswith("bearer")
    r = httpx.get(f"{gw['base']}/v1/models", timeout=10)
    assert_v1_error(r, 401, "authentication_error")


def test_401_invalid_token(gw):
    r = post(gw, "/v1/chat/completions", {"model": MODEL, "messages": HELLO}, token="x" * 40)
    assert_v1_error(r, 401, "authentication_error")
    r = httpx.get(f"{gw['base']}/v1/models", headers={"Authorization": "Basic Zm9vOmJhcg=="}, timeout=10)
    assert_v1_error(r, 401, "authentication_error")


def test_403_mcp_client_token(gw):
    r = post(gw, "/v1/chat/completions", {"model": MODEL, "messages": HELLO}, token=gw["mcp"])
    assert_v1_error(r, 403, "permission_error")
    r = httpx.get(f"{gw['base']}/v1/models", headers=auth(gw["mcp"]), timeout=10)
    assert_v1_error(r, 403, "permission_error")


def test_404_unknown_model(gw):
    r = chat(gw, model="nope/never")
    assert_v1_error(r, 404, "not_found_error", message="Model not found: nope/never")
    r = chat(gw, model="unknown-model", stream=True)
    assert_v1_error(r, 404, "not_found_error", message="Model not found: unknown-model")


def test_404_unknown_single_model(gw):
    r = httpx.get(f"{gw['base']}/v1/models/nope/never", headers=auth(gw["rpc"]), timeout=10)
    assert_v1_error(r, 404, "not_found_error", message="Model not found")


def test_404_unknown_embedding_model(gw):
    r = post(gw, "/v1/embeddings", {"model": "nope/never", "input": "x"})
    assert_v1_error(r, 404, "not_found_error", message="Model not found: nope/never")


def test_404_embeddings_without_an_embedding_model(start_gateway):
    chat_only = start_gateway(
        "  rateLimit: {windowMs: 60000, maxRequests: 100000}\n",
        body=(
            "local: {autoFetch: false, preload: false}\n"
            "providers:\n"
            "  script:\n"
            "    type: scripted\n"
            "    models: [m1]\n"
            "    script: [{steps: [{reply: hi}]}]\n"
            "models:\n"
            "  - {id: script/m1, capabilities: [chat, streaming]}\n"
            "agents:\n"
            "  default: {model: script/m1}\n"
        ),
    )
    r = post(chat_only, "/v1/embeddings", {"model": MODEL, "input": "x"})
    assert_v1_error(r, 404, "not_found_error", message="No embedding provider configured")
    with pytest.raises(openai.NotFoundError):
        sdk(chat_only).embeddings.create(model=MODEL, input="x")
    # the model still chats
    assert sdk(chat_only).chat.completions.create(model=MODEL, messages=HELLO).choices[0].message.content == "hi"


def _exact_body(size: int) -> bytes:
    body = json.dumps({"model": MODEL, "messages": HELLO}).encode()
    assert len(body) <= size
    return body + b" " * (size - len(body))  # trailing whitespace is valid JSON


def test_413_body_over_the_limit(gw):
    body = _exact_body(BODY_LIMIT + 1)
    r = post(gw, "/v1/chat/completions", content=body)
    assert_v1_error(r, 413, "server_error")


def test_413_chunked_body_over_the_limit(gw):
    body = _exact_body(BODY_LIMIT + 100)

    def chunks():
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    r = httpx.post(
        f"{gw['base']}/v1/chat/completions",
        content=chunks(),
        headers={**auth(gw["rpc"]), "Content-Type": "application/json"},
        timeout=30,
    )
    assert "content-length" not in {k.lower() for k in r.request.headers}
    assert_v1_error(r, 413, "server_error")


def test_body_exactly_at_the_limit_accepted(gw):
    body = _exact_body(BODY_LIMIT)
    assert len(body) == BODY_LIMIT
    r = post(gw, "/v1/chat/completions", content=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == HELLO_REPLY


def test_429_rate_limit(start_gateway):
    limited = start_gateway("  rateLimit: {windowMs: 60000, maxRequests: 3}\n")
    for _ in range(3):
        r = httpx.get(f"{limited['base']}/v1/models", headers=auth(limited["rpc"]), timeout=10)
        assert r.status_code == 200, r.text
    r = httpx.get(f"{limited['base']}/v1/models", headers=auth(limited["rpc"]), timeout=10)
    assert_v1_error(r, 429, "rate_limit_error")
    assert int(r.headers["retry-after"]) >= 1
    r = post(limited, "/v1/chat/completions", {"model": MODEL, "messages": HELLO})
    assert_v1_error(r, 429, "rate_limit_error")
    with pytest.raises(openai.RateLimitError):
        sdk(limited).models.list()
    # the REST API shares the limit and answers in its own format
    r = httpx.get(f"{limited['base']}/api/agents", headers=auth(limited["rpc"]), timeout=10)
    assert r.status_code == 429
    assert set(r.json()) == {"error"} and isinstance(r.json()["error"], str)
    # health is exempt
    assert httpx.get(f"{limited['base']}/health", timeout=10).status_code == 200
    assert httpx.get(f"{limited['base']}/api/health", timeout=10).status_code == 200


# --- the SDK's exception classes ---------------------------------------------------------------


def test_sdk_raises_not_found(gw):
    with pytest.raises(openai.NotFoundError) as e:
        sdk(gw).chat.completions.create(model="nope/never", messages=HELLO)
    assert e.value.status_code == 404
    assert e.value.type == "not_found_error"
    assert "Model not found: nope/never" in e.value.message


def test_sdk_raises_authentication_error(gw):
    with pytest.raises(openai.AuthenticationError) as e:
        sdk(gw, "not-a-real-token-0123456789abcdefghijklmnop").models.list()
    assert e.value.status_code == 401
    assert e.value.type == "authentication_error"


def test_sdk_raises_permission_denied(gw):
    with pytest.raises(openai.PermissionDeniedError) as e:
        sdk(gw, gw["mcp"]).chat.completions.create(model=MODEL, messages=HELLO)
    assert e.value.status_code == 403
    assert e.value.type == "permission_error"


def test_sdk_raises_bad_request(gw):
    with pytest.raises(openai.BadRequestError) as e:
        sdk(gw).chat.completions.create(model=MODEL, messages=HELLO, temperature=2.5)
    assert e.value.status_code == 400
    assert e.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        sdk(gw).chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        sdk(gw).responses.create(model=MODEL, input="hello", temperature=-1)
