#!/bin/bash
# test_cuda_tp_kill.sh: a tensor-parallel rank that dies ends the whole engine, never a hang.
#  1. SIGKILL to rank 1 in the middle of `bench throughput -tp 2`: the command exits non-zero
#     within 10 s of the kill, its error names rank 1 and the signal.
#  2. SIGKILL to rank 0 (the engine's process): rank 1 exits by itself within 10 s.
#  3. A rank 1 that cannot start (CVLLM_TP_WORKER garbage is not possible from outside, so: a
#     tensor-parallel size larger than the GPUs) is a clear error at once.
# Needs 2 GPUs (exit 77 "skipped" otherwise). $CVLLM_BIN: the cvllm binary; $CVLLM_TP_MODEL: a
# model folder to use (default: the qwen3-0.6b preset, written to a temporary folder).
set -u
BIN=${CVLLM_BIN:-cvllm}
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${n:-0}" -lt 2 ]; then echo "skipped: ${n:-0} GPUs (2 needed)"; exit 77; fi
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
T=$(mktemp -d)
trap '[ -n "${OUT:-}" ] && cp "$T"/*.log "$OUT/" 2>/dev/null; rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
M=${CVLLM_TP_MODEL:-}
if [ -z "$M" ]; then
  M=$T/model
  "$BIN" mkmodel --preset qwen3-0.6b --seed 0 "$M" > /dev/null || { echo "FAIL: mkmodel"; exit 1; }
fi
alive() { [ -d /proc/$1 ] && ! grep -q '^State:.*Z' /proc/$1/status 2>/dev/null; }

# starts a long tensor-parallel run in the background; sets PID and WORKER once it runs steps
start_run() {
  "$BIN" bench throughput "$M" --device cuda --tensor-parallel-size 2 --num-seqs 64 \
    --input-len 64 --output-len 8000 --max-model-len 8192 > "$T/$1.log" 2>&1 &
  PID=$!
  for _ in $(seq 1200); do
    grep -q "start-up" "$T/$1.log" && break
    alive $PID || break
    sleep 0.1
  done
  sleep 2 # into the decode steps
  WORKER=$(pgrep -P $PID | head -1)
}

# 1. kill rank 1
start_run kill1
if [ -z "$WORKER" ]; then
  fail "case 1: no rank 1 process under $PID"; cat "$T/kill1.log"
else
  t0=$(date +%s.%N)
  kill -9 "$WORKER"
  for _ in $(seq 300); do alive $PID || break; sleep 0.05; done
  t1=$(date +%s.%N)
  if alive $PID; then
    fail "case 1: the engine still runs 15 s after rank 1 was killed"
    for t in /proc/$PID/task/*; do echo "    thread $(cat $t/comm): $(cat $t/wchan) $(grep State $t/status)"; done
    kill -9 $PID
  fi
  wait $PID; rc=$?
  dt=$(awk "BEGIN{printf \"%.2f\", $t1 - $t0}")
  echo "case 1: rank 1 killed; the engine exited with $rc after $dt s"
  grep -m4 -i "rank 1\|tensor parallel\|start-up" "$T/kill1.log" | sed 's/^/    /'
  [ "$rc" != 0 ] || fail "case 1: exit status 0"
  awk "BEGIN{exit !($dt < 10)}" || fail "case 1: took $dt s (10 s allowed)"
  grep -q "rank 1 is gone.*signal 9" "$T/kill1.log" || fail "case 1: the error does not name rank 1 and signal 9"
fi

# 2. kill rank 0
start_run kill0
if [ -z "$WORKER" ]; then
  fail "case 2: no rank 1 process under $PID"; cat "$T/kill0.log"
else
  t0=$(date +%s.%N)
  kill -9 $PID
  wait $PID 2>/dev/null
  for _ in $(seq 200); do alive "$WORKER" || break; sleep 0.05; done
  t1=$(date +%s.%N)
  dt=$(awk "BEGIN{printf \"%.2f\", $t1 - $t0}")
  if alive "$WORKER"; then
    fail "case 2: rank 1 still runs 10 s after rank 0 was killed"
    for t in /proc/$WORKER/task/*; do echo "    thread $(cat $t/comm): $(cat $t/wchan) $(grep State $t/status)"; done
    kill -9 "$WORKER"
  else
    echo "case 2: rank 0 killed; rank 1 exited after $dt s"
  fi
fi

# 3. more ranks than GPUs
out=$("$BIN" bench throughput "$M" --device cuda --tensor-parallel-size $((n + 2)) --num-seqs 1 \
  --input-len 8 --output-len 8 2>&1); rc=$?
echo "case 3: -tp $((n + 2)) on $n GPUs: exit $rc: $(echo "$out" | grep -m1 -i "tensor")"
[ $rc != 0 ] && echo "$out" | grep -q "needs $((n + 2)) GPUs" || fail "case 3: no clear error"

if [ $fails = 0 ]; then echo "test_cuda_tp_kill: all passed"; exit 0; fi
echo "test_cuda_tp_kill: $fails failed"; exit 1
