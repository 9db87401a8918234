"""Shared fixtures: a tiny end-to-end config on the toy task, written into a temp run dir."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # makes tests/toytask.py importable as `toytask`


@pytest.fixture
def toy_overrides(tmp_path):
    """Dotted overrides for a fast toy run (16 rollouts × 24 tokens per step)."""
    return [
        f"output_dir={tmp_path}", "steps=3", "batch_size=16", "group_size=4", "progress=false",
        "generator.max_new_tokens=24", "trainer.lr=1e-3", "trainer.micro_batch_size=8",
        "task.name=toytask:ToyTask", "reward_model.engine=task", "checkpoint_every=0",
    ]


QWEN3_STYLE_TEMPLATE = (Path(__file__).parent / "fixtures" / "qwen3_style_chat_template.jinja").read_text()
"""A chat template in the style of Qwen3's: not prefix-stable (see the file's comment)."""


@pytest.fixture(scope="session")
def qwen3_style_policy(tmp_path_factory):
    """The tiny policy with a Qwen3-style chat template: a model directory."""
    import shutil

    from dynalize import tiny
    from dynalize.backends.hf import load_tokenizer

    out = tmp_path_factory.mktemp("qwen3-style") / "policy"
    shutil.copytree(tiny.resolve("tiny:policy"), out)
    tok = load_tokenizer(str(out))
    tok.chat_template = QWEN3_STYLE_TEMPLATE
    tok.save_pretrained(str(out))
    return str(out)
