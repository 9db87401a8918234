"""`python -m dynalize.rm pairs ...` and `python -m dynalize.rm train ...`

pairs: preference pairs from a run's rollouts: clean replies the RM scores above the 75th
       percentile of their prompt's over replies that trigger a penalty (dynalize/rm/pairs.py).
train: a Bradley–Terry reward model on pair files (TRL's RewardTrainer), held-out accuracy before
       and after, saved as a directory `reward_model: {engine: hf, path: DIR}` loads.

Exit codes: 0 done; 2 bad input (one line: a pair file, a run without penalties or verdicts, a
setting, a non-empty output directory).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Any

import anyio
from pydantic import ValidationError
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ..analysis.runs import ReportError
from ..config import TaskConfig, _set_dotted, parse_override, read_yaml
from ..errors import ConfigError, one_line
from ..hooks import HookError
from .config import PairsConfig, RMTrainConfig

console = Console(stderr=True)


# --- pairs ---------------------------------------------------------------------------------------

def parse_pairs_args(argv: list[str]) -> PairsConfig:
    ap = argparse.ArgumentParser(prog="python -m dynalize.rm pairs",
                                 description="Preference pairs from a run: clean, well-scored replies over "
                                             "penalised ones.")
    ap.add_argument("--run", required=True, help="the run directory")
    ap.add_argument("--out", required=True, help="the pair file to write (JSONL)")
    ap.add_argument("--percentile", type=float, default=75.0, help="chosen replies score above it (default 75)")
    ap.add_argument("--scope", choices=("prompt", "run"), default="prompt",
                    help="the percentile of the prompt's own replies (default) or of every reply read")
    ap.add_argument("--pairs-per-prompt", type=int, default=4, help="pairs per prompt at most (default 4)")
    ap.add_argument("--steps", help="training steps to read: 10-99, 50-, 0,5,40-60 (default all)")
    ap.add_argument("--no-dedup", action="store_true", help="keep repeated reply texts as separate replies")
    ap.add_argument("--rejudge", action="store_true",
                    help="judge every reply against every penalty the run ever accepted (default: the verdicts "
                         "recorded in training, which cover the penalties active at each step)")
    ap.add_argument("--judge", help="with --rejudge: LLM judge for penalties without a regex (JSON or YAML/JSON file)")
    ap.add_argument("--judge-concurrency", type=int, default=16, help="with --rejudge: judge calls in flight at once (16)")
    ap.add_argument("--rejected", choices=("random", "highest"), default="random",
                    help="pair penalised replies in random order (default) or highest RM score first")
    ap.add_argument("--seed", type=int, default=0, help="seeds the random pairing of replies (default 0)")
    a = ap.parse_args(argv)
    return settings(PairsConfig, dict(
        run=a.run, out=a.out, percentile=a.percentile, scope=a.scope, pairs_per_prompt=a.pairs_per_prompt,
        steps=a.steps, dedup=not a.no_dedup, rejudge=a.rejudge, judge=a.judge, judge_concurrency=a.judge_concurrency,
        rejected=a.rejected, seed=a.seed))


def settings(cls: Any, data: dict[str, Any]) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(one_line(e)) from None


def pairs_command(cfg: PairsConfig) -> dict[str, Any]:
    from ..analysis.audit import judge_from_spec
    from .pairfile import write_pairs
    from .pairs import pairs_from_run

    if cfg.judge and not cfg.rejudge:
        raise ConfigError("--judge is used only with --rejudge")
    # offline: no time budget per batch of replies (a verdict still fails after its retries)
    judge = judge_from_spec(cfg.judge, cfg.judge_concurrency, time_budget_s=None) if cfg.judge else None
    with Progress(console=console, transient=True) as bar:
        pairs, stats = anyio.run(pairs_from_run, cfg, judge, bar)
    write_pairs(cfg.out, pairs)
    t = Table(title=f"pairs from {cfg.run} ({'re-judged against every penalty' if cfg.rejudge else 'recorded verdicts'}"
                    f", {cfg.percentile:g}th percentile of each {cfg.scope}'s replies)")
    t.add_column("")
    t.add_column("count", justify="right")
    for name, value in [("replies read", stats.replies),
                        ("distinct replies" if cfg.dedup else "replies kept", stats.distinct),
                        ("skipped: failed verdict", stats.failed),
                        ("skipped: penalised multi-turn rollout, reply unknown", stats.unattributed),
                        ("skipped: no RM score", stats.no_rm), ("prompts read", stats.prompts),
                        ("clean replies above the percentile", stats.chosen_pool),
                        ("penalised replies", stats.rejected_pool), ("prompts used", stats.prompts_used),
                        ("pairs", stats.pairs)]:
        t.add_row(name, str(value))
    console.print(t)
    cov = Table(title="per-penalty coverage: pairs whose rejected reply triggers it")
    for c in ("penalty", "title", "regex", "pairs"):
        cov.add_column(c, justify="right" if c == "pairs" else "left")
    for pid, p in stats.penalties.items():
        cov.add_row(pid, p.title, p.regex or "—", str(stats.coverage.get(pid, 0)))
    console.print(cov)
    console.print(f"written: {cfg.out} ({stats.pairs} pairs from {stats.prompts_used} prompts)")
    return {"pairs": stats.pairs, "prompts_used": stats.prompts_used, "coverage": stats.coverage}


# --- train ---------------------------------------------------------------------------------------

def parse_train_args(argv: list[str]) -> RMTrainConfig:
    ap = argparse.ArgumentParser(prog="python -m dynalize.rm train",
                                 description="Train a Bradley-Terry reward model on preference pairs.",
                                 epilog="Every setting (dynalize/rm/config.py: RMTrainConfig) can be given as "
                                        "key=value, e.g. lr=2e-6 epochs=1 trainer_args.bf16=true")
    ap.add_argument("--config", help="a YAML file of RMTrainConfig settings")
    ap.add_argument("--base", help="model to start from: an RM or LM directory, or tiny:<name>")
    ap.add_argument("--pairs", help="the original pair file")
    ap.add_argument("--extra", nargs="+", help="further pair files (e.g. from `python -m dynalize.rm pairs`)")
    ap.add_argument("--out", help="output directory of the trained RM")
    ap.add_argument("--task", help="the task whose rm_input the RM reads: a task name, module:Class, or a run "
                                   "directory (its config.yaml's task); default: the chat with the reply")
    ap.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    a = ap.parse_args(argv)
    data: dict[str, Any] = read_yaml(a.config) if a.config else {}
    for key in ("base", "pairs", "extra", "out"):
        if getattr(a, key) is not None:
            data[key] = getattr(a, key)
    if a.overwrite:
        data["overwrite"] = True
    if a.task:
        data["task"] = task_section(a.task)
    for item in a.overrides:
        key, value = parse_override(item)
        _set_dotted(data, key, value)
    return settings(RMTrainConfig, data)


def task_section(spec: str) -> dict[str, Any]:
    """`--task`: a run directory gives its config.yaml's task section; anything else is a task name."""
    run_config = Path(spec) / "config.yaml"
    if Path(spec).is_dir():
        if not run_config.is_file():
            raise ConfigError(f"--task {spec}: a directory, but no run (no config.yaml in it)")
        task = read_yaml(run_config).get("task")
        return TaskConfig.model_validate(task or {}).model_dump()
    return {"name": spec, "args": {}}


def train_command(cfg: RMTrainConfig) -> dict[str, Any]:
    from .train import train_reward_model

    summary = train_reward_model(cfg, console)
    if not summary:  # not the main process
        return summary
    t = Table(title=f"held-out pair accuracy: {summary['previous'] or 'no previous RM'} (before) → {cfg.out} "
                    f"(after), by the hf engine")
    for c in ("pairs", "held out", "trained on", "accuracy before", "accuracy after", "margin after"):
        t.add_column(c, justify="left" if c == "pairs" else "right")
    for name in summary["files"]:
        b, a = summary["before"].get(name, {}), summary["after"].get(name, {})
        t.add_row(f"{name} ({summary['files'][name]})", str(summary["held_out_pairs"][name]),
                  str(summary["train_pairs"][name]), _pct(b.get("accuracy")), _pct(a.get("accuracy")),
                  f"{a['margin']:+.3f}" if a else "n/a")
    console.print(t)
    if not summary["before"]:
        console.print("before: n/a (the base has no reward head; previous=DIR names the RM this one replaces)")
    if summary["scale"] is not None:
        console.print(f"keep_scale: scores multiplied by {summary['scale']:.4f} to spread as {summary['previous']}'s")
    console.print(f"written: {cfg.out} (train loss {summary['train_loss']:.4f}, {summary['seconds']:.0f} s); "
                  f"use it with reward_model: {{engine: hf, path: {cfg.out}}}")
    return summary


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


# --- entry point -------------------------------------------------------------------------------

USAGE = "usage: python -m dynalize.rm {pairs,train} ... (--help after either for its options)"


def quiet_transformers() -> None:
    """Loading bars and notices of transformers off (the training progress bar stays: the Trainer's)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__.split(chr(10), 2)[2].strip()}")
        return 0
    if not argv or argv[0] not in ("pairs", "train"):
        print(USAGE, file=sys.stderr)
        return 2
    quiet_transformers()
    try:
        if argv[0] == "pairs":
            pairs_command(parse_pairs_args(argv[1:]))
        else:
            train_command(parse_train_args(argv[1:]))
    except (ConfigError, ReportError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except HookError as e:  # task code failed: which hook of which task, then its traceback
        print(f"error: {e}", "".join(traceback.format_exception(e.error)), sep="\n", end="", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
