"""The reward model's term: each policy reply scored on the conversation up to it, then averaged."""

from __future__ import annotations

import statistics

from ..backends.base import EngineError, RewardModel, RMInput
from ..errors import ConfigError
from ..hooks import optional, owner_name, user_code
from ..tasks.base import Task
from ..types import Batch, Prompt, Rollout
from .base import RewardTerm, TermScores


def rm_inputs(task: Task, rollout: Rollout) -> list[RMInput]:
    """What the RM reads for each policy reply: the task's view of the reply and the conversation
    up to it (and of the rollout's prompt, when `rm_input` names a `prompt` argument)."""
    extra = optional(task.rm_input, prompt=rollout.prompt)
    with user_code(owner_name("task", task), "rm_input"):
        return [task.rm_input(conversation, reply, **extra) for conversation, reply in rollout.exchanges()]


class RMTerm(RewardTerm):
    """`scores["rm"]`: the RM's mean over a rollout's policy replies (one reply when single-turn).

    What the RM reads of a reply is the task's choice (`Task.rm_input`). All replies of a batch
    go to the RM in one call, with each reply's `Prompt` when its `score` names `prompts`.
    Records `rm_scores` (per reply) and `rm_score` (their mean). `owner` names the reward model
    in errors (default: its class).
    """

    name = "rm"
    rescorable = True
    rescore_repeats_score = True  # the RM reads the rollout alone: an unchanged reply's score is the recorded one

    def __init__(self, reward_model: RewardModel, task: Task, owner: str | None = None):
        self.reward_model = reward_model
        self.task = task
        self.owner = owner or owner_name("reward model", reward_model)

    async def score(self, batch: Batch) -> TermScores:
        return await self._score(batch, f"the batch of step {batch.step + 1}")  # batch k is step k + 1

    async def rescore(self, batch: Batch) -> list[float]:
        """The RM's mean over each edited rollout's replies, as `score` (rewards.rescore)."""
        return (await self._score(batch, "replies edited to confirm a penalty")).values

    async def _score(self, batch: Batch, batch_of: str) -> TermScores:
        rollouts = batch.rollouts
        owners: list[int] = []
        inputs: list[RMInput] = []
        prompts: list[Prompt] = []
        for i, r in enumerate(rollouts):
            prompt = r.prompt
            for x in rm_inputs(self.task, r):
                owners.append(i)
                inputs.append(x)
                prompts.append(prompt)
        try:
            with user_code(f"{self.owner} ({batch_of})", "score"):  # a reward function's own errors: one line
                scores = await self.reward_model.score(inputs, **optional(self.reward_model.score, prompts=prompts))
                if len(scores) != len(inputs):
                    raise EngineError(f"returned {len(scores)} scores for {len(inputs)} replies")
        except ConfigError as e:  # e.g. a reward function's scores that are not finite numbers
            raise ConfigError(f"{e} ({batch_of})") from None
        per: list[list[float]] = [[] for _ in rollouts]
        for i, s in zip(owners, scores):
            per[i].append(float(s))
        values = [statistics.fmean(s) for s in per]
        return TermScores(values, [{"rm_scores": s, "rm_score": v} for s, v in zip(per, values)])
