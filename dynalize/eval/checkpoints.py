"""Evaluate a run's saved checkpoints with a benchmark, resumably.

For each selected `checkpoints/step_NNNNNN/policy` of a run (the base policy as step 0 on
request), the protocol runs and two things are written: one summary line in `eval/<bench>.jsonl`
(step, score, CI, per-criterion means, counts, protocol settings) and every item's raw record
(prompts, replies, judge text) in `eval/<bench>_raw/step_NNNNNN.jsonl`. A checkpoint whose line
is already in `eval/<bench>.jsonl` is skipped, so an interrupted evaluation resumes where it
stopped (a checkpoint cut off midway is redone whole).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
import yaml

from ..runlog import append_jsonl, read_jsonl, write_jsonl_atomic
from .common import BenchmarkError, BenchResult
from .policy import PolicySampler, load_policy

log = structlog.get_logger("dynalize.eval")

Protocol = Callable[[PolicySampler], Awaitable[BenchResult]]
PolicyLoader = Callable[[str], PolicySampler]


def find_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, policy directory) of every complete checkpoint, by step."""
    out = []
    for d in sorted((Path(run_dir) / "checkpoints").glob("step_*")):
        suffix = d.name.removeprefix("step_")
        if suffix.isdigit() and (d / "state.json").exists() and (d / "policy" / "config.json").exists():
            out.append((int(suffix), d / "policy"))
    return out


def run_policy_config(run_dir: str | Path) -> dict[str, Any]:
    """The `policy` section of the run's config.yaml ({} when there is none)."""
    cfg_path = Path(run_dir) / "config.yaml"
    if not cfg_path.is_file():
        return {}
    return (yaml.safe_load(cfg_path.read_text()) or {}).get("policy") or {}


def base_policy(run_dir: str | Path) -> str:
    """The policy the run started from (`policy.path` in its config.yaml)."""
    path = run_policy_config(run_dir).get("path")
    if not path:
        raise BenchmarkError(f"--base: {run_dir}/config.yaml names no policy.path to start from")
    return str(path)


def select(checkpoints: list[tuple[int, Path]], every: int | None = None,
           steps: list[int] | None = None) -> list[tuple[int, Path]]:
    """Checkpoints whose step is a multiple of `every`, or listed in `steps` (both filters apply)."""
    out = checkpoints
    if every:
        out = [(s, p) for s, p in out if s % every == 0]
    if steps is not None:
        out = [(s, p) for s, p in out if s in set(steps)]
    return out


def eval_paths(run_dir: str | Path, bench: str) -> tuple[Path, Path]:
    """(`eval/<bench>.jsonl`, `eval/<bench>_raw/`)."""
    root = Path(run_dir) / "eval"
    return root / f"{bench}.jsonl", root / f"{bench}_raw"


def done_steps(run_dir: str | Path, bench: str) -> set[int]:
    path, _ = eval_paths(run_dir, bench)
    return {int(r["step"]) for r in read_jsonl(path) if "step" in r} if path.exists() else set()


async def evaluate_run(run_dir: str | Path, bench: str, protocol: Protocol, *, settings: dict[str, Any],
                       every: int | None = None, steps: list[int] | None = None, base: bool = False,
                       redo: bool = False, loader: PolicyLoader | None = None) -> list[dict[str, Any]]:
    """Run `protocol` on each selected checkpoint not evaluated yet; return the new summary rows.

    `loader(path)` builds the policy sampler (default: `load_policy(path)`, the hf engine).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BenchmarkError(f"--run: {run_dir} is not a directory")
    todo: list[tuple[int, str]] = [(s, str(p)) for s, p in select(find_checkpoints(run_dir), every, steps)]
    if base:
        todo.insert(0, (0, base_policy(run_dir)))
    if not todo:
        raise BenchmarkError(f"--run: {run_dir} has no complete checkpoint to evaluate (checkpoints/step_*/policy)")
    done = set() if redo else done_steps(run_dir, bench)
    skipped = [s for s, _ in todo if s in done]
    if skipped:
        log.info("eval.resume", bench=bench, already_done=skipped)
    summary_path, raw_dir = eval_paths(run_dir, bench)
    raw_dir.mkdir(parents=True, exist_ok=True)
    load = loader or load_policy
    rows = []
    for step, path in todo:
        if step in done:
            continue
        log.info("eval.checkpoint", bench=bench, step=step, policy=path)
        t0 = time.perf_counter()
        policy = load(path)
        try:
            result = await protocol(policy)
        finally:
            await policy.close()
            del policy
            _free_memory()
        write_jsonl_atomic(raw_dir / f"step_{step:06d}.jsonl", result.raw)
        row = {"step": step, "bench": bench, **result.row(), "policy": path, "settings": settings,
               "seconds": round(time.perf_counter() - t0, 2)}
        append_jsonl(summary_path, row)
        rows.append(row)
        log.info("eval.done", bench=bench, step=step, score=result.score)
    return rows


def _free_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass
