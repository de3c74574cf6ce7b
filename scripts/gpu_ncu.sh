#!/bin/bash
# gpu_ncu.sh: Nsight Compute on the decode attention of a real batch (issue 14), in the bundle
# (scripts/gpu_bundle.sh copies it); on the GPU machine, from the repository root:
#   bash build-cudarun/gpu_ncu.sh
# An eager run of 256 sequences (bench.py's prompt spread is not needed: 562-token prompts, 64
# output tokens), skipping the first decode steps' attention launches, then 2 launches profiled
# with the sections that say what bounds a kernel (speed of light, memory, occupancy, warp
# stalls). Reports: $OUT/ncu_decode.txt. KERNEL=regex picks another kernel (default
# attention_decode_kernel); SKIP the launches skipped (default 28 x 30: 30 decode steps); ARGS
# replaces the bench's workload arguments; NAME the report's name (default ncu_decode).
H=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp}
M=/tmp/qwen3-0.6b
[ -d "$M" ] || bash "$H/run.sh" cvllm mkmodel --preset qwen3-0.6b --seed 0 "$M" >/dev/null 2>&1
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout ${NCU_TIMEOUT:-240} bash "$H/run.sh" "$NCU" --target-processes all \
    --kernel-name "regex:${KERNEL:-attention_decode_kernel}" --launch-skip "${SKIP:-840}" \
    --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats \
    cvllm bench throughput "$M" --device cuda --enforce-eager \
    ${ARGS:---num-seqs 256 --input-len 562 --output-len 64} >"$OUT/${NAME:-ncu_decode}.txt" 2>&1
echo "ncu exit $?"
grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Compute \(SM\)|Warp Cycles Per Issued|Stall|Block Limit|One or More|No Eligible|Issued Warp" "$OUT/${NAME:-ncu_decode}.txt" | head -60
