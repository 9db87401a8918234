"""Group-relative advantages and policy-gradient losses, as pure tensor functions.

Losses take per-token tensors of shape (batch, seq): the learner's log-probabilities
`logprobs` (with grad), the generator's `gen_logprobs`, the per-sequence `advantages` (batch,),
and `loss_mask` (1 where the token was written by the policy). They return the loss and a few
metrics. Normalisation: the token sum is divided by `num_loss_tokens`, the number of policy tokens
in the whole optimizer batch (pass it explicitly when micro-batching).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, std_normalize: bool = False, eps: float = 1e-6) -> Tensor:
    """A_i = r_i − mean_group(r), optionally / std_group(r). `rewards` has shape (groups, G)."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if std_normalize:
        centred = centred / (rewards.std(dim=1, keepdim=True) + eps)
    return centred


def advantages(groups: list[list[float]], std_normalize: bool = False) -> list[list[float]]:
    """`group_advantages` for groups of any sizes (after stale drops groups can differ)."""
    return [group_advantages(torch.tensor([g], dtype=torch.float64), std_normalize)[0].tolist() for g in groups]


@dataclass
class LossOutput:
    loss: Tensor
    masked_tokens: Tensor  # policy tokens excluded by the trust-region mask (or clipped, for PPO)
    mean_ratio: Tensor  # mean importance ratio over policy tokens


def _prepare(logprobs: Tensor, gen_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor):
    mask = loss_mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype).unsqueeze(-1).expand_as(logprobs)
    log_ratio = (logprobs - gen_logprobs) * mask
    return mask, adv, log_ratio


def prime_loss(
    logprobs: Tensor,
    gen_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    num_loss_tokens: int | Tensor,
    mask_threshold: float = 0.2,
    log_ratio_coef: float = 1e-3,
) -> LossOutput:
    """prime-rl's default: per token −A·r + c·(log r)², with r = exp(logπθ − logπ_gen).

    A token is masked where π_θ − π_gen > t and A > 0, or π_θ − π_gen < −t and A < 0 (the policy
    already moved that token's probability far in the direction the advantage pushes).
    """
    mask, adv, log_ratio = _prepare(logprobs, gen_logprobs, advantages, loss_mask)
    ratio = torch.exp(log_ratio)
    prob_diff = (torch.exp(logprobs) - torch.exp(gen_logprobs)).detach()
    outside = ((prob_diff > mask_threshold) & (adv > 0)) | ((prob_diff < -mask_threshold) & (adv < 0))
    keep = mask * (~outside).to(mask.dtype)
    per_token = -adv * ratio + log_ratio_coef * log_ratio.pow(2)
    loss = (per_token * keep).sum() / num_loss_tokens
    return LossOutput(loss, (mask - keep).sum().detach(), ((ratio * mask).sum() / mask.sum().clamp(min=1)).detach())


def ppo_clip_loss(
    logprobs: Tensor,
    gen_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    num_loss_tokens: int | Tensor,
    clip_eps: float = 0.2,
) -> LossOutput:
    """PPO's clipped surrogate per token, −min(r·A, clip(r, 1±ε)·A), over the same normaliser."""
    mask, adv, log_ratio = _prepare(logprobs, gen_logprobs, advantages, loss_mask)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    loss = (per_token * mask).sum() / num_loss_tokens
    was_clipped = ((clipped < unclipped).to(mask.dtype) * mask).sum().detach()
    return LossOutput(loss, was_clipped, ((ratio * mask).sum() / mask.sum().clamp(min=1)).detach())


def token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each next token under `logits / temperature`, aligned to input_ids.

    Position i holds log p(input_ids[i] | input_ids[:i]); position 0 is 0.
    """
    logits = logits[:, :-1].float() / temperature
    targets = input_ids[:, 1:]
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)
