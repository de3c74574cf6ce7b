#!/bin/bash
# dec_probe.sh BUILD_DIR OUT_BIN: a cvllm whose decode attention kernels time their blocks
# (scripts/dec_probe.cuh): attention.cu patched into a copy with the stamps, compiled for sm_90a
# only, linked with BUILD_DIR's other objects. Run it on the GPU as cvllm:
#   scripts/dec_probe.sh build /tmp/cvllm_probe
#   (there) cvllm_probe bench ops --device cuda attention 2> probe.log
#   (there) PROBE_EVERY=120 cvllm_probe bench throughput M --device cuda --enforce-eager \
#             --kv-cache-dtype fp8 2> probe.log
# Used for docs/BENCHMARKS.md rounds 19-20; the patch follows attention.cu as it was then.
set -euo pipefail
B=$(cd "${1:?build dir}" && pwd)
OUTB=${2:?output binary}
S=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d)
python3 - "$S/src/backend/cuda/attention.cu" "$T/attention.cu" "$S/scripts/dec_probe.cuh" <<'PY'
import sys
src, dst, hdr = sys.argv[1:4]
s = open(src).read()
def once(old, new, where):
    global s
    a = s.index(where)
    i = s.index(old, a)
    s = s[:i] + new + s[i + len(old):]
s = s.replace('#include "backend/cuda/qk_norm_rope.cuh"\n',
              '#include "backend/cuda/qk_norm_rope.cuh"\n#include "%s"\n' % hdr, 1)
K1 = 'attention_decode_tc_kernel(AttentionParams p'
K2 = 'attention_decode_tma_kernel(AttentionParams p'
# stamp 0 at entry, 1 after each pdl_wait() of the two kernels
for K, E in ((K1, K2), (K2, '/* CVLLM_CUDA_DEC_TMA:')):
    a = s.index(K); b = s.index(E, a + 1)
    body = s[a:b]
    i = body.index('{\n') + 2
    body = body[:i] + '    PROBE(0);\n' + body[i:].replace('pdl_wait()', 'pdl_wait(), PROBE(1)')
    s = s[:a] + body + s[b:]
once('    dtc_prologue<KV, HD, FUSE>', '    PROBE(2);\n    dtc_prologue<KV, HD, FUSE>', K1)
once('    dtc_prologue<KV, HD, FUSE>', '    PROBE(2);\n    dtc_prologue<KV, HD, FUSE>', K2)
# 7, 8 around the fused prologue's last barrier (dtc_prologue, shared by both kernels)
once('        }\n        __syncthreads();\n    }\n}',
     '        }\n        PROBE(7);\n        __syncthreads();\n        PROBE(8);\n    }\n}',
     'dtc_prologue(const AttentionParams')
once("((base + it) / ST) & 1);\n",
     "((base + it) / ST) & 1);\n if (base + it == 0) PROBE(3);\n", K1)
once("(used / ST) & 1);\n", "(used / ST) & 1);\n if (used == 0) PROBE(3);\n", K2)
once('dtc_dsm;\n        __syncthreads();\n',
     'dtc_dsm;\n        PROBE(4);\n        __syncthreads();\n        PROBE(5);\n', K1)
once('    __syncthreads();\n    dtc_finish',
     '    PROBE(4);\n    __syncthreads();\n    PROBE(5);\n    dtc_finish', K2)
once('(e >> 1); });\n}', '(e >> 1); });\n    PROBE(6);\n}', K1)
once('(e >> 1); });\n#endif', '(e >> 1); });\n    PROBE(6);\n#endif', K2)
once('    if (attention_decode_uses_tc(p)) {',
     '    probe_before_launch(p, num_parts * p->n_kv_heads * p->num_seqs, stream);\n'
     '    if (attention_decode_uses_tc(p)) {', 'extern "C" int attention_decode_cuda(')
open(dst, 'w').write(s)
PY
cd "$B"
${NVCC:-/usr/local/cuda/bin/nvcc} -forward-unknown-to-host-compiler -DCVLLM_HAVE_CUDA \
  -DCVLLM_HAVE_NCCL -DCVLLM_SM90A --options-file CMakeFiles/cvllm_core.dir/includes_CUDA.rsp \
  -O3 -DNDEBUG \
  --generate-code=arch=compute_90a,code=[sm_90a] -std=c++17 -x cu -c "$T/attention.cu" \
  -o "$T/attention.cu.o"
cp libcvllm_core.a "$T/lib.a"
(cd "$T" && ar r lib.a attention.cu.o)
sed "s|libcvllm_core.a|$T/lib.a|" CMakeFiles/cvllm.dir/linkLibs.rsp > "$T/libs.rsp"
g++ CMakeFiles/cvllm.dir/src/cli/main.c.o -o "$OUTB" @"$T/libs.rsp" \
  -L/usr/local/cuda/targets/x86_64-linux/lib/stubs -L/usr/local/cuda/targets/x86_64-linux/lib
rm -rf "$T"
echo "$OUTB"
