"""The proxy/gold measurement: the same replies graded on their full rubrics by two judges.

The *proxy* is the judge the policy trains against; the *gold* judge is a stronger one that the
policy never sees. Over a held-out set (out of distribution: other prompts, other rubrics):

    proxy, gold     benchmark scores (mean of per-reply rubric scores, clipped to [0, 1])
    gap             proxy − gold
    overclaim       over the (reply, positive criterion) pairs the proxy marks met, the share
                    gold marks unmet: credit given without the substance
    missed_pitfalls over the (reply, pitfall) pairs gold marks present, the share the proxy
                    misses: the other way a proxy can be exploited
    per criterion / per tag: met rates under both judges (`<judge>_met/<id>`, `<judge>_met/tag:<tag>`)

Graded verdicts (a level's value in [0, 1], `judge.levels`) count as that much of "met": a met
rate is the mean credit, and overclaim is the proxy's credit gold does not give,
Σ max(0, proxy − gold) / Σ proxy (missed pitfalls likewise); for yes/no verdicts these are the
counts above.

A reply for which either judge failed a verdict is left out of every number (`unscored`):
a failed verdict is not "unmet".
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..judge.levels import Verdict, credit
from .criteria import Criterion, benchmark_score, rubric_score


@dataclass
class Graded:
    """One reply's verdicts under both judges, on its full rubric."""

    criteria: Sequence[Criterion]
    proxy: Mapping[str, Verdict]
    gold: Mapping[str, Verdict]
    failed: set[str] = field(default_factory=set)
    """Criterion ids either judge failed to decide."""


def _rate(hits: float, n: float) -> float:
    return hits / n if n else 0.0


def met_rates(replies: Sequence[tuple[Sequence[Criterion], Sequence[Mapping[str, Verdict]]]],
              per_criterion_limit: int = 64) -> list[dict[str, float]]:
    """Per judge, the met rate of each criterion id and each tag (`<id>`, `tag:<tag>`) over
    `replies`, each (criteria, [verdicts of judge 0, judge 1, ...]). Criterion ids are left out
    when more than `per_criterion_limit` distinct ones occur (ids unique per prompt say nothing
    summed over prompts); tags are always in."""
    n_judges = len(replies[0][1]) if replies else 0
    counts: dict[str, list[float]] = defaultdict(lambda: [0.0] * (1 + n_judges))  # key → [n, met per judge]
    ids: set[str] = set()
    for criteria, verdicts in replies:
        for c in criteria:
            ids.add(c.id)
            for key in [c.id, *(f"tag:{t}" for t in c.tags)]:
                row = counts[key]
                row[0] += 1
                for j, v in enumerate(verdicts):
                    row[1 + j] += credit(v.get(c.id))
    out: list[dict[str, float]] = [{} for _ in range(n_judges)]
    for key, row in sorted(counts.items()):
        if key.startswith("tag:") or len(ids) <= per_criterion_limit:
            for j in range(n_judges):
                out[j][key] = _rate(row[1 + j], row[0])
    return out


def measure(graded: Sequence[Graded], per_criterion_limit: int = 64) -> dict[str, float]:
    """The protocol's numbers for `graded` (see the module docstring). Per-criterion rates are
    reported only when at most `per_criterion_limit` distinct criterion ids occur (datasets whose
    ids are unique per prompt would log thousands); per-tag rates always."""
    scored = [g for g in graded if not g.failed]
    out: dict[str, float] = {"replies": float(len(graded)), "unscored": float(len(graded) - len(scored))}
    if not scored:
        return out
    proxy = [rubric_score(g.criteria, g.proxy) for g in scored]
    gold = [rubric_score(g.criteria, g.gold) for g in scored]
    out["proxy"], out["gold"] = benchmark_score(proxy), benchmark_score(gold)
    out["gap"] = out["proxy"] - out["gold"]
    out["proxy_raw"], out["gold_raw"] = statistics.fmean(proxy), statistics.fmean(gold)
    claimed = overclaimed = present = missed = 0.0
    for g in scored:
        for c in g.criteria:
            p, q = credit(g.proxy.get(c.id)), credit(g.gold.get(c.id))
            if c.weight > 0:
                claimed += p
                overclaimed += max(0.0, p - q)
            if c.weight < 0:
                present += q
                missed += max(0.0, q - p)
    out["overclaim"] = _rate(overclaimed, claimed)
    out["missed_pitfalls"] = _rate(missed, present)
    proxy_rates, gold_rates = met_rates([(g.criteria, [g.proxy, g.gold]) for g in scored], per_criterion_limit)
    out.update({f"proxy_met/{k}": v for k, v in proxy_rates.items()})
    out.update({f"gold_met/{k}": v for k, v in gold_rates.items()})
    return out


JUDGES = (("proxy", "proxy judge (rubric.judge)"), ("gold", "gold judge (rubric.gold_judge)"))
"""The measurement's judges: the key of their `unscored_<key>` column, and how a line names them."""


def missing_verdicts(rows: Sequence[Mapping[str, object]], regraded: Mapping[int, bool] | None = None) -> list[str]:
    """One line per judge whose verdicts are missing from held-out evaluations (eval/task.jsonl rows,
    `rubric/unscored_<judge>` replies of `rubric/replies`), e.g. "the gold judge (rubric.gold_judge)
    failed on 12 of 12 held-out replies at steps 0, 2". Steps that `regraded` marks complete (a later
    `python -m dynalize.eval --bench rubric`) are not missing."""
    done = regraded or {}
    out = []
    for key, name in JUDGES:
        steps, failed, replies = [], 0, 0
        for r in rows:
            step, n = r.get("step", r.get("version")), r.get(f"rubric/unscored_{key}")
            if isinstance(n, int | float) and n > 0 and not done.get(step):  # type: ignore[arg-type]
                steps.append(step)
                failed += int(n)
                replies += int(r.get("rubric/replies", n))  # type: ignore[call-overload]
        if steps:
            out.append(f"the {name} failed on {failed} of {replies} held-out replies at step"
                       f"{'s' if len(steps) > 1 else ''} {', '.join(str(s) for s in steps)}")
    return out
