#!/usr/bin/env bash
# The mixed-fault soak (RELIABILITY.md, docs/reliability/chaos.md): two shop
# instances on a local three-node cluster under a steady confirmed publisher,
# while a fault scheduler picks among SIGKILL, SIGTERM and restart, a forced
# connection close, a queue deletion, a node frozen and a node killed; then
# an invariant checker (lost must be 0, duplicates per fault kind against
# their bound, the longest time nothing was handled).
#
#   scripts/chaos.sh [SECS] [SEED]     # default 60 s and a random seed
#
# The seed is printed first: pass it back to replay the same schedule. The
# output is also written to $CHAOS_LOG (default target/chaos.log). The
# cluster (acemq-1..3@localhost on 5681-5683) is started and stopped by the
# test itself.
set -euo pipefail
cd "$(dirname "$0")/.."
export ACEMQ_CHAOS_SECS="${1:-60}"
if [ -n "${2:-}" ]; then export ACEMQ_CHAOS_SEED="$2"; fi
log="${CHAOS_LOG:-target/chaos.log}"
mkdir -p "$(dirname "$log")"
echo "chaos: ${ACEMQ_CHAOS_SECS} s of faults, output also in $log"
status=0
cargo test -p acemq --test cluster chaos -- --ignored --nocapture --test-threads=1 2>&1 | tee "$log" || status=$?
echo
awk '/^==== chaos/ { p = 1 } p' "$log" | grep -v '^test ' || true
exit "$status"
