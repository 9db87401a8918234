"""Build Dynalize's penalty term (proposer, judge, empty buffer) from its settings, importing
only what those settings use: the lexical proposer and the regex judge need no engine (no torch,
no transformers), so `python -m dynalize.monitor` replays a run without loading one. An LLM
proposer or judge needs a `chat_factory` (`dynalize.build.build_chat_model`, which
`build.build_penalty_term` passes; the monitor imports it only when an LLM is configured).
"""

from __future__ import annotations

from typing import Any, Callable

from .backends.base import ChatModel
from .errors import ConfigError
from .judge.judge import Judge, RegexJudge
from .penalties.buffer import PenaltyBuffer
from .penalties.config import JudgeConfig, PenaltiesConfig
from .penalties.detectors import DETECTORS
from .penalties.lexical import LexicalProposer
from .rewards.penalties import PenaltyTerm

ChatFactory = Callable[[Any], ChatModel]
"""Builds a chat model from its settings (`dynalize.build.build_chat_model`)."""


def uses_llm(cfg: PenaltiesConfig) -> bool:
    """Whether the proposer or the judge is an LLM (a chat model must be built)."""
    return cfg.proposer.engine == "llm" or cfg.judge.engine == "llm"


def penalty_term(cfg: PenaltiesConfig, *, domain: str = "", seed: int = 0,
                 chat_factory: ChatFactory | None = None) -> PenaltyTerm:
    """Dynalize's term: proposer, judge and an empty buffer, as `cfg` says; `chat_factory` builds
    an LLM's chat model (needed when `uses_llm(cfg)`).

    With the regex judge an LLM proposer must give a regex (candidates without one are rejected).
    """
    p, j = cfg.proposer, cfg.judge
    if uses_llm(cfg) and chat_factory is None:
        raise ValueError("an LLM proposer or judge needs a chat_factory (dynalize.build.build_chat_model)")
    if p.engine == "llm":
        from .penalties.proposer import LLMProposer

        assert p.chat is not None and chat_factory is not None
        dedup = labelled(chat_factory(p.dedup_chat), "dedup") if p.dedup_chat else None
        chat = labelled(chat_factory(p.chat), "proposer")
        proposer: Any = LLMProposer(chat, p, dedup, require_regex=j.engine == "regex")
    else:
        lexical = p.lexical
        if not j.context and "detectors" not in lexical.model_fields_set:
            # the default list: its detectors that read the conversation only where the judge reads it
            lexical = lexical.model_copy(update={"detectors": [
                name for name in lexical.detectors if not (name in DETECTORS and DETECTORS[name].needs_context)]})
        try:
            proposer = LexicalProposer(lexical)
        except ValueError as e:  # an unknown detector name
            raise ConfigError(f"config error: penalties.proposer.lexical.detectors: {e}") from None
        if not j.context and (reading := [d.name for d in proposer.detectors if d.needs_context]):
            raise ConfigError(f"config error: penalties.proposer.lexical.detectors has detectors that read the "
                              f"conversation ({', '.join(reading)}): they need penalties.judge.context: true, or "
                              f"leave them out of the list")
    judge: Judge = RegexJudge()
    if j.engine == "llm":
        assert chat_factory is not None
        judge = Judge(judge_chat(j, chat_factory), j, domain=domain, role="penalty judge")
    return PenaltyTerm(cfg, proposer, judge, PenaltyBuffer(), seed=seed, domain=domain)


def labelled(chat: ChatModel, role: str) -> ChatModel:
    """`chat`, its warnings naming `role` (the proposer, dedup, ...)."""
    chat.label = role
    return chat


def judge_chat(j: JudgeConfig, chat_factory: ChatFactory) -> ChatModel:
    """The LLM judge's chat model, at most `j.max_concurrency` requests in flight (a limit per
    request, so none is held through a retry's backoff)."""
    assert j.chat is not None
    limit = min(j.chat.max_concurrency, j.max_concurrency)
    return chat_factory(j.chat.model_copy(update={"max_concurrency": limit}))
