"""A live gateway process on 127.0.0.1 for the Python tests (the binary the suite just built)."""

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def gateway(tmp_path_factory):
    binary = Path(os.environ.get("AGENT_GATEWAY_BIN", ROOT / "target" / "debug" / "agent-gateway"))
    tmp = tmp_path_factory.mktemp("gw")
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
    )
    log = open(tmp / "gateway.log", "w")
    proc = subprocess.Popen([str(binary), "serve", "--config", str(config)], stdout=log, stderr=log)
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
                raise RuntimeError(f"gateway did not start: {(tmp / 'gateway.log').read_text()}")
            time.sleep(0.1)
    yield {"base": base, "ws": f"ws://127.0.0.1:{port}/ws", "admin": ADMIN, "rpc": RPC}
    proc.terminate()
    proc.wait(timeout=15)
    log.close()
