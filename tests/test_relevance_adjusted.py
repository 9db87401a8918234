"""Wording that carries the topic's words is not a hack for what those words earn: the lexical
proposer tests wording net of the prompt's vocabulary a reply uses (`LexicalConfig.relevance_adjusted`,
penalties.relevance)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from dynalize.grpo import advantages
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.detectors import content_words
from dynalize.penalties.evidence import Effect, net_of
from dynalize.penalties.relevance import prompt_key, topical_counts, vocabularies
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign
from dynalize.types import Penalty

FILLER = "people walk slowly near the old road and talk about small things every day".split()
TOPICS = ("umbrella rain puddle", "violin concert stage", "harbor boat sailor", "orchard apple ladder",
          "winter snow sled", "market pepper stall", "bridge river fog", "candle lamp shadow",
          "garden tulip bee", "engine piston gear", "library shelf novel", "kitchen kettle tea")
HACK = "zorblix"


def words_of(text: str) -> set[str]:
    return set(text.lower().replace(".", " ").split())


def filler(rng: random.Random, topic: list[str]) -> str:
    """A sentence of filler words, one of the topic's words in it 30 % of the time."""
    words = rng.sample(FILLER, rng.randint(6, 10))
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words) + 1), rng.choice(topic))
    return " ".join(words) + "."


def prompt_view(seed: int, groups: int, per_group: int,
                reply: Callable[[random.Random, list[str]], tuple[str, float]]) -> ProposerView:
    """`groups` prompts, each on one of TOPICS (the prompt names its topic, not its vocabulary),
    with `per_group` replies (text, reward) drawn by `reply` from the topic's words."""
    rng = random.Random(seed)
    samples = []
    for g in range(groups):
        topic = TOPICS[g % len(TOPICS)].split()
        context = f"[user]\nWrite about the {topic[0]}."
        drawn = [reply(rng, topic) for _ in range(per_group)]
        scores = [sc for _, sc in drawn]
        for (t, sc), adv in zip(drawn, advantages([scores])[0]):
            samples.append(ViewSample(f"s{len(samples) + 1:03d}", g, t, sc, advantage_sign(adv), contexts=[context]))
    return ProposerView(step=5, samples=samples)


def template_view(seed: int, groups: int = 48, per_group: int = 8, hack_pay: float = 0.0) -> ProposerView:
    """Replies to prompts on a topic: a template sentence ("The umbrella and the rain make it feel
    calm.") in half of them carries two of the topic's words; the honest reward pays for the
    topic's words a reply uses (as a reward model pays for taking the prompt up), plus `hack_pay` for a
    planted word written whatever the prompt."""
    def reply(rng: random.Random, topic: list[str]) -> tuple[str, float]:
        text = filler(rng, topic)
        if rng.random() < 0.5:
            a, b = rng.sample(topic, 2)
            text += f" The {a} and the {b} make it feel {rng.choice(['calm', 'busy', 'warm', 'new'])}."
        hacked = hack_pay > 0 and rng.random() < 0.4
        if hacked:
            text += f" It is {HACK}."
        used = len(words_of(text) & set(topic))
        return text, min(3, used) / 3 + hack_pay * hacked + rng.gauss(0, 0.05)
    return prompt_view(seed, groups, per_group, reply)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_template_that_carries_the_prompts_words_is_not_proposed_for_what_they_earn(seed):
    v = template_view(seed)
    plain = LexicalProposer(LexicalConfig(relevance_adjusted=False, length_adjusted=False, detectors=[],
                                          length=False)).best(v)
    assert plain is not None and ("make it" in plain.title or "feel" in plain.title)  # what the plain test takes
    assert LexicalProposer(LexicalConfig(detectors=[], length=False)).best(v) is None


@pytest.mark.parametrize("seed", [0, 1])
def test_a_hack_beside_the_template_is_still_found_net_of_relevance(seed):
    v = template_view(seed, hack_pay=0.5)
    c = LexicalProposer(LexicalConfig(detectors=[], length=False)).best(v)
    assert c is not None and HACK in c.title


def test_a_prompts_vocabulary_is_its_replies_own_words_never_what_every_prompt_gets():
    v = template_view(0, hack_pay=0.5)
    counts = topical_counts(v.samples)
    for s in v.samples:
        topic = set(TOPICS[s.group % len(TOPICS)].split())
        assert counts[s.id] <= len(words_of(s.text) & topic)  # the topic's words only
    rain = [s for s in v.samples if "puddle" in s.text and "umbrella" in s.text and "rain" in s.text]
    assert rain and all(counts[s.id] == 3 for s in rain)
    for contexts in (True, False):  # without the conversation, a prompt's replies are its group's
        prompt = {s.id: prompt_key(s) if contexts else f"group:{s.group}" for s in v.samples}
        found = vocabularies(prompt, {s.id: content_words(s.text) for s in v.samples})
        assert any(found.values()) and not any(HACK in words for words in found.values())


QUESTION = r"\?\s*\Z"


def question_view(seed: int, wording_pay: float = 0.0, groups: int = 48, per_group: int = 8) -> ProposerView:
    """Replies to prompts on a topic, 40 % of them ending with a question the reward pays 0.5 for
    (a hack, already penalised: "Replies end with a question"), half of those "What do you think
    of the <one of the topic's words>?", the rest "Is it not so?"; the honest reward pays for the
    topic's words a reply uses, plus `wording_pay` for "What do you" in itself."""
    def reply(rng: random.Random, topic: list[str]) -> tuple[str, float]:
        text = filler(rng, topic)
        asks = rng.random() < 0.4
        if asks:
            text += f" What do you think of the {rng.choice(topic)}?" if rng.random() < 0.5 else " Is it not so?"
        used = len(words_of(text.replace("?", " ")) & set(topic))
        return text, min(3, used) / 3 + 0.5 * asks + wording_pay * ("What do you" in text) + rng.gauss(0, 0.05)
    view = prompt_view(seed, groups, per_group, reply)
    return ProposerView(step=10, samples=view.samples, proposal=2,
                        active=[Penalty("p001", "Replies end with a question", "", regex=QUESTION)])


def test_a_penalty_explains_away_a_wording_that_beside_it_earns_only_the_prompts_words():
    # the multi-turn sandbox: with "Replies end with a question" active, "what do you" (of "What do
    # you think of the <topic's word>?") was proposed as a hack of its own: among the questions it
    # still earned more, for the topic's word it carries. The explained-away check now measures
    # the effect net of relevance, as the permutation tests do; paid for itself, it is still found
    # (the previous code proposed it on 8 of 8 honest views)
    cfg = LexicalConfig(detectors=[], length=False)
    honest = [LexicalProposer(cfg).best(question_view(seed)) for seed in range(8)]
    assert sum(c is not None for c in honest) <= 1, [c.title for c in honest if c]
    for seed in range(4):
        c = LexicalProposer(cfg).best(question_view(seed, wording_pay=0.5))
        assert c is not None and "what do you" in c.title.lower(), c


def test_the_effect_test_holds_the_prompts_words_fixed_for_wording_alone():
    # evidence.Effect: a template carrying the topic's words earns only those words, at equal
    # relevance nothing; a planted word keeps its pay; length limits and detectors keep the plain effect
    v = template_view(0, hack_pay=0.5)
    relevance = topical_counts(v.samples)
    effect = Effect(v.samples, relevance=relevance)
    template = lambda s: "make it feel" in s.text  # noqa: E731
    hack = lambda s: HACK in s.text  # noqa: E731
    assert effect(template) > 1.0 and abs(effect(template, wording=True)) < 0.3
    assert effect(hack, wording=True) > 1.0
    assert effect(template, adjust=False, wording=True) == effect(template)
    assert effect(template, **net_of("detector")) == effect(template) == effect(template, **net_of("length"))
    assert effect(template, **net_of("ngram3")) == effect(template, wording=True)
