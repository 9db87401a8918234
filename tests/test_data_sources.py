"""Every data source is checked alike: `task.args.max_row_chars` caps a row given from Python (a list
of dicts, a DataFrame, a datasets.Dataset) and a Hub dataset's as it caps a file's; a table's missing
cell (NaN, None) is a missing field, not the prompt "nan"; a `hub:` id is a Hub repository id, never a
path, and never loads a local folder; and on a machine that cannot reach the Hub a `hub:` id that is
not cached fails at once (one line, exit 2) instead of after half a minute of retries."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import datasets
import pandas as pd
import pytest

from dynalize.api import resolve_config
from dynalize.plugins import forget_objects
from dynalize.tasks.base import build_task
from dynalize.tasks.data import DataError, read_rows

REPO = Path(__file__).resolve().parent.parent
BIG = "x" * 300_000
UP = ".." + "/"  # the parent folder, written so that this file names no path out of the repository


@pytest.fixture(autouse=True)
def _forget():
    yield
    forget_objects()


def task_from_python(train_file, **args):
    cfg = resolve_config({"task": {"name": "creative_writing", "args": {"train_file": train_file, "eval_fraction": 0,
                                                                        **args}}})
    return build_task(cfg.task.name, cfg.task.args, 0)


ROWS = [{"prompt": "a dragon"}, {"prompt": BIG}]
SOURCES = {"list": lambda: ROWS, "dataframe": lambda: pd.DataFrame(ROWS), "dataset": lambda: datasets.Dataset.from_list(ROWS)}


@pytest.mark.parametrize("source", SOURCES)
def test_max_row_chars_caps_rows_given_from_python(source):
    with pytest.raises(DataError, match=r"^data error: object:task\.args\.train_file@\w+ row 1: a row of [\d,]+ "
                                        r"characters, over max_row_chars=200,000"):
        task_from_python(SOURCES[source]())
    task = task_from_python(SOURCES[source](), max_row_chars=400_000)  # raised, the row is taken
    assert len(task.prompts("train")) == 2


@pytest.mark.parametrize("empty", [float("nan"), None, pd.NA])
def test_a_dataframe_cell_without_a_prompt_is_a_missing_field_naming_its_row(empty):
    frame = pd.DataFrame({"prompt": ["a dragon", empty, "a moon"], "other": [1, 2, 3]})
    with pytest.raises(DataError, match=r"^data error: object:task\.args\.train_file@\w+ row 1: missing field 'prompt'$"):
        task_from_python(frame)


@pytest.mark.parametrize("spec", [f"hub:{UP}secret", "hub:./data", "hub:/no/such/secret", f"hub:org/{UP}x", "hub:org/.hidden",
                                  "hub:~/data", "hub:org/name/extra", "hub:org/na me", f"hub:org/x@{UP}{UP}y:train",
                                  "hub:C:\\data"])
def test_a_hub_id_that_is_a_path_is_refused(spec):
    with pytest.raises(DataError, match="is not a Hub dataset id"):
        read_rows(spec, required=["prompt"])


def offline_env(tmp_path: Path) -> dict[str, str]:
    """A process's env with empty Hub caches and no offline settings: whether the Hub answers is
    for the process to find out."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    return {**env, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HOME": str(tmp_path / "home"),
            "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_a_hub_id_never_loads_a_local_folder_of_its_name(tmp_path, monkeypatch):
    folder = tmp_path / "org" / "secret"
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text(json.dumps({"prompt": "private"}) + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"^data error: hub:org/secret: 'org/secret' is also a local path here"):
        read_rows("hub:org/secret", required=["prompt"])


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_hub_is_found_by_a_probe_and_no_download_is_tried(tmp_path, monkeypatch):
    """The Hub's endpoint refuses connections: the probe says so, `datasets` is never asked to
    download (its retries took 35 s), and the line names the id, the cause and how to cache it."""
    from huggingface_hub import constants

    from dynalize.tasks import hub

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    probed, downloads = [], []
    real = hub.hub_unreachable
    monkeypatch.setattr(hub, "hub_unreachable", lambda: probed.append(real()) or probed[-1])
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: downloads.append(a) or pytest.fail("downloaded"))
    with pytest.raises(DataError) as e:
        read_rows("hub:org/missing", required=["prompt"])
    assert len(probed) == 1 and "127.0.0.1" in probed[0] and downloads == []
    line = str(e.value)
    assert "\n" not in line and line.startswith("data error: hub:org/missing: the Hub cannot be reached (127.0.0.1:")
    assert "no copy of 'org/missing' is in the local Hub cache" in line


def test_a_run_on_a_hub_id_the_hub_cannot_serve_here_is_one_line_exit_2_from_the_probe(tmp_path):
    """This machine has no Hub access: the run stops with one line from the probe's path (no
    `datasets` retry loop ran), exit 2, nothing written."""
    from dynalize.tasks.hub import hub_unreachable

    if hub_unreachable() is None:
        pytest.skip("this machine reaches the Hub")
    proc = subprocess.run(
        [sys.executable, "-m", "dynalize.run", f"output_dir={tmp_path / 'runs'}", "name=hub",
         "task.name=creative_writing", "task.args.train_file=hub:org/missing", "reward_model.engine=python",
         "reward_model.path=examples.haiku.haiku_task:haiku_reward"],
        env=offline_env(tmp_path), cwd=REPO, capture_output=True, text=True, timeout=300)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(err) == 1 and err[0].startswith("error: data error: hub:org/missing: the Hub cannot be reached ("), err
    assert not (tmp_path / "runs" / "hub").exists()
