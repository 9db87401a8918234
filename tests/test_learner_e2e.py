"""The learner's options in whole runs: LoRA + packing + reference KL resume exactly and export."""

import anyio
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from dynalize import tiny
from dynalize.config import load_config
from dynalize.export import export_policy
from dynalize.run import main, train
from dynalize.runlog import read_jsonl

OPTIONS = ["policy.lora.r=4", "trainer.micro_batch_tokens=200", "trainer.kl.beta=0.1"]


@pytest.mark.slow
def test_a_lora_packed_kl_run_resumes_exactly_and_exports_the_merged_model_and_adapter(toy_overrides, tmp_path):
    straight = load_config(None, toy_overrides + OPTIONS + ["name=straight", "steps=4"])
    anyio.run(train, straight, False)
    anyio.run(train, load_config(None, toy_overrides + OPTIONS + ["name=split", "steps=2"]), False)
    assert main(["--resume", str(tmp_path / "split"), "steps=4"]) == 0
    a = read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    b = read_jsonl(tmp_path / "split" / "metrics.jsonl")
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        for key in ("loss", "reward/mean", "grad_norm", "kl/ref", "policy_version"):
            assert x[key] == y[key], (x["step"], key)
    assert a[0]["kl/ref"] == 0.0 and a[-1]["kl/ref"] > 0

    out = export_policy(tmp_path / "straight", tmp_path / "exported")
    merged = AutoModelForCausalLM.from_pretrained(out)
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.resolve("tiny:policy")),
                                        out / "adapter")
    ids = torch.tensor([[5, 9, 17, 33, 60]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, adapted(ids).logits, atol=1e-5)
