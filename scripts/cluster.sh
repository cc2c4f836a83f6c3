#!/usr/bin/env bash
# A local three-node RabbitMQ cluster beside the default broker, from
# Debian's rabbitmq-server only (no containers): the host's (3.10.8), or the
# broker root's that ACEMQ_BROKER_ROOT names (scripts/broker-root.sh, e.g.
# /var/cache/acemq/sid: RabbitMQ 4.3, whose cluster keeps its metadata in
# Khepri, a Raft store: it answers while a majority of the three runs, so
# at most one node may be down or frozen at a time):
#
#   scripts/cluster.sh up       start acemq-1..3@localhost on 5681–5683 and join them
#                               (unless they already run as one cluster: then nothing;
#                               whatever an earlier cluster left is removed first)
#   scripts/cluster.sh down     stop the three nodes and remove everything they wrote
#   scripts/cluster.sh status   exit 0 when all three run as one cluster, 3 otherwise
#   scripts/cluster.sh start N  start node N again (e.g. after a kill -9), rejoining on its data
#
# Each node is a scripts/broker-node.sh node (ACEMQ_BROKER_ROOT and
# ACEMQ_NODE_PLUGINS pass through to it): its own node name, AMQP port
# (5681–5683), distribution port (25681–25683), mnesia and log folders under
# ${ACEMQ_NODE_ROOT:-/tmp/acemq-nodes}, its own rabbitmq.conf, an empty
# plugin list, one scheduler (`+S 1:1`). They share the rabbitmq user's
# Erlang cookie. To keep three nodes small on a 2-core machine: a memory
# watermark of 1 GiB each and `raft.wal_max_size_bytes` at 32 MiB (quorum
# queues' write-ahead log is kept in memory up to that size; the default,
# 512 MiB, would reach the watermark first). The default broker
# (rabbit@localhost:5672) is never touched.
#
# Addresses for acemq: AMQP_ADDR=amqp://guest:guest@127.0.0.1:5681/%2f,amqp://guest:guest@127.0.0.1:5682/%2f,amqp://guest:guest@127.0.0.1:5683/%2f
set -euo pipefail
cd "$(dirname "$0")"
# rabbitmqctl is the broker root's when ACEMQ_BROKER_ROOT is set.
if [ -n "${ACEMQ_BROKER_ROOT:-}" ]; then PATH="$PWD/broker-bin:$PATH"; fi

NODES=(acemq-1 acemq-2 acemq-3)
PORTS=(5681 5682 5683)
conf=$(mktemp)
trap 'rm -f "$conf"' EXIT
cat >"$conf" <<'EOF'
vm_memory_high_watermark.absolute = 1GiB
raft.wal_max_size_bytes = 33554432
EOF

ms() { echo $(($(date +%s%N) / 1000000)); }
secs_since() { local d=$(($(ms) - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }
ctl() { timeout "${CTL_TIMEOUT:-60}" rabbitmqctl -q -n "$1@localhost" "${@:2}"; }

# The running nodes node $1 sees in its cluster.
running_nodes() {
  ctl "$1" eval 'rabbit_nodes:all_running().' 2>/dev/null | tr -d "[]' \n" | tr ',' '\n' | sort
}

is_clustered() {
  local want got
  want=$(printf '%s@localhost\n' "${NODES[@]}" | sort)
  got=$(running_nodes "${NODES[0]}") || return 1
  [ "$want" = "$got" ]
}

up() {
  local t0 t1 i started
  t0=$(ms)
  if is_clustered; then
    echo "cluster: already up (${NODES[*]} on ${PORTS[*]})"
    return 0
  fi
  # What an earlier cluster left (an interrupted run: nodes still running,
  # frozen or killed, or folders whose data names the other nodes) is removed
  # first. A node started on such data waits minutes for its peers' tables
  # before it gives up; a fresh cluster forms in seconds.
  down >/dev/null
  # The nodes boot one after the other: on 2 cores, three at once are
  # slower in all.
  for i in 0 1 2; do
    ./broker-node.sh up "${NODES[$i]}" "${PORTS[$i]}" "$conf"
  done
  started=$(secs_since "$t0")
  t1=$(ms)
  for i in 1 2; do
    if running_nodes "${NODES[$i]}" | grep -qx "${NODES[0]}@localhost"; then
      continue
    fi
    local step out
    for step in stop_app reset "join_cluster ${NODES[0]}@localhost" start_app; do
      # shellcheck disable=SC2086 # the step is a command and its argument
      if ! out=$(ctl "${NODES[$i]}" $step 2>&1); then
        echo "cluster: rabbitmqctl -n ${NODES[$i]}@localhost $step failed: $out" >&2
        exit 69
      fi
    done
  done
  for _ in $(seq 1 60); do
    if is_clustered; then
      echo "cluster: up in $(secs_since "$t0") s (three nodes started in $started s, joined in $(secs_since "$t1") s): $(running_nodes "${NODES[0]}" | tr '\n' ' ')"
      return 0
    fi
    sleep 0.5
  done
  echo "cluster: the nodes did not form one cluster; node 1 sees: $(running_nodes "${NODES[0]}" | tr '\n' ' ')" >&2
  exit 69
}

down() {
  local t0 i
  t0=$(ms)
  for i in 2 1 0; do
    ./broker-node.sh down "${NODES[$i]}" "${PORTS[$i]}"
  done
  echo "cluster: down in $(secs_since "$t0") s"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status)
    if is_clustered; then
      echo "cluster: up: $(running_nodes "${NODES[0]}" | tr '\n' ' ')"
    else
      echo "cluster: not up"
      exit 3
    fi
    ;;
  start)
    n=${2:?usage: $0 start 1|2|3}
    case "$n" in 1|2|3) ;; *) echo "cluster: no node $n (1, 2 or 3)" >&2; exit 64 ;; esac
    ./broker-node.sh up "${NODES[$((n - 1))]}" "${PORTS[$((n - 1))]}" "$conf"
    ;;
  *)
    echo "usage: $0 up|down|status|start N" >&2
    exit 64
    ;;
esac
