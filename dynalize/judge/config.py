"""The judge's settings (the `penalties.judge` section; rubric judges extend it): settings only."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..backends.config import ChatModelConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class JudgeConfig(_Section):
    """Who judges rollouts against the live penalties, with retries, a cache and failure limits."""

    engine: Literal["regex", "llm"] = "regex"
    """`regex` (lexical penalties only, no LLM) or `llm` (a ChatModel judges the rest)."""
    chat: ChatModelConfig | None = None
    """llm: the judge's chat model."""
    max_concurrency: int = Field(32, gt=0)
    """llm: judge requests in flight at once (the lower of this and `chat.max_concurrency`); a
    call waiting out a retry backoff holds no slot."""
    retries: int = Field(3, ge=1)
    """llm: attempts per JSON answer; then the verdicts still missing count as failures."""
    reasks: int = Field(1, ge=0)
    """llm: times a text whose verdicts failed after `retries` (or whose call failed) is asked again
    in a new call, within the step's `time_budget_s`, before its verdicts count as failures (and
    its rollout's group is left out). Counted: `judge/reasked`, `judge/recovered`. 0: never."""
    cache_size: int = Field(4096, ge=0)
    """llm: verdicts remembered by (text, context, buffer version)."""
    context: bool = True
    """Show the judge, with each reply, the conversation up to that reply (system messages left
    out): in multi-turn rollouts the simulated user's turns and the policy's earlier replies."""
    time_budget_s: float | None = Field(300.0, gt=0)
    """llm: seconds the judge may take per training step; verdicts not in by then count as
    failures. None: no budget (a step waits for every call's retries)."""
    max_failure_rate: float | None = Field(0.1, ge=0, le=1)
    """Stop the run (checkpoint first) when more than this share of the verdicts asked over the
    last `failure_window` judged steps failed. A failed verdict is never read as "not triggered":
    its rollout's group is left out of the update (docs/reliability.md). None: never stop."""
    failure_window: int = Field(5, ge=1)
    """Judged steps (steps with at least one verdict asked) that `max_failure_rate` looks back over."""

    @model_validator(mode="after")
    def _llm_needs_chat(self) -> "JudgeConfig":
        if self.engine == "llm" and self.chat is None:
            raise ValueError("judge.engine=llm needs judge.chat")
        return self
