#!/usr/bin/env bash
# A root of Debian sid's rabbitmq-server (RabbitMQ 4.3.x on Erlang 29), made
# with `debootstrap --variant=minbase sid`, for nodes beside the default
# broker (3.10.8 on bookworm). RabbitMQ 4 is not packaged for bookworm; the
# nodes run from the root with `chroot`, which shares the host's network: a
# node listens on the host's 127.0.0.1 and registers with the host's epmd.
#
#   scripts/broker-root.sh build              build the root once (or find it built); print its version
#   scripts/broker-root.sh version            the version recorded in the root (exit 3 when not built)
#   scripts/broker-root.sh cli TOOL ARGS...   one of the root's rabbitmq-* tools (rabbitmqctl,
#                                             rabbitmq-queues, rabbitmq-diagnostics, ...), as
#                                             the root's rabbitmq user, e.g. `cli rabbitmqctl -n
#                                             acemq-rmq4@localhost list_queues`
#   scripts/broker-root.sh run [--bind DIR]... UID:GID CMD...
#                                             CMD in the root as UID:GID, with DIR (a host folder)
#                                             mounted at the same path inside it
#   scripts/broker-root.sh ids                the root's rabbitmq user as UID:GID
#
# The root is $ACEMQ_BROKER_ROOT, or /var/cache/acemq/sid when that is empty.
# scripts/broker-node.sh and scripts/cluster.sh run their nodes from it when
# ACEMQ_BROKER_ROOT is set; scripts/broker-bin/ holds rabbitmqctl and its
# siblings that go to the root's tools then (put it first on PATH).
#
# The build (about 90 s and 250 MB, once per machine): `apt-get install
# debootstrap` on the host if it is missing, `debootstrap --variant=minbase
# sid` into ROOT.partial (mirror: debootstrap's default, or
# $ACEMQ_DEBIAN_MIRROR), apt told not to check the Release file's
# Valid-Until (sid's on a mirror can be past it), the host's /etc/hosts
# copied in (epmd resolves `localhost` with it), the rabbitmq user created
# with the host's rabbitmq uid and gid when those are free in the root,
# `apt-get install --no-install-recommends rabbitmq-server` (services kept
# from starting by a policy-rc.d), apt's caches cleaned, then the stamp
# ROOT/.acemq-broker-root: the recipe, `dpkg-query -W rabbitmq-server
# erlang-base` and the build's date and time; ROOT.partial is renamed ROOT
# last. A root without that stamp, or with another recipe's, is built again
# (nothing may run in it then). Remove ROOT to rebuild at will; sid moves, so
# a rebuild can bring another 4.3.x (the stamp says which).
#
# Every command runs in a mount namespace of its own (unshare) where /proc and
# /sys are mounted in the root, so no mount outlives its processes. The
# root's own Erlang cookie (/var/lib/rabbitmq/.erlang.cookie in the root)
# is its nodes' and CLI's, not the default broker's.
set -euo pipefail

SELF=$(readlink -f "$0")
ROOT=${ACEMQ_BROKER_ROOT:-/var/cache/acemq/sid}
ROOT=${ROOT%/}
STAMP="$ROOT/.acemq-broker-root"
# Bump when the build below changes: a root of another recipe is rebuilt.
RECIPE="acemq-broker-root sid recipe 1"

say() { echo "broker-root: $*"; }
die() { local code=$1; shift; echo "broker-root: $*" >&2; exit "$code"; }
ms() { echo $(($(date +%s%N) / 1000000)); }
secs_since() { local d=$(($(ms) - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }

usage() {
  sed -n '/^#   scripts/s/^#   //p' "$SELF" >&2
  exit 64
}

# --- inside the root --------------------------------------------------------

# `__enter ROOT [--bind DIR]... UID:GID CMD...`, in a fresh mount namespace
# (see in_root): mount /proc, /sys and each DIR in the root, then chroot.
if [ "${1:-}" = __enter ]; then
  root=$2
  shift 2
  while [ "${1:-}" = --bind ]; do
    mkdir -p "$root$2"
    mount --bind "$2" "$root$2"
    shift 2
  done
  spec=$1
  shift
  mount -t proc proc "$root/proc"
  mount -t sysfs -o ro sysfs "$root/sys" 2>/dev/null || true
  exec chroot --userspec="$spec" --groups="${spec#*:}" "$root" "$@"
fi

# in_root [--bind DIR]... UID:GID CMD...: CMD in the root, in a mount
# namespace of its own.
in_root() {
  exec unshare --mount --propagation private -- "$SELF" __enter "$ROOT" "$@"
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

root_ready() {
  [ -f "$STAMP" ] && [ "$(head -n 1 "$STAMP")" = "$RECIPE" ] &&
    [ -x "$ROOT/usr/lib/rabbitmq/bin/rabbitmq-server" ] && [ -s "$ROOT/var/lib/rabbitmq/.erlang.cookie" ]
}

# Processes whose root directory is $1 (a node, its CLI, an epmd).
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
  local t0 part hu hg log
  t0=$(ms)
  part="$ROOT.partial"
  log="$ROOT.build.log"
  if [ -e "$ROOT" ]; then
    [ -z "$(procs_in "$ROOT")" ] || die 69 "$ROOT is incomplete or outdated but processes run in it (stop its nodes first)"
    assert_no_mounts "$ROOT"
    say "removing the incomplete or outdated root $ROOT"
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
  say "building the sid root with rabbitmq-server in $ROOT (once; log $log)"
  : >"$log"
  # debootstrap mounts /proc and /sys in the target while it installs: in a
  # namespace of its own, an interrupted build leaves no mount behind. It
  # checks the Release file's signature, not its Valid-Until.
  # shellcheck disable=SC2086 # the mirror is an optional argument
  if ! unshare --mount --propagation private -- \
    debootstrap --variant=minbase sid "$part" ${ACEMQ_DEBIAN_MIRROR:-} >>"$log" 2>&1; then
    tail -n 20 "$log" >&2
    die 69 "debootstrap sid failed (log $log)"
  fi
  # sid's Release file on a mirror can be past its Valid-Until.
  echo 'Acquire::Check-Valid-Until "false";' >"$part/etc/apt/apt.conf.d/99acemq-valid-until"
  # Keep the package's scripts from starting a broker inside the root.
  printf '#!/bin/sh\nexit 101\n' >"$part/usr/sbin/policy-rc.d"
  chmod 755 "$part/usr/sbin/policy-rc.d"
  # debootstrap writes no /etc/hosts; epmd and the node names need localhost.
  cp /etc/hosts "$part/etc/hosts"
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
      apt-get -o Acquire::Check-Valid-Until=false update -q &&
      apt-get install -y -q --no-install-recommends rabbitmq-server &&
      apt-get clean && rm -rf /var/lib/apt/lists/*' >>"$log" 2>&1; then
    tail -n 20 "$log" >&2
    die 69 "installing rabbitmq-server in the sid root failed (log $log)"
  fi
  [ -s "$part/var/lib/rabbitmq/.erlang.cookie" ] || die 70 "the package made no Erlang cookie in the root"
  {
    echo "$RECIPE"
    # shellcheck disable=SC2016 # dpkg-query's format
    chroot "$part" dpkg-query -W -f '${Package} ${Version}\n' rabbitmq-server erlang-base
    echo "built $(date -u +%FT%TZ) in $(secs_since "$t0") s"
  } >"$part/.acemq-broker-root.tmp"
  mv "$part/.acemq-broker-root.tmp" "$part/.acemq-broker-root"
  mv "$part" "$ROOT"
  say "root built in $(secs_since "$t0") s, $(du -sh --one-file-system "$ROOT" | cut -f1) in $ROOT"
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

# "RabbitMQ 4.3.6 (Debian 4.3.6-1), Erlang 29.0.1 (erlang-base 1:29.0.1+dfsg-1)"
# from the stamp.
versions() {
  awk '$1 == "rabbitmq-server" { r = $2 } $1 == "erlang-base" { e = $2 }
    END { v = r; sub(/-[^-]*$/, "", v); ev = e; sub(/^[0-9]+:/, "", ev); sub(/[+-].*$/, "", ev)
          printf "RabbitMQ %s (Debian %s), Erlang %s (erlang-base %s)", v, r, ev, e }' "$STAMP"
}

# --- commands ---------------------------------------------------------------

[ "$(id -u)" -eq 0 ] || die 77 "run as root (chroot, unshare, mount)"
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build)
    [ $# -eq 0 ] || usage
    ensure_root
    say "$(versions) in $ROOT ($(tail -n 1 "$STAMP"))"
    ;;
  version)
    [ $# -eq 0 ] || usage
    root_ready || die 3 "no broker root built in $ROOT (scripts/broker-root.sh build)"
    versions
    echo
    ;;
  ids)
    root_ready || die 69 "no broker root built in $ROOT (scripts/broker-root.sh build)"
    rabbit_ids
    ;;
  cli)
    [ $# -ge 1 ] || usage
    case "$1" in rabbitmqctl | rabbitmq-*) ;; *) die 64 "TOOL is one of the root's rabbitmq-* tools or rabbitmqctl (got '$1')" ;; esac
    root_ready || die 69 "no broker root built in $ROOT (scripts/broker-root.sh build)"
    tool=$1
    shift
    # The tool as the root's rabbitmq user, with its cookie and nothing of
    # the caller's environment.
    in_root "$(rabbit_ids)" env -i HOME=/var/lib/rabbitmq LANG=C.UTF-8 \
      PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      /bin/sh -c 'cd /var/lib/rabbitmq && exec "$@"' sh "/usr/lib/rabbitmq/bin/$tool" "$@"
    ;;
  run)
    binds=()
    while [ "${1:-}" = --bind ]; do
      [ $# -ge 2 ] || usage
      case "$2" in /*) ;; *) die 64 "--bind takes an absolute folder (got '$2')" ;; esac
      [ -d "$2" ] || die 66 "--bind $2: no such folder"
      binds+=(--bind "$2")
      shift 2
    done
    [ $# -ge 2 ] || usage
    case "$1" in *[!0-9:]* | "") die 64 "UID:GID must be numbers (got '$1')" ;; esac
    root_ready || die 69 "no broker root built in $ROOT (scripts/broker-root.sh build)"
    # The host's /etc/hosts may have changed since the build.
    cmp -s /etc/hosts "$ROOT/etc/hosts" || cp /etc/hosts "$ROOT/etc/hosts"
    in_root "${binds[@]}" "$@"
    ;;
  *) usage ;;
esac
