"""Sequence packing for the learner: micro-batches by token budget, each one row of sequences laid
end to end, position ids restarting at every sequence.

transformers reads restarting position ids (with no attention mask) as packed sequences: each
token attends only to the earlier tokens of its own sequence (a block-diagonal causal mask for
SDPA and eager attention, the default and the CPU path; flash-attention 2's varlen kernels for a
model loaded with it). The loss side stays padded, (sequences, longest): only the model's input is packed, so
the loss, its normalisation and the metrics are those of the padded path. Logits are computed
only where the next token is a policy token (`logits_to_keep` as indices).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def pack(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of `lengths` grouped into bins of at most `budget` tokens, first-fit decreasing
    (a sequence longer than the budget gets a bin of its own). Deterministic: ties keep order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, left in enumerate(room):
            if lengths[i] <= left:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(budget - lengths[i])
    return [sorted(b) for b in bins]


def packed_inputs(seqs: Sequence[Any], device: torch.device) -> dict[str, torch.Tensor]:
    """One packed row of `seqs` (TrainSequences): `packed_ids` and `position_ids`, shape
    (1, total tokens); `predict_at`, the row positions whose next token is a policy token (the
    only ones the model computes logits for: prompts and user turns cost no vocabulary-sized
    rows); `targets`, those next tokens; `rows` and `cols`, where each lands in the padded layout."""
    ids, positions, predict_at, rows, cols = [], [], [], [], []
    for i, s in enumerate(seqs):
        start = len(ids)
        ids += s.input_ids
        positions += range(len(s.input_ids))
        for p in range(1, len(s.input_ids)):
            if s.loss_mask[p]:
                predict_at.append(start + p - 1)
                rows.append(i)
                cols.append(p)
    packed = torch.tensor([ids], dtype=torch.long, device=device)
    at = torch.tensor(predict_at, dtype=torch.long, device=device)
    return {
        "packed_ids": packed,
        "position_ids": torch.tensor([positions], dtype=torch.long, device=device),
        "predict_at": at,
        "targets": packed[:, at + 1],
        "rows": torch.tensor(rows, dtype=torch.long, device=device),
        "cols": torch.tensor(cols, dtype=torch.long, device=device),
    }


def unpack(values: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """The policy tokens' values (1, K) of a packed row in the padded layout `shape`
    (sequences, width); every other position (prompt, user turns, padding) holds 0."""
    flat = torch.zeros(shape[0] * shape[1], dtype=values.dtype, device=values.device)
    return flat.index_put((rows * shape[1] + cols,), values[0]).view(shape)


def padding_share(lengths: Sequence[int], groups: Sequence[Sequence[int]], packed: bool) -> float:
    """Share of the model's input tokens that are padding: 0 for packed rows; for padded
    micro-batches each group costs len(group) × its longest sequence."""
    if packed:
        return 0.0
    computed = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    return 1 - sum(lengths) / computed if computed else 0.0
