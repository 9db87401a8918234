"""A loss of one's own for `trainer.loss.name: examples.custom_loss:clipped_prime`.

It receives what the built-in losses receive (dynalize/grpo.py): per-token `logprobs` (with
grad), the generator's `gen_logprobs`, per-sequence `advantages`, the `loss_mask` of policy
tokens and `num_loss_tokens`, the normaliser of the whole optimizer batch; then the entries of
`trainer.loss.kwargs`. It returns a `grpo.LossOutput`. This one is prime-rl's loss with the
advantages clipped to ±`max_abs` (a guard against one outlier reward dominating a step).
"""

from __future__ import annotations

from dynalize import grpo


def clipped_prime(logprobs, gen_logprobs, advantages, loss_mask, num_loss_tokens, max_abs: float = 1.0):
    return grpo.prime_loss(logprobs, gen_logprobs, advantages.clamp(-max_abs, max_abs), loss_mask, num_loss_tokens)
