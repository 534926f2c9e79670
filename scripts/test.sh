#!/usr/bin/env bash
# test.sh: set up what the tests need (scripts/dev-setup.sh: a venv in .venv/, Docker, llama-server,
# vLLM on CPU), then run them all with the venv's Python.
# Extra arguments go to pytest: bash scripts/test.sh -k ladder
set -Eeuo pipefail
cd "$(dirname "$0")/.."
exports="$(mktemp)"
# Not `eval "$(dev-setup.sh)"`: that would swallow a failed setup and fail later with a traceback.
if ! bash scripts/dev-setup.sh > "$exports"; then
  rm -f "$exports"
  echo "test.sh: setup failed (see dev-setup's message above); no test was run" >&2
  exit 1
fi
# shellcheck disable=SC1090
source "$exports"
rm -f "$exports"
exec python -m pytest -q "$@"
