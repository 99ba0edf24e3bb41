#!/usr/bin/env bash
# Installs the Autobahn testsuite (`wstest`, Python 2 code) into its own virtualenv,
# target/autobahn/venv, with every dependency pinned (requirements.txt). Python 2.7 comes from
# $AUTOBAHN_PYTHON2, else pyenv's 2.7.18 (shipped in this project's machine image), else
# python2.7 on PATH. The virtualenv is made by virtualenv 20.21.1 (the last release that creates
# Python 2 environments, with pip 20.3.4 and setuptools 44.1.1 bundled), itself installed into
# a Python 3 bootstrap venv beside it. Safe to run again: it does nothing when up to date.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=target/autobahn
VENV=$DIR/venv
STAMP=$VENV/.requirements.sha256
REQ=tests/autobahn/requirements.txt

fail() { printf 'autobahn install: %s\n' "$*" >&2; exit 1; }

want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ -x "$VENV/bin/wstest" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  exit 0
fi

PY2=${AUTOBAHN_PYTHON2:-}
if [ -z "$PY2" ]; then
  for candidate in "${PYENV_ROOT:-$HOME/.pyenv}/versions/2.7.18/bin/python" "$(command -v python2.7 || true)"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then PY2=$candidate; break; fi
  done
fi
[ -n "$PY2" ] || fail "Python 2.7 not found: set AUTOBAHN_PYTHON2, or install it (pyenv install 2.7.18)"
"$PY2" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (2, 7) else 1)' \
  || fail "$PY2 is not Python 2.7"
command -v python3 >/dev/null || fail "python3 is needed to bootstrap virtualenv"

rm -rf "$VENV"
mkdir -p "$DIR"
[ -x "$DIR/bootstrap/bin/python" ] || python3 -m venv "$DIR/bootstrap" \
  || fail "cannot create the bootstrap venv (python3 -m venv)"
"$DIR/bootstrap/bin/python" -m pip install -q --disable-pip-version-check virtualenv==20.21.1 \
  || fail "cannot install virtualenv 20.21.1 from PyPI"
"$DIR/bootstrap/bin/python" -m virtualenv -q --no-download -p "$PY2" "$VENV" \
  || fail "cannot create the Python 2.7 virtualenv at $VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-python-version-warning -r "$REQ" \
  || fail "cannot install the pinned Autobahn testsuite ($REQ); gcc and Python 2.7 headers are needed for wsaccel"
"$VENV/bin/wstest" --autobahnversion >/dev/null 2>&1 || fail "wstest does not start"
echo "$want" > "$STAMP"
echo "autobahn install: wstest ready in $VENV"
