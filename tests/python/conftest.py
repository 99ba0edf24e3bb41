"""Live gateway processes on 127.0.0.1 for the Python tests (the binary the suite just built).

`gateway` is the default configuration (the local provider); `scripted_gateway` answers from a
scripted provider so replies and token counts are known; `start_gateway` starts one more
gateway with its own configuration (stopped at the end of the session)."""

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "py-admin-secret-0123456789abcdefghijklmnopqrstu"
RPC = "py-rpc-secret-0123456789abcdefghijklmnopqrstuvw"
API = "py-api-secret-0123456789abcdefghijklmnopqrstuvw"
MCP = "py-mcp-secret-0123456789abcdefghijklmnopqrstuvw"

# The scripted provider every `scripted_gateway`-style test relies on.
HELLO_REPLY = "Hello there, friend."
LONG_REPLY = " ".join(f"word{i}" for i in range(400))
DEFAULT_REPLY = "Default scripted answer."
SCRIPTED_BODY = f"""local: {{autoFetch: false, preload: false}}
providers:
  script:
    type: scripted
    models: [m1]
    script:
      - match: "hello"
        steps:
          - reply: "{HELLO_REPLY}"
            usage: {{input: 10, output: 5}}
      - match: "long"
        steps:
          - reply: "{LONG_REPLY}"
            usage: {{input: 7, output: 400}}
      - match: "keep going"
        steps:
          - toolCalls: [{{name: memory_search, arguments: {{query: a}}}}]
          - toolCalls: [{{name: memory_search, arguments: {{query: b}}}}]
          - toolCalls: [{{name: memory_search, arguments: {{query: c}}}}]
          - reply: "never reached with maxSteps 2"
      - steps:
          - reply: "{DEFAULT_REPLY}"
            usage: {{input: 3, output: 4}}
agents:
  default: {{model: script/m1}}
  stepper: {{model: script/m1, maxSteps: 2}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary() -> Path:
    return Path(os.environ.get("AGENT_GATEWAY_BIN", ROOT / "target" / "debug" / "agent-gateway"))


class Gateway(dict):
    """A running gateway: a dict of base, ws, tokens (admin, rpc, api, mcp), pid and log."""

    def stop(self):
        proc = self["_proc"]
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self["_log"].close()


def launch(tmp: Path, gateway_extra: str = "", body: str = "") -> Gateway:
    """Starts `agent-gateway serve` with the four test tokens. `gateway_extra` is YAML indented
    two spaces (more keys under `gateway:`), `body` top-level YAML (providers, agents...)."""
    port = _free_port()
    config = tmp / "gateway.yaml"
    config.write_text(
        "gateway:\n"
        "  host: 127.0.0.1\n"
        f"  port: {port}\n"
        f"  dataDir: {tmp / 'data'}\n"
        "  tokens:\n"
        f"    - {{id: admin, secret: {ADMIN}, scopes: ['*']}}\n"
        f"    - {{id: client, secret: {RPC}, scopes: [rpc]}}\n"
        f"    - {{id: apiclient, secret: {API}, scopes: [api]}}\n"
        f"    - {{id: mcp, secret: {MCP}, scopes: [mcp-client]}}\n"
        f"{gateway_extra}"
        f"{body}"
    )
    log_path = tmp / "gateway.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([str(_binary()), "serve", "--config", str(config)], stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 20
    while True:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                log.close()
                raise RuntimeError(f"gateway did not start: {log_path.read_text()}")
            time.sleep(0.1)
    return Gateway(
        base=base,
        ws=f"ws://127.0.0.1:{port}/ws",
        admin=ADMIN,
        rpc=RPC,
        api=API,
        mcp=MCP,
        pid=proc.pid,
        log_path=log_path,
        _proc=proc,
        _log=log,
    )


@pytest.fixture(scope="session")
def gateway(tmp_path_factory):
    gw = launch(tmp_path_factory.mktemp("gw"))
    yield gw
    gw.stop()


@pytest.fixture(scope="session")
def start_gateway(tmp_path_factory):
    """A factory: start_gateway(gateway_extra="", body=SCRIPTED_BODY) -> Gateway."""
    started = []

    def start(gateway_extra: str = "", body: str = SCRIPTED_BODY) -> Gateway:
        gw = launch(tmp_path_factory.mktemp("gwx"), gateway_extra, body)
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.stop()


# The body limit of `scripted_gateway` (small, so that bodies of exactly that size are cheap).
BODY_LIMIT = 16384


@pytest.fixture(scope="session")
def scripted_gateway(start_gateway):
    """The scripted provider, a rate limit high enough never to refuse a test, and a 16 KiB
    POST body limit."""
    return start_gateway(
        "  rateLimit: {windowMs: 60000, maxRequests: 1000000}\n"
        f"  httpBodyLimitBytes: {BODY_LIMIT}\n"
    )
