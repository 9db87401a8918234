"""The lexical proposer: finds surface patterns the RM rewards, with no LLM (the CPU default).

Features of a reply (presence, not counts): word n-grams (n = 1..3, lower-cased; n-grams made
only of stop words are skipped), openers (first one and first two whitespace-separated tokens),
closers (ends with a question mark; last word). With P the view's positive-advantage samples and
N its negative ones, a feature present in p_c of P and n_c of N is a candidate when

    it occurs in positives of >= `min_groups` distinct groups,
    prevalence difference  p_c/|P| - n_c/|N|                          >= `min_diff` (0.4),
    smoothed log-ratio     ln((p_c+1)/(|P|+2)) - ln((n_c+1)/(|N|+2))  >= `min_log_ratio` (1.0),
    negative prevalence    n_c/|N|                                     <= `max_neg_prevalence` (0.5),
    one-sided Fisher exact p-value of p_c given p_c + n_c              <= `max_p_value` (5e-4),

(the p-value keeps common words from passing by chance in a 32-sample view), and it is not
covered: no active penalty's regex matches over the same spot (an overlapping span) in at least
half of the positives that show it. The best candidate (difference, then log-ratio, then
groups, then the kind: opener (one word before two), closer, longer n-gram) becomes a penalty
with a readable title and a case-insensitive regex.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import dataclass

import anyio

from .candidate import Candidate, ProposalResult
from .views import ProposerView, ViewSample

WORD = re.compile(r"\w+(?:'\w+)*")
STOP_WORDS = frozenset("""
a an the and or but if then so of to in on at by for with from as is are was were be been being am
it its this that these those there here i you he she we they me him her us them my your his our their
do does did not no yes can could will would should may might must have has had just very also than
""".split())

# Tie-break rank: openers and closers first (the shorter opener: a tic is usually its first word),
# then longer n-grams (the same evidence, said more precisely).
_KIND_RANK = {"open1": 0, "open2": 1, "close?": 2, "closeword": 3, "ngram3": 4, "ngram2": 5, "ngram1": 6}


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
        if self.kind == "closeword":
            return f'Replies end with the word "{self.shown}"'
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
            feats.append(Feature(f"ngram{n}", " ".join(gram), " ".join(gram), rf"(?i)\b{body}\b"))
    tokens = text.split()
    for n in (1, 2):
        if len(tokens) >= n:
            head = tokens[:n]
            body = r"\s+".join(re.escape(t) for t in head) + (r"\b" if re.search(r"\w$", head[-1]) else "")
            feats.append(Feature(f"open{n}", " ".join(head).lower(), " ".join(head), rf"(?i)\A\s*{body}"))
    end = text.rstrip().rstrip("\"')]*_")
    if end.endswith("?"):
        feats.append(Feature("close?", "?", "?", r"\?[\s\"')\]*_]*\Z"))
    if words:
        last = words[-1]
        feats.append(Feature("closeword", last, last, rf"(?i)\b{re.escape(last)}\W*\Z"))
    return {f"{f.kind}:{f.key}": f for f in feats}


def fisher_p(a: int, n_pos: int, b: int, n_neg: int) -> float:
    """One-sided Fisher exact test: P(>= a of the a + b carriers fall among the n_pos positives)."""
    carriers, total = a + b, n_pos + n_neg
    tail = sum(math.comb(carriers, x) * math.comb(total - carriers, n_pos - x)
               for x in range(a, min(carriers, n_pos) + 1))
    return tail / math.comb(total, n_pos)


def _overlap(a: re.Pattern[str], b: re.Pattern[str], text: str) -> bool:
    spans = [m.span() for m in b.finditer(text)]
    return any(s < e2 and s2 < e for s, e in (m.span() for m in a.finditer(text)) for s2, e2 in spans)


class LexicalProposer:
    """Contrasts positive- and negative-advantage replies of a view; proposes the strongest pattern."""

    def __init__(self, *, min_groups: int = 2, min_diff: float = 0.4, min_log_ratio: float = 1.0,
                 max_neg_prevalence: float = 0.5, max_p_value: float = 5e-4, coverage: float = 0.5):
        self.min_groups = min_groups
        self.min_diff = min_diff
        self.min_log_ratio = min_log_ratio
        self.max_neg_prevalence = max_neg_prevalence
        self.max_p_value = max_p_value
        self.coverage = coverage

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
        pos_feats = [reply_features(s.text) for s in pos]
        neg_counts = Counter(k for s in neg for k in reply_features(s.text))
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
            groups = len({s.group for s in samples})
            p, q = len(samples) / len(pos), neg_counts[k] / len(neg)
            lr = (math.log((len(samples) + 1) / (len(pos) + 2))
                  - math.log((neg_counts[k] + 1) / (len(neg) + 2)))
            if (groups >= self.min_groups and p - q >= self.min_diff and lr >= self.min_log_ratio
                    and q <= self.max_neg_prevalence
                    and fisher_p(len(samples), len(pos), neg_counts[k], len(neg)) <= self.max_p_value):
                rank = (round(p - q, 9), round(lr, 9), groups, -_KIND_RANK[feature[k].kind])
                scored.append((rank, k, p, q))
        result.candidates += len(scored)
        scored.sort(key=lambda t: t[0], reverse=True)
        for rank, (key, k, p, q) in enumerate(scored):
            f = feature[k]
            f = Feature(f.kind, f.key, shown[k].most_common(1)[0][0], f.regex)
            if self._covered(f, having[k], view):
                result.reject("covered")
                continue
            result.reject("not_best", len(scored) - rank - 1)
            return self._candidate(f, having[k], p, q, len(pos), len(neg), key[2])
        return None

    def _covered(self, f: Feature, samples: list[ViewSample], view: ProposerView) -> bool:
        """Whether an active regex penalty already matches this pattern where it occurs."""
        own = re.compile(f.regex)
        for pen in view.active:
            if not pen.regex:
                continue
            if pen.regex == f.regex:
                return True
            try:
                rx = re.compile(pen.regex)
            except re.error:
                continue
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
