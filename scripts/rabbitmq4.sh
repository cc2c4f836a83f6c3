#!/usr/bin/env bash
# A RabbitMQ 4 node for tests, beside the default broker (3.10.8 on
# bookworm): Debian sid's rabbitmq-server (4.3.x on Erlang 29) from the
# broker root of scripts/broker-root.sh, started by scripts/broker-node.sh.
# A chroot shares the host's network: the node listens on the host's
# 127.0.0.1:PORT.
#
#   scripts/rabbitmq4.sh up     [PORT]   build the root once, start the node, wait until it answers
#   scripts/rabbitmq4.sh down   [PORT]   stop the node, remove its data; ok when it is not running
#   scripts/rabbitmq4.sh status [PORT]   exit 0 when the node is up, 3 when it is not
#   scripts/rabbitmq4.sh pid    [PORT]   the node's beam.smp
#   scripts/rabbitmq4.sh ctl  ARGS...    that node's rabbitmqctl (e.g. `ctl list_queues name messages`)
#   scripts/rabbitmq4.sh cli TOOL ARGS... another of its CLI tools (rabbitmq-queues, rabbitmq-diagnostics, ...)
#   scripts/rabbitmq4.sh build           build (or find) the root only, and print its version
#   scripts/rabbitmq4.sh version         the root's version (RabbitMQ, Debian package, Erlang)
#
# PORT is the AMQP port on 127.0.0.1, default $ACEMQ_RABBITMQ4_PORT or 5704
# (`ctl` and `cli` take the port from ACEMQ_RABBITMQ4_PORT only). The node is
# `acemq-rmq4@localhost` on 5704 and `acemq-rmq4-PORT@localhost` on any other
# port; its Erlang distribution port is PORT+20000 (25704). Ports used by the
# other helper nodes: 5681–5683, 5690, 5695, 5720 (dist +20000); the default
# broker's are 5672 and 25672.
#
# Extra configuration, applied on `up` (a node already up with other settings
# is restarted with the new ones):
#   ACEMQ_RABBITMQ4_CONF      lines appended to the node's rabbitmq.conf,
#                             e.g. `consumer_timeout = 5000`
#   ACEMQ_RABBITMQ4_ADVANCED  the node's advanced.config, an Erlang term list,
#                             e.g. `[{rabbit, [{channel_tick_interval, 1000}]}].`
#   ACEMQ_NODE_PLUGINS        plugins to enable (none by default), e.g.
#                             `rabbitmq_stream` (streams on PORT-120: 5584)
#   ACEMQ_RABBITMQ4_TIMEOUT   seconds `up` waits for the node (default 120)
#
# The root: $ACEMQ_BROKER_ROOT, or /var/cache/acemq/sid (scripts/broker-root.sh
# says how it is built, once per machine, and where the version is recorded).
# The node's files: ${ACEMQ_NODE_ROOT:-/tmp/acemq-nodes}/NAME, as for every
# scripts/broker-node.sh node. The default broker is never touched.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
export ACEMQ_BROKER_ROOT=${ACEMQ_BROKER_ROOT:-/var/cache/acemq/sid}

say() { echo "rabbitmq4: $*"; }
die() { local code=$1; shift; echo "rabbitmq4: $*" >&2; exit "$code"; }

usage() {
  sed -n '/^#   scripts/s/^#   //p' "$0" >&2
  exit 64
}

node_for_port() {
  port=$1
  case "$port" in *[!0-9]*|"") die 64 "PORT must be a number (got '$port')" ;; esac
  if [ "$port" -eq 5704 ]; then name=acemq-rmq4; else name="acemq-rmq4-$port"; fi
  dir="${ACEMQ_NODE_ROOT:-/tmp/acemq-nodes}/$name"
}

node_script() { "$HERE/broker-node.sh" "$@"; }

up() {
  local conf adv sig rc=0
  local limit=${ACEMQ_RABBITMQ4_TIMEOUT:-120}
  case "$limit" in *[!0-9]*|"") die 64 "ACEMQ_RABBITMQ4_TIMEOUT must be whole seconds" ;; esac
  conf=$(mktemp) adv=$(mktemp)
  # shellcheck disable=SC2064 # the files are known now
  trap "rm -f '$conf' '$adv'" RETURN
  printf '%s\n' "${ACEMQ_RABBITMQ4_CONF:-}" >"$conf"
  printf '%s\n' "${ACEMQ_RABBITMQ4_ADVANCED:-[].}" >"$adv"
  sig=$({ cat "$conf" "$adv"; echo "plugins ${ACEMQ_NODE_PLUGINS:-}"; } | md5sum | cut -d' ' -f1)
  if node_script status "$name" "$port" >/dev/null 2>&1; then
    if [ "$(cat "$dir/acemq-rmq4.sig" 2>/dev/null)" = "$sig" ]; then
      say "$name@localhost is already up on 127.0.0.1:$port"
      return 0
    fi
    say "$name@localhost runs with other settings; restarting it"
    node_script down "$name" "$port" >/dev/null
  fi
  ACEMQ_NODE_START_SECS=$limit node_script up "$name" "$port" "$conf" "$adv" || rc=$?
  [ "$rc" -eq 0 ] || exit "$rc"
  echo "$sig" >"$dir/acemq-rmq4.sig"
  say "AMQP_ADDR=amqp://guest:guest@127.0.0.1:$port/%2f"
}

[ "$(id -u)" -eq 0 ] || die 77 "run as root (chroot, unshare, mount)"
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up | down | status | pid)
    [ $# -le 1 ] || usage
    node_for_port "${1:-${ACEMQ_RABBITMQ4_PORT:-5704}}"
    ;;
  ctl | cli) node_for_port "${ACEMQ_RABBITMQ4_PORT:-5704}" ;;
  build | version) [ $# -eq 0 ] || usage ;;
  *) usage ;;
esac

case "$cmd" in
  up) up ;;
  down | status | pid) node_script "$cmd" "$name" "$port" ;;
  ctl) "$HERE/broker-root.sh" cli rabbitmqctl -n "$name@localhost" "$@" ;;
  cli)
    [ $# -ge 1 ] || usage
    case "$1" in rabbitmq-*) ;; *) die 64 "TOOL is one of the root's rabbitmq-* tools (got '$1')" ;; esac
    tool=$1
    shift
    "$HERE/broker-root.sh" cli "$tool" -n "$name@localhost" "$@"
    ;;
  build) "$HERE/broker-root.sh" build ;;
  version) "$HERE/broker-root.sh" version ;;
esac
