"""Plots and tabulates bench/cpp/control_plane_scale's JSON (issue #32 item 3).

    python bench/control_plane_plot.py RESULT.json [BASELINE.json] [--png OUT.png] [--markdown]

The first file is the one tabulated; a second one (say, the run before a fix)
is drawn beside it, dashed. Without matplotlib it prints the table only.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

# Issue #32's bar: a cached op at rank 0 costs at most this at 1024 ranks.
BAR_US = 10.0
BAR_RANKS = 1024


def spread(values):
    return min(values), statistics.median(values), max(values)


def table(result, markdown):
    head = ["ranks", "cached µs/op (min / median / max)", "ns per rank per cached op",
            "new op µs (min / median / max)", "bytes per rank", "bytes per rank per slot"]
    rows = []
    for p in result["points"]:
        c, w = spread(p["cached_us_per_op"]), spread(p["new_us_per_op"])
        rows.append([str(p["ranks"]), "%.2f / %.2f / %.2f" % c, "%.0f" % (c[1] * 1e3 / p["ranks"]),
                     "%.1f / %.1f / %.1f" % w, "%.0f" % statistics.median(p["bytes_per_rank"]),
                     "%.0f" % statistics.median(p["slot_bytes_per_rank"])])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
        lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def plot(results, labels, png):
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot (make bench-setup installs it)",
              file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, mem) = plt.subplots(1, 2, figsize=(12, 4.8))
    for result, label, style in zip(results, labels, ["-", "--"]):
        ranks = [p["ranks"] for p in result["points"]]
        for key, name, color in [("cached_us_per_op", "cached op", "tab:blue"),
                                 ("new_us_per_op", "new op", "tab:orange")]:
            lo, mid, hi = zip(*(spread(p[key]) for p in result["points"]))
            ax.errorbar(ranks, mid, yerr=[[m - a for a, m in zip(lo, mid)],
                                          [b - m for b, m in zip(hi, mid)]],
                        fmt=style + "o", ms=3, capsize=2, color=color, label=f"{name}, {label}")
        names = result["ops_per_step"]
        mem.plot(ranks, [statistics.median(p["bytes_per_rank"]) for p in result["points"]],
                 style + "o", ms=3, color="tab:green",
                 label=f"steady state ({names} names), {label}")
        mem.plot(ranks, [statistics.median(p["slot_bytes_per_rank"]) for p in result["points"]],
                 style + "o", ms=3, color="tab:purple", label=f"each further slot, {label}")
    first = results[0]["points"][0]
    linear = [statistics.median(first["cached_us_per_op"]) * p["ranks"] / first["ranks"]
              for p in results[0]["points"]]
    ax.plot([p["ranks"] for p in results[0]["points"]], linear, ":", color="gray",
            label="linear in N (from the first point)")
    ax.axhline(BAR_US, color="red", lw=0.8)
    ax.axvline(BAR_RANKS, color="red", lw=0.8)
    ax.text(2, BAR_US * 1.2, f"bar: {BAR_US:g} µs per cached op at N = {BAR_RANKS}", color="red",
            fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="simulated ranks N",
           ylabel="µs per op at rank 0 (thread CPU time)",
           title="rank 0's cost per op: Coordinator + ResponseCache + fusion")
    mem.set(xscale="log", xlabel="simulated ranks N", ylabel="bytes per simulated rank",
            title="coordinator memory per rank (mallinfo2)")
    for a in (ax, mem):
        a.set_xscale("log", base=2)
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"plot: {png}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result")
    parser.add_argument("baseline", nargs="?")
    parser.add_argument("--png", help="default: the result's path with .png")
    parser.add_argument("--label", default="now")
    parser.add_argument("--baseline-label", default="before")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args()
    results = [json.loads(Path(args.result).read_text())]
    labels = [args.label]
    if args.baseline:
        results.append(json.loads(Path(args.baseline).read_text()))
        labels.append(args.baseline_label)
    print(table(results[0], args.markdown))
    plot(results, labels, args.png or str(Path(args.result).with_suffix(".png")))


if __name__ == "__main__":
    main()
