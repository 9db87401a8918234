"""How many passes every rank runs in a step (`sharding.agreed_passes`), without launching processes:
the collective is Accelerate's gather, stood in for by what the peers would report."""

from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType

from dynalize.backends.sharding import agreed_passes
from dynalize.errors import ConfigError


def accelerator(kind: DistributedType, peers: list[int]) -> SimpleNamespace:
    """An Accelerator of len(peers) + 1 processes whose gather returns this rank's count and the peers'."""
    gather = lambda t: torch.cat([t, torch.tensor(peers, dtype=t.dtype)])
    return SimpleNamespace(num_processes=len(peers) + 1, distributed_type=kind, device=torch.device("cpu"),
                           gather=gather)


def test_every_rank_runs_the_largest_ranks_micro_batch_count():
    assert agreed_passes(accelerator(DistributedType.FSDP, [3]), 2) == 3
    assert agreed_passes(accelerator(DistributedType.FSDP, [1]), 2) == 2
    assert agreed_passes(accelerator(DistributedType.MULTI_CPU, [1, 4, 2]), 1) == 4
    assert agreed_passes(accelerator(DistributedType.NO, []), 5) == 5


def test_deepspeed_refuses_more_than_one_pass_per_step_on_any_rank():
    """Accelerate's DeepSpeed backward steps the optimizer: two passes would be two steps."""
    assert agreed_passes(accelerator(DistributedType.DEEPSPEED, [1]), 1) == 1
    with pytest.raises(ConfigError, match="one micro-batch"):
        agreed_passes(accelerator(DistributedType.DEEPSPEED, [2]), 1)  # the peer's shard needs two


def test_lora_under_zero3_stops_with_one_line_instead_of_merging_placeholders():
    from dynalize.backends.sharding import refuse_zero3_lora

    def deepspeed(stage: int) -> SimpleNamespace:
        return SimpleNamespace(distributed_type=DistributedType.DEEPSPEED,
                               state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=stage)))

    with pytest.raises(ConfigError, match="ZeRO-3"):
        refuse_zero3_lora(deepspeed(3), lora=object())
    refuse_zero3_lora(deepspeed(2), lora=object())  # ZeRO-2 keeps whole parameters on every rank
    refuse_zero3_lora(deepspeed(3), lora=None)
    refuse_zero3_lora(SimpleNamespace(distributed_type=DistributedType.FSDP, state=SimpleNamespace()), lora=object())
