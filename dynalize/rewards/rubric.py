"""The rubric term: `coef · R̃`, each reply judged against its prompt's own rubric; Rubric Dropout,
POW3R-style weights, and the proxy/gold measurement at evaluation.

Per group (all rollouts of one prompt in one step) the term draws one keep-mask from
SHA256(instance id, step) (`rubrics.dropout`), asks the judge about every reply in one call
covering the whole rubric (`judge_dropped`, the default: the same calls as fixed-rubric training,
so dropout costs no judge calls; or only the kept criteria), and scores each reply with
HealthBench's formula over the kept criteria, with human or reweighted weights. A rollout's value
is the mean over its policy replies (one when single-turn). From the same verdicts it logs the
in-domain *full-rubric* reward (`rubric/full`, human weights, nothing dropped) next to the masked
one (`rubric/masked`), and the mask statistics (`rubric/f`, `rubric/kept_frac`,
`rubric/floor_binds`). The noise control (`rubric.noise.f`, `rubrics.noise`) adds dropout's variance
to each rollout's reward as zero-mean noise instead (`rubric/noise_std`, `rubric_noise`).

At each held-out evaluation (`evaluate`) the term grades the replies on their full rubrics with
the training (proxy) judge and the gold judge (`rubrics.protocol`), and re-grades a fixed set of
early replies with gold, interleaved with the new ones (the reviewers' check, `anchor_gold`).
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..judge.judge import Judge, Judgement
from ..rubrics.config import ReweightConfig, RubricConfig
from ..rubrics.criteria import Criterion, benchmark_score, rubric_from_meta, rubric_score
from ..rubrics.dropout import DropoutSpec, Mask, anneal_factor, fraction_at, full_mask, keep_mask
from ..rubrics.noise import dropout_std, group_noise
from ..rubrics.protocol import Graded, measure, met_rates
from ..rubrics.reweight import Pow3rReweighter, PortReweighter, Reweighter
from ..types import Batch, Message, Rollout
from .base import RewardTerm, TermScores


def rubric_of(rollout: Rollout) -> list[Criterion]:
    """The rollout's rubric, from its prompt's meta (a RubricError names what is wrong)."""
    criteria = rubric_from_meta(rollout.meta)
    if criteria is None:
        raise ValueError(f"prompt {rollout.prompt_id!r} has no rubric (meta['rubric']): the rubric term "
                         f"needs a task whose prompts carry one")
    return criteria


def rubric_key(criteria: Sequence[Criterion]) -> str:
    """A short hash of what a judge is asked (ids and texts): the judge's cache key for a rubric."""
    raw = json.dumps([[c.id, c.text] for c in criteria])
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


def make_reweighter(cfg: ReweightConfig) -> Reweighter | None:
    if cfg.method == "pow3r_port":
        return PortReweighter(cfg.min_factor)
    if cfg.method == "pow3r":
        return Pow3rReweighter(cfg.min_factor, cfg.ema, cfg.category_prefix)
    return None


@dataclass(eq=False)
class _Request:
    """What one `assess` covers: texts judged on one rubric (a group's replies), and whose each is
    ((group, rollout) in the batch)."""

    criteria: list[Criterion]
    texts: list[str] = field(default_factory=list)
    contexts: list[str | None] = field(default_factory=list)
    """What each text answers as saved (an anchor's), used where `conversations` has None."""
    owners: list[tuple[int, int]] = field(default_factory=list)
    conversations: list[list[Message] | None] = field(default_factory=list)
    """The conversation each text answers: each judge renders its own context from it."""

    def contexts_for(self, judge: Judge) -> list[str | None]:
        convs = self.conversations or [None] * len(self.texts)
        ctxs = self.contexts or [None] * len(self.texts)
        return [judge.context_of(c) if c is not None else x for c, x in zip(convs, ctxs)]


class RubricTerm(RewardTerm):
    """Rubric rewards for one run. Records per rollout `rubric_verdicts` (one dict per reply),
    `rubric_dropped` (criteria the group's mask dropped), `rubric_score` (R̃, the mean over its
    replies), `rubric_full` (R on the full rubric, or None) and `rubric_failed`."""

    name = "rubric"

    def __init__(self, cfg: RubricConfig, judge: Judge, gold: Judge | None = None, *, steps: int):
        self.cfg = cfg
        d = cfg.dropout
        self.spec = DropoutSpec(f=d.f, min_keep=d.min_keep, protected_ids=frozenset(d.protected_ids),
                                protected_tags=frozenset(d.protected_tags), tag_rates=dict(d.tag_rates),
                                id_rates=dict(d.id_rates))
        self.dropping = d.active
        self.anneal_steps = d.anneal_steps or steps
        self.judge, self.gold = judge, gold
        self.reweighter = make_reweighter(cfg.reweight)
        self.anchors: list[dict[str, Any]] = []
        """The reviewers' check: early eval replies with their first gold verdicts, re-graded at every evaluation."""
        self.totals: dict[str, float] = {}
        self._step: dict[str, float] = {}
        self._noise_stds: list[float] = []

    def not_rescorable(self) -> str | None:
        return ("the rubric term cannot score edited replies (its judge's verdicts are asked per step, under the "
                "step's dropout mask)")

    # --- training ---------------------------------------------------------------------------------

    def mask(self, criteria: list[Criterion], instance_id: str, step: int) -> Mask:
        """The keep-mask of `instance_id`'s group at `step` (everything when nothing is dropped)."""
        if not self.dropping:
            return full_mask(criteria)
        factor = anneal_factor(step, self.cfg.dropout.schedule, self.anneal_steps)
        return keep_mask(criteria, self.spec, instance_id, step, factor)

    async def score(self, batch: Batch) -> TermScores:
        """Judge every reply once, score it on the group's kept criteria, log the full-rubric reward."""
        groups = batch.groups
        rubrics = [rubric_of(g[0]) for g in groups]
        masks = [self.mask(c, g[0].prompt_id, batch.step) for c, g in zip(rubrics, groups)]
        requests = []
        for gi, (g, criteria, mask) in enumerate(zip(groups, rubrics, masks)):
            asked = criteria if self.cfg.judge_dropped else [c for c in criteria if c.id in mask.kept]
            requests.append(self._request(asked, [(gi, i, r) for i, r in enumerate(g)]))
        judged = await self._assess(self.judge, requests)
        rollouts = batch.rollouts
        values, info, unscored = [], [], []
        masked_scores, full_scores, shifts = [], [], []
        asked_n = failed_n = 0
        decided_replies: list[tuple[list[Criterion], list[dict[str, bool]]]] = []
        for g, criteria, mask, req, judgements in zip(groups, rubrics, masks, requests, judged):
            per_rollout: list[list[Judgement]] = [[] for _ in g]
            for (_, i), j in zip(req.owners, judgements):
                per_rollout[i].append(j)
            asked_n += len(req.texts) * len(req.criteria)
            failed_n += sum(len(j.failed) for j in judgements)
            decided = [j.verdicts for j in judgements if not j.failed]
            decided_replies += [(req.criteria, [v]) for v in decided]
            weights = None
            if self.reweighter is not None and decided:
                weights = self.reweighter.weights(g[0].prompt_id, criteria, decided, mask.kept)
                human = sum(c.weight for c in criteria if c.weight > 0)
                shifts.append(sum(abs(weights[c.id] - c.weight) for c in criteria if c.weight > 0) / (2 * human))
            noise = self._noise(g[0].prompt_id, batch.step, criteria, per_rollout, weights)
            for js, eps in zip(per_rollout, noise):
                failed = set().union(*(j.failed for j in js)) if js else set()
                masked = statistics.fmean(rubric_score(criteria, j.verdicts, mask.kept, weights) for j in js)
                full = None
                if self.cfg.judge_dropped and not failed:
                    full = statistics.fmean(rubric_score(criteria, j.verdicts) for j in js)
                    full_scores.append(full)
                if not failed & mask.kept:
                    masked_scores.append(masked)
                values.append(self.cfg.coef * (masked + eps))
                unknown = bool(failed & mask.kept)  # a kept verdict failed: the reward is unknown
                unscored.append(unknown)
                info.append({"rubric_verdicts": [j.verdicts for j in js],
                             "rubric_dropped": sorted(c.id for c in criteria if c.id not in mask.kept),
                             "rubric_score": None if unknown else masked, "rubric_full": full,
                             "rubric_failed": sorted(failed),
                             **({"rubric_noise": eps} if self.cfg.noise.f > 0 else {})})
        assert len(values) == len(rollouts)
        self._record(batch.step, masks, rubrics, masked_scores, full_scores, shifts, asked_n, failed_n,
                     decided_replies)
        return TermScores(values, info, unscored=unscored)

    def _noise(self, instance_id: str, step: int, criteria: list[Criterion], per_rollout: list[list[Judgement]],
               weights: dict[str, float] | None) -> list[float]:
        """The noise control (`rubric.noise`, rubrics/noise.py): per rollout of one group, dropout's
        variance at `noise.f` as zero-mean noise (0 everywhere when off); logs `rubric/noise_std`."""
        if self.cfg.noise.f <= 0:
            return [0.0] * len(per_rollout)
        verdicts = [None if not js or any(j.failed for j in js) else [j.verdicts for j in js] for js in per_rollout]
        stds = dropout_std(criteria, verdicts, self.cfg.noise.f, weights)
        self._noise_stds += stds
        return group_noise(instance_id, step, stds)

    def _record(self, step: int, masks: list[Mask], rubrics: list[list[Criterion]], masked: list[float],
                full: list[float], shifts: list[float], asked: int, failed: int,
                decided: list[tuple[list[Criterion], list[dict[str, bool]]]]) -> None:
        s = self._step
        if self._noise_stds:
            s["rubric/noise_std"] = statistics.fmean(self._noise_stds)
            self._noise_stds = []
        s["rubric/f"] = fraction_at(self.spec.f, step, self.cfg.dropout.schedule, self.anneal_steps)
        if masks:
            s["rubric/kept_frac"] = statistics.fmean(m.kept_fraction for m in masks)
            s["rubric/floor_binds"] = statistics.fmean(m.floor_binds for m in masks)
            s["rubric/criteria"] = statistics.fmean(len(c) for c in rubrics)
        if masked:
            s["rubric/masked"] = statistics.fmean(masked)
        if full:
            s["rubric/full"] = statistics.fmean(full)
        if shifts:
            s["rubric/weight_shift"] = statistics.fmean(shifts)
        self._count("rubric/verdicts", asked)
        self._count("rubric/failed_verdicts", failed)
        self.judge.window.add(failed, asked)
        s["rubric/failure_rate"] = failed / asked if asked else 0.0
        if decided and self.cfg.judge_dropped:
            [rates] = met_rates(decided, self.cfg.per_criterion_limit)
            s.update({f"rubric/met/{k}": v for k, v in rates.items()})

    def metrics(self) -> dict[str, float]:
        out = {**self._step, **{f"{k}_total": v for k, v in self.totals.items()}}
        out.update(self.judge.stats.metrics("rubric_judge/"))
        self.judge.stats.reset()
        self._step = {}
        return out

    def chat_models(self) -> dict[str, Any]:
        return {"proxy judge": self.judge.chat, "gold judge": self.gold.chat if self.gold else None}

    def stop_reason(self) -> str | None:
        """The judge failed more than `rubric.judge.max_failure_rate` of its verdicts over the last
        `failure_window` judged steps."""
        return self.judge.window.stop_reason("rubric.judge.max_failure_rate", self.judge.last_error)

    # --- evaluation -----------------------------------------------------------------------------

    async def evaluate(self, batch: Batch) -> dict[str, float]:
        """The proxy/gold measurement on held-out replies: full rubrics, human weights. Each reply's
        verdicts and scores are recorded with it (`proxy_verdicts`, `gold_verdicts`, ...)."""
        singles = [_Request(req.criteria, [t], [None], [o], [c]) for gi, g in enumerate(batch.groups)
                   for req in [self._request(rubric_of(g[0]), [(gi, i, r) for i, r in enumerate(g)])]
                   for t, c, o in zip(req.texts, req.conversations, req.owners)]
        proxy = [js[0] for js in await self._assess(self.judge, singles)]
        out_cost = judge_cost("rubric/proxy_judge/", self.judge.stats, len(singles))
        self.judge.stats.reset()  # evaluation calls are not the next training step's
        gold: list[Judgement] | None = None
        anchors: list[_Request] = []
        out: dict[str, float] = dict(out_cost)
        if self.gold is not None:
            anchors = [_Request([Criterion.from_dict(c) for c in a["criteria"]], [a["text"]], [a["context"]],
                                [], [_conversation(a.get("conversation"))]) for a in self.anchors]
            order = _interleave(singles, anchors)  # the reviewers' check: old text among the new
            answers = {id(r): js[0] for r, js in zip(order, await self._assess(self.gold, order))}
            gold = [answers[id(s)] for s in singles]
            if anchors:
                out.update(self._anchor_metrics([answers[id(a)] for a in anchors]))
            elif self.cfg.eval_anchors:
                out.update(self._choose_anchors(singles, gold))
            out.update(judge_cost("rubric/gold_judge/", self.gold.stats, len(order)))
            self.gold.stats.reset()
        golds: list[Judgement | None] = list(gold) if gold is not None else [None] * len(proxy)
        graded = [Graded(s.criteria, p.verdicts, (g or p).verdicts, p.failed | (g.failed if g else set()))
                  for s, p, g in zip(singles, proxy, golds)]
        out["rubric/unscored_proxy"] = float(sum(bool(p.failed) for p in proxy))  # which judge left a reply
        if gold is not None:                                                     # unscored (run.py's exit 4)
            out["rubric/unscored_gold"] = float(sum(bool(g.failed) for g in gold))
        if gold is None:  # proxy only
            m = measure(graded, self.cfg.per_criterion_limit)
            out.update({f"rubric/{k}": v for k, v in m.items() if k in ("replies", "unscored", "proxy", "proxy_raw")
                        or k.startswith("proxy_met/")})
        else:
            out.update({f"rubric/{k}": v for k, v in measure(graded, self.cfg.per_criterion_limit).items()})
        self._record_eval(batch, singles, graded, proxy, gold)
        return out

    def _record_eval(self, batch: Batch, singles: list["_Request"], graded: list[Graded], proxy: list[Judgement],
                     gold: list[Judgement] | None) -> None:
        """Each eval rollout's verdicts and scores, one entry per reply, into its `info`, with the
        ids each judge failed to decide and the rubric itself (what `eval --bench rubric` re-grades)."""
        per: dict[tuple[int, int], list[tuple[Graded, Judgement, Judgement | None]]] = {}
        for k, (s, g) in enumerate(zip(singles, graded)):
            per.setdefault(s.owners[0], []).append((g, proxy[k], gold[k] if gold is not None else None))
        for gi, group in enumerate(batch.groups):
            for i, r in enumerate(group):
                gs = per.get((gi, i), [])
                r.info["rubric_criteria"] = [c.to_dict() for c in rubric_of(r)]
                r.info["proxy_verdicts"] = [dict(g.proxy) for g, _, _ in gs]
                r.info["proxy_failed"] = [sorted(p.failed) for _, p, _ in gs]
                r.info["proxy_score"] = [None if g.failed else rubric_score(g.criteria, g.proxy) for g, _, _ in gs]
                if gold is not None:
                    r.info["gold_verdicts"] = [dict(g.gold) for g, _, _ in gs]
                    r.info["gold_failed"] = [sorted(q.failed) for _, _, q in gs if q is not None]
                    r.info["gold_score"] = [None if g.failed else rubric_score(g.criteria, g.gold) for g, _, _ in gs]

    def _choose_anchors(self, singles: list["_Request"], gold: list[Judgement]) -> dict[str, float]:
        """Keep `eval_anchors` replies of this (first) evaluation, spread evenly, with their gold verdicts."""
        usable = [(s, g) for s, g in zip(singles, gold) if not g.failed]
        k = min(self.cfg.eval_anchors, len(usable))
        picked = [usable[round(n * len(usable) / k)] for n in range(k)] if k else []
        self.anchors = [{"criteria": [c.to_dict() for c in s.criteria], "text": s.texts[0],
                         "context": s.contexts_for(self.gold)[0] if self.gold else None,
                         "conversation": [m.to_dict() for m in s.conversations[0] or []],
                         "gold": dict(g.verdicts)} for s, g in picked]
        return self._anchor_metrics([Judgement(dict(a["gold"])) for a in self.anchors])

    def _anchor_metrics(self, now: list[Judgement]) -> dict[str, float]:
        """Gold's score of the anchors now, and the share of their verdicts that changed since the first."""
        pairs = [(a, j) for a, j in zip(self.anchors, now) if not j.failed]
        if not pairs:
            return {}
        scores = [rubric_score([Criterion.from_dict(c) for c in a["criteria"]], j.verdicts) for a, j in pairs]
        flips = [a["gold"].get(k) != v for a, j in pairs for k, v in j.verdicts.items()]
        return {"rubric/anchor_gold": benchmark_score(scores), "rubric/anchor_flips": statistics.fmean(flips),
                "rubric/anchors": float(len(pairs))}

    # --- internals ------------------------------------------------------------------------------

    def _request(self, criteria: list[Criterion], rollouts: list[tuple[int, int, Rollout]]) -> _Request:
        """Every policy reply of `rollouts` with the conversation it answers (each judge renders it)."""
        req = _Request(criteria)
        for gi, i, r in rollouts:
            for conversation, reply in r.exchanges():
                req.texts.append(reply)
                req.conversations.append(list(conversation))
                req.owners.append((gi, i))
        return req

    async def _assess(self, judge: Judge, requests: list[_Request]) -> list[list[Judgement]]:
        """One `assess` per request, all at once (the judge bounds calls in flight)."""
        out: list[list[Judgement]] = [[] for _ in requests]

        async def one(k: int, req: _Request) -> None:
            out[k] = await judge.assess(req.texts, req.criteria, rubric_key(req.criteria), req.contexts_for(judge))

        async with anyio.create_task_group() as tg:
            for k, req in enumerate(requests):
                if req.texts:
                    tg.start_soon(one, k, req)
        return out

    def _count(self, key: str, n: float = 1) -> None:
        self._step[key] = self._step.get(key, 0.0) + n
        self.totals[key] = self.totals.get(key, 0.0) + n

    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals), "anchors": self.anchors,
                "reweighter": self.reweighter.state_dict() if self.reweighter else {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.totals = dict(state.get("totals", {}))
        self.anchors = list(state.get("anchors", []))
        if self.reweighter is not None:
            self.reweighter.load_state_dict(state.get("reweighter") or {})


def judge_cost(prefix: str, stats: Any, replies: int) -> dict[str, float]:
    """What a judge's evaluation cost: requests (retries and re-asks included) and characters
    sent and received, in all and per reply graded (protocols compare by these)."""
    if not replies:
        return {}
    out = {"requests": float(stats.requests), "prompt_chars": float(stats.prompt_chars),
           "reply_chars": float(stats.reply_chars)}
    out.update({f"{k}_per_reply": v / replies for k, v in list(out.items())})
    return {f"{prefix}{k}": v for k, v in out.items()}


def _conversation(saved: Any) -> list[Message] | None:
    """An anchor's saved conversation (None for anchors saved before conversations were kept)."""
    if not isinstance(saved, list):
        return None
    return [Message(m["role"], m["content"]) for m in saved]


def _interleave(a: list[_Request], b: list[_Request]) -> list[_Request]:
    """a[0], b[0], a[1], b[1], ... then the rest of the longer list."""
    out: list[_Request] = []
    for k in range(max(len(a), len(b))):
        out += a[k:k + 1] + b[k:k + 1]
    return out
