#!/usr/bin/env bash
# Instructions per non-streaming /v1/chat/completions request, counted by valgrind's callgrind:
# user-space work only, independent of the machine's load and of CPU frequency, so two builds
# can be compared to a fraction of a percent where timed runs move by 10-20%.
#
#   benches/v1_proxy/instructions.sh gateway [binary] [requests]   (default target/release/agent-gateway, 1000)
#   benches/v1_proxy/instructions.sh proxy [requests]
#   CALLGRIND_KEEP=/tmp/cg benches/v1_proxy/instructions.sh gateway   (keeps the dumps)
#   API_TOKENS=1000 benches/v1_proxy/instructions.sh gateway   (1000 API tokens stored first)
#   THREADS=1 benches/v1_proxy/instructions.sh gateway   (also each thread's count per request)
#   STREAM=1 benches/v1_proxy/instructions.sh gateway   (streaming requests: "stream": true)
#
# Needs valgrind, curl and python3, and the bench built once (`cargo bench --bench v1_proxy
# --no-run`): its binary plays the upstream (and the proxy). One keep-alive client sends 200
# requests to warm up, then the counted ones; the count covers every thread of the process
# (the SQLite writer too) between the two callgrind dumps.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${1:?gateway or proxy}
if [ "$target" = gateway ]; then
  bin=${2:-target/release/agent-gateway}
  n=${3:-1000}
else
  n=${2:-1000}
fi
# V1_PROXY_HARNESS names the bench binary that plays the upstream (the CI guard uses a debug
# build of it); by default the newest release build.
bench=${V1_PROXY_HARNESS:-$(ls -t target/release/deps/v1_proxy-* 2>/dev/null | grep -v '\.d$' | head -1 || true)}
if [ -z "$bench" ]; then
  echo "the bench is not built: run cargo bench --bench v1_proxy --no-run first" >&2
  exit 2
fi
for tool in valgrind callgrind_control curl python3; do
  command -v "$tool" > /dev/null || { echo "$tool is needed (apt-get install valgrind curl python3)" >&2; exit 2; }
done
work=$(mktemp -d)
# THREADS=1: one dump per thread, and the count of each thread printed too (the tokio workers'
# share is the stable figure; the SQLite threads' moves with how rows fall into batches).
threads_flag=
if [ "${THREADS:-0}" = 1 ]; then threads_flag=--separate-threads=yes; fi
pids=()
cleanup() {
  exec 3>&- || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
token=bench-secret-0123456789abcdefghijklmnopqrstuv
key=upstream-key-0123456789abcdef

# The roles exit when their standard input closes: it is a FIFO this script holds open (fd 3).
mkfifo "$work/hold"
"$bench" --v1-proxy-role upstream < "$work/hold" > "$work/upstream" &
pids+=($!)
exec 3> "$work/hold"
until [ -s "$work/upstream" ]; do sleep 0.1; done
upstream=$(awk '{print $2}' "$work/upstream")

if [ "$target" = proxy ]; then
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" \
    "$bench" --v1-proxy-role proxy "$upstream" < "$work/hold" > "$work/proxy" 2> "$work/valgrind.log" &
  pids+=($!)
  for _ in $(seq 600); do [ -s "$work/proxy" ] && break; sleep 0.2; done
  port=$(awk '{print $2}' "$work/proxy")
  model=bench-model
else
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat > "$work/bench.yaml" <<EOF
gateway:
  port: $port
  dataDir: $work/data
  tokens: [{id: bench, secret: $token, scopes: ['*']}]
  rateLimit: {windowMs: 1000, maxRequests: 1000000000}
local: {autoFetch: false, preload: false}
providers:
  up: {type: openai, baseUrl: 'http://127.0.0.1:$upstream/v1', apiKeyEnv: BENCH_UPSTREAM_KEY,
       models: [bench-model], timeoutMs: 10000, maxRetries: 0}
agents:
  default: {model: up/bench-model}
EOF
  BENCH_UPSTREAM_KEY=$key AGENT_GATEWAY_LOG=warn valgrind --tool=callgrind $threads_flag \
    --callgrind-out-file="$work/cg.%p" "$bin" serve --config "$work/bench.yaml" \
    > "$work/gateway.log" 2> "$work/valgrind.log" &
  pids+=($!)
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.5; done
  model=up/bench-model
  # API_TOKENS=n: n API tokens stored (tokens.create) before the count, as a gateway with many
  # clients has; the requests still use the configuration's token.
  if [ "${API_TOKENS:-0}" -gt 0 ]; then
    python3 - "$port" "$API_TOKENS" "$token" <<'EOF'
import http.client, json, sys
port, n, token = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
for i in range(n):
    body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tokens.create",
                       "params": {"scopes": ["rpc"], "id": f"bench-{i}"}})
    conn.request("POST", "/rpc", body, headers)
    answer = json.loads(conn.getresponse().read())
    if "result" not in answer:
        sys.exit(f"tokens.create failed: {answer}")
EOF
  fi
fi

load() {
  python3 - "$port" "$1" "$token" "$model" "${STREAM:-0}" <<'EOF'
import http.client, json, sys
port, n, token, model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
stream = sys.argv[5] == "1"
conn = http.client.HTTPConnection("127.0.0.1", port)
request = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
if stream:
    request["stream"] = True
body = json.dumps(request)
headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
# Streamed, the answer arrives in pieces ("hel", "lo", ...) and ends with [DONE].
expect = b"[DONE]" if stream else b"hello from upstream"
for _ in range(n):
    conn.request("POST", "/v1/chat/completions", body, headers)
    answer = conn.getresponse()
    text = answer.read()
    if answer.status != 200 or expect not in text:
        sys.exit(f"unexpected answer {answer.status}: {text[:200]!r}")
EOF
}

load 200
callgrind_control -d > /dev/null 2>&1
sleep 1
load "$n"
callgrind_control -d > /dev/null 2>&1
sleep 1
dumps=$(ls "$work"/cg.*.2 "$work"/cg.*.2-* 2>/dev/null || true)
total=$(cat $dumps | awk '/^summary:/ {s += $2} END {print s}')
# (guard.sh reads the "gateway: N" line of the non-streaming count)
label=$target
if [ "${STREAM:-0}" = 1 ]; then label="$target (streaming)"; fi
echo "$label: $((total / n)) instructions per request ($n requests, $total in all)"
if [ -n "$threads_flag" ]; then
  per=$(for f in $dumps; do awk -v n="$n" '/^summary:/ {if ($2 > 0) printf "%d ", $2 / n}' "$f"; done)
  echo "per thread, per request (largest first): $(echo $per | tr ' ' '\n' | sort -rn | tr '\n' ' ')"
fi
# CALLGRIND_KEEP=dir keeps the counted dumps for callgrind_annotate (per-function costs).
if [ -n "${CALLGRIND_KEEP:-}" ]; then
  mkdir -p "$CALLGRIND_KEEP"
  cp $dumps "$CALLGRIND_KEEP"/
fi
