"""The learner's options: a loss by import path, the reference KL, dropout off for the ratio."""

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from dynalize import grpo, tiny
from dynalize.build import build_learner
from dynalize.config import ConfigError, TrainerConfig, load_config
from learnerkit import learner, mixed_batch, step_with_grads

ROOT = Path(__file__).resolve().parents[1]


# --- a loss by import path -------------------------------------------------------------------------

def test_a_loss_named_by_import_path_gets_the_built_in_inputs_and_its_kwargs(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    batch = mixed_batch()
    cfg = load_config(None, ["trainer.loss.name=examples.custom_loss:clipped_prime",
                             "trainer.loss.kwargs={max_abs: 0.5}"])
    custom, g_custom = step_with_grads(build_learner(cfg), batch)
    clipped = [type(s)(s.input_ids, s.loss_mask, s.gen_logprobs, max(-0.5, min(0.5, s.advantage))) for s in batch]
    builtin, g_builtin = step_with_grads(learner(TrainerConfig()), clipped)
    assert custom["loss"] == builtin["loss"]
    assert all(torch.equal(g_custom[k], g_builtin[k]) for k in g_builtin)


def test_a_loss_that_cannot_be_imported_is_a_config_error():
    cfg = load_config(None, ["trainer.loss.name=no_such_module_here:loss"])
    with pytest.raises(ConfigError, match="cannot import loss function"):
        build_learner(cfg)
    with pytest.raises(ConfigError, match="trainer.loss.name: .*'module:function'"):
        load_config(None, ["trainer.loss.name=priime"])


# --- reference KL ----------------------------------------------------------------------------------

def test_kl_estimators_by_hand():
    lp, ref = torch.log(torch.tensor([0.5, 0.2])), torch.log(torch.tensor([0.25, 0.4]))
    x = [math.log(2), math.log(0.5)]
    assert grpo.reference_kl(lp, ref, "k1").tolist() == pytest.approx(x)
    assert grpo.reference_kl(lp, ref, "k2").tolist() == pytest.approx([v * v / 2 for v in x])
    assert grpo.reference_kl(lp, ref, "k3").tolist() == pytest.approx([math.exp(-v) - 1 + v for v in x])


def sampled_by_the_policy(batch):
    """`batch` with the initial policy's own log-probabilities as the generator's: on-policy at the
    first step (the penalty is importance-weighted by π_θ / π_gen, as the policy loss)."""
    policy = AutoModelForCausalLM.from_pretrained(tiny.resolve("tiny:policy"))
    out = []
    with torch.no_grad():
        for s in batch:
            ids = torch.tensor([s.input_ids])
            lp = torch.log_softmax(policy(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
            out.append(type(s)(s.input_ids, s.loss_mask, [0.0] + lp.tolist(), s.advantage))
    return out


def train_kl(beta: float, steps: int = 4, lora=None):
    """KL to the initial policy logged at each of `steps` steps of lr 1e-3 on a fixed batch."""
    lrn = learner(TrainerConfig(lr=1e-3, kl={"beta": beta, "log": True}), lora=lora)
    batch = sampled_by_the_policy(mixed_batch())
    return lrn, batch, [lrn.train_step(batch)["kl/ref"] for _ in range(steps)]


@pytest.mark.slow
def test_a_kl_penalty_keeps_the_policy_closer_to_the_reference():
    _, _, free = train_kl(0.0)
    _, _, held = train_kl(4.0)  # its gradient starts at 0 (x = 0); it has 3 steps to pull back
    assert free[0] == 0.0 and held[0] == 0.0  # step 1 trains the reference itself
    assert free[-1] > 0
    assert held[-1] < 0.5 * free[-1]


@pytest.mark.slow
def test_the_logged_kl_is_the_k3_mean_over_policy_tokens_by_hand():
    lrn, batch, _ = train_kl(0.0, steps=2)
    state = lrn.policy_state()
    path = tiny.resolve("tiny:policy")
    policy = AutoModelForCausalLM.from_pretrained(path)
    policy.load_state_dict(state, strict=False)
    reference = AutoModelForCausalLM.from_pretrained(path)
    total = tokens = 0.0
    with torch.no_grad():
        for s in batch:
            ids = torch.tensor([s.input_ids])
            lp = torch.log_softmax(policy(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
            rp = torch.log_softmax(reference(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
            for a, b, m in zip(lp.tolist(), rp.tolist(), s.loss_mask[1:]):
                if m:
                    total += math.exp(b - a) - 1 + (a - b)
                    tokens += 1
    logged = lrn.train_step(batch)["kl/ref"]  # measured before this step's update
    assert logged == pytest.approx(total / tokens, rel=1e-4)
    assert logged > 0


def test_without_kl_settings_no_reference_is_loaded_and_no_kl_logged():
    lrn = learner(TrainerConfig())
    assert lrn.reference is None
    assert "kl/ref" not in lrn.train_step(mixed_batch())


# --- dropout and the importance ratio --------------------------------------------------------------

@pytest.fixture(scope="module")
def policy_with_dropout(tmp_path_factory) -> str:
    model = AutoModelForCausalLM.from_pretrained(tiny.resolve("tiny:policy"), attention_dropout=0.3)
    out = tmp_path_factory.mktemp("dropout_policy")
    model.save_pretrained(out)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tiny.resolve("tiny:policy")).save_pretrained(out)
    return str(out)


def twice(lrn):
    t = lrn._collate(mixed_batch()[:3])
    with torch.no_grad():
        return lrn._logprobs(t, 1), lrn._logprobs(t, 1)


def test_the_learner_computes_the_ratio_with_dropout_off_by_default(policy_with_dropout):
    a, b = twice(learner(TrainerConfig(), path=policy_with_dropout))
    assert torch.equal(a, b)  # the same tokens, the same log-probabilities: on-policy r = 1


def test_disable_dropout_false_keeps_the_models_dropout(policy_with_dropout):
    a, b = twice(learner(TrainerConfig(disable_dropout=False), path=policy_with_dropout))
    assert (a - b).abs().max().item() > 1e-3


def test_warmup_raises_the_lr_linearly_then_holds_it_and_a_resumed_learner_continues_the_schedule(tmp_path):
    cfg = TrainerConfig(lr=1e-3, warmup_steps=4)
    lrn = learner(cfg)
    seen = [lrn.train_step(mixed_batch(seed=s))["lr"] for s in range(3)]
    assert seen == pytest.approx([2.5e-4, 5e-4, 7.5e-4])
    assert [g["lr"] for g in lrn.optimizer.param_groups] == pytest.approx([7.5e-4])  # what the optimizer stepped on
    lrn.save(str(tmp_path / "ckpt"))
    resumed = learner(cfg)
    resumed.load(str(tmp_path / "ckpt"))
    assert [resumed.train_step(mixed_batch(seed=s))["lr"] for s in (3, 4)] == pytest.approx([1e-3, 1e-3])
    assert learner(TrainerConfig(lr=1e-3)).train_step(mixed_batch())["lr"] == 1e-3  # default: no warmup
