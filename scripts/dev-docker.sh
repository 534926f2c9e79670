#!/usr/bin/env bash
# dev-docker.sh: a private Docker engine and a registry-free base image for
# Kiln's tests, CI (.ci/run) and air-gapped users.
#
# Why: Kiln builds Docker images, so its tests need a real engine. Machines here
# (and CI runners, and air-gapped sites) have no system dockerd running and no
# registry they can pull from. This script starts Debian's dockerd privately
# (its own socket, data root and exec root under DIR, no bridge, no iptables)
# and makes a Debian base image with mmdebstrap + `docker import`, so every
# `FROM` can name an image that is already in the local store.
#
# usage:
#   bash scripts/dev-docker.sh install              apt-get install docker.io mmdebstrap (no-op when present)
#   eval "$(bash scripts/dev-docker.sh start [DIR])"   start (or reuse) the engine; prints `export DOCKER_HOST=...`
#   bash scripts/dev-docker.sh stop [DIR] [--purge]  stop it; keeps DIR/data (images + build cache) unless --purge
#   bash scripts/dev-docker.sh status [DIR]          exit 0 when it answers, 3 when it does not
#   bash scripts/dev-docker.sh base-image [NAME] [--force]   make NAME (default kiln-local/debian:bookworm)
#
# DIR defaults to ${KILN_DOCKER_DIR:-/var/lib/kiln-docker}. Layout:
#   DIR/docker.sock   the engine's socket (DOCKER_HOST=unix://DIR/docker.sock)
#   DIR/dockerd.pid   its pidfile          DIR/dockerd.log   its log
#   DIR/data          --data-root: images, layers, BuildKit cache (kept across stop/start)
#   DIR/run           --exec-root: runtime state (netns, containerd state)
#
# The engine runs with --bridge=none: every `docker build` and `docker run` needs
# `--network host` (BuildKit otherwise fails with "network bridge not found"; the
# legacy builder silently has no network). That also keeps traffic on loopback.
#
# CLI: use Debian's client, /usr/bin/docker (20.10). With DOCKER_BUILDKIT=1 it
# has BuildKit built in (RUN --mount=type=cache, --mount=type=secret). The newer
# /usr/local/bin/docker that comes first on PATH here has no buildx plugin, so
# DOCKER_BUILDKIT=1 builds fail with it. Override with KILN_DOCKER_CLI.
#
# Environment (all optional):
#   KILN_DOCKER_DIR            default DIR
#   KILN_DOCKER_CLI            docker client (default /usr/bin/docker)
#   KILN_DOCKER_START_TIMEOUT  seconds to wait for /_ping after start (default 60)
#   KILN_DOCKER_STOP_TIMEOUT   seconds to wait for the daemon to exit after TERM (default 30)
#   KILN_CONTAINER_STOP_TIMEOUT seconds each container gets to stop before KILL (default 5)
#   KILN_DEBIAN_MIRROR         Debian mirror for base-image (default: the one apt uses here)
#   KILN_DEBIAN_SUITE          suite for base-image (default bookworm)
#   KILN_BASE_PACKAGES         comma list for mmdebstrap --include (default python3,ca-certificates)
set -Eeuo pipefail

PROG=dev-docker.sh
DEFAULT_DIR=${KILN_DOCKER_DIR:-/var/lib/kiln-docker}
DEFAULT_IMAGE=kiln-local/debian:bookworm
# Bump when the base-image recipe below changes, so cached images are rebuilt.
BASE_RECIPE_VERSION=1
START_TIMEOUT=${KILN_DOCKER_START_TIMEOUT:-60}
STOP_TIMEOUT=${KILN_DOCKER_STOP_TIMEOUT:-30}
CONTAINER_STOP_TIMEOUT=${KILN_CONTAINER_STOP_TIMEOUT:-5}
# shellcheck disable=SC2016  # literal, shown to the user
START_HINT='eval "$(bash scripts/dev-docker.sh start)"'

# dockerd, containerd and runc live in /usr/sbin and /usr/bin; a root shell
# without sbin on PATH (some CI runners) would not find them.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 2; }
trap 'rc=$?; printf "%s: failed (exit %s) at line %s: %s\n" "$PROG" "$rc" "$LINENO" "$BASH_COMMAND" >&2' ERR

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# Debian's 20.10 client: BuildKit via DOCKER_BUILDKIT=1 (the PATH one lacks buildx).
docker_cli() {
  local cli=${KILN_DOCKER_CLI:-/usr/bin/docker}
  if [[ -x $cli ]]; then
    printf '%s\n' "$cli"
  elif command -v docker >/dev/null 2>&1; then
    log "warning: $cli not found; using $(command -v docker) (BuildKit may need buildx)"
    command -v docker
  else
    die "no docker client; run: bash scripts/dev-docker.sh install"
  fi
}

usage() {
  sed -n '2,/^set -Eeuo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
}

# Resolve DIR to an absolute path and check the socket path fits sun_path.
resolve_dir() {
  local dir=${1:-$DEFAULT_DIR}
  [[ -n $dir ]] || die "empty DIR"
  dir=$(realpath -m -- "$dir")
  local sock="$dir/docker.sock"
  (( ${#sock} < 100 )) || die "socket path too long for a unix socket (${#sock} bytes): $sock; choose a shorter DIR"
  printf '%s\n' "$dir"
}

# ping_sock SOCK -> 0 when the engine behind the unix socket answers /_ping with OK.
ping_sock() {
  local sock=$1 out
  [[ -S $sock ]] || return 1
  out=$(curl -fsS --max-time 3 --unix-socket "$sock" http://localhost/_ping 2>/dev/null) || return 1
  [[ $out == OK ]]
}

# ping_host DOCKER_HOST -> 0 when it answers.
ping_host() {
  local host=$1 out
  case $host in
    unix://*) ping_sock "${host#unix://}" ;;
    tcp://*)
      out=$(curl -fsS --max-time 3 "http://${host#tcp://}/_ping" 2>/dev/null) || return 1
      [[ $out == OK ]] ;;
    *) DOCKER_HOST=$host "$(docker_cli)" version >/dev/null 2>&1 ;;
  esac
}

# is_our_dockerd PID DIR -> 0 when PID is a live dockerd started with DIR's pidfile.
is_our_dockerd() {
  local pid=$1 dir=$2 comm cmdline
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ -r /proc/$pid/comm ]] || return 1
  comm=$(<"/proc/$pid/comm") || return 1
  [[ $comm == dockerd ]] || return 1
  cmdline=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  grep -qxF -- "$dir/dockerd.pid" <<<"$cmdline"
}

# alive PID -> 0 when PID runs and is not a zombie. Processes whose parent
# died are reparented to PID 1, which on these machines can leave them as
# zombies for a while; kill -0 alone would call those alive.
alive() {
  local pid=$1 state
  kill -0 "$pid" 2>/dev/null || return 1
  state=$(awk '/^State:/ { print $2; exit }' "/proc/$pid/status" 2>/dev/null) || return 1
  [[ -n $state && $state != Z ]]
}

read_pid() {
  local pidfile=$1 pid=""
  [[ -f $pidfile ]] && pid=$(tr -dc '0-9' <"$pidfile" 2>/dev/null || true)
  printf '%s\n' "$pid"
}

# wait_gone PID SECONDS -> 0 when PID exited within SECONDS (not our child: poll).
wait_gone() {
  local pid=$1 secs=$2 t0
  t0=$(now)
  while alive "$pid"; do
    if awk -v a="$t0" -v b="$(now)" -v s="$secs" 'BEGIN { exit !(b - a >= s) }'; then
      return 1
    fi
    sleep 0.1
  done
  return 0
}

# A dockerd that crashed or was KILLed leaves DIR/run/containerd/containerd.pid
# behind, and either a running containerd or (it dies with its parent) a zombie
# that PID 1 here is slow to reap. A new dockerd that finds the pidfile naming a
# "live" pid waits for that containerd and fails after ~15 s with "failed to
# start containerd: timeout waiting for containerd to start". So: stop a real
# orphan (checking it is DIR's containerd), then drop the pidfile.
# Call only while no dockerd of DIR runs.
stop_orphan_containerd() {
  local dir=$1 pidfile="$1/run/containerd/containerd.pid" cpid cmdline
  cpid=$(read_pid "$pidfile")
  [[ -n $cpid ]] || return 0
  if alive "$cpid" && [[ $(<"/proc/$cpid/comm") == containerd ]] \
    && cmdline=$(tr '\0' '\n' <"/proc/$cpid/cmdline" 2>/dev/null) \
    && grep -qxF -- "$dir/run/containerd/containerd.toml" <<<"$cmdline"; then
    log "stopping orphaned containerd pid $cpid (left by a dockerd that did not exit cleanly)"
    kill -TERM "$cpid" 2>/dev/null || true
    if ! wait_gone "$cpid" 10; then
      kill -KILL "$cpid" 2>/dev/null || true
      wait_gone "$cpid" 5 || log "warning: containerd pid $cpid survived KILL"
    fi
  fi
  rm -f -- "$pidfile"
}

# Unmount everything dockerd may have left mounted under DIR (deepest first).
unmount_under() {
  local dir=$1 m
  local -a mounts=()
  mapfile -t mounts < <(awk -v d="$dir/" '{ gsub(/\\040/, " ", $2); if (index($2, d) == 1) print $2 }' /proc/self/mounts | sort -r)
  for m in "${mounts[@]}"; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: could not unmount $m"
  done
}

take_lock() {  # take_lock FILE: exclusive lock on fd 9 (closed for dockerd, see start)
  local file=$1
  mkdir -p -- "$(dirname -- "$file")"
  exec 9>"$file"
  if ! flock -w 300 9; then
    die "timed out waiting for lock $file (another $PROG running?)"
  fi
}

# ---------------------------------------------------------------- install
cmd_install() {
  local -a missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  [[ -x /usr/bin/docker ]] || missing+=(docker.io)
  command -v containerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v runc >/dev/null 2>&1 || missing+=(docker.io)
  command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  command -v flock >/dev/null 2>&1 || missing+=(util-linux)
  if ((${#missing[@]} == 0)); then
    log "install: docker.io and mmdebstrap already present ($(dockerd --version 2>/dev/null | head -n1))"
    return 0
  fi
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  ((EUID == 0)) || die "install needs root (apt-get install -y ${missing[*]})"
  log "install: apt-get install -y ${missing[*]}"
  local -a apt=(env DEBIAN_FRONTEND=noninteractive apt-get -y -q -o Dpkg::Use-Pty=0)
  # docker.io's postinst would start the *system* dockerd (bridge, iptables)
  # where services can start. We never use it: forbid service starts for this
  # install unless the machine already has a policy (these machines ship one).
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\n# temporary, from %s install\nexit 101\n' "$PROG" >"$policy"
    chmod 0755 "$policy"
    made_policy=1
  fi
  local rc=0
  if ! "${apt[@]}" install "${missing[@]}"; then
    log "install: retrying after apt-get update"
    { "${apt[@]}" update && "${apt[@]}" install "${missing[@]}"; } || rc=$?
  fi
  ((made_policy)) && rm -f -- "$policy"
  ((rc == 0)) || die "install: apt-get install ${missing[*]} failed (exit $rc)"
  log "install: done ($(dockerd --version 2>/dev/null | head -n1))"
}

# ---------------------------------------------------------------- start
cmd_start() {
  local dir
  dir=$(resolve_dir "${1:-}")
  local sock="$dir/docker.sock" pidfile="$dir/dockerd.pid" logfile="$dir/dockerd.log"
  local host="unix://$sock"

  command -v dockerd >/dev/null 2>&1 || die "dockerd not found; run: bash scripts/dev-docker.sh install"
  ((EUID == 0)) || die "dockerd needs root (it mounts overlayfs and namespaces)"
  mkdir -p -- "$dir/data" "$dir/run"
  take_lock "$dir/.lock"

  local pid
  pid=$(read_pid "$pidfile")
  if [[ -n $pid ]] && is_our_dockerd "$pid" "$dir"; then
    if ping_sock "$sock"; then
      log "start: already running (pid $pid) at $host"
      printf 'export DOCKER_HOST=%s\n' "$host"
      return 0
    fi
    # Alive but not answering: perhaps still starting. Wait, then give up.
    log "start: dockerd pid $pid is alive but not answering yet; waiting up to ${START_TIMEOUT}s"
    local t0
    t0=$(now)
    until ping_sock "$sock"; do
      if ! alive "$pid"; then break; fi
      if awk -v a="$t0" -v b="$(now)" -v s="$START_TIMEOUT" 'BEGIN { exit !(b - a >= s) }'; then
        die "dockerd pid $pid at $host does not answer /_ping; see $logfile, or: bash scripts/dev-docker.sh stop $dir"
      fi
      sleep 0.2
    done
    if ping_sock "$sock"; then
      printf 'export DOCKER_HOST=%s\n' "$host"
      return 0
    fi
  fi
  if ping_sock "$sock"; then
    die "something answers at $host but $pidfile does not name it; stop that engine first"
  fi

  # Not running: clean what a crashed or killed engine leaves behind. dockerd
  # refuses to start while its pidfile names any live process.
  if [[ -e $pidfile ]]; then
    log "start: removing stale pidfile $pidfile (pid ${pid:-none} is not our dockerd)"
    rm -f -- "$pidfile"
  fi
  rm -f -- "$sock"
  stop_orphan_containerd "$dir"
  # Mounts a crashed engine left (netns/default, overlay2 and data-root binds);
  # nothing under DIR is in use now that no dockerd or containerd runs there.
  unmount_under "$dir"
  # Keep the log bounded across many CI runs.
  if [[ -f $logfile ]] && (($(stat -c %s -- "$logfile") > 20 * 1024 * 1024)); then
    mv -f -- "$logfile" "$logfile.1"
  fi

  local -a args=(
    dockerd
    --host "$host"
    --data-root "$dir/data"
    --exec-root "$dir/run"
    --pidfile "$pidfile"
    --bridge=none
    --iptables=false
    --ip-masq=false
    --ip-forward=false
    --storage-driver=overlay2
    --shutdown-timeout=5
  )
  local t0
  t0=$(now)
  printf '\n==== %s %s start: %s\n' "$(date -u +%FT%TZ)" "$PROG" "${args[*]}" >>"$logfile"
  # setsid: own session, so it outlives this shell and CI step's process group.
  # All of its stdio goes to the log (so `eval "$(... start)"` does not hang
  # on an inherited pipe), and it must not inherit the lock on fd 9.
  setsid "${args[@]}" </dev/null >>"$logfile" 2>&1 9>&- &
  pid=$!
  log "start: dockerd pid $pid, log $logfile"

  until ping_sock "$sock"; do
    if ! alive "$pid"; then
      local rc=0
      wait "$pid" || rc=$?
      log "start: dockerd exited (status $rc) before answering; last log lines:"
      tail -n 25 -- "$logfile" >&2 || true
      exit 1
    fi
    if awk -v a="$t0" -v b="$(now)" -v s="$START_TIMEOUT" 'BEGIN { exit !(b - a >= s) }'; then
      log "start: no answer on $sock within ${START_TIMEOUT}s; last log lines:"
      tail -n 25 -- "$logfile" >&2 || true
      kill -TERM "$pid" 2>/dev/null || true
      exit 1
    fi
    sleep 0.1
  done
  log "start: engine ready in $(elapsed "$t0")s ($host)"
  log "start: every build and run needs --network host (engine runs with --bridge=none)"
  printf 'export DOCKER_HOST=%s\n' "$host"
}

# ---------------------------------------------------------------- stop
cmd_stop() {
  local dir_arg="" purge=0 a
  for a in "$@"; do
    case $a in
      --purge) purge=1 ;;
      -*) die "stop: unknown option $a" ;;
      *) [[ -z $dir_arg ]] || die "stop: one DIR only"; dir_arg=$a ;;
    esac
  done
  local dir
  dir=$(resolve_dir "$dir_arg")
  local sock="$dir/docker.sock" pidfile="$dir/dockerd.pid" host="unix://$dir/docker.sock"
  if [[ ! -d $dir ]]; then
    log "stop: $dir does not exist; nothing to do"
    return 0
  fi
  if ((purge)); then  # check before touching anything in DIR
    case $dir in
      / | /bin | /boot | /dev | /etc | /home | /lib | /opt | /proc | /root | /run | /sbin | /srv | /sys | /tmp | /usr | /var | /var/lib | /work)
        die "stop --purge: refusing to delete $dir" ;;
    esac
    [[ -d $dir/data || -f $dir/dockerd.log ]] || die "stop --purge: $dir does not look like a dev-docker DIR (no data/ or dockerd.log); not deleting"
  fi
  [[ -d $dir/data || -f $dir/dockerd.log || -f $dir/dockerd.pid ]] || die "stop: $dir does not look like a dev-docker DIR (no data/, dockerd.log or dockerd.pid)"
  take_lock "$dir/.lock"

  local pid
  pid=$(read_pid "$pidfile")
  if [[ -n $pid ]] && ! is_our_dockerd "$pid" "$dir"; then
    log "stop: pidfile names pid $pid, which is not our dockerd; ignoring it"
    pid=""
  fi
  if [[ -z $pid ]] && ping_sock "$sock"; then
    die "stop: something answers at $host but $pidfile does not name a dockerd; stop it by hand"
  fi

  if [[ -n $pid ]]; then
    local t0 cli
    t0=$(now)
    # Containers first, by id, while the engine still answers.
    if ping_sock "$sock"; then
      cli=$(docker_cli)
      local -a ids=()
      mapfile -t ids < <(DOCKER_HOST=$host "$cli" ps -q 2>/dev/null || true)
      if ((${#ids[@]} > 0)); then
        log "stop: stopping ${#ids[@]} container(s): ${ids[*]}"
        DOCKER_HOST=$host "$cli" stop --time "$CONTAINER_STOP_TIMEOUT" "${ids[@]}" >/dev/null || log "warning: some containers did not stop cleanly"
      fi
    fi
    log "stop: TERM dockerd pid $pid"
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_gone "$pid" "$STOP_TIMEOUT"; then
      log "stop: dockerd pid $pid still alive after ${STOP_TIMEOUT}s; KILL"
      kill -KILL "$pid" 2>/dev/null || true
      wait_gone "$pid" 10 || die "stop: pid $pid survived KILL"
      stop_orphan_containerd "$dir"
    fi
    log "stop: stopped in $(elapsed "$t0")s"
  else
    log "stop: not running"
    stop_orphan_containerd "$dir"
  fi

  rm -f -- "$pidfile" "$sock"
  if mountpoint -q -- "$dir/run/netns/default" 2>/dev/null; then
    umount -- "$dir/run/netns/default" || umount -l -- "$dir/run/netns/default" || log "warning: could not unmount $dir/run/netns/default"
  fi

  if ((purge)); then
    unmount_under "$dir"
    log "stop: --purge: deleting $dir (images and build cache)"
    rm -rf --one-file-system -- "$dir"
  else
    log "stop: kept $dir/data (images, build cache); delete with: bash scripts/dev-docker.sh stop --purge"
  fi
}

# ---------------------------------------------------------------- status
cmd_status() {
  local dir
  dir=$(resolve_dir "${1:-}")
  local sock="$dir/docker.sock" pidfile="$dir/dockerd.pid" pid
  pid=$(read_pid "$pidfile")
  echo "dir:      $dir"
  echo "socket:   unix://$sock"
  if [[ -n $pid ]] && is_our_dockerd "$pid" "$dir"; then
    echo "pid:      $pid"
  else
    echo "pid:      none${pid:+ (stale pidfile names $pid)}"
  fi
  if [[ -d $dir/data ]]; then
    echo "data:     $(du -sh --one-file-system -- "$dir/data" 2>/dev/null | cut -f1) in $dir/data"
  fi
  if ping_sock "$sock"; then
    local cli
    cli=$(docker_cli)
    echo "engine:   answering ($(DOCKER_HOST="unix://$sock" "$cli" version --format '{{.Server.Version}} API {{.Server.APIVersion}}' 2>/dev/null || echo '?'))"
    echo "images:   $(DOCKER_HOST="unix://$sock" "$cli" images -q 2>/dev/null | sort -u | wc -l)"
    echo "running:  $(DOCKER_HOST="unix://$sock" "$cli" ps -q 2>/dev/null | wc -l) container(s)"
    echo "use:      export DOCKER_HOST=unix://$sock"
    return 0
  fi
  echo "engine:   not answering (start: $START_HINT)"
  return 3
}

# ---------------------------------------------------------------- base-image
# The Debian mirror apt uses on this machine, for SUITE: from deb822
# /etc/apt/sources.list.d/*.sources, else one-line sources.list(.d/*.list).
debian_mirror() {
  local suite=$1 f uri
  local -a files=()
  shopt -s nullglob
  files=(/etc/apt/sources.list.d/*.sources)
  for f in "${files[@]}"; do
    uri=$(awk -v suite="$suite" '
      function flush() {
        if (!done && uris != "" && index(" " types " ", " deb ") && index(" " suites " ", " " suite " ") && tolower(enabled) != "no") {
          split(uris, u, " "); print u[1]; done = 1
        }
        types = suites = uris = enabled = last = ""
      }
      /^#/ { next }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]/ { v = $0; gsub(/[ \t]+/, " ", v)
                 if (last == "uris") uris = uris v; else if (last == "suites") suites = suites v; else if (last == "types") types = types v
                 next }
      { i = index($0, ":"); if (!i) next
        k = tolower(substr($0, 1, i - 1)); v = substr($0, i + 1); gsub(/[ \t]+/, " ", v); sub(/^ /, "", v); sub(/ $/, "", v)
        last = k
        if (k == "types") types = v; else if (k == "uris") uris = v; else if (k == "suites") suites = v; else if (k == "enabled") enabled = v }
      END { flush() }' "$f")
    if [[ $uri =~ ^(https?|ftp|file):// ]]; then printf '%s\n' "$uri"; return 0; fi
  done
  files=()
  [[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
  files+=(/etc/apt/sources.list.d/*.list)
  for f in "${files[@]}"; do
    # deb [opts] URI SUITE COMPONENTS...
    uri=$(sed -E 's/#.*//; s/\[[^]]*\]//' "$f" | awk -v suite="$suite" '$1 == "deb" && $3 == suite { print $2; exit }')
    if [[ $uri =~ ^(https?|ftp|file):// ]]; then printf '%s\n' "$uri"; return 0; fi
  done
  return 1
}

# The engine base-image talks to: DOCKER_HOST if it answers, else DIR's socket.
engine_host() {
  if [[ -n ${DOCKER_HOST:-} ]] && ping_host "$DOCKER_HOST"; then
    printf '%s\n' "$DOCKER_HOST"; return 0
  fi
  local sock
  sock="$(resolve_dir "")/docker.sock"
  if ping_sock "$sock"; then
    printf 'unix://%s\n' "$sock"; return 0
  fi
  return 1
}

cmd_base_image() {
  local name="" force=0 a
  for a in "$@"; do
    case $a in
      --force) force=1 ;;
      -*) die "base-image: unknown option $a" ;;
      *) [[ -z $name ]] || die "base-image: one NAME only"; name=$a ;;
    esac
  done
  name=${name:-$DEFAULT_IMAGE}
  local suite=${KILN_DEBIAN_SUITE:-bookworm}
  local packages=${KILN_BASE_PACKAGES:-python3,ca-certificates}
  local variant=minbase arch mirror
  arch=$(dpkg --print-architecture)

  local host
  host=$(engine_host) || die "base-image: no Docker engine answers (DOCKER_HOST=${DOCKER_HOST:-unset}); start one: $START_HINT"
  export DOCKER_HOST=$host
  local cli
  cli=$(docker_cli)

  if [[ -n ${KILN_DEBIAN_MIRROR:-} ]]; then
    mirror=$KILN_DEBIAN_MIRROR
  else
    mirror=$(debian_mirror "$suite") || die "base-image: found no Debian mirror for '$suite' in /etc/apt/sources.list{,.d/*.sources,.d/*.list}; set KILN_DEBIAN_MIRROR=http://your.mirror/debian (air-gapped: a local mirror or file:// path works)"
  fi
  local v
  for v in "$mirror" "$suite" "$packages"; do
    [[ $v != *[\"$'\n'\\]* ]] || die "base-image: unexpected character in '$v'"
  done

  # Cache key: everything that decides the image's content except the date.
  local key
  key=$(printf '%s\n' "recipe=$BASE_RECIPE_VERSION" "mirror=$mirror" "suite=$suite" "variant=$variant" "packages=$packages" "arch=$arch" | sha256sum | cut -c1-16)

  existing_key() {
    "$cli" image inspect --format '{{ index .Config.Labels "org.kiln.base.key" }}' "$name" 2>/dev/null || true
  }
  if ((!force)) && [[ $(existing_key) == "$key" ]]; then
    log "base-image: $name is up to date (key $key, mirror $mirror, suite $suite); --force rebuilds"
    printf '%s\n' "$name"
    return 0
  fi

  take_lock "${TMPDIR:-/tmp}/kiln-base-image.lock"
  if ((!force)) && [[ $(existing_key) == "$key" ]]; then  # made while we waited
    log "base-image: $name is up to date (made by another run)"
    printf '%s\n' "$name"
    return 0
  fi
  command -v mmdebstrap >/dev/null 2>&1 || die "base-image: mmdebstrap not found; run: bash scripts/dev-docker.sh install"
  ((EUID == 0)) || die "base-image: mmdebstrap --mode=root needs root"

  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-base.XXXXXX")
  # shellcheck disable=SC2064  # expand $work now
  trap "rm -rf -- '$work'" EXIT

  log "base-image: building $name without a registry: mmdebstrap $variant $suite ($packages) from $mirror"
  log "base-image: (needs only the Debian mirror; an air-gapped site points KILN_DEBIAN_MIRROR at its local mirror)"
  local t0
  t0=$(now)
  mmdebstrap --variant="$variant" --mode=root --include="$packages" \
    "$suite" "$work/base.tar" "$mirror" 2>"$work/mmdebstrap.log" || {
      log "base-image: mmdebstrap failed; last lines:"
      tail -n 30 -- "$work/mmdebstrap.log" >&2 || true
      exit 1
    }
  local t_mm
  t_mm=$(elapsed "$t0")
  log "base-image: mmdebstrap took ${t_mm}s ($(du -h -- "$work/base.tar" | cut -f1))"

  local created
  created=$(date -u +%FT%TZ)
  local -a changes=(
    --change "LABEL org.kiln.base.key=\"$key\""
    --change "LABEL org.kiln.base.mirror=\"$mirror\""
    --change "LABEL org.kiln.base.suite=\"$suite\""
    --change "LABEL org.kiln.base.variant=\"$variant\""
    --change "LABEL org.kiln.base.packages=\"$packages\""
    --change "LABEL org.kiln.base.created=\"$created\""
    --change "LABEL org.kiln.base.recipe=\"mmdebstrap --variant=$variant --mode=root --include=$packages $suite base.tar $mirror; docker import\""
    --change "LABEL org.opencontainers.image.created=\"$created\""
    # docker import sets no ENV or CMD; give it what Debian's official image has.
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    --change "ENV LANG=C.UTF-8"
    --change 'CMD ["bash"]'
  )
  t0=$(now)
  local id
  id=$("$cli" import "${changes[@]}" "$work/base.tar" "$name")
  log "base-image: docker import took $(elapsed "$t0")s: $name ($id)"
  rm -rf -- "$work"
  trap - EXIT
  printf '%s\n' "$name"
}

# ---------------------------------------------------------------- main
main() {
  local cmd=${1:-}
  (($# > 0)) && shift
  case $cmd in
    install) cmd_install "$@" ;;
    start) (($# <= 1)) || die "start: at most one DIR"; cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    status) (($# <= 1)) || die "status: at most one DIR"; cmd_status "$@" || exit $? ;;
    base-image) cmd_base_image "$@" ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
