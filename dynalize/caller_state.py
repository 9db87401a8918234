"""What a run changes in its caller's process, put back when `dynalize.train` returns.

A run sets torch's thread count, reseeds torch's global generator (generation seeds it per
request), configures logging (its own root handler, quieter libraries, structlog's renderer) and
transformers' verbosity. The command line owns its process; a notebook or script that calls
`dynalize.train` does not hand it over: its logging handlers, thread count and random state are
the same after the call as before it, whether the run finished or raised.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog

LOG_LEVEL_HELP = ("how much the log on stderr says: DEBUG, INFO (the default), WARNING or ERROR "
                  "(results, tables and one-line errors are printed at every level)")
"""`--log-level`'s help, the same in every command."""

QUIETED = ("httpx", "transformers", "accelerate")
"""The library loggers the run sets to WARNING (api.setup_logging)."""


def _torch_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"threads": torch.get_num_threads(), "rng": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def _restore_torch(state: dict[str, Any]) -> None:
    import torch

    if torch.get_num_threads() != state["threads"]:
        torch.set_num_threads(state["threads"])
    torch.set_rng_state(state["rng"])
    if "cuda_rng" in state:
        torch.cuda.set_rng_state_all(state["cuda_rng"])


def _transformers_state() -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    return {"verbosity": hf_logging.get_verbosity(), "progress": hf_logging.is_progress_bar_enabled()}


def _restore_transformers(state: dict[str, Any]) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity(state["verbosity"])
    (hf_logging.enable_progress_bar if state["progress"] else hf_logging.disable_progress_bar)()


@contextmanager
def kept_caller_state() -> Iterator[None]:
    """Run the block, then put back the caller's logging (root handlers, levels, structlog's
    configuration), torch's thread count and global random state (and Python's and numpy's), and
    transformers' verbosity. Handlers the block added to the root logger are removed and closed;
    the caller's own are never closed."""
    import numpy as np

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quieted = {name: logging.getLogger(name).level for name in QUIETED}
    struct = structlog.get_config()
    torch_state, hf_state = _torch_state(), _transformers_state()
    py_rng, np_rng = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
                h.close()
        for h in handlers:
            if h not in root.handlers:
                root.addHandler(h)
        root.setLevel(level)
        for name, lvl in quieted.items():
            logging.getLogger(name).setLevel(lvl)
        structlog.configure(**struct)
        _restore_torch(torch_state)
        _restore_transformers(hf_state)
        random.setstate(py_rng)
        np.random.set_state(np_rng)


def use_root_handler(handler: logging.Handler, level: str) -> None:
    """Make `handler` the root logger's only one, at `level`, without closing the handlers it
    replaces (logging.basicConfig(force=True) closes them: a caller's file handler would stay
    closed after the run)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
