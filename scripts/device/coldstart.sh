#!/usr/bin/env bash
# coldstart.sh NAME CMD...: one measuring call of issue 28 (docs/research/device-plan-coldstart.md).
# Waits for the background sm_90 build first (its 16 compile jobs would slow every boot it timed),
# runs CMD from Kiln's code in $K/kiln with the supervisor under lean-python.sh (an image's start-up,
# not the GPU box's site-packages), keeps its output in $OUT/NAME.log, ROOT/coldstart.json in $OUT,
# and bundles the rest (bundle.sh NAME: at most 8 files come back).
#   bash .carry/gpu/kiln/scripts/device/coldstart.sh vllm python3 bench/coldstart.py --engine vllm
STEP=coldstart
source "$(dirname "$0")/common.sh"
sync_code
name="${1:?name}"; shift
waited=0
while [ -e "$K/build.log" ] && [ ! -e "$K/build.done" ] && [ "$waited" -lt "${KILN_WAIT_BUILD_S:-480}" ]; do
  sleep 5; waited=$((waited + 5))
done
log "build: $(cat "$K/build.done" 2>/dev/null || echo 'none, or still running') (waited $waited s)"
export KILN_BENCH_PYTHON="$K/kiln/scripts/device/lean-python.sh"
cd "$K/kiln"
set +e
PYTHONPATH="$K/kiln" "$@" 2>&1 | tee "$OUT/$name.log"
rc=${PIPESTATUS[0]}
set -e
log "$name: exit $rc"
cp -f "$K/coldstart.json" "$OUT/" 2>/dev/null || true
cp -f "$K/device.log" "$OUT/"
bash "$K/kiln/scripts/device/bundle.sh" "$name"
exit "$rc"
