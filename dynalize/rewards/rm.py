"""The reward model's term: each policy reply scored on the conversation up to it, then averaged."""

from __future__ import annotations

import statistics

from ..backends.base import RewardModel, RMInput
from ..errors import ConfigError
from ..tasks.base import Task
from ..types import Batch, Rollout
from .base import RewardTerm, TermScores


def rm_inputs(task: Task, rollout: Rollout) -> list[RMInput]:
    """What the RM reads for each policy reply: the task's view of the reply and the conversation up to it."""
    return [task.rm_input(conversation, reply) for conversation, reply in rollout.exchanges()]


class RMTerm(RewardTerm):
    """`scores["rm"]`: the RM's mean over a rollout's policy replies (one reply when single-turn).

    What the RM reads of a reply is the task's choice (`Task.rm_input`). All replies of a batch
    go to the RM in one call. Records `rm_scores` (per reply) and `rm_score` (their mean).
    """

    name = "rm"

    def __init__(self, reward_model: RewardModel, task: Task):
        self.reward_model = reward_model
        self.task = task

    async def score(self, batch: Batch) -> TermScores:
        rollouts = batch.rollouts
        owners, inputs = [], []
        for i, r in enumerate(rollouts):
            for x in rm_inputs(self.task, r):
                owners.append(i)
                inputs.append(x)
        scores = await self.reward_model.score(inputs)
        if len(scores) != len(inputs):  # a user's reward function, most likely: one line, exit 2
            raise ConfigError(f"reward model error: it returned {len(scores)} scores for {len(inputs)} "
                              f"replies (one score per reply is needed)")
        per: list[list[float]] = [[] for _ in rollouts]
        for i, s in zip(owners, scores):
            per[i].append(float(s))
        values = [statistics.fmean(s) for s in per]
        return TermScores(values, [{"rm_scores": s, "rm_score": v} for s, v in zip(per, values)])
