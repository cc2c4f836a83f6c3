#!/usr/bin/env python3
"""Draws docs/layer-overhead.png from the layers bench's criterion output.

Run after `cargo bench -p acemq-layers --bench layers`:

    python3 scripts/layer_chart.py [CRITERION_DIR] [OUT_PNG]

CRITERION_DIR defaults to $CARGO_TARGET_DIR/criterion (or target/criterion);
OUT_PNG to docs/layer-overhead.png. Needs matplotlib (`pip install matplotlib`).
Also prints the figures as a Markdown table (median ns per delivery, and the
overhead over the bare handler).
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LAYERS = [
    ("in_flight", "in-flight"),
    ("pause_open", "pause (open)"),
    ("cancel", "cancel"),
    ("retry", "retry (success)"),
    ("dead_letter", "dead-letter (success)"),
    ("full_stack", "full stack"),
]
PER_LAYER_TARGET = 100.0
FULL_STACK_TARGET = 500.0


def median_ns(root, group, bench):
    path = os.path.join(root, group, bench, "new", "estimates.json")
    with open(path) as f:
        return json.load(f)["median"]["point_estimate"]


def main():
    target_dir = os.environ.get("CARGO_TARGET_DIR", "target")
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(target_dir, "criterion")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join("docs", "layer-overhead.png")

    bare = median_ns(root, "per_delivery", "bare")
    rows = []
    for key, label in LAYERS:
        total = median_ns(root, "per_delivery", key)
        rows.append((label, total, total - bare))
    c_bare = median_ns(root, "concurrent_8_tasks", "bare")
    c_full = median_ns(root, "concurrent_8_tasks", "full_stack")

    print("| case | ns per delivery (median) | added over bare | target |")
    print("|---|---:|---:|---|")
    print(f"| bare service_fn | {bare:.1f} | — | — |")
    for label, total, added in rows:
        target = "≤ 500 in all" if label == "full stack" else "≤ 100 added"
        print(f"| {label} | {total:.1f} | {added:.1f} | {target} |")
    print(f"| 8 tasks, bare (handler yields once) | {c_bare:.1f} | — | — |")
    print(f"| 8 tasks, full stack (handler yields once) | {c_full:.1f} | {c_full - c_bare:.1f} | ≤ 500 in all |")

    labels = [r[0] for r in rows] + ["full stack,\n8 tasks"]
    added = [r[2] for r in rows] + [c_full - c_bare]
    targets = [PER_LAYER_TARGET] * (len(rows) - 1) + [FULL_STACK_TARGET, FULL_STACK_TARGET]
    colors = ["#4c72b0"] * (len(rows) - 1) + ["#dd8452", "#dd8452"]

    fig, ax = plt.subplots(figsize=(9, 4.5))
    bars = ax.bar(labels, added, color=colors)
    for i, t in enumerate(targets):
        ax.hlines(t, i - 0.4, i + 0.4, colors="#c44e52", linestyles="dashed", linewidth=1.5)
    for bar, v in zip(bars, added):
        ax.annotate(f"{v:.0f}", (bar.get_x() + bar.get_width() / 2, v),
                    ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("ns added per delivery (median)")
    ax.set_title(f"acemq layer overhead over a bare service_fn ({bare:.0f} ns); "
                 "dashed: target")
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
