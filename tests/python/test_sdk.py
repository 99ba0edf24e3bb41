"""The generated Python SDK against a live gateway, and the OpenRPC document against its meta-schema."""

import json
import os
from pathlib import Path

import jsonschema
import pytest

from agent_gateway_sdk import Client, RpcError, WsClient
from agent_gateway_sdk.types import METHOD_SCOPES

ROOT = Path(__file__).resolve().parents[2]


def test_ping_over_http(gateway):
    result = Client(gateway["base"], gateway["rpc"]).system_ping()
    assert result["pong"] is True
    assert isinstance(result["ts"], int)


def test_ping_and_status_over_websocket(gateway):
    with WsClient(gateway["ws"], gateway["admin"]) as ws:
        assert ws.system_ping()["pong"] is True
        status = ws.gateway_status()
        assert status["pid"] > 0 and status["generation"] >= 1


def test_errors_surface_as_rpc_error(gateway):
    client = Client(gateway["base"], gateway["rpc"])
    with pytest.raises(RpcError) as e:
        client.gateway_status()
    assert e.value.code == -32603
    assert "admin" in e.value.message
    with pytest.raises(RpcError) as e:
        Client(gateway["base"], gateway["admin"]).session_delete({"key": "x"})
    assert e.value.code == -32602


def test_sdk_has_one_typed_method_per_method():
    openrpc = json.loads((ROOT / "generated" / "openrpc.json").read_text())
    names = {m["name"] for m in openrpc["methods"]}
    assert names == set(METHOD_SCOPES)
    typed = [a for a in vars(Client.__mro__[2]) if not a.startswith("_") and a != "call"]
    assert len(typed) == len(names)


def test_openrpc_document_validates_against_the_meta_schema():
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    meta_path = os.environ.get("OPENRPC_META_SCHEMA")
    schema_meta_path = os.environ.get("JSON_SCHEMA_META_SCHEMA")
    assert meta_path and schema_meta_path, "the test command sets OPENRPC_META_SCHEMA and JSON_SCHEMA_META_SCHEMA"
    meta = json.loads(Path(meta_path).read_text())
    schema_meta = Resource.from_contents(json.loads(Path(schema_meta_path).read_text()), default_specification=DRAFT7)
    registry = Registry().with_resources(
        [("https://meta.json-schema.tools", schema_meta), ("https://meta.json-schema.tools/", schema_meta)]
    )
    document = json.loads((ROOT / "generated" / "openrpc.json").read_text())
    validator = jsonschema.Draft7Validator(meta, registry=registry)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message[:200]}" for e in errors[:10])
