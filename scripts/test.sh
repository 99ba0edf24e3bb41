#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what the tests need (a Python virtualenv
# with the SDK and tools, npm packages, Debian packages when run as root: Node.js, the
# PostgreSQL server, valgrind), then runs lints, the generated-files check, the Rust tests (with
# the fuzz corpus replay), the instruction budget of a /v1 request, the Autobahn WebSocket
# conformance run, the TypeScript SDK type-check, the Python tests and the Node tests of the
# OpenAI-compatible API.
# The PostgreSQL tests start a throwaway server themselves (tests/suite/pg.rs) from the server
# binaries (AGENT_GATEWAY_PG_BIN, else /usr/lib/postgresql/*/bin, else initdb on PATH), or use
# the existing server AGENT_GATEWAY_TEST_DATABASE_URL=postgres://user@host:port/db names (they
# create their own databases on it). The distribution's system cluster is never used.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

step() { printf '\n==> %s\n' "$*"; }

# A clean CI build gains nothing from incremental caches, and they double the disk used.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi

if ! command -v npm >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    step "installing nodejs and npm (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  else
    echo "npm is required (install Node.js), or run as root so apt-get can install it" >&2
    exit 1
  fi
fi

# PostgreSQL server binaries for the throwaway test cluster (its system cluster is never used:
# a warning from the package that it could not start one, in a container without init, is
# harmless).
pg_found() {
  [ -n "${AGENT_GATEWAY_TEST_DATABASE_URL:-}" ] || [ -n "${AGENT_GATEWAY_PG_BIN:-}" ] ||
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1
}
if ! pg_found; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    # postgresql-15 where the distribution has it (Debian 12), else its default server version
    pg_pkg=postgresql
    if apt-cache policy postgresql-15 2>/dev/null | grep -q 'Candidate: [0-9]'; then pg_pkg=postgresql-15; fi
    step "installing the PostgreSQL server ($pg_pkg, apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pg_pkg" >/dev/null
  else
    echo "PostgreSQL server binaries (initdb, postgres) are required: install postgresql-15, or set" >&2
    echo "AGENT_GATEWAY_PG_BIN to the directory holding them, or AGENT_GATEWAY_TEST_DATABASE_URL to an" >&2
    echo "existing server (postgres://user@host:port/db); or run as root so apt-get can install it" >&2
    exit 1
  fi
fi
# openssl makes the certificates of the PostgreSQL TLS test (postgresql-common brings it too).
if ! command -v openssl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    step "installing openssl (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
  else
    echo "openssl is required (the PostgreSQL TLS test makes its certificates with it)" >&2
    exit 1
  fi
fi

# prlimit (util-linux) applies the process runner's resource limits (gateway/src/proc).
if ! command -v prlimit >/dev/null 2>&1 && [ ! -x /usr/bin/prlimit ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    step "installing util-linux (prlimit, apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq util-linux >/dev/null
  else
    echo "prlimit (util-linux) is required (the process runner's limits)" >&2
    exit 1
  fi
fi

# valgrind (callgrind) counts the instructions of a /v1 request for the budget check.
for tool in valgrind curl; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      step "installing $tool (apt-get)"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$tool" >/dev/null
    else
      echo "$tool is required (the /v1 instruction budget check), or run as root so apt-get can install it" >&2
      exit 1
    fi
  fi
done

step "Python virtualenv (.venv)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt


step "Autobahn testsuite (wstest, Python 2.7 virtualenv in target/autobahn)"
bash tests/autobahn/install.sh

step "npm packages (tests/node)"
(cd tests/node && npm install --no-audit --no-fund --loglevel=error >/dev/null)
node -e "process.stdout.write(JSON.stringify(require('./tests/node/node_modules/@open-rpc/meta-schema').openrpcDocument))" > target-openrpc-meta.json.tmp
mkdir -p target && mv target-openrpc-meta.json.tmp target/openrpc-meta-schema.json

step "formatting and generated files"
cargo fmt --all -- --check
cargo run -q -p gateway-codegen -- check

step "documentation (relative links and anchors, the README's quick start against .ci/run)"
python3 scripts/check_docs.py

step "clippy"
cargo clippy -q --all-targets -- -D warnings

step "local models (fetched once into the model cache, verified)"
cargo build -q --bin agent-gateway
./target/debug/agent-gateway fetch-models

step "Rust tests"
cargo test -q --all 2>&1 | tee target/cargo-test.log | grep -vE '^\s*$' | grep -E 'test result|FAILED|panicked|error' || true
if grep -qE 'FAILED|error(\[|:)' target/cargo-test.log || ! grep -q 'test result' target/cargo-test.log; then
  cat target/cargo-test.log
  exit 1
fi

step "the /v1 instruction budget (callgrind on the debug build, benches/v1_proxy/guard.sh)"
benches/v1_proxy/guard.sh

step "RFC 6455 conformance (Autobahn fuzzingclient against the test build's /ws-echo)"
cargo test -q --test suite rpc::autobahn:: -- --ignored --nocapture 2>&1 | tee target/autobahn.log | grep -E '^autobahn:|test result' || true
if ! grep -q 'test result: ok. 1 passed' target/autobahn.log; then
  cat target/autobahn.log
  exit 1
fi

step "TypeScript SDK type-check (tsc)"
tests/node/node_modules/.bin/tsc -p generated/sdk/typescript

step "Python tests (SDK against a live gateway)"
AGENT_GATEWAY_BIN="$ROOT/target/debug/agent-gateway" OPENRPC_META_SCHEMA="$ROOT/target/openrpc-meta-schema.json" \
  JSON_SCHEMA_META_SCHEMA="$ROOT/tests/node/node_modules/@json-schema-tools/meta-schema/schema.json" \
  PYTHONPATH="$ROOT/generated/sdk/python" .venv/bin/python -m pytest -q -p no:cacheprovider tests/python

step "Node SDK tests (openai npm)"
AGENT_GATEWAY_BIN="$ROOT/target/debug/agent-gateway" node --test tests/node/*.test.mjs
