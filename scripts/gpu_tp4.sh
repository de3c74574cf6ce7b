#!/bin/bash
# gpu_tp4.sh: tensor parallelism on 4 GPUs (issue 16; device tool `nvidia-h200-x4`; TP=8 on an
# `nvidia-h200-x8`), one call:
# test_cuda_engine's tensor-parallel test at TP 4 (golden fixtures, cvllm-tiny-py, the qwen3-0.6b
# preset), `bench throughput` of the qwen3-8b preset at TP 4 (default workload, batch 1), and
# --enforce-eager profiled runs at TP 2 and 4 (the all-reduce time per step, which the graphs
# hide). From the repository root with the bundle in build-cudarun; logs in $OUT.
H=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp}
export NCCL_NVLS_ENABLE=0
R="bash $H/run.sh"
S=$OUT/summary.txt
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee -a "$S"
M=/tmp/qwen3-0.6b M8=/tmp/qwen3-8b
$R cvllm mkmodel --preset qwen3-0.6b --seed 0 $M > /dev/null 2>&1
$R cvllm mkmodel --preset qwen3-8b --seed 0 $M8 > /dev/null 2>&1 &
mk=$!
t=$(date +%s)
CVLLM_BIN=$H/bin/cvllm CVLLM_TEST_TP_MODEL=$M CVLLM_TEST_FILTER=test_tensor_parallel \
  CVLLM_TEST_TP_SIZE=${TP:-4} CVLLM_TEST_TP_PRESETS=${TP_PRESETS:-test-qwen2} \
  timeout ${ENGINE_TIMEOUT:-150} $R test_cuda_engine > "$OUT/engine4.log" 2>&1
echo "test_cuda_engine (TP ${TP:-4}) exit $? ($(($(date +%s) - t)) s)" | tee -a "$S"
grep -E "tensor parallel|NOT A TIE|FAIL|parts at|PASSED|OK \]" "$OUT/engine4.log" | head -40 | tee -a "$S"
wait $mk
b() {
  local tag=$1 m=$2 tp=$3
  shift 3
  echo "==== $tag: bench throughput $m -tp $tp $*" >> "$OUT/bench4.log"
  timeout ${BENCH_TIMEOUT:-80} $R cvllm bench throughput "$m" --device cuda \
    --tensor-parallel-size "$tp" "$@" >> "$OUT/bench4.log" 2>&1
  printf '%-26s rc %d  %s\n' "$tag" $? "$(grep -h Throughput "$OUT/bench4.log" | tail -1)" | tee -a "$S"
}
N=${TP:-4}
b 8b-tp$N-default $M8 $N
b 8b-tp$N-batch1 $M8 $N --num-seqs 1 --input-len 16 --output-len 1024
CVLLM_CUDA_PROFILE=1 b 8b-tp2-batch1-eager-prof $M8 2 --num-seqs 1 --input-len 16 --output-len 256 --enforce-eager
CVLLM_CUDA_PROFILE=1 b 8b-tp$N-batch1-eager-prof $M8 $N --num-seqs 1 --input-len 16 --output-len 256 --enforce-eager
CVLLM_CUDA_PROFILE=1 b 0.6b-tp2-default-eager-prof $M 2 --enforce-eager
grep -E "==== |cuda profile: (decode|prefill) " "$OUT/bench4.log" | grep -v " 0 steps" | tee -a "$S"
echo "done $(date -u)" | tee -a "$S"
