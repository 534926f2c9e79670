#!/usr/bin/env bash
# engine_libs.sh PREFIX: what the engine itself reads from the disk before it can read a weight (issue
# 38: part of the gap between a cold boot and a cold read of the model alone): llama-server and every
# shared library it loads (ldd: the prefix's own, CUDA's, the C++ runtime), their bytes, and the time
# to cat them all with the page cache dropped first (where permitted; never with KILN_NO_DROP=1, the
# CPU dry run on a shared machine). One line.
set -Eeuo pipefail
bin="${1:?PREFIX}/bin/llama-server"
mapfile -t files < <({ echo "$bin"; ldd "$bin" | awk '$3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'; } | xargs -r readlink -f | sort -u)
bytes=$(stat -L -c %s "${files[@]}" | awk '{s += $1} END {print s}')
dropped=no
if [ -z "${KILN_NO_DROP:-}" ] && sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then dropped=yes; fi
t0=$(date +%s.%N); cat "${files[@]}" > /dev/null; t1=$(date +%s.%N)
largest=$(stat -L -c '%s %n' "${files[@]}" | sort -rn | head -n 3 | awk '{printf "%s %.0f MB; ", $2, $1 / 1e6}')
echo "engine_libs: ${#files[@]} files, $bytes bytes, cold cat $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}') s (page cache dropped: $dropped); largest: $largest"
