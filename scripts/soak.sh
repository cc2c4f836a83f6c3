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
cargo test "$@" --test broker soak -- --ignored --nocapture --test-threads=1 2>&1 | tee "$log" || status=$?
echo
echo "soak: finished in $(( $(date +%s) - start )) s (exit $status); the figure tables again:"
awk '/^==== soak/ { p = 1 } p && /^$/ { p = 0 } p' "$log"
grep -E '^(A handed back|test result)' "$log" || true
exit "$status"
