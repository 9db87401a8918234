"""The reference KL penalty's gradients: each setting's expected gradient is that of KL(π_θ ‖ π_ref),
checked exactly on a 6-way categorical (the sum over outcomes weighted by their probability), on
the policy's own samples and on stale ones; and in the learner, the penalty reaches the loss."""

import math

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from dynalize import grpo, tiny
from dynalize.api import resolve_config
from dynalize.build import check_config
from dynalize.config import ConfigError, TrainerConfig
from learnerkit import learner, mixed_batch, step_with_grads

SETTINGS = [("loss", "k3"), ("loss", "k2"), ("advantage", "k1")]
"""(placement, estimator): the settings a penalty accepts."""


def categorical(seed: int):
    """Logits θ of a 6-way policy, the reference's log-probabilities, a stale generator's."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda: 1.5 * torch.randn(6, generator=g, dtype=torch.float64)  # noqa: E731
    return draw(), torch.log_softmax(draw(), -1), torch.log_softmax(draw(), -1)


def expected_gradient(term, theta, ref_lp, gen_lp=None):
    """Σ_y π_gen(y) · ∇_θ term(y), exactly: each outcome y a one-token sample. On-policy
    (`gen_lp` None) π_gen is π_θ itself, held fixed as the sampler is."""
    theta = theta.clone().requires_grad_(True)
    lp = torch.log_softmax(theta, -1)
    gen = lp.detach() if gen_lp is None else gen_lp
    per_outcome = term(lp[:, None], gen[:, None], ref_lp[:, None])[:, 0]
    (gen.exp() * per_outcome).sum().backward()
    return theta.grad


def grad_kl_policy_to_reference(theta, ref_lp):
    """∂/∂θ KL(π_θ ‖ π_ref) = p ⊙ (log p − log q − KL), by hand."""
    lp = torch.log_softmax(theta, -1)
    p = lp.exp()
    return p * (lp - ref_lp - (p * (lp - ref_lp)).sum())


def grad_kl_reference_to_policy(theta, ref_lp):
    """∂/∂θ KL(π_ref ‖ π_θ) = p − q, by hand."""
    return torch.softmax(theta, -1) - ref_lp.exp()


def penalty(placement, estimator):
    ones = lambda lp: torch.ones_like(lp)  # noqa: E731
    return lambda lp, gen, ref: grpo.reference_kl_penalty(lp, gen, ref, ones(lp), estimator, placement)


@pytest.mark.parametrize("placement,estimator", SETTINGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_penalty_has_the_gradient_of_kl_policy_to_reference_on_policy(placement, estimator, seed):
    theta, ref, _ = categorical(seed)
    got = expected_gradient(penalty(placement, estimator), theta, ref)
    assert torch.allclose(got, grad_kl_policy_to_reference(theta, ref), atol=1e-9)


@pytest.mark.parametrize("placement,estimator", SETTINGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_penalty_has_the_gradient_of_kl_policy_to_reference_on_stale_samples(placement, estimator, seed):
    theta, ref, gen = categorical(seed)
    got = expected_gradient(penalty(placement, estimator), theta, ref, gen)
    want = grad_kl_policy_to_reference(theta, ref)
    assert torch.allclose(got, want, atol=1e-9)
    # without the importance weight the stale samples would pull elsewhere
    unweighted = expected_gradient(lambda lp, g, r: grpo.reference_kl(lp, r, "k2"), theta, ref, gen)
    assert (unweighted - want).abs().max() > 1e-3


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_the_importance_weighted_k1_and_k3_values_are_the_kl_exactly(estimator):
    theta, ref, gen = categorical(3)
    lp = torch.log_softmax(theta, -1)
    placement = "advantage" if estimator == "k1" else "loss"
    value = penalty(placement, estimator)(lp[:, None], gen[:, None], ref[:, None])[:, 0]
    kl = (lp.exp() * (lp - ref)).sum()
    assert (gen.exp() * value).sum().item() == pytest.approx(kl.item(), abs=1e-12)


def test_unweighted_k1_and_k3_terms_are_what_the_docs_say_they_are():
    """Why the penalty is not the estimator itself: as a loss term on the policy's samples k1's
    expected gradient is 0, and k3's is the gradient of the other KL, KL(π_ref ‖ π_θ)."""
    theta, ref, _ = categorical(4)
    k1 = expected_gradient(lambda lp, g, r: grpo.reference_kl(lp, r, "k1"), theta, ref)
    k3 = expected_gradient(lambda lp, g, r: grpo.reference_kl(lp, r, "k3"), theta, ref)
    assert k1.abs().max() < 1e-12
    assert torch.allclose(k3, grad_kl_reference_to_policy(theta, ref), atol=1e-12)
    assert (k3 - grad_kl_policy_to_reference(theta, ref)).abs().max() > 1e-2


def test_the_penalty_is_zero_and_finite_off_policy_tokens():
    lp = torch.tensor([[-1000.0, -0.5]], requires_grad=True)  # a padded position far off the reference
    ref, gen, mask = torch.tensor([[0.0, -1.0]]), torch.tensor([[0.0, -0.7]]), torch.tensor([[0, 1]])
    for placement, estimator in SETTINGS:
        out = grpo.reference_kl_penalty(lp, gen, ref, mask, estimator, placement)
        out.sum().backward()
        assert out[0, 0].item() == 0.0 and torch.isfinite(lp.grad).all()
        lp.grad = None


# --- the config ------------------------------------------------------------------------------------

def refusal(overrides, resume=None) -> str | None:
    """The one line a run with these settings stops on before any model loads (None: it starts)."""
    try:
        check_config(resolve_config(None, overrides, resume=resume))
    except ConfigError as e:
        return str(e)
    return None


def test_k1_in_the_loss_is_refused_in_one_line():
    k1_in_loss = refusal([("trainer.kl.beta", 0.1), ("trainer.kl.estimator", "k1")])
    assert k1_in_loss == ("config error: trainer.kl: estimator k1 as a loss term has expected gradient 0 on the "
                          "policy's samples (a silent no-op): set trainer.kl.placement=advantage for k1, or "
                          "trainer.kl.estimator=k3 or k2")
    k3_as_advantage = refusal([("trainer.kl.beta", 0.1), ("trainer.kl.placement", "advantage")])
    assert k3_as_advantage.startswith("config error: trainer.kl: placement advantage takes estimator k1")
    assert "\n" not in k3_as_advantage
    assert refusal([("trainer.kl.beta", 0.1), ("trainer.kl.placement", "advantage"),
                    ("trainer.kl.estimator", "k1")]) is None
    assert refusal([("trainer.kl.log", True), ("trainer.kl.estimator", "k1")]) is None  # logs, penalises nothing


def test_an_earlier_runs_kl_settings_load_on_resume_and_an_override_mends_k1(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    saved = resolve_config(None, []).model_dump(mode="json")
    saved["trainer"]["kl"] = {"beta": 0.1, "estimator": "k1", "reference": None, "log": False}  # no placement
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert resolve_config(None, [], resume=run).trainer.kl.placement == "loss"  # it loads
    assert refusal([], resume=run).startswith("config error: trainer.kl: estimator k1 as a loss term")
    assert refusal([("trainer.kl.placement", "advantage")], resume=run) is None
    saved["trainer"]["kl"]["estimator"] = "k3"
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert refusal([], resume=run) is None  # the old default resumes as it is


# --- in the learner --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def moved_reference(tmp_path_factory) -> str:
    """A reference some way from the policy (tiny:policy with noise on its weights), on disk."""
    model = AutoModelForCausalLM.from_pretrained(tiny.resolve("tiny:policy"))
    torch.manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    out = tmp_path_factory.mktemp("reference")
    model.save_pretrained(out)
    return str(out)


def by_hand(batch, reference: str):
    """The documented per-token gradient r·x·∇log π_θ as the gradient of Σ sg(r·x)·log π_θ / N, the
    per-token (r, x) and N, from separately loaded models (policy: tiny:policy, as the learner starts)."""
    policy = AutoModelForCausalLM.from_pretrained(tiny.resolve("tiny:policy"))
    ref_model = AutoModelForCausalLM.from_pretrained(reference)
    n = sum(sum(s.loss_mask) for s in batch)
    surrogate, tokens = 0.0, []
    for s in batch:
        ids = torch.tensor([s.input_ids])
        lp = torch.log_softmax(policy(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
        with torch.no_grad():
            rp = torch.log_softmax(ref_model(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
        for i, m in enumerate(s.loss_mask[1:]):
            if m:
                x = (lp[i] - rp[i]).item()
                r = math.exp(lp[i].item() - s.gen_logprobs[i + 1])
                surrogate = surrogate + r * x * lp[i] / n
                tokens.append((r, x))
    surrogate.backward()
    return {k: p.grad for k, p in policy.named_parameters() if p.grad is not None}, tokens, n


ESTIMATE = {"k1": lambda x: x, "k2": lambda x: x * x / 2, "k3": lambda x: math.exp(-x) - 1 + x}
"""Schulman's estimators by hand: what `kl/ref` averages; the loss adds r times them (k2: r detached)."""


@pytest.mark.slow
def test_each_kl_setting_reaches_the_learners_loss_and_gradient_as_documented(moved_reference):
    """On the mixed batch (its generator log-probabilities are not the policy's: stale samples),
    β = 1 adds β·Σ r·k / N to the loss and β·∇Σ sg(r·x)·log π_θ / N to the gradient; `kl/ref`
    is the estimator's mean over policy tokens."""
    batch = mixed_batch()
    grads_hand, tokens, n = by_hand(batch, moved_reference)
    free = dict(lr=1e-6, max_grad_norm=1e9)
    base, g_base = step_with_grads(learner(TrainerConfig(**free, kl={"log": True}), reference=moved_reference),
                                   batch)
    want = torch.cat([grads_hand[k].flatten() for k in grads_hand])
    for placement, estimator in SETTINGS:
        kl = {"beta": 1.0} | ({} if (placement, estimator) == SETTINGS[0] else  # the default: beta alone
                             {"placement": placement, "estimator": estimator})
        metrics, grads = step_with_grads(learner(TrainerConfig(**free, kl=kl), reference=moved_reference), batch)
        diff = torch.cat([(grads[k] - g_base[k]).flatten() for k in grads_hand])
        assert (diff - want).norm() < 1e-4 * want.norm(), (placement, estimator, (diff - want).norm() / want.norm())
        est = ESTIMATE[estimator]
        assert metrics["loss"] - base["loss"] == pytest.approx(sum(r * est(x) for r, x in tokens) / n, rel=1e-4)
        assert metrics["kl/ref"] == pytest.approx(sum(est(x) for _, x in tokens) / n, rel=1e-4)
