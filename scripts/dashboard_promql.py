#!/usr/bin/env python3
"""Parse every PromQL query of a Grafana dashboard with promtool.

Usage: scripts/dashboard_promql.py docs/grafana/acemq.json

Grafana's variables are replaced by values Prometheus accepts
($__rate_interval by 5m, $queue and $instance by .*), each query becomes a
recording rule in a temporary file, and `promtool check rules` parses them
all: a query that does not parse fails here instead of in front of an
operator. (tests/metrics_docs.rs checks the metric names they use.)
"""

import json
import os
import re
import subprocess
import sys
import tempfile

SUBSTITUTIONS = [
    (r"\$__rate_interval|\$__interval|\$__range", "5m"),
    (r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*"),
]


def queries(node):
    """Every `expr` string of the dashboard's panels, nested rows included."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


def main(path):
    with open(path, encoding="utf-8") as f:
        dashboard = json.load(f)
    exprs = list(queries(dashboard.get("panels", [])))
    if not exprs:
        sys.exit(f"{path}: no queries found")
    rules = []
    for i, expr in enumerate(exprs):
        for pattern, value in SUBSTITUTIONS:
            expr = re.sub(pattern, value, expr)
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    with tempfile.TemporaryDirectory() as tmp:
        rules_file = os.path.join(tmp, "dashboard.rules.yml")
        with open(rules_file, "w", encoding="utf-8") as f:
            # JSON is YAML: no YAML library needed.
            json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
        done = subprocess.run(["promtool", "check", "rules", rules_file])
    if done.returncode != 0:
        sys.exit(f"{path}: a query does not parse (see above)")
    print(f"{path}: {len(exprs)} queries parse")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
