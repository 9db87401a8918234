"""A run's reward as a sum of named terms: the RM score (`rm`), rubric rewards (`rubric`,
coef · R̃), Dynalize's penalties (`penalties`, −λ · violations). A new kind of reward is one
`RewardTerm` subclass here."""

from .base import RewardTerm, TermScores, score_batch
from .penalties import PenaltyTerm
from .rm import RMTerm
from .rubric import RubricTerm

__all__ = ["PenaltyTerm", "RMTerm", "RewardTerm", "RubricTerm", "TermScores", "score_batch"]
