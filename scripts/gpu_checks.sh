#!/bin/bash
# gpu_checks.sh: the GPU correctness checks in one call of the device tool, from the repository
# root, with a bundle made by scripts/gpu_bundle.sh (BUNDLE, default build-cudarun):
#   scripts/gpu_bundle.sh build-cuda <repo>/build-cudarun      (here)
#   bash scripts/gpu_checks.sh                                 (there; logs in $OUT)
# 1. compute-sanitizer memcheck (--leak-check full, --error-exitcode 1) on every bundled
#    test_cuda_* binary: test_cuda_kernels with CVLLM_TEST_SMALL=1 (no 8k contexts),
#    test_cuda_engine one test a process (CVLLM_TEST_FILTER), test_bad_input last and alone (it
#    takes all but 4 MiB of the GPU; its deliberate allocation failures are API errors, so it
#    runs with --report-api-errors no);
# 2. compute-sanitizer racecheck on test_attention_prefill and test_attention_decode
#    (CVLLM_TEST_SMALL=2: every GQA shape at head_dim 128);
# 3. scripts/compare_hf_gpu.py --dtype bf16 (greedy ids against transformers, both in bf16) on
#    every golden fixture, models/cvllm-tiny-py and the qwen3-0.6b preset (cvllm mkmodel
#    --preset qwen3-0.6b --seed 0, in /tmp).
# Everything but test_bad_input runs at once (sanitizers are slow and mostly host-bound), each
# under SAN_TIMEOUT seconds (default 270), test_bad_input under 60: about 5.5 minutes at worst.
# Logs: $OUT/<check>.log, $OUT/summary.txt; the last line printed is a one-line summary.
# Exit status 0 when every check passed.
H=$(cd "${BUNDLE:-build-cudarun}" && pwd) || exit 2
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
T=${SAN_TIMEOUT:-270}
t0=$(date +%s)
S=$OUT/summary.txt
: >"$S"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
date -u

CS=
for c in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer; do
    if [ -n "$c" ] && [ -x "$c" ]; then
        CS=$c
        break
    fi
done
if [ -z "$CS" ]; then # a pip CUDA (nvidia-*-cu1x wheels): look in the nvidia namespace package
    NV=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)
    [ -n "$NV" ] && CS=$(find "$NV" -maxdepth 4 -type f -name compute-sanitizer -perm -u+x 2>/dev/null | head -1)
fi
echo "compute-sanitizer: ${CS:-not found}"
[ -n "$CS" ] && "$CS" --version | tail -1

# san NAME TOOL TIMEOUT BINARY [ENV=VALUE ...] [-- SANITIZER FLAGS]: one sanitizer run, its log
# in $OUT/NAME.log and "rc seconds" in $OUT/NAME.rc
san() {
    local name=$1 tool=$2 to=$3 bin=$4
    shift 4
    local envs=() flags=()
    while [ $# -gt 0 ]; do
        if [ "$1" = "--" ]; then
            shift
            flags=("$@")
            break
        fi
        envs+=("$1")
        shift
    done
    [ "$tool" = memcheck ] && flags+=(--leak-check full)
    local s
    s=$(date +%s)
    echo "== $name: ${envs[*]} $tool ${flags[*]} $bin" >"$OUT/$name.log"
    env "${envs[@]}" timeout -k 10 "$to" bash "$H/run.sh" "$CS" --tool "$tool" --error-exitcode 1 \
        --target-processes application-only --print-limit 100 "${flags[@]}" "$H/bin/$bin" \
        >>"$OUT/$name.log" 2>&1
    echo "$? $(($(date +%s) - s))" >"$OUT/$name.rc"
}

# hf: the qwen3-0.6b preset, then compare_hf_gpu.py --dtype bf16 (cvllm through run.sh, so that
# only cvllm sees the bundled libraries)
hf() {
    local s M=${QWEN06:-/tmp/qwen3-0.6b}
    s=$(date +%s)
    (
        if [ ! -f "$M/config.json" ]; then
            bash "$H/run.sh" cvllm mkmodel --preset qwen3-0.6b --seed 0 "$M" || echo "mkmodel failed"
        fi
        W=$(mktemp /tmp/cvllm-wrap.XXXXXX)
        printf '#!/bin/bash\nexec bash %q cvllm "$@"\n' "$H/run.sh" >"$W"
        chmod +x "$W"
        models=()
        for r in tests/fixtures/golden/*/reference.json; do
            models+=("$(dirname "$r"):$r")
        done
        [ -f tests/fixtures/trained/reference.json ] &&
            models+=("models/cvllm-tiny-py:tests/fixtures/trained/reference.json")
        models+=("$M")
        PYTHONUNBUFFERED=1 timeout -k 10 "$T" python3 scripts/compare_hf_gpu.py --cvllm "$W" \
            --dtype bf16 "${models[@]}"
        rc=$?
        rm -f "$W"
        exit $rc
    ) >"$OUT/hf_bf16.log" 2>&1
    echo "$? $(($(date +%s) - s))" >"$OUT/hf_bf16.rc"
}

SAN=()
if [ -n "$CS" ]; then
    for t in "$H"/bin/test_cuda_*; do
        b=$(basename "$t")
        case $b in
        test_cuda_kernels)
            san memcheck_kernels memcheck "$T" "$b" CVLLM_TEST_SMALL=1 &
            SAN+=(memcheck_kernels)
            for k in prefill decode; do
                san racecheck_attention_$k racecheck "$T" "$b" CVLLM_TEST_SMALL=2 \
                    CVLLM_TEST_FILTER=test_attention_$k &
                SAN+=("racecheck_attention_$k")
            done
            ;;
        test_cuda_engine)
            for k in golden_fixtures trained_model presets; do
                san memcheck_engine_$k memcheck "$T" "$b" CVLLM_TEST_FILTER=test_$k &
                SAN+=("memcheck_engine_$k")
            done
            ;;
        *)
            san "memcheck_${b#test_cuda_}" memcheck "$T" "$b" &
            SAN+=("memcheck_${b#test_cuda_}")
            ;;
        esac
    done
fi
hf &
wait
if [ -n "$CS" ] && [ -x "$H/bin/test_cuda_engine" ]; then
    san memcheck_engine_bad_input memcheck 60 test_cuda_engine CVLLM_TEST_FILTER=test_bad_input \
        -- --report-api-errors no
    SAN+=(memcheck_engine_bad_input)
fi

# per check: rc, seconds, the sanitizer's and cmocka's verdicts
nm=0 okm=0 nr=0 okr=0
for n in "${SAN[@]}"; do
    read -r rc sec <"$OUT/$n.rc"
    v=$(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY" "$OUT/$n.log" | tail -2 | tr '\n' ' ')
    c=$(grep -hE "^\[ *(PASSED|FAILED) *\]" "$OUT/$n.log" | tr -s ' ' | tr '\n' ' ')
    what=ok
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && what="TIMEOUT after $sec s"
    [ "$rc" = 77 ] && what="skipped (no GPU)"
    [ "$rc" != 0 ] && [ "$what" = ok ] && what=FAIL
    printf '%-34s %-18s rc %3s %4s s  %s %s\n' "$n" "$what" "$rc" "$sec" "${v:-no sanitizer summary}" "$c" | tee -a "$S"
    case $n in
    memcheck*) nm=$((nm + 1)) && [ "$rc" = 0 ] && okm=$((okm + 1)) ;;
    racecheck*) nr=$((nr + 1)) && [ "$rc" = 0 ] && okr=$((okr + 1)) ;;
    esac
done
read -r hrc hsec <"$OUT/hf_bf16.rc"
grep -h "^SUMMARY" "$OUT/hf_bf16.log" | tee -a "$S"
printf 'hf_bf16 rc %s, %s s (1: cvllm failed, a parting not at a near tie, or see the log)\n' \
    "$hrc" "$hsec" | tee -a "$S"
hs=$(grep -h "^SUMMARY all" "$OUT/hf_bf16.log" | sed 's/^SUMMARY all (bf16): //')
nocs=
[ -z "$CS" ] && nocs=" (compute-sanitizer not found)"
line="gpu_checks: memcheck $okm/$nm clean, racecheck $okr/$nr clean$nocs, HF bf16: ${hs:-no summary (rc $hrc)}; $(($(date +%s) - t0)) s"
echo "$line" | tee -a "$S"
[ -n "$CS" ] && [ "$okm" = "$nm" ] && [ "$okr" = "$nr" ] && [ "$hrc" = 0 ]
