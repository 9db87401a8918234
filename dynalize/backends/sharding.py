"""The learner's Accelerator and gradient scaler under `accelerate launch`: FSDP2 on CPU processes
too, a float16 loss scaler whose skip decision every rank shares, and the number of passes every
rank runs in a step.

Accelerate (1.15) applies the launcher's FSDP settings only on accelerators: started on CPU
processes with an FSDP config it silently runs plain DDP (every rank holds the whole model) and
it ignores a DeepSpeed config the same way. `learner_accelerator` turns the configured FSDP2
plugin on for CPU processes (gloo), so the CPU run takes Accelerate's own FSDP2 path: the
`fully_shard` wrapping, DTensor shards, DCP checkpoints and gathered full state dicts of a GPU
run. DeepSpeed on CPU processes stops with one line instead of training as DDP.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from accelerate import Accelerator, PartialState
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from accelerate.utils.environment import parse_flag_from_env

from ..errors import ConfigError


def learner_accelerator() -> Accelerator:
    """The Accelerator the learner trains with: Accelerate's own, with FSDP2 switched on for CPU
    processes when the launcher asked for FSDP (see the module docstring)."""
    cpu = not torch.cuda.is_available()
    accelerator = Accelerator(cpu=cpu)
    if not cpu or accelerator.distributed_type != DistributedType.MULTI_CPU:
        return accelerator
    if parse_flag_from_env("ACCELERATE_USE_DEEPSPEED"):
        raise ConfigError("config error: DeepSpeed needs GPUs: on CPU processes Accelerate would run the "
                          "learner as plain DDP instead; use configs/accelerate/fsdp_cpu.yaml (FSDP2) on CPU")
    if parse_flag_from_env("ACCELERATE_USE_FSDP"):
        plugin = FullyShardedDataParallelPlugin()  # the launcher's settings (FSDP_* variables)
        if plugin.fsdp_version != 2:
            raise ConfigError("config error: FSDP on CPU processes runs as FSDP2 only: set fsdp_version: 2")
        # Accelerate reads the distributed type from the shared process state on every use
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        state = AcceleratorState()
        state.distributed_type = DistributedType.FSDP
        state.fsdp_plugin = plugin
    return accelerator


def set_deepspeed_micro_batch(accelerator: Accelerator, micro_batch_size: int) -> None:
    """DeepSpeed sizes its batches from a dataloader the learner does not have: without this, a
    config that leaves `train_micro_batch_size_per_gpu` on `auto` (as `accelerate config` writes
    it) stops `prepare` with a ValueError. Each micro-batch is `trainer.micro_batch_size` rows."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if accelerator.distributed_type == DistributedType.DEEPSPEED and plugin is not None \
            and plugin.is_auto("train_micro_batch_size_per_gpu"):
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = micro_batch_size


def refuse_zero3_lora(accelerator: Accelerator, lora: Any) -> None:
    """LoRA's merged weights are read from the adapted modules (`lora.merged_state`); ZeRO-3 leaves
    empty placeholders there, so the generator would get wrong weights without a word: stop."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if lora is not None and accelerator.distributed_type == DistributedType.DEEPSPEED \
            and plugin is not None and plugin.zero_stage == 3:
        raise ConfigError("config error: policy.lora is not supported under DeepSpeed ZeRO-3 (its merged weights "
                          "need the partitioned base gathered); use FSDP2 (configs/accelerate/fsdp.yaml)")


def agreed_passes(accelerator: Accelerator, count: int) -> int:
    """The number of forward/backward passes every rank runs in a step: the largest of the ranks'
    micro-batch counts (`count`: this rank's). Under FSDP2 every forward all-gathers the parameters
    and the synced backward reduce-scatters the gradients (ZeRO-3 likewise, at every backward), so
    a rank that ran fewer passes than its peers would leave them waiting in a collective forever;
    the ranks' shards differ in size and in packing bins. The learner pads with zero-weight passes.

    Under DeepSpeed, Accelerate's backward also steps the optimizer (the learner never marks a
    pass as "no gradient boundary"): more than one pass would be more than one optimizer step, on
    part of the batch each, so that stops with one line instead."""
    if accelerator.num_processes > 1:
        counts = accelerator.gather(torch.tensor([count], device=accelerator.device))
        count = int(counts.max().item())
    if count > 1 and accelerator.distributed_type == DistributedType.DEEPSPEED:
        raise ConfigError(f"config error: under DeepSpeed each rank's shard must be one micro-batch (this step "
                          f"needs {count}): raise trainer.micro_batch_size to batch_size / processes or more, "
                          f"and leave trainer.micro_batch_tokens null")
    return count


@contextmanager
def unsharded(model: torch.nn.Module) -> Iterator[None]:
    """Under FSDP2, every parameter of `model` whole (all-gathered) for the block, sharded again
    after: a collective, run by every rank in the same order. Anything else: nothing to do. (A
    module's `state_dict()` reshards it: read the state through Accelerate's `get_state_dict`.)"""
    from torch.distributed.fsdp import FSDPModule

    groups = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in groups:
        m.unshard()
    try:
        yield
    finally:
        for m in groups:
            m.reshard()


def grad_scaler(accelerator: Accelerator) -> torch.amp.GradScaler:
    """A float16 loss scaler whose skip decision every rank shares. Under FSDP each rank checks
    only its own gradient shards for inf/NaN: the sharded scaler all-reduces that finding, so every
    rank skips the same steps and keeps the same scale (FSDP1's flat shards need it; under FSDP2,
    DTensor's unscale op reduces the finding as well). DDP's gradients are the same on every rank:
    the plain scaler agrees by itself."""
    if accelerator.distributed_type == DistributedType.FSDP:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(accelerator.device.type)
    return torch.amp.GradScaler(accelerator.device.type)


def scaler_state(scaler: torch.amp.GradScaler) -> dict[str, Any]:
    """The scaler's state as JSON-ready numbers (scale, growth tracker, factors): what resume needs
    to continue with the scale the run had reached instead of the initial 65536."""
    return {k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in scaler.state_dict().items()}


def local_parameter_share(model: torch.nn.Module) -> tuple[int, int]:
    """(parameters this rank holds, parameters of the whole model): the shard FSDP left here,
    read from the local tensors of the DTensor parameters (a plain parameter counts whole)."""
    from torch.distributed.tensor import DTensor

    local = total = 0
    for p in model.parameters():
        total += p.numel()
        local += p.to_local().numel() if isinstance(p, DTensor) else p.numel()
    return local, total
