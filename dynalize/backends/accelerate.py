"""The Learner on Accelerate: AdamW, micro-batching, grad clipping, DDP/FSDP/DeepSpeed via
`accelerate launch`. It knows tokens, masks, advantages and logprobs, nothing of where they came from.

Under `accelerate launch` with several processes only rank 0 runs the orchestrator. It calls this
learner as usual; each call is broadcast to the other ranks, which wait in `serve()`. Each rank
trains on its shard of the global batch; the loss is normalised by the global token count, so one
step equals the one-process step on the same batch (up to float summation order).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import broadcast_object_list, extract_model_from_parallel as unwrap_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from .. import grpo
from ..types import TrainSequence
from . import lora as lora_adapters
from . import packing
from .base import Learner
from .hf import DTYPES
from .sharding import grad_scaler, learner_accelerator, scaler_state, set_deepspeed_micro_batch


def process_state() -> PartialState:
    """This process's place among the training processes (`accelerate launch`, `torchrun`). Without
    a GPU, Accelerate must be told that the processes are CPU ones, or under `torchrun` every process
    takes itself for the only one (rank 0)."""
    return PartialState(cpu=not torch.cuda.is_available())


class AccelerateLearner(Learner):
    """Trains the policy with a GRPO-family loss (see dynalize.grpo).

    With `trainer_cfg.master_weights == "float32"` and a half-precision `dtype`, the optimizer
    updates float32 weights and forward/backward run in `dtype` under torch.autocast (float16 with
    a gradient scaler); the weights handed to the generator (`policy_state`) are always in `dtype`.
    (Autocast here rather than Accelerator's `mixed_precision`, which is fixed once per process.)
    A float16 step whose gradients overflow is skipped by the scaler: it does not count as a new
    policy version and logs `skipped_step` 1 (and no grad_norm) instead. The scaler's state is
    checkpointed in learner.json, so a resumed run continues with the scale it had reached.

    `lora` (policy.lora) trains peft adapters on a frozen base (loaded in `dtype`; peft keeps the
    adapters in float32); `loss_fn` replaces the built-in loss (`trainer.loss.name:
    module:function`); `reference` is the model directory of the KL reference (`trainer.kl`;
    with LoRA the base with adapters off is used instead); `seed` draws the adapters' initial
    weights. docs/learner.md.
    """

    def __init__(self, path: str, trainer_cfg: Any, temperature: float = 1.0, dtype: str = "float32",
                 accelerator: Accelerator | None = None, lora: Any = None,
                 loss_fn: Callable[..., grpo.LossOutput] | None = None, reference: str | None = None,
                 seed: int = 0):
        self.accelerator = accelerator or learner_accelerator()
        self.cfg = trainer_cfg
        self.temperature = temperature
        self.dtype = DTYPES[dtype]
        master = trainer_cfg.master_weights == "float32"
        self.autocast = self.dtype if master and self.dtype != torch.float32 else None
        self.scaler = grad_scaler(self.accelerator) if self.autocast == torch.float16 else None
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.lora = lora
        self.loss_fn = loss_fn
        # With LoRA the frozen base stays in `dtype`: only the (float32) adapters are trained.
        load_dtype = torch.float32 if master and lora is None else self.dtype
        model = AutoModelForCausalLM.from_pretrained(path, dtype=load_dtype)
        model.config.use_cache = False
        if lora is not None:
            model = lora_adapters.add_adapters(model, lora, seed)
        if trainer_cfg.disable_dropout:
            disable_dropout(model)
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=trainer_cfg.lr,
            weight_decay=trainer_cfg.weight_decay, betas=tuple(trainer_cfg.betas),
        )
        set_deepspeed_micro_batch(self.accelerator, trainer_cfg.micro_batch_size)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.accelerator.register_save_state_pre_hook(drop_tied_weights)
        self.model.train()
        self.reference = None
        if trainer_cfg.kl.active and lora is None:
            self.reference = AutoModelForCausalLM.from_pretrained(reference or path, dtype=self.dtype)
            self.reference.to(self.accelerator.device).eval().requires_grad_(False)
        self.version = 0

    @property
    def unwrapped(self):
        return self.accelerator.unwrap_model(self.model)

    def _loss(self, logprobs, gen_logprobs, advantages, mask, num_tokens) -> grpo.LossOutput:
        lc = self.cfg.loss
        if self.loss_fn is not None:
            out = self.loss_fn(logprobs, gen_logprobs, advantages, mask, num_tokens, **lc.kwargs)
            if not isinstance(out, grpo.LossOutput):
                raise TypeError(f"the loss function {lc.name} returned {type(out).__name__}, not a grpo.LossOutput")
            return out
        if lc.name == "ppo_clip":
            return grpo.ppo_clip_loss(logprobs, gen_logprobs, advantages, mask, num_tokens, lc.clip_eps)
        return grpo.prime_loss(logprobs, gen_logprobs, advantages, mask, num_tokens,
                               lc.mask_threshold, lc.log_ratio_coef, lc.kl_mask_type)

    def _micro_batches(self, batch: list[TrainSequence]) -> list[list[TrainSequence]]:
        """`micro_batch_size` sequences at a time, or with packing bins of `micro_batch_tokens`."""
        budget = self.cfg.micro_batch_tokens
        if budget is None:
            size = self.cfg.micro_batch_size
            return [batch[i : i + size] for i in range(0, len(batch), size)]
        return [[batch[i] for i in b] for b in packing.pack([len(s.input_ids) for s in batch], budget)]

    def _collate(self, seqs: list[TrainSequence]) -> dict[str, torch.Tensor]:
        """The loss side padded to the longest sequence; the model's input padded too, or packed."""
        t = self._padded(seqs)
        if self.cfg.micro_batch_tokens is not None:
            t.update(packing.packed_inputs(seqs, self.accelerator.device))
        return t

    def _padded(self, seqs: list[TrainSequence]) -> dict[str, torch.Tensor]:
        pad = self.tokenizer.pad_token_id or 0
        width = max(len(s.input_ids) for s in seqs)
        device = self.accelerator.device

        def padded(rows, value, dtype):
            return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=dtype, device=device)

        return {
            "input_ids": padded([s.input_ids for s in seqs], pad, torch.long),
            "attention_mask": padded([[1] * len(s.input_ids) for s in seqs], 0, torch.long),
            "loss_mask": padded([s.loss_mask for s in seqs], 0, torch.long),
            "gen_logprobs": padded([s.gen_logprobs for s in seqs], 0.0, torch.float32),
            "advantages": torch.tensor([s.advantage for s in seqs], dtype=torch.float32, device=device),
        }

    def _logprobs(self, t: dict[str, torch.Tensor], first: int, model: Any = None) -> torch.Tensor:
        """Per-token logprobs of `model` (default: the policy), aligned to input_ids (sequences,
        width). Padded: logits are computed only from the position before the micro-batch's
        first policy token on (long prompts cost no vocabulary-sized rows). Packed: only where the
        next token is a policy token (0 elsewhere)."""
        model = model or self.model
        width = t["input_ids"].shape[1]
        if "packed_ids" in t:
            logits = model(input_ids=t["packed_ids"], position_ids=t["position_ids"],
                           logits_to_keep=t["predict_at"]).logits
            picked = grpo.target_logprobs(logits, t["targets"], self.temperature)
            return packing.unpack(picked, t["rows"], t["cols"], tuple(t["input_ids"].shape))
        keep = width - first + 1
        logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"], logits_to_keep=keep).logits
        tail = grpo.token_logprobs(logits, t["input_ids"][:, width - keep :], self.temperature)
        return torch.nn.functional.pad(tail, (width - keep, 0), value=0.0)

    def _reference_logprobs(self, t: dict[str, torch.Tensor], first: int) -> torch.Tensor:
        """The frozen reference's logprobs on the same tokens (no grad): the base with its
        adapters off under LoRA, else the reference copy."""
        with torch.no_grad():
            if self.reference is not None:
                return self._logprobs(t, first, self.reference)
            with self.unwrapped.disable_adapter():
                return self._logprobs(t, first, self.unwrapped)

    def _global_tokens(self, batch: list[TrainSequence]) -> torch.Tensor:
        local = torch.tensor(float(sum(sum(s.loss_mask) for s in batch)), device=self.accelerator.device)
        return self.accelerator.reduce(local, reduction="sum")

    # --- multi-process: rank 0 leads, the others follow in serve() ---------------------------------

    @property
    def distributed(self) -> bool:
        return self.accelerator.num_processes > 1

    def _lead(self, command: str, arg: Any = None) -> None:
        """Rank 0: tell the other ranks what to do next."""
        if self.distributed:
            broadcast_object_list([(command, arg)], from_process=0)

    def serve(self) -> None:
        """Ranks > 0: follow rank 0's calls until it says stop."""
        actions = {"train": self._train_shard, "save": self._save, "load": self._load, "state": self._state}
        while True:
            message = [None]
            broadcast_object_list(message, from_process=0)
            command, arg = message[0]
            if command == "stop":
                self._close_group()
                return
            actions[command](arg)

    def stop_followers(self) -> None:
        """Rank 0, at the end of the run: the other ranks leave `serve()`; then every rank closes
        the process group together."""
        if self.distributed:
            self._lead("stop")
            self._close_group()

    def _close_group(self) -> None:
        """Every rank, once no collective is left: meet at a barrier, then destroy the process
        group, so that no rank exits while another's gloo connections to it are still open (an
        exit, or a process torn down under load, would close them under a live peer)."""
        self.accelerator.wait_for_everyone()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    # --- the Learner interface ----------------------------------------------------------------------

    def train_step(self, batch: list[TrainSequence]) -> dict[str, float]:
        """One optimizer step on the global batch."""
        self._lead("train", batch)
        return self._train_shard(batch)

    def policy_state(self) -> dict[str, Any]:
        """The weights in the policy's dtype (float32 master weights are cast)."""
        self._lead("state")
        return {k: v.to(self.dtype) if v.is_floating_point() else v for k, v in self._state().items()}

    def save(self, directory: str) -> None:
        self._lead("save", directory)
        self._save(directory)

    def load(self, directory: str) -> None:
        self._lead("load", directory)
        self._load(directory)

    # --- what every rank runs -----------------------------------------------------------------------

    def _train_shard(self, batch: list[TrainSequence]) -> dict[str, float]:
        """This rank's share of one step; the loss is normalised by the global batch's policy tokens."""
        acc = self.accelerator
        batch = batch[acc.process_index :: acc.num_processes]
        if not batch:
            raise ValueError(f"a batch of fewer sequences than the {acc.num_processes} training processes")
        num_tokens = self._global_tokens(batch).clamp(min=1)
        micro = self._micro_batches(batch)
        kl = self.cfg.kl
        totals = {"loss": 0.0, "masked_tokens": 0.0, "ratio_sum": 0.0, "abs_logprob_diff": 0.0, "kl": 0.0}
        for i, seqs in enumerate(micro):
            t = self._collate(seqs)
            first = first_policy_token(seqs)
            sync = acc.no_sync(self.model) if i < len(micro) - 1 else nullcontext()
            with sync, torch.autocast(acc.device.type, dtype=self.autocast, enabled=self.autocast is not None):
                ref = self._reference_logprobs(t, first) if kl.active else None
                logprobs = self._logprobs(t, first)
                out = self._loss(logprobs, t["gen_logprobs"], t["advantages"], t["loss_mask"], num_tokens)
                loss = out.loss
                if ref is not None:
                    estimate = grpo.reference_kl(logprobs.detach(), ref, kl.estimator)
                    totals["kl"] += (estimate * t["loss_mask"]).sum().item()
                    if kl.beta > 0:
                        penalty = grpo.reference_kl_penalty(logprobs, t["gen_logprobs"], ref, t["loss_mask"],
                                                            kl.estimator, kl.placement)
                        loss = loss + kl.beta * penalty.sum() / num_tokens
                # DDP averages gradients over processes; the loss is already a global mean.
                acc.backward(self.scaler.scale(loss * acc.num_processes) if self.scaler else loss * acc.num_processes)
            mask = t["loss_mask"].float()
            totals["loss"] += loss.item()
            totals["masked_tokens"] += out.masked_tokens.item()
            totals["ratio_sum"] += (out.mean_ratio * mask.sum()).item()
            totals["abs_logprob_diff"] += ((logprobs.detach() - t["gen_logprobs"]).abs() * mask).sum().item()
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        grad_norm = acc.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        skipped = False
        lr = warmup_lr(self.cfg.lr, self.cfg.warmup_steps, self.version + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.scaler:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)  # skipped when a gradient is inf/NaN (on any rank)
            self.scaler.update()
            skipped = self.scaler.get_scale() < scale  # the scale backs off exactly then
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not skipped:
            self.version += 1
        stats = acc.reduce(torch.tensor(list(totals.values()), device=acc.device), reduction="sum")
        loss, masked, ratio_sum, diff, kl_sum = stats.tolist()
        n = num_tokens.item()
        metrics = {
            "loss": loss,
            "grad_norm": float(grad_norm),
            "masked_frac": masked / n,
            "mean_ratio": ratio_sum / n,
            "mismatch/abs_logprob_diff": diff / n,
            "loss_tokens": n,
            "processes": float(acc.num_processes),
            "lr": lr,
        }
        if self.scaler:
            metrics.update({"skipped_step": float(skipped), "grad_scale": self.scaler.get_scale()})
            if skipped:  # an overflowed gradient's norm is inf/NaN: it says nothing of the policy
                del metrics["grad_norm"]
        if kl.active:
            metrics["kl/ref"] = kl_sum / n
        return metrics

    def _state(self, _: Any = None) -> dict[str, Any]:
        """The full policy's weights under the base model's names (LoRA: merged)."""
        if self.lora is not None:
            return lora_adapters.merged_state(self.unwrapped)
        return self.accelerator.get_state_dict(self.model, unwrap=True)

    def _save(self, directory: str) -> None:
        """`policy/` (save_pretrained, safetensors: what evaluation and vLLM load) and
        `train_state/` (Accelerate's full state: sharded weights, optimizer, RNG; what resume loads)."""
        out = Path(directory)
        acc = self.accelerator
        state = self._state()  # a collective under FSDP / ZeRO-3
        if acc.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
            if self.lora is not None:  # policy/: merged weights; adapter/: peft's adapter alone
                self.unwrapped.get_base_model().save_pretrained(out / "policy", state_dict=state,
                                                                safe_serialization=True)
                self.unwrapped.save_pretrained(out / "adapter", safe_serialization=True)
            else:
                self.unwrapped.save_pretrained(out / "policy", state_dict=state, safe_serialization=True)
            self.tokenizer.save_pretrained(out / "policy")
            learner = {"version": self.version}
            if self.scaler:
                learner["grad_scaler"] = scaler_state(self.scaler)
            (out / "learner.json").write_text(json.dumps(learner))
        acc.wait_for_everyone()
        acc.save_state(str(out / "train_state"))
        acc.wait_for_everyone()

    def _load(self, directory: str) -> None:
        src = Path(directory)
        self.accelerator.load_state(str(src / "train_state"))
        learner = json.loads((src / "learner.json").read_text())
        self.version = learner["version"]
        if self.scaler and "grad_scaler" in learner:  # checkpoints from before it start at the initial scale
            self.scaler.load_state_dict(learner["grad_scaler"])


def drop_tied_weights(models: list[torch.nn.Module], weights: list[dict[str, Any]], _output_dir: str) -> None:
    """Accelerate's save-state hook: leave out of each saved state dict the weights its model ties
    to another (e.g. `lm_head.weight` to the input embedding), as `save_pretrained` does. Loading
    ties them again. Kept, safetensors would refuse the shared storage and Accelerate would drop
    them itself with a warning at every checkpoint; an undeclared alias still gets that warning."""
    for model, state in zip(models, weights):
        tied = getattr(unwrap_model(model), "all_tied_weights_keys", None) or {}
        for key in list(state):
            for target, source in tied.items():
                if key == target or key.endswith("." + target):
                    prefix = key[: len(key) - len(target)]
                    if prefix + source in state:
                        del state[key]


def disable_dropout(model: torch.nn.Module) -> None:
    """Zero every dropout of `model`: `nn.Dropout` modules (LoRA's too) and the float dropout
    rates attention layers apply themselves (`attention_dropout` in Qwen2/Llama)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in vars(module).items():
            if name.endswith("dropout") and isinstance(value, float) and value > 0:
                setattr(module, name, 0.0)


def first_policy_token(seqs: list[TrainSequence]) -> int:
    """The earliest position any sequence of the micro-batch trains on (≥ 1)."""
    return max(1, min((s.loss_mask.index(1) for s in seqs if 1 in s.loss_mask), default=1))


def warmup_lr(lr: float, warmup_steps: int, step: int) -> float:
    """The learning rate of optimizer step `step` (from 1) under linear warmup over `warmup_steps`."""
    return lr if warmup_steps <= 0 else lr * min(1.0, step / warmup_steps)
