"""dynalize: RL post-training of language models with GRPO against reward models, rubric
rewards and Dynalize's evolving penalties.

`dynalize.train(config, **overrides)` runs what `python -m dynalize.run` runs and
`dynalize.export(run_dir, out)` what `python -m dynalize.export` does (dynalize/api.py,
dynalize/export.py). Errors
to catch: `dynalize.ConfigError` (bad input: one line), `dynalize.FolderInUse` (a ConfigError:
another process holds the run folder), `dynalize.RunStopped` (the run stopped itself after a
checkpoint), `dynalize.HookError` (user code raised).
"""

from typing import Any

from .errors import ConfigError, RunStopped

__all__ = ["ConfigError", "FolderInUse", "HookError", "RunConfig", "RunResult", "RunStopped", "export", "train"]


def __getattr__(name: str) -> Any:  # the API imports torch-backed parts: load it on first use
    if name in ("train", "RunResult"):
        from . import api

        return getattr(api, name)
    if name == "export":  # the module dynalize/export.py, callable as its `export` function
        import importlib

        return importlib.import_module(f"{__name__}.export")
    if name == "RunConfig":
        from .config import RunConfig

        return RunConfig
    if name == "FolderInUse":
        from .folderlock import FolderInUse

        return FolderInUse
    if name == "HookError":
        from .hooks import HookError

        return HookError
    raise AttributeError(f"module 'dynalize' has no attribute {name!r}")
