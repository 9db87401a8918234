"""The lexical proposer: finds surface patterns the RM rewards, with no LLM (the CPU default).

It tests every word n-gram, opener, closer, detector and length limit of the view against the
rewards permuted within groups (and, for a pattern that has taken over, across steps), at one
error rate for them all (`LexicalConfig.fwer`, penalties.discovery), keeps those the RM pays
enough for (`min_effect`), drops those an active penalty covers or explains away, and proposes
the strongest as a regex penalty; its `ProposalResult.evidence` says whether finding nothing
was evidence of nothing. Named detectors (`LexicalConfig.detectors`,
penalties.detectors: repetition, drift off the prompt's topic, unfinished sentences, ...) go
through the same tests beside the word patterns and become penalties that name their detector.
The rules and the evidence for each are in docs/penalties.md ("The lexical proposer", "Named
detectors"). Penalties' regexes may come from elsewhere (an LLM
proposer, a checkpoint): they are matched once per proposal through saferegex, and one that runs
past its time budget on `MATCH_PASSES` passes in a row is left out of the checks (each timed-out
pass counted in `regex_timeouts`). Words, tokens and
the proposer's own patterns use the judge's engine (`regex`), so the evidence counted here and
the judge's verdicts agree on every character (`regex`'s word characters include combining
marks; its white space leaves out U+001C..U+001F, which `re` and `str.split` count).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import anyio
import numpy as np
import regex

from ..types import Penalty
from .candidate import Candidate, ProposalResult
from .config import LexicalConfig
from .detectors import DETECTORS, Detector, detector
from .discovery import Trial, decide, length_choice
from .evidence import Effect, Held, fisher_p, net_of
from .relevance import topical_counts
from ..judge.saferegex import RegexTimeout, SafeRegex, UnsafeRegex
from .forms import FORMS, form_feature
from .permutation import group_index, whole_groups
from .process import ProposerProcess
from .surface import (KIND_RANK, Feature, length_feature, length_limit, longest_reply, short_feature, view_features,
                      word_count)
from .views import ProposerView, ViewSample, distinct_reference, per_reply, prompt_group, rollout_id

Spans = dict[str, list[list[tuple[int, int]]]]
"""Where a penalty's regex matches each sample of a view: sample id -> for each of its replies
(`ViewSample.parts`), the (start, end) of each match."""


MATCH_PASSES = 3
"""Passes a penalty's regex gets over a view before it is left out for running past its budget: a
pass that timed out once may have been slowed by the machine, and leaving an active penalty out
lets its own pattern be proposed again."""


def penalty_matches(penalties: list[Penalty], samples: list[ViewSample],
                    result: ProposalResult) -> list[tuple[Penalty, Spans]]:
    """The penalties with a usable regex, with its matches in `samples`. A pattern past its time
    budget (saferegex) on `MATCH_PASSES` passes in a row is left out, each timed-out pass counted in
    `result.regex_timeouts`; a bad one is left out."""
    texts = [t for s in samples for t in s.parts]
    out = []
    for pen in penalties:
        if not pen.regex:
            continue
        try:
            rx = SafeRegex(pen.regex)
        except UnsafeRegex:
            continue
        for _ in range(MATCH_PASSES):
            try:
                found = iter(rx.spans_all(texts))
            except RegexTimeout:
                result.regex_timeouts += 1
                continue
            out.append((pen, {s.id: [next(found) for _ in s.parts] for s in samples}))
            break
    return out


def read_at_most(samples: list[ViewSample], most: int, key: str) -> list[ViewSample]:
    """`samples`, or past `most` of them a seeded draw (`key`) of their whole groups within it, in order."""
    if len(samples) <= most:
        return samples
    return [samples[i] for i in whole_groups(group_index([s.group for s in samples]), most, key)]


def _shows(spans: Spans, s: ViewSample) -> bool:
    return any(spans[s.id])


def _dose(spans: Spans, s: ViewSample) -> int:
    """How many times a penalty's regex matches the sample's replies."""
    return sum(map(len, spans[s.id]))


def _search(rx: regex.Pattern[str], s: ViewSample) -> bool:
    return any(rx.search(t) is not None for t in s.parts)


Shows = Callable[[ViewSample], bool]
"""Whether a sample shows a pattern (any of its replies)."""

Dose = Callable[[ViewSample], int]
"""How much of a pattern a sample shows: its matches for an active regex penalty, else 0 or 1."""

DOSE_LEVELS = 3
"""An active penalty explains a pattern away at each of its doses (matches in the rollout: 1, 2,
3 or more) apart: a reward that pays per occurrence pays for a hack written twice, and what marks
the second occurrence ("... to say here. There is a lot to say ...") is that hack, not another."""


def _has_contexts(samples: list[ViewSample]) -> bool:
    """Whether every reply of `samples` comes with the conversation it answers."""
    return all(len(s.contexts) == len(s.parts) and None not in s.contexts for s in samples)


class _Detections:
    """Which samples a detector flags (any reply), each decided once per proposal."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, int], bool] = {}

    def shows(self, d: Detector) -> Shows:
        def shows(s: ViewSample) -> bool:
            key = (d.name, id(s))
            if key not in self._memo:
                ctxs = s.contexts if len(s.contexts) == len(s.parts) else [None] * len(s.parts)
                self._memo[key] = any(d(part, ctx) for part, ctx in zip(s.parts, ctxs))
            return self._memo[key]
        return shows


def _contained(f: Feature, features: dict[str, Feature]) -> list[Feature]:
    """The words and shorter phrases of phrase `f` that are features of this view."""
    if not f.kind.startswith("ngram") or f.kind == "ngram1":
        return []
    words = f.key.split()
    subs = {" ".join(words[i:i + n]) for n in range(1, len(words)) for i in range(len(words) - n + 1)}
    return [features[k] for k in (f"ngram{len(g.split())}:{g}" for g in sorted(subs)) if k in features]


def _overlap(a: regex.Pattern[str], spans: list[list[tuple[int, int]]], parts: list[str]) -> bool:
    return any(s < e2 and s2 < e for text, where in zip(parts, spans)
               for s, e in (m.span() for m in a.finditer(text)) for s2, e2 in where)


class LexicalProposer:
    """Contrasts positive- and negative-advantage replies of a view; proposes the strongest pattern."""

    def __init__(self, cfg: LexicalConfig | None = None, accept: Callable[[Candidate], bool] | None = None):
        self.cfg = cfg or LexicalConfig()
        """The contrast thresholds (every field is documented in penalties.config.LexicalConfig)."""
        self.detectors = [detector(name) for name in dict.fromkeys(self.cfg.detectors)]
        """The named detectors tested beside word patterns (ValueError on an unknown name)."""
        self.accept = accept
        """A last veto on each candidate that passed every test, in rank order (None: none). For
        analysis only, e.g. a benchmark's oracle that blocks penalties matching no planted
        feature to measure what false penalties cost; in a run only the reward's confirmation sets it
        (penalties.witness). With `runs_in: process` it is still asked here, in this process."""
        self.process: ProposerProcess | None = ProposerProcess() if self.cfg.runs_in == "process" else None
        """With `runs_in: process`, the worker process `best` runs in (penalties.process)."""

    async def propose(self, view: ProposerView) -> ProposalResult:
        t0 = time.perf_counter()
        result = ProposalResult(step=view.step)
        try:
            # pure CPU work: off the event loop, so judge calls and the loop keep going
            if self.process is None:
                result.accepted = await anyio.to_thread.run_sync(self.best, view, result)
            else:
                result = await anyio.to_thread.run_sync(self.process.best, self.cfg, view, self.accept)
        except Exception as e:  # noqa: BLE001 - a proposer failure must never stop training
            result.error = f"{type(e).__name__}: {e}"
        result.latency = time.perf_counter() - t0
        return result

    def best(self, view: ProposerView, result: ProposalResult | None = None) -> Candidate | None:
        """The strongest pattern the reward pays for (at the configured error rate) as a candidate,
        or None; `result.evidence` says whether None is evidence of no hack."""
        result = result or ProposalResult(step=view.step)
        view = distinct_reference(view)
        view = self._within_budget(view, result)
        if self.cfg.unit == "reply":
            view = per_reply(view)
        pos, neg = view.positives(), view.negatives()
        if not view.samples:
            result.evidence, result.evidence_reason = "insufficient", "no rollout to read"
            return None
        everyone = view.samples + view.reference
        words_of = {s.id: longest_reply(s.parts) for s in everyone}  # "longer than L": any reply
        size_of = {s.id: sum(map(word_count, s.parts)) for s in everyone}  # what length-adjusting holds fixed
        relevance = self._relevance(view)
        held = Held(size_of if self.cfg.length_adjusted else None, relevance)  # what the effect test holds fixed
        effect = Effect(view.samples, *held)
        table = view_features(view.samples, view.reference, self.cfg.min_groups, prompt_group)
        feats_of, feature, shown, now, then = table.keys, table.features, table.shown, table.now, table.then

        def tested(k: str, f: Feature, shows: Shows) -> Trial:
            return Trial(k, f, shows, now.get(k) or [i for i, s in enumerate(view.samples) if shows(s)],
                           then.get(k) or [i for i, s in enumerate(view.reference) if shows(s)])

        candidates = [Trial(k, f, lambda s, k=k: k in feats_of[s.id], now[k], then.get(k, []))
                      for k, f in feature.items()]
        detections = _Detections()
        usable = self._usable_detectors(view, result)
        for d in usable:
            f = Feature("detector", d.name, d.title, "")
            k = f"detector:{d.name}"
            feature[k], shown[k] = f, Counter({f.shown: 1})
            candidates.append(tested(k, f, detections.shows(d)))
        for f in map(form_feature, FORMS if self.cfg.forms else ()):
            k = f"form:{f.key}"
            feature[k], shown[k] = f, Counter({f.shown: 1})
            candidates.append(tested(k, f, lambda s, rx=regex.compile(f.regex): _search(rx, s)))
        limits = list(range(self.cfg.length_step, max(words_of.values(), default=0), self.cfg.length_step)) \
            if self.cfg.length else []
        floor = self._length_floor(view, words_of)
        for n in (n for n in limits if n >= floor):
            f = length_feature(n)
            feature[f.key], shown[f.key] = f, Counter({f.shown: 1})
            candidates.append(tested(f.key, f, lambda s, n=n: words_of[s.id] > n))
        if self.cfg.short:  # "at most L words", below what the untrained policy wrote
            shortest = {s.id: min(map(word_count, s.parts), default=0) for s in everyone}
            for n in (n for n in limits if n < floor):
                f = short_feature(n)
                feature[f.key], shown[f.key] = f, Counter({f.shown: 1})
                candidates.append(tested(f.key, f, lambda s, n=n: 0 < shortest[s.id] <= n))
        active = penalty_matches(view.active, view.samples, result)
        retired = penalty_matches(view.retired, view.samples + view.reference, result)
        comeback = self._retired_trials(view, retired, detections, usable)
        passed, evidence = decide(candidates + [t for t, _ in comeback.values()], view.samples, view.reference,
                                  size_of, self.cfg, view.step, view.proposal, relevance)
        back = [comeback[t.key] for t in passed if t.key in comeback]
        passed = [t for t in passed if t.key not in comeback]
        result.evidence, result.evidence_reason, result.detectable = evidence.state, evidence.reason, evidence.detectable
        if evidence.unnamed is not None:
            result.omnibus = {"p": evidence.unnamed.p, "passed": evidence.unnamed.passed,
                              "replies": evidence.unnamed.replies, "of": len(view.samples)}
            if evidence.unnamed.passed:
                result.unnamed = evidence.unnamed.carriers
        if evidence.unidentifiable:
            result.reject("not_identifiable", len(evidence.unidentifiable))
        worth = [t for t in passed if t.family == "across" or self.cfg.min_effect <= 0
                 or effect(t.shows, **net_of(t.feature.kind, t.feature.key)) >= self.cfg.min_effect]
        lengths = [t for t in worth if t.feature.kind == "length"]
        scored = [t for t in worth if t.feature.kind != "length"]
        if lengths:
            # of the length limits that pass: the strongest, the largest, or the one nearest the onset
            chosen = length_choice(lengths, view.samples, words_of, limits, self.cfg, view.step, floor)
            if chosen is None:
                result.reject("no_onset")
            if chosen is not None:
                scored.append(chosen)
        scored.sort(key=lambda t: (-t.z, KIND_RANK[t.feature.kind]))
        explainers: list[Dose] = [lambda s, spans=spans: _dose(spans, s) for _, spans in active]
        explainers += [detections.shows(DETECTORS[p.detector]) for p in view.active if p.detector in DETECTORS]
        named = {p.detector for p in view.active if p.detector}
        revival = self._revival(back, pos, neg, effect, active, named)
        if revival is not None:
            result.candidates += 1
            return revival
        result.candidates += len(scored)
        waiting: list[Shows] = []  # stronger patterns set aside for not rising yet (explain_by_stronger)
        chosen: list[Candidate] = []  # the best, then its runners-up (`runners_up`)
        for rank, t in enumerate(scored):
            f, k = t.feature, t.key
            having = [s for s in pos if t.shows(s)]
            if shown.get(k):
                f = Feature(f.kind, f.key, shown[k].most_common(1)[0][0], f.regex)
            own = self._shows_of(f, detections)
            if self._covered(f, having, active, named):
                result.reject("covered")
                continue
            causes: list[Dose] = list(explainers)  # a pattern shown or not is a dose of 0 or 1
            if self.cfg.explain_by_stronger:
                causes += [*waiting, *self._broader(f, own, feature, view, detections, held)]
            if having and self._explained(f, own, having, view, causes, held):
                result.reject("explained")
                continue
            if t.family == "within" and not self._rising(f, own, view):
                result.reject("not_rising")
                waiting.append(own)
                continue
            n_neg = sum(map(t.shows, neg))
            p, q = len(having) / max(len(pos), 1), n_neg / max(len(neg), 1)
            groups = len({prompt_group(s) for s in view.samples if t.shows(s)})
            c = self._candidate(f, having or [s for s in view.samples if t.shows(s)], p, q, len(pos), len(neg),
                                groups, t.family)
            if self.accept is not None and not self.accept(c):
                result.reject("vetoed")
                continue
            chosen.append(c)
            if len(chosen) > self.cfg.runners_up:
                result.reject("not_best", len(scored) - rank - 1)
                break
            self._as_live(c, view, detections, active, named, explainers, result)
        result.also = chosen[1:]
        return chosen[0] if chosen else None

    def _as_live(self, c: Candidate, view: ProposerView, detections: _Detections, active: list[tuple[Penalty, Spans]],
                 named: set[str], explainers: list[Dose], result: ProposalResult) -> None:
        """Hold chosen candidate `c` as if it were live for the candidates after it: what it covers
        is covered, what it explains away is explained (as at the next proposal, once it is)."""
        if c.detector is not None:
            named.add(c.detector)
            explainers.append(detections.shows(DETECTORS[c.detector]))
            return
        pen = Penalty(id=f"chosen{len(active)}", title=c.title, description=c.description, regex=c.regex)
        for _, spans in penalty_matches([pen], view.samples, result):
            active.append((pen, spans))
            explainers.append(lambda s, spans=spans: _dose(spans, s))

    def _within_budget(self, view: ProposerView, result: ProposalResult) -> ProposerView:
        """`view` with its samples, and its reference's, each cut to a seeded draw of whole groups past
        `most_rollouts` (what was read is recorded in `result.read`)."""
        most = self.cfg.most_rollouts
        if most is None:
            return view
        samples = read_at_most(view.samples, most, f"proposal-draw:{view.step}")
        reference = read_at_most(view.reference, most, "proposal-draw:reference")
        if len(samples) < len(view.samples) or len(reference) < len(view.reference):
            result.read = {"rollouts": len(samples), "of": len(view.samples),
                           "reference": len(reference), "reference_of": len(view.reference)}
        return replace(view, samples=samples, reference=reference)

    def _relevance(self, view: ProposerView) -> dict[str, int] | None:
        """Per sample of the view and its reference: the words of its prompt's vocabulary it uses
        (penalties.relevance), counted over both; None when `relevance_adjusted` is off."""
        return topical_counts(view.samples, view.reference) if self.cfg.relevance_adjusted else None

    def _length_floor(self, view: ProposerView, words_of: dict[str, int]) -> float:
        """The shortest length limit worth testing: `length_floor`'s quantile of the reference's lengths."""
        if self.cfg.length_floor is None or not view.reference:
            return 0.0
        return float(np.quantile([words_of[s.id] for s in view.reference], self.cfg.length_floor))

    def _usable_detectors(self, view: ProposerView, result: ProposalResult) -> list[Detector]:
        """The configured detectors this view can test: one that reads the conversation needs it
        for every reply (counted in `result.rejected["no_context"]` otherwise)."""
        usable = []
        for d in self.detectors:
            if d.needs_context and not _has_contexts(view.samples):
                result.reject("no_context")
                continue
            usable.append(d)
        return usable

    @staticmethod
    def _shows_of(f: Feature, detections: _Detections) -> Shows:
        """Whether a sample shows pattern `f`: its detector, or its regex in any reply."""
        if f.kind == "detector":
            return detections.shows(DETECTORS[f.key])
        rx = regex.compile(f.regex)
        return lambda s: _search(rx, s)

    def _retired_trials(self, view: ProposerView, retired: list[tuple[Penalty, Spans]], detections: _Detections,
                        usable: list[Detector]) -> dict[str, tuple[Trial, Penalty]]:
        """Each retired penalty's pattern (its regex, or its configured, usable detector) as a trial
        of the proposal's revival family (penalties.discovery, `REVIVAL_SHARE`), keyed `retired:<id>`."""
        on = {d.name: d for d in usable}
        looks: list[tuple[Penalty, Shows, Feature]] = [
            (pen, detections.shows(on[pen.detector]), Feature("detector", pen.detector, pen.title, ""))
            for pen in view.retired if pen.detector in on]
        for pen, spans in retired:
            is_length = length_limit(pen.regex) is not None
            looks.append((pen, lambda s, spans=spans: _shows(spans, s),
                          Feature("length" if is_length else "ngram1", pen.id, pen.title, pen.regex or "")))
        out = {}
        for pen, shows, f in looks:
            key = f"retired:{pen.id}"
            out[key] = (Trial(key, f, shows, [i for i, s in enumerate(view.samples) if shows(s)],
                              [i for i, s in enumerate(view.reference) if shows(s)], retired=True), pen)
        return out

    def _revival(self, back: list[tuple[Trial, Penalty]], pos: list[ViewSample], neg: list[ViewSample],
                 effect: Effect, active: list[tuple[Penalty, Spans]],
                 named: set[str]) -> Candidate | None:
        """A retired penalty whose pattern passed the revival family (`back`, strongest first) and is
        paid at least `min_effect`, not covered by an active penalty, as a candidate that revives it."""
        for trial, pen in back:
            f, shows = trial.feature, trial.shows
            samples = [s for s in pos if shows(s)]
            if not samples or (self.cfg.min_effect > 0
                               and effect(shows, **net_of(f.kind, f.key)) < self.cfg.min_effect):
                continue
            if self._covered(f, samples, active, named):
                continue
            p, q = len(samples) / max(len(pos), 1), sum(map(shows, neg)) / max(len(neg), 1)
            c = self._candidate(f, samples, p, q, len(pos), len(neg), len({prompt_group(s) for s in samples}))
            c.title, c.revives = pen.title, pen.id
            c.description = f"{pen.title} (back after retirement)." + c.description[len(f.title) + 1:]
            return c
        return None

    def _weak_evidence(self, pos: list[ViewSample], neg: list[ViewSample], effect: Effect,
                       shows: Callable[[ViewSample], bool],
                       feature: Feature, p_value: float | None = None) -> tuple[list[ViewSample], float, float, int] | None:
        """(positives showing it, p, q, groups) if a pattern passes the weak-evidence test (Fisher p at most
        `p_value`, default `weak_p_value`), else None."""
        if not pos or not neg:
            return None
        samples = [s for s in pos if shows(s)]
        n_neg = sum(map(shows, neg))
        p, q = len(samples) / len(pos), n_neg / len(neg)
        groups = len({prompt_group(s) for s in samples})
        if (groups < self.cfg.min_groups or p <= q
                or fisher_p(len(samples), len(pos), n_neg, len(neg)) > (p_value or self.cfg.weak_p_value)
                or (self.cfg.min_effect > 0
                    and effect(shows, **net_of(feature.kind, feature.key)) < self.cfg.min_effect)):
            return None
        return samples, p, q, groups

    def _weak_in(self, samples: list[ViewSample], shows: Callable[[ViewSample], bool], held: Held, feature: Feature,
                 p_value: float | None = None) -> bool:
        """Whether a pattern shows weak evidence among `samples` alone (a stratum of the view)."""
        stratum = ProposerView(0, samples)
        return self._weak_evidence(stratum.positives(), stratum.negatives(), Effect(samples, *held), shows,
                                   feature, p_value) is not None

    def _broader(self, f: Feature, own: Shows, features: dict[str, Feature], view: ProposerView,
                 detections: _Detections, held: Held) -> list[Shows]:
        """The words and shorter phrases of phrase `f` that show weak evidence where `f` is absent:
        the RM pays them elsewhere too, so they may be what it pays in `f` (one that only ever
        occurs inside `f` is `f` itself, and explains nothing)."""
        contained = _contained(f, features)
        if not contained:  # not a phrase: nothing to look at, and no stratum to build
            return []
        rest = [s for s in view.samples if not own(s)]
        stratum, effect = ProposerView(0, rest), Effect(rest, *held)  # once, for every word tested
        pos, neg = stratum.positives(), stratum.negatives()
        out = []
        for g in contained:
            shows = self._shows_of(g, detections)
            if self._weak_evidence(pos, neg, effect, shows, g) is not None:
                out.append(shows)
        return out

    def _explained(self, f: Feature, own: Shows, samples: list[ViewSample], view: ProposerView,
                   active: list[Dose], held: Held) -> bool:
        """Whether an active penalty (or, with `explain_by_stronger`, another possible cause) that
        travels with the pattern explains it away: it matches at least `coverage` of the pattern's
        positives, and `explain_lift` times more often than replies at large, and holding it fixed
        (among the replies it does not match, and, with `explain_within`, among those it matches
        once, twice, or `DOSE_LEVELS` times or more) the pattern no longer shows weak evidence on
        any side it occurs on, the sides sharing `weak_p_value` (Bonferroni): one test, one rate."""
        if self.cfg.explain_lift <= 0:
            return False
        for dose in active:
            level = {s.id: min(int(dose(s)), DOSE_LEVELS) for s in view.samples}  # `samples` are among them
            share = sum(level[s.id] > 0 for s in samples) / len(samples)
            base = sum(lv > 0 for lv in level.values()) / len(level)
            if share < max(self.cfg.coverage, self.cfg.explain_lift * base):
                continue
            doses = range(DOSE_LEVELS + 1) if self.cfg.explain_within else (0,)
            strata = [st for st in ([s for s in view.samples if level[s.id] == d] for d in doses) if any(map(own, st))]
            p_value = self.cfg.weak_p_value / max(1, len(strata))  # evidence in any: at weak_p_value over them all
            if not any(self._weak_in(st, own, held, f, p_value) for st in strata):
                return True
        return False

    def _rising(self, f: Feature, own: Shows, view: ProposerView) -> bool:
        """Whether the pattern is more prevalent now than in the view's reference (`drift_p_value`;
        a detector that reads the conversation is not checked against a reference without one)."""
        if self.cfg.drift_p_value is None or not view.reference:
            return True
        if f.kind == "detector" and DETECTORS[f.key].needs_context and not _has_contexts(view.reference):
            return True
        now = sum(map(own, view.samples))
        then = sum(map(own, view.reference))
        return fisher_p(now, len(view.samples), then, len(view.reference)) <= self.cfg.drift_p_value

    def _covered(self, f: Feature, samples: list[ViewSample], active: list[tuple[Penalty, Spans]],
                 named: set[str]) -> bool:
        """Whether an active regex penalty already matches this pattern where it occurs, or (a
        detector) an active penalty names the same detector (`named`)."""
        if f.kind == "detector":
            return f.key in named
        own = regex.compile(f.regex)
        for pen, spans in active:
            if (f.kind == "length") != (length_limit(pen.regex) is not None):
                continue  # length and wording do not cover each other
            if f.kind == "length" or pen.regex == f.regex:
                return True
            hit = sum(_overlap(own, spans[s.id], s.parts) for s in samples)
            if hit >= self.cfg.coverage * len(samples):
                return True
        return False

    @staticmethod
    def _candidate(f: Feature, samples: list[ViewSample], p: float, q: float, n_pos: int, n_neg: int,
                   groups: int, found: str = "within") -> Candidate:
        what = f"{f.title}. {DETECTORS[f.key].description}" if f.kind == "detector" else f"{f.title}."
        if found == "across":
            description = (
                f"{what} It rose from the run's first batches to most sampled replies ({p:.0%} of those "
                f"the reward model scored above their group) while the reward rose with it: the reward "
                f"model seems to reward the pattern itself rather than the quality of the reply.")
        else:
            description = (
                f"{what} Among sampled replies, {p:.0%} of those the reward model scored above their "
                f"group ({round(p * n_pos)}/{n_pos}, from {groups} groups) show this, against {q:.0%} of "
                f"those it scored below ({round(q * n_neg)}/{n_neg}): the reward model seems to reward "
                f"the pattern itself rather than the quality of the reply.")
        refs = list(dict.fromkeys(rollout_id(s.id) for s in samples))
        if f.kind == "detector":
            return Candidate(f.title, description, refs, None, groups, detector=f.key)
        return Candidate(f.title, description, refs, f.regex, groups)
