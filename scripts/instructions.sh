#!/usr/bin/env bash
# Instructions per delivery on a consumer's path, counted by valgrind's
# callgrind: exact and the same from run to run, whatever mode the broker
# is in, where timings on this machine's two shared cores move by 2×.
# Runs one round of one consumer of the end-to-end bench under callgrind
# and prints, per delivery, the instructions of the whole process and of
# the consumer's own task (B: acemq's consumer loop; m and mv: the plain
# multi-ack task; c: the per-delivery task and the tasks it spawns).
#
#   cargo bench --bench throughput --no-run
#   scripts/instructions.sh B [BENCH_BINARY]     # then m, to compare
#
# Under callgrind the process runs ~50× slower, so deliveries arrive in
# smaller bursts than in a timed run: compare counts of one consumer with
# another's, or of one build with another's, never with timed runs. The
# bench's environment is passed through (ACEMQ_BENCH_ADDR, ACEMQ_BENCH_NODE,
# ACEMQ_BENCH_QUEUE_TYPES, ACEMQ_BENCH_SHAPES, ...); give one queue type and
# one shape. ACEMQ_BENCH_N defaults to 5000 here.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/instructions.sh KIND [BENCH_BINARY]}
bin=${2:-$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/throughput-* | grep -v '\.d$' | head -1)}
n=${ACEMQ_BENCH_N:-5000}
out=$(mktemp -d)
ACEMQ_BENCH_ONLY=$kind ACEMQ_BENCH_N=$n ACEMQ_BENCH_ROUNDS=1 ACEMQ_BENCH_LOAD_WAIT=${ACEMQ_BENCH_LOAD_WAIT:-1} \
  valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$bin" --bench >"$out/log" 2>&1 ||
  { tail -20 "$out/log"; exit 1; }
grep "^round 0 $kind " "$out/log" || { tail -20 "$out/log"; exit 1; }
callgrind_annotate --inclusive=yes --threshold=100 "$out/cg" >"$out/inclusive" 2>/dev/null
python3 - "$out/inclusive" "$n" "$kind" <<'PY'
import re, sys
path, n, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
for line in open(path):
    m = re.match(r'\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S.*?)(?: \[.*\])?$', line)
    if m:
        rows.append((int(m.group(1).replace(',', '')), m.group(2)))
def find(pattern):
    hits = [c for c, name in rows if re.search(pattern, name)]
    return max(hits) if hits else 0
total = find(r'PROGRAM TOTALS')
task = {
    'B': r'acemq::consumer::run::ConsumerLoop<S>::run::\{\{closure\}\}$',
    'B0': r'acemq::consumer::run::ConsumerLoop<S>::run::\{\{closure\}\}$',
    'm': r'throughput::multi_ack::\{\{closure\}\}$',
    'mv': r'throughput::multi_ack::\{\{closure\}\}$',
    'c': r'throughput::plain_consumer::\{\{closure\}\}$',
}.get(kind)
print(f"{kind}: {total / n:,.0f} instructions a delivery in the whole process"
      + (f", {find(task) / n:,.0f} in the consumer's task" if task else ""))
for label, pattern in [
    ('  starting handlers (conversion, span, the stack\'s call)', r'Generation<S>::start$'),
    ('  polling handlers (the stack\'s futures, the handler inlined)', r'cancel::slots::Slots<F> as futures_core::stream::Stream>::poll_next$'),
    ('  reading lapin\'s consumer', r'<lapin::consumer::Consumer as futures_core::stream::Stream>::poll_next$'),
]:
    c = find(pattern)
    if c and kind in ('B', 'B0'):
        print(f"{label}: {c / n:,.0f}")
PY
rm -rf "$out"
