"""The learner's scale features turned on together give the numbers of each alone: packing with a
reference KL, with and without LoRA (whose reference is the base with its adapters off), against
the padded run on the same batches. FSDP2 with packing and a reference KL: tests/test_fsdp.py."""

import pytest

from dynalize.config import LoraConfig, TrainerConfig
from learnerkit import learner, multiturn_batch, mixed_batch, step_with_grads

LORA = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_packing_and_a_reference_kl_give_the_padded_runs_loss_gradients_and_kl(lora):
    kl = {"beta": 0.1}
    padded = learner(TrainerConfig(lr=1e-2, micro_batch_size=3, kl=kl), lora=lora)
    packed = learner(TrainerConfig(lr=1e-2, micro_batch_tokens=48, kl=kl), lora=lora)
    assert (padded.reference is None) == (packed.reference is None) == (lora is not None)
    kls = []
    for batch in (mixed_batch(), multiturn_batch()):
        a, g_pad = step_with_grads(padded, batch)
        b, g_pack = step_with_grads(packed, batch)
        assert b["loss_tokens"] == a["loss_tokens"]
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        assert b["kl/ref"] == pytest.approx(a["kl/ref"], rel=1e-3, abs=1e-8)
        assert set(g_pack) == set(g_pad)
        assert max((g_pack[k] - g_pad[k]).abs().max().item() for k in g_pad) <= 1e-5
        kls.append(a["kl/ref"])
    assert kls[0] == pytest.approx(0.0, abs=1e-9) and kls[-1] > 1e-6  # the policy moved off its reference
