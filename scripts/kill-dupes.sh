#!/usr/bin/env bash
# Duplicates per SIGKILL (RELIABILITY.md, docs/reliability/coalescing.md):
# the shop killed ACEMQ_KILLS times (default 10) and restarted, at
# saturation (5,000 orders queued, 5 ms of work each, prefetch 100,
# concurrency 8) and at a moderate rate (200 orders/s, same settings), each
# with the default ack_batch and with `ack_batch: 0`. Prints one line per
# cell: kills, duplicates per kill (median, max, mean), lost (must be 0).
#
#   scripts/kill-dupes.sh                   # all four cells
#   scripts/kill-dupes.sh saturation        # one load, both ack_batch
#
# Extra cargo arguments go in CARGO_ARGS (e.g. --release). The full output
# is in $KILL_LOG (default target/kill-dupes.log). AMQP_ADDR selects the
# broker (default amqp://guest:guest@127.0.0.1:5672/%2f).
set -euo pipefail
cd "$(dirname "$0")/.."

log="${KILL_LOG:-target/kill-dupes.log}"
mkdir -p "$(dirname "$log")"
: >"$log"
loads=("${@:-saturation moderate}")
# shellcheck disable=SC2206
loads=(${loads[*]})
cargo build ${CARGO_ARGS:-} --example shop
cargo test ${CARGO_ARGS:-} --test broker --no-run
status=0
for load in "${loads[@]}"; do
  for batch in "" 0; do
    echo "kill-dupes: load $load, ack_batch ${batch:-default}, $(uptime)" | tee -a "$log"
    ACEMQ_KILL_LOAD="$load" ACEMQ_SOAK_ACK_BATCH="$batch" \
      cargo test ${CARGO_ARGS:-} --test broker kill_dupes -- --ignored --nocapture --exact kill_dupes::kill_dupes \
      >>"$log" 2>&1 || status=$?
    grep '^kill-dupes: load .*|' "$log" | tail -1 || true
  done
done
echo
echo "kill-dupes: every cell ($(uptime)):"
grep '^kill-dupes: load .*|' "$log" | sed 's/ | published.*//'
exit "$status"
