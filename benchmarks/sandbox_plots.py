"""Plots of the sandbox experiment (benchmarks/sandbox_table.py): matplotlib, Agg, into `<out>/plots/`.

`rm_gold.png` (held-out RM and gold against step, both arms), `prevalence.png` (each planted
feature's held-out prevalence), `penalties.png` (the penalty timeline of each Dynalize seed).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

ARMS = ("rm_only", "dynalize")
LABEL = {"rm_only": "RM-only", "dynalize": "Dynalize"}


def plots(res: dict[str, Any], plot_dir: Path, name: str) -> list[Path]:
    """Write the three plots of `res` (sandbox_table.analyse) for feature list `name`; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_dir.mkdir(parents=True, exist_ok=True)
    seeds, labels, runs = res["seeds"], res["features"], res["runs"]
    colors = {"rm_only": "tab:red", "dynalize": "tab:blue"}
    written = []

    def mean_curve(arm: str, key: str) -> tuple[list[int], list[float]]:
        curves = [runs[f"{arm}_s{s}"][key] for s in seeds]
        n = min(map(len, curves))
        return runs[f"{arm}_s{seeds[0]}"]["steps"][:n], [statistics.fmean(c[i] for c in curves) for i in range(n)]

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in zip(axes, ("rm", "gold"), ("held-out RM score", "held-out gold quality")):
        for arm in ARMS:
            for s in seeds:
                r = runs[f"{arm}_s{s}"]
                ax.plot(r["steps"], r[key], color=colors[arm], alpha=0.25, lw=0.8)
            x, y = mean_curve(arm, key)
            ax.plot(x, y, color=colors[arm], lw=2, label=f"{LABEL[arm]} (mean of {len(seeds)} seeds)")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"Sandbox, feature list '{name}'")
    fig.tight_layout()
    written.append(plot_dir / "rm_gold.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(labels), figsize=(3.6 * len(labels), 3.4), squeeze=False)
    for ax, k in zip(axes[0], labels):
        for arm in ARMS:
            curves = [runs[f"{arm}_s{s}"]["prev"][k] for s in seeds]
            n = min(map(len, curves))
            x = runs[f"{arm}_s{seeds[0]}"]["steps"][:n]
            ax.plot(x, [statistics.fmean(c[i] for c in curves) for i in range(n)], color=colors[arm],
                    lw=2, label=LABEL[arm])
        for s in seeds:
            for p in runs[f"dynalize_s{s}"]["penalties"]:
                if p["feature"] == k:
                    ax.axvline(p["events"][0][1], color=colors["dynalize"], ls=":", alpha=0.6)
        ax.set_title(k)
        ax.set_ylim(0, 1)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out prevalence")
    axes[0][0].legend()
    fig.suptitle(f"Planted features in held-out replies (dotted: a matching penalty enters), list '{name}'")
    fig.tight_layout()
    written.append(plot_dir / "prevalence.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    n_pens = [max(1, len(runs[f"dynalize_s{s}"]["penalties"])) for s in seeds]
    fig, axes = plt.subplots(len(seeds), 1, figsize=(11, 0.9 + 0.42 * sum(n_pens) + 0.5 * len(seeds)),
                             squeeze=False, gridspec_kw={"height_ratios": n_pens})
    last_step = max(max([runs[f"dynalize_s{s}"]["steps"][-1]] + [st for p in runs[f"dynalize_s{s}"]["penalties"]
                                                                 for _, st in p["events"]]) for s in seeds)
    for ax, s in zip(axes[:, 0], seeds):
        pens = runs[f"dynalize_s{s}"]["penalties"]
        for i, p in enumerate(pens):
            start = None
            for e, st in p["events"] + [("end", last_step)]:
                if e in ("add", "revive"):
                    start = st
                elif start is not None:
                    ax.barh(i, st - start, left=start, height=0.6,
                            color="tab:green" if p["feature"] else "tab:gray", alpha=0.8)
                    start = None
                if e == "revive":
                    ax.plot(st, i, marker=">", color="black", ms=6)
                if e == "retire":
                    ax.plot(st, i, marker="x", color="black", ms=6)
        ax.set_yticks(range(len(pens)))
        ax.set_yticklabels([f"{p['id']} {p['title'][:40]}" + (f"  [{p['feature']}]" if p["feature"] else "")
                            for p in pens], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, last_step)
        ax.set_ylabel(f"seed {s}")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("step (bars: active; x: retired; >: revived; green: matches a planted feature)")
    fig.suptitle(f"Dynalize penalty buffer, feature list '{name}'")
    fig.tight_layout()
    written.append(plot_dir / "penalties.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written
