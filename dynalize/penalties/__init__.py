"""Evolving penalties: a proposer writes negative rubrics, a buffer keeps the live ones, a judge
checks every rollout against them, and `PenaltyEngine` joins the three for the training loop."""

from .buffer import PenaltyBuffer, PenaltyBufferError
from .candidate import Candidate, ProposalResult, Proposer
from .engine import PenaltyEngine
from .judge import Judge, JudgeStats, Judgement, RegexJudge
from .lexical import LexicalProposer
from .proposer import LLMProposer
from .views import ProposerView, ViewSample, build_view

__all__ = [
    "Candidate", "Judge", "JudgeStats", "Judgement", "LLMProposer", "LexicalProposer", "PenaltyBuffer",
    "PenaltyBufferError", "PenaltyEngine", "ProposalResult", "Proposer", "ProposerView", "RegexJudge",
    "ViewSample", "build_view",
]
