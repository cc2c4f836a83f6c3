#!/usr/bin/env bash
# A RabbitMQ 4 node for tests, beside the default broker (3.10.8 on
# bookworm). RabbitMQ 4 is not packaged for bookworm; Debian trixie's
# rabbitmq-server (4.0.x on Erlang 27) is, so the node runs from a trixie root
# (`debootstrap --variant=minbase trixie`) with `chroot`. A chroot shares the
# host's network: the node listens on the host's 127.0.0.1:PORT.
#
#   scripts/rabbitmq4.sh up     [PORT]   build the root once, start the node, wait until it answers
#   scripts/rabbitmq4.sh down   [PORT]   stop the node, remove its data; ok when it is not running
#   scripts/rabbitmq4.sh status [PORT]   exit 0 when the node is up, 3 when it is not
#   scripts/rabbitmq4.sh pid    [PORT]   the node's beam.smp
#   scripts/rabbitmq4.sh ctl  ARGS...    that node's rabbitmqctl (e.g. `ctl list_queues name messages`)
#   scripts/rabbitmq4.sh cli TOOL ARGS... another of its CLI tools (rabbitmq-queues, rabbitmq-diagnostics, ...)
#   scripts/rabbitmq4.sh build           build (or check) the root only
#
# PORT is the AMQP port on 127.0.0.1, default $ACEMQ_RABBITMQ4_PORT or 5704
# (`ctl` and `cli` take the port from ACEMQ_RABBITMQ4_PORT only). The node is
# `acemq-rmq4@localhost` on 5704 and `acemq-rmq4-PORT@localhost` on any other
# port; its Erlang distribution port is PORT+20000 (25704). Ports used by the
# other helper nodes: 5681–5683, 5690, 5695 (dist 25681–25683, 25690, 25695);
# the default broker's are 5672 and 25672.
#
# Extra configuration, applied on `up` (a node already up with other settings
# is restarted with the new ones):
#   ACEMQ_RABBITMQ4_CONF      lines appended to the node's rabbitmq.conf,
#                             e.g. `consumer_timeout = 5000`
#   ACEMQ_RABBITMQ4_ADVANCED  the node's advanced.config, an Erlang term list,
#                             e.g. `[{rabbit, [{channel_tick_interval, 1000}]}].`
#   ACEMQ_RABBITMQ4_TIMEOUT   seconds `up` waits for the node (default 120)
#
# The root: ${ACEMQ_RABBITMQ4_ROOT:-/var/cache/acemq/trixie-rabbitmq4}, built
# once and reused (about 240 MB). The build runs `apt-get install debootstrap`
# on the host if it is missing, `debootstrap --variant=minbase trixie` into
# ROOT.partial (mirror: debootstrap's default, or $ACEMQ_DEBIAN_MIRROR),
# creates the rabbitmq user with the host's rabbitmq uid and gid when those are
# free in the root, installs rabbitmq-server with apt-get
# (--no-install-recommends, services kept from starting by a policy-rc.d), cleans
# apt's caches, writes the stamp file ROOT/.acemq-rabbitmq4 and renames
# ROOT.partial to ROOT. A root without the stamp (an interrupted build) is built
# again. Remove ROOT to rebuild (`down` keeps it).
#
# Everything the node writes (mnesia, logs, its rabbitmq.conf, advanced.config,
# an empty enabled-plugins file and its environment) lives in the root under
# /var/lib/acemq-nodes/NAME, owned by the root's rabbitmq user; the node and
# its CLI read the root's own Erlang cookie (/var/lib/rabbitmq/.erlang.cookie in
# the root, made by the package), not the default broker's. Each process runs
# in a mount namespace of its own (unshare) where /proc and /sys are mounted in
# the root, so no mount outlives the node. The node registers with the host's
# epmd (the default broker's) when one runs; an epmd it started itself is
# stopped by `down` when no node is left registered with it. One scheduler
# (`+S 1:1`): the machine has 2 cores. The default broker is never touched.
set -euo pipefail

SELF=$(readlink -f "$0")
ROOT=${ACEMQ_RABBITMQ4_ROOT:-/var/cache/acemq/trixie-rabbitmq4}
ROOT=${ROOT%/}
STAMP="$ROOT/.acemq-rabbitmq4"
# Bump when the build below changes: a root with another recipe is rebuilt.
RECIPE="acemq-rabbitmq4 recipe 1"
NODES_IN_ROOT=/var/lib/acemq-nodes

say() { echo "rabbitmq4: $*"; }
die() { local code=$1; shift; echo "rabbitmq4: $*" >&2; exit "$code"; }
ms() { echo $(($(date +%s%N) / 1000000)); }
secs_since() { local d=$(($(ms) - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }

usage() {
  sed -n '/^#   scripts/s/^#   //p' "$SELF" >&2
  exit 64
}

# --- inside the root --------------------------------------------------------

# `__enter ROOT UID:GID CMD...` runs in a fresh mount namespace (see in_root):
# mount /proc and /sys in the root, then chroot as that user.
if [ "${1:-}" = __enter ]; then
  root=$2 spec=$3
  shift 3
  mount -t proc proc "$root/proc"
  mount -t sysfs -o ro sysfs "$root/sys" 2>/dev/null || true
  exec chroot --userspec="$spec" --groups="${spec#*:}" "$root" "$@"
fi

# in_root UID:GID CMD...: CMD in the root, in a mount namespace of its own.
in_root() {
  unshare --mount --propagation private -- "$SELF" __enter "$ROOT" "$@"
}

# The root's rabbitmq user as UID:GID.
rabbit_ids() {
  local u g
  u=$(awk -F: '$1 == "rabbitmq" { print $3 }' "$ROOT/etc/passwd")
  g=$(awk -F: '$1 == "rabbitmq" { print $4 }' "$ROOT/etc/passwd")
  if [ -z "$u" ] || [ -z "$g" ]; then die 70 "no rabbitmq user in $ROOT/etc/passwd"; fi
  echo "$u:$g"
}

# --- the build --------------------------------------------------------------

root_ready() { [ -f "$STAMP" ] && [ "$(head -n 1 "$STAMP")" = "$RECIPE" ]; }

# Processes whose root directory is $1 (a node, its CLI, its epmd).
procs_in() {
  local p r
  for p in /proc/[0-9]*; do
    r=$(readlink "$p/root" 2>/dev/null) || continue
    [ "$r" = "$1" ] && echo "${p#/proc/}"
  done
  return 0
}

# No mount may remain under a folder that is about to be removed (every mount
# here lives in a namespace that dies with its processes; this is a guard).
assert_no_mounts() {
  if awk -v d="$1" '$2 == d || index($2, d "/") == 1 { found = 1 } END { exit !found }' /proc/mounts; then
    die 70 "something is mounted under $1; unmount it first (grep '$1' /proc/mounts)"
  fi
}

build() {
  local t0 part ids hu hg
  t0=$(ms)
  part="$ROOT.partial"
  if [ -e "$ROOT" ]; then
    [ -z "$(procs_in "$ROOT")" ] || die 69 "$ROOT is incomplete or outdated but processes run in it (down them first)"
    assert_no_mounts "$ROOT"
    rm -rf --one-file-system "$ROOT"
  fi
  if [ -e "$part" ]; then
    say "removing an interrupted build in $part"
    [ -z "$(procs_in "$part")" ] || die 69 "processes run in $part"
    assert_no_mounts "$part"
    rm -rf --one-file-system "$part"
  fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    say "installing debootstrap on the host (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  mkdir -p "$(dirname "$ROOT")"
  local log="$ROOT.build.log"
  say "building the trixie root with RabbitMQ 4 in $ROOT (once; log $log)"
  : >"$log"
  # debootstrap mounts /proc and /sys in the target while it installs: in a
  # namespace of its own, an interrupted build leaves no mount behind.
  # shellcheck disable=SC2086 # the mirror is an optional argument
  if ! unshare --mount --propagation private -- \
    debootstrap --variant=minbase trixie "$part" ${ACEMQ_DEBIAN_MIRROR:-} >>"$log" 2>&1; then
    tail -n 20 "$log" >&2
    die 69 "debootstrap trixie failed (log $log)"
  fi
  # Keep the package's scripts from starting a broker inside the root.
  printf '#!/bin/sh\nexit 101\n' >"$part/usr/sbin/policy-rc.d"
  chmod 755 "$part/usr/sbin/policy-rc.d"
  # debootstrap writes no /etc/hosts; the node name's host is localhost.
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$part/etc/hosts"
  local chroot_env=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive HOME=/root)
  # The rabbitmq user takes the host's uid and gid when they are free in the
  # root, so the node's processes and files show as rabbitmq on the host;
  # otherwise the package's adduser picks them.
  if hu=$(id -u rabbitmq 2>/dev/null) && hg=$(id -g rabbitmq 2>/dev/null) &&
    ! chroot "$part" getent passwd "$hu" >/dev/null && ! chroot "$part" getent group "$hg" >/dev/null; then
    chroot "$part" "${chroot_env[@]}" groupadd --system --gid "$hg" rabbitmq >>"$log" 2>&1
    chroot "$part" "${chroot_env[@]}" useradd --system --uid "$hu" --gid "$hg" --home-dir /var/lib/rabbitmq \
      --no-create-home --shell /usr/sbin/nologin --comment "RabbitMQ messaging server" rabbitmq >>"$log" 2>&1
  fi
  # shellcheck disable=SC2016 # expanded by the inner sh
  if ! unshare --mount --propagation private -- sh -c '
      mount -t proc proc "$1/proc" && exec chroot "$@"' sh "$part" "${chroot_env[@]}" sh -c '
      apt-get update -q &&
      apt-get install -y -q --no-install-recommends rabbitmq-server &&
      apt-get clean && rm -rf /var/lib/apt/lists/*' >>"$log" 2>&1; then
    tail -n 20 "$log" >&2
    die 69 "installing rabbitmq-server in the trixie root failed (log $log)"
  fi
  [ -s "$part/var/lib/rabbitmq/.erlang.cookie" ] || die 70 "the package made no Erlang cookie in the root"
  ids=$(ROOT=$part rabbit_ids)
  mkdir -p "$part$NODES_IN_ROOT"
  chown "$ids" "$part$NODES_IN_ROOT"
  {
    echo "$RECIPE"
    # shellcheck disable=SC2016 # dpkg-query's format
    chroot "$part" dpkg-query -W -f '${Package} ${Version}\n' rabbitmq-server erlang-base
    echo "built $(date -u +%FT%TZ) in $(secs_since "$t0") s"
  } >"$part/.acemq-rabbitmq4.tmp"
  mv "$part/.acemq-rabbitmq4.tmp" "$part/.acemq-rabbitmq4"
  mv "$part" "$ROOT"
  say "root built in $(secs_since "$t0") s, $(du -sh --one-file-system "$ROOT" | cut -f1) in $ROOT ($(versions))"
}

ensure_root() {
  root_ready && return 0
  mkdir -p "$(dirname "$ROOT")"
  # One build at a time; a second caller waits and then finds the stamp.
  exec 9>"$ROOT.lock"
  flock 9
  root_ready || build
  exec 9>&-
}

# --- the node ---------------------------------------------------------------

node_for_port() {
  port=$1
  case "$port" in *[!0-9]*|"") die 64 "PORT must be a number (got '$port')" ;; esac
  if [ "$port" -lt 1024 ] || [ "$port" -gt 45535 ]; then die 64 "PORT must be within 1024-45535 (got $port)"; fi
  [ "$port" -ne 5672 ] || die 64 "refusing to touch the default broker's port 5672"
  if [ "$port" -eq 5704 ]; then name=acemq-rmq4; else name="acemq-rmq4-$port"; fi
  node="$name@localhost"
  dist=$((port + 20000))
  indir="$NODES_IN_ROOT/$name"
  dir="$ROOT$indir"
}

# `sh -c "$WITH_NODE_ENV" ENV_FILE CMD...` (in the root, under `env -i`): CMD
# with only the node's environment, from the rabbitmq user's home.
# shellcheck disable=SC2016 # expanded by that sh
WITH_NODE_ENV='set -a; . "$0"; set +a; cd /var/lib/rabbitmq; exec "$@"'

# rabbitmq-* CLI tool $1 against the node, as the root's rabbitmq user.
cli() {
  local tool=$1
  shift
  [ -f "$dir/cli.env" ] || die 69 "$node has no environment in $dir (is it up? scripts/rabbitmq4.sh up $port)"
  timeout "${CTL_TIMEOUT:-60}" "$SELF" __in_root "$(rabbit_ids)" \
    env -i /bin/sh -c "$WITH_NODE_ENV" "$indir/cli.env" "/usr/lib/rabbitmq/bin/$tool" -n "$node" "$@"
}
ctl() { cli rabbitmqctl "$@"; }

# The node's beam.smp, found by RABBITMQ_NODENAME in /proc/PID/environ.
beam_pid() {
  local p
  for p in $(pgrep -x beam.smp 2>/dev/null || true); do
    if { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "RABBITMQ_NODENAME=$node"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

amqp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

is_up() { beam_pid >/dev/null && CTL_TIMEOUT=15 ctl -q await_startup -t 10 >/dev/null 2>&1 && amqp_open "$port"; }

# "RabbitMQ 4.0.5 (Debian 4.0.5-6+deb13u2), Erlang 27.3.4.1" from the stamp.
versions() {
  awk '$1 == "rabbitmq-server" { r = $2 } $1 == "erlang-base" { e = $2 }
    END { v = r; sub(/-[^-]*$/, "", v); sub(/^[0-9]+:/, "", e); sub(/[+-].*$/, "", e)
          printf "RabbitMQ %s (Debian %s), Erlang %s", v, r, e }' "$STAMP"
}

# Write the node's files into $dir (config.sig changes when its settings do).
write_node_files() {
  mkdir -p "$dir/mnesia" "$dir/log"
  echo '[].' >"$dir/enabled_plugins"
  {
    echo "listeners.tcp.1 = 127.0.0.1:$port"
    echo "loopback_users = none"
    echo "log.file.level = info"
    echo "log.console = false"
    if [ -n "${ACEMQ_RABBITMQ4_CONF:-}" ]; then
      echo "# ACEMQ_RABBITMQ4_CONF"
      printf '%s\n' "$ACEMQ_RABBITMQ4_CONF"
    fi
  } >"$dir/rabbitmq.conf"
  printf '%s\n' "${ACEMQ_RABBITMQ4_ADVANCED:-[].}" >"$dir/advanced.config"
  # /etc/rabbitmq/rabbitmq-env.conf of the root is replaced by an empty one.
  : >"$dir/rabbitmq-env.conf"
  # node.env: the node's environment; cli.env: its CLI's, without
  # RABBITMQ_NODENAME (the CLI runs on a beam.smp of its own, which beam_pid
  # must not take for the node's; the CLI is given -n instead).
  cat >"$dir/cli.env" <<EOF
RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
RABBITMQ_NODE_PORT=$port
RABBITMQ_DIST_PORT=$dist
RABBITMQ_CONFIG_FILE='$indir/rabbitmq.conf'
RABBITMQ_ADVANCED_CONFIG_FILE='$indir/advanced.config'
RABBITMQ_CONF_ENV_FILE='$indir/rabbitmq-env.conf'
RABBITMQ_MNESIA_BASE='$indir/mnesia'
RABBITMQ_MNESIA_DIR='$indir/mnesia/$node'
RABBITMQ_LOG_BASE='$indir/log'
RABBITMQ_ENABLED_PLUGINS_FILE='$indir/enabled_plugins'
RABBITMQ_PID_FILE='$indir/pid'
RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='+S 1:1'
ERL_EPMD_ADDRESS=127.0.0.1
ERL_FLAGS='-kernel inet_dist_use_interface {127,0,0,1}'
HOME=/var/lib/rabbitmq
PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/sbin:/bin
LANG=C.UTF-8
ERL_CRASH_DUMP='$indir/log/erl_crash.dump'
EOF
  { echo "RABBITMQ_NODENAME='$node'"; cat "$dir/cli.env"; } >"$dir/node.env"
  cat "$dir/rabbitmq.conf" "$dir/advanced.config" "$dir/node.env" | md5sum | cut -d' ' -f1 >"$dir/config.sig.new"
  chown -R "$(rabbit_ids)" "$dir"
}

up() {
  local t0 limit
  limit=${ACEMQ_RABBITMQ4_TIMEOUT:-120}
  case "$limit" in *[!0-9]*|"") die 64 "ACEMQ_RABBITMQ4_TIMEOUT must be whole seconds" ;; esac
  ensure_root
  t0=$(ms)
  if beam_pid >/dev/null; then
    write_node_files
    if cmp -s "$dir/config.sig.new" "$dir/config.sig" && is_up; then
      rm -f "$dir/config.sig.new"
      say "$node is already up on 127.0.0.1:$port (dist $dist)"
      return 0
    fi
    say "$node runs with other settings or does not answer; restarting it"
    stop_node
  fi
  amqp_open "$port" && die 69 "port $port is taken by something else"
  amqp_open "$dist" && die 69 "distribution port $dist is taken by something else"
  # A folder left by a node that was killed keeps its data; the config files
  # are written afresh.
  write_node_files
  mv "$dir/config.sig.new" "$dir/config.sig"
  # In the foreground (rabbitmq-server's own wrapper stays as the parent of
  # beam.smp), in a session of its own, so that what it prints when it cannot
  # boot lands in startup_log and startup_err; `-detached` would lose it. Every
  # step up to the wrapper is an exec: $! is the wrapper, alive as long as the
  # node. Its mount namespace lives as long as it does.
  setsid "$SELF" __in_root "$(rabbit_ids)" \
    env -i /bin/sh -c "$WITH_NODE_ENV" "$indir/node.env" /usr/lib/rabbitmq/bin/rabbitmq-server \
    </dev/null >"$dir/log/startup_log" 2>"$dir/log/startup_err" &
  local started=$!
  # await_startup fails while the node has not registered with epmd: retry.
  local deadline=$((SECONDS + limit)) left why="did not answer within $limit s"
  while [ "$SECONDS" -lt "$deadline" ]; do
    left=$((deadline - SECONDS))
    if CTL_TIMEOUT=$((left + 5)) ctl -q await_startup -t "$left" >/dev/null 2>&1 && amqp_open "$port"; then
      say "$node ($(versions)) up on 127.0.0.1:$port (dist $dist) in $(secs_since "$t0") s; AMQP_ADDR=amqp://guest:guest@127.0.0.1:$port/%2f; data in $dir"
      return 0
    fi
    if ! kill -0 "$started" 2>/dev/null; then
      why="exited while booting"
      break
    fi
    sleep 0.5
  done
  echo "rabbitmq4: $node $why; its logs ($dir/log):" >&2
  tail -n 30 "$dir/log/"*.log "$dir/log/startup_log" "$dir/log/startup_err" >&2 2>/dev/null || true
  stop_node
  exit 69
}

# Stop the node (kill -9 after 30 s) and whatever else of it runs in the root.
stop_node() {
  local pid t0 p
  if pid=$(beam_pid); then
    if [ -f "$dir/cli.env" ]; then
      CTL_TIMEOUT=35 ctl -q stop >/dev/null 2>&1 || true
    else
      kill -TERM "$pid" 2>/dev/null || true # RabbitMQ stops gracefully on SIGTERM
    fi
    t0=$SECONDS
    while kill -0 "$pid" 2>/dev/null; do
      if [ $((SECONDS - t0)) -ge 30 ]; then
        kill -9 "$pid" 2>/dev/null || true
      fi
      sleep 0.2
    done
  fi
  # Its CLI processes or helpers, if any outlived it.
  for p in $(procs_in "$ROOT"); do
    if { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "RABBITMQ_NODENAME=$node"; then
      kill -9 "$p" 2>/dev/null || true
    fi
  done
  stop_own_epmd
}

# An epmd started from the root (when no epmd ran on the host) is stopped once
# no node is registered with it.
stop_own_epmd() {
  local p names
  for p in $(procs_in "$ROOT"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = epmd ] || continue
    names=$(in_root 0:0 /usr/bin/epmd -names 2>/dev/null | grep -c '^name ' || true)
    if [ "${names:-0}" -eq 0 ]; then
      kill "$p" 2>/dev/null || true
    else
      say "leaving epmd (pid $p, started from $ROOT) running: $names node(s) registered with it"
    fi
  done
}

down() {
  local t0
  t0=$(ms)
  if ! beam_pid >/dev/null && [ ! -d "$dir" ]; then
    [ ! -d "$ROOT" ] || stop_own_epmd
    say "$node is not running"
    return 0
  fi
  stop_node
  rm -rf --one-file-system "$dir"
  say "$node down, its data removed, in $(secs_since "$t0") s"
}

# --- commands ---------------------------------------------------------------

if [ "${1:-}" = __in_root ]; then
  shift
  exec unshare --mount --propagation private -- "$SELF" __enter "$ROOT" "$@"
fi

[ "$(id -u)" -eq 0 ] || die 77 "run as root (chroot, unshare, mount)"
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up | down | status | pid)
    [ $# -le 1 ] || usage
    node_for_port "${1:-${ACEMQ_RABBITMQ4_PORT:-5704}}"
    ;;
  ctl | cli) node_for_port "${ACEMQ_RABBITMQ4_PORT:-5704}" ;;
  build) ;;
  *) usage ;;
esac

case "$cmd" in
  up) up ;;
  down) down ;;
  status)
    if [ -f "$STAMP" ] && is_up; then
      say "$node ($(versions)) is up on 127.0.0.1:$port (dist $dist), pid $(beam_pid)"
    else
      say "$node is not up"
      exit 3
    fi
    ;;
  pid) beam_pid || die 3 "$node has no beam.smp" ;;
  ctl)
    root_ready || die 69 "no RabbitMQ 4 root in $ROOT (scripts/rabbitmq4.sh up)"
    ctl "$@"
    ;;
  cli)
    [ $# -ge 1 ] || usage
    case "$1" in rabbitmq-*) ;; *) die 64 "TOOL is one of the root's rabbitmq-* tools (got '$1')" ;; esac
    root_ready || die 69 "no RabbitMQ 4 root in $ROOT (scripts/rabbitmq4.sh up)"
    cli "$@"
    ;;
  build)
    ensure_root
    say "root ready in $ROOT ($(versions))"
    ;;
esac
