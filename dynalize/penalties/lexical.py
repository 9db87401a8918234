"""The lexical proposer: finds surface patterns the RM rewards, with no LLM (the CPU default).

Features of a reply (presence, not counts): word n-grams (n = 1..3, lower-cased; n-grams made
only of stop words are skipped), openers (first one and first two whitespace-separated tokens),
closers (ends with a question mark, or with other closing punctuation than a lone "." such as
"!" or "..."; last word), and length: "longer than L words" (whitespace
tokens), for L on a grid of multiples of `length_step`, of which only the largest L that passes
the tests below competes (the proposer knows no threshold: it reads L off the view's word
counts; the largest passing L penalises only the excess, not the ordinary length of a reply). With P the view's positive-advantage samples and N its negative ones, a feature
present in p_c of P and n_c of N is a candidate when

    it occurs in positives of >= `min_groups` distinct groups,
    prevalence difference  p_c/|P| - n_c/|N|                          >= `min_diff` (0.4),
    smoothed log-ratio     ln((p_c+1)/(|P|+2)) - ln((n_c+1)/(|N|+2))  >= `min_log_ratio` (1.0;
                           `length_log_ratio` for length, if set: "longer than L" is common by
                           construction, so its relative enrichment runs smaller than a word's),
    negative prevalence    n_c/|N|                                     <= `max_neg_prevalence` (0.5),
    one-sided Fisher exact p-value of p_c given p_c + n_c              <= `max_p_value` (5e-4),
    standardised effect on the RM score                                >= `min_effect` (0.8):
        within each group of the view that has replies with and without the pattern (any advantage
        sign), their mean RM scores' difference; averaged over those groups (weighted by carriers)
        and divided by the mean within-group std of RM scores (scale-free, so it means the same on
        any RM; passes when no group has both). Ordinary wording that comes with better replies
        is rewarded a little; a pattern the RM pays for in itself is rewarded a lot,

(the p-value keeps common words from passing by chance in a 32-sample view), and it is not
covered: no active penalty's regex matches over the same spot (an overlapping span) in at least
half of the positives that show it. The best candidate (difference, then log-ratio, then
groups, then the kind: opener (one word before two), closer, longer n-gram, length) becomes a
penalty with a readable title and a case-insensitive regex (for length, `\\A\\s*(?:\\S+\\s+){L}\\S`:
at least L + 1 words). Length and wording are separate families for coverage: a length
candidate is covered by any active length penalty (one at a time: no ratcheting the limit
down), and a length penalty covers no wording (its match spans the reply's first L + 1 words).

Two more checks keep co-travellers and old habits out. Explained away: an active penalty that
matches at least `coverage` of the candidate's positives, and `explain_lift` times more often
than replies at large, may be why the candidate looks rewarded (the words of "What do you think
of it?" travel with the closing question); the candidate is dropped unless it still shows weak
evidence (below) among the replies that penalty does not match. Rising (with `drift_p_value`
set and a reference in the view): the pattern must be more prevalent in the view than in the
run's first batch, one-sided Fisher p <= `drift_p_value`: a hack is something training
amplifies, while wording that came with better replies from the start is the base policy's.

Weak evidence, used there and for revival: positives of `min_groups` groups, more prevalent
among positives than negatives, Fisher p <= `weak_p_value` (0.05) and the same effect test.
Revival: a retired penalty's regex is tested first, on weak evidence (it was shown once
already). The first that passes (and is not covered) is proposed again, under its old title and
regex, naming the penalty it revives.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from ..types import Penalty
from .candidate import Candidate, ProposalResult
from .views import ProposerView, ViewSample

WORD = re.compile(r"\w+(?:'\w+)*")
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


def reply_features(text: str) -> dict[str, Feature]:
    """The features present in `text`, by kind:key."""
    feats: list[Feature] = []
    words = [w.lower() for w in WORD.findall(text)]
    for n in (1, 2, 3):
        for i in range(len(words) - n + 1):
            gram = words[i:i + n]
            if all(w in STOP_WORDS for w in gram):
                continue
            body = r"\W+".join(re.escape(w) for w in gram)
            feats.append(Feature(f"ngram{n}", " ".join(gram), " ".join(gram), rf"(?i){WORD_START}{body}{WORD_END}"))
    tokens = text.split()
    for n in (1, 2):
        if len(tokens) >= n:
            head = tokens[:n]
            body = r"\s+".join(re.escape(t) for t in head) + (WORD_END if re.search(r"\w$", head[-1]) else "")
            feats.append(Feature(f"open{n}", " ".join(head).lower(), " ".join(head), rf"(?i)\A\s*{body}"))
    end = text.rstrip().rstrip("\"')]*_")
    if end.endswith("?"):
        feats.append(Feature("close?", "?", "?", r"\?[\s\"')\]*_]*\Z"))
    else:  # other closing punctuation ("!", "...", "?!"); a lone "." is the ordinary end of a reply
        punct = re.search(r"[^\w\s\"')\]*_]+\Z", end)
        if punct and punct.group() != ".":
            mark = punct.group()
            feats.append(Feature("closep", mark, mark, re.escape(mark) + r"[\s\"')\]*_]*\Z"))
    if words:
        last = words[-1]
        feats.append(Feature("closeword", last, last, rf"(?i){WORD_START}{re.escape(last)}\W*\Z"))
    return {f"{f.kind}:{f.key}": f for f in feats}


def length_feature(words: int) -> Feature:
    """The pattern "longer than `words` words": at least `words` + 1 whitespace-separated tokens."""
    return Feature("length", f">{words}", str(words), rf"\A\s*(?:\S+\s+){{{words}}}\S")


_LENGTH_REGEX = re.compile(r"\\A\\s\*\(\?:\\S\+\\s\+\)\{(\d+)\}\\S")


def length_limit(regex: str | None) -> int | None:
    """L if `regex` is a length pattern made by `length_feature(L)`, else None."""
    m = _LENGTH_REGEX.fullmatch(regex or "")
    return int(m.group(1)) if m else None


def word_count(text: str) -> int:
    """Whitespace-separated tokens, as the length regex counts them."""
    return len(text.split())


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
        spreads = [statistics.pstdev([s.rm_score for s in g]) for g in self.groups.values() if len(g) > 1]
        self.spread = statistics.fmean(spreads) if spreads else 0.0

    def __call__(self, shows: Callable[[ViewSample], bool]) -> float:
        diffs = []
        for g in self.groups.values():
            have = [s.rm_score for s in g if shows(s)]
            lack = [s.rm_score for s in g if not shows(s)]
            if have and lack:
                diffs.append((statistics.fmean(have) - statistics.fmean(lack), len(have)))
        if not diffs or self.spread <= 0:
            return math.inf
        return sum(d * n for d, n in diffs) / sum(n for _, n in diffs) / self.spread


def _compiled(penalties: list[Penalty]) -> list[tuple[Penalty, re.Pattern[str]]]:
    """The penalties that have a regex that compiles, with it."""
    out = []
    for pen in penalties:
        if pen.regex:
            try:
                out.append((pen, re.compile(pen.regex)))
            except re.error:
                continue
    return out


def _overlap(a: re.Pattern[str], b: re.Pattern[str], text: str) -> bool:
    spans = [m.span() for m in b.finditer(text)]
    return any(s < e2 and s2 < e for s, e in (m.span() for m in a.finditer(text)) for s2, e2 in spans)


class LexicalProposer:
    """Contrasts positive- and negative-advantage replies of a view; proposes the strongest pattern."""

    def __init__(self, *, min_groups: int = 2, min_diff: float = 0.4, min_log_ratio: float = 1.0,
                 max_neg_prevalence: float = 0.5, max_p_value: float = 5e-4, coverage: float = 0.5,
                 length: bool = True, length_step: int = 5, min_effect: float = 0.8,
                 weak_p_value: float = 0.05, explain_lift: float = 1.5, drift_p_value: float | None = None,
                 length_log_ratio: float | None = None):
        self.min_groups = min_groups
        self.min_diff = min_diff
        self.min_log_ratio = min_log_ratio
        self.length_log_ratio = min_log_ratio if length_log_ratio is None else length_log_ratio
        self.max_neg_prevalence = max_neg_prevalence
        self.max_p_value = max_p_value
        self.coverage = coverage
        self.length = length
        self.min_effect = min_effect
        self.weak_p_value = weak_p_value
        self.explain_lift = explain_lift
        self.drift_p_value = drift_p_value
        self.length_step = max(1, length_step)

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
        if len(pos) < self.min_groups or not neg:
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
        if self.length:
            # the largest length threshold that still separates positives from negatives
            lengths = []
            pos_words, neg_words = [words_of[s.id] for s in pos], [words_of[s.id] for s in neg]
            for n in range(self.length_step, max(pos_words, default=0), self.length_step):
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
        revival = self._revival(view, pos, neg, effect)
        if revival is not None:
            result.candidates += 1
            return revival
        result.candidates += len(scored)
        scored.sort(key=lambda t: t[0], reverse=True)
        for rank, (key, k, p, q) in enumerate(scored):
            f = feature[k]
            f = Feature(f.kind, f.key, shown[k].most_common(1)[0][0], f.regex)
            if self._covered(f, having[k], view):
                result.reject("covered")
                continue
            if self._explained(f, having[k], view):
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
        min_lr = self.length_log_ratio if kind == "length" else self.min_log_ratio
        if (groups >= self.min_groups and p - q >= self.min_diff and lr >= min_lr
                and q <= self.max_neg_prevalence
                and fisher_p(len(samples), n_pos, n_neg_with, n_neg) <= self.max_p_value
                and (self.min_effect <= 0 or effect() >= self.min_effect)):
            return (round(p - q, 9), round(lr, 9), groups, -_KIND_RANK[kind]), p, q
        return None

    def _revival(self, view: ProposerView, pos: list[ViewSample], neg: list[ViewSample],
                 effect: "_Effect") -> Candidate | None:
        """A retired regex penalty whose pattern is back among the positives, as a candidate."""
        for pen, rx in _compiled(view.retired):
            evidence = self._weak_evidence(pos, neg, effect, lambda s: rx.search(s.text) is not None)
            if evidence is None:
                continue
            samples, p, q, groups = evidence
            kind = "length" if length_limit(pen.regex) is not None else "ngram1"
            f = Feature(kind, pen.id, pen.title, pen.regex)
            if self._covered(f, samples, view):
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
        if (groups < self.min_groups or p <= q
                or fisher_p(len(samples), len(pos), n_neg, len(neg)) > self.weak_p_value
                or (self.min_effect > 0 and effect(shows) < self.min_effect)):
            return None
        return samples, p, q, groups

    def _explained(self, f: Feature, samples: list[ViewSample], view: ProposerView) -> bool:
        """Whether an active penalty that travels with the pattern explains it away (module docstring)."""
        if self.explain_lift <= 0:
            return False
        own = re.compile(f.regex)
        for _, rx in _compiled(view.active):
            share = sum(rx.search(s.text) is not None for s in samples) / len(samples)
            base = sum(rx.search(s.text) is not None for s in view.samples) / len(view.samples)
            if share < max(self.coverage, self.explain_lift * base):
                continue
            rest = ProposerView(view.step, [s for s in view.samples if rx.search(s.text) is None])
            if self._weak_evidence(rest.positives(), rest.negatives(), _Effect(rest),
                                   lambda s: own.search(s.text) is not None) is None:
                return True
        return False

    def _rising(self, f: Feature, view: ProposerView) -> bool:
        """Whether the pattern is more prevalent now than in the view's reference (module docstring)."""
        if self.drift_p_value is None or not view.reference:
            return True
        rx = re.compile(f.regex)
        now = sum(rx.search(s.text) is not None for s in view.samples)
        then = sum(rx.search(s.text) is not None for s in view.reference)
        return fisher_p(now, len(view.samples), then, len(view.reference)) <= self.drift_p_value

    def _covered(self, f: Feature, samples: list[ViewSample], view: ProposerView) -> bool:
        """Whether an active regex penalty already matches this pattern where it occurs."""
        own = re.compile(f.regex)
        for pen, rx in _compiled(view.active):
            if (f.kind == "length") != (length_limit(pen.regex) is not None):
                continue  # length and wording do not cover each other
            if f.kind == "length" or pen.regex == f.regex:
                return True
            hit = sum(_overlap(own, rx, s.text) for s in samples)
            if hit >= self.coverage * len(samples):
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
