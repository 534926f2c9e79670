#!/usr/bin/env bash
# lean-python.sh ARGS...: python3 without the machine's site-packages (the device's holds PyTorch
# and ~200 packages whose .pth hooks a pod's lean venv does not run), seeing only what the
# supervisor imports on a boot from a local model: psutil and pynvml (nvidia-ml-py), linked from
# the machine's own install into $KILN_DEVICE_ROOT/lean-site. bench/common.py's KILN_BENCH_PYTHON
# points here so that the supervisor's start-up is an image's, not the GPU box's.
set -Eeuo pipefail
K="${KILN_DEVICE_ROOT:-/root/k}"
PY="${PY:-python3}"
site="$K/lean-site"
if [ ! -e "$site/.made" ]; then
  mkdir -p "$site"
  "$PY" - "$site" <<'PYEOF'
import importlib.util, os, sys
site = sys.argv[1]
for name in ("psutil", "pynvml"):
    spec = importlib.util.find_spec(name)
    if spec is None:
        print(f"lean-python: {name} is not installed here; the supervisor runs without it", file=sys.stderr)
        continue
    src = os.path.dirname(spec.origin) if spec.submodule_search_locations else spec.origin
    dst = os.path.join(site, os.path.basename(src))
    if not os.path.lexists(dst):
        os.symlink(src, dst)
PYEOF
  touch "$site/.made"
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -S "$@"
