#!/usr/bin/env bash
# Runs one command with the gateway on a throwaway PostgreSQL cluster (benches/postgres/cluster.sh):
# a fresh database, named to the gateway by AGENT_GATEWAY_DATABASE_URL in the command's
# environment. For the benches that start their own gateway, e.g. the spawn rate of
# benches/orchestration on PostgreSQL:
#
#   bash benches/postgres/with_cluster.sh target/release/deps/orchestration-<hash>
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/postgres/cluster.sh
psql "CREATE DATABASE bench"
AGENT_GATEWAY_DATABASE_URL="postgres://gateway@127.0.0.1:$port/bench" "$@"
