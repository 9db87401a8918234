"""How much of its prompt's own vocabulary a reply uses: what a reward model pays for taking the
prompt up, held fixed when wording is tested (`LexicalConfig.relevance_adjusted`).

A prompt's vocabulary is read off the replies, not the prompt: the content words its replies use
far more often than the replies to other prompts (`TOPICAL_ALPHA`: "umbrellas" and "puddles" in
replies about the rain, which only names the rain). A hack's wording, written whatever the prompt,
is nobody's vocabulary; a template sentence that carries the topic's words ("The umbrellas and the
rain make it feel busy.") is paid for those words, which this count holds fixed. It reads texts
and prompts only, never rewards, so nothing is chosen by the rewards; the permutations then shuffle
the rewards net of it within groups, as for `length_adjusted` (exact for the plain reward, close to
exact net of a covariate).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from scipy import stats

from .detectors import content_words
from .views import ViewSample, prompt_group

TOPICAL_ALPHA = 0.05
"""A word belongs to a prompt's vocabulary when as many of that prompt's replies using it would be a
surprise, at this level over every (word, prompt) pair of the view (Bonferroni), if words were
spread over prompts regardless of them: a one-sided hypergeometric (Fisher) test. A word needs at
least two of the prompt's replies."""


def prompt_key(s: ViewSample, batch: str = "") -> str:
    """Which prompt `s` answers: its conversation up to the policy's first reply, or (not known)
    its group within `batch`."""
    context = s.contexts[0] if s.contexts else None
    return context.split("\n\n[assistant]")[0] if context else f"{batch}group:{prompt_group(s)}"


def topical_counts(samples: list[ViewSample], reference: list[ViewSample] = ()) -> dict[str, int]:
    """Per sample id (of `samples` and of their `reference`, whose ids are their own): how many
    distinct words of its prompt's vocabulary its replies use."""
    prompt = {s.id: prompt_key(s) for s in samples} | {s.id: prompt_key(s, "reference:") for s in reference}
    words = {s.id: set().union(*map(content_words, s.parts)) for s in [*samples, *reference]}
    vocabulary = vocabularies(prompt, words)
    return {i: len(words[i] & vocabulary[prompt[i]]) for i in prompt}


def vocabularies(prompt: dict[str, str], words: dict[str, set[str]]) -> dict[str, set[str]]:
    """Per prompt: its vocabulary (`TOPICAL_ALPHA`), from each sample's prompt and content words."""
    replies = Counter(prompt.values())
    used: dict[str, Counter[str]] = {p: Counter() for p in replies}
    for i, p in prompt.items():
        used[p].update(words[i])
    everywhere = sum(used.values(), Counter())
    pairs = [(p, w, c) for p, counts in used.items() for w, c in counts.items() if c >= 2]
    vocabulary: dict[str, set[str]] = {p: set() for p in used}
    if not pairs:
        return vocabulary
    k = np.array([c for _, _, c in pairs])
    p_values = stats.hypergeom.sf(k - 1, len(prompt), np.array([everywhere[w] for _, w, _ in pairs]),
                                  np.array([replies[p] for p, _, _ in pairs]))
    bar = TOPICAL_ALPHA / sum(map(len, used.values()))
    for (p, w, _), pv in zip(pairs, p_values):
        if pv <= bar:
            vocabulary[p].add(w)
    return vocabulary
