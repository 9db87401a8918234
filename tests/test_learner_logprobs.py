"""The learner's token log-probabilities: exactly today's numbers, in memory that does not hold a
float32 copy of the logits (issue 26: at Qwen3's vocabulary that copy is gigabytes)."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dynalize import grpo

QWEN3_VOCAB = 151_936


def full_copy_logprobs(logits, input_ids, temperature=1.0):
    """The learner's log-probabilities before issue 26: log_softmax over a float32 copy of all logits."""
    x = logits[:, :-1].float() / temperature
    picked = torch.gather(x, -1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)


class PeakNewMemory(TorchDispatchMode):
    """Peak bytes of the storages the ops run under it allocate and keep alive at once (the
    tensors that existed before are not counted). Deterministic: it counts bytes, not time."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, list] = {}  # storage pointer -> [bytes, tensors alive on it]
        self.now = self.peak = 0
        self.known: set[int] = set()

    def remember(self, *tensors):
        """Storages that exist already (the inputs)."""
        for t in tensors:
            self.known.add(t.untyped_storage().data_ptr())

    def _release(self, ptr):
        entry = self.live[ptr]
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.live[ptr]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr in self.known or ptr == 0:
                continue
            if ptr not in self.live:
                self.live[ptr] = [t.untyped_storage().nbytes(), 0]
                self.now += self.live[ptr][0]
                self.peak = max(self.peak, self.now)
            self.live[ptr][1] += 1
            weakref.finalize(t, self._release, ptr)
        return out


def peaks(fn, logits, ids, weights):
    """(forward peak, backward peak) of new memory, in bytes, for log-probabilities fn."""
    x = logits.detach().clone().requires_grad_(True)
    with PeakNewMemory() as fwd:
        fwd.remember(x, ids)
        lp = fn(x, ids, 0.7)
        loss = (lp * weights).sum()
    with PeakNewMemory() as bwd:
        bwd.remember(x, ids, lp, loss, weights)
        loss.backward()
    return fwd.peak, bwd.peak


def test_the_memory_tracker_sees_a_full_float32_copy():
    logits = torch.randn(1, 8, 1000, dtype=torch.bfloat16)
    with PeakNewMemory() as m:
        m.remember(logits)
        logits.float()
    assert m.peak >= 8 * 1000 * 4


def test_token_logprobs_at_qwen3_vocabulary_holds_no_float32_copy_of_the_logits():
    torch.manual_seed(0)
    batch, length = 2, 512  # bf16 logits: 311 MB; a float32 copy of them: 622 MB
    logits = torch.randn(batch, length, QWEN3_VOCAB, dtype=torch.bfloat16)
    ids = torch.randint(0, QWEN3_VOCAB, (batch, length))
    weights = torch.randn(batch, length)
    forward, backward = peaks(grpo.token_logprobs, logits, ids, weights)
    size = logits.nbytes
    assert forward < size / 2  # slices only, never the whole tensor in float32
    assert backward < size * 1.5  # the gradient itself (bf16, = size) plus slices


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_elements", [grpo.CHUNK_ELEMENTS, 700])
def test_token_logprobs_and_gradients_equal_the_full_copy_computation(dtype, temperature, chunk_elements):
    torch.manual_seed(1)
    base = torch.randn(3, 17, 300).to(dtype)
    ids = torch.randint(0, 300, (3, 17))
    weights = torch.randn(3, 17)
    a, b = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
    old = full_copy_logprobs(a, ids, temperature)
    new = grpo.token_logprobs(b, ids, temperature, chunk_elements)
    (old * weights).sum().backward()
    (new * weights).sum().backward()
    assert (old - new).abs().max().item() <= 1e-6
    assert (a.grad.float() - b.grad.float()).abs().max().item() <= 1e-6
