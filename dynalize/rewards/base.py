"""Reward terms: a rollout's reward is a sum of named terms, each computed in one place.

A term scores a whole batch at once and returns one value per rollout, what it records about
each rollout (written with it to `rollouts/step_*.jsonl`), and the events of its own log
(`<run>/<name>.jsonl`). `score_batch` runs every term of a run concurrently and writes
`rollout.scores[name]` and `rollout.reward`, their sum. Advantages are computed from the total,
once, by `dynalize.grpo`. A run without penalties simply has no penalty term.

A term that could not score a rollout (a judge verdict that failed) says so (`unscored`): the
rollout's reward is unknown, and the loop leaves its whole group out of the update rather than
read the gap as a score (docs/reliability.md).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio
import anyio.abc

from ..hooks import unwrap_hook_errors
from ..types import Batch


@dataclass
class TermScores:
    """What one term says about one batch, rollouts in `batch.rollouts` order."""

    values: list[float]
    """The term's contribution to each rollout's reward."""
    info: list[dict[str, Any]] | None = None
    """Per rollout: fields recorded with it (e.g. `rm_scores`, `verdicts`)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """Lines for the term's event log, `<run>/<name>.jsonl` (each with its `step`)."""
    unscored: list[bool] | None = None
    """Per rollout: the term could not score it (its value is a placeholder). Recorded in the
    rollout's `info["unscored"]` (term names); the loop leaves such rollouts' groups out of the
    update (`left_out`)."""


class RewardTerm(abc.ABC):
    """One named part of the reward. Subclasses set `name` and implement `score`."""

    name: ClassVar[str]
    event_log: ClassVar[bool] = False
    """Whether the term's `score` returns events, written to `<run>/<name>.jsonl` (a resume trims
    that file, and only the logs of terms that write one: any other file is not the run's)."""

    @abc.abstractmethod
    async def score(self, batch: Batch) -> TermScores:
        """Score every rollout of `batch`."""

    def observe(self, batch: Batch, task_group: anyio.abc.TaskGroup) -> None:  # noqa: B027 - optional hook
        """Learn from the scored batch (rewards and advantages set). Work that takes time runs in
        `task_group`: training never waits for it (Dynalize's proposer)."""

    async def finish(self) -> None:  # noqa: B027 - optional hook
        """The run's last step, before its metrics and checkpoint: land or cancel background work
        (`observe`'s), so nothing is lost uncounted."""

    def metrics(self) -> dict[str, float]:
        """This step's metrics (counters since the last call), read once per step."""
        return {}

    def chat_models(self) -> dict[str, Any]:
        """The term's chat models by role (`gold judge`, `proposer`, ...): their token use is reported."""
        return {}

    def stop_reason(self) -> str | None:
        """Why the run must stop (one line, e.g. a judge that keeps failing), or None. Asked after
        every step; the loop writes a checkpoint first, so a fixed run resumes."""
        return None

    rescorable: bool = False
    """Whether `rescore` can score edited copies of rollouts (rewards.rescore: a run's
    confirmation of discovered penalties scores replies with a pattern taken out or put in)."""

    rescore_repeats_score: bool = False
    """Whether `rescore` of an unchanged rollout gives the value `score` recorded for it
    (`scores[name]`): the term reads neither the step nor anything but the rollout. A run's
    confirmation then takes the originals' values from the rollouts instead of scoring them
    again (rewards.rescore), which halves what it asks of the term."""

    def not_rescorable(self) -> str | None:
        """Why the term cannot score edited replies (one clause), or None when it can."""
        return None if self.rescorable else f"the {self.name} term cannot score edited replies"

    async def rescore(self, batch: Batch) -> list[float]:
        """The term's value for each rollout of `batch`, as `score` gives it, without changing
        the term's state or metrics: the rollouts are edited copies of scored ones
        (rewards.rescore.with_reply), never trained on. Terms that can set `rescorable`."""
        raise NotImplementedError(f"the {self.name} term cannot score edited replies")

    async def evaluate(self, batch: Batch) -> dict[str, float]:
        """Held-out metrics of the term on an evaluation batch (logged as `eval/<key>`, e.g. the
        rubric term's proxy/gold measurement); fields set in a rollout's `info` are written with
        the evaluation's rollouts."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the term (JSON-ready)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore what `state_dict` returned."""


async def score_batch(terms: list[RewardTerm], batch: Batch) -> dict[str, list[dict[str, Any]]]:
    """Score `batch` with every term at once; fill each rollout's `scores`, `info` and `reward`.

    Returns each term's events by term name.
    """
    rollouts = batch.rollouts
    results: dict[str, TermScores] = {}

    async def run(term: RewardTerm) -> None:
        results[term.name] = await term.score(batch)

    with unwrap_hook_errors():  # a task hook failing in a term: its one error, not a group
        async with anyio.create_task_group() as tg:
            for term in terms:
                tg.start_soon(run, term)
    for term in terms:
        got = results[term.name]
        if len(got.values) != len(rollouts):
            raise RuntimeError(f"reward term {term.name!r} gave {len(got.values)} values for {len(rollouts)} rollouts")
        for i, r in enumerate(rollouts):
            r.scores[term.name] = float(got.values[i])
            if got.info is not None:
                r.info.update(got.info[i])
            if got.unscored is not None and got.unscored[i]:
                mark_unscored(r, term.name)
    for r in rollouts:
        r.reward = sum(r.scores[t.name] for t in terms)
    return {t.name: results[t.name].events for t in terms if results[t.name].events}


def mark_unscored(rollout: Any, term: str) -> None:
    """Record that `term` could not score `rollout` (`info["unscored"]`: the names of such terms,
    which the rollout's record and the loop's left-out accounting read)."""
    rollout.info["unscored"] = [*rollout.info.get("unscored", []), term]
