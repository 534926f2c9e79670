#!/usr/bin/env bash
# bundle.sh NAME: what comes back from a device call is at most 8 files, 2 folders down; pack
# everything under $OUT into $OUT/NAME.tar.gz and keep beside it only the summaries (*.json at the
# top but each boot's status-*.json, env.txt, device.log), so nothing is left out. Run last in a call: `...; bash .../bundle.sh a40`.
set -Eeuo pipefail
name="${1:?name}"
OUT="${OUT:?}"
tmp="$(mktemp -d)"
tar -czf "$tmp/$name.tar.gz" -C "$OUT" .
# each boot's status-*.json is in the tarball: a run of many rounds would leave more than 8 files beside it
find "$OUT" -mindepth 1 -maxdepth 1 \( ! -name '*.json' -o -name 'status-*.json' \) ! -name env.txt ! -name device.log \
  -exec rm -rf {} +
mv "$tmp/$name.tar.gz" "$OUT/"
ls -la "$OUT" >&2
n="$(find "$OUT" -type f | wc -l)"
[ "$n" -le 8 ] || echo "bundle: $n files under \$OUT: more than the 8 that come back" >&2
