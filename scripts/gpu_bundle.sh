#!/bin/bash
# gpu_bundle.sh BUILD_DIR DEST: copies what the GPU tests need onto a machine that has the CUDA 13
# runtime and cuBLAS but not this machine's other libraries: the CUDA binaries of BUILD_DIR (cvllm,
# test_cuda_*), the shared libraries they need that such a machine may lack (bundled in DEST/lib,
# with the ones a newer distribution normally has in DEST/lib-extra, searched last), and a
# run.sh that sets LD_LIBRARY_PATH and runs the GPU tests (or the command given to it) from the
# repository root, logs in $OUT when set.
#   scripts/gpu_bundle.sh build-cuda /path/to/repo/build-cudarun
#   (there) bash build-cudarun/run.sh                 # every test_cuda_* binary
#   (there) bash build-cudarun/run.sh cvllm --version # any bundled binary
set -euo pipefail
B=${1:?build dir}
D=${2:?destination}
mkdir -p "$D/bin" "$D/lib" "$D/lib-extra"
cp "$B"/cvllm "$B"/test_cuda_* "$D/bin/" 2>/dev/null || true
L=/usr/lib/x86_64-linux-gnu
for l in libcmocka.so.0 libutf8proc.so.2 libmicrohttpd.so.12 libjansson.so.4 libxxhash.so.0 libpcre2-8.so.0; do
  cp -L "$L/$l" "$D/lib/"
done
for l in libgnutls.so.30 libp11-kit.so.0 libidn2.so.0 libunistring.so.2 libtasn1.so.6 libnettle.so.8 libhogweed.so.6 libgmp.so.10 libffi.so.8; do
  cp -L "$L/$l" "$D/lib-extra/" 2>/dev/null || true
done
cp -L /usr/local/cuda/lib64/libcudart.so.13 "$D/lib-extra/"
cp "$(dirname "$0")/compare_hf_gpu.py" "$(dirname "$0")"/gpu_*.sh "$D/" 2>/dev/null || true
cat > "$D/run.sh" <<'RUN'
#!/bin/bash
# Runs on the GPU machine from the repository root: bash build-cudarun/run.sh [command...]
H=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0
CUBLAS=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null || true)
NCCL=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$H/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${CUBLAS}:${NCCL}:$H/lib-extra:${LD_LIBRARY_PATH:-}"
export PATH="$H/bin:$PATH"
OUT=${OUT:-/tmp}
if [ $# -gt 0 ]; then exec "$@"; fi
nvidia-smi -L
rc=0
for t in "$H"/bin/test_cuda_*; do
  echo "== $(basename "$t")"
  timeout ${TEST_TIMEOUT:-200} "$t" 2>&1 | tee "$OUT/$(basename "$t").log"
  r=${PIPESTATUS[0]}
  echo "== $(basename "$t") exit $r"
  [ "$r" = 0 ] || [ "$r" = 77 ] || rc=1
done
exit $rc
RUN
chmod +x "$D/run.sh"
du -sh "$D"
