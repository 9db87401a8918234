"""`dynalize.train(config, **overrides)`: a run from Python, what `python -m dynalize.run` does.

    import dynalize
    result = dynalize.train("configs/sandbox_dynalize.yaml", steps=40, **{"trainer.lr": 3e-6})
    result.run_dir, result.metrics["reward/mean"], result.summary

`config` is a RunConfig, a dict of its fields or a YAML path (None: dynalize/config.py's
defaults). Overrides are dotted keys (`**{"trainer.lr": 1e-5}`) or whole sections merged into the
config's (`trainer={"lr": 1e-5}`), applied in order. Settings that name code or data may be
Python objects: a `Task` subclass or instance for `task.name`, a reward function for
`reward_model.path` (engine `python`), a predicate for `rubric.judge.predicate`, a
`datasets.Dataset` or a list of dicts for a task's `train_file` / `eval_file`. An object an import
path reaches (a module-level class or function of an importable module) is saved in the run's
config.yaml as `module:name`, so the run resumes from the command line too; any other (a lambda,
an instance, data in memory, code in `__main__`) is held for this call only (dynalize.plugins):
such a run is continued with `dynalize.train(config, resume=RUN_DIR)` given the same objects,
and `python -m dynalize.run --resume` refuses it with one line. Data in memory is named with a
fingerprint of its rows, so a resume given other rows is refused (`task` may not change).

Errors are raised, each alone (never inside an exception group): `ConfigError` (bad input, an
engine misconfigured or unreachable, a reward function's bad scores, naming it and the step),
`RunStopped` (the run stopped itself after a checkpoint), `HookError` (user code raised: the
function and the step; the original is its `__cause__`), anything else from a part that failed.
The CLI maps them to its exit codes. `dynalize.export(run_dir, out)` is `python -m dynalize.export`
(dynalize/export.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog
from pydantic import TypeAdapter, ValidationError
from rich.table import Table

from .caller_state import QUIETED, kept_caller_state, use_root_handler
from .checkpoint import checkpoints, resume_from
from .config import ConfigError, RunConfig, _set_dotted, dump_config, flatten, read_yaml, validate
from .errors import RunStopped
from .folderlock import FolderLock, hold_folder
from .hooks import HookError, leaf_errors
from .plugins import OBJECT_PREFIX, forget_objects, give_object, given_object, import_path, is_given
from .resume import freeze_derived, resume_config, steps_problem
from .runlog import RunDir, move_aside, naming, read_jsonl
from .summary import incomplete_measurements, penalty_rows, summary_rows, summary_table

log = structlog.get_logger("dynalize.run")

PLAIN = (str, int, float, bool, type(None))


@dataclass
class RunResult:
    """What `train` returns: where the run is, its settings, and what it measured."""

    run_dir: Path
    config: RunConfig
    history: list[dict[str, Any]] = field(default_factory=list)
    """metrics.jsonl's rows of the steps this call ran."""
    incomplete: list[str] = field(default_factory=list)
    """What the run's held-out measurement misses (a judge's failed verdicts), one line per judge;
    empty when it is complete (the CLI then exits 0, else 4)."""

    @property
    def metrics(self) -> dict[str, Any]:
        """The last step's metrics ({} when no step ran, e.g. on a process of rank > 0)."""
        return self.history[-1] if self.history else {}

    @property
    def summary(self) -> list[tuple[str, str, str]]:
        """The rows of the summary table the CLI prints: (metric, first, last)."""
        return [*summary_rows(self.history, self.run_dir, self.incomplete), *penalty_rows(self.config)] \
            if self.history else []

    def table(self) -> Table:
        """The summary as a rich Table (`rich.print(result.table())`)."""
        return summary_table(self.config, self.history, self.incomplete)


def train(config: RunConfig | Mapping[str, Any] | str | Path | None = None, /, *,
          resume: str | Path | bool | None = None, overwrite: bool = False, log_level: str | None = "INFO",
          **overrides: Any) -> RunResult:
    """Run the training `config` describes, with `overrides` on top; `resume` (a run directory,
    or True for the config's own) continues a run from its latest intact checkpoint, `overwrite`
    starts afresh in a used run directory (the old one is moved aside). `log_level=None` leaves
    logging as the caller configured it."""
    _check_arguments(resume=resume, overwrite=overwrite, log_level=log_level)
    with kept_caller_state():  # the caller's logging, threads and random state, as they were
        if log_level is not None:
            setup_logging(log_level.upper())
        forget_objects()
        data = _as_tree(config)
        if resume is True:  # the run directory the config names
            resume = str(validate(_store_objects(_apply(_copy(data), overrides.items()))).run_dir)
        cfg = resolve_config(data if config is not None or not resume else None, overrides.items(),
                             resume=resume or None, overwrite=overwrite, merge=True)
        return run(cfg, resume=bool(resume), overwrite=overwrite,
                   base=str(config) if isinstance(config, (str, Path)) else "the config given to dynalize.train")


def _check_arguments(*, resume: Any, overwrite: Any, log_level: Any) -> None:
    """ConfigError (one line) for `train` arguments of the wrong type, before anything runs."""
    if not (resume is None or isinstance(resume, (str, bool, os.PathLike))):
        raise ConfigError(f"config error: dynalize.train: resume must be a run directory (a path), True or None, "
                          f"not {type(resume).__name__} {resume!r:.40}")
    if not isinstance(overwrite, bool):
        raise ConfigError(f"config error: dynalize.train: overwrite must be True or False, not {overwrite!r:.40}")
    if not (log_level is None or isinstance(log_level, str) and log_level.upper() in logging.getLevelNamesMapping()):
        raise ConfigError(f"config error: dynalize.train: log_level must be a level name (DEBUG, INFO, WARNING, "
                          f"ERROR) or None, not {log_level!r:.40}")


def resolve_config(config: Mapping[str, Any] | str | Path | None, overrides: Iterable[tuple[str, Any]] = (), *,
                   resume: str | Path | None = None, overwrite: bool = False, merge: bool = False) -> RunConfig:
    """The run's settings: `config` (else, with `resume`, the run's saved config.yaml) with
    `overrides` applied in order (`merge`: a dict value merges into its section instead of
    replacing it), Python objects stored (see the module doc). With `resume`, the result is checked
    against the saved settings (config.resume_conflict)."""
    if resume is None:
        return _checked(freeze_derived(validate(_store_objects(_apply(_as_tree(config), overrides, merge)))))
    saved = Path(resume) / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"config error: {resume} is not a run directory (no config.yaml)")
    if overwrite:
        raise ConfigError("config error: --resume continues a run and --overwrite replaces it: give one")
    base = _as_tree(saved if config is None else config)
    run_path = Path(resume) if Path(resume).name not in ("", "..") else Path(resume).resolve()
    tree = _store_objects(_apply(base, [*overrides, ("output_dir", str(run_path.parent)),
                                        ("name", run_path.name)], merge))
    return _checked(resume_config(validate(read_yaml(saved)), validate(tree)))


def _as_tree(config: RunConfig | Mapping[str, Any] | str | Path | None) -> dict[str, Any]:
    """The settings as a plain tree of dicts (values, objects among them, kept as they are)."""
    if config is None:
        return {}
    if isinstance(config, RunConfig):
        return config.model_dump()
    if isinstance(config, (str, Path)):
        return read_yaml(config)
    if not isinstance(config, Mapping):
        raise ConfigError(f"config error: dynalize.train takes a RunConfig, a dict or a YAML path, not a "
                          f"{type(config).__name__}")
    return _copy(config)


def _copy(tree: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in tree.items()}


def _apply(tree: dict[str, Any], overrides: Iterable[tuple[str, Any]], merge: bool = True) -> dict[str, Any]:
    """`tree` with each (dotted key, value) set in order; with `merge`, a dict value merges into its section."""
    for key, value in overrides:
        if merge and isinstance(value, Mapping):
            for sub, v in flatten(_copy(value)).items():
                _set_dotted(tree, f"{key}.{sub}", v)
        else:
            _set_dotted(tree, key, value)
    return tree


def _store_objects(tree: dict[str, Any]) -> dict[str, Any]:
    """`tree` with each Python object replaced by its import path, or held (plugins.give_object)
    and named `object:<setting>`; so is a list where the task's settings expect a path (data)."""
    task = tree.get("task") if isinstance(tree.get("task"), dict) else {}
    if "name" in task and not isinstance(task["name"], PLAIN):
        task["name"] = import_path(task["name"]) or give_object("task.name", task["name"])
    args = task.get("args") if isinstance(task.get("args"), dict) else {}
    fields = _task_fields(task.get("name"))
    for name, value in args.items():
        listed = isinstance(value, (list, tuple)) and name in fields and not _accepts(fields[name], value)
        if listed or _is_table(value):  # in-memory data where a path goes
            args[name] = give_object(f"task.args.{name}", value, tag=fingerprint(value))
    _replace(tree, "")
    return tree


def _is_table(value: Any) -> bool:
    """A datasets.Dataset or a pandas DataFrame."""
    return hasattr(value, "_fingerprint") or (hasattr(value, "to_dict") and hasattr(value, "columns"))


def fingerprint(data: Any) -> str:
    """12 hex digits of the SHA-256 of in-memory data's rows (JSON, keys sorted): the same rows,
    the same fingerprint, in any process."""
    rows = data.to_dict("records") if hasattr(data, "to_dict") and hasattr(data, "columns") else data
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, default=str).encode("utf-8") + b"\n")
    return digest.hexdigest()[:12]


def _replace(tree: dict[str, Any], prefix: str) -> None:
    for key, value in tree.items():
        if isinstance(value, dict):
            _replace(value, f"{prefix}{key}.")
        elif isinstance(value, (list, tuple)):
            tree[key] = [v if isinstance(v, (PLAIN, dict, list)) else _stored(f"{prefix}{key}.{i}", v)
                         for i, v in enumerate(value)]
        elif not isinstance(value, PLAIN):
            tree[key] = _stored(prefix + key, value)


def _stored(setting: str, obj: Any) -> str:
    return import_path(obj) or give_object(setting, obj)


def _task_fields(name: Any) -> dict[str, Any]:
    """The task's settings fields (annotations by name); {} when the task does not resolve."""
    from .tasks.base import task_class

    try:
        return {k: f.annotation for k, f in task_class(str(name)).Args.model_fields.items()}
    except (ConfigError, TypeError):
        return {}


def _accepts(annotation: Any, value: Any) -> bool:
    try:
        TypeAdapter(annotation).validate_python(value)
    except (ValidationError, TypeError, ValueError):
        return False
    return True


def _checked(cfg: RunConfig) -> RunConfig:
    """`cfg`, or one line naming a setting that names an object this process was not given
    (a run started from Python, resumed from the command line)."""
    for value in flatten(cfg.model_dump(mode="json")).values():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and v.startswith(OBJECT_PREFIX) and not is_given(v):
                given_object(v)
    return cfg


def run(cfg: RunConfig, *, resume: bool = False, overwrite: bool = False,
        base: str = "the given RunConfig") -> RunResult:
    """Check `cfg` (names, paths, engines; one request to every API-backed model), then run it."""
    from .backends.accelerate import process_state
    from .build import check_config
    from .preflight import preflight

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    check_config(cfg)
    if not process_state().is_main_process:
        follow(cfg)
        return RunResult(cfg.run_dir, cfg)
    with one_error():
        _sync(preflight, cfg)
        history = _sync(anyio.run, train_async, cfg, resume, base, overwrite)
    return RunResult(cfg.run_dir, cfg, history, incomplete_measurements(cfg.run_dir))


@contextmanager
def one_error() -> Iterator[None]:
    """The run's event loop wraps what its tasks raise in (nested) exception groups, which
    `except ConfigError` misses: a group that holds one error (or only errors meant for the
    user, the first of them) is raised as that error."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = list(leaf_errors(group))
        if len(leaves) == 1 or (leaves and all(isinstance(e, (ConfigError, RunStopped, HookError)) for e in leaves)):
            raise leaves[0] from leaves[0].__cause__
        raise


def _sync(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, which runs an event loop of its own: in a thread of its own when this thread
    already runs one (a Jupyter notebook), where a second loop cannot start."""
    try:
        asyncio.get_running_loop()
        in_a_loop = True
    except RuntimeError:
        in_a_loop = False
    if not in_a_loop:  # outside the except block: fn's errors must not chain onto this RuntimeError
        return fn(*args)
    with ThreadPoolExecutor(1, thread_name_prefix="dynalize") as pool:
        return pool.submit(fn, *args).result()


# --- moved from run.py: logging, threads, the run itself, its summary ---------------------------

def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)  # the stderr of the moment
    handler.setFormatter(logging.Formatter("%(message)s"))
    use_root_handler(handler, level)
    for noisy in QUIETED:
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


FOLLOWING: list[Any] = []
"""A follower rank's learner, kept to the end of the process. Torn down earlier (as a temporary
dropped when `serve()` returns), its DDP reducer frees gloo's process group with the GIL held,
which joins gloo's worker thread while that thread waits for the GIL to free the last broadcast's
tensors: a deadlock, seen once in a loaded test run (both threads' native stacks in
docs/reliability.md). The command line's ranks leave with `os._exit` (run.exit_process), so it is
never torn down there."""


def follow(cfg: RunConfig) -> None:
    """Ranks > 0 (`accelerate launch`, `torchrun`): hold a shard of the learner and follow rank 0."""
    from .build import build_learner

    set_torch_threads(cfg.torch_threads)
    learner = build_learner(cfg)
    FOLLOWING.append(learner)
    learner.serve()


async def train_async(cfg: RunConfig, resume: bool, base: str = "the given RunConfig",
                      overwrite: bool = False) -> list[dict[str, Any]]:
    """Run (or with `resume`, continue) the training `cfg` describes (`base`: where its settings
    started, for the log). A new run refuses a directory that holds files unless `overwrite`
    (the old directory is then moved aside). The run folder is locked for this process while it
    runs (dynalize.folderlock): a second run of the same folder stops with FolderInUse."""
    run_dir, cfg = cfg.run_dir, freeze_derived(cfg)
    if problem := RunDir(run_dir).problem():
        raise ConfigError(f"config error: {problem}")
    with hold_folder(run_dir, "run folder") as lock:  # one writer per folder, before any check or write
        return await _train_held(cfg, resume, base, overwrite, lock)


async def _train_held(cfg: RunConfig, resume: bool, base: str, overwrite: bool,
                      lock: FolderLock) -> list[dict[str, Any]]:
    """`train_async` with the run folder locked by this process (`lock`)."""
    from .build import build_parts
    from .loop import Orchestrator

    run_dir = cfg.run_dir
    if problem := RunDir(run_dir).links_out():
        raise ConfigError(f"config error: {problem}")
    if not resume and not overwrite and RunDir(run_dir).holds_run():
        raise ConfigError(f"config error: {run_dir} already holds a run: continue it with --resume {run_dir}, "
                          f"start afresh with --overwrite (the old directory is moved aside), or pick another name=")
    set_torch_threads(cfg.torch_threads)
    parts = build_parts(cfg)
    parts.run.hold(lock)  # every write checks the folder is still the one locked (RunDir.here)
    if overwrite and not resume and parts.run.holds_run():
        moved = lock.replace_aside(move_aside)
        log.warning("overwrite: the earlier run was moved aside", run=str(run_dir), moved_to=str(moved))
    orchestrator = Orchestrator(parts)
    if resume and not checkpoints(parts.run.checkpoints_dir):  # killed before its first checkpoint
        log.warning("resume: no checkpoint yet, so the run starts again from step 0 with its saved config "
                    "(the same seed: the same run)", run=str(run_dir))
        parts.run.truncate(0, 0, _event_logs(parts.terms))
        resume = False
    if resume:
        ckpt, state = resume_from(parts.run.checkpoints_dir, parts.learner, orchestrator.load_state_dict)
        if problem := steps_problem(cfg.steps, orchestrator.next_step):
            raise ConfigError(problem)
        if "eval_rows" not in state and parts.run.eval_path.exists():  # a checkpoint from before eval_rows
            orchestrator.eval_rows = len(read_jsonl(parts.run.eval_path))
        parts.run.truncate(orchestrator.next_step, state.get("eval_rows"), _event_logs(parts.terms))
        log.info("resuming", run=str(run_dir), step=orchestrator.next_step, checkpoint=ckpt.name)
    parts.run.create()
    with naming(run_dir / "config.yaml"):  # a full disk names the file
        dump_config(cfg, run_dir / "config.yaml")
    log.info("run", name=cfg.name, dir=str(run_dir), config=base, task=cfg.task.name, steps=cfg.steps,
             terms=[t.name for t in parts.terms])
    try:
        history = await orchestrator.run()
    finally:
        parts.learner.stop_followers()
    if cfg.export_final:
        from .export import export_policy

        if (root := parts.run.here()) != run_dir:  # moved after its last checkpoint: never into a new folder there
            raise RunStopped(f"{parts.run.moved} (the run finished; its final export was not written: "
                             f"python -m dynalize.export {root} --out {root / 'final'})")
        final = export_policy(run_dir, run_dir / "final", overwrite=True, checkpoint=orchestrator.last_checkpoint)
        log.info("exported the final policy", path=str(final))
    return history


def _event_logs(terms: Iterable[Any]) -> list[str]:
    """The event logs `<name>.jsonl` the run's terms write (a resume trims these, and no other file)."""
    return [t.name for t in terms if t.event_log]
