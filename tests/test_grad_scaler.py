"""float16 policies: the loss scaler's state resumes exactly, and a step the scaler skips is no
new policy version and logs the skip, not a NaN gradient norm."""

import json

import pytest
import torch

from dynalize import tiny
from dynalize.backends.accelerate import AccelerateLearner
from dynalize.config import TrainerConfig
from dynalize.types import TrainSequence

OVERFLOW = 1e4
"""An advantage scale whose gradients overflow float16 once multiplied by the loss scale."""


def batch(advantage_scale: float = 1.0) -> list[TrainSequence]:
    ids = list(range(5, 21))
    return [TrainSequence(ids, [0] * 4 + [1] * 12, [0.0] * 4 + [-3.0] * 12, adv * advantage_scale)
            for adv in (1.0, -1.0, 0.5, -0.5)]


def fp16_learner() -> AccelerateLearner:
    return AccelerateLearner(tiny.resolve("tiny:policy"), TrainerConfig(lr=1e-3, micro_batch_size=4),
                             dtype="float16")


def master_weights(learner: AccelerateLearner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.unwrapped.state_dict().items()}


@pytest.mark.slow
def test_a_skipped_fp16_step_is_no_new_policy_version_and_logs_no_nan_grad_norm():
    learner = fp16_learner()
    learner.train_step(batch())
    before, version = master_weights(learner), learner.version
    metrics = learner.train_step(batch(OVERFLOW))
    assert learner.version == version  # the generator keeps sampling the same policy version
    assert all(v == v for v in metrics.values())  # no NaN anywhere in the line
    assert "grad_norm" not in metrics  # an inf/NaN norm would say nothing of the policy
    assert metrics["skipped_step"] == 1.0
    after = master_weights(learner)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert metrics["grad_scale"] == 32768.0  # backed off once from 65536
    normal = learner.train_step(batch())
    assert normal["skipped_step"] == 0.0 and normal["grad_norm"] == normal["grad_norm"]
    assert learner.version == version + 1


@pytest.mark.slow
def test_resume_continues_with_the_loss_scale_reached_and_trains_exactly_as_without_the_break(tmp_path):
    straight = fp16_learner()
    for advantage_scale in (1.0, OVERFLOW, 1.0, OVERFLOW):  # two overflows: 65536 -> 16384
        straight.train_step(batch(advantage_scale))
    straight.save(str(tmp_path / "ckpt"))
    for _ in range(2):
        straight.train_step(batch())

    resumed = fp16_learner()
    resumed.load(str(tmp_path / "ckpt"))
    assert resumed.scaler.get_scale() == 16384.0  # not the initial 65536
    for _ in range(2):
        resumed.train_step(batch())
    a, b = master_weights(straight), master_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a), max((a[k] - b[k]).abs().max().item() for k in a)
    assert resumed.scaler.state_dict() == straight.scaler.state_dict()
    saved = json.loads((tmp_path / "ckpt" / "learner.json").read_text())  # JSON: nothing to unpickle
    assert saved["grad_scaler"]["scale"] == 16384.0
    assert saved["version"] == 2  # the two skipped steps made no policy version
