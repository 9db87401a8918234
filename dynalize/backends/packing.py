"""Sequence packing for the learner: micro-batches by token budget, each one row of sequences laid
end to end, position ids restarting at every sequence.

transformers reads restarting position ids (with no attention mask) as packed sequences: each
token attends only to the earlier tokens of its own sequence (flash-attention's varlen kernels
where installed, a block-diagonal causal mask for SDPA and eager attention, which is the CPU
path). The loss side stays padded, (sequences, longest): only the model's input is packed, so
the loss, its normalisation and the metrics are those of the padded path.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def packed_inputs(rows: Sequence[Sequence[int]], device: torch.device) -> dict[str, torch.Tensor]:
    """One packed row: `packed_ids` and `position_ids` of shape (1, total tokens), and each
    sequence's `starts` in it."""
    ids = [t for r in rows for t in r]
    positions = [p for r in rows for p in range(len(r))]
    starts, at = [], 0
    for r in rows:
        starts.append(at)
        at += len(r)
    return {
        "packed_ids": torch.tensor([ids], dtype=torch.long, device=device),
        "position_ids": torch.tensor([positions], dtype=torch.long, device=device),
        "starts": torch.tensor(starts, dtype=torch.long, device=device),
        "lengths": torch.tensor([len(r) for r in rows], dtype=torch.long, device=device),
    }


def unpack(values: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    """Per-token values of a packed row (1, total) as the padded layout (sequences, width):
    row i holds its sequence's values at positions 1 .. length − 1, zeros elsewhere (position 0
    predicts from the previous sequence's last token in the row: it is never a policy token)."""
    total = values.shape[1]
    flat = torch.nn.functional.pad(values[0], (0, 1), value=0.0)  # index `total` reads 0
    j = torch.arange(width, device=values.device).unsqueeze(0)
    index = starts.unsqueeze(1) + j
    inside = (j >= 1) & (j < lengths.unsqueeze(1))
    return flat[torch.where(inside, index, torch.full_like(index, total))]


def padding_share(lengths: Sequence[int], groups: Sequence[Sequence[int]], packed: bool) -> float:
    """Share of the model's input tokens that are padding: 0 for packed rows; for padded
    micro-batches each group costs len(group) × its longest sequence."""
    if packed:
        return 0.0
    computed = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    return 1 - sum(lengths) / computed if computed else 0.0
