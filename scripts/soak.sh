#!/usr/bin/env bash
# The soak (RELIABILITY.md): the shop binary under a steady publisher,
# SIGTERMed and restarted, SIGKILLed and restarted, and two competing
# consumers with one stopped mid-stream; every published order accounted for.
#
#   scripts/soak.sh              # debug build (what RELIABILITY.md reports)
#   scripts/soak.sh --release    # optimised build
#
# Extra arguments go to `cargo test` (e.g. --release). The output, with the
# figure tables, is also written to $SOAK_LOG (default target/soak.log).
# AMQP_ADDR selects the broker (default amqp://guest:guest@127.0.0.1:5672/%2f).
#
# SOAK_TEST picks the soak tests by name (default `soak`: all three), e.g.
# SOAK_TEST=soak_sigkill for the SIGKILL soak alone. ACEMQ_SOAK_ACK_BATCH is
# written into every shop instance's queue config as `ack_batch: <value>`
# (unset: the config's default). SIGKILL duplicates per kill, with and
# without ack coalescing, one command each:
#
#   SOAK_TEST=soak_sigkill ACEMQ_SOAK_ACK_BATCH=0 SOAK_LOG=target/soak-kill-off.log scripts/soak.sh
#   SOAK_TEST=soak_sigkill SOAK_LOG=target/soak-kill-on.log scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."

broker_up() { timeout 20 rabbitmqctl status >/dev/null 2>&1; }

if [ -z "${AMQP_ADDR:-}" ]; then
  if ! command -v rabbitmq-server >/dev/null 2>&1; then
    echo "soak: installing Debian's rabbitmq-server"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
  fi
  if ! broker_up; then
    echo "soak: starting RabbitMQ"
    rabbitmq-server -detached || true
  fi
  timeout 180 rabbitmqctl await_startup
fi
# The soak reads queue counts with rabbitmqctl, also against AMQP_ADDR.
command -v rabbitmqctl >/dev/null || { echo "soak: rabbitmqctl is needed on PATH" >&2; exit 1; }
echo "soak: RabbitMQ $(rabbitmqctl version 2>/dev/null) is up"

log="${SOAK_LOG:-target/soak.log}"
mkdir -p "$(dirname "$log")"
echo "soak: output also in $log"
start=$(date +%s)
status=0
test_filter="${SOAK_TEST:-soak}"
echo "soak: tests matching '$test_filter', ack_batch: ${ACEMQ_SOAK_ACK_BATCH:-unset, the config default}"
cargo test "$@" --test broker "$test_filter" -- --ignored --nocapture --test-threads=1 2>&1 | tee "$log" || status=$?
echo
echo "soak: finished in $(( $(date +%s) - start )) s (exit $status); the figure tables again:"
awk '/^==== soak/ { p = 1 } p && /^$/ { p = 0 } p' "$log"
grep -E '^(A handed back|SIGKILL duplicates|test result)' "$log" || true
exit "$status"
