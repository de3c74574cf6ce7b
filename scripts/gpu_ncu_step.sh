#!/bin/bash
# gpu_ncu_step.sh: every kernel of one eager decode step timed by Nsight Compute (gpu__time_duration,
# kernels serialized: no overlap between them), to see where a step's time goes (issue 14). In the
# bundle (scripts/gpu_bundle.sh copies it); on the GPU machine, from the repository root:
#   bash build-cudarun/gpu_ncu_step.sh            # batch 128 (context ~512) and batch 1
# Reports: $OUT/ncu_step_B<batch>.csv (one row a kernel) and a per-kernel-name summary on stdout.
# SKIP launches are skipped (past the prefill and the first decode steps), COUNT profiled.
H=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp}
M=/tmp/qwen3-0.6b
[ -d "$M" ] || bash "$H/run.sh" cvllm mkmodel --preset qwen3-0.6b --seed 0 "$M" >/dev/null 2>&1
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for B in ${BATCHES:-128 1}; do
  IN=512; [ "$B" = 1 ] && IN=16
  timeout ${NCU_TIMEOUT:-200} bash "$H/run.sh" "$NCU" --target-processes all \
      --launch-skip "${SKIP:-3000}" --launch-count "${COUNT:-600}" \
      --metrics gpu__time_duration.sum --csv \
      cvllm bench throughput "$M" --device cuda --enforce-eager --num-seqs "$B" \
      --input-len "$IN" --output-len 64 >"$OUT/ncu_step_B$B.csv" 2>"$OUT/ncu_step_B$B.err"
  echo "== batch $B: ncu exit $?"
  python3 - "$OUT/ncu_step_B$B.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki = hdr.index("Kernel Name"); vi = hdr.index("Metric Value"); ui = hdr.index("Metric Unit")
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
ks = [(r[ki], float(r[vi].replace(",", "")) * scale.get(r[ui], 1.0)) for r in rows]
# one step: from an embedding kernel to the next one
starts = [i for i, (k, _) in enumerate(ks) if k.startswith("embedding")]
if len(starts) >= 2: ks = ks[starts[0]:starts[1]]
tot = collections.OrderedDict()
for k, us in ks:
    n = k.split("(")[0].split("<")[0][:60]
    c, t = tot.get(n, (0, 0.0)); tot[n] = (c + 1, t + us)
s = sum(t for _, t in tot.values())
print(f"{len(ks)} kernels, {s:.1f} us (serialized)")
for n, (c, t) in sorted(tot.items(), key=lambda x: -x[1][1]):
    print(f"{t:9.1f} us {c:4d} x {t / c:7.2f} us  {n}")
print("the first 24 kernels of the step, in order:")
for k, us in ks[:24]:
    print(f"{us:8.2f} us  {k[:110]}")
PY
done
