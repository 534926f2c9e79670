#!/usr/bin/env bash
# coldstart.sh NAME CMD...: one measuring call (docs/research/device-plan-coldstart.md; issue 38:
# docs/research/device-run-2026-12-05-p9/). Waits for the background sm_90 build first (its 16
# compile jobs would slow every boot it timed), measures what the engine itself reads from the cold
# disk (engine_libs.sh), runs CMD from Kiln's code in $K/kiln, keeps its output in $OUT/NAME.log,
# ROOT/coldstart.json in $OUT, and bundles the rest (bundle.sh NAME: at most 8 files come back).
#   bash .carry/gpu/kiln/scripts/device/coldstart.sh vllm python3 bench/coldstart.py --engine vllm
# bench/coldstart.py starts Kiln as the image does (kiln_dev/image_start.py: the venv p9-call1.sh made
# from the carried wheels, $K/wheels); KILN_BENCH_PYTHON (lean-python.sh: `python3 -S`) is only for
# the benches that still use it (supervisor_cpu.py). KILN_DEADLINE: no step starts that would not end
# KILN_CALL_S (default 560) seconds after this call began, so the call ends inside its 10 minutes.
STEP=coldstart
source "$(dirname "$0")/common.sh"
export KILN_DEADLINE="$(( $(date +%s) + ${KILN_CALL_S:-560} ))"
sync_code
name="${1:?name}"; shift
waited=0
while [ -e "$K/build.log" ] && [ ! -e "$K/build.done" ] && [ "$waited" -lt "${KILN_WAIT_BUILD_S:-480}" ]; do
  sleep 5; waited=$((waited + 5))
done
log "build: $(cat "$K/build.done" 2>/dev/null || echo 'none, or still running') (waited $waited s)"
export KILN_BENCH_PYTHON="$K/kiln/scripts/device/lean-python.sh"
[ ! -d "$K/wheels" ] || export KILN_IMAGE_WHEELS="$K/wheels"
[ ! -x "$K/h200/bin/llama-server" ] || log "$(bash "$K/kiln/scripts/device/engine_libs.sh" "$K/h200" 2>&1)"
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
