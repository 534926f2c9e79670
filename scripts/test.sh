#!/usr/bin/env bash
# test.sh: set up what the tests need (scripts/dev-setup.sh), then run them all.
# Extra arguments go to pytest: bash scripts/test.sh -k ladder
set -Eeuo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/dev-setup.sh)"
exec python3 -m pytest -q "$@"
