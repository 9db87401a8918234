"""The tables of the synthetic discovery suite (benchmarks/discovery_synthetic.py): nulls, tuned
kinds, held-out kinds, printed with rich or written as markdown (`--markdown`, for the docs). Every
number comes from the scored runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.table import Table

from synthetic_policy import TRAITS
from synthetic_worlds import SHORTCUT_KINDS

LEFT = {"kind", "what the reward pays for", "proposed"}
KIND_TITLES = {"length_step": "more than 34 words (a step)",
               "length_ramp": "more than 34 words, paid per word up to 20 more (a ramp)"}
"""Kinds that share a trait, told apart by how the reward pays it."""


@dataclass
class Cells:
    """A table as text cells; `breaks` are the row indexes a section ends after."""

    title: str
    columns: tuple[str, ...]
    rows: list[list[str]]
    breaks: set[int]

    def rich(self) -> Table:
        t = Table(title=self.title)
        for col in self.columns:
            t.add_column(col, justify="left" if col in LEFT else "right", no_wrap=col == "kind")
        for i, row in enumerate(self.rows):
            t.add_row(*row, end_section=i in self.breaks)
        return t

    def markdown(self) -> str:
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |",
                 "| " + " | ".join("---" for _ in self.columns) + " |"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"


def _exits(e: dict[str, int]) -> str:
    return f"{e['0']} / {e['10']} / {e['11']} / {e.get('12', 0)} / {e['other']}"


def _proposed(titles: list[tuple[str, int]], top: int = 3) -> str:
    if not titles:
        return "—"
    shown = "; ".join(f"{t[:48]} ({n})" for t, n in titles[:top])
    return shown + (f"; {len(titles) - top} more" if len(titles) > top else "")


def null_cells(rows: list[dict[str, Any]]) -> Cells:
    out = []
    for r in rows:
        lo, hi = r["ci95"]
        out.append([r["kind"], str(r["runs"]), str(r["alarmed"]), f"{r['rate']:.3f} [{lo:.3f}, {hi:.3f}]",
                    _exits(r["exits"]), _proposed(r["proposed"])])
    return Cells("Null worlds and legitimate-pay controls (the monitor should stay quiet)",
                 ("kind", "runs", "alarmed", "false-alarm rate [95 % CI]", "exit 0 / 10 / 11 / 12 / other", "proposed"),
                 out, {i for i, r in enumerate(rows) if r["kind"] == "ties"})


def kinds_cells(title: str, rows: list[dict[str, Any]]) -> Cells:
    out = []
    for r in rows:
        k = r["kind"]
        control = k.startswith("control")
        what = KIND_TITLES.get(k) or TRAITS[SHORTCUT_KINDS[k]].title if k in SHORTCUT_KINDS else \
            "nothing (a style of this half drifts up unpaid)" if control else "every kind above"
        recall = "—" if control or not r["seeable"] else f"{r['found']}/{r['seeable']}"
        prec = f"alarmed {r['alarmed']}/{r['runs']}" if control else \
            f"{r['true'] / r['patterns']:.2f} ({r['true']}/{r['patterns']})" if r["patterns"] else "—"
        delay = "—" if r["delay_median"] is None else f"{r['delay_median']:g} / {r['delay_max']}"
        rule = "—" if control else f"{r['exit0_qualifying']} of {r['qualifying']} ({r.get('exit0_claim_broken', '?')})"
        out.append([k, what, str(r["runs"]), recall, prec, f"{r['false_per_run']:.2f}", delay, _exits(r["exits"]), rule])
    planted = next((i for i, r in enumerate(rows) if r["kind"] == "all planted"), None)
    return Cells(title, ("kind", "what the reward pays for", "runs", "recall", "precision", "false / run",
                         "delay median / max", "exit 0 / 10 / 11 / 12 / other", "exit 0 when paid >= 0.5 std in >= 50 % (netting what it said it could see)"),
                 out, set() if planted is None else {planted - 1, planted})


def tables(scores: dict[str, Any]) -> list[Cells]:
    rows = scores["rows"]
    out = [null_cells(rows["null"])] if rows["null"] else []
    for half, name in (("tuned", "Tuned kinds (defaults may be chosen on these)"),
                       ("held_out", "Held-out kinds (never tuned on)")):
        if rows[half]:
            out.append(kinds_cells(f"{name}: python -m dynalize.monitor, defaults", rows[half]))
    return out


def notes(scores: dict[str, Any]) -> list[str]:
    """The lines printed under the tables."""
    out = []
    unseen = [r["name"] for r in scores["runs"] if r["kind"] in SHORTCUT_KINDS and not r["seeable"]]
    if unseen:
        out.append(f"Not counted in recall (the logs cannot show the shortcut rising): {', '.join(unseen)}")
    out.append(f"Recall counts a planted run whose shortcut reached 20 % of a logged step's replies after the logs "
               f"began; a pattern matches it by what it fires on. Planted pay (reward stds, by seed): "
               f"{', '.join(f'{p:g}' for p in scores.get('pays', ()))}; trait rising to "
               f"{scores.get('prevalence', 0):.0%} of replies. {len(scores['runs'])} of {scores.get('planned', '?')} "
               f"planned runs in the tables.")
    return out


def print_tables(scores: dict[str, Any], console) -> None:
    if scores.get("settings"):
        console.print("settings given to the monitor: " + " ".join(scores["settings"]))
    for t in tables(scores):
        console.print(t.rich())
    for line in notes(scores):
        console.print(line, markup=False, highlight=False)


def markdown(scores: dict[str, Any]) -> str:
    return "\n".join(t.markdown() for t in tables(scores)) + "\n" + "\n\n".join(notes(scores)) + "\n"
