"""Tiny models built locally: a byte-level BPE tokenizer trained offline and Qwen2-style models.

Nothing here downloads anything. `resolve("tiny:<name>")` builds the named model once into the
cache (`$DYNALIZE_CACHE`, default `~/.cache/dynalize`) and returns its directory, which then loads
like any Hugging Face model directory. Tasks can register their own builders (`register`), e.g.
a policy pre-trained on the task's language; `dynalize.build.model_dir` imports the built-in
tasks first, so their names resolve anywhere.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_PREFIX = "tiny:"

# A small built-in corpus: enough English for a BPE vocabulary of a few thousand tokens.
_BASE_TEXT = """
The quick brown fox jumps over the lazy dog. A story begins with a person, a place and a want.
Write about the sea, the forest, the city, the river, the mountain, the garden, the desert, the
moon, the stars, the rain, the winter, the summer, music, friendship, memory, courage, silence.
Sure, here is a short piece. I think this is a good question. Thank you for sharing that with me.
How does that make you feel? What would you like to talk about next? Let us take a breath together.
It was a quiet morning when she opened the window and listened to the birds sing in the trees.
He walked along the old road, thinking of home, of his mother's kitchen and the smell of bread.
The light was soft and golden, and the children laughed as they ran across the wet green field.
Numbers 0 1 2 3 4 5 6 7 8 9 10 100 and signs , . ; : ! ? ' " ( ) - / * + = < > [ ] { } # @ & %.
"""


def base_corpus() -> list[str]:
    """The default tokenizer corpus: the built-in text, as lines."""
    return [line.strip() for line in _BASE_TEXT.strip().splitlines() if line.strip()]


def build_tokenizer(texts: Iterable[str], vocab_size: int = 4096, padding_side: str = "left") -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts`, with ChatML special tokens and template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side=padding_side,  # must be passed here: set afterwards, transformers 5 does not save it
        chat_template=CHATML_TEMPLATE,
        model_max_length=4096,
    )


def qwen2_config(vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 2, kv_heads: int = 1,
                 intermediate: int = 256, max_positions: int = 1024, **extra) -> Qwen2Config:
    """A tiny Qwen2 config. head_dim = hidden / heads stays ≥ 32 so vLLM can load it."""
    assert hidden // heads >= 32, "vLLM needs attention head_dim >= 32"
    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=intermediate, max_position_embeddings=max_positions,
        tie_word_embeddings=True, rope_theta=10000.0, **extra,
    )


def build_policy(out: Path, seed: int = 0, texts: Iterable[str] | None = None, **arch) -> None:
    """A random-init tiny causal LM and its tokenizer, saved to `out`."""
    tokenizer = build_tokenizer(texts or base_corpus())
    cfg = qwen2_config(len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, **arch)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    tokenizer.save_pretrained(out)


def build_reward_model(out: Path, seed: int = 0, texts: Iterable[str] | None = None, **arch) -> None:
    """A random-init tiny sequence classifier with one output (a Bradley–Terry RM shape)."""
    tokenizer = build_tokenizer(texts or base_corpus(), padding_side="right")
    cfg = qwen2_config(len(tokenizer), num_labels=1, pad_token_id=tokenizer.pad_token_id, **arch)
    torch.manual_seed(seed)
    Qwen2ForSequenceClassification(cfg).save_pretrained(out)
    tokenizer.save_pretrained(out)


Builder = Callable[[Path], None]
_BUILDERS: dict[str, tuple[Builder, str]] = {
    "policy": (build_policy, "2"),
    "rm": (build_reward_model, "2"),
}


def register(name: str, builder: Builder, version: str = "1") -> None:
    """Make `tiny:<name>` buildable. Bump `version` when the builder's output changes."""
    _BUILDERS[name] = (builder, version)


def known(path: str) -> bool:
    """Whether `path` is `tiny:<name>` with a registered builder."""
    return path.startswith(TINY_PREFIX) and path[len(TINY_PREFIX):] in _BUILDERS


def cache_dir() -> Path:
    return Path(os.environ.get("DYNALIZE_CACHE", Path.home() / ".cache" / "dynalize"))


def resolve(path: str) -> str:
    """A model directory for `path`: a `tiny:<name>` is built into the cache on first use."""
    if not path.startswith(TINY_PREFIX):
        if not Path(path).exists():
            raise FileNotFoundError(f"model path does not exist: {path}")
        return path
    name = path[len(TINY_PREFIX):]
    if name not in _BUILDERS:
        raise FileNotFoundError(f"unknown tiny model {path!r}: known are {', '.join(sorted(_BUILDERS))}")
    builder, version = _BUILDERS[name]
    key = hashlib.sha256(f"{name}:{version}:{torch.__version__}".encode()).hexdigest()[:10]
    out = cache_dir() / "tiny" / f"{name}-{key}"
    if not (out / "config.json").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{name}-"))
        try:
            builder(tmp)
            if not (out / "config.json").exists():  # another process may have won the race
                shutil.rmtree(out, ignore_errors=True)
                tmp.rename(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(out)
