"""`python -m dynalize.run [--config X.yaml] [--resume RUN_DIR | --overwrite] [key=value ...]`

Reads the config, builds the parts, runs the loop, prints a summary. The settings start from
`--config`'s file, or from the run's saved config with `--resume`, or else from the defaults in
dynalize/config.py; dotted overrides apply on top. With no arguments at all it runs the built-in
demo, dynalize/assets/default.yaml (the sandbox task with Dynalize on, a few minutes on a CPU).

Exit codes (README.md, docs/reliability.md): 0 finished; 1 an unexpected error (a bug, or task
code raising) with its traceback; 2 bad input (one line: a config, a task, data, a run directory
already in use, a resume that would change what the run is, no intact checkpoint, a full disk or
a read-only folder), before anything is written or without damaging anything earlier; 3 the run
stopped itself (one line: a judge that keeps failing, too many rollouts left out; a checkpoint
was written, `--resume` continues); 4 the run finished but a held-out measurement is incomplete
(the last line names the judge and how many replies it failed on; `python -m dynalize.eval --run
RUN --bench rubric` grades them again); 130
interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import textwrap
import traceback
import typing
from pathlib import Path
from typing import Any

import anyio
import structlog
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from .checkpoint import checkpoints, resume_from
from .config import ConfigError, RunConfig, config_yaml, dump_config, load_config
from .cost import cost_lines
from .errors import RunStopped
from .hooks import HookError
from .resume import freeze_derived, resume_config, steps_problem
from .rubrics.protocol import missing_verdicts
from .runlog import RunDir, filesystem_problem, read_jsonl

DEFAULT_CONFIG = Path(__file__).parent / "assets" / "default.yaml"
log = structlog.get_logger("dynalize.run")


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr, force=True)  # stderr of the moment
    for noisy in ("httpx", "transformers", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="%H:%M:%S"),
                    structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),  # the stderr of the moment
    )


def set_torch_threads(threads: int = 0) -> None:
    """On a CPU, torch threads per call (0 = half the cores). Generation and training (or the event
    loop's worker threads) run torch at once: two calls that each take every core oversubscribe it
    (OpenMP spin-waits) and can be many times slower."""
    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 2) // 2))


def config_sections(model: type[BaseModel] = RunConfig, name: str = "(top level)",
                    prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    """(dotted name, settings class) of `model` and every section under it, depth first."""
    out = [(name, model)]
    for field_name, field in model.model_fields.items():
        if (section := _section(field.annotation)) is not None:
            out += config_sections(section, prefix + field_name, f"{prefix}{field_name}.")
    return out


def _section(annotation: Any) -> type[BaseModel] | None:
    """The settings class a field holds (`X` or `X | None`), or None for a plain value."""
    kinds = typing.get_args(annotation) or (annotation,)
    return next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)


def sections_help() -> str:
    """The --help epilog: each config section, where its fields are documented, and what it is."""
    rows = [(name, f"{cls.__module__.replace('.', '/')}.py: {cls.__name__}", (cls.__doc__ or "").strip().split("\n")[0])
            for name, cls in config_sections()]
    width = max(len(name) for name, _, _ in rows)
    lines = [f"  {name:<{width}}  {where}" + (f"\n  {'':<{width}}    {doc}" if doc else "") for name, where, doc in rows]
    top = ", ".join(n for n, f in RunConfig.model_fields.items() if _section(f.annotation) is None)
    return ("config sections (set a field with section.field=value; every field is documented where it is\n"
            "declared, in the file and class named here):\n" + "\n".join(lines) +
            f"\n\ntop-level fields: {textwrap.fill(top, 96, subsequent_indent='  ')}\n\n"
            "--print-config shows every field's resolved value. README.md and docs/ explain the run.")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dynalize.run", description=__doc__.splitlines()[0],
                                 epilog=sections_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML experiment file (default: dynalize/config.py's defaults; with no "
                                     "arguments at all, the built-in sandbox demo)")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest intact checkpoint "
                    "(with --config, that file's settings, checked against the run's)")
    ap.add_argument("--overwrite", action="store_true",
                    help="start afresh in a run directory already in use, moving the old one aside")
    ap.add_argument("--print-config", action="store_true",
                    help="print the resolved config (YAML, usable as --config) and exit without running")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-5 steps=40")
    return ap.parse_args(argv)


def resolve_config(args: argparse.Namespace) -> RunConfig:
    if args.resume:
        saved = Path(args.resume) / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"config error: {args.resume} is not a run directory (no config.yaml)")
        if args.overwrite:
            raise ConfigError("config error: --resume continues a run and --overwrite replaces it: give one")
        cfg = load_config(args.config or saved, args.overrides)
        run = Path(args.resume) if Path(args.resume).name not in ("", "..") else Path(args.resume).resolve()
        cfg.output_dir, cfg.name = str(run.parent), run.name
        return resume_config(load_config(saved), cfg)
    return freeze_derived(load_config(base_config(args), args.overrides))


def base_config(args: argparse.Namespace) -> Path | None:
    """Where a new run's settings start: `--config`, the built-in demo when there are no arguments
    at all, else no file (dynalize/config.py's defaults)."""
    if args.config:
        return Path(args.config)
    return None if args.overrides else DEFAULT_CONFIG


def describe_base(args: argparse.Namespace) -> str:
    """The settings' starting point, for the run's first log line."""
    if args.resume:
        return str(Path(args.resume) / "config.yaml")
    base = base_config(args)
    if base is None:
        return "dynalize/config.py defaults"
    return "the built-in demo (dynalize/assets/default.yaml)" if base == DEFAULT_CONFIG else str(base)


def follow(cfg: RunConfig) -> None:
    """Ranks > 0 (`accelerate launch`, `torchrun`): hold a shard of the learner and follow rank 0."""
    from .build import build_learner

    set_torch_threads(cfg.torch_threads)
    build_learner(cfg).serve()


async def train(cfg: RunConfig, resume: bool, base: str = "the given RunConfig",
                overwrite: bool = False) -> list[dict[str, Any]]:
    """Run (or with `resume`, continue) the training `cfg` describes (`base`: where its settings
    started, for the log). A new run refuses a directory that holds files unless `overwrite`
    (the old directory is then moved aside)."""
    from .build import build_parts
    from .loop import Orchestrator

    run_dir, cfg = cfg.run_dir, freeze_derived(cfg)
    if problem := RunDir(run_dir).problem():
        raise ConfigError(f"config error: {problem}")
    if not resume and not overwrite and RunDir(run_dir).holds_run():
        raise ConfigError(f"config error: {run_dir} already holds a run: continue it with --resume {run_dir}, "
                          f"start afresh with --overwrite (the old directory is moved aside), or pick another name=")
    set_torch_threads(cfg.torch_threads)
    parts = build_parts(cfg)
    if overwrite and not resume and parts.run.holds_run():
        moved = parts.run.move_aside()
        log.warning("overwrite: the earlier run was moved aside", run=str(run_dir), moved_to=str(moved))
    orchestrator = Orchestrator(parts)
    if resume and not checkpoints(parts.run.checkpoints_dir):  # killed before its first checkpoint
        log.warning("resume: no checkpoint yet, so the run starts again from step 0 with its saved config "
                    "(the same seed: the same run)", run=str(run_dir))
        parts.run.truncate(0, 0, [t.name for t in parts.terms])
        resume = False
    if resume:
        ckpt, state = resume_from(parts.run.checkpoints_dir, parts.learner, orchestrator.load_state_dict)
        if problem := steps_problem(cfg.steps, orchestrator.next_step):
            raise ConfigError(problem)
        if "eval_rows" not in state and parts.run.eval_path.exists():  # a checkpoint from before eval_rows
            orchestrator.eval_rows = len(read_jsonl(parts.run.eval_path))
        parts.run.truncate(orchestrator.next_step, state.get("eval_rows"), [t.name for t in parts.terms])
        log.info("resuming", run=str(run_dir), step=orchestrator.next_step, checkpoint=ckpt.name)
    parts.run.create()
    dump_config(cfg, run_dir / "config.yaml")
    log.info("run", name=cfg.name, dir=str(run_dir), config=base, task=cfg.task.name, steps=cfg.steps,
             terms=[t.name for t in parts.terms])
    try:
        history = await orchestrator.run()
    finally:
        parts.learner.stop_followers()
    if cfg.export_final:
        from .export import export_policy

        final = export_policy(run_dir, run_dir / "final", overwrite=True, checkpoint=orchestrator.last_checkpoint)
        log.info("exported the final policy", path=str(final))
    return history


def incomplete_measurements(run_dir: Path) -> list[str]:
    """What the run's held-out evaluations miss (a judge's failed verdicts), one line per judge;
    evaluations re-graded complete since (eval/rubric.jsonl) are not missing."""
    run = RunDir(run_dir)
    if not run.eval_path.exists():
        return []
    regraded_path = run.eval_path.parent / "rubric.jsonl"
    regraded = {r.get("step"): bool(r.get("complete")) for r in read_jsonl(regraded_path)} \
        if regraded_path.exists() else {}
    return missing_verdicts(read_jsonl(run.eval_path), regraded)


def summary_table(cfg: RunConfig, history: list[dict[str, Any]], missing: list[str] | None = None) -> Table:
    t = Table(title=f"dynalize run {cfg.name!r}  ({cfg.run_dir})")
    t.add_column("metric")
    t.add_column("first", justify="right")
    t.add_column("last", justify="right")
    eval_keys = dict.fromkeys(k for h in history for k in h if k.startswith("eval/")  # the task's own too
                              and "_met/" not in k)  # not every criterion's met rate
    rows = ["reward/mean", "rm/mean", "rubric/masked", "rubric/full", "gen_len/mean", "loss", *eval_keys,
            "penalties/active"]
    first, last = history[0], history[-1]
    logged = RunDir(cfg.run_dir).metrics_path
    before = [h for h in read_jsonl(logged) if h.get("step") == 0] if logged.exists() else []  # step 0's evaluation
    for key in rows:
        evals = [h[key] for h in before + history if key in h and isinstance(h[key], int | float)]
        if evals:
            t.add_row(key, f"{evals[0]:.3f}", f"{evals[-1]:.3f}")
    steps = len(history)
    t.add_row("steps", str(first["step"]), str(last["step"]))
    t.add_row("dropped rollouts (total)", "", str(last["dropped_total"]))
    t.add_row("rollouts left out, unscored (total)", "", str(last.get("left_out_total", 0)))
    for what, failed, of in (("judge: failed verdicts", "judge/failed_verdicts_total", "judge/verdicts_total"),
                             ("proposer: failed proposals", "proposer/failed_total", "proposer/finished_total")):
        if of in last:
            n, total = int(last[failed]), int(last[of])
            t.add_row(f"{what} (total)", "", f"{n} of {total} ({n / total:.1%})" if total else "0 of 0")
    for role, spent in cost_lines(last):
        t.add_row(f"tokens: {role} (total)", "", spent)
    if any("eval/rubric/replies" in h for h in history) or missing:
        t.add_row("held-out measurement", "", "INCOMPLETE: " + "; ".join(missing) if missing else "complete")
    t.add_row("rollouts/s (mean)", "", f"{statistics.fmean(h['rollouts_per_s'] for h in history):.1f}")
    t.add_row("step time s (mean)", "", f"{statistics.fmean(h['time/step'] for h in history):.2f} × {steps}")
    return t


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level.upper())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        cfg = resolve_config(args)
        if args.print_config:
            print(config_yaml(cfg), end="")
            return 0
        from .build import check_config

        check_config(cfg)
        from .backends.accelerate import process_state

        if not process_state().is_main_process:
            follow(cfg)
            return 0
        history = anyio.run(train, cfg, bool(args.resume), describe_base(args), args.overwrite)
    except KeyboardInterrupt:
        print("interrupted: metrics and rollouts written so far are kept", file=sys.stderr)
        return 130
    except BaseException as e:  # noqa: BLE001 - errors meant for the user come out of task groups too
        if (err := _find(e, (ConfigError, FileNotFoundError))) is not None:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if (err := _find(e, (RunStopped,))) is not None:
            print(f"stopped: {err}", file=sys.stderr)
            return 3
        if isinstance(err := _find(e, (HookError,)), HookError):  # task code failed: which hook of which
            print(f"error: {err}", "".join(traceback.format_exception(err.error)),  # task, then its traceback
                  sep="\n", end="", file=sys.stderr)
            return 1
        if problem := filesystem_problem(_find(e, (OSError,))):  # a full disk, a read-only folder
            print(f"error: {problem}", file=sys.stderr)
            return 2
        raise
    missing = incomplete_measurements(cfg.run_dir)
    if history:
        Console().print(summary_table(cfg, history, missing))
    if missing:
        print(f"incomplete: the run finished but its held-out measurement is not: {'; '.join(missing)}; grade "
              f"them again with python -m dynalize.eval --run {cfg.run_dir} --bench rubric", file=sys.stderr)
        return 4
    return 0


def _find(e: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """`e`, or the first exception of one of `kinds` inside it (task groups wrap what they raise)."""
    if isinstance(e, kinds):
        return e
    for inner in getattr(e, "exceptions", ()):
        if (found := _find(inner, kinds)) is not None:
            return found
    return None


if __name__ == "__main__":
    sys.exit(main())
