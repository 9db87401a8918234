"""`python -m dynalize.run [--config X.yaml] [--resume RUN_DIR | --overwrite] [key=value ...]`

Reads the config, runs it through the Python API (dynalize/api.py, what `dynalize.train` runs),
prints a summary. The settings start from `--config`'s file, or from the run's saved config with
`--resume`, or else from the defaults in dynalize/config.py; dotted overrides apply on top. With
no arguments at all it runs the built-in demo, dynalize/assets/default.yaml (the sandbox task with
Dynalize on, a few minutes on a CPU).

Exit codes (docs/running.md, docs/reliability.md): 0 finished; 1 an unexpected error (a traceback; task
code that raised: which hook, then its traceback); 2 bad input (one line: a config, a task, data,
a run directory already in use or held by another process (one writer per folder), a link in
it that leads out of it, a resume that would change what the run is, no intact
checkpoint, an engine misconfigured or an API-backed model unreachable, before the run directory
exists; a full disk or a read-only folder, without damaging anything earlier); 3 the run stopped
itself (one line: a judge that keeps failing, too many rollouts left out; a checkpoint was
written, `--resume` continues); 4 the run finished but a held-out measurement is incomplete (the
last line names the judge and how many replies it failed on; `python -m dynalize.eval --run RUN
--bench rubric` grades them again); 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import traceback
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console

from . import api
from .backends.secrets import mask_secrets
from .caller_state import LOG_LEVEL_HELP
from .api import follow, set_torch_threads, setup_logging  # noqa: F401 - their old home
from .api import train_async as train  # noqa: F401 - the coroutine, as callers of dynalize.run know it
from .config import ConfigError, RunConfig, config_yaml, parse_override
from .errors import RunStopped
from .hooks import HookError
from .runlog import filesystem_problem
from .summary import incomplete_measurements, summary_table  # noqa: F401 - their old home

DEFAULT_CONFIG = Path(__file__).parent / "assets" / "default.yaml"


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
            "--print-config shows every field's resolved value. docs/running.md explains the run.")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dynalize.run", description=__doc__.splitlines()[0],
                                 epilog=sections_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML experiment file (default: with no --config, --resume or override, "
                                     "the built-in sandbox demo; with overrides, dynalize/config.py's defaults)")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest intact checkpoint "
                    "(with --config, that file's settings, checked against the run's)")
    ap.add_argument("--overwrite", action="store_true",
                    help="start afresh in a run directory already in use, moving the old one aside")
    ap.add_argument("--print-config", action="store_true",
                    help="print the resolved config (YAML, usable as --config) and exit without running")
    ap.add_argument("--log-level", default="INFO", help=LOG_LEVEL_HELP)
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-5 steps=40")
    return ap.parse_args(argv)


def resolve_config(args: argparse.Namespace) -> RunConfig:
    overrides = [parse_override(item) for item in args.overrides]
    if args.resume:
        return api.resolve_config(args.config, overrides, resume=args.resume, overwrite=args.overwrite)
    return api.resolve_config(base_config(args), overrides)


def base_config(args: argparse.Namespace) -> Path | None:
    """Where a new run's settings start: `--config`; the built-in demo when no override is given
    either (flags that set nothing, such as --overwrite or --print-config, do not count); else no
    file (dynalize/config.py's defaults)."""
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level.upper())
    try:
        cfg = resolve_config(args)
        if args.print_config:
            print(config_yaml(cfg), end="")
            return 0
        result = api.run(cfg, resume=bool(args.resume), overwrite=args.overwrite, base=describe_base(args))
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
            if isinstance(err.error, KeyboardInterrupt):  # raised by user code: the interrupted path
                print(f"interrupted: {err}; metrics and rollouts written so far are kept", file=sys.stderr)
                return 130
            trace = mask_secrets("".join(traceback.format_exception(err.error))) if err.error.__traceback__ else ""
            print(f"error: {err}\n{trace}", end="", file=sys.stderr)  # task, then its traceback (if it tells more)
            return 1
        if problem := next(filter(None, map(filesystem_problem, _walk(e))), None):  # a full disk, a read-only folder
            print(f"error: {problem}", file=sys.stderr)
            return 2
        raise
    if result.history:
        Console().print(result.table())
    if result.incomplete:
        print(f"incomplete: the run finished but its held-out measurement is not: {'; '.join(result.incomplete)}; "
              f"grade them again with python -m dynalize.eval --run {cfg.run_dir} --bench rubric", file=sys.stderr)
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


def _walk(e: BaseException) -> typing.Iterator[BaseException]:
    """`e` and every exception inside it, depth first (task groups wrap what they raise)."""
    yield e
    for inner in getattr(e, "exceptions", ()):
        yield from _walk(inner)


def exit_process(status: int) -> None:
    """End the process with `status`. A rank of a multi-process launch (`WORLD_SIZE` > 1) whose run
    is over (every file written and closed, the process group destroyed) leaves at once, skipping
    the interpreter's teardown: a two-process CPU run was seen dying by SIGABRT after its last
    line was printed (1 launch in about 40 under load), which points at that teardown of torch's
    and gloo's threads; the cause is not proven (docs/reliability.md)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    exit_process(main())
