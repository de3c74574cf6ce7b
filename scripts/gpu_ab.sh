#!/bin/bash
# gpu_ab.sh: one change against its switch, in one call of the device tool (issue 14). In the
# bundle (scripts/gpu_bundle.sh copies it); on the GPU machine, from the repository root:
#   A="CVLLM_CUDA_FUSE=0" bash build-cudarun/gpu_ab.sh
# Runs test_cuda_kernels (TESTS=0: not), `bench ops --device cuda $OPS` with and without $A (OPS
# empty: none), then each workload of $WORKLOADS (default "default fixed batch1") with the build
# as it is and with the environment $A (space-separated VAR=VALUE), alternated, $REPS times (2);
# BASE=path/to/another/bundle/run.sh adds that build (say, the last commit's) as a third variant.
# Logs and $OUT/summary.txt.
H=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp}
L=$OUT/bench.log
M=/tmp/qwen3-0.6b
: >"$L"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$L"
date -u | tee -a "$L"
[ -d "$M" ] || bash "$H/run.sh" cvllm mkmodel --preset qwen3-0.6b --seed 0 "$M" >>"$L" 2>&1
declare -A W=(
    [default]=""
    [fixed]="--num-seqs 256 --input-len 562 --output-len 523"
    [batch1]="--num-seqs 1 --input-len 16 --output-len 1024"
    [prefill]="--num-seqs 64 --input-len 2048 --output-len 1"
    [fp8]="--kv-cache-dtype fp8"
)
if [ "${TESTS:-1}" = 1 ]; then
    TEST_TIMEOUT=290 timeout 300 bash "$H/run.sh" test_cuda_kernels >"$OUT/test_cuda_kernels.log" 2>&1
    echo "test_cuda_kernels exit $?" | tee -a "$OUT/summary.txt"
    grep -E "PASSED|FAILED|OK \]|relative error|differs|Error|error" "$OUT/test_cuda_kernels.log" | tail -30
fi
if [ -n "${OPS:-}" ]; then
    timeout 200 bash "$H/run.sh" cvllm bench ops --device cuda $OPS >"$OUT/ops_new.txt" 2>&1
    env $A timeout 200 bash "$H/run.sh" cvllm bench ops --device cuda $OPS >"$OUT/ops_A.txt" 2>&1
    paste -d'|' <(cut -c1-100 "$OUT/ops_new.txt") <(sed 's/^ *//' "$OUT/ops_A.txt" | cut -c1-60) | head -${OPS_LINES:-80}
fi
M2=${MODEL:-$M}
for r in $(seq 1 "${REPS:-2}"); do
    for w in ${WORKLOADS:-default fixed batch1}; do
        for v in new A ${BASE:+base}; do
            envs=""; [ "$v" = A ] && envs="$A"
            run="$H/run.sh"; [ "$v" = base ] && run="$BASE"
            echo "==== $w $v ($envs)" >>"$L"
            env $envs timeout "${BENCH_TIMEOUT:-150}" bash "$run" cvllm bench throughput "$M2" \
                --device cuda ${W[$w]} ${EXTRA:-} >>"$L" 2>&1
            rc=$?
            line=$(grep -h "Throughput" "$L" | tail -1)
            printf '%-8s %-4s rc %d  %s\n' "$w" "$v" $rc "${line#Time: }" | tee -a "$OUT/summary.txt"
        done
    done
done
