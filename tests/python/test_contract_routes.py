"""The contract the gateway serves over HTTP: /openrpc.json (the generated document, valid against
the OpenRPC meta-schema) and the JSON-RPC method pages under /docs/rpc/."""

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parents[2]


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_served_openrpc_document_is_the_generated_file_and_validates(gateway):
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    status, headers, body = _get(f"{gateway['base']}/openrpc.json")
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert body == (ROOT / "generated" / "openrpc.json").read_bytes()

    meta_path = os.environ.get("OPENRPC_META_SCHEMA")
    schema_meta_path = os.environ.get("JSON_SCHEMA_META_SCHEMA")
    assert meta_path and schema_meta_path, "the test command sets OPENRPC_META_SCHEMA and JSON_SCHEMA_META_SCHEMA"
    meta = json.loads(Path(meta_path).read_text())
    schema_meta = Resource.from_contents(json.loads(Path(schema_meta_path).read_text()), default_specification=DRAFT7)
    registry = Registry().with_resources(
        [("https://meta.json-schema.tools", schema_meta), ("https://meta.json-schema.tools/", schema_meta)]
    )
    validator = jsonschema.Draft7Validator(meta, registry=registry)
    errors = sorted(validator.iter_errors(json.loads(body)), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message[:200]}" for e in errors[:10])


def test_method_pages_cover_every_method_of_the_document(gateway):
    document = json.loads((ROOT / "generated" / "openrpc.json").read_text())
    by_namespace = {}
    for m in document["methods"]:
        by_namespace.setdefault(m["tags"][0]["name"], []).append(m)
    status, _, index = _get(f"{gateway['base']}/docs/rpc/")
    assert status == 200
    index = index.decode()
    for namespace, methods in by_namespace.items():
        assert f'href="{namespace}.html"' in index
        status, headers, page = _get(f"{gateway['base']}/docs/rpc/{namespace}.html")
        assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
        page = page.decode()
        for m in methods:
            assert f'<section class="method" id="{m["name"]}">' in page, m["name"]
            assert f'scope: {m["x-scope"]}' in page, m["name"]
