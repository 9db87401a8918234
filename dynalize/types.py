"""Plain data that flows between the parts of dynalize. No torch, no engines.

A *rollout* is one sampled episode for one prompt: a single reply, or (multi-turn) several policy
replies with simulated-user turns between them. A *group* is the G rollouts of one prompt in one
step; advantages are computed within a group.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant"]


@dataclass
class Message:
    """One chat message."""

    role: Role
    content: str

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def as_messages(items: list[dict[str, str]] | list[Message]) -> list[Message]:
    """Accept chat messages as dicts or Message objects."""
    return [m if isinstance(m, Message) else Message(role=m["role"], content=m["content"]) for m in items]


@dataclass
class Prompt:
    """One training or evaluation prompt: an id and the conversation so far."""

    id: str
    messages: list[Message]
    meta: dict[str, Any] = field(default_factory=dict)
    """Per-prompt data that task hooks and reward terms read (an answer, a persona, a rubric);
    JSON-ready, since rollouts carry it into checkpoints."""


def exchanges(messages: list[Message], turns: list[Message]) -> list[tuple[list[Message], str]]:
    """Each assistant message of `turns` with the conversation before it (`messages`, then the
    earlier turns): what RM and judge read for each policy reply."""
    out, conversation = [], list(messages)
    for m in turns:
        if m.role == "assistant":
            out.append((list(conversation), m.content))
        conversation.append(m)
    return out


@dataclass
class Rollout:
    """One sampled episode, with everything the trainer and the analysis need.

    Token fields are those of the whole sequence the learner trains on: `prompt_ids` then
    `completion_ids`. `loss_mask[i]` says whether completion token i was written by the policy
    (1) or by someone else, e.g. a simulated user (0); `logprobs[i]` is the generator's
    log-probability of completion token i (0.0 where the mask is 0).

    Generation fills the episode (and `info["user_failed"]` when its simulated user failed:
    dynalize.rollouts); scoring fills `scores` (one value per reward term, by name),
    `info` (what each term records about the rollout, e.g. per-reply RM scores or verdicts) and
    `reward` (the sum of the scores); `advantage` comes from the reward (dynalize.grpo).
    """

    prompt_id: str
    group: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    replies: list[str]
    policy_version: int
    truncated: bool = False
    messages: list[Message] = field(default_factory=list)
    """The prompt's conversation."""
    meta: dict[str, Any] = field(default_factory=dict)
    """The prompt's `meta` (per-prompt data a task or reward term reads, e.g. an answer or a rubric)."""
    turns: list[Message] = field(default_factory=list)
    """Everything after the prompt: policy replies (reasoning stripped) and simulated-user turns."""
    reasoning: list[str] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    reward: float = 0.0
    advantage: float = 0.0

    @property
    def text(self) -> str:
        """The policy's replies, joined; the whole reply for single-turn rollouts."""
        return "\n\n".join(self.replies)

    @property
    def prompt(self) -> Prompt:
        """The prompt this rollout answers (its id, messages and meta)."""
        return Prompt(self.prompt_id, self.messages, self.meta)

    @property
    def conversation(self) -> list[Message]:
        """The whole conversation: the prompt's messages, then every reply and user turn."""
        return [*self.messages, *self.turns]

    def exchanges(self) -> list[tuple[list[Message], str]]:
        """Each policy reply with the conversation up to it: what the reply answers."""
        return exchanges(self.messages, self.turns)

    def record(self, step: int) -> dict[str, Any]:
        """The JSON-ready line written to rollouts/step_NNNNNN.jsonl."""
        left_out = bool(self.info.get("left_out"))
        unknown = set(self.info.get("unscored") or ())
        return {
            "step": step,
            "prompt_id": self.prompt_id,
            "group": self.group,
            "policy_version": self.policy_version,
            "prompt": [m.to_dict() for m in self.messages],
            "turns": [m.to_dict() for m in self.turns],
            "replies": self.replies,
            "reasoning": self.reasoning,
            "prompt_tokens": len(self.prompt_ids),
            "completion_tokens": len(self.completion_ids),
            "policy_tokens": int(sum(self.loss_mask)),
            "truncated": self.truncated,
            **self.info,
            # a rollout left out of the update has no known reward: null, never a 0.0 read as one
            "scores": {k: None if k in unknown else v for k, v in self.scores.items()},
            "reward": None if left_out else self.reward,
            "advantage": None if left_out else self.advantage,
        }


def output_step(batch: int) -> int:
    """The step a batch is labelled with in every output (files, metrics, log lines): batches count
    from 0, steps are training steps completed once that batch has trained (batch k is step k + 1)."""
    return batch + 1


@dataclass
class Batch:
    """The rollouts of one training step, grouped by prompt (`step`: the batch's number, from 0;
    outputs name it `output_step(step)`)."""

    step: int
    groups: list[list[Rollout]]

    @property
    def rollouts(self) -> list[Rollout]:
        return [r for g in self.groups for r in g]


@dataclass
class Penalty:
    """A negative rubric: a behaviour the RM seems to reward for the wrong reasons.

    `references` are the sample ids (from the proposer's view of a batch) that show the pattern.
    A penalty with a `regex` is decided lexically, and one naming a `detector`
    (dynalize.penalties.detectors) by that detector's Python check: neither needs an LLM judge.
    """

    id: str
    title: str
    description: str
    references: list[str] = field(default_factory=list)
    regex: str | None = None
    created_step: int = 0
    active: bool = True
    history: list[dict[str, Any]] = field(default_factory=list)
    detector: str | None = None
    """The named detector that decides it (instead of a regex); None in checkpoints before detectors."""
    pay: list[list[float]] = field(default_factory=list)
    """What the reward paid for the pattern on the latest steps that measured it: [step, groups,
    sum of the groups' reward gaps] each (penalties.pay); what a violation costs under
    `penalties.weight="pay"`."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Penalty":
        return cls(**d)


@dataclass
class TrainSequence:
    """What the learner needs of one rollout: tokens, which to train on, and the advantage."""

    input_ids: list[int]
    loss_mask: list[int]
    gen_logprobs: list[float]
    advantage: float

    @classmethod
    def from_rollout(cls, r: Rollout) -> "TrainSequence":
        n = len(r.prompt_ids)
        return cls(
            input_ids=r.prompt_ids + r.completion_ids,
            loss_mask=[0] * n + list(r.loss_mask),
            gen_logprobs=[0.0] * n + list(r.logprobs),
            advantage=r.advantage,
        )
