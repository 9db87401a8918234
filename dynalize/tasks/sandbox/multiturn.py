"""The multi-turn sandbox: a conversation of up to `max_turns` replies, a new topic each turn.

The user opens with "Write about <topic>." as in the single-turn sandbox; after each policy reply
a deterministic simulated user answers in the sandbox's own grammar: a sentence about the topic
just written on (a closing sentence of the corpus when the reply named its topic, a filler
otherwise), then "Write about <next topic>.". The topics of a conversation are a plan fixed per
prompt (its `meta["topics"]`), drawn from the prompt's own split, so held-out conversations stay
on held-out topics and the replies of a group answer the same requests. The flawed RM scores each
reply against the topic its user turn asked for (its last "Write about ..." sentence); a
rollout's RM score is the mean over its replies (the framework's rule), and the held-out gold the
mean over every reply of a conversation.

The policy is `tiny:sandbox-policy-multiturn` (`multiturn_policy.py`): the single-turn sandbox
policy fine-tuned on conversations with this same user, since a policy that never saw a second
turn writes nonsense there.
"""

from __future__ import annotations

import hashlib
import random
import statistics

from pydantic import Field

from ...types import Message, Prompt
from ...types import exchanges as turn_exchanges  # the module's own `exchanges` adds topics
from ..base import Split
from .features import feature_prevalence
from .gold import gold_score
from .grammar import CLOSINGS, FILLERS, prompt_text, render, words_of
from .reward import topic_of
from .task import SandboxArgs, SandboxTask
from .topics import Topic, find_topic

MAX_TURNS = 4
"""The most policy replies a conversation may have (the policy is fine-tuned on up to this many)."""


class SandboxMultiturnArgs(SandboxArgs):
    """Settings of the multi-turn sandbox (`task.args`): the sandbox's, and the number of turns."""

    max_turns: int = Field(MAX_TURNS, ge=1, le=MAX_TURNS)
    """Policy replies per conversation: the user asks for a new topic after each but the last."""


def _seeded(*parts: object) -> random.Random:
    """An RNG that depends only on `parts` (the same in every process and Python version)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def topic_plan(first: Topic, pool: list[Topic], turns: int, seed: int = 0) -> list[Topic]:
    """The topics of a conversation opened on `first`: then `turns` − 1 others from `pool`."""
    others = [t for t in pool if t != first]
    return [first, *_seeded("plan", seed, first.name).sample(others, min(turns - 1, len(others)))]


def user_message(topic: Topic, reply: str, next_topic: Topic, turn: int) -> str:
    """What the simulated user says after `reply` about `topic`: a sentence of the grammar about
    it (a closing sentence when the reply named its topic, a filler otherwise), then the request
    for `next_topic`. Deterministic: the sentence is drawn with an RNG seeded by the reply."""
    rng = _seeded("user", turn, topic.name, reply)
    named = set(topic.core.split()) <= set(words_of(reply))
    template = rng.choice(CLOSINGS if named else FILLERS)
    return f"{render(template, topic, rng)} {prompt_text(next_topic)}"


def exchanges(conversation: list[Message]) -> list[tuple[Topic | None, str]]:
    """(topic asked for, reply) for every policy reply of a conversation."""
    return [(topic_of(before), reply) for before, reply in turn_exchanges([], conversation)]


def play_user(plan: list[Topic], replies: list[str]) -> list[Message]:
    """The conversation that `replies` make with the simulated user along `plan` (for the policy's
    fine-tuning corpus and tests): the opening request, then each reply and the user's answer."""
    messages = [Message("user", prompt_text(plan[0]))]
    for k, reply in enumerate(replies):
        messages.append(Message("assistant", reply))
        if k + 1 < min(len(plan), len(replies)):
            messages.append(Message("user", user_message(plan[k], reply, plan[k + 1], k + 1)))
    return messages


class SandboxMultiturnTask(SandboxTask):
    """The sandbox over a conversation: up to `max_turns` replies, each on the topic the user asks."""

    Args = SandboxMultiturnArgs
    description = ("Short writing over a conversation: the user names a topic, the assistant writes a few "
                   "sentences about it, and the user answers and names the next topic.")

    def __init__(self, args: SandboxMultiturnArgs, seed: int = 0):
        super().__init__(args, seed)
        self.args: SandboxMultiturnArgs = args
        self.max_turns = args.max_turns  # type: ignore[misc]  # the loop reads it on the instance

    def prompts(self, split: Split) -> list[Prompt]:
        pool = self.topics(split)
        return [Prompt(p.id, p.messages, {**p.meta, "topics": [t.name for t in
                                                                 topic_plan(find_topic(p.meta["topic"]), pool,
                                                                            self.max_turns, self.args.topic_seed)]})
                for p in super().prompts(split)]

    async def user_reply(self, conversation: list[Message], prompt: Prompt) -> str | None:
        """The next request of the prompt's topic plan, after a sentence about the reply's topic."""
        plan = [find_topic(name) for name in prompt.meta["topics"]]
        turn = sum(m.role == "assistant" for m in conversation)
        if turn >= len(plan):
            return None
        return user_message(plan[turn - 1], conversation[-1].content, plan[turn], turn)

    async def evaluate(self, prompts: list[Prompt], replies: list[str],
                       conversations: list[list[Message]]) -> dict[str, float]:
        """Over every reply of the held-out conversations: mean gold (each reply on the topic asked
        for; a conversation's replies averaged first, as the RM does), its std over conversations,
        gold of the last reply, mean words per reply, replies per conversation, and the share of
        replies showing each feature."""
        if len(prompts) != len(conversations):
            raise ValueError(f"{len(prompts)} prompts but {len(conversations)} conversations")
        pairs = [exchanges(c) for c in conversations]
        per_reply = [[gold_score(t, r) for t, r in conv] for conv in pairs]
        golds = [statistics.fmean(g) if g else 0.0 for g in per_reply]
        every = [r for conv in pairs for _, r in conv]
        metrics = {
            "gold": statistics.fmean(golds) if golds else 0.0,
            "gold_std": statistics.pstdev(golds) if golds else 0.0,
            "gold_last": statistics.fmean(g[-1] for g in per_reply if g) if every else 0.0,
            "words": statistics.fmean(len(words_of(r)) for r in every) if every else 0.0,
            "turns": statistics.fmean(len(conv) for conv in pairs) if pairs else 0.0,
        }
        return metrics | feature_prevalence(every, self.args.features)
