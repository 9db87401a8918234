"""Hub dataset ids (`hub:ORG/NAME[@REVISION][:SPLIT]`) wherever a task reads a data file: loaded
through `datasets.load_dataset`, offline from the local Hub cache, and an id that cannot be
resolved stops with one line naming it. No network: the test builds the dataset repository
(as `huggingface-cli download --repo-type dataset` leaves it) in a temporary Hub cache."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynalize.tasks.data import DataError
from dynalize.tasks.hub import HubId

REPO = Path(__file__).resolve().parent.parent
MAIN = "1" * 40
V1 = "2" * 40
CARD = """---
configs:
- config_name: default
  data_files:
  - {split: train, path: data/train.jsonl}
  - {split: test, path: data/test.jsonl}
- config_name: small
  data_files:
  - {split: train, path: small/train.jsonl}
- config_name: prefs
  data_files:
  - {split: pairs, path: prefs/pairs.jsonl}
---
"""


def write_snapshot(cache: Path, commit: str, prompts: dict[str, list[str]]) -> None:
    root = cache / "datasets--org--stories" / "snapshots" / commit
    (root / "README.md").parent.mkdir(parents=True, exist_ok=True)
    (root / "README.md").write_text(CARD, encoding="utf-8")
    for rel, texts in prompts.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts), encoding="utf-8")
    (root / "prefs").mkdir(exist_ok=True)
    (root / "prefs" / "pairs.jsonl").write_text(json.dumps({"prompt": "p", "chosen": "good", "rejected": "bad"}) + "\n",
                                               encoding="utf-8")


@pytest.fixture
def offline_hub(tmp_path):
    """Env of a process with the Hub unreachable and org/stories in its Hub cache: main and tag v1."""
    cache = tmp_path / "hub"
    write_snapshot(cache, MAIN, {"data/train.jsonl": ["a dragon", "a moon", "a ship"],
                                 "data/test.jsonl": ["a test"], "small/train.jsonl": ["small one"]})
    write_snapshot(cache, V1, {"data/train.jsonl": ["old prompt"], "data/test.jsonl": ["old test"],
                               "small/train.jsonl": ["old small"]})
    refs = cache / "datasets--org--stories" / "refs"
    refs.mkdir()
    (refs / "main").write_text(MAIN)
    (refs / "v1").write_text(V1)
    return {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "home"),
            "HF_DATASETS_CACHE": str(tmp_path / "datasets"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


READ = """
import json, sys
from dynalize.rm.pairfile import read_pairs
from dynalize.tasks.data import DataError, read_rows
out = {}
for spec in sys.argv[1:]:
    try:
        if spec.endswith(":pairs"):
            out[spec] = [(p.chosen, p.rejected) for p in read_pairs(spec)]
        else:
            out[spec] = [r.data["prompt"] for r in read_rows(spec, required=["prompt"])]
    except DataError as e:
        out[spec] = str(e)
print(json.dumps(out))
"""


def read_offline(env: dict[str, str], *specs: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", READ, *specs], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_hub_ids_load_offline_from_the_local_hub_cache_with_split_revision_and_config(offline_hub):
    got = read_offline(offline_hub, "hub:org/stories", "hub:org/stories:test", "hub:org/stories@v1:train",
                       f"hub:org/stories@{V1}:test", "hub:org/stories:small:train", "hub:org/stories:train[1:]")
    assert got == {"hub:org/stories": ["a dragon", "a moon", "a ship"], "hub:org/stories:test": ["a test"],
                   "hub:org/stories:train[1:]": ["a moon", "a ship"],
                   "hub:org/stories@v1:train": ["old prompt"], f"hub:org/stories@{V1}:test": ["old test"],
                   "hub:org/stories:small:train": ["small one"]}


def test_a_reward_model_pair_file_may_be_a_hub_dataset(offline_hub):
    got = read_offline(offline_hub, "hub:org/stories:prefs:pairs")
    assert got == {"hub:org/stories:prefs:pairs": [["good", "bad"]]}


def test_a_hub_id_that_cannot_be_resolved_offline_fails_with_one_line_naming_it(offline_hub):
    got = read_offline(offline_hub, "hub:org/missing", "hub:org/stories@v9:train")
    for spec, message in got.items():
        assert isinstance(message, str) and "\n" not in message, message
        assert message.startswith(f"data error: {spec}: "), message


def test_a_run_on_an_unresolvable_hub_id_exits_2_with_one_line_and_no_run_directory(offline_hub, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dynalize.run", f"output_dir={tmp_path / 'runs'}", "name=hub",
         "task.name=creative_writing",
         "task.args.train_file=hub:org/missing", "reward_model.engine=python",
         "reward_model.path=examples.haiku.haiku_task:haiku_reward"],
        env=offline_hub, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: data error: hub:org/missing: ")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "runs" / "hub").exists()


@pytest.mark.parametrize("spec", ["hub:", "hub:a/b/c", "hub:org/x@:train", "hub:org/x:a:b:c", "hub:org/x::train"])
def test_a_malformed_hub_id_is_refused_with_its_form(spec):
    with pytest.raises(DataError, match="is not a Hub dataset id: use hub:ORG/NAME"):
        HubId.parse(spec)


def test_hub_id_fields():
    assert HubId.parse("hub:org/x@rev:cfg:test") == HubId("org/x", "rev", "cfg", "test")
    assert HubId.parse("hub:squad") == HubId("squad")
    assert HubId.parse("hub:org/x:train[:2]") == HubId("org/x", split="train[:2]")
    assert HubId.parse("hub:org/x@v1:cfg:train[1:3]") == HubId("org/x", "v1", "cfg", "train[1:3]")


def test_max_row_chars_caps_a_hub_datasets_rows(offline_hub, tmp_path):
    cache = Path(offline_hub["HF_HUB_CACHE"])
    write_snapshot(cache, "3" * 40, {"data/train.jsonl": ["short", "x" * 300_000], "data/test.jsonl": ["t"],
                                     "small/train.jsonl": ["s"]})
    (cache / "datasets--org--stories" / "refs" / "big").write_text("3" * 40)
    got = read_offline(offline_hub, "hub:org/stories@big:train")
    assert got["hub:org/stories@big:train"].startswith("data error: hub:org/stories@big:train row 1: a row of ")
    assert "over max_row_chars=200,000" in got["hub:org/stories@big:train"]
