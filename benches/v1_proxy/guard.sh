#!/usr/bin/env bash
# The instruction budget of one /v1 request, checked in CI (scripts/test.sh runs it).
#
#   benches/v1_proxy/guard.sh            # counts, compares with budget.txt, fails above it + 10%
#   benches/v1_proxy/guard.sh --update   # counts and writes the new figure into budget.txt
#
# It counts the debug build the test suite already built (target/debug/agent-gateway), with
# the upstream played by a debug build of the bench (built here if missing), so CI builds no
# release binary for it. The figure is every user-space instruction of the gateway process
# (all threads, the SQLite writer too) per non-streaming /v1 request, as instructions.sh counts
# it, with GUARD_REQUESTS requests (default 300) after 200 to warm up; the lowest of
# GUARD_RUNS counts (default 2) is compared, since a count only ever goes up with noise
# (a batch that falls badly), never down.
#
# A change that makes every request pay shows up here as a failure naming the figure. Lower the
# budget (--update) when a change makes requests cheaper, so that the margin stays tight.
set -euo pipefail
cd "$(dirname "$0")/../.."
budget_file=benches/v1_proxy/budget.txt
bin=target/debug/agent-gateway
requests=${GUARD_REQUESTS:-300}
runs=${GUARD_RUNS:-2}
margin_pct=10

[ -x "$bin" ] || cargo build -q --bin agent-gateway
harness=$(ls -t target/debug/deps/v1_proxy-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
if [ -z "$harness" ]; then
  cargo test -q --bench v1_proxy --no-run
  harness=$(ls -t target/debug/deps/v1_proxy-* | grep -v '\.d$' | head -1)
fi

lowest=
for _ in $(seq "$runs"); do
  line=$(V1_PROXY_HARNESS="$harness" benches/v1_proxy/instructions.sh gateway "$bin" "$requests" | grep '^gateway:' | tail -1)
  count=$(echo "$line" | awk '{print $2}')
  echo "guard: $line"
  if [ -z "$lowest" ] || [ "$count" -lt "$lowest" ]; then lowest=$count; fi
done

if [ "${1:-}" = "--update" ]; then
  printf '%s\n' "$lowest" > "$budget_file"
  echo "guard: budget.txt is now $lowest instructions per /v1 request (debug build)"
  exit 0
fi
budget=$(tr -dc '0-9' < "$budget_file")
limit=$((budget + budget * margin_pct / 100))
echo "guard: lowest of $runs runs: $lowest instructions per /v1 request; budget $budget, limit $limit (+$margin_pct%)"
if [ "$lowest" -gt "$limit" ]; then
  echo "guard: FAILED: a /v1 request costs $lowest instructions, over the budget's limit $limit." >&2
  echo "guard: find what every request now pays (CALLGRIND_KEEP=dir benches/v1_proxy/instructions.sh gateway $bin), or, if the cost is deliberate, raise budget.txt in the same commit and say why." >&2
  exit 1
fi
if [ "$lowest" -lt $((budget - budget * margin_pct / 100)) ]; then
  echo "guard: requests got cheaper than the budget by more than $margin_pct%: lower it (benches/v1_proxy/guard.sh --update)"
fi
