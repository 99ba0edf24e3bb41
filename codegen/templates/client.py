"""Small JSON-RPC clients for agent-gateway: HTTP (stdlib only) and WebSocket (`websockets`)."""

import itertools
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Optional

from . import types


class RpcError(Exception):
    """A JSON-RPC error answered by the gateway."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data


def _unwrap(response: Dict[str, Any]) -> Any:
    error = response.get("error")
    if error is not None:
        raise RpcError(error.get("code", 0), error.get("message", ""), error.get("data"))
    return response.get("result")


class _HttpClient:
    """JSON-RPC over HTTP: POST <base_url>/rpc with a bearer token."""

    def __init__(self, base_url: str, token: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._ids = itertools.count(1)

    def call(self, method: str, params: Optional[Dict[str, Any]] = None) -> Any:
        body = json.dumps(
            {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params or {}}
        ).encode()
        request = urllib.request.Request(
            f"{self.base_url}/rpc",
            data=body,
            headers={"content-type": "application/json", "authorization": f"Bearer {self.token}"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return _unwrap(json.loads(response.read()))
        except urllib.error.HTTPError as e:
            raise RpcError(e.code, e.reason or "HTTP error") from e


class _WsClient:
    """JSON-RPC over WebSocket: GET <url>?token=...; notifications go to `on_notification`."""

    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        from websockets.sync.client import connect  # optional dependency

        sep = "&" if "?" in url else "?"
        self._socket = connect(f"{url}{sep}token={urllib.parse.quote(token)}", open_timeout=timeout)
        self.timeout = timeout
        self._ids = itertools.count(1)
        self.on_notification: Callable[[str, Any], None] = lambda method, params: None
        self.notifications: List[Dict[str, Any]] = []

    def call(self, method: str, params: Optional[Dict[str, Any]] = None) -> Any:
        request_id = next(self._ids)
        self._socket.send(
            json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}})
        )
        while True:
            message = json.loads(self._socket.recv(timeout=self.timeout))
            if "method" in message:
                self.notifications.append(message)
                self.on_notification(message["method"], message.get("params"))
                continue
            if message.get("id") == request_id:
                return _unwrap(message)

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> "_WsClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
