"""LoRA through peft (`policy.lora`): adapters trained alone, merged weights handed out, exact resume."""

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from dynalize import tiny
from dynalize.config import LoraConfig, TrainerConfig
from dynalize.backends.accelerate import AccelerateLearner
from learnerkit import learner, mixed_batch, step_with_grads

LORA = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])


def trained(steps: int = 2):
    lrn = learner(TrainerConfig(lr=1e-2), lora=LORA)
    for _ in range(steps):
        lrn.train_step(mixed_batch())
    return lrn


def test_lora_trains_the_adapters_only():
    lrn = learner(TrainerConfig(lr=1e-2), lora=LORA)
    base_before = {k: v.clone() for k, v in lrn.unwrapped.get_base_model().state_dict().items() if "lora_" not in k}
    _, grads = step_with_grads(lrn, mixed_batch())
    assert grads and all("lora_" in name for name in grads)
    optimized = sum(p.numel() for g in lrn.optimizer.param_groups for p in g["params"])
    assert optimized == sum(p.numel() for n, p in lrn.model.named_parameters() if "lora_" in n)
    after = lrn.unwrapped.get_base_model().state_dict()
    assert all(torch.equal(after[k], v) for k, v in base_before.items())


def test_the_generator_gets_merged_weights_equal_to_peft_merge():
    lrn = trained()
    state = lrn.policy_state()
    merged = lrn.unwrapped.merge_and_unload().state_dict()  # peft's own merge (the learner is done)
    assert set(state) - {"lm_head.weight"} == set(merged) - {"lm_head.weight"}
    for k, v in state.items():
        assert torch.allclose(v, merged[k], atol=1e-6), k
    assert any(not torch.equal(state[k], v) for k, v in AutoModelForCausalLM.from_pretrained(
        tiny.resolve("tiny:policy")).state_dict().items() if k in state)  # the adapters did change it


def test_a_lora_checkpoint_resumes_exactly_and_holds_the_merged_policy_and_the_adapter(tmp_path):
    lrn = trained(steps=1)
    lrn.save(str(tmp_path / "ckpt"))
    lrn.train_step(mixed_batch())
    continued = lrn.policy_state()

    resumed = learner(TrainerConfig(lr=1e-2), lora=LORA)
    resumed.load(str(tmp_path / "ckpt"))
    resumed.train_step(mixed_batch())
    again = resumed.policy_state()
    assert all(torch.equal(continued[k], again[k]) for k in continued)

    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "policy")
    base = AutoModelForCausalLM.from_pretrained(tiny.resolve("tiny:policy"))
    adapted = PeftModel.from_pretrained(base, tmp_path / "ckpt" / "adapter")
    ids = torch.tensor([mixed_batch()[0].input_ids])
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, adapted(ids).logits, atol=1e-5)


def test_lora_reference_kl_uses_the_base_with_adapters_off():
    lrn = learner(TrainerConfig(lr=1e-2, kl={"beta": 0.1}), lora=LORA)
    assert lrn.reference is None  # no second copy
    first = lrn.train_step(mixed_batch())["kl/ref"]
    second = lrn.train_step(mixed_batch())["kl/ref"]
    assert first == pytest.approx(0.0, abs=1e-9)  # B = 0 at the start: the adapted model is the base
    assert second > 0


def test_the_adapters_start_from_the_seed_whatever_the_global_rng():
    torch.manual_seed(123)
    a = learner(TrainerConfig(), lora=LORA).unwrapped.state_dict()
    torch.rand(1000)
    b = AccelerateLearner(tiny.resolve("tiny:policy"), TrainerConfig(), lora=LORA).unwrapped.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_merged_weights_are_w_plus_delta_rounded_once():
    """A bf16 base: each merged weight is W + ΔW computed in float32 and rounded once to bf16 (as
    peft's own merge does), not ΔW rounded to bf16 first and the sum rounded again."""
    from peft.tuners.lora import LoraLayer

    lrn = learner(TrainerConfig(lr=1e-2), lora=LORA, dtype="bfloat16")
    for _ in range(2):
        lrn.train_step(mixed_batch())
    state = lrn.policy_state()
    twice_rounded = 0
    for name, module in lrn.unwrapped.get_base_model().named_modules():
        if isinstance(module, LoraLayer):
            w = module.get_base_layer().weight.detach()
            delta = module.get_delta_weight("default").float()
            assert w.dtype == state[f"{name}.weight"].dtype == torch.bfloat16
            assert torch.equal(state[f"{name}.weight"], (w.float() + delta).to(torch.bfloat16)), name
            twice_rounded += int((w + delta.to(torch.bfloat16) != (w.float() + delta).to(torch.bfloat16)).sum())
    assert twice_rounded > 0  # the two roundings differ here (else this test could not tell them apart)
