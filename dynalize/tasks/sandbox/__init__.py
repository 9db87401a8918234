"""The sandbox: a planted-hack world where reward hacking and its cure run on a CPU in minutes.

A tiny policy pre-trained on a small grammar of replies about topics (`pretrain`, registered as
`tiny:sandbox-policy`), a gold quality score (`gold`), and a flawed RM that tracks gold but also
pays for configurable surface features (`reward`, `features`); `learned_rm` trains a tiny
Bradley–Terry RM on pairs that flawed RM labels (`tiny:sandbox-rm`). `multiturn` plays the same
world over conversations of up to four replies with a simulated user (`sandbox_multiturn`).
"""

from .features import (FEATURE_SETS, Feature, alternative_features, default_features, describe_features,
                       feature_prevalence)
from .gold import gold_parts, gold_score
from .learned_rm import LEARNED_RM_NAME, build_learned_rm
from .multiturn import SandboxMultiturnArgs, SandboxMultiturnTask
from .multiturn_policy import MULTITURN_POLICY_NAME
from .pretrain import POLICY_NAME, build_sandbox_policy, sample_replies
from .reward import SandboxRewardModel, feature_bonus
from .task import SandboxArgs, SandboxTask
from .topics import ALL_TOPICS, Topic, find_topic, split_topics

__all__ = [
    "ALL_TOPICS", "FEATURE_SETS", "LEARNED_RM_NAME", "MULTITURN_POLICY_NAME", "POLICY_NAME", "Feature", "SandboxArgs",
    "SandboxMultiturnArgs", "SandboxMultiturnTask", "SandboxRewardModel", "SandboxTask", "Topic",
    "alternative_features", "build_learned_rm", "build_sandbox_policy", "default_features", "describe_features",
    "feature_bonus", "feature_prevalence", "find_topic", "gold_parts", "gold_score", "sample_replies",
    "split_topics",
]
