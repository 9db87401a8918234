"""The optional packages dynalize imports and the extra that installs each: a missing one stops the
command with one line naming the extra (`pip install 'dynalize[data]'`), the same way everywhere.
(vLLM has its own line, dynalize.preflight.VLLM_HINT: on CPU it installs through a script.)"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from .errors import ConfigError

EXTRAS = {
    "datasets": "data", "pyarrow": "data",  # hub: datasets, parquet files, save_to_disk folders
    "peft": "lora",  # policy.lora
    "trl": "rm",  # python -m dynalize.rm train
    "tensorboard": "trackers", "wandb": "trackers", "trackio": "trackers", "mlflow": "trackers",  # report_to
}
"""Top-level module -> the pyproject.toml extra that installs it."""


def missing(module: str, what: str, extra: str | None = None) -> ConfigError:
    """The one-line error for `what` (e.g. "config error: policy.lora") needing the absent `module`;
    `extra` when a wider one than the module's own is what the command needs (rm: trl and datasets)."""
    return ConfigError(f"{what} needs {module}, which is not installed: "
                       f"pip install 'dynalize[{extra or EXTRAS[module]}]'")


def installed(module: str) -> bool:
    """Whether `module` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or stubbed parent package counts as absent
        return False


def require(module: str, what: str, extra: str | None = None) -> None:
    """Stop with `missing(module, what)` unless `module` is installed: the check a command makes before
    any work, so the user learns it in the first second, not after a model loaded."""
    if not installed(module):
        raise missing(module, what, extra)


def optional_import(module: str, what: str) -> ModuleType:
    """`import module`, or the one-line error naming its extra when it (or one of its own imports of
    the same package) is not installed."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] == module.split(".")[0]:
            raise missing(module.split(".")[0], what) from None
        raise
