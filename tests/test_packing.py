"""Sequence packing (`trainer.micro_batch_tokens`): the same loss and gradients as padding, no padding."""

import pytest

from dynalize.backends import packing
from dynalize.config import TrainerConfig
from learnerkit import learner, mixed_batch, multiturn_batch, step_with_grads


def test_pack_fills_bins_first_fit_decreasing_and_never_splits_a_sequence():
    lengths = [5, 9, 3, 7, 2, 12]
    bins = packing.pack(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins if len(b) > 1)
    # longest first, each into the first bin it fits: 12 (over the budget: alone) | 9 | 7 + 3 | 5 + 2
    assert bins == [[5], [1], [2, 3], [0, 4]]
    assert packing.pack(lengths, 10) == bins  # deterministic


def test_padding_share_counts_what_padding_costs():
    assert packing.padding_share([2, 4], [[0, 1]], packed=False) == pytest.approx(0.25)
    assert packing.padding_share([2, 4], [[0, 1]], packed=True) == 0.0


def test_packed_inputs_restart_positions_and_predict_only_policy_tokens():
    import torch

    from dynalize.types import TrainSequence

    a = TrainSequence([5, 6, 7], [0, 1, 1], [0.0] * 3, 1.0)
    b = TrainSequence([8, 9, 10, 11], [0, 1, 0, 1], [0.0] * 4, 1.0)
    t = packing.packed_inputs([a, b], torch.device("cpu"))
    assert t["packed_ids"].tolist() == [[5, 6, 7, 8, 9, 10, 11]]
    assert t["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3]]
    assert t["predict_at"].tolist() == [0, 1, 3, 5]  # the position before each policy token
    assert t["targets"].tolist() == [[6, 7, 9, 11]]
    out = packing.unpack(torch.tensor([[1.0, 2.0, 3.0, 4.0]]), t["rows"], t["cols"], (2, 4))
    assert out.tolist() == [[0.0, 1.0, 2.0, 0.0], [0.0, 3.0, 0.0, 4.0]]


@pytest.mark.parametrize("make_batch", [mixed_batch, multiturn_batch], ids=["mixed_lengths", "multi_turn"])
def test_packed_micro_batches_give_the_padded_loss_and_gradients(make_batch):
    batch = make_batch()
    padded, g_pad = step_with_grads(learner(TrainerConfig(micro_batch_size=3)), batch)
    packed, g_pack = step_with_grads(learner(TrainerConfig(micro_batch_tokens=48)), batch)
    assert packed["loss"] == pytest.approx(padded["loss"], abs=1e-5)
    assert packed["mean_ratio"] == pytest.approx(padded["mean_ratio"], abs=1e-5)
    assert packed["loss_tokens"] == padded["loss_tokens"]
    assert set(g_pack) == set(g_pad)
    assert max((g_pack[k] - g_pad[k]).abs().max().item() for k in g_pad) <= 1e-5
    # several sequences share a row (else nothing was packed)
    assert len(learner(TrainerConfig(micro_batch_tokens=48))._micro_batches(batch)) < len(batch)


def test_a_packed_sequence_does_not_see_the_sequence_before_it():
    """Changing the first sequence of a row must not change the second's log-probabilities."""
    import torch

    lrn = learner(TrainerConfig(micro_batch_tokens=1000))
    a, b = mixed_batch()[:2]
    other = type(a)([t + 1 for t in a.input_ids], a.loss_mask, a.gen_logprobs, a.advantage)
    with torch.no_grad():
        first = lrn._logprobs(lrn._collate([a, b]), 1)[1]
        second = lrn._logprobs(lrn._collate([other, b]), 1)[1]
    assert torch.allclose(first, second, atol=1e-6)


@pytest.mark.parametrize("make_batch", [mixed_batch, multiturn_batch], ids=["mixed_lengths", "multi_turn"])
def test_packed_reference_logprobs_equal_the_unpacked_ones(make_batch):
    """The separately loaded reference runs packed forwards too: each sequence sees only itself
    (a reference whose config asks for a KV cache must not attend across the row)."""
    import torch

    lrn = learner(TrainerConfig(micro_batch_tokens=1000, kl={"beta": 0.1}))
    assert lrn.reference is not None and lrn.reference.config.use_cache  # as from_pretrained loads it
    batch = make_batch()
    with torch.no_grad():
        packed = lrn._reference_logprobs(lrn._collate(batch), 1)
        padded = lrn._reference_logprobs(lrn._padded(batch), 1)
    mask = lrn._padded(batch)["loss_mask"].bool()
    assert len(lrn._micro_batches(batch)) == 1  # every sequence in one row
    assert (packed - padded)[mask].abs().max().item() <= 1e-6


def test_kl_to_the_initial_policy_is_zero_at_the_first_packed_step():
    """Step 1: the policy and the reference hold the same weights, packed alike: no KL."""
    for batch in (mixed_batch(), multiturn_batch()):
        metrics = learner(TrainerConfig(micro_batch_tokens=48, kl={"beta": 0.1})).train_step(batch)
        assert metrics["kl/ref"] == pytest.approx(0.0, abs=1e-9)
