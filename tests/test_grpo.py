"""GRPO advantages and losses against numbers computed by hand."""

import math

import pytest
import torch

from dynalize import grpo


def test_group_advantages_mean_only_by_default():
    adv = grpo.group_advantages(torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 4.0]]))
    expected = torch.tensor([[-1.0, 0.0, 1.0], [-4 / 3, -4 / 3, 8 / 3]])
    assert torch.allclose(adv, expected)


def test_group_advantages_std_option():
    adv = grpo.group_advantages(torch.tensor([[0.0, 0.0, 4.0]]), std_normalize=True, eps=0.0)
    std = math.sqrt(((4 / 3) ** 2 * 2 + (8 / 3) ** 2) / 2)  # unbiased std of [0, 0, 4]
    assert torch.allclose(adv, torch.tensor([[-4 / 3 / std, -4 / 3 / std, 8 / 3 / std]]))


def _probs(*ps):
    return torch.log(torch.tensor([list(ps)]))


def test_prime_loss_masks_tokens_pushed_past_threshold_positive_advantage():
    logprobs = _probs(0.5, 0.5, 0.9).requires_grad_(True)
    gen = _probs(0.25, 0.5, 0.5)
    out = grpo.prime_loss(logprobs, gen, torch.tensor([1.0]), torch.ones(1, 3), num_loss_tokens=3)
    # tokens 1 and 3 moved up by > 0.2 with A > 0: masked out of −A·r; token 2 has r = 1
    c = 1e-3
    assert out.loss.item() == pytest.approx((-1 + c * math.log(2) ** 2 + c * math.log(1.8) ** 2) / 3, rel=1e-6)
    assert out.masked_tokens.item() == 2


def test_a_token_outside_the_trust_region_is_still_pulled_back_by_the_log_ratio_term():
    """prime-rl's default KL mask (`all`): (log r)² acts on every policy token, so a token the
    policy pushed past the trust region gets the gradient that pulls it back, not zero."""
    logprobs = _probs(0.5, 0.5, 0.9).requires_grad_(True)
    out = grpo.prime_loss(logprobs, _probs(0.25, 0.5, 0.5), torch.tensor([1.0]), torch.ones(1, 3), num_loss_tokens=3)
    out.loss.backward()
    c = 1e-3
    assert logprobs.grad.tolist()[0] == pytest.approx([2 * c * math.log(2) / 3, -1 / 3, 2 * c * math.log(1.8) / 3])


@pytest.mark.parametrize(("kl_mask_type", "kl_tokens"), [("all", [1, 1, 1]), ("unmasked", [0, 1, 0]),
                                                          ("masked", [1, 0, 1])])
def test_kl_mask_type_chooses_the_tokens_the_log_ratio_term_acts_on(kl_mask_type, kl_tokens):
    logprobs = _probs(0.5, 0.6, 0.9).requires_grad_(True)
    gen = _probs(0.25, 0.5, 0.5)  # token 2 moved by 0.1: inside the region; 1 and 3 outside
    out = grpo.prime_loss(logprobs, gen, torch.tensor([1.0]), torch.ones(1, 3), num_loss_tokens=3,
                          kl_mask_type=kl_mask_type)
    out.loss.backward()
    c, log_r = 1e-3, [math.log(2), math.log(1.2), math.log(1.8)]
    pg = [0.0, -1.2 / 3, 0.0]  # ∂(−A·r)/∂logπ = −A·r, inside the region only
    expected = [p + k * 2 * c * lr / 3 for p, k, lr in zip(pg, kl_tokens, log_r)]
    assert logprobs.grad.tolist()[0] == pytest.approx(expected, rel=1e-6)
    assert out.masked_tokens.item() == 2


def test_prime_loss_negative_advantage_keeps_tokens_that_moved_up():
    logprobs = _probs(0.5, 0.5, 0.9)
    gen = _probs(0.25, 0.5, 0.5)
    out = grpo.prime_loss(logprobs, gen, torch.tensor([-1.0]), torch.ones(1, 3), num_loss_tokens=3)
    t1 = 2.0 + 1e-3 * math.log(2.0) ** 2
    t2 = 1.0
    t3 = 1.8 + 1e-3 * math.log(1.8) ** 2
    assert out.loss.item() == pytest.approx((t1 + t2 + t3) / 3, rel=1e-6)
    assert out.masked_tokens.item() == 0


def test_prime_loss_negative_advantage_masks_tokens_pushed_down():
    out = grpo.prime_loss(_probs(0.1), _probs(0.5), torch.tensor([-1.0]), torch.ones(1, 1), num_loss_tokens=1)
    assert out.masked_tokens.item() == 1
    assert out.loss.item() == pytest.approx(1e-3 * math.log(0.2) ** 2, rel=1e-6)  # only the (log r)² term


def test_prime_loss_ignores_non_policy_tokens_and_divides_by_given_count():
    logprobs = _probs(0.5, 0.5)
    gen = _probs(0.5, 0.5)
    out = grpo.prime_loss(logprobs, gen, torch.tensor([2.0]), torch.tensor([[0, 1]]), num_loss_tokens=4)
    assert out.loss.item() == pytest.approx(-2.0 / 4)


def test_ppo_clip_loss():
    logprobs = _probs(0.5, 0.5, 0.25)
    gen = _probs(0.25, 0.5, 0.5)  # ratios 2, 1, 0.5
    out = grpo.ppo_clip_loss(logprobs, gen, torch.tensor([1.0]), torch.ones(1, 3), num_loss_tokens=3, clip_eps=0.2)
    assert out.loss.item() == pytest.approx(-(1.2 + 1.0 + 0.5) / 3)
    assert out.masked_tokens.item() == 1
    neg = grpo.ppo_clip_loss(logprobs, gen, torch.tensor([-1.0]), torch.ones(1, 3), num_loss_tokens=3, clip_eps=0.2)
    # −min(−r, −clip(r)) = max(r, clip(r)): 2, 1, 0.8
    assert neg.loss.item() == pytest.approx((2.0 + 1.0 + 0.8) / 3)


def test_token_logprobs_aligns_to_inputs_and_uses_temperature():
    logits = torch.tensor([[[0.0, 0.0], [2.0, 0.0], [0.0, 0.0]]])
    ids = torch.tensor([[1, 0, 1]])
    lp = grpo.token_logprobs(logits, ids)
    assert lp[0, 0].item() == 0.0
    assert lp[0, 1].item() == pytest.approx(math.log(0.5))
    assert lp[0, 2].item() == pytest.approx(-math.log(math.exp(2) + 1))  # token 1 has logit 0
    hot = grpo.token_logprobs(logits, ids, temperature=2.0)
    assert hot[0, 2].item() == pytest.approx(-math.log(math.e + 1))
