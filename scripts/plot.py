#!/usr/bin/env python3
"""Plots of ctxengine evaluation CSVs (docs/EVAL.md).

    python3 scripts/plot.py RUN_DIR [RUN_DIR ...] [--out DIR]

Reads <run>/perplexity.csv, perplexity_curve.csv, longchat_lines.csv, altqa.csv, passkey.csv and
ruler_niah.csv (whichever exist; several run directories are merged) and writes PNGs to --out
(default: the first run dir):

  perplexity_vs_length.png   mean per-window perplexity against evaluation length, per series
  position_loss.png          position-wise NLL (binned), solid, with the windowed control dashed
  longchat_accuracy.png      LongChat-Lines accuracy against prompt length (Giraffe Table 1 style)
  altqa_accuracy.png         AltQA-style presence accuracy against prompt length, per series
  passkey_heatmap.png        passkey accuracy by length (x) and depth (y), the needle-in-a-haystack
                             figure: one row of panels per series, one panel per measured score
                             (generated, teacher-forced, and their windowed controls)
  ruler_niah_heatmap.png     the same for the RULER tasks (a series per variant and haystack)
  grid.png                   recipes/paper_grid.lua's grid.csv: perplexity against length and
                             recall at [2Lt, 4Lt) per method, APE and RoPE panels, seed spread
                             (half the range) as error bars

A series is one combination of the recipe's tags (method, pe, ...): every column that is not a
known field of the task. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import csv
import math
import os
import sys
import textwrap
from collections import OrderedDict

# Fields the tasks write; every other column is a tag that names a series.
KNOWN = {
    "perplexity": {"task", "length", "multiple", "positions", "windows", "tokens", "mean_ppl",
                   "token_ppl", "mean_nll", "window", "windowed_mean_ppl", "windowed_mean_nll"},
    "perplexity_curve": {"task", "length", "positions", "bin", "pos_start", "pos_end", "tokens",
                         "mean_nll", "window", "windowed_mean_nll"},
    "longchat_lines": {"task", "source", "n_lines", "target_tokens", "items", "correct",
                       "accuracy", "mean_prompt_tokens", "max_prompt_tokens", "skipped",
                       "max_new_tokens", "window"},
    "altqa": {"task", "mode", "split", "group", "value", "items", "correct", "accuracy",
              "mean_prompt_tokens", "skipped", "max_new_tokens", "window", "context"},
}
# passkey.csv and ruler_niah.csv (one row per length and depth); ruler_niah's variant, haystack
# and value_type are not listed, so they name series.
PROBE_FIELDS = {"task", "length", "multiple", "depth", "items", "mean_prompt_tokens",
                "needle_depth", "accuracy", "tf_accuracy", "mean_logprob", "window",
                "windowed_accuracy", "windowed_tf_accuracy", "windowed_mean_logprob",
                "max_new_tokens"}
KNOWN["passkey"] = PROBE_FIELDS
KNOWN["ruler_niah"] = PROBE_FIELDS
PROBE_SCORES = [("accuracy", "generated"), ("tf_accuracy", "teacher-forced"),
                ("windowed_accuracy", "generated, windowed"),
                ("windowed_tf_accuracy", "teacher-forced, windowed")]


def read_rows(dirs, name):
    rows = []
    for d in dirs:
        path = os.path.join(d, name + ".csv")
        if not os.path.exists(path):
            continue
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                row["_run"] = os.path.basename(os.path.normpath(d)) if len(dirs) > 1 else ""
                rows.append(row)
    return rows


def number(row, key, default=math.nan):
    try:
        v = row.get(key, "")
        return float(v) if v not in ("", None) else default
    except ValueError:
        return default


def series_key(row, task):
    tags = [f"{k}={v}" for k, v in row.items()
            if k not in KNOWN[task] and not k.startswith("_") and v not in ("", None)]
    if row.get("_run"):
        tags.insert(0, row["_run"])
    if row.get("positions") not in (None, "", "gap1"):
        tags.append("positions=" + row["positions"])
    # For the retrieval tasks a window is a separate run (the windowed control); perplexity
    # records carry their control's window as a field of the same run.
    if task in ("longchat_lines", "altqa") and row.get("window") not in (None, "", "0"):
        tags.append("window=" + row["window"])
    return ", ".join(tags) or "(all)"


def group(rows, task):
    out = OrderedDict()
    for r in rows:
        out.setdefault(series_key(r, task), []).append(r)
    return out


def plot_perplexity(plt, dirs, out):
    rows = read_rows(dirs, "perplexity")
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rs in group(rows, "perplexity").items():
        pts = sorted({number(r, "length"): number(r, "mean_ppl") for r in rs}.items())
        pts = [(x, y) for x, y in pts if math.isfinite(y)]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("mean per-window perplexity")
    ax.set_title("Perplexity vs evaluation length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, out, "perplexity_vs_length.png")


def plot_curve(plt, dirs, out):
    rows = read_rows(dirs, "perplexity_curve")
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, rs) in enumerate(group(rows, "perplexity_curve").items()):
        longest = max(number(r, "length") for r in rs)
        rs = sorted((r for r in rs if number(r, "length") == longest), key=lambda r: number(r, "bin"))
        x = [(number(r, "pos_start") + number(r, "pos_end")) / 2 for r in rs]
        c = colors[i % len(colors)]
        ax.plot(x, [number(r, "mean_nll") for r in rs], color=c, marker=".",
                label=f"{name} (L={int(longest)})")
        w = [number(r, "windowed_mean_nll") for r in rs]
        if any(math.isfinite(v) for v in w):
            win = number(rs[0], "window")
            ax.plot(x, w, color=c, linestyle="--", label=f"{name}, windowed ({int(win)})")
    ax.set_xlabel("position in the window (tokens)")
    ax.set_ylabel("mean NLL (nats/token)")
    ax.set_title("Position-wise loss; dashed: attention limited to the last W tokens")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, out, "position_loss.png")


def plot_longchat(plt, dirs, out):
    rows = [r for r in read_rows(dirs, "longchat_lines") if r.get("accuracy", "") != ""]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rs in group(rows, "longchat_lines").items():
        xkey = "mean_prompt_tokens" if "mean_prompt_tokens" in rs[0] else "prompt_tokens"
        pts = sorted((number(r, xkey), number(r, "accuracy")) for r in rs
                     if math.isfinite(number(r, xkey)))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("LongChat-Lines retrieval accuracy vs context length")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, out, "longchat_accuracy.png")


def plot_altqa(plt, dirs, out):
    rows = [r for r in read_rows(dirs, "altqa")
            if r.get("accuracy", "") != "" and r.get("group", "all") == "all"]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rs in group(rows, "altqa").items():
        pts = sorted((number(r, "mean_prompt_tokens"), number(r, "accuracy")) for r in rs
                     if math.isfinite(number(r, "mean_prompt_tokens")))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("presence accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Question answering (AltQA-style) accuracy vs context length")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, out, "altqa_accuracy.png")


def plot_heatmap(plt, dirs, out, task, title):
    """Accuracy by length and depth, the needle-in-a-haystack figure (depth 0% at the top)."""
    rows = read_rows(dirs, task)
    if not rows:
        return None
    series = group(rows, task)
    scores = [(k, label) for k, label in PROBE_SCORES
              if any(math.isfinite(number(r, k)) for r in rows)]
    if not scores:
        return None
    ncol, nrow = len(scores), len(series)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol + 1.2, 3.2 * nrow + 0.6), squeeze=False)
    image = None
    for i, (name, rs) in enumerate(series.items()):
        lengths = sorted({number(r, "length") for r in rs})
        depths = sorted({number(r, "depth") for r in rs})
        for j, (key, label) in enumerate(scores):
            # mean over the rows of a cell (several runs or seeds of the same series)
            cells = {}
            for r in rs:
                v = number(r, key)
                if math.isfinite(v):
                    cells.setdefault((number(r, "depth"), number(r, "length")), []).append(v)
            grid = [[(sum(cells[(d, L)]) / len(cells[(d, L)])) if (d, L) in cells else math.nan
                     for L in lengths] for d in depths]
            ax = axes[i][j]
            image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto",
                              interpolation="nearest")
            ax.set_xticks(range(len(lengths)))
            ax.set_xticklabels([str(int(L)) for L in lengths], fontsize=7, rotation=45)
            step = max(1, len(depths) // 10)
            ax.set_yticks(range(0, len(depths), step))
            ax.set_yticklabels([f"{100 * depths[k]:.0f}%" for k in range(0, len(depths), step)],
                               fontsize=7)
            if not cells:
                ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center",
                        va="center", fontsize=8, color="gray")
            elif len(lengths) * len(depths) <= 120:
                for y, row in enumerate(grid):
                    for x, v in enumerate(row):
                        if math.isfinite(v):
                            ax.text(x, y, f"{v:.2f}", ha="center", va="center", fontsize=6)
            if i == 0:
                ax.set_title(label, fontsize=9)
            if i == nrow - 1:
                ax.set_xlabel("length (tokens)")
            if j == 0:
                ax.set_ylabel("\n".join(textwrap.wrap(name, 34)) + "\n\nneedle depth", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.colorbar(image, ax=axes, shrink=0.8, label="accuracy")
    path = os.path.join(out, task + "_heatmap.png")
    fig.savefig(path, dpi=110)
    return path


def plot_passkey(plt, dirs, out):
    return plot_heatmap(plt, dirs, out, "passkey", "Passkey retrieval by length and depth")


def plot_ruler(plt, dirs, out):
    return plot_heatmap(plt, dirs, out, "ruler_niah",
                        "RULER needle tasks by length and depth (fraction of values found)")


def plot_grid(plt, dirs, out):
    """recipes/paper_grid.lua's grid.csv (row,pe,seeds,measure,multiple,mean,half_range)."""
    rows = []
    for d in dirs:
        path = os.path.join(d, "grid.csv")
        if os.path.exists(path):
            with open(path, newline="") as f:
                rows += list(csv.DictReader(f))
    if not rows:
        return None
    methods = list(OrderedDict.fromkeys(r["row"] for r in rows if r["row"] != "scratch"))
    pes = [("learned", "APE"), ("rope", "RoPE")]
    # a corpus without recall spans (Python docs) has no recall row: perplexity panels only
    has_recall = any(r["measure"] == "recall_bin2" for r in rows)
    fig, axes = plt.subplots(2 if has_recall else 1, 2, figsize=(12, 8.5 if has_recall else 4.5),
                             squeeze=False)
    for col, (pe, label) in enumerate(pes):
        ax = axes[0][col]
        for i, m in enumerate(methods):
            pts = sorted((int(r["multiple"]), float(r["mean"]), float(r["half_range"]))
                         for r in rows if r["row"] == m and r["pe"] == pe and r["measure"] == "ppl")
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                            marker="os^vD"[i % 5], color=plt.cm.tab20(i % 20), capsize=3, label=m)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length (multiples of Lt)")
        ax.set_ylabel("mean per-window perplexity")
        ax.set_title(f"{label}: perplexity by length")
        ax.grid(True, alpha=0.3)
        if not has_recall:
            continue
        ax = axes[1][col]
        bars = [(m, r) for m in methods for r in rows
                if r["row"] == m and r["pe"] == pe and r["measure"] == "recall_bin2" and r["multiple"] == "4"]
        wins = {r["row"]: float(r["mean"]) for r in rows if r["pe"] == pe and
                r["measure"] == "windowed_recall_bin2" and r["multiple"] == "4"}
        xs = range(len(bars))
        # error bars only where several seeds ran (a single seed has no spread to show)
        ax.bar(xs, [float(r["mean"]) for _, r in bars],
               yerr=[float(r["half_range"]) if int(r["seeds"]) > 1 else 0 for _, r in bars],
               capsize=3, color="tab:blue", label="full attention (bars: seed spread)")
        ax.scatter(xs, [wins.get(m, math.nan) for m, _ in bars], color="tab:red", zorder=3,
                   label="windowed control")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([m for m, _ in bars], rotation=45, ha="right")
        ax.set_ylabel("recall accuracy, distance [2Lt, 4Lt)")
        ax.set_title(f"{label}: recall at 4Lt beyond 2Lt")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][1].legend(fontsize=7, ncol=2)
    return save(fig, out, "grid.png")


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories holding the evaluation CSVs")
    ap.add_argument("--out", help="where the PNGs go (default: the first run directory)")
    args = ap.parse_args()
    for d in args.runs:
        if not os.path.isdir(d):
            print(f"plot: {d}: not a directory", file=sys.stderr)
            return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot: needs matplotlib (Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return 1
    out = args.out or args.runs[0]
    os.makedirs(out, exist_ok=True)
    made = [p for p in (f(plt, args.runs, out) for f in (plot_perplexity, plot_curve,
                                                          plot_longchat, plot_altqa,
                                                          plot_passkey, plot_ruler,
                                                          plot_grid)) if p]
    if not made:
        print("plot: no evaluation CSVs (perplexity.csv, perplexity_curve.csv, longchat_lines.csv, "
              "altqa.csv, passkey.csv, ruler_niah.csv, grid.csv) in " + ", ".join(args.runs),
              file=sys.stderr)
        return 1
    for p in made:
        print("wrote " + p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
