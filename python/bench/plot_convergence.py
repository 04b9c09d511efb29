"""Plots python/bench/convergence.py's results: the training-loss curves
(a moving average over 50 steps) and the held-out loss of each run.

    python plot_convergence.py convergence.json convergence.svg
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def smooth(xs, k=50):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= k:
            acc -= xs[i - k]
        out.append(acc / min(i + 1, k))
    return out


def main(src, dst):
    with open(src) as f:
        meta = json.load(f)
    runs = meta["runs"]
    fig, (curves, bars) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    for r in runs:
        style = "-" if r["error_feedback"] or r["codec"] is None else "--"
        width = 2.2 if r["codec"] is None else 1.2
        ys = smooth(r["curve"])
        # Every 10th step of the moving average: the SVG stays small.
        xs = list(range(0, len(ys), 10))
        curves.plot(xs, [ys[i] for i in xs], style, linewidth=width, label=r["name"])
    curves.set_yscale("log")
    curves.set_xlabel("step")
    curves.set_ylabel("training loss (moving average of 50 steps)")
    curves.set_title(
        f"DDP over sncl, {meta['world']} ranks, {meta['model']}, SGD lr {meta['lr']} momentum 0.9"
    )
    curves.legend(fontsize=8, ncol=2)
    names = [r["name"] for r in runs]
    losses = [r["held_out_loss"] for r in runs]
    colors = ["black" if r["codec"] is None else ("tab:blue" if r["error_feedback"] else "tab:gray")
              for r in runs]
    bars.barh(names[::-1], losses[::-1], color=colors[::-1])
    base = runs[0]["held_out_loss"]
    bars.axvline(base, color="black", linewidth=0.8)
    for y, r in enumerate(runs[::-1]):
        bars.text(r["held_out_loss"], y, f" {r['held_out_loss']:.4f} ({r['held_out_loss'] / base - 1:+.1%})",
                  va="center", fontsize=8)
    bars.set_xlabel("held-out loss after training (blue: with error feedback)")
    bars.set_xlim(0, max(losses) * 1.45)
    fig.tight_layout()
    fig.savefig(dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
