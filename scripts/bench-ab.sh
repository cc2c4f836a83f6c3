#!/usr/bin/env bash
# Two builds of the end-to-end bench, rotated round by round: acemq's B as
# built at another commit ("before") against B now ("after"), with the
# plain shapes c and m from the current build, one round of each per
# round. Tells a change in acemq from the machine's drift, which moves a
# whole run by more than a change does.
#
#   git worktree add /tmp/acemq-before <commit>
#   (cd /tmp/acemq-before && CARGO_TARGET_DIR=/tmp/acemq-before-target cargo bench --bench throughput --no-run)
#   cargo bench --bench throughput --no-run
#   scripts/bench-ab.sh /tmp/acemq-before-target [rounds]
#
# The bench's environment (ACEMQ_BENCH_ADDR, ACEMQ_BENCH_NODE,
# ACEMQ_BENCH_QUEUE_TYPES, ACEMQ_BENCH_SHAPES, ACEMQ_BENCH_N, ...) is passed
# through: give one queue type and one shape. Prints one line per run, then
# the medians of msgs/s and client CPU per message.
set -euo pipefail
cd "$(dirname "$0")/.."
before_target=${1:?usage: scripts/bench-ab.sh BEFORE_TARGET_DIR [ROUNDS]}
rounds=${2:-5}
newest() { ls -t "$1"/release/deps/throughput-* | grep -v '\.d$' | head -1; }
after=$(newest "${CARGO_TARGET_DIR:-target}")
before=$(newest "$before_target")
export ACEMQ_BENCH_ROUNDS=1
runs=("before B" "after B" "after c" "after m")
log=$(mktemp)
for r in $(seq 1 "$rounds"); do
  for i in 0 1 2 3; do
    read -r build kind <<<"${runs[$(( (i + r) % 4 ))]}"
    bin=$after; [ "$build" = before ] && bin=$before
    line=$(ACEMQ_BENCH_ONLY=$kind "$bin" --bench 2>&1 | grep "^round 0 $kind " || true)
    echo "r$r $build $line" | tee -a "$log"
  done
done
python3 - "$log" <<'PY'
import re, statistics, sys
runs = {}
for l in open(sys.argv[1]):
    m = re.match(r'r\d+ (\w+) round 0 (\w+) .*? (\d+) msgs/s .*?([\d.]+) µs client CPU/msg', l)
    if m:
        runs.setdefault(f"{m[1]} {m[2]}", []).append((int(m[3]), float(m[4])))
print("| | msgs/s (median) | client CPU µs/msg (median) | runs |")
print("|---|---:|---:|---:|")
for k, v in runs.items():
    print(f"| {k} | {statistics.median(x[0] for x in v):,.0f} | "
          f"{statistics.median(x[1] for x in v):.1f} | {len(v)} |")
PY
rm -f "$log"
