"""The rubric world's plots (benchmarks/rubric_table.py): proxy and gold against step, gap and
overclaim against step, per-criterion gold at End; the frontier plot is dynalize.analysis.frontier's."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any


def mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and v == v]
    return statistics.fmean(values) if values else float("nan")


def plots(res: dict[str, Any], plot_dir: Path, name: str, labels: dict[str, str]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_dir.mkdir(parents=True, exist_ok=True)
    seeds, arms, runs = res["seeds"], res["arms"], res["runs"]
    palette = ["tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:olive"]
    colors = dict(zip(arms, palette * 2))
    written = []

    def panel(ax, key: str, title: str) -> None:
        for a in arms:
            curves = [runs[f"{a}_s{s}"][key] for s in seeds]
            x = runs[f"{a}_s{seeds[0]}"]["steps"]
            n = min(map(len, curves))
            for c in curves:
                ax.plot(x[:len(c)], c, color=colors[a], alpha=0.2, lw=0.8)
            ax.plot(x[:n], [mean([c[i] for c in curves]) for i in range(n)], color=colors[a], lw=2, label=labels[a])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panel(axes[0], "proxy", "held-out proxy score (training judge)")
    panel(axes[1], "gold", "held-out gold score")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Rubric world, lists '{name}' (thin: seeds; thick: mean)")
    fig.tight_layout()
    written.append(plot_dir / "proxy_gold.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panel(axes[0], "gap", "proxy − gold")
    panel(axes[1], "overclaim", "overclaim: proxy-met criteria gold marks unmet")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    written.append(plot_dir / "gap_overclaim.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    crit = list(runs[f"base_s{seeds[0]}"]["criteria_end"])
    fig, ax = plt.subplots(figsize=(max(8.0, 0.75 * len(crit) + 2), 4))
    width = 0.8 / len(arms)
    for i, a in enumerate(arms):
        ys = [mean([runs[f"{a}_s{s}"]["criteria_end"][c][1] for s in seeds]) for c in crit]
        ax.bar([k + i * width for k in range(len(crit))], ys, width, color=colors[a], label=labels[a])
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(crit))])
    ax.set_xticklabels(crit, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("gold met rate at End")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    written.append(plot_dir / "criteria_end.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written
