#!/usr/bin/env bash
# A throwaway RabbitMQ node beside the default broker, for the tests whose
# faults touch a whole broker (memory alarm, a short consumer_timeout, a
# broker restart, node loss). The node runs the host's rabbitmq-server
# (Debian bookworm's 3.10.8), or, when ACEMQ_BROKER_ROOT names a broker root
# (scripts/broker-root.sh, e.g. /var/cache/acemq/sid: RabbitMQ 4.3), that
# root's, with `chroot`.
#
#   scripts/broker-node.sh up     NAME PORT [EXTRA_CONF_FILE [ADVANCED_CONFIG_FILE]]
#   scripts/broker-node.sh down   NAME PORT
#   scripts/broker-node.sh status NAME PORT
#   scripts/broker-node.sh pid    NAME PORT   (the node's beam.smp)
#   scripts/broker-node.sh ctl    NAME PORT ARGS...   (rabbitmqctl -n NAME@localhost ARGS...,
#                                                    the node's own version of it)
#
# NAME is the short node name (node `NAME@localhost`), PORT its AMQP port; the
# Erlang distribution port is PORT+20000. Everything the node writes (mnesia,
# logs, its own rabbitmq.conf and enabled-plugins file) lives under
# ${ACEMQ_NODE_ROOT:-/tmp/acemq-nodes}/NAME, owned by the `rabbitmq` user
# (the host's, or the broker root's: the folder is mounted at the same path
# inside the root, so the node's files are where they are for a 3.10 node).
# A host node shares the Erlang cookie in /var/lib/rabbitmq with the default
# broker and rabbitmqctl; a root's nodes share the root's cookie, and its
# rabbitmqctl is `scripts/broker-bin/rabbitmqctl` (with ACEMQ_BROKER_ROOT
# set) or this script's `ctl`.
# EXTRA_CONF_FILE is appended to the node's rabbitmq.conf (e.g. a line
# `consumer_timeout = 5000`). ADVANCED_CONFIG_FILE becomes the node's
# advanced.config, for settings rabbitmq.conf cannot take on 3.10 (e.g.
# `[{rabbit, [{channel_tick_interval, 1000}]}].`, so consumer_timeout is
# checked every second rather than every minute). One scheduler (`+S 1:1`):
# the machine has 2 cores.
#
# Plugins: none by default (an empty enabled-plugins file). ACEMQ_NODE_PLUGINS
# (names separated by spaces or commas) enables some on `up`; with
# `rabbitmq_stream` the node's stream port is PORT-120 (5552 is 5672's), on
# 127.0.0.1 and advertised as such.
#
# `up` is idempotent (a node already up is left as it is; a node that was
# killed is started again on its data) and waits until the node accepts AMQP
# (at most ACEMQ_NODE_START_SECS, 60 by default, then the log's tail and exit
# 69); `down` stops the node (kill -9 after 30 s) and removes its folder;
# `status` exits 0 when the node is up, 3 when it is not. The default
# broker (rabbit@localhost:5672, /etc/rabbitmq/rabbitmq.conf) is never touched.
#
# Ports used by acemq's tests (nothing else may use them): the fault-test node
# 5690 (dist 25690), the bench node 5695 (dist 25695), the cluster 5681–5683
# (dist 25681–25683), the consumer-timeout node 5720 (dist 25720), the
# RabbitMQ 4 node of scripts/rabbitmq4.sh 5704 (dist 25704).
set -euo pipefail

usage() {
  echo "usage: $0 up|down|status|pid NAME PORT [EXTRA_CONF_FILE [ADVANCED_CONFIG_FILE]], or ctl NAME PORT ARGS..." >&2
  exit 64
}

[ $# -ge 3 ] || usage
cmd=$1 name=$2 port=$3
shift 3
extra="" advanced=""
if [ "$cmd" != ctl ]; then
  [ $# -le 2 ] || usage
  extra=${1:-} advanced=${2:-}
fi
case "$name" in *[!A-Za-z0-9_-]*|"") echo "broker-node: NAME must be letters, digits, - or _ (got '$name')" >&2; exit 64 ;; esac
case "$port" in *[!0-9]*|"") echo "broker-node: PORT must be a number (got '$port')" >&2; exit 64 ;; esac
if [ "$port" -lt 1144 ] || [ "$port" -gt 45535 ]; then
  echo "broker-node: PORT must be within 1144-45535 (got $port): the distribution port is PORT+20000, the stream port PORT-120" >&2
  exit 64
fi
if [ "$port" -eq 5672 ] || [ "$name" = rabbit ]; then
  echo "broker-node: refusing to touch the default broker (rabbit@localhost:5672)" >&2
  exit 64
fi

HERE=$(cd "$(dirname "$0")" && pwd)
node="$name@localhost"
dist=$((port + 20000))
stream_port=$((port - 120))
root="${ACEMQ_NODE_ROOT:-/tmp/acemq-nodes}"
root=${root%/}
case "$root" in /*) ;; *) root="$PWD/$root" ;; esac
dir="$root/$name"
broker_root=${ACEMQ_BROKER_ROOT:-}
broker_root=${broker_root%/}

# The plugins to enable, as the inside of an Erlang list.
plugins=$(printf '%s\n' "${ACEMQ_NODE_PLUGINS:-}" | tr ', ' '\n\n' | grep -v '^$' | paste -sd, - || true)
case "$plugins" in *[!a-z0-9_,]*)
  echo "broker-node: ACEMQ_NODE_PLUGINS names plugins (letters, digits and _; got '${ACEMQ_NODE_PLUGINS:-}')" >&2
  exit 64
  ;;
esac
streams=0
case ",$plugins," in *,rabbitmq_stream,*) streams=1 ;; esac

if [ -n "$broker_root" ]; then
  # The root's rabbitmqctl and its siblings (scripts/broker-bin goes to the
  # root when ACEMQ_BROKER_ROOT is set); the root is built on first use.
  export ACEMQ_BROKER_ROOT=$broker_root
  PATH="$HERE/broker-bin:$PATH"
  if ! out=$("$HERE/broker-root.sh" build 2>&1); then
    echo "$out" >&2
    echo "broker-node: the broker root $broker_root could not be built" >&2
    exit 69
  fi
  ids=$("$HERE/broker-root.sh" ids)
  what="$("$HERE/broker-root.sh" version | sed 's/ (Debian.*//') from $broker_root"
else
  if ! command -v rabbitmq-server >/dev/null 2>&1; then
    echo "broker-node: Debian's rabbitmq-server is not installed (apt-get install rabbitmq-server)" >&2
    exit 69
  fi
  ids=rabbitmq:rabbitmq
  what="the host's RabbitMQ"
fi

# rabbitmqctl against this node, as the rabbitmq user (its cookie).
ctl() { timeout "${CTL_TIMEOUT:-20}" rabbitmqctl -n "$node" "$@"; }

# The node's beam.smp, found by RABBITMQ_NODENAME in /proc/PID/environ (its
# arguments do not name it reliably).
beam_pid() {
  local p
  for p in $(pgrep -x beam.smp 2>/dev/null || true); do
    if tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "RABBITMQ_NODENAME=$node"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

ms() { echo $(($(date +%s%N) / 1000000)); }
secs_since() { local d=$(($(ms) - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }

amqp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }

# (A loaded machine can take seconds to start the CLI itself.)
is_up() { beam_pid >/dev/null && CTL_TIMEOUT=30 ctl await_startup -t 20 >/dev/null 2>&1 && amqp_open; }

up() {
  if is_up; then
    echo "broker-node: $node is already up on $port"
    return 0
  fi
  if beam_pid >/dev/null; then
    echo "broker-node: $node has a beam but does not answer; restarting it" >&2
    down_quiet
  fi
  if amqp_open; then
    echo "broker-node: port $port is taken by something else" >&2
    exit 69
  fi
  local t0
  t0=$(ms)
  # A folder left by a node that was killed keeps its data (a restarted
  # cluster node rejoins with it); the config files are written afresh.
  mkdir -p "$dir/mnesia" "$dir/log"
  if [ -n "$plugins" ]; then echo "[$plugins]." >"$dir/enabled_plugins"; else : >"$dir/enabled_plugins"; fi
  {
    echo "listeners.tcp.1 = 127.0.0.1:$port"
    echo "loopback_users = none"
    echo "log.file.level = info"
    echo "log.console = false"
    if [ "$streams" -eq 1 ]; then
      echo "stream.listeners.tcp.1 = 127.0.0.1:$stream_port"
      echo "stream.advertised_host = 127.0.0.1"
      echo "stream.advertised_port = $stream_port"
    fi
    if [ -n "$extra" ]; then
      [ -r "$extra" ] || { echo "broker-node: cannot read $extra" >&2; exit 66; }
      cat "$extra"
    fi
  } >"$dir/rabbitmq.conf"
  local advanced_env=""
  if [ -n "$advanced" ]; then
    [ -r "$advanced" ] || { echo "broker-node: cannot read $advanced" >&2; exit 66; }
    cp "$advanced" "$dir/advanced.config"
    advanced_env="RABBITMQ_ADVANCED_CONFIG_FILE='$dir/advanced.config'"
  fi
  # The node's environment; /etc/rabbitmq/rabbitmq-env.conf is replaced by an
  # empty one so it cannot pin the node name of the default broker.
  : >"$dir/rabbitmq-env.conf"
  cat >"$dir/env.sh" <<EOF
RABBITMQ_NODENAME='$node'
RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
RABBITMQ_NODE_PORT=$port
RABBITMQ_DIST_PORT=$dist
RABBITMQ_CONFIG_FILE='$dir/rabbitmq.conf'
$advanced_env
RABBITMQ_CONF_ENV_FILE='$dir/rabbitmq-env.conf'
RABBITMQ_MNESIA_BASE='$dir/mnesia'
RABBITMQ_MNESIA_DIR='$dir/mnesia/$node'
RABBITMQ_LOG_BASE='$dir/log'
RABBITMQ_ENABLED_PLUGINS_FILE='$dir/enabled_plugins'
RABBITMQ_PID_FILE='$dir/pid'
RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='+S 1:1'
ERL_EPMD_ADDRESS=127.0.0.1
ERL_FLAGS='-kernel inet_dist_use_interface {127,0,0,1}'
ERL_CRASH_DUMP='$dir/log/erl_crash.dump'
HOME=/var/lib/rabbitmq
EOF
  chown -R "$ids" "$root"
  chmod 755 "$root"
  # Started as the rabbitmq user directly (not through the wrapper, which
  # would send its output to the default broker's startup_log).
  local start="set -a; . '$dir/env.sh'; set +a; cd /var/lib/rabbitmq; exec /usr/lib/rabbitmq/bin/rabbitmq-server -detached"
  if [ -n "$broker_root" ]; then
    # In the root, with nothing of this environment; the node's folder is
    # mounted at its own path there.
    "$HERE/broker-root.sh" run --bind "$root" "$ids" env -i LANG=C.UTF-8 \
      PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/sh -c "$start" \
      >"$dir/log/startup_log" 2>"$dir/log/startup_err" || true
  else
    su rabbitmq -s /bin/sh -c "$start" >"$dir/log/startup_log" 2>"$dir/log/startup_err" || true
  fi
  # await_startup fails while the node has not registered with epmd yet:
  # retry, each wait no longer than what is left of the limit, so the limit
  # holds in wall-clock time also when a node hangs in its boot (e.g. mnesia
  # waiting for the tables of cluster peers that are down).
  local limit=${ACEMQ_NODE_START_SECS:-60} deadline left why
  deadline=$((SECONDS + limit))
  why="did not start within $limit s"
  while left=$((deadline - SECONDS)); [ "$left" -gt 0 ]; do
    if CTL_TIMEOUT=$((left + 5)) ctl await_startup -t "$left" >/dev/null 2>&1 && amqp_open; then
      local on="dist $dist"
      [ "$streams" -eq 0 ] || on="$on, streams $stream_port"
      echo "broker-node: $node ($what) up on 127.0.0.1:$port ($on) in $(secs_since "$t0") s, data in $dir"
      return 0
    fi
    # A beam that has gone will not come up: say so now, not at the limit.
    if [ $(($(ms) - t0)) -gt 10000 ] && ! beam_pid >/dev/null; then
      why="exited while starting"
      break
    fi
    sleep 0.5
  done
  echo "broker-node: $node ($what) $why ($(secs_since "$t0") s); its log:" >&2
  tail -n 30 "$dir/log/"*.log "$dir/log/startup_log" "$dir/log/startup_err" >&2 2>/dev/null || true
  # A node left half-started would hold its ports and a core: it is killed
  # (its folder stays for a look; `down` removes it).
  local pid
  if pid=$(beam_pid); then
    kill -9 "$pid" 2>/dev/null || true
    echo "broker-node: $node's beam ($pid) killed" >&2
  fi
  exit 69
}

# An epmd started from the broker root (when none ran on the host) is
# stopped once no node is registered with it.
stop_root_epmd() {
  local p r names
  [ -n "$broker_root" ] || return 0
  for p in $(pgrep -x epmd 2>/dev/null || true); do
    r=$(readlink "/proc/$p/root" 2>/dev/null) || continue
    [ "$r" = "$broker_root" ] || continue
    names=$("$HERE/broker-root.sh" run "$ids" /usr/bin/epmd -names 2>/dev/null | grep -c '^name ' || true)
    if [ "${names:-0}" -eq 0 ]; then kill "$p" 2>/dev/null || true; fi
  done
}

down_quiet() {
  local pid t0
  if pid=$(beam_pid); then
    # A node of another broker root (or of the host, when this one is called
    # with a root) does not take this CLI's cookie: SIGTERM stops it
    # gracefully too.
    CTL_TIMEOUT=30 ctl stop >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
    t0=$SECONDS
    while kill -0 "$pid" 2>/dev/null; do
      if [ $((SECONDS - t0)) -ge 30 ]; then
        kill -9 "$pid" 2>/dev/null || true
      fi
      sleep 0.2
    done
  fi
  rm -rf "$dir"
  rmdir "$root" 2>/dev/null || true
  stop_root_epmd
}

case "$cmd" in
  up) up ;;
  down)
    t0=$(ms)
    down_quiet
    echo "broker-node: $node down, $dir removed, in $(secs_since "$t0") s"
    ;;
  status)
    if is_up; then
      echo "broker-node: $node ($what) is up on 127.0.0.1:$port (dist $dist), pid $(beam_pid)"
    else
      echo "broker-node: $node is not up"
      exit 3
    fi
    ;;
  pid) beam_pid || { echo "broker-node: $node has no beam.smp" >&2; exit 3; } ;;
  ctl) CTL_TIMEOUT=${CTL_TIMEOUT:-60} ctl "$@" ;;
  *) usage ;;
esac
