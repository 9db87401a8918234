"""The learner's precision: float32 master weights under a bf16 policy keep small updates."""

import pytest
import torch

from dynalize import tiny
from dynalize.backends.accelerate import AccelerateLearner
from dynalize.config import TrainerConfig
from dynalize.types import TrainSequence


def batch() -> list[TrainSequence]:
    ids = list(range(5, 21))
    return [TrainSequence(ids, [0] * 4 + [1] * 12, [0.0] * 4 + [-3.0] * 12, adv) for adv in (1.0, -1.0, 0.5, -0.5)]


def weights_changed(master: str) -> tuple[float, torch.dtype]:
    """Share of the policy's weights (in its own dtype) that one step at lr 1e-6 changed."""
    learner = AccelerateLearner(tiny.resolve("tiny:policy"), TrainerConfig(lr=1e-6, master_weights=master),
                                dtype="bfloat16")
    before = learner.policy_state()
    learner.train_step(batch())
    after = learner.policy_state()
    changed = sum(int((after[k] != before[k]).sum()) for k in before)
    return changed / sum(v.numel() for v in before.values()), next(iter(after.values())).dtype


@pytest.mark.slow
def test_float32_master_weights_keep_updates_a_bf16_policy_would_round_away():
    with_master, dtype = weights_changed("float32")
    in_bf16, _ = weights_changed("policy")
    assert dtype == torch.bfloat16  # the generator gets the policy's dtype either way
    assert with_master > 0.01  # the step moved the weights ...
    assert in_bf16 < with_master / 10  # ... which pure bf16 training mostly rounds away
