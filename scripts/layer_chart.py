#!/usr/bin/env python3
"""The layer bench's figures as ratios to the yardstick, and docs/layer-overhead.png.

Run after `cargo bench -p acemq-layers --bench layer_ratios` (interleaved,
robust on a busy machine: the figures to publish) or after
`cargo bench -p acemq-layers --bench layers` (criterion):

    python3 scripts/layer_chart.py [SOURCE] [OUT_PNG]

SOURCE is the layer_ratios bench's JSON (a path ending in .json, e.g.
target/layer-ratios.json: per-round ratios, medians taken by the bench) or a
criterion directory; it defaults to $CARGO_TARGET_DIR/layer-ratios.json when
that exists, else $CARGO_TARGET_DIR/criterion (CARGO_TARGET_DIR: target);
OUT_PNG to docs/layer-overhead.png; OUT_PNG `-` prints the table only.
Needs matplotlib for the chart (`pip install matplotlib`); without it the
table is still printed.

Each layer's added cost (its median minus the bare handler's) is divided by
the yardstick's added cost (tower's `ConcurrencyLimit` around the same
handler, minus bare), both from the same run, in each group: `per_delivery`
(one delivery at a time) and `concurrent_8_tasks` (8 tasks, the handler
yields once). Absolute nanoseconds move from machine to machine; the ratio is
what the targets are written in (each layer ≤ 1.0×).
"""

import json
import os
import sys

CASES = [
    ("yardstick", "yardstick: tower ConcurrencyLimit"),
    ("in_flight", "in-flight"),
    ("pause_open", "pause (open)"),
    ("cancel", "cancel (woken by the loop)"),
    ("cancel_self_waking", "cancel (waking itself)"),
    ("retry", "retry (success)"),
    ("dead_letter", "dead-letter (success)"),
    ("dead_letter_retry", "dead-letter + limit + retry, one service"),
    ("full_stack", "full stack (as App builds it)"),
]
GROUPS = [("per_delivery", "sequential"), ("concurrent_8_tasks", "8 tasks")]
LAYER_TARGET = 1.0


def median_ns(root, group, bench):
    path = os.path.join(root, group, bench, "new", "estimates.json")
    try:
        with open(path) as f:
            return json.load(f)["median"]["point_estimate"]
    except FileNotFoundError:
        return None


def figures(root):
    """{group: {case: (ns, added, ratio)}} plus each group's bare ns."""
    out = {}
    for group, _ in GROUPS:
        bare = median_ns(root, group, "bare")
        yard = median_ns(root, group, "yardstick")
        if bare is None:
            continue
        yard_added = None if yard is None else yard - bare
        rows = {"bare": (bare, None, None)}
        for key, _ in CASES:
            ns = median_ns(root, group, key)
            if ns is None:
                continue
            added = ns - bare
            ratio = added / yard_added if yard_added and yard_added > 0 else None
            rows[key] = (ns, added, ratio)
        out[group] = rows
    return out


def figures_json(path):
    """The same shape as figures(), from layer_ratios' JSON."""
    with open(path) as f:
        data = json.load(f)
    out = {}
    for group, _ in GROUPS:
        if group not in data or "bare" not in data[group]:
            continue
        bare = data[group]["bare"]["median_ns"]
        rows = {"bare": (bare, None, None)}
        for key, _ in CASES:
            if key in data[group]:
                ns = data[group][key]["median_ns"]
                rows[key] = (ns, ns - bare, data[group][key]["ratio"])
        out[group] = rows
    return out


def cell(x, fmt):
    return "—" if x is None else format(x, fmt)


def print_table(figs):
    heads = []
    for group, label in GROUPS:
        if group in figs:
            heads += [f"{label}: ns (median)", "added over bare", "× yardstick's added"]
    print("| case | " + " | ".join(heads) + " | target |")
    print("|---|" + "---:|" * len(heads) + "---|")
    for key, label in [("bare", "bare service_fn")] + CASES:
        cells = []
        for group, _ in GROUPS:
            if group not in figs:
                continue
            ns, added, ratio = figs[group].get(key, (None, None, None))
            cells += [cell(ns, ".1f"), cell(added, ".1f"), cell(ratio, ".2f")]
        if key in ("bare", "yardstick", "full_stack", "dead_letter_retry"):
            target = "—"
        else:
            target = f"≤ {LAYER_TARGET:.1f}×"
        print(f"| {label} | " + " | ".join(cells) + f" | {target} |")
    for group, label in GROUPS:
        if group in figs and "yardstick" in figs[group]:
            bare = figs[group]["bare"][0]
            yard = figs[group]["yardstick"][1]
            print(f"\n{label}: bare {bare:.1f} ns, the yardstick adds {yard:.1f} ns", end="")
    print()


def chart(figs, out):
    try:
        import matplotlib
    except ImportError:
        print("\nmatplotlib is not installed (pip install matplotlib): no chart drawn")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k, _ in CASES if k != "yardstick"]
    labels = [dict(CASES)[k].replace(" (", "\n(") for k in keys]
    fig, ax = plt.subplots(figsize=(9.5, 4.8))
    width = 0.38
    colors = {"per_delivery": "#4c72b0", "concurrent_8_tasks": "#dd8452"}
    present = [(g, l) for g, l in GROUPS if g in figs]
    for gi, (group, glabel) in enumerate(present):
        xs, ys = [], []
        for i, k in enumerate(keys):
            ratio = figs[group].get(k, (None, None, None))[2]
            if ratio is not None:
                xs.append(i + (gi - (len(present) - 1) / 2) * width)
                ys.append(ratio)
        bars = ax.bar(xs, ys, width, label=glabel, color=colors[group])
        for bar, v in zip(bars, ys):
            ax.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, v),
                        ha="center", va="bottom", fontsize=8)
    ax.axhline(LAYER_TARGET, color="#c44e52", linestyle="dashed", linewidth=1.5,
               label="target for one layer: 1.0× the yardstick")
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("added cost ÷ yardstick's added cost (medians)")
    yard = ", ".join(
        f"{glabel} +{figs[g]['yardstick'][1]:.0f} ns"
        for g, glabel in present if "yardstick" in figs[g]
    )
    ax.set_title("acemq layers against tower's ConcurrencyLimit, same run\n"
                 f"(yardstick's added cost: {yard})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"\nwrote {out}")


def main():
    target_dir = os.environ.get("CARGO_TARGET_DIR", "target")
    default = os.path.join(target_dir, "layer-ratios.json")
    if not os.path.exists(default):
        default = os.path.join(target_dir, "criterion")
    root = sys.argv[1] if len(sys.argv) > 1 else default
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join("docs", "layer-overhead.png")
    if root.endswith(".json"):
        figs = figures_json(root)
        print(f"from {root} (layer_ratios: the ratio is the median of the per-round ratios)\n")
    else:
        figs = figures(root)
        print(f"from {root} (criterion: the ratio is of the medians)\n")
    if not figs:
        sys.exit(f"no criterion figures under {root}: run "
                 "`cargo bench -p acemq-layers --bench layers` first")
    for group, _ in GROUPS:
        if group in figs and "yardstick" not in figs[group]:
            print(f"warning: {group} has no yardstick figure (an old run?): no ratios")
    print_table(figs)
    if out != "-":
        chart(figs, out)


if __name__ == "__main__":
    main()
