#!/bin/bash
# gpu_tp.sh: tensor parallelism (issue 15) on a machine of 2 GPUs (device tool `nvidia-h200-x2`),
# in one call. From the repository root, with the bundle of scripts/gpu_bundle.sh in build-cudarun:
#   bash build-cudarun/gpu_tp.sh [tests] [bench] [bench8b]
# tests:   test_cuda_kernels, test_cuda_engine (its tensor-parallel test included, and on the
#          qwen3-0.6b preset through CVLLM_TEST_TP_MODEL), tests/test_cuda_tp_kill.sh
# bench:   `bench throughput` of the qwen3-0.6b preset at TP 1 and 2 (default workload, batch 1),
#          profiled (CVLLM_CUDA_PROFILE=1: the all-reduce time per step)
# bench8b: the same for the qwen3-8b preset (written here: ~16 GB, about a minute)
# Logs in $OUT (summary.txt, one log per part).
H=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp}
export NCCL_NVLS_ENABLE=0
R="bash $H/run.sh"
S=$OUT/summary.txt
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee -a "$S"
$R bash -c 'ldd $(command -v cvllm) | grep -i nccl' | tee -a "$S"
date -u | tee -a "$S"
M=/tmp/qwen3-0.6b
$R cvllm mkmodel --preset qwen3-0.6b --seed 0 "$M" > /dev/null 2>&1
T0=$(date +%s)
parts=" $* "
[ $# -eq 0 ] && parts=" tests bench "
if [[ $parts == *" tests "* ]]; then
  t=$(date +%s)
  TEST_TIMEOUT=290 timeout 300 $R test_cuda_kernels > "$OUT/kernels.log" 2>&1
  echo "test_cuda_kernels exit $? ($(($(date +%s) - t)) s)" | tee -a "$S"
  t=$(date +%s)
  CVLLM_BIN=$H/bin/cvllm CVLLM_TEST_TP_MODEL=$M CVLLM_TEST_FILTER=${ENGINE_TESTS:-*} \
    CVLLM_TEST_TP_PRESETS=${TP_PRESETS:-test-qwen3,test-qwen2,test-llama} \
    timeout ${ENGINE_TIMEOUT:-400} $R test_cuda_engine > "$OUT/engine.log" 2>&1
  echo "test_cuda_engine exit $? ($(($(date +%s) - t)) s)" | tee -a "$S"
  grep -E "^\[  (FAILED|PASSED|SKIPPED)|^\[       OK|FAIL|NOT A TIE|tensor parallel|tp " "$OUT/engine.log" | head -60 | tee -a "$S"
  t=$(date +%s)
  CVLLM_BIN=$H/bin/cvllm CVLLM_TP_MODEL=$M timeout 150 $R bash tests/test_cuda_tp_kill.sh > "$OUT/kill.log" 2>&1
  echo "test_cuda_tp_kill exit $? ($(($(date +%s) - t)) s)" | tee -a "$S"
  cat "$OUT/kill.log" | tail -15 | tee -a "$S"
fi
# b TAG MODEL TP ARGS...: one bench throughput run, its figure into the summary
b() {
  local tag=$1 m=$2 tp=$3
  shift 3
  local s=$(date +%s.%N)
  echo "==== $tag: bench throughput $m -tp $tp $*" >> "$OUT/bench.log"
  timeout ${BENCH_TIMEOUT:-200} $R cvllm bench throughput "$m" --device cuda \
    --tensor-parallel-size "$tp" "$@" >> "$OUT/bench.log" 2>&1
  local rc=$?
  printf '%-24s rc %d %6.1f s  %s\n' "$tag" $rc "$(awk "BEGIN{print $(date +%s.%N) - $s}")" \
    "$(grep -h Throughput "$OUT/bench.log" | tail -1)" | tee -a "$S"
}
if [[ $parts == *" bench "* ]]; then
  b 0.6b-tp1-default $M 1
  b 0.6b-tp2-default $M 2
  CVLLM_CUDA_PROFILE=1 b 0.6b-tp2-default-prof $M 2
  b 0.6b-tp1-batch1 $M 1 --num-seqs 1 --input-len 16 --output-len 1024
  b 0.6b-tp2-batch1 $M 2 --num-seqs 1 --input-len 16 --output-len 1024
  grep "cuda profile" "$OUT/bench.log" | tail -24 | tee -a "$S"
fi
T0=${T0:-$(date +%s)}
if [[ $parts == *" bench8b "* ]] && [ $(($(date +%s) - T0)) -lt ${BENCH8B_BEFORE:-100000} ]; then
  M8=/tmp/qwen3-8b
  t=$(date +%s)
  $R cvllm mkmodel --preset qwen3-8b --seed 0 "$M8" > /dev/null 2>&1
  echo "mkmodel qwen3-8b: rc $? in $(($(date +%s) - t)) s" | tee -a "$S"
  b 8b-tp1-default $M8 1
  b 8b-tp2-default $M8 2
  CVLLM_CUDA_PROFILE=1 b 8b-tp2-default-prof $M8 2
  b 8b-tp1-batch1 $M8 1 --num-seqs 1 --input-len 16 --output-len 1024
  b 8b-tp2-batch1 $M8 2 --num-seqs 1 --input-len 16 --output-len 1024
  CVLLM_CUDA_PROFILE=1 b 8b-tp2-batch1-prof $M8 2 --num-seqs 1 --input-len 16 --output-len 512
  grep "cuda profile" "$OUT/bench.log" | tail -36 | tee -a "$S"
fi
echo "done $(date -u)" | tee -a "$S"
