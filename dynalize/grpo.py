"""Group-relative advantages and policy-gradient losses, as pure tensor functions.

Losses take per-token tensors of shape (batch, seq): the learner's log-probabilities
`logprobs` (with grad), the generator's `gen_logprobs`, the per-sequence `advantages` (batch,),
and `loss_mask` (1 where the token was written by the policy). They return the loss and a few
metrics. Normalisation: the token sum is divided by `num_loss_tokens`, the number of policy tokens
in the whole optimizer batch (pass it explicitly when micro-batching). A loss of one's own
(`trainer.loss.name: module:function`) takes the same five inputs plus its `trainer.loss.kwargs`
and returns a `LossOutput` (docs/learner.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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


KLMask = Literal["all", "unmasked", "masked"]


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
    kl_mask_type: KLMask = "all",
) -> LossOutput:
    """prime-rl's default: per token −A·r + c·(log r)², with r = exp(logπθ − logπ_gen).

    A token is masked where π_θ − π_gen > t and A > 0, or π_θ − π_gen < −t and A < 0 (the policy
    already moved that token's probability far in the direction the advantage pushes): it gets no
    −A·r term. The c·(log r)² term, which pulls π_θ back towards π_gen, acts on the tokens
    `kl_mask_type` names: `all` policy tokens (prime-rl's default), `unmasked` (inside the trust
    region only: a masked token then gets no gradient at all) or `masked` (outside it only).
    """
    mask, adv, log_ratio = _prepare(logprobs, gen_logprobs, advantages, loss_mask)
    ratio = torch.exp(log_ratio)
    prob_diff = (torch.exp(logprobs) - torch.exp(gen_logprobs)).detach()
    outside = ((prob_diff > mask_threshold) & (adv > 0)) | ((prob_diff < -mask_threshold) & (adv < 0))
    keep = mask * (~outside).to(mask.dtype)
    kl_tokens = {"all": mask, "unmasked": keep, "masked": mask - keep}[kl_mask_type]
    # keep and kl_tokens are 0/1: the sum is exactly (−A·r + c·(log r)²)·keep when they coincide.
    loss = (-adv * ratio * keep + log_ratio_coef * log_ratio.pow(2) * kl_tokens).sum() / num_loss_tokens
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


KLEstimator = Literal["k1", "k2", "k3"]
KLPlacement = Literal["loss", "advantage"]


def reference_kl(logprobs: Tensor, ref_logprobs: Tensor, estimator: KLEstimator = "k3") -> Tensor:
    """Per-token value of Schulman's estimators of KL(π_θ ‖ π_ref) on tokens sampled from π_θ,
    x = log π_θ − log π_ref: k1 = x, k2 = x²/2, k3 = e^(−x) − 1 + x. k1 and k3 are unbiased
    (k3 ≥ 0, lower variance); k2 is biased as a value but its gradient is the KL's (see
    `reference_kl_penalty`). What `kl/ref` logs."""
    x = logprobs - ref_logprobs
    if estimator == "k1":
        return x
    if estimator == "k2":
        return 0.5 * x.pow(2)
    return torch.exp(-x) - 1 + x


def reference_kl_penalty(logprobs: Tensor, gen_logprobs: Tensor, ref_logprobs: Tensor, loss_mask: Tensor,
                         estimator: KLEstimator = "k3", placement: KLPlacement = "loss") -> Tensor:
    """Per-token penalty (batch, seq), 0 off policy tokens, whose gradient in expectation over
    tokens sampled from the generator π_gen is ∇ KL(π_θ ‖ π_ref) at each token's context.

    With r = π_θ / π_gen (the policy loss's importance ratio) and x = log π_θ − log π_ref:
    `loss` + k3: r · k3 (TRL's, its use_bias_correction_kl); `loss` + k2: sg(r) · k2;
    `advantage` + k1: r · sg(x), k1 as a detached per-token advantage −x (prime-rl's). Each
    one's gradient per token is r · x · ∇log π_θ, and E_gen[r · x · ∇log π_θ] = Σ ∇π_θ · x =
    ∇ KL(π_θ ‖ π_ref) (Σ ∇π_θ = 0). Without r, k3's would be ∇ KL(π_ref ‖ π_θ), and k1 in the
    loss has expected gradient 0 (E[∇log π_θ] = 0), so `loss` + k1 is refused.
    """
    mask = loss_mask.to(logprobs.dtype)
    logprobs, ref_logprobs = logprobs * mask, ref_logprobs * mask  # 0 off policy tokens: no inf there
    ratio = torch.exp(logprobs - gen_logprobs * mask)
    if placement == "advantage" and estimator == "k1":
        return ratio * reference_kl(logprobs, ref_logprobs, "k1").detach()
    if placement == "loss" and estimator == "k2":
        return ratio.detach() * reference_kl(logprobs, ref_logprobs, "k2")
    if placement == "loss" and estimator == "k3":
        return ratio * reference_kl(logprobs, ref_logprobs, "k3")
    raise ValueError(f"no KL penalty for estimator {estimator!r} placed in the {placement!r}")


CHUNK_ELEMENTS = 1 << 23
"""token_logprobs works on float32 slices of at most this many logits (32 MiB) at a time."""


def token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float = 1.0,
                   chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """Log-probability of each next token under `logits / temperature`, aligned to input_ids.

    Position i holds log p(input_ids[i] | input_ids[:i]); position 0 is 0. Computed in float32
    over slices of the sequence, forward and backward (`_TokenLogprobs`): the memory it adds
    to the logits is the (batch, seq) result plus one slice, never a float32 copy of the whole
    logits tensor (batch × seq × vocabulary; 2.4 GB for 4 × 1,000 tokens at Qwen3's vocabulary).
    """
    picked = _TokenLogprobs.apply(logits, input_ids[:, 1:], float(temperature), int(chunk_elements))
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)


def target_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0,
                    chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """log p(targets[b, i]) under logits[b, i] / temperature (logits already at the positions that
    predict them, e.g. from `logits_to_keep` indices), in the same float32 slices."""
    return _TokenLogprobs.apply(logits, targets, float(temperature), int(chunk_elements))


def _slices(batch: int, length: int, vocab: int, chunk_elements: int):
    """(row, start, end) slices of positions 0..length-1 of each row, each ≤ chunk_elements logits."""
    step = max(1, chunk_elements // max(vocab, 1))
    for b in range(batch):
        for start in range(0, length, step):
            yield b, start, min(start + step, length)


class _TokenLogprobs(torch.autograd.Function):
    """log_softmax(logits[:, i] / T) at targets[:, i] for the first targets.shape[1] positions,
    one slice at a time (the positions after them, if any, get no gradient). Backward keeps
    only the logits (already held by the model's graph) and the per-token log-normaliser, and
    rebuilds each slice's softmax: ∂/∂logits = (onehot(target) − softmax) · grad / T."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float, chunk_elements: int) -> Tensor:
        batch, length, vocab = logits.shape[0], targets.shape[1], logits.shape[2]
        picked = torch.empty(batch, length, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(picked)
        for b, s, e in _slices(batch, length, vocab, chunk_elements):
            x = logits[b, s:e].to(torch.float32, copy=True).div_(temperature)
            norm = torch.logsumexp(x, dim=-1)
            picked[b, s:e] = torch.gather(x, -1, targets[b, s:e].unsqueeze(-1)).squeeze(-1) - norm
            lse[b, s:e] = norm
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk_elements = temperature, chunk_elements
        return picked

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        logits, targets, lse = ctx.saved_tensors
        temperature = ctx.temperature
        grad = torch.zeros_like(logits)  # positions past the targets (the last one) get 0
        batch, length, vocab = logits.shape[0], targets.shape[1], logits.shape[2]
        for b, s, e in _slices(batch, length, vocab, ctx.chunk_elements):
            g = grad_out[b, s:e].float().unsqueeze(-1)
            part = logits[b, s:e].to(torch.float32, copy=True)  # one float32 slice, worked in place
            part.div_(temperature).sub_(lse[b, s:e].unsqueeze(-1)).exp_().mul_(-g)
            part.scatter_add_(-1, targets[b, s:e].unsqueeze(-1), g)
            grad[b, s:e] = part.div_(temperature)
        return grad, None, None, None
