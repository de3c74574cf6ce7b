#!/bin/bash
# gpu_tp_debug.sh: tensor-parallel runs of the tiny preset traced (CVLLM_TP_TRACE=1), with a
# watchdog that shows where each process waits if one hangs (thread wait channels, and a
# cuda-gdb backtrace of the first hang); non-blocking and blocking NCCL communicators, graphs off
# and on. Logs in $OUT/debug_TAG.log.
H=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp}
export NCCL_NVLS_ENABLE=0
M=/tmp/tiny
bash "$H/run.sh" cvllm mkmodel --preset tiny --seed 0 $M > /dev/null 2>&1
CG=$(command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
gdb_left=1
# one TAG BLOCKING EXTRA_ARGS
one() {
  local tag=$1 blocking=$2 extra=$3
  local log=$OUT/debug_$tag.log
  CVLLM_NCCL_BLOCKING=$blocking CVLLM_TP_TRACE=1 NCCL_DEBUG=WARN bash "$H/run.sh" cvllm complete $M \
    --device cuda -tp 2 --prompt-ids 1,2,3,4,5 --prompt-ids 7,8,9 --max-tokens 6 --temperature 0 \
    --max-num-seqs 4 --max-model-len 256 --kv-cache-memory 64M $extra > "$log" 2>&1 &
  local pid=$!
  for i in $(seq 150); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  if kill -0 $pid 2>/dev/null; then
    echo "== $tag: HUNG after 15 s; where:" >> "$log"
    for p in $(pgrep -f "cvllm complete|cvllm-tp-rank"); do
      echo "-- pid $p $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-60)" >> "$log"
      for t in /proc/$p/task/*; do echo "   $(cat $t/comm) $(cat $t/wchan)" >> "$log"; done
      if [ -n "$CG" ] && [ $gdb_left = 1 ]; then
        timeout 40 "$CG" -p $p --batch -ex "thread apply all bt 14" 2>&1 | grep -E "^#|^Thread" | head -80 >> "$log"
      fi
    done
    gdb_left=0
    pkill -9 -f "cvllm complete"; pkill -9 -f "cvllm-tp-rank"; sleep 1
  fi
  wait $pid; echo "== $tag: exit $?" >> "$log"
  echo "=== $tag: $(tail -1 "$log")"
  grep -v "^\[tp rank" "$log" | grep -v "^cvllm: " | head -30
  grep "^\[tp rank" "$log" | tail -12
}
one nb-eager 0 --enforce-eager
one b-eager 1 --enforce-eager
one nb-graphs 0 ""
one b-graphs 1 ""
