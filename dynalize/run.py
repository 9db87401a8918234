"""`python -m dynalize.run [--config X.yaml] [--resume RUN_DIR] [key=value ...]`

Reads the config, builds the parts, runs the loop, prints a summary. The settings start from
`--config`'s file, or from the run's saved config with `--resume`, or else from the defaults in
dynalize/config.py; dotted overrides apply on top. With no arguments at all it runs the built-in
demo, dynalize/assets/default.yaml (the sandbox task with Dynalize on, a few minutes on a CPU).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import traceback
from pathlib import Path
from typing import Any

import anyio
import structlog
from rich.console import Console
from rich.table import Table

from .config import ConfigError, RunConfig, dump_config, load_config
from .hooks import HookError
from .runlog import load_checkpoint

DEFAULT_CONFIG = Path(__file__).parent / "assets" / "default.yaml"
log = structlog.get_logger("dynalize.run")


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dynalize.run", description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="YAML experiment file (default: dynalize/config.py's defaults; with no "
                                     "arguments at all, the built-in sandbox demo)")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-5 steps=40")
    return ap.parse_args(argv)


def resolve_config(args: argparse.Namespace) -> RunConfig:
    if args.resume:
        saved = Path(args.resume) / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"config error: {args.resume} is not a run directory (no config.yaml)")
        cfg = load_config(saved, args.overrides)
        cfg.output_dir, cfg.name = str(Path(args.resume).parent), Path(args.resume).name
        return cfg
    return load_config(base_config(args), args.overrides)


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
    from .backends.accelerate import AccelerateLearner
    from .build import model_dir

    set_torch_threads(cfg.torch_threads)
    AccelerateLearner(model_dir(cfg.policy.path), cfg.trainer, temperature=cfg.generator.temperature,
                      dtype=cfg.policy.dtype).serve()


async def train(cfg: RunConfig, resume: bool, base: str = "the given RunConfig") -> list[dict[str, Any]]:
    from .build import build_parts
    from .loop import Orchestrator

    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    set_torch_threads(cfg.torch_threads)
    parts = build_parts(cfg)
    orchestrator = Orchestrator(parts)
    if resume:
        ckpt = parts.run.latest_checkpoint()
        if ckpt is None:
            raise ConfigError(f"config error: {run_dir} has no checkpoint to resume from")
        orchestrator.load_state_dict(load_checkpoint(ckpt, parts.learner))
        parts.run.truncate(orchestrator.next_step)
        log.info("resuming", run=str(run_dir), step=orchestrator.next_step)
    dump_config(cfg, run_dir / "config.yaml")
    log.info("run", name=cfg.name, dir=str(run_dir), config=base, task=cfg.task.name, steps=cfg.steps,
             terms=[t.name for t in parts.terms])
    try:
        return await orchestrator.run()
    finally:
        parts.learner.stop_followers()


def summary_table(cfg: RunConfig, history: list[dict[str, Any]]) -> Table:
    t = Table(title=f"dynalize run {cfg.name!r}  ({cfg.run_dir})")
    t.add_column("metric")
    t.add_column("first", justify="right")
    t.add_column("last", justify="right")
    eval_keys = dict.fromkeys(k for h in history for k in h if k.startswith("eval/"))  # the task's own too
    rows = ["reward/mean", "rm/mean", "gen_len/mean", "loss", *eval_keys, "penalties/active"]
    first, last = history[0], history[-1]
    for key in rows:
        evals = [h[key] for h in history if key in h]
        if evals:
            t.add_row(key, f"{evals[0]:.3f}", f"{evals[-1]:.3f}")
    steps = len(history)
    t.add_row("steps", str(first["step"]), str(last["step"]))
    t.add_row("dropped rollouts (total)", "", str(last["dropped_total"]))
    t.add_row("rollouts/s (mean)", "", f"{statistics.fmean(h['rollouts_per_s'] for h in history):.1f}")
    t.add_row("step time s (mean)", "", f"{statistics.fmean(h['time/step'] for h in history):.2f} × {steps}")
    return t


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level.upper())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        cfg = resolve_config(args)
        from .build import check_config

        check_config(cfg)
        from .backends.accelerate import process_state

        if not process_state().is_main_process:
            follow(cfg)
            return 0
        history = anyio.run(train, cfg, bool(args.resume), describe_base(args))
    except (ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except HookError as e:  # task code failed: which hook of which task, then the task's own traceback
        print(f"error: {e}", "".join(traceback.format_exception(e.error)), sep="\n", end="", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: metrics and rollouts written so far are kept", file=sys.stderr)
        return 130
    if history:
        Console().print(summary_table(cfg, history))
    return 0


if __name__ == "__main__":
    sys.exit(main())
