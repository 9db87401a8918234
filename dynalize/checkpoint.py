"""Checkpoints on disk: written whole, verified on resume, loaded without running code.

`checkpoints/step_NNNNNN/` holds the learner's files (`policy/`, `train_state/`, `learner.json`),
`rng.json` (Python and torch RNG state, as JSON), `state.json` (the orchestrator's state),
`inflight.json` (the batches generated ahead) and, written last, `manifest.json`: the size and
SHA-256 of every other file. The folder is written as `step_NNNNNN.tmp/` and renamed once the
manifest is in, so a crash (even `kill -9`) leaves the earlier checkpoints untouched and at most
a `.tmp` folder, which is ignored.

On resume the newest checkpoint whose files match its manifest, and that loads, is used; each
damaged one is skipped with a warning that names what is wrong. With none left the run stops
with one line; a checkpoint without a manifest is damaged unless it is recognisably from before
manifests (`from_before_manifests`). Nothing in a checkpoint runs code: the RNG state is JSON,
and accelerate loads its optimizer and RNG pickles with torch's restricted loader
(`torch.load(weights_only=True)`: tensors and plain containers only). The one exception is a
sharded (FSDP) `train_state/`: torch's distributed-checkpoint `.metadata` is read with pickle.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
import torch

from .errors import ConfigError, describe
from .runlog import naming

log = structlog.get_logger("dynalize.checkpoint")

MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"step_\d{6,}")
"""A finished checkpoint's folder name (`step_NNNNNN.tmp` is one being written)."""


# --- RNG state as JSON --------------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    """Python's and torch's (CPU) RNG state, JSON-ready."""
    version, internal, gauss = random.getstate()
    return {"python": [version, list(internal), gauss],
            "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")}


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    raw = bytearray(base64.b64decode(state["torch"], validate=True))
    torch.set_rng_state(torch.frombuffer(raw, dtype=torch.uint8).clone())


# --- manifest -----------------------------------------------------------------------------------

def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        os.fsync(f.fileno())  # on disk before the manifest vouches for it
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path) -> None:
    """`manifest.json`: size and SHA-256 of every file under `folder` (written last: the mark of
    a complete checkpoint)."""
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _digest(p)}
             for p in _files(folder)}
    tmp = folder / (MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"format": 1, "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MANIFEST)


def damage(folder: Path) -> str | None:
    """What is wrong with the checkpoint in `folder` (a missing, extra, resized or altered file),
    or None when every file matches its manifest."""
    try:
        listed = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        return "no manifest.json (written incompletely, or by a version before manifests)"
    except (ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest.json ({describe(e, 80)})"
    present = {p.relative_to(folder).as_posix() for p in _files(folder)}
    if missing := sorted(set(listed) - present):
        return f"{missing[0]} is missing"
    if extra := sorted(present - set(listed)):
        return f"{extra[0]} is not in the manifest"
    for name, want in listed.items():
        path = folder / name
        if path.stat().st_size != want["size"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {want['size']}"
        with open(path, "rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() != want["sha256"]:
                return f"{name} does not match its SHA-256 in the manifest"
    return None


# --- save and load ------------------------------------------------------------------------------

def save_checkpoint(path: Path, learner: Any, state: dict[str, Any]) -> None:
    """Learner (policy + optimizer), RNG and the orchestrator's `state` (its batches generated
    ahead go to inflight.json), written to `<path>.tmp`, checked, then renamed to `path`."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with naming(tmp):  # a full disk names the checkpoint, whichever library was writing
        learner.save(str(tmp))
        if not any(tmp.rglob("*")):
            raise RuntimeError(f"the learner wrote nothing into checkpoint {tmp}")
        state = dict(state)
        (tmp / "rng.json").write_text(json.dumps(rng_state()))
        (tmp / "inflight.json").write_text(json.dumps(state.pop("inflight", {})))
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
        write_manifest(tmp)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


STATE_TYPES: dict[str, type | tuple[type, ...]] = {
    "step": int, "data_position": int, "learner_version": int, "generator_version": int, "dropped_total": int,
    "left_out_total": int, "eval_rows": int, "terms": dict}
"""The types of the orchestrator's state in state.json (keys a checkpoint from an older version may lack)."""


def state_problem(state: Any) -> str | None:
    """What is wrong with the types of a loaded state.json, or None."""
    if not isinstance(state, dict):
        return f"state.json holds {type(state).__name__}, not an object"
    for key, kind in STATE_TYPES.items():
        value = state.get(key)
        if key in state and (not isinstance(value, kind) or isinstance(value, bool)):
            return f"state.json: {key} is {type(value).__name__} {str(value)[:40]!r}, not {getattr(kind, '__name__', kind)}"
    if "step" not in state:
        return "state.json has no step"
    return None


def load_checkpoint(path: Path, learner: Any) -> dict[str, Any]:
    """Restore the learner and RNG from `path`; return the orchestrator's state."""
    state = json.loads((path / "state.json").read_text())
    if problem := state_problem(state):
        raise ValueError(problem)
    state["inflight"] = json.loads((path / "inflight.json").read_text())
    learner.load(str(path))
    if (path / "rng.json").exists():
        set_rng_state(json.loads((path / "rng.json").read_text()))
    else:  # a checkpoint from before rng.json: plain tensors and tuples only, never code
        set_rng_state_legacy(torch.load(path / "rng.pt", weights_only=True))
    return state


def set_rng_state_legacy(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def checkpoints(folder: Path) -> list[Path]:
    """The finished checkpoints in `folder` (`step_NNNNNN`), newest first."""
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if p.is_dir() and STEP_DIR.fullmatch(p.name)), reverse=True)


def resume_from(folder: Path, learner: Any, restore: Callable[[dict[str, Any]], None] | None = None
                ) -> tuple[Path, dict[str, Any]]:
    """Load the newest intact checkpoint in `folder` into `learner` (and its state through
    `restore`, the orchestrator's `load_state_dict`); (its path, the orchestrator's state).
    Damaged ones, and ones whose state does not load, are skipped with a warning; with none
    intact, ConfigError (one line)."""
    found = checkpoints(folder)
    if not found:
        raise ConfigError(f"config error: {folder.parent} has no checkpoint to resume from")
    skipped = []
    for path in found:
        why = damage(path)
        legacy = why is not None and from_before_manifests(path)
        if why is not None and not legacy:
            skipped.append(f"{path.name}: {why}")
            log.warning("checkpoint.damaged", checkpoint=str(path), problem=why)
            continue
        if legacy:
            log.warning("checkpoint.unverified", checkpoint=str(path),
                        problem="written by a version from before manifests (rng.pt, no manifest.json): loaded unverified")
        try:
            state = load_checkpoint(path, learner)
            if restore is not None:
                restore(state)
            return path, state
        except Exception as e:  # noqa: BLE001 - a checkpoint that does not load is damaged too
            skipped.append(f"{path.name}: {describe(e, 120)}")
            log.warning("checkpoint.unloadable", checkpoint=str(path), problem=describe(e))
    raise ConfigError(f"config error: no intact checkpoint to resume from in {folder}: " + "; ".join(skipped))


def from_before_manifests(path: Path) -> bool:
    """Whether a checkpoint without `manifest.json` is recognisably older than manifests (they came
    with `rng.json`: such a checkpoint holds `rng.pt` instead). One that holds `rng.json` but no
    manifest was written by this version and lost its manifest: damaged, never loaded unverified."""
    return (not (path / MANIFEST).exists() and not (path / "rng.json").exists()
            and (path / "rng.pt").is_file() and (path / "state.json").is_file())


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
