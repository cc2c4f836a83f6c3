#!/usr/bin/env bash
# The broker tests that run on RabbitMQ 4: a named set of tests/broker (and
# the outbox relay's tests of tests/postgres) against the RabbitMQ 4.0 node of
# scripts/rabbitmq4.sh, beside the default broker (3.10.8), which is never
# touched. What differs between the two brokers: docs/reliability/rabbitmq4.md.
#
#   scripts/broker-suite-rmq4.sh                   node up, the set on it, node down
#   scripts/broker-suite-rmq4.sh --default-broker  the same set on the default broker
#                                                  (AMQP_ADDR and ACEMQ_RABBITMQCTL as set, or
#                                                  their defaults); no RabbitMQ 4 node
#   scripts/broker-suite-rmq4.sh --list            print the set and the exclusions
#
# Options (before `--`): --no-postgres leaves out the outbox relay's tests
# (they need PostgreSQL, see tests/postgres/main.rs). Arguments after `--` go
# to both test binaries (e.g. `-- --test-threads=1`).
#
# On RabbitMQ 4 the node is started with `scripts/rabbitmq4.sh up` on
# ${ACEMQ_RABBITMQ4_PORT:-5704} and always taken down at the end (trap), also
# when a test fails or the run is interrupted; the tests get
#   AMQP_ADDR=amqp://guest:guest@127.0.0.1:PORT/%2f
#   ACEMQ_RABBITMQCTL="scripts/rabbitmq4.sh ctl"   (tests/broker/support.rs)
# The test binaries are built before the node starts, so the time printed for
# each run is the tests' own. CARGO_TARGET_DIR is honoured.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
cd "$HERE"

# --- the named set ------------------------------------------------------------
# libtest filters (a test runs when its name contains one of them), by module.
BROKER_FILTERS=(
  topology::     # Q, its .dlq and rungs with their arguments; quorum queues and their rungs
  routing::      # exchanges, bindings, passed-through arguments, passive queues, the redelivery bound
  retry::        # in process, through the TTL rungs, at volume
  dead_letter::  # dead-letter reasons: max-attempts, rejected, panic; a deleted .dlq
  drain::        # the drain: finish, hand back, abandon, one deadline
  pause::        # the paused gate's hand-back
  process::      # the shop binary: SIGTERM drains and hands back, SIGKILL leaves it to the broker
  replay::       # dead-lettered messages moved back by reason
  factory::      # a connection closed by the broker (rabbitmqctl close_connection)
  faults::       # lost connections through a proxy, a deleted queue, signals
  recovery::     # a queue deleted while consumed
  reliability::  # lost connections, a consumer cancelled by the broker, panics
  settle::       # the settle ledger, coalesced and not
  round_trip::   # acknowledgements coalescing into runs
  delivery_limit:: # x-delivery-limit above max_redeliveries; a queue created without it keeps working
  broker_cancel::  # a consumer cancelled with its channel open: old handlers never settle on the new one
)
# Tests of those modules left out on RabbitMQ 4, each with its reason
# (`--skip`: a test whose name contains it does not run). None today.
BROKER_SKIPS=()
# tests/postgres (`--all-features`): the outbox relay publishing to AMQP_ADDR.
POSTGRES_FILTERS=(
  relay::        # the outbox relay: confirms, unroutable rows, an unreachable broker, two relays
)

say() { echo "broker-suite: $*"; }
die() { echo "broker-suite: $*" >&2; exit 64; }

on_default=0 postgres=1
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --default-broker) on_default=1 ;;
    --no-postgres) postgres=0 ;;
    --list)
      printf 'broker (cargo test -p acemq --test broker):\n'
      printf '  %s\n' "${BROKER_FILTERS[@]}"
      if [ ${#BROKER_SKIPS[@]} -gt 0 ]; then printf 'skipped:\n'; printf '  %s\n' "${BROKER_SKIPS[@]}"; fi
      printf 'postgres (cargo test -p acemq --all-features --test postgres):\n'
      printf '  %s\n' "${POSTGRES_FILTERS[@]}"
      exit 0
      ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see the comment at the top of $0)" ;;
  esac
  shift
done

skip_args=()
for s in "${BROKER_SKIPS[@]}"; do skip_args+=(--skip "$s"); done

broker_cmd=(cargo test -p acemq --test broker)
postgres_cmd=(cargo test -p acemq --all-features --test postgres)

say "building the test binaries"
"${broker_cmd[@]}" --no-run
[ "$postgres" -eq 0 ] || "${postgres_cmd[@]}" --no-run

if [ "$on_default" -eq 0 ]; then
  port=${ACEMQ_RABBITMQ4_PORT:-5704}
  export ACEMQ_RABBITMQ4_PORT=$port
  export AMQP_ADDR="amqp://guest:guest@127.0.0.1:$port/%2f"
  export ACEMQ_RABBITMQCTL="scripts/rabbitmq4.sh ctl"
  trap 'scripts/rabbitmq4.sh down "$port" || true' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  scripts/rabbitmq4.sh up "$port"
  where="RabbitMQ 4 ($(scripts/rabbitmq4.sh ctl -q version 2>/dev/null || echo '?')) at 127.0.0.1:$port"
else
  where="the default broker ($(
    # shellcheck disable=SC2086 # a command line, split on whitespace like the tests split it
    set -- ${ACEMQ_RABBITMQCTL:-rabbitmqctl}
    "$@" -q version 2>/dev/null || echo '?'
  )) at ${AMQP_ADDR:-amqp://127.0.0.1:5672}"
  where=${where//guest:guest@/}
fi

status=0
run() {
  local name=$1 t0 rc took
  shift
  say "$name on $where: $*"
  t0=$(date +%s%N)
  set +e
  "$@"
  rc=$?
  set -e
  took=$((($(date +%s%N) - t0) / 1000000))
  say "$name: exit $rc in $((took / 1000)).$((took % 1000 / 100)) s"
  [ "$rc" -eq 0 ] || status=1
}

run broker "${broker_cmd[@]}" -- "${BROKER_FILTERS[@]}" "${skip_args[@]}" "${extra[@]}"
if [ "$postgres" -eq 1 ]; then
  run postgres "${postgres_cmd[@]}" -- "${POSTGRES_FILTERS[@]}" "${extra[@]}"
fi
exit "$status"
