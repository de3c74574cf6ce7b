#!/bin/bash
# gpu_throughput.sh: issue 14's throughput workloads on a GPU machine, in one call of the device
# tool. Copied into the bundle (scripts/gpu_bundle.sh build-cuda <repo>/build-cudarun, then
# cp scripts/gpu_throughput.sh <repo>/build-cudarun/); there, from the repository root:
#   bash build-cudarun/gpu_throughput.sh
# Makes the qwen3-0.6b preset (random bf16 weights) in /tmp, runs the GPU kernel tests, the four
# workloads with this build (the default one with CVLLM_CUDA_PROFILE=1), the same with the
# optimizations switched off where a switch exists, with bin/cvllm-base when the bundle has one
# (the build before the change), a profiled --enforce-eager run (the decode step by op class),
# the engine tests, and `bench ops --device cuda` for both binaries. Logs: $OUT/bench.log.
# VARIANTS=1 adds the switched-off runs (CVLLM_CUDA_GEMV_MAX_T=0, CVLLM_CUDA_GEMV=wide|warp,
# CVLLM_CUDA_ATTN_SIMT=1); SWITCHES=1 the longest-first decode order and the programmatic
# launches switched off one at a time (CVLLM_CUDA_DEC_ORDER=0, CVLLM_CUDA_PDL=0) and the fp8
# cache. NO_SECOND=1 skips the second runs.
H=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp}
L=$OUT/bench.log
M=/tmp/qwen3-0.6b
: >"$L"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$L"
date -u | tee -a "$L"
t0=$(date +%s)
bash "$H/run.sh" cvllm mkmodel --preset qwen3-0.6b --seed 0 "$M" >>"$L" 2>&1
echo "mkmodel: rc $? in $(($(date +%s) - t0)) s" | tee -a "$L"

declare -A W=(
    [default]=""
    [fixed]="--num-seqs 256 --input-len 562 --output-len 523"
    [batch1]="--num-seqs 1 --input-len 16 --output-len 1024"
    [prefill]="--num-seqs 64 --input-len 2048 --output-len 1"
)
# b TAG BINARY WORKLOAD [ENV=VALUE ...] [-- EXTRA ARGS]
b() {
    local tag=$1 bin=$2 w=$3
    shift 3
    local envs=() extra=()
    while [ $# -gt 0 ]; do
        if [ "$1" = "--" ]; then
            shift
            extra=("$@")
            break
        fi
        envs+=("$1")
        shift
    done
    echo "==== $tag: $bin bench throughput ${W[$w]} ${extra[*]} ${envs[*]}" >>"$L"
    local s=$(date +%s.%N)
    env "${envs[@]}" timeout "${BENCH_TIMEOUT:-150}" bash "$H/run.sh" "$bin" bench throughput "$M" \
        --device cuda ${W[$w]} "${extra[@]}" >>"$L" 2>&1
    local rc=$?
    local line
    line=$(grep -h "Throughput" "$L" | tail -1)
    printf '%-28s rc %d %6.1f s  %s\n' "$tag" "$rc" "$(awk "BEGIN{print $(date +%s.%N) - $s}")" \
        "${line#Time: }" | tee -a "$OUT/summary.txt"
}

echo "== test_cuda_kernels"
TEST_TIMEOUT=290 timeout 300 bash "$H/run.sh" test_cuda_kernels >"$OUT/test_cuda_kernels.log" 2>&1
echo "test_cuda_kernels exit $?" | tee -a "$OUT/summary.txt"
grep -E "tensor cores\)|PASSED|FAILED|OK \]|FAILED \]|relative error" "$OUT/test_cuda_kernels.log" | tail -40

: >"$OUT/summary.txt.tmp"
b new-default cvllm default CVLLM_CUDA_PROFILE=1
b new-fixed cvllm fixed
b new-batch1 cvllm batch1
b new-prefill cvllm prefill
if [ -x "$H/bin/cvllm-base" ]; then
    b base-default cvllm-base default
    b base-fixed cvllm-base fixed
    b base-batch1 cvllm-base batch1
    b base-prefill cvllm-base prefill
fi
# a second run of each (the spread between runs)
if [ -z "${NO_SECOND:-}" ]; then
    b new-default-2 cvllm default
    b new-fixed-2 cvllm fixed
    b new-batch1-2 cvllm batch1
    b new-prefill-2 cvllm prefill
fi
if [ -n "${VARIANTS:-}" ]; then
    b new-batch1-nogemv cvllm batch1 CVLLM_CUDA_GEMV_MAX_T=0
    b new-batch1-gemv-wide cvllm batch1 CVLLM_CUDA_GEMV=wide
    b new-batch1-gemv-warp cvllm batch1 CVLLM_CUDA_GEMV=warp
    b new-prefill-simt cvllm prefill CVLLM_CUDA_ATTN_SIMT=1
fi
b new-default-eager-prof cvllm default CVLLM_CUDA_PROFILE=1 -- --enforce-eager
if [ -n "${SWITCHES:-}" ]; then # this round's changes switched off, and the fp8 cache
    b noorder-default cvllm default CVLLM_CUDA_DEC_ORDER=0
    b noorder-fixed cvllm fixed CVLLM_CUDA_DEC_ORDER=0
    b nopdl-default cvllm default CVLLM_CUDA_PDL=0
    b nopdl-batch1 cvllm batch1 CVLLM_CUDA_PDL=0
    b fp8-default cvllm default -- --kv-cache-dtype fp8
    echo "==== bench ops decode, CVLLM_CUDA_PDL=0" >>"$L"
    CVLLM_CUDA_PDL=0 timeout 60 bash "$H/run.sh" cvllm bench ops --device cuda decode >>"$L" 2>&1
fi
grep -h "cuda profile" "$L"

echo "== test_cuda_engine"
TEST_TIMEOUT=200 timeout 210 bash "$H/run.sh" test_cuda_engine >"$OUT/test_cuda_engine.log" 2>&1
echo "test_cuda_engine exit $?" | tee -a "$OUT/summary.txt"
grep -E "FAIL|PASSED|FAILED|OK \]" "$OUT/test_cuda_engine.log" | tail -15

for bin in cvllm cvllm-base; do
    [ -x "$H/bin/$bin" ] || continue
    echo "==== bench ops $bin" >>"$L"
    timeout 90 bash "$H/run.sh" "$bin" bench ops --device cuda all >>"$L" 2>&1
    echo "bench ops $bin: rc $?" | tee -a "$OUT/summary.txt"
done
for v in ${VARIANTS:+wide warp}; do
    echo "==== bench ops gemm, CVLLM_CUDA_GEMV=$v" >>"$L"
    CVLLM_CUDA_GEMV=$v timeout 60 bash "$H/run.sh" cvllm bench ops --device cuda gemm >>"$L" 2>&1
done
grep -A12 "^decode attention" "$L" | tail -26
echo "== summary"
cat "$OUT/summary.txt"
rm -f "$OUT/summary.txt.tmp"
date -u
