"""A toy task for tests: reward is the share of vowels among a reply's letters; and a generator
whose replies a test scripts."""

import anyio

from dynalize.backends.base import Completion, Generator, RewardModel
from dynalize.tasks.base import Task, TaskArgs
from dynalize.types import Message, Prompt

TOPICS = ["sea", "forest", "city", "river", "moon", "rain", "music", "garden", "desert", "winter", "stars", "bread"]


def vowel_share(text: str) -> float:
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


class VowelRM(RewardModel):
    def __init__(self, delay: float = 0.0):
        self.delay = delay

    async def score(self, items):
        await anyio.sleep(self.delay)
        return [vowel_share(x if isinstance(x, str) else x[-1].content) for x in items]


class ToyArgs(TaskArgs):
    n_topics: int = 12
    """How many topics to use."""
    rm_delay: float = 0.0
    """Seconds the RM takes per batch (to make steps last, e.g. for crash tests)."""


class ToyTask(Task):
    Args = ToyArgs
    description = "Short texts about a topic."

    def prompts(self, split):
        topics = TOPICS[: self.args.n_topics] if split == "train" else TOPICS[-4:]
        return [Prompt(f"{split}-{t}", [Message("user", f"Write about the {t}.")]) for t in topics]

    def reward_model(self):
        return VowelRM(self.args.rm_delay)

    async def evaluate(self, prompts, replies):
        return {"vowels": sum(map(vowel_share, replies)) / len(replies)}


class ScriptedGenerator(Generator):
    """A generator that answers each prompt (its chat-template text, decoded) with `reply(text)`,
    as token ids of `tokenizer`: tests choose what the policy says."""

    def __init__(self, tokenizer, reply):
        self.tok, self.reply = tokenizer, reply

    async def generate(self, prompts, sampling):
        out = []
        for ids in prompts:
            text = self.reply(self.tok.decode(ids))
            tokens = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            out.append(Completion(tokens, [-0.5] * len(tokens), text, "stop"))
        return out

    async def update_weights(self, state, version):
        self.version = version


DOUBLE_VOWEL = "(?i)[aeiou]{2}"


def propose_double_vowels(messages) -> str:
    """A scripted LLM proposer (`penalties.proposer.chat: {engine: scripted, path:
    toytask:propose_double_vowels}`): every proposal is one penalty with a regex, citing the whole
    view; the duplicate check calls each later one a duplicate of the first (p001)."""
    import json
    import re

    system, user = messages[0].content, messages[-1].content
    if system.startswith("You keep a list of penalties"):
        ids = dict.fromkeys(re.findall(r"^- (c\d+):", user, re.M))
        return json.dumps({"duplicates": [{"candidate": c, "duplicate_of": "p001"} for c in ids]})
    ids = re.findall(r"^\[(s\d+)\] group", user, re.M)
    return json.dumps({"candidates": [{"title": "Doubles its vowels", "description": "Two vowels in a row.",
                                       "sample_ids": ids, "regex": DOUBLE_VOWEL}]})


def penalty_overrides() -> list[str]:
    """Overrides that turn Dynalize on with `propose_double_vowels` and the regex judge."""
    return ["penalties.enabled=true", "penalties.every=1", "penalties.proposer.engine=llm",
            "penalties.proposer.chat.engine=scripted", "penalties.proposer.chat.path=toytask:propose_double_vowels"]
