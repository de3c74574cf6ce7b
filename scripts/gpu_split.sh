#!/bin/bash
# gpu_split.sh: a decode step's time split by op class with the graphs on (issue 14's breakdown).
# In the bundle (scripts/gpu_bundle.sh copies it); on the GPU machine, from the repository root:
#   bash build-cudarun/gpu_split.sh
# Runs each workload of $WORKLOADS (default "default"; also "fp8") and `bench ops decode` as
# built and with CVLLM_CUDA_SKIP=attn, gemm, other (the decode steps leave that class out: the
# outputs are wrong, the steps and their shapes are not), $REPS times (1). A class's share is the
# run's time less the run's without it. Logs and $OUT/split.txt.
H=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp}
export NCCL_NVLS_ENABLE=0
M=/tmp/qwen3-0.6b
S=$OUT/split.txt
[ -d "$M" ] || bash "$H/run.sh" cvllm mkmodel --preset qwen3-0.6b --seed 0 "$M" >/dev/null 2>&1
declare -A W=([default]="" [fp8]="--kv-cache-dtype fp8")
for r in $(seq 1 "${REPS:-1}"); do
    for w in ${WORKLOADS:-default}; do
        for skip in "" attn gemm other; do
            log=$OUT/split_${w}_${skip:-none}_$r.log
            CVLLM_CUDA_SKIP=$skip timeout 150 bash "$H/run.sh" cvllm bench throughput "$M" \
                --device cuda ${W[$w]} >"$log" 2>&1
            printf '%-8s skip %-6s rc %d  %s\n' "$w" "${skip:-none}" $? \
                "$(grep -h Throughput "$log" | tail -1)" | tee -a "$S"
        done
    done
done
for skip in "" attn gemm other; do
    echo "== bench ops decode, skip ${skip:-none}" | tee -a "$S"
    CVLLM_CUDA_SKIP=$skip timeout 150 bash "$H/run.sh" cvllm bench ops --device cuda decode 2>&1 |
        grep -E "graphs|eager|B +[0-9]" | tee -a "$S"
done
