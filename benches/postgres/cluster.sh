# Sourced by the PostgreSQL bench scripts: a throwaway cluster in a temp dir with the server's
# default durability (fsync on, synchronous commit on), on loopback, stopped and removed when
# the sourcing script exits. Defines `psql "<sql>"` and `$port`.
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
bin=${AGENT_GATEWAY_PG_BIN:-$bin}
[ -x "$bin/initdb" ] || { echo "PostgreSQL server binaries not found (AGENT_GATEWAY_PG_BIN)" >&2; exit 1; }
dir=$(mktemp -d /tmp/gw-bench-pg.XXXXXX)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres: "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
as_pg "$bin/initdb" -D "$dir/data" -A trust -U gateway -E UTF8 --locale=C.UTF-8 >/dev/null
as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
  -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
trap 'as_pg "$bin/pg_ctl" -D "$dir/data" -m fast stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
psql() { "$bin/psql" -h 127.0.0.1 -p "$port" -U gateway -d postgres -qAt -c "$1"; }
