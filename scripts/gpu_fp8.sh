#!/bin/bash
# gpu_fp8.sh: one short single-GPU call: every GPU test (the fp8 KV cache's included), the
# default workload with a bf16 and an fp8 KV cache, and the transformers bf16 comparison of
# scripts/gpu_checks.sh (its "hf" part). From the repository root with the bundle in
# build-cudarun; logs in $OUT.
H=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp}
export NCCL_NVLS_ENABLE=0
R="bash $H/run.sh"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$S"
M=/tmp/qwen3-0.6b
$R cvllm mkmodel --preset qwen3-0.6b --seed 0 $M > /dev/null 2>&1
t=$(date +%s)
timeout 100 $R test_cuda_kernels > "$OUT/kernels.log" 2>&1
echo "test_cuda_kernels exit $? ($(($(date +%s) - t)) s)" | tee -a "$S"
grep -E "FAILED|fp8|NaN" "$OUT/kernels.log" | head -12 | tee -a "$S"
t=$(date +%s)
CVLLM_BIN=$H/bin/cvllm timeout 170 $R test_cuda_engine > "$OUT/engine.log" 2>&1
echo "test_cuda_engine exit $? ($(($(date +%s) - t)) s)" | tee -a "$S"
grep -E "^\[  (FAILED|PASSED)|^\[       OK|FAIL|NOT A TIE|fp8|agree" "$OUT/engine.log" | head -30 | tee -a "$S"
for kv in bfloat16 fp8; do
  timeout 60 $R cvllm bench throughput $M --device cuda --kv-cache-dtype $kv >> "$OUT/bench.log" 2>&1
  echo "default workload, kv $kv: rc $? $(grep -h Throughput "$OUT/bench.log" | tail -1)" | tee -a "$S"
done
timeout 40 $R cvllm bench throughput $M --device cuda --kv-cache-dtype fp8 --num-seqs 64 --input-len 8000 --output-len 256 >> "$OUT/bench.log" 2>&1
echo "64 x 8000 + 256, kv fp8: rc $? $(grep -h Throughput "$OUT/bench.log" | tail -1)" | tee -a "$S"
timeout 40 $R cvllm bench throughput $M --device cuda --num-seqs 64 --input-len 8000 --output-len 256 >> "$OUT/bench.log" 2>&1
echo "64 x 8000 + 256, kv bf16: rc $? $(grep -h Throughput "$OUT/bench.log" | tail -1)" | tee -a "$S"
if [ -z "${NO_HF:-}" ]; then
  W=$(mktemp /tmp/cvllm-wrap.XXXXXX)
  printf '#!/bin/bash\nexec bash %q cvllm "$@"\n' "$H/run.sh" > "$W"; chmod +x "$W"
  models=()
  for r in tests/fixtures/golden/*/reference.json; do models+=("$(dirname "$r"):$r"); done
  models+=("models/cvllm-tiny-py:tests/fixtures/trained/reference.json" "$M")
  PYTHONUNBUFFERED=1 timeout -k 5 ${HF_TIMEOUT:-90} python3 "$H/compare_hf_gpu.py" --cvllm "$W" --dtype bf16 "${models[@]}" > "$OUT/hf_bf16.log" 2>&1
  echo "compare_hf_gpu --dtype bf16: exit $?" | tee -a "$S"
  grep -E "SUMMARY|parts|tie" "$OUT/hf_bf16.log" | head -20 | tee -a "$S"
fi
echo "done $(date -u)" | tee -a "$S"
