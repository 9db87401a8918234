"""Preference pairs from a run: clean, well-scored replies over replies that trigger a penalty.

The pair rule (docs/rm_retraining.md): for each training prompt, a *chosen* reply triggers no
penalty and its RM score is above the `percentile` (75th) of that prompt's replies (or, with
`scope: run`, of every reply read); a *rejected* reply to the same prompt triggers at least one
penalty. Up to `pairs_per_prompt` pairs per prompt, each chosen and each rejected reply used
once before any is reused.

Verdicts come from the rollouts' own records (`verdicts`: the penalties active at that step),
or, with `rejudge`, from judging every reply again against every penalty the run ever accepted
(regexes locally, the rest by an LLM judge, as `python -m dynalize.report audit` does). A reply
whose verdict failed (`judge_failed`, `unscored`, or a failed re-judgement) is neither clean nor
penalised: it is skipped and counted. A multi-turn rollout's recorded verdicts cover the whole
rollout, so a penalised one cannot say which reply triggered: its replies are skipped and
counted unless `rejudge` judges each reply.

A unit is one policy reply with the conversation before it; replies to the same conversation
(for single-turn tasks: the same prompt) are compared. With `dedup`, a reply text counts once
per prompt (RM score averaged over its copies, penalties pooled).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

from ..analysis.audit import live_copy, row_exchanges
from ..analysis.penalties import penalty_history
from ..analysis.runs import ReportError, Run
from ..errors import ConfigError
from ..judge.judge import Judge
from ..judge.prompting import transcript
from ..runlog import read_jsonl
from ..types import Message, Penalty
from .config import PairsConfig
from .pairfile import Pair

FAILED = "failed"
"""A reply's verdict status when the judge failed to decide it."""
UNATTRIBUTED = "unattributed"
"""A reply of a penalised multi-turn rollout whose recorded verdict names no reply."""


@dataclass
class Reply:
    """One policy reply read from a run, with what was decided about it."""

    prompt_id: str
    context: list[Message]
    text: str
    rm: float | None
    step: int
    penalties: frozenset[str] | str = frozenset()
    """The ids it triggers, or FAILED / UNATTRIBUTED."""
    copies: int = 1

    @property
    def group(self) -> str:
        """Replies with the same key answer the same conversation."""
        return self.prompt_id + "\x00" + json.dumps([m.to_dict() for m in self.context], sort_keys=True)


@dataclass
class PairStats:
    """What building the pairs read, skipped and made (printed by the CLI)."""

    replies: int = 0
    failed: int = 0
    unattributed: int = 0
    no_rm: int = 0
    distinct: int = 0
    prompts: int = 0
    prompts_used: int = 0
    chosen_pool: int = 0
    rejected_pool: int = 0
    pairs: int = 0
    threshold: float | None = None
    coverage: dict[str, int] = field(default_factory=dict)
    """Per penalty id: pairs whose rejected reply triggers it."""
    penalties: dict[str, Penalty] = field(default_factory=dict)


def parse_steps(spec: str | None, available: list[int]) -> list[int]:
    """The steps `spec` selects among `available`: `10-99`, `50-`, `0,5,40-60`; None: all."""
    if spec is None:
        return list(available)
    wanted: set[int] = set()
    try:
        for part in spec.split(","):
            lo, sep, hi = part.strip().partition("-")
            if not sep:
                wanted.add(int(lo))
            else:
                a, b = int(lo), (int(hi) if hi.strip() else max(available, default=0))
                if a > b:
                    raise ValueError
                wanted.update(range(a, b + 1))
    except ValueError:
        raise ConfigError(f"--steps: expected e.g. 10-99, 50- or 0,5,40-60, got {spec!r}") from None
    chosen = [s for s in available if s in wanted]
    if not chosen:
        raise ConfigError(f"--steps {spec} selects none of the run's rollout steps "
                          f"({min(available)}–{max(available)})")
    return chosen


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation between order statistics (numpy's default)."""
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def replies_of_row(row: dict[str, Any], step: int) -> list[Reply]:
    """Every policy reply of one rollout line, with its RM score and its recorded verdict status."""
    pairs = row_exchanges(row)
    rm = row.get("rm_scores")
    if not (isinstance(rm, list) and len(rm) == len(pairs)):
        total = (row.get("scores") or {}).get("rm", row.get("rm_score"))
        rm = [total] * len(pairs) if len(pairs) == 1 else [None] * len(pairs)
    if row.get("judge_failed") or row.get("unscored"):
        status: frozenset[str] | str = FAILED
    else:
        status = frozenset(pid for pid, hit in (row.get("verdicts") or {}).items() if hit)
        if status and len(pairs) > 1:
            status = UNATTRIBUTED
    return [Reply(str(row.get("prompt_id", "")), context, text, score, step, status)
            for (context, text), score in zip(pairs, rm)]


def merge_copies(replies: list[Reply]) -> list[Reply]:
    """One reply per text within each group: RM score averaged, penalties pooled, first step kept;
    a failed verdict on any copy makes the text failed."""
    by: dict[tuple[str, str], list[Reply]] = defaultdict(list)
    for r in replies:
        by[(r.group, r.text)].append(r)
    out = []
    for copies in by.values():
        first = copies[0]
        statuses = [c.penalties for c in copies]
        if FAILED in statuses or UNATTRIBUTED in statuses:
            status: frozenset[str] | str = FAILED if FAILED in statuses else UNATTRIBUTED
        else:
            status = frozenset().union(*statuses)  # type: ignore[arg-type]
        out.append(Reply(first.prompt_id, first.context, first.text, statistics.fmean(c.rm for c in copies),
                         first.step, status, len(copies)))
    return out


def make_pairs(replies: list[Reply], cfg: PairsConfig, run_name: str = "",
               penalties: dict[str, Penalty] | None = None) -> tuple[list[Pair], PairStats]:
    """The pair rule on replies whose verdicts are known (see the module docstring)."""
    stats = PairStats(replies=len(replies), penalties=dict(penalties or {}))
    stats.no_rm = sum(r.rm is None for r in replies)
    usable = [r for r in replies if r.rm is not None]
    if cfg.dedup:
        usable = merge_copies(usable)
    stats.distinct = len(usable)
    stats.failed = sum(r.penalties == FAILED for r in usable)
    stats.unattributed = sum(r.penalties == UNATTRIBUTED for r in usable)
    judged = [r for r in usable if not isinstance(r.penalties, str)]
    groups: dict[str, list[Reply]] = defaultdict(list)
    for r in judged:
        groups[r.group].append(r)
    stats.prompts = len(groups)
    if cfg.scope == "run" and judged:
        stats.threshold = percentile([r.rm for r in judged], cfg.percentile)
    rng = random.Random(cfg.seed)
    pairs: list[Pair] = []
    coverage: dict[str, int] = {pid: 0 for pid in stats.penalties}
    for key in sorted(groups):
        group = groups[key]
        cut = stats.threshold if cfg.scope == "run" else percentile([r.rm for r in group], cfg.percentile)
        chosen = [r for r in group if not r.penalties and r.rm > cut]
        rejected = [r for r in group if r.penalties]
        stats.chosen_pool += len(chosen)
        stats.rejected_pool += len(rejected)
        if not chosen or not rejected:
            continue
        rng.shuffle(chosen)
        rng.shuffle(rejected)
        if cfg.rejected == "highest":
            rejected.sort(key=lambda r: -r.rm)
        n = min(cfg.pairs_per_prompt, math.lcm(len(chosen), len(rejected)))
        stats.prompts_used += 1
        for i in range(n):
            c, r = chosen[i % len(chosen)], rejected[i % len(rejected)]
            hit = sorted(r.penalties)
            for pid in hit:
                coverage[pid] = coverage.get(pid, 0) + 1
            pairs.append(Pair(list(c.context), c.text, r.text, prompt_id=c.prompt_id, source={
                "run": run_name, "chosen_step": c.step, "chosen_rm": round(c.rm, 6), "rejected_step": r.step,
                "rejected_rm": round(r.rm, 6), "penalties": hit}))
    stats.pairs = len(pairs)
    stats.coverage = coverage
    return pairs, stats


# --- reading a run -------------------------------------------------------------------------------

def read_run_replies(run: Run, steps: list[int],
                     progress: Callable[[int], None] | None = None) -> tuple[list[Reply], int]:
    """Every policy reply of the run's training rollouts at `steps`, and how many rollout lines
    carried recorded verdicts."""
    files = dict(run.rollout_files("step"))
    out: list[Reply] = []
    with_verdicts = 0
    for step in steps:
        for row in read_jsonl(files[step]):
            with_verdicts += "verdicts" in row
            out.extend(replies_of_row(row, step))
        if progress:
            progress(1)
    return out, with_verdicts


async def rejudge(replies: list[Reply], penalties: list[Penalty], judge: Judge, chunk: int = 512,
                  progress: Callable[[int], None] | None = None) -> None:
    """Replace each reply's recorded status by the judge's verdicts on all `penalties` (every one
    marked active); a verdict that fails marks the reply FAILED."""
    live = [live_copy(p) for p in penalties]
    for i in range(0, len(replies), chunk):
        part = replies[i:i + chunk]
        judged = await judge.assess([r.text for r in part], live, buffer_version=0,
                                    contexts=[transcript(r.context) for r in part])
        for r, j in zip(part, judged):
            r.penalties = FAILED if j.failed else frozenset(pid for pid, hit in j.verdicts.items() if hit)
        if progress:
            progress(len(part))


def run_penalties(run: Run) -> dict[str, Penalty]:
    """Every penalty the run ever accepted, by id; a run without any cannot give pairs."""
    found = penalty_history(run).penalties
    if not found:
        raise ReportError(f"{run.path} accepted no penalties (no add event in penalties.jsonl and no buffer in a "
                          f"checkpoint): pairs need penalised replies, from a run with penalties.enabled: true")
    return found


async def pairs_from_run(cfg: PairsConfig, judge: Judge | None = None, bar: Any = None) -> tuple[list[Pair], PairStats]:
    """Read the run, decide every reply's verdicts (recorded, or judged again), apply the pair rule.
    `judge` decides penalties without a regex when re-judging (regexes are matched locally);
    `bar` is a rich Progress. Errors are one line (ReportError / ConfigError)."""
    from ..judge.judge import RegexJudge

    run = Run(cfg.run)
    penalties = run_penalties(run)
    files = dict(run.rollout_files("step"))
    if not files:
        raise ReportError(f"{run.path} has no rollouts/step_*.jsonl files")
    steps = parse_steps(cfg.steps, sorted(files))
    job = bar.add_task("reading rollouts", total=len(steps)) if bar else None
    replies, with_verdicts = read_run_replies(run, steps, (lambda n: bar.advance(job, n)) if bar else None)
    if cfg.rejudge:
        no_regex = [p.id for p in penalties.values() if not p.regex and not p.detector]
        if no_regex and judge is None:
            raise ConfigError(f"--rejudge: {len(no_regex)} of the run's penalties have no regex "
                              f"({', '.join(no_regex[:5])}): pass --judge to judge them")
        job = bar.add_task("judging replies", total=len(replies)) if bar else None
        await rejudge(replies, list(penalties.values()), judge or RegexJudge(),
                      progress=(lambda n: bar.advance(job, n)) if bar else None)
    elif not with_verdicts:
        raise ReportError(f"{run.path}: its rollouts carry no penalty verdicts (a run with penalties.enabled: "
                          f"false?); pass --rejudge to judge them against the penalties it accepted")
    if replies and all(r.rm is None for r in replies):
        raise ReportError(f"{run.path}: its rollouts carry no RM scores (rm_scores / scores.rm)")
    pairs, stats = make_pairs(replies, cfg, run.name, penalties)
    if not pairs:
        raise ReportError(f"no pairs: of {stats.prompts} prompts read, none had both a clean reply above the "
                          f"{cfg.percentile:g}th percentile and a penalised reply ({stats.chosen_pool} clean "
                          f"candidates, {stats.rejected_pool} penalised replies, {stats.failed} failed verdicts"
                          + ("" if cfg.rejudge else "; --rejudge judges every reply against every penalty") + ")")
    return pairs, stats
