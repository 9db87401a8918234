"""What one call of TRL's reward functions holds, as dynalize's batch, and across processes.

TRL passes each prompt `num_generations` times in a row, and gathers the processes' completions
in rank order before it centres rewards per group (`rewards.view(-1, num_generations)`): rollout
i of the gathered batch belongs to group i // num_generations. The reward before penalties is
TRL's own sum: `Σ weight · score` over the functions that gave a number (None adds nothing), None
where none did (TRL leaves such a completion out of its group's baseline).
"""

from __future__ import annotations

import math
from typing import Any

from ..monitor.readers import MonitoredRollout
from ..monitor.replay import as_batch
from ..types import Batch, Message


class PenaltiesError(ValueError):
    """A TRL run set up in a way the penalties cannot follow (one line)."""


def weighted_sum(scores: list[list[float | None]], weights: list[float]) -> list[float | None]:
    """Per completion, Σ weight · score over the functions that gave a finite number (TRL's
    NaN-aware sum), or None where none did. `scores[f][i]`: function f's score of completion i."""
    out: list[float | None] = []
    for row in zip(*scores):
        given = [(w, s) for w, s in zip(weights, row) if s is not None and not math.isnan(s)]
        out.append(sum(w * s for w, s in given) if given else None)
    return out


def messages(value: Any, role: str) -> list[Message]:
    """TRL's prompt or completion (text, or a list of {role, content}) as chat messages."""
    if isinstance(value, str):
        return [Message(role, value)]  # type: ignore[arg-type]
    out = []
    for m in value:
        r = str(m.get("role") or role)
        content = m.get("content")
        if isinstance(content, list):  # multimodal: the text parts
            content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
        out.append(Message(r if r in ("system", "user", "assistant") else "user", "" if content is None else str(content)))  # type: ignore[arg-type]
    return out


def to_batch(step: int, prompts: list[Any], completions: list[Any], rewards: list[float | None],
             num_generations: int, columns: list[dict[str, Any]] | None = None) -> Batch:
    """The gathered completions of one step as a batch (reward: before penalties, NaN where no
    function gave one). `columns`: each completion's other reward arguments (the dataset's
    columns), kept with its prompt as TRL gave it as the rollout's row (`meta["row"]`, what
    rewards.functions.trl_inputs passes back to the functions when an edited copy is scored).
    Refuses a batch whose groups are not `num_generations` copies of a prompt."""
    n = len(completions)
    if n % num_generations:
        raise PenaltiesError(f"dynalize.trl: {n} completions in step {step} are not whole groups of "
                             f"num_generations={num_generations}")
    rows = []
    for i, (p, c, r) in enumerate(zip(prompts, completions, rewards)):
        if p != prompts[i - i % num_generations]:
            raise PenaltiesError(f"dynalize.trl: completion {i} of step {step} answers another prompt than its "
                                 f"group's first (TRL passes each prompt num_generations={num_generations} times "
                                 f"in a row)")
        prompt, turns = messages(p, "user"), messages(c, "assistant")
        if not any(m.role == "assistant" for m in turns):
            turns = [Message("assistant", "\n\n".join(m.content for m in turns))]
        rows.append(MonitoredRollout(step, str(i // num_generations), prompt, turns, math.nan if r is None else r))
    batch = as_batch(step, rows)
    if columns is not None:
        for r, p, cols in zip(batch.rollouts, prompts, columns, strict=True):
            r.meta["row"] = {"prompt": p, "columns": cols}
    return batch


def scorable(batch: Batch) -> Batch:
    """The batch without the rollouts no reward function scored (their reward is NaN): what the
    proposer reads and the metrics describe."""
    groups = [[r for r in g if not math.isnan(r.reward)] for g in batch.groups]
    return Batch(batch.step, [g for g in groups if g])


class Processes:
    """This process's place among the trainer's processes (accelerate's state), and the two
    collectives the penalties need."""

    def __init__(self) -> None:
        from accelerate import PartialState

        state = PartialState()
        self.rank, self.count = state.process_index, state.num_processes

    @property
    def main(self) -> bool:
        return self.rank == 0

    def gather(self, value: Any) -> list[Any]:
        """Every process's `value`, in rank order (called by all processes)."""
        if self.count == 1:
            return [value]
        from accelerate.utils import gather_object

        return gather_object([value])

    def broadcast(self, value: Any) -> Any:
        """The main process's `value`, on every process (called by all processes)."""
        if self.count == 1:
            return value
        from accelerate.utils import broadcast_object_list

        box = [value]
        broadcast_object_list(box, from_process=0)
        return box[0]
