"""Experiment trackers (`report_to`): TensorBoard, Weights & Biases, Trackio and MLflow.

What a run sends them: the resolved config as hyper-parameters (flattened, `trainer.lr`); every
number of each metrics.jsonl line at its step (nested ones flattened: `staleness/1`; step 0 is the
evaluation before training); the reward terms' events (penalties added, retired, revived) as a
table that grows as they come; and a small table of sample rollouts (prompt, reply, then the RM
score, the penalties triggered, the rubric scores masked and full with the kept criteria met and
the dropped ones, each reward function's score, each only where the run has that term, and the
reward) every `eval_every` steps
and at the last step.

Accelerate's tracker classes start each library, store the config and log the numbers. Tables go
to each library's own table, which Accelerate has no common call for: `wandb.Table`,
`trackio.Table`, `mlflow.log_table` (a JSON artifact per step), and a Markdown table as TensorBoard
text. TensorBoard writes to `<run>/tensorboard/`; the others go where their own settings send them
(WANDB_MODE / WANDB_DIR, TRACKIO_DIR, MLFLOW_TRACKING_URI).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .analysis.tables import markdown
from .config import RunConfig, flatten
from .extras import require
from .types import Rollout

MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow"}
"""The module each tracker needs (all installed by `pip install -e ".[trackers]"`)."""
SAMPLE_ROWS = 8
"""Rollouts in each sample table: the first of each of the batch's first prompts."""
SAMPLE_COLUMNS = ["step", "prompt", "reply", "rm", "penalties triggered", "rubric (masked)", "rubric (full)",
                  "criteria met", "dropped", "reward"]
"""Every column a sample table can have; a table has those its rollouts carry (`sample_columns`)."""
EVENT_COLUMNS = ["step", "term", "event", "id", "title", "description", "regex", "reason"]


def check_installed(report_to: list[str]) -> None:
    """One line (ConfigError) naming the first tracker in `report_to` whose library is missing."""
    for name in report_to:
        require(MODULES[name], f"config error: report_to: {name}")


def hyperparameters(cfg: RunConfig) -> dict[str, Any]:
    """The config as flat `section.field` → bool, int, float, str or None (lists as JSON)."""
    flat = flatten(cfg.model_dump(mode="json"), ".")
    return {k: v if v is None or isinstance(v, (bool, int, float, str)) else json.dumps(v) for k, v in flat.items()}


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics line, nested ones flattened (`staleness/1`)."""
    return {k: float(v) for k, v in flatten(record, "/").items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}


def sample_columns(rollouts: list[dict[str, Any]]) -> list[str]:
    """The sample table's columns for a step's rollout lines: `rm` only with an RM, the triggered
    penalties only with the penalty term, the rubric columns only with the rubric term, one
    `rewards/<name>` column per reward function (`reward_funcs`) before the reward."""
    has = {"rm": any("rm" in (r.get("scores") or {}) for r in rollouts),
           "penalties triggered": any("verdicts" in r for r in rollouts)}
    rubric = any("rubric_verdicts" in r for r in rollouts)
    has.update(dict.fromkeys(("rubric (masked)", "rubric (full)", "criteria met", "dropped"), rubric))
    columns = [c for c in SAMPLE_COLUMNS if has.get(c, True)]
    functions = list(dict.fromkeys(k for r in rollouts for k in r.get("rewards") or {}))  # reward_funcs, by name
    return [*columns[:-1], *(f"rewards/{name}" for name in functions), columns[-1]]


def _cell(r: dict[str, Any], column: str, step: int) -> Any:
    if column == "step":
        return step
    if column == "prompt":
        return next((m["content"] for m in reversed(r["prompt"]) if m["role"] == "user"), "")
    if column == "reply":
        return "\n\n".join(r["replies"])
    if column == "rm":
        return (r.get("scores") or {}).get("rm")
    if column == "penalties triggered":
        return ", ".join(pid for pid, hit in (r.get("verdicts") or {}).items() if hit)
    if column == "rubric (masked)":
        return r.get("rubric_score")
    if column == "rubric (full)":
        return r.get("rubric_full")
    if column == "criteria met":  # over the kept criteria, per reply
        dropped = set(r.get("rubric_dropped") or ())
        return "; ".join(f"{sum(bool(v) for k, v in verdicts.items() if k not in dropped)} of "
                         f"{sum(k not in dropped for k in verdicts)}" for verdicts in r.get("rubric_verdicts") or [])
    if column == "dropped":
        return ", ".join(r.get("rubric_dropped") or ())
    if column.startswith("rewards/"):  # one reward function's score (None: it did not apply)
        return (r.get("rewards") or {}).get(column.removeprefix("rewards/"))
    return r.get(column)


def sample_rows(step: int, rollouts: list[dict[str, Any]], n: int = SAMPLE_ROWS) -> list[list[Any]]:
    """One row per prompt (its first rollout), for the first `n` prompts of a step's rollout lines,
    in the columns of `sample_columns`."""
    columns = sample_columns(rollouts)
    rows, seen = [], set()
    for r in rollouts:
        if r["prompt_id"] in seen or len(rows) == n:
            continue
        seen.add(r["prompt_id"])
        rows.append([_cell(r, c, step) for c in columns])
    return rows


def event_rows(step: int, events: dict[str, list[dict[str, Any]]]) -> list[list[Any]]:
    """Rows of the reward terms' events of a step (add, retire, revive; per-step stats are metrics)."""
    return [[e.get("step", step), term, e.get("event", ""), e.get("id", ""), e.get("title", ""),
             e.get("description", ""), e.get("regex") or "", e.get("reason", "")]
            for term, lines in events.items() for e in lines if e.get("event") != "stats"]


class Trackers:
    """The run's trackers: `start()` once, `log_step` after each step, `finish()` at the end. With
    `report_to` empty every call does nothing."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.trackers: list[Any] = []
        self.events: list[list[Any]] = []

    def start(self) -> None:
        from accelerate.tracking import MLflowTracker, TensorBoardTracker, TrackioTracker, WandBTracker

        cfg = self.cfg
        check_installed(cfg.report_to)
        params = hyperparameters(cfg)
        make = {
            "tensorboard": lambda: TensorBoardTracker("", Path(cfg.run_dir) / "tensorboard"),
            "wandb": lambda: WandBTracker(cfg.tracker_project, name=cfg.name),
            # trackio takes the config at init: Accelerate's store_init_configuration would add its
            # `allow_val_change` argument to it as one more key
            "trackio": lambda: TrackioTracker(cfg.tracker_project, name=cfg.name, config=params),
            "mlflow": lambda: MLflowTracker(cfg.tracker_project, run_name=cfg.name),
        }
        for name in dict.fromkeys(cfg.report_to):
            tracker = make[name]()
            tracker.start()
            if name != "trackio":
                tracker.store_init_configuration(params)
            self.trackers.append(tracker)

    def log_step(self, record: dict[str, Any], events: dict[str, list[dict[str, Any]]],
                 rollouts: list[Rollout]) -> None:
        """A step's metrics line, its reward terms' events and (when due) a table of its rollouts."""
        if not self.trackers:
            return
        step = record["step"]
        numbers = scalars(record)
        for t in self.trackers:
            t.log(numbers, step=step)
        if rows := event_rows(step, events):
            self.events += rows
            self.table("events", EVENT_COLUMNS, self.events, step)
        every, last = self.cfg.eval_every, step == self.cfg.steps
        if rollouts and (last or (every and step % every == 0)):
            lines = [r.record(step) for r in rollouts]
            self.table("samples", sample_columns(lines), sample_rows(step, lines), step)

    def table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """A table in each tracker, in the library's own form."""
        for t in self.trackers:
            if t.name == "wandb":
                t.log_table(name, columns=columns, data=rows, step=step)
            elif t.name == "trackio":
                import trackio

                t.log({name: trackio.Table(columns=columns, data=rows)}, step=step)
            elif t.name == "mlflow":
                import mlflow

                mlflow.log_table({c: [row[i] for row in rows] for i, c in enumerate(columns)},
                                 artifact_file=f"{name}/step_{step:06d}.json")
            else:
                t.log({name: markdown_table(columns, rows)}, step=step)

    def finish(self) -> None:
        for t in self.trackers:
            t.finish()
        self.trackers = []


def markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (TensorBoard renders text as Markdown), each cell on one line."""
    def cell(v: Any) -> str:
        return " ".join((f"{v:.4g}" if isinstance(v, float) else str(v)).split())

    return markdown(columns, [[cell(v) for v in row] for row in rows])
