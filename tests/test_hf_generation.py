"""HFGenerator: log-probabilities read step by step (memory that does not grow with the vocabulary),
and the fast path (static KV cache, a compiled decoding step on a GPU) sampling exactly as the plain one.

The memory test measures each generation in its own process (benchmarks/memory.py's cells): peak
resident set, the models' parameters aside, at Qwen3's vocabulary against 8,192.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest
import torch

from dynalize import tiny
from dynalize.backends.base import SamplingParams
from dynalize.backends.hf import HFGenerator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

PROMPTS = [[5, 6, 7, 8], [40, 41], [100, 7, 300, 12, 9]] * 3
SAMPLINGS = [SamplingParams(max_new_tokens=24, seed=4),
             SamplingParams(max_new_tokens=30, seed=1, temperature=0.7, top_p=0.9, min_p=0.05)]


@pytest.fixture(scope="module")
def policy():
    return tiny.resolve("tiny:policy")


def generate(gen: HFGenerator, sampling: SamplingParams, prompts=PROMPTS):
    return anyio.run(gen.generate, prompts, sampling)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t0.7-top_p-min_p"])
def test_reported_logprobs_are_log_softmax_of_logits_over_temperature_at_the_sampled_token(policy, sampling):
    """What the learner recomputes: log softmax(logits / T) of the sampled token, before top-p/min-p."""
    gen = HFGenerator(policy, fast="off")
    for prompt, c in zip(PROMPTS, generate(gen, sampling)):
        ids = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            logits = gen.model(ids).logits[0, len(prompt) - 1 : -1].float() / sampling.temperature
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        assert len(c.logprobs) == len(c.token_ids)
        assert c.logprobs == pytest.approx(expected.tolist(), abs=1e-5)
        if sampling.top_p < 1:
            assert all(lp < 0 for lp in c.logprobs)  # the unrenormalised probability, not the nucleus's


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t0.7-top_p-min_p"])
def test_fast_path_samples_the_same_tokens_and_logprobs_as_the_plain_path(policy, sampling):
    plain = generate(HFGenerator(policy, fast="off"), sampling)
    fast_gen = HFGenerator(policy, fast="on")
    fast = generate(fast_gen, sampling)
    assert [c.token_ids for c in fast] == [c.token_ids for c in plain]
    assert [c.finish_reason for c in fast] == [c.finish_reason for c in plain]
    for f, p in zip(fast, plain):  # float32 rounding of attention over the longer (masked) static cache
        assert f.logprobs == pytest.approx(p.logprobs, abs=1e-5)
    assert fast_gen.fast and not fast_gen.compiles  # a CPU: the static cache, no compiling


def test_fast_path_pays_its_first_batch_once_per_shape(policy):
    gen = HFGenerator(policy, fast="on")
    sampling = SamplingParams(max_new_tokens=8, seed=0)
    generate(gen, sampling)
    generate(gen, sampling, [[9, 10, 11, 12, 13, 14]] * len(PROMPTS))  # another width, the same cache size
    assert list(gen.first_call_s) == [(len(PROMPTS), 256)]
    generate(gen, sampling, PROMPTS[:2])  # a smaller last batch: its own shape
    assert list(gen.first_call_s) == [(len(PROMPTS), 256), (2, 256)]


def test_fast_is_auto_on_cuda_only_and_rejects_other_values(policy):
    assert HFGenerator(policy, device="cpu").fast is False  # auto, on a CPU
    with pytest.raises(ValueError, match="hf_fast must be one of auto, on, off"):
        HFGenerator(policy, fast="yes")


def test_the_run_config_reaches_the_generator(policy):
    from dynalize.build import build_generator
    from dynalize.config import load_config

    gen = build_generator(load_config(None, ["generator.hf_fast=on"]), policy)
    assert gen.fast is True


@pytest.fixture(scope="module")
def two_vocabularies(tmp_path_factory):
    import memory

    work = tmp_path_factory.mktemp("vocab")
    return {v: memory.build_models(work, v, "small", "float32") for v in (8192, 151936)}


@pytest.mark.slow
def test_generation_memory_does_not_grow_with_the_vocabulary(two_vocabularies):
    """8 rollouts × 128 new tokens: peak RSS (weights aside) at vocabulary 151,936 within 1.5× of
    8,192. Keeping every step's logits took 4.6× here (2.5 GB against 0.55 GB)."""
    import memory

    peaks = {}
    for vocab, models in two_vocabularies.items():
        r = memory.run_cell({"framework": "dynalize", "part": "generation", "vocab": vocab, "new_tokens": 128,
                             "batch": 8, "micro_batch": 4, "dtype": "float32", "fast": "off", **models}, timeout=600)
        assert "error" not in r, r
        assert r["mean_len"] > 100  # the batch ran (almost) to the cap
        peaks[vocab] = r["peak_minus_weights_mib"]
    assert peaks[151936] <= memory.BOUND * peaks[8192], peaks


def test_evaluation_generates_with_the_same_generator_and_its_options(policy):
    from dynalize.eval.policy import load_policy

    sampler = load_policy(policy, "hf", fast="on")
    assert isinstance(sampler.generator, HFGenerator) and sampler.generator.fast
    anyio.run(sampler.close)
