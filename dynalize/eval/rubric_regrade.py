"""`python -m dynalize.eval --run RUN --bench rubric [--all] [--rejudge LABEL --judge SPEC]`

Grades a rubric run's saved held-out replies (rollouts/eval_NNNNNN.jsonl, with their rubrics and
the verdicts each judge gave during training) again, without generating anything:

- by default with the run's own judges (config.yaml's `rubric.judge`, `rubric.gold_judge`), only
  the replies a judge failed on (a gold judge that was down); `--all` grades every reply anew.
  Written to `RUN/eval/rubric.jsonl` (one line per evaluation step: the proxy/gold measurement,
  `complete`) and `RUN/eval/rubric_raw/step_NNNNNN.jsonl` (every reply with both judges' verdicts);
  once a step is complete there, `python -m dynalize.run` no longer counts it as missing.
- with `--rejudge LABEL --judge SPEC`, by another gold judge (SPEC: a chat model, as for the other
  benchmarks; the prompt, retries and context are the run's `rubric.gold_judge` settings), into
  `RUN/eval/rubric@LABEL.jsonl` and `..._raw/`; the proxy's verdicts are the run's (re-graded ones
  where `eval/rubric_raw/` has them). `python -m dynalize.report rubric RUN` then shows gold Peak /
  End / Final per judge side by side.

Rerun the same command to pick up where it stopped: replies whose verdicts failed are graded
again, the rest kept. Exit status: 0 every step complete; 1 a judge still failed on some replies;
2 bad input or a judge endpoint that does not answer a test request.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import anyio
from pydantic import ValidationError

from ..caller_state import LOG_LEVEL_HELP
from ..backends.config import ChatModelConfig
from ..errors import ConfigError, describe, one_line
from ..judge.judge import Judge
from ..judge.prompting import transcript
from ..rewards.rubric import rubric_key
from ..rubrics.criteria import Criterion, rubric_from_meta
from ..rubrics.protocol import Graded, measure
from ..runlog import read_jsonl, write_jsonl_atomic
from ..types import as_messages, exchanges
from .checkpoints import eval_paths
from .common import BenchmarkError, progress, read_chat_spec
from .models import PROBE, is_local_url


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dynalize.eval --bench rubric", description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="run directory of a rubric run (runs/<name>)")
    ap.add_argument("--bench", required=True, choices=("rubric",), help="rubric (this command)")
    ap.add_argument("--all", action="store_true", help="grade every reply anew, not only those a judge failed on")
    ap.add_argument("--rejudge", metavar="LABEL", help="grade the replies with another gold judge (--judge), "
                                                       "into eval/rubric@LABEL.jsonl")
    ap.add_argument("--judge", help="with --rejudge: the second gold judge's chat model (JSON or YAML/JSON file)")
    ap.add_argument("--steps", help="only these evaluation steps, comma-separated")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--log-level", default="INFO", help=LOG_LEVEL_HELP)
    args = ap.parse_args(argv)
    if bool(args.rejudge) != bool(args.judge):
        ap.error("--rejudge LABEL and --judge SPEC go together (a second gold judge and its name)")
    if args.rejudge and not args.rejudge.replace("-", "").replace("_", "").replace(".", "").isalnum():
        ap.error("--rejudge: a label of letters, digits, '-', '_' or '.'")
    return args


def replies(row: dict[str, Any], context: bool, rubric: list[Criterion]) -> list[dict[str, Any]]:
    """One raw record per policy reply of a saved eval rollout line: what a judge reads and what each
    judge decided then (failed ids included)."""
    prompt = as_messages(row.get("prompt") or [])
    turns = as_messages(row.get("turns") or [{"role": "assistant", "content": r} for r in row.get("replies") or []])
    out = []
    for k, (conversation, text) in enumerate(exchanges(prompt, turns)):
        rec: dict[str, Any] = {"prompt_id": row.get("prompt_id"), "group": row.get("group"), "reply": k,
                               "text": text, "context": transcript(conversation) if context else None,
                               "criteria": [c.to_dict() for c in rubric]}
        for judge in ("proxy", "gold"):
            verdicts = (row.get(f"{judge}_verdicts") or [])[k:k + 1]
            failed = (row.get(f"{judge}_failed") or [])[k:k + 1]
            scores = (row.get(f"{judge}_score") or [])[k:k + 1]
            if verdicts:
                # lines from before `<judge>_failed`: a reply without a score had a failed verdict somewhere
                rec[judge] = verdicts[0]
                rec[f"{judge}_failed"] = failed[0] if failed else ([] if scores and scores[0] is not None
                                                                   else sorted(verdicts[0]))
        out.append(rec)
    return out


def saved_replies(run: Path, step: int, context: bool, prompts: dict[str, list[Criterion]] | None) -> list[dict[str, Any]]:
    """The raw records of evaluation `step` from the run's eval rollouts."""
    out = []
    path = run / "rollouts" / f"eval_{step:06d}.jsonl"
    for n, row in enumerate(read_jsonl(path), 1):
        try:
            if row.get("rubric_criteria"):
                rubric = [Criterion.from_dict(c) for c in row["rubric_criteria"]]
            elif prompts is not None and row.get("prompt_id") in prompts:
                rubric = prompts[row["prompt_id"]]
            else:
                raise BenchmarkError(f"{run}: eval rollout of prompt {row.get('prompt_id')!r} at step {step} has no "
                                     f"rubric, and the task has no such eval prompt")
            out += replies(row, context, rubric)
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # a damaged row: one line naming it
            raise BenchmarkError(f"{path}: rollout {n} is damaged ({describe(e, 160)}): restore the file; "
                                 f"nothing was graded or written") from None
    return out


class Regrader:
    """Grades raw records with a proxy and a gold judge (either may be None: its verdicts are kept)."""

    def __init__(self, proxy: Judge | None, gold: Judge | None, redo: bool, show_progress: bool = True):
        self.proxy, self.gold, self.redo, self.show = proxy, gold, redo, show_progress

    async def grade(self, records: list[dict[str, Any]], step: int) -> None:
        todo = [(name, judge, rec) for name, judge in (("proxy", self.proxy), ("gold", self.gold)) if judge is not None
                for rec in records if self.redo or name not in rec or rec.get(f"{name}_failed")]
        with progress(self.show and bool(todo)) as bar:
            task = bar.add_task(f"step {step}: grading", total=len(todo))

            async def one(judge: Judge, name: str, rec: dict[str, Any]) -> None:
                criteria = [Criterion.from_dict(c) for c in rec["criteria"]]
                [j] = await judge.assess([rec["text"]], criteria, rubric_key(criteria), [rec["context"]])
                rec[name], rec[f"{name}_failed"] = dict(j.verdicts), sorted(j.failed)
                bar.advance(task)

            async with anyio.create_task_group() as tg:
                for name, judge, rec in todo:
                    tg.start_soon(one, judge, name, rec)


def summary(step: int, records: list[dict[str, Any]], per_criterion_limit: int, settings: dict[str, Any]) -> dict[str, Any]:
    """One eval/rubric*.jsonl line: the measurement of `records` as eval/task.jsonl names it."""
    graded = []
    for rec in records:
        criteria = [Criterion.from_dict(c) for c in rec["criteria"]]
        failed = set(rec.get("proxy_failed", [])) | set(rec.get("gold_failed", []))
        if "gold" not in rec:
            failed |= {c.id for c in criteria}
        graded.append(Graded(criteria, rec.get("proxy", {}), rec.get("gold", {}), failed))
    m = {f"rubric/{k}": v for k, v in measure(graded, per_criterion_limit).items()}
    for judge in ("proxy", "gold"):
        m[f"rubric/unscored_{judge}"] = float(sum(bool(r.get(f"{judge}_failed", True)) or judge not in r
                                                 for r in records))
    failed = int(sum(bool(r.get("proxy_failed", True) or r.get("gold_failed", True)) for r in records))
    return {"step": step, **m, "complete": failed == 0, "failed": failed, "settings": settings}


def _judges(cfg: Any, args: argparse.Namespace, domain: str) -> tuple[Judge | None, Judge, dict[str, Any]]:
    from ..build import build_criteria_judge

    r = cfg.rubric
    if args.rejudge:
        spec = read_chat_spec(args.judge, "--judge")
        if spec.get("engine", "openai") == "openai" and "api_key_env" not in spec and is_local_url(spec.get("base_url")):
            spec["api_key_env"] = None  # a local server: no key unless one is named
        try:
            chat = ChatModelConfig.model_validate(spec)
        except ValidationError as e:
            raise BenchmarkError(one_line(e, prefix="--judge")) from None
        base = r.gold_judge or r.judge  # the prompt, retries, context of the run's gold judge
        jcfg = base.model_copy(update={"engine": "llm", "chat": chat})
        gold = build_criteria_judge(jcfg, domain=domain, cache=False, role=f"gold judge {args.rejudge}")
        return None, gold, {"judge": {k: v for k, v in spec.items() if k in ("engine", "model", "base_url", "path")}}
    if r.gold_judge is None:
        raise BenchmarkError(f"{args.run}: the run has no rubric.gold_judge: grade with another one with "
                             f"--rejudge LABEL --judge SPEC")
    proxy = build_criteria_judge(r.judge, domain=domain, role="proxy judge")
    gold = build_criteria_judge(r.gold_judge, domain=domain, cache=False, role="gold judge")
    chat = r.gold_judge.chat
    public = {k: getattr(chat, k) for k in ("engine", "model", "base_url", "path") if chat and getattr(chat, k)}
    return proxy, gold, {"judge": public}


async def _probe(judges: list[Judge]) -> None:
    """One short request to each openai-backed judge, so a dead endpoint stops before any grading."""
    for j in judges:
        if j.chat is None or not hasattr(j.chat, "base_url"):
            continue
        try:
            await j.chat.chat(PROBE, max_tokens=16)
        except Exception as e:  # noqa: BLE001 - reported as one line
            raise BenchmarkError(f"{j.role}: {j.chat.base_url} did not answer a test request "  # type: ignore[attr-defined]
                                 f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


async def regrade(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Grade every selected evaluation step; the summary lines written now."""
    from ..config import load_config
    from ..tasks.base import build_task, task_prompts

    run = Path(args.run)
    if not (run / "config.yaml").is_file():
        raise BenchmarkError(f"{run} is not a run directory (no config.yaml)")
    cfg = load_config(run / "config.yaml")
    if not cfg.rubric.enabled:
        raise BenchmarkError(f"{run}: not a rubric run (rubric.enabled is false)")
    steps = sorted(int(p.stem.removeprefix("eval_")) for p in (run / "rollouts").glob("eval_*.jsonl")
                   if p.stem.removeprefix("eval_").isdigit())
    if args.steps:
        try:
            wanted = {int(s) for s in args.steps.split(",") if s.strip()}
        except ValueError:
            raise BenchmarkError(f"--steps: expected comma-separated integers, got {args.steps!r}") from None
        steps = [s for s in steps if s in wanted]
    if not steps:
        raise BenchmarkError(f"{run}: no saved held-out replies (rollouts/eval_*.jsonl) to grade")
    task = build_task(cfg.task.name, cfg.task.args, cfg.seed)
    prompts = None
    proxy, gold, settings = _judges(cfg, args, task.description)
    await _probe([j for j in (proxy, gold) if j is not None])
    summary_path, raw_dir = eval_paths(run, "rubric", args.rejudge)
    own_raw = eval_paths(run, "rubric")[1]
    grader = Regrader(proxy, gold, args.all, show_progress=not args.no_progress)
    rows = {r["step"]: r for r in read_jsonl(summary_path)} if summary_path.exists() else {}
    written, todo = [], []
    for step in steps:  # every step read (and a damaged one refused) before anything is graded or written
        raw_path = raw_dir / f"step_{step:06d}.jsonl"
        if raw_path.exists():
            records = read_jsonl(raw_path)
        else:
            if prompts is None and any(not r.get("rubric_criteria") for r in read_jsonl(run / "rollouts" / f"eval_{step:06d}.jsonl")):
                prompts = {p.id: rubric_from_meta(p.meta) or [] for p in task_prompts(task, cfg.task.name, "eval")}
            records = saved_replies(run, step, cfg.rubric.judge.context, prompts)
            if args.rejudge:  # a fresh judge: every reply; the proxy's verdicts, re-graded where they were
                regraded = own_raw / f"step_{step:06d}.jsonl"
                if regraded.exists():
                    records = [{**r, **{k: v for k, v in o.items() if k.startswith("proxy")}}
                               for r, o in zip(records, read_jsonl(regraded))]
                for r in records:
                    r.pop("gold", None)
                    r.pop("gold_failed", None)
        todo.append((step, raw_path, records))
    for step, raw_path, records in todo:
        await grader.grade(records, step)
        raw_dir.mkdir(parents=True, exist_ok=True)
        write_jsonl_atomic(raw_path, records)
        rows[step] = summary(step, records, cfg.rubric.per_criterion_limit, settings)
        write_jsonl_atomic(summary_path, [rows[s] for s in sorted(rows)])
        written.append(rows[step])
    return written


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ..run import setup_logging

    setup_logging(args.log_level.upper())
    try:
        rows = anyio.run(regrade, args)
    except (BenchmarkError, ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    name = "rubric" if not args.rejudge else f"rubric@{args.rejudge}"
    path = eval_paths(args.run, "rubric", args.rejudge)[0]
    for r in rows:
        gold, proxy = r.get("rubric/gold"), r.get("rubric/proxy")
        print(f"{name} step {r['step']}: gold {'n/a' if gold is None else f'{gold:.3f}'}, proxy "
              f"{'n/a' if proxy is None else f'{proxy:.3f}'}, {int(r['rubric/replies'] - r['rubric/unscored'])} of "
              f"{int(r['rubric/replies'])} replies scored")
    bad = [r for r in rows if not r["complete"]]
    for r in bad:
        print(f"error: {name} step {r['step']}: a judge failed on {r['failed']} replies; rerun the same command "
              f"to grade them again", file=sys.stderr)
    print(f"written: {path}")
    return 1 if bad else 0
