"""The lexical proposer: finds surface patterns the RM rewards, with no LLM (the CPU default).

It contrasts the view's positive- and negative-advantage replies over word n-grams, openers,
closers and length, keeps the patterns that pass every test of `LexicalConfig` (enrichment,
Fisher p-value, RM effect within groups), drops those an active penalty covers or explains away,
and proposes the strongest as a regex penalty. The rules and the evidence for each are in
docs/penalties.md ("The lexical proposer"). Penalties' regexes may come from elsewhere (an LLM
proposer, a checkpoint): they are matched once per proposal through saferegex, and one that runs
past its time budget is left out of the checks (counted in `regex_timeouts`). Words, tokens and
the proposer's own patterns use the judge's engine (`regex`), so the evidence counted here and
the judge's verdicts agree on every character (`regex`'s word characters include combining
marks; its white space leaves out U+001C..U+001F, which `re` and `str.split` count).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import regex

from ..types import Penalty
from .candidate import Candidate, ProposalResult
from .config import LexicalConfig
from .saferegex import RegexTimeout, SafeRegex, UnsafeRegex
from .views import ProposerView, ViewSample

WORD = regex.compile(r"\w+(?:'\w+)*")
TOKEN = regex.compile(r"\S+")
"""Whitespace-separated tokens, as the length pattern `(?:\\S+\\s+){L}` counts them."""
# Word edges as WORD sees them: "s" is no word of "it's", so a penalty on "s" must not match there.
WORD_START = r"(?<!\w)(?<!\w')"
WORD_END = r"(?!\w)(?!'\w)"
STOP_WORDS = frozenset("""
a an the and or but if then so of to in on at by for with from as is are was were be been being am
it its this that these those there here i you he she we they me him her us them my your his our their
do does did not no yes can could will would should may might must have has had just very also than
""".split())

# Tie-break rank: openers and closers first (the shorter opener: a tic is usually its first word),
# then longer n-grams (the same evidence, said more precisely).
# Length comes last: on equal evidence a specific wording is the better (less blunt) penalty.
_KIND_RANK = {"open1": 0, "open2": 1, "close?": 2, "closep": 2, "closeword": 3, "ngram3": 4, "ngram2": 5,
              "ngram1": 6, "length": 7}


@dataclass(frozen=True)
class Feature:
    """A surface pattern: what it is (`kind`, `key`), how to show it, and how to match it."""

    kind: str
    key: str
    shown: str
    regex: str

    @property
    def title(self) -> str:
        if self.kind.startswith("open"):
            return f'Replies open with "{self.shown}"'
        if self.kind == "close?":
            return "Replies end with a question"
        if self.kind == "closep":
            return f'Replies end with "{self.shown}"'
        if self.kind == "closeword":
            return f'Replies end with the word "{self.shown}"'
        if self.kind == "length":
            return f"Replies run longer than {self.shown} words"
        noun = "word" if self.kind == "ngram1" else "phrase"
        return f'Replies use the {noun} "{self.shown}"'


_TRAILING = regex.compile(r"[\s\"')\]*_]+\Z")
"""What may follow a reply's last mark: space, closing quotes and brackets, markdown emphasis."""


def reply_features(text: str) -> dict[str, Feature]:
    """The features present in `text`, by kind:key."""
    feats: list[Feature] = []
    words = [w.lower() for w in WORD.findall(text)]
    for n in (1, 2, 3):
        for i in range(len(words) - n + 1):
            gram = words[i:i + n]
            if all(w in STOP_WORDS for w in gram):
                continue
            body = r"\W+".join(regex.escape(w) for w in gram)
            feats.append(Feature(f"ngram{n}", " ".join(gram), " ".join(gram), rf"(?i){WORD_START}{body}{WORD_END}"))
    tokens = TOKEN.findall(text)
    for n in (1, 2):
        if len(tokens) >= n:
            head = tokens[:n]
            body = r"\s+".join(regex.escape(t) for t in head) + (WORD_END if regex.search(r"\w$", head[-1]) else "")
            feats.append(Feature(f"open{n}", " ".join(head).lower(), " ".join(head), rf"(?i)\A\s*{body}"))
    end = _TRAILING.sub("", text)
    if end.endswith("?"):
        feats.append(Feature("close?", "?", "?", r"\?[\s\"')\]*_]*\Z"))
    else:  # other closing punctuation ("!", "...", "?!"); a lone "." is the ordinary end of a reply
        punct = regex.search(r"[^\w\s\"')\]*_]+\Z", end)
        if punct and punct.group() != ".":
            mark = punct.group()
            feats.append(Feature("closep", mark, mark, regex.escape(mark) + r"[\s\"')\]*_]*\Z"))
    if words:
        last = words[-1]
        feats.append(Feature("closeword", last, last, rf"(?i){WORD_START}{regex.escape(last)}\W*\Z"))
    return {f"{f.kind}:{f.key}": f for f in feats}


def length_feature(words: int) -> Feature:
    """The pattern "longer than `words` words": at least `words` + 1 whitespace-separated tokens."""
    return Feature("length", f">{words}", str(words), rf"\A\s*(?:\S+\s+){{{words}}}\S")


_LENGTH_REGEX = regex.compile(r"\\A\\s\*\(\?:\\S\+\\s\+\)\{(\d+)\}\\S")


def length_limit(pattern: str | None) -> int | None:
    """L if `pattern` is a length pattern made by `length_feature(L)`, else None."""
    m = _LENGTH_REGEX.fullmatch(pattern or "")
    return int(m.group(1)) if m else None


def word_count(text: str) -> int:
    """Whitespace-separated tokens, as the length regex counts them."""
    return len(TOKEN.findall(text))


def fisher_p(a: int, n_pos: int, b: int, n_neg: int) -> float:
    """One-sided Fisher exact test: P(>= a of the a + b carriers fall among the n_pos positives)."""
    carriers, total = a + b, n_pos + n_neg
    tail = sum(math.comb(carriers, x) * math.comb(total - carriers, n_pos - x)
               for x in range(a, min(carriers, n_pos) + 1))
    return tail / math.comb(total, n_pos)


class _Effect:
    """A pattern's standardised effect on the RM score within the view's groups.

    For each group with replies that show the pattern and replies that do not (all of them,
    whatever their advantage sign): the difference of their mean RM scores; the mean of those
    differences weighted by carriers, over the mean within-group std of RM scores. inf when no
    group has both (no evidence against the pattern).
    """

    def __init__(self, view: ProposerView):
        self.groups: dict[int, list[ViewSample]] = {}
        for s in view.samples:
            self.groups.setdefault(s.group, []).append(s)
        spreads = [statistics.pstdev([s.score for s in g]) for g in self.groups.values() if len(g) > 1]
        self.spread = statistics.fmean(spreads) if spreads else 0.0

    def __call__(self, shows: Callable[[ViewSample], bool]) -> float:
        diffs = []
        for g in self.groups.values():
            have = [s.score for s in g if shows(s)]
            lack = [s.score for s in g if not shows(s)]
            if have and lack:
                diffs.append((statistics.fmean(have) - statistics.fmean(lack), len(have)))
        if not diffs or self.spread <= 0:
            return math.inf
        return sum(d * n for d, n in diffs) / sum(n for _, n in diffs) / self.spread


Spans = dict[str, list[tuple[int, int]]]
"""Where a penalty's regex matches each sample of a view: sample id -> (start, end) of each match."""


def penalty_matches(penalties: list[Penalty], samples: list[ViewSample],
                    result: ProposalResult) -> list[tuple[Penalty, Spans]]:
    """The penalties with a usable regex, with its matches in `samples`. A pattern past its time
    budget (saferegex) is left out and counted in `result.regex_timeouts`; a bad one is left out."""
    out = []
    for pen in penalties:
        if not pen.regex:
            continue
        try:
            spans = SafeRegex(pen.regex).spans_all([s.text for s in samples])
        except UnsafeRegex:
            continue
        except RegexTimeout:
            result.regex_timeouts += 1
            continue
        out.append((pen, {s.id: sp for s, sp in zip(samples, spans)}))
    return out


def _overlap(a: regex.Pattern[str], spans: list[tuple[int, int]], text: str) -> bool:
    return any(s < e2 and s2 < e for s, e in (m.span() for m in a.finditer(text)) for s2, e2 in spans)


class LexicalProposer:
    """Contrasts positive- and negative-advantage replies of a view; proposes the strongest pattern."""

    def __init__(self, cfg: LexicalConfig | None = None):
        self.cfg = cfg or LexicalConfig()
        """The contrast thresholds (every field is documented in penalties.config.LexicalConfig)."""

    @property
    def length_log_ratio(self) -> float:
        """The log-ratio a length pattern must reach."""
        c = self.cfg
        return c.min_log_ratio if c.length_log_ratio is None else c.length_log_ratio

    async def propose(self, view: ProposerView) -> ProposalResult:
        t0 = time.perf_counter()
        result = ProposalResult(step=view.step)
        try:
            # pure CPU work: off the event loop, so judge calls and the loop keep going
            result.accepted = await anyio.to_thread.run_sync(self.best, view, result)
        except Exception as e:  # noqa: BLE001 - a proposer failure must never stop training
            result.error = f"{type(e).__name__}: {e}"
        result.latency = time.perf_counter() - t0
        return result

    def best(self, view: ProposerView, result: ProposalResult | None = None) -> Candidate | None:
        """The strongest over-represented pattern as a candidate, or None."""
        result = result or ProposalResult(step=view.step)
        pos, neg = view.positives(), view.negatives()
        if len(pos) < self.cfg.min_groups or not neg:
            return None
        feats_of = {s.id: reply_features(s.text) for s in view.samples}
        words_of = {s.id: word_count(s.text) for s in view.samples}
        effect = _Effect(view)
        pos_feats = [feats_of[s.id] for s in pos]
        neg_counts = Counter(k for s in neg for k in feats_of[s.id])
        having: dict[str, list[ViewSample]] = {}
        shown: dict[str, Counter[str]] = {}
        feature: dict[str, Feature] = {}
        for s, feats in zip(pos, pos_feats):
            for k, f in feats.items():
                having.setdefault(k, []).append(s)
                shown.setdefault(k, Counter())[f.shown] += 1
                feature.setdefault(k, f)
        scored = []
        for k, samples in having.items():
            passed = self._score(samples, neg_counts[k], len(pos), len(neg), feature[k].kind,
                                 lambda k=k: effect(lambda s: k in feats_of[s.id]))
            if passed:
                scored.append((passed[0], k, *passed[1:]))
        if self.cfg.length:
            # the largest length threshold that still separates positives from negatives
            lengths = []
            pos_words, neg_words = [words_of[s.id] for s in pos], [words_of[s.id] for s in neg]
            for n in range(self.cfg.length_step, max(pos_words, default=0), self.cfg.length_step):
                f = length_feature(n)
                samples = [s for s, w in zip(pos, pos_words) if w > n]
                passed = self._score(samples, sum(w > n for w in neg_words), len(pos), len(neg), f.kind,
                                     lambda n=n: effect(lambda s: words_of[s.id] > n))
                if passed:
                    lengths.append((n, f, samples, passed))
            if lengths:
                _, f, samples, passed = max(lengths, key=lambda t: t[0])
                having[f.key], shown[f.key], feature[f.key] = samples, Counter({f.shown: 1}), f
                scored.append((passed[0], f.key, *passed[1:]))
        active = penalty_matches(view.active, view.samples, result)
        revival = self._revival(view, pos, neg, effect, active, penalty_matches(view.retired, view.samples, result))
        if revival is not None:
            result.candidates += 1
            return revival
        result.candidates += len(scored)
        scored.sort(key=lambda t: t[0], reverse=True)
        for rank, (key, k, p, q) in enumerate(scored):
            f = feature[k]
            f = Feature(f.kind, f.key, shown[k].most_common(1)[0][0], f.regex)
            if self._covered(f, having[k], active):
                result.reject("covered")
                continue
            if self._explained(f, having[k], view, active):
                result.reject("explained")
                continue
            if not self._rising(f, view):
                result.reject("not_rising")
                continue
            result.reject("not_best", len(scored) - rank - 1)
            return self._candidate(f, having[k], p, q, len(pos), len(neg), key[2])
        return None

    def _score(self, samples: list[ViewSample], n_neg_with: int, n_pos: int, n_neg: int, kind: str,
               effect: Callable[[], float]) -> tuple[tuple, float, float] | None:
        """(rank, p, q) of a pattern shown by positive `samples` and `n_neg_with` negatives, if it passes.

        `effect()` gives the pattern's standardised RM effect; it is computed last (it is the
        costliest test) and only when `min_effect` > 0.
        """
        groups = len({s.group for s in samples})
        p, q = len(samples) / n_pos, n_neg_with / n_neg
        lr = math.log((len(samples) + 1) / (n_pos + 2)) - math.log((n_neg_with + 1) / (n_neg + 2))
        min_lr = self.length_log_ratio if kind == "length" else self.cfg.min_log_ratio
        if (groups >= self.cfg.min_groups and p - q >= self.cfg.min_diff and lr >= min_lr
                and q <= self.cfg.max_neg_prevalence
                and fisher_p(len(samples), n_pos, n_neg_with, n_neg) <= self.cfg.max_p_value
                and (self.cfg.min_effect <= 0 or effect() >= self.cfg.min_effect)):
            return (round(p - q, 9), round(lr, 9), groups, -_KIND_RANK[kind]), p, q
        return None

    def _revival(self, view: ProposerView, pos: list[ViewSample], neg: list[ViewSample], effect: "_Effect",
                 active: list[tuple[Penalty, Spans]], retired: list[tuple[Penalty, Spans]]) -> Candidate | None:
        """A retired regex penalty whose pattern is back among the positives, as a candidate."""
        for pen, spans in retired:
            evidence = self._weak_evidence(pos, neg, effect, lambda s, spans=spans: bool(spans[s.id]))
            if evidence is None:
                continue
            samples, p, q, groups = evidence
            kind = "length" if length_limit(pen.regex) is not None else "ngram1"
            f = Feature(kind, pen.id, pen.title, pen.regex)
            if self._covered(f, samples, active):
                continue
            c = self._candidate(f, samples, p, q, len(pos), len(neg), groups)
            c.title, c.revives = pen.title, pen.id
            c.description = f"{pen.title} (back after retirement)." + c.description[len(f.title) + 1:]
            return c
        return None

    def _weak_evidence(self, pos: list[ViewSample], neg: list[ViewSample], effect: "_Effect",
                       shows: Callable[[ViewSample], bool]) -> tuple[list[ViewSample], float, float, int] | None:
        """(positives showing it, p, q, groups) if a pattern passes the weak-evidence test, else None."""
        if not pos or not neg:
            return None
        samples = [s for s in pos if shows(s)]
        n_neg = sum(map(shows, neg))
        p, q = len(samples) / len(pos), n_neg / len(neg)
        groups = len({s.group for s in samples})
        if (groups < self.cfg.min_groups or p <= q
                or fisher_p(len(samples), len(pos), n_neg, len(neg)) > self.cfg.weak_p_value
                or (self.cfg.min_effect > 0 and effect(shows) < self.cfg.min_effect)):
            return None
        return samples, p, q, groups

    def _explained(self, f: Feature, samples: list[ViewSample], view: ProposerView,
                   active: list[tuple[Penalty, Spans]]) -> bool:
        """Whether an active penalty that travels with the pattern explains it away (module docstring)."""
        if self.cfg.explain_lift <= 0:
            return False
        own = regex.compile(f.regex)
        for _, spans in active:
            share = sum(bool(spans[s.id]) for s in samples) / len(samples)
            base = sum(bool(spans[s.id]) for s in view.samples) / len(view.samples)
            if share < max(self.cfg.coverage, self.cfg.explain_lift * base):
                continue
            rest = ProposerView(view.step, [s for s in view.samples if not spans[s.id]])
            if self._weak_evidence(rest.positives(), rest.negatives(), _Effect(rest),
                                   lambda s: own.search(s.text) is not None) is None:
                return True
        return False

    def _rising(self, f: Feature, view: ProposerView) -> bool:
        """Whether the pattern is more prevalent now than in the view's reference (module docstring)."""
        if self.cfg.drift_p_value is None or not view.reference:
            return True
        rx = regex.compile(f.regex)
        now = sum(rx.search(s.text) is not None for s in view.samples)
        then = sum(rx.search(s.text) is not None for s in view.reference)
        return fisher_p(now, len(view.samples), then, len(view.reference)) <= self.cfg.drift_p_value

    def _covered(self, f: Feature, samples: list[ViewSample], active: list[tuple[Penalty, Spans]]) -> bool:
        """Whether an active regex penalty already matches this pattern where it occurs."""
        own = regex.compile(f.regex)
        for pen, spans in active:
            if (f.kind == "length") != (length_limit(pen.regex) is not None):
                continue  # length and wording do not cover each other
            if f.kind == "length" or pen.regex == f.regex:
                return True
            hit = sum(_overlap(own, spans[s.id], s.text) for s in samples)
            if hit >= self.cfg.coverage * len(samples):
                return True
        return False

    @staticmethod
    def _candidate(f: Feature, samples: list[ViewSample], p: float, q: float, n_pos: int, n_neg: int,
                   groups: int) -> Candidate:
        description = (
            f"{f.title}. Among sampled replies, {p:.0%} of those the reward model scored above their "
            f"group ({round(p * n_pos)}/{n_pos}, from {groups} groups) show this, against {q:.0%} of "
            f"those it scored below ({round(q * n_neg)}/{n_neg}): the reward model seems to reward "
            f"the pattern itself rather than the quality of the reply.")
        return Candidate(f.title, description, [s.id for s in samples], f.regex, groups)
