"""dynalize: RL post-training of language models with GRPO against reward models, rubric
rewards and Dynalize's evolving penalties.

`dynalize.train(config, **overrides)` runs what `python -m dynalize.run` runs (dynalize/api.py).
"""

from typing import Any

__all__ = ["RunConfig", "RunResult", "train"]


def __getattr__(name: str) -> Any:  # the API imports torch-backed parts: load it on first use
    if name in ("train", "RunResult"):
        from . import api

        return getattr(api, name)
    if name == "RunConfig":
        from .config import RunConfig

        return RunConfig
    raise AttributeError(f"module 'dynalize' has no attribute {name!r}")
