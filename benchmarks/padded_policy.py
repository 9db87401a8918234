"""A random-init Qwen3 policy at a user's vocabulary, for the GPU check and the memory table.

Its own module so that benchmarks/gpu_check.py and benchmarks/memory.py both use it without importing
each other (gpu_check -> gpu_report -> memory, and nothing back).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def build_policy(out: Path, shape: dict[str, int], dtype: str, seed: int = 0) -> dict[str, Any]:
    """A random-init Qwen3 of `shape` in `dtype` and dynalize.tiny's tokenizer padded to its vocabulary."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from dynalize import tiny
    from dynalize.backends.hf import DTYPES

    tiny.build_tokenizer(tiny.base_corpus()).save_pretrained(out)
    spec = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    first = max(vocab.values()) + 1
    vocab.update({f"Ġ<{i}>": i for i in range(first, shape["vocab_size"])})  # no merge makes them: never encoded
    (out / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(out)
    if len(tok) != shape["vocab_size"]:
        raise RuntimeError(f"padded tokenizer has {len(tok)} tokens, the model {shape['vocab_size']}")
    cfg = Qwen3Config(**shape, max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=None)
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(cfg).to(DTYPES[dtype])
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    del model
    return {"path": str(out), "parameters_m": round(params / 1e6, 1), "dtype": dtype, **shape}
