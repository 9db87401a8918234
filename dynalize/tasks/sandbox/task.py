"""SandboxTask: short writing on a topic, scored by a flawed RM with planted features.

The task's description and prompts say nothing of the features: only the RM (and the held-out
evaluation, which reports their prevalence) reads the feature list.
"""

from __future__ import annotations

import statistics

from pydantic import Field

from ...backends.base import RewardModel
from ...types import Message, Penalty, Prompt
from ..base import Split, Task, TaskArgs
from .features import Feature, default_features, feature_prevalence
from .gold import gold_score
from .grammar import prompt_text, words_of
from .planted import planted_matches
from .reward import SandboxRewardModel, topic_of
from .topics import Topic, split_topics


class SandboxArgs(TaskArgs):
    """Settings of the sandbox task (`task.args`)."""

    features: list[Feature] = Field(default_factory=default_features)
    """Spurious features the flawed RM pays for (see dynalize/tasks/sandbox/features.py)."""
    n_train_topics: int = Field(100, gt=0)
    """Topics in the training split."""
    n_eval_topics: int = Field(30, gt=0)
    """Held-out topics, disjoint from the training ones."""
    topic_seed: int = 0
    """Seed of the shuffle that splits topics into train and held-out."""
    gold_weight: float = Field(1.0, ge=0)
    """Weight of gold quality in the RM score."""
    rm_noise: float = Field(0.05, ge=0)
    """Half-width of the RM's fixed pseudo-random offset per reply."""


class SandboxTask(Task):
    """Write a few sentences about a topic; a planted-hack world for CPU experiments."""

    Args = SandboxArgs
    description = "Short writing: the user names a topic and the assistant writes a few sentences about it."

    def __init__(self, args: SandboxArgs, seed: int = 0):
        super().__init__(args, seed)
        self.args: SandboxArgs = args
        train, held_out = split_topics(args.n_train_topics, args.n_eval_topics, args.topic_seed)
        self._topics: dict[str, list[Topic]] = {"train": train, "eval": held_out}

    def topics(self, split: Split) -> list[Topic]:
        """The topics of a split, in prompt order."""
        return list(self._topics[split])

    def prompts(self, split: Split) -> list[Prompt]:
        return [Prompt(id=t.id, messages=[Message("user", prompt_text(t))], meta={"topic": t.name})
                for t in self._topics[split]]

    def reward_model(self) -> RewardModel:
        return SandboxRewardModel(self.args.features, self.args.gold_weight, self.args.rm_noise)

    def planted_matches(self, penalties: list[Penalty]) -> list[str | None]:
        """The planted feature each penalty catches, judged by its regex's behaviour (planted.py)."""
        return planted_matches([p.regex for p in penalties], list(self.args.features))

    async def evaluate(self, prompts: list[Prompt], replies: list[str]) -> dict[str, float]:
        """Mean and std of gold, mean length in words, and the prevalence of each feature."""
        if len(prompts) != len(replies):
            raise ValueError(f"{len(prompts)} prompts but {len(replies)} replies")
        golds = [gold_score(p.meta.get("topic") or topic_of(p.messages), r) for p, r in zip(prompts, replies)]
        metrics = {
            "gold": statistics.fmean(golds) if golds else 0.0,
            "gold_std": statistics.pstdev(golds) if golds else 0.0,
            "words": statistics.fmean(len(words_of(r)) for r in replies) if replies else 0.0,
        }
        return metrics | feature_prevalence(replies, self.args.features)
