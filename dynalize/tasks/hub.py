"""Hugging Face Hub dataset ids (`hub:ORG/NAME[@REVISION][:SPLIT]`, docs/data_formats.md): parsed
strictly (a Hub repository id, never a path), read through `datasets.load_dataset`, and, when the
Hub cannot be reached (offline settings, or no connection to its host within HUB_PROBE_S), from
the local Hub cache at once, instead of after half a minute of `datasets`' retries.

    rows = read_hub("hub:org/stories@v1:test")     # dynalize.tasks.data.read_rows calls it
"""

from __future__ import annotations

import os
import re
import socket
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..extras import optional_import
from .rows import DataError, Row, first_line

HUB_PREFIX = "hub:"
"""A data path starting with this names a Hugging Face Hub dataset (docs/data_formats.md)."""


_REPO_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"(?:{_REPO_PART}/)?{_REPO_PART}")
"""A Hub repository id, as the Hub's own grammar allows: `NAME` or `OWNER/NAME`, letters, digits,
`.`, `_` and `-`, neither starting nor ending with `.` or `-`; never a path (`..`, `./x`, `/x`)."""
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/-]{0,255}")
_CONFIG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,255}")
_SPLIT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+%:\[\]-]{0,255}")  # train, train[:100], train[10%:]+test

HUB_PROBE_S = 2.0
"""How long the Hub's host (or the proxy's) gets to accept a connection before a Hub id is read
from the local Hub cache alone: on a machine without network, `datasets` spends half a minute
retrying before it gives up."""


@dataclass(frozen=True)
class HubId:
    """`hub:ORG/NAME[@REVISION][:SPLIT]` or `hub:ORG/NAME[@REVISION][:CONFIG:SPLIT]`, parsed; `ORG/NAME`
    must be a Hub repository id (`_REPO_ID`), never a path."""

    name: str
    revision: str | None = None
    config: str | None = None
    split: str = "train"

    @classmethod
    def parse(cls, spec: str) -> "HubId":
        body = spec.removeprefix(HUB_PREFIX)
        repo, _, rest = body.partition(":")
        repo, _, revision = repo.partition("@")
        parts = re.split(r":(?![^\[]*\])", rest) if rest else []  # a split may be sliced: train[:100]
        if (not _REPO_ID.fullmatch(repo) or ".." in repo or "--" in repo or len(repo) > 96 or len(parts) > 2
                or "" in parts or (revision == "" and "@" in body)
                or (revision and (not _REVISION.fullmatch(revision) or ".." in revision))
                or not all((_CONFIG if k < len(parts) - 1 else _SPLIT).fullmatch(x) for k, x in enumerate(parts))):
            raise DataError(f"data error: {spec!r} is not a Hub dataset id: use hub:ORG/NAME, "
                            f"hub:ORG/NAME@REVISION:SPLIT or hub:ORG/NAME@REVISION:CONFIG:SPLIT (ORG and NAME: "
                            f"letters, digits, '.', '_', '-'; a local folder is given as a path, without hub:)")
        config, split = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0] if parts else "train")
        return cls(repo, revision or None, config, split)


def read_hub(spec: str) -> list[Row]:
    """A Hub dataset's split, through `datasets.load_dataset`: downloaded or cached, or, when the
    Hub cannot be reached (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE, no network: `hub_unreachable`),
    from the dataset repository in the local Hub cache (`huggingface-cli download --repo-type
    dataset ORG/NAME`). Never a local folder: `datasets` would load one of the id's name first."""
    datasets = optional_import("datasets", f"data error: {spec}: a Hub dataset")

    hub = HubId.parse(spec)
    if Path(hub.name).exists():
        raise DataError(f"data error: {spec}: {hub.name!r} is also a local path here, which datasets would load "
                        f"instead of the Hub dataset: give a local folder as a path (without hub:), or run from "
                        f"another folder")
    at = f" at revision {hub.revision!r}" if hub.revision else ""
    if not hub_offline() and (unreachable := hub_unreachable()):
        folder = _cached_snapshot(hub)
        if folder is None:
            raise DataError(f"data error: {spec}: the Hub cannot be reached ({unreachable}) and no copy of "
                            f"{hub.name!r}{at} is in the local Hub cache (download it where there is a network: "
                            f"huggingface-cli download --repo-type dataset {hub.name})")
        ds = _load_snapshot(spec, hub, folder)
    else:
        try:
            ds = datasets.load_dataset(hub.name, hub.config, split=hub.split, revision=hub.revision)
        except Exception as online:  # noqa: BLE001 - datasets raises many types; the cached copy is tried next
            folder = _cached_snapshot(hub)
            if folder is None:
                raise DataError(f"data error: {spec}: cannot load the Hub dataset {hub.name!r}{at} and no copy of it "
                                f"is in the local Hub cache ({first_line(online)})") from None
            ds = _load_snapshot(spec, hub, folder)
    return [Row(r, f"{spec} row {i}") for i, r in enumerate(ds)]


def _load_snapshot(spec: str, hub: HubId, folder: str) -> Any:
    datasets = optional_import("datasets", f"data error: {spec}: a Hub dataset")

    try:
        return datasets.load_dataset(folder, hub.config, split=hub.split)
    except Exception as e:  # noqa: BLE001
        raise DataError(f"data error: {spec}: the cached copy of {hub.name!r} ({folder}) does not load "
                        f"({first_line(e)})") from None


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE or HF_DATASETS_OFFLINE asks for the local cache alone."""
    return any(os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_unreachable() -> str | None:
    """Why the Hub cannot be reached from here, or None: its endpoint (HF_ENDPOINT), or the HTTPS
    proxy when one is set, must resolve and accept a TCP connection within HUB_PROBE_S."""
    from huggingface_hub import constants

    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or os.environ.get("ALL_PROXY")
    parts = urlsplit(proxy or constants.ENDPOINT)
    if not parts.hostname:
        return None  # nothing to probe: leave it to datasets
    return _connect_problem(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))


@cache
def _connect_problem(host: str, port: int) -> str | None:
    """Why `host:port` accepts no connection within HUB_PROBE_S (name lookup included: it runs in
    a thread, so a resolver that hangs is cut too), or None; asked once per process."""
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=HUB_PROBE_S).close()
            outcome.append(None)
        except OSError as e:
            outcome.append(f"{host}:{port}: {first_line(e)}")

    probe = threading.Thread(target=connect, name="hub-probe", daemon=True)
    probe.start()
    probe.join(HUB_PROBE_S + 0.5)
    return outcome[0] if outcome else f"{host}:{port}: no connection within {HUB_PROBE_S:g} s"


def _cached_snapshot(hub: HubId) -> str | None:
    """The folder of `hub`'s dataset repository in the local Hub cache, or None; no network."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(hub.name, repo_type="dataset", revision=hub.revision, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached (or not at that revision)
        return None
