#!/usr/bin/env bash
# The store backends side by side: the gateway rows of benches/v1_proxy (/v1, non-streaming and
# streaming) and benches/agent_turn (agent.execute over /ws) on SQLite and on PostgreSQL,
# alternated ROUNDS times in one session so the ratios compare like with like. PostgreSQL is a
# throwaway cluster in a temp dir with the server's default durability (fsync on, synchronous
# commit on), on loopback; it is stopped and removed at the end.
#
#   bash benches/postgres/run.sh            # ROUNDS=3 BENCH_SECONDS=5 V1_CONNECTIONS=8
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
export BENCH_SECONDS=${BENCH_SECONDS:-5}
V1_CONNECTIONS=${V1_CONNECTIONS:-8}

. benches/postgres/cluster.sh

cargo bench --bench v1_proxy --no-run >/dev/null 2>&1
cargo bench --bench agent_turn --no-run >/dev/null 2>&1
v1=$(ls -t target/release/deps/v1_proxy-* | grep -v '\.d$' | head -1)
turn=$(ls -t target/release/deps/agent_turn-* | grep -v '\.d$' | head -1)

for round in $(seq "$ROUNDS"); do
  for backend in sqlite postgres; do
    if [ "$backend" = postgres ]; then
      db="bench_${round}"
      psql "CREATE DATABASE $db"
      export AGENT_GATEWAY_DATABASE_URL="postgres://gateway@127.0.0.1:$port/$db"
    else
      unset AGENT_GATEWAY_DATABASE_URL
    fi
    echo "== round $round: $backend"
    BENCH_TARGETS=gateway BENCH_CONNECTIONS=$V1_CONNECTIONS "$v1" 2>&1 | grep -E '^\| gateway' | sed "s/^| gateway/| $backend \/v1/"
    BENCH_CALLS=${BENCH_CALLS:-1600} "$turn" 2>&1 | grep -E '^\| (ephemeral|stored)' | sed "s/^| /| $backend agent.execute /"
  done
done
