"""LoRA adapters through peft: add them, merge them into plain weights without touching the
model, save them alone.

The merged weights are computed as W + ΔW from each adapter layer, never with peft's in-place
merge/unmerge (W + ΔW − ΔW is not W in floating point: the frozen base would drift a little at
every weight push and a resume would no longer be exact).
"""

from __future__ import annotations

from typing import Any

import torch


def add_adapters(model: torch.nn.Module, lora: Any, seed: int = 0) -> torch.nn.Module:
    """`model` wrapped by peft with trainable LoRA adapters (`lora`: r, alpha, dropout,
    target_modules); the base weights are frozen. The adapters' random initialisation (A; B
    starts at 0) is drawn from `seed`, whatever the global RNG's state: two runs start alike."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=lora.target_modules, task_type="CAUSAL_LM")
    check_targets(model, config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def check_targets(model: torch.nn.Module, config: Any) -> None:
    """ConfigError (one line) when `config.target_modules` (peft's LoraConfig) names no module of
    `model`, with the names of the model's linear layers it could name; peft's own error is a
    long traceback."""
    from peft.tuners.tuners_utils import check_target_module_exists

    from ..errors import ConfigError

    names = [name for name, _ in model.named_modules() if name]
    if any(check_target_module_exists(config, name) for name in names):
        return
    linear = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    wanted = config.target_modules if isinstance(config.target_modules, str) else sorted(config.target_modules)
    raise ConfigError(f"config error: policy.lora.target_modules {wanted} match no module of the policy "
                      f"{type(model).__name__}; its linear layers are named: {', '.join(linear)}")


def merged_state(peft_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict with every adapter folded in, under the base model's own names
    (what transformers' save_pretrained, the HF generator and vLLM load)."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    state: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                layer = module.get_base_layer()
                weight = layer.weight.detach()
                for adapter in module.active_adapters:
                    if adapter in module.lora_A:
                        weight = weight + module.get_delta_weight(adapter).to(weight.dtype)
                state[f"{name}.weight"] = weight
                if getattr(layer, "bias", None) is not None:
                    state[f"{name}.bias"] = layer.bias.detach()
        for key, value in base.state_dict().items():
            if "lora_" in key or ".base_layer." in key:
                continue
            state.setdefault(key, value)
    return state


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")
