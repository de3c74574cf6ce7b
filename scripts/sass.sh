#!/bin/bash
# sass.sh: the SASS (sm_90 machine code) of CUDA code, on the development machine, which has the
# CUDA 13 compiler but no cuobjdump / nvdisasm. Debian's non-free nvidia-cuda-toolkit (CUDA 11.8)
# has both; they read CUDA 13's sm_90 cubins once the ELF header's flags are rewritten in the old
# encoding (0x005a055a: sm_90, 64-bit). The package is downloaded once into $SASS_DIR (default
# /tmp/cvllm-sass), not installed.
#   scripts/sass.sh src/backend/cuda/attention.cu [FUNCTION]   # compile (-O3, sm_90a, as the
#                                                              # build's Hopper code) and dump
#   scripts/sass.sh FILE.cubin [FUNCTION]
# Writes FILE.sass next to the cubin (in $SASS_DIR for a .cu) and prints, for each function whose
# mangled name contains FUNCTION (all if none), its instruction count and, for each loop that
# holds an mma (HMMA, HGMMA), the loop's instruction mix: what a change to a kernel's inner loop
# costs.
set -euo pipefail
D=${SASS_DIR:-/tmp/cvllm-sass}
IN=${1:?usage: scripts/sass.sh FILE.cu|FILE.cubin [FUNCTION]}
FN=${2:-}
R=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$D"
CUOBJDUMP=$D/x/usr/bin/cuobjdump
if [ ! -x "$CUOBJDUMP" ]; then
    echo "sass.sh: fetching Debian's nvidia-cuda-toolkit (non-free) for cuobjdump" >&2
    mkdir -p "$D/lists/partial" "$D/archives/partial"
    printf 'deb http://deb.debian.org/debian bookworm non-free\n' > "$D/nf.list"
    APT=(-o Dir::Etc::SourceList="$D/nf.list" -o Dir::Etc::SourceParts=/dev/null
         -o Dir::State::Lists="$D/lists" -o Dir::Cache::Archives="$D/archives"
         -o APT::Sandbox::User=root)
    apt-get "${APT[@]}" update -qq
    (cd "$D" && apt-get "${APT[@]}" download nvidia-cuda-toolkit)
    dpkg -x "$D"/nvidia-cuda-toolkit_*.deb "$D/x"
fi
case "$IN" in
*.cu)
    CUBIN=$D/$(basename "${IN%.cu}").cubin
    nvcc -O3 -DNDEBUG -DCVLLM_HAVE_CUDA -DCVLLM_SM90A -std=c++17 -arch=sm_90a -cubin \
        -I"$R/include" -I"$R/src" \
        -o "$CUBIN" "$IN"
    ;;
*) CUBIN=$IN ;;
esac
python3 - "$CUBIN" <<'EOF'
import struct, sys
d = bytearray(open(sys.argv[1], 'rb').read())
struct.pack_into('<I', d, 48, 0x005a055a)  # e_flags: sm_90 (or 90a) in the encoding 11.8 reads
open(sys.argv[1] + '.old', 'wb').write(d)
EOF
"$CUOBJDUMP" -sass "$CUBIN.old" > "${CUBIN%.cubin}.sass"
rm -f "$CUBIN.old"
echo "SASS: ${CUBIN%.cubin}.sass" >&2
python3 - "${CUBIN%.cubin}.sass" "$FN" <<'EOF'
import collections, re, sys
funcs = open(sys.argv[1]).read().split('Function : ')[1:]
for f in funcs:
    name = f.split()[0]
    if sys.argv[2] and sys.argv[2] not in name:
        continue
    ins = [(int(m.group(1), 16), m.group(2).strip())
           for m in re.finditer(r'^\s+/\*([0-9a-f]{4,6})\*/\s+(.*?);', f, re.M)]
    print('%s: %d instructions' % (name, len(ins)))
    op = lambda s: re.sub(r'^@!?U?P\w+\s+', '', s).split()[0]
    for a, s in ins:
        t = re.findall(r'0x[0-9a-f]+', s) if s.split()[-1:] and 'BRA' in s else []
        if t and int(t[-1], 16) < a:
            body = [x for x in ins if int(t[-1], 16) <= x[0] <= a]
            c = collections.Counter(op(x[1]) for x in body)
            if any(k.startswith(('HMMA', 'HGMMA')) for k in c):
                print('  loop %x..%x: %d: %s' % (int(t[-1], 16), a, len(body),
                      ', '.join('%s %d' % kv for kv in c.most_common(12))))
EOF
