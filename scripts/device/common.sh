# common.sh: sourced by every device step (scripts/device/*.sh). Runs on the lent GPU machine, in
# the repository root of /work/main's copy, with this session's carry at .carry/gpu:
#   .carry/gpu/kiln/            Kiln's code from the gpu worktree (git archive of its HEAD)
#   .carry/gpu/MANIFEST*.sha256 every part, the stream, each file in it (scripts/device/pack.sh)
#   .carry/gpu/parts/pNN        this call's parts of the stream
# Everything lasting goes to /root/k, which survives between calls while the machine stays warm.
set -Eeuo pipefail
# The carry this script came in: $C/kiln/scripts/device/common.sh (.carry/gpu, or .carry/cN when the
# calls were staged ahead, stage.sh N with KILN_CARRY, so no call waits on staging while the machine
# stays warm only 30 s)
C="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
K="${KILN_DEVICE_ROOT:-/root/k}"   # overridable for the CPU dry run
export KILN_DEVICE_ROOT="$K"       # the benches read it (bench/common.add_device_root)
OUT="${OUT:-/tmp/out}"
mkdir -p "$K/parts" "$OUT"
export PYTHONUNBUFFERED=1
# The device image's own interpreter holds torch; never a venv.
PY="${PY:-python3}"

log() { printf '[%s %s] %s\n' "$(date +%T)" "${STEP:-device}" "$*" | tee -a "$K/device.log" >&2; }

sync_code() {
  rm -rf "$K/kiln"
  cp -a "$C/kiln" "$K/kiln"
  cp -f "$C"/MANIFEST*.sha256 "$K/"
}

# Move this call's parts into $K/parts, each checked against the manifest first.
take_parts() {
  local f n
  for f in "$C"/parts/p*; do
    [ -e "$f" ] || continue
    n="$(basename "$f")"
    (cd "$C/parts" && grep -E " $n\$" "$K/MANIFEST.sha256" | sha256sum --check --strict --quiet) \
      || { log "part $n does not match MANIFEST.sha256: refusing it"; return 1; }
    mv -f "$f" "$K/parts/$n"
    log "part $n ok ($(stat -c %s "$K/parts/$n") bytes)"
  done
}

parts_missing() {
  local n missing=0
  for n in $(awk '$2 ~ /^p[0-9]+$/ {print $2}' "$K/MANIFEST.sha256"); do
    [ -e "$K/parts/$n" ] || { missing=$((missing + 1)); }
  done
  echo "$missing"
}

gpu_apps() { nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1 || true; }
