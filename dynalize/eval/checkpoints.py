"""Evaluate a run's saved checkpoints with a benchmark, resumably; or judge saved generations again.

For each selected `checkpoints/step_NNNNNN/policy` of a run (the base policy as step 0 on
request), the protocol runs and two things are written: every item's raw record (prompts,
replies, judge text) in `eval/<bench>_raw/step_NNNNNN.jsonl`, then one summary line in
`eval/<bench>.jsonl` (step, score, CI, per-criterion means, counts, `complete`, settings).

Resuming: a step whose last summary line is complete is skipped. A step with a raw file but no
complete line (judge calls that failed, or a stop between the two writes) is picked up from its
raw file: only what failed is judged (or, for a failed conversation, held) again, as the
benchmarks re-queue failed items. A checkpoint cut off before its raw file is redone whole.

Judging again (`rejudge=LABEL`): the raw files of `eval/<bench>_raw/` are judged anew with
another judge, without generating, into `eval/<bench>@LABEL.jsonl` and `eval/<bench>@LABEL_raw/`.
"""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
import yaml

from ..runlog import append_jsonl, read_jsonl, write_jsonl_atomic
from .common import Benchmark, BenchmarkError
from .policy import PolicySampler, load_policy

log = structlog.get_logger("dynalize.eval")

PolicyLoader = Callable[[str], PolicySampler]
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""A judge label: letters, digits, `_`, `.`, `-` (it names files)."""
JUDGE_IDENTITY = ("engine", "model", "base_url", "path", "sampling")
"""What must not change between an evaluation and its resumption."""


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


def choose(available: list[tuple[int, Any]], every: int | None, steps: list[int] | None, what: str,
           also: set[int] = frozenset()) -> list[tuple[int, Any]]:
    """`select`, refusing (one line) a listed step that is not available (`also`: steps added
    otherwise, e.g. the base policy's 0) and a selection left empty."""
    have = ", ".join(str(s) for s, _ in available) or "none"
    missing = [s for s in steps or [] if s not in {a for a, _ in available} | also]
    if missing:
        raise BenchmarkError(f"--steps: no {what} at step {', '.join(map(str, missing))} (this run has: {have})")
    chosen = select(available, every, steps)
    if not chosen and every and not also:
        raise BenchmarkError(f"--every {every}: no {what} at a multiple of {every} (this run has: {have})")
    return chosen


def eval_paths(run_dir: str | Path, bench: str, label: str | None = None) -> tuple[Path, Path]:
    """(`eval/<bench>.jsonl`, `eval/<bench>_raw/`); with a judge label `eval/<bench>@<label>...`."""
    name = bench if label is None else f"{bench}@{label}"
    root = Path(run_dir) / "eval"
    return root / f"{name}.jsonl", root / f"{name}_raw"


def row_complete(row: dict[str, Any] | None) -> bool:
    """Whether a summary line stands for a finished evaluation (lines written before `complete`
    existed: no judge or patient errors)."""
    if row is None:
        return False
    if "complete" in row:
        return bool(row["complete"])
    counts = row.get("counts") or {}
    return not counts.get("judge_errors") and not counts.get("patient_errors")


def last_rows(path: Path) -> dict[int, dict[str, Any]]:
    """The last summary line of each step."""
    return {int(r["step"]): r for r in read_jsonl(path) if "step" in r} if path.exists() else {}


def done_steps(run_dir: str | Path, bench: str, label: str | None = None) -> set[int]:
    """Steps whose last summary line is complete."""
    return {s for s, r in last_rows(eval_paths(run_dir, bench, label)[0]).items() if row_complete(r)}


def saved_steps(raw_dir: Path) -> list[tuple[int, Path]]:
    """(step, raw file) of every `step_NNNNNN.jsonl` in a raw directory, by step."""
    out = []
    for p in sorted(raw_dir.glob("step_*.jsonl")) if raw_dir.is_dir() else []:
        suffix = p.stem.removeprefix("step_")
        if suffix.isdigit():
            out.append((int(suffix), p))
    return out


async def evaluate_run(run_dir: str | Path, bench: str, protocol: Benchmark, *, every: int | None = None,
                       steps: list[int] | None = None, base: bool = False, redo: bool = False,
                       loader: PolicyLoader | None = None, rejudge: str | None = None,
                       sources: list[tuple[int, str]] | None = None) -> list[dict[str, Any]]:
    """Run `protocol` on each selected checkpoint not evaluated completely yet; return the new rows.

    `loader(path)` builds the policy sampler (default: `load_policy(path)`, the hf engine); it is
    called only when something is generated. `rejudge`: the label of another judge that rates the
    saved generations again (see the module's doc). `sources`: (step, what `loader` loads) to
    evaluate instead of the checkpoints (a run's saved held-out replies, eval.heldout). Stops
    after a checkpoint whose every judge call failed (its row says so); the protocol's endpoints
    are tried before the first checkpoint.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BenchmarkError(f"--run: {run_dir} is not a directory")
    source_summary, source_raw = eval_paths(run_dir, bench)
    if rejudge is not None:
        if not LABEL.fullmatch(rejudge):
            raise BenchmarkError(f"--rejudge: {rejudge!r} is not a label (letters, digits, _ . -)")
        todo: list[tuple[int, Any]] = choose(saved_steps(source_raw), every, steps, "saved generations")
        if not todo:
            raise BenchmarkError(f"--rejudge: {source_raw} holds no saved generations (evaluate the run first)")
    else:
        checkpoints = sources if sources is not None else [(s, str(p)) for s, p in find_checkpoints(run_dir)]
        what = "complete checkpoint" if sources is None else "saved held-out evaluation"
        todo = choose(checkpoints, every, steps, what, {0} if base else set())
        if base:
            todo.insert(0, (0, base_policy(run_dir)))
        if not todo:
            where = "checkpoints/step_*/policy" if sources is None else "rollouts/eval_*.jsonl"
            raise BenchmarkError(f"--run: {run_dir} has no {what} to evaluate ({where})")
    summary_path, raw_dir = eval_paths(run_dir, bench, rejudge)
    previous = last_rows(summary_path)
    skipped = [s for s, _ in todo if not redo and row_complete(previous.get(s))]
    if skipped:
        log.info("eval.resume", bench=bench, already_done=skipped)
    todo = [(s, p) for s, p in todo if s not in skipped]
    sources = last_rows(source_summary)
    if rejudge is not None:
        unfinished = [s for s, _ in todo if not row_complete(sources.get(s))]
        if unfinished:
            log.warning("eval.rejudge_skipped", steps=unfinished,
                        reason=f"no complete line in {source_summary} (finish that evaluation first)")
            if len(unfinished) == len(todo):
                raise BenchmarkError(f"--rejudge: the evaluation of step {', '.join(map(str, unfinished))} in "
                                     f"{source_summary} is not complete: finish it first (rerun it)")
        todo = [(s, p) for s, p in todo if s not in unfinished]
    if not todo:
        return []
    await protocol.check()
    raw_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for step, where in todo:
        own = raw_dir / f"step_{step:06d}.jsonl"
        records, fresh = None, False
        if own.exists() and not redo:
            records = read_jsonl(own)
            _same_judge(previous.get(step), protocol.settings, step)
        elif rejudge is not None:
            records, fresh = read_jsonl(where), True
        log.info("eval.checkpoint", bench=bench, step=step, source=str(where),
                 resume=records is not None and not fresh, rejudge=rejudge)
        t0 = time.perf_counter()
        policy = None
        if records is None or protocol.needs_policy(records):
            if rejudge is not None:
                raise BenchmarkError(f"--rejudge: step {step}: the saved generations are incomplete")
            policy = (loader or load_policy)(where)
        try:
            result = await protocol.run(policy, records, fresh)
        finally:
            if policy is not None:
                await policy.close()
                del policy
                _free_memory()
        write_jsonl_atomic(own, result.raw)
        settings = dict(protocol.settings)
        if rejudge is not None:
            settings.update(rejudge=rejudge, generations=str(source_raw.relative_to(run_dir) / own.name))
        row = {"step": step, "bench": bench, **result.row(), "policy": where if rejudge is None else None,
               "settings": settings, "seconds": round(time.perf_counter() - t0, 2)}
        append_jsonl(summary_path, row)
        rows.append(row)
        log.info("eval.done", bench=bench, step=step, score=result.score, complete=result.complete)
        for w in result.warnings:
            log.error("eval.warning", bench=bench, step=step, message=w, raw=str(own))
        if result.failed and not result.counts.get("scored"):
            log.error("eval.stopped", bench=bench, step=step,
                      reason="no judgement succeeded; rerun the same command to judge again")
            break
    return rows


def _same_judge(row: dict[str, Any] | None, settings: dict[str, Any], step: int) -> None:
    """Refuse to finish a checkpoint with another judge (or patient) than the one it started with."""
    if row is None:
        return
    for role in ("judge", "patient"):
        old, new = (row.get("settings") or {}).get(role), settings.get(role)
        if isinstance(old, dict) and isinstance(new, dict):
            if any(old.get(k) != new.get(k) for k in JUDGE_IDENTITY if k in old):
                who = old.get("model") or old.get("path")
                raise BenchmarkError(f"step {step} was begun with another --{role} ({who}); resume with the same "
                                     f"one, or pass --redo (or --rejudge LABEL)")


def _free_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass
