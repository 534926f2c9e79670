#!/usr/bin/env bash
# fetch-wheels.sh: on the CPU machine, before pack.sh, the wheels the device run carries and this
# checkout no longer holds (.whl is gitignored; the 2026-12-01 run's copy went with its worktree):
#   .whl/v026/   exactly the 87 files of vllm026-wheels.sha256 (vLLM 0.26.0 and what the device
#                lacks, for CPython 3.12 on x86-64), each checked against its sha256 there
#   .whl/extra/  gguf 0.19.0 (the P9 model maker, transformers' GGUF loader) and watchdog 7.1.0
# Each by its exact file name through pip (no resolution: --no-deps). DRY=1 prints the commands.
set -Eeuo pipefail
here="$(cd "$(dirname "$0")" && pwd)"; repo="$(cd "$here/../.." && pwd)"
py="${PY:-python3}"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64)
get() {   # get DIR FILE: the one wheel whose file name is FILE
  local dir="$1" file="$2" name version
  [ -s "$dir/$file" ] && return 0
  name="${file%%-*}"; version="$(echo "$file" | cut -d- -f2)"
  # Ask only for the platforms in FILE's own tag: given several, pip takes the newest build it finds,
  # which is another file with another sha256 when a release has more than one manylinux build.
  local tag="${file%.whl}"; tag="${tag##*-}" own=()
  if [ "$tag" = any ]; then own=("${plat[@]}"); else for t in ${tag//./ }; do own+=(--platform "$t"); done; fi
  local cmd=("$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
             "${own[@]}" -d "$dir" "$name==$version")
  if [ -n "${DRY:-}" ]; then echo "${cmd[*]}"; return 0; fi
  "${cmd[@]}"
  [ -s "$dir/$file" ] || { echo "fetch-wheels: pip did not give $file (got: $(ls "$dir" | grep -i "^$name-" | tr '\n' ' '))" >&2; return 1; }
}
mkdir -p "$repo/.whl/v026" "$repo/.whl/extra"
while read -r _sha file; do get "$repo/.whl/v026" "$file"; done < "$here/vllm026-wheels.sha256"
[ -n "${DRY:-}" ] || (cd "$repo/.whl/v026" && sha256sum --check --strict --quiet "$here/vllm026-wheels.sha256")
get "$repo/.whl/extra" gguf-0.19.0-py3-none-any.whl
for w in "$repo"/.whl/extra/watchdog-7.1.0-*.whl; do [ -s "$w" ] && break; done
[ -s "${w:-}" ] || { [ -n "${DRY:-}" ] && echo "$py -m pip download ... watchdog==7.1.0" || \
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
    -d "$repo/.whl/extra" watchdog==7.1.0; }
echo "fetch-wheels: .whl/v026 ($(ls "$repo/.whl/v026" | wc -l) files) and .whl/extra ready" >&2
