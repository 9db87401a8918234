"""Experiment trackers with the real libraries, offline: one toy run (3 steps, a penalty added in
step 2, evaluations at steps 0, 2 and 3, samples due at steps 2 and 3) reports to every tracker installed, and each one's files are
read back with the library's own reader: TensorBoard's EventAccumulator, W&B's offline run file
(its protobuf records), Trackio's SQLite storage, MLflow's client on a local directory."""

from __future__ import annotations

import glob
import importlib.util
import json
import struct
from pathlib import Path

import anyio
import pytest
from toytask import penalty_overrides

from dynalize.config import load_config
from dynalize.run import main, train
from dynalize.runlog import read_jsonl
from dynalize.trackers import MODULES, markdown_table, sample_columns, sample_rows

STEPS = 3
TOY_COLUMNS = ["step", "prompt", "reply", "rm", "penalties triggered", "reward"]
"""The sample table of a run with an RM and penalties, no rubric term."""


def installed(name: str) -> bool:
    return importlib.util.find_spec(MODULES[name]) is not None


def needs(name: str):
    return pytest.mark.skipif(not installed(name), reason=f"{MODULES[name]} is not installed "
                                                          f"(pip install -e \".[trackers]\")")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A toy run reporting to every installed tracker, each writing under a temp directory."""
    tmp = tmp_path_factory.mktemp("trackers")
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp / "wandb"), "WANDB_SILENT": "true",
           "TRACKIO_DIR": str(tmp / "trackio"), "MLFLOW_TRACKING_URI": f"file:{tmp / 'mlruns'}",
           "MLFLOW_ALLOW_FILE_STORE": "true"}
    (tmp / "wandb").mkdir()
    report_to = [name for name in MODULES if installed(name)]
    if not report_to:
        pytest.skip("no tracker library is installed (pip install -e \".[trackers]\")")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        cfg = load_config(None, [
            f"output_dir={tmp}", "name=tracked", f"steps={STEPS}", "batch_size=16", "group_size=4", "progress=false",
            "generator.max_new_tokens=24", "trainer.lr=1e-3", "trainer.micro_batch_size=8", "checkpoint_every=0",
            "task.name=toytask:ToyTask", "reward_model.engine=task", "eval_every=2", "export_final=false",
            f"report_to={json.dumps(report_to)}", "tracker_project=dynalize-test", *penalty_overrides()])
        anyio.run(train, cfg, False)
    root = tmp / "tracked"
    return {"tmp": tmp, "root": root, "metrics": read_jsonl(root / "metrics.jsonl"),
            "rollouts": {s: read_jsonl(root / "rollouts" / f"step_{s:06d}.jsonl") for s in range(1, STEPS + 1)}}


def check_numbers(run, series: dict[str, dict[int, float]]) -> None:
    """Every metric of every step of metrics.jsonl is in `series` (name → step → value)."""
    assert run["metrics"][0] == {"step": 0, **{k: v for k, v in run["metrics"][0].items() if k.startswith("eval/")}}
    for m in run["metrics"][1:]:  # row 0: the evaluation before training
        for key in ("reward/mean", "rm/mean", "loss", "penalties/active", "time/step"):
            assert series[key][m["step"]] == pytest.approx(m[key], rel=1e-6), (key, m["step"])
        for age, n in m["staleness"].items():  # nested metrics, flattened
            assert series[f"staleness/{age}"][m["step"]] == n
    assert series["eval/vowels"].keys() == {0, 2, 3}  # the held-out evaluation's steps, step 0 included
    assert series["penalty/p001/prevalence"].keys() == {2, 3}  # the penalty came in at step 2


def first_reply(run, step: int) -> str:
    return run["rollouts"][step][0]["replies"][0]


@needs("tensorboard")
def test_tensorboard_holds_every_metric_the_config_and_the_tables(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(run["root"] / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    check_numbers(run, {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]})
    texts = {tag.removesuffix("/text_summary"): {e.step: e.tensor_proto.string_val[0].decode()
                                                 for e in events.Tensors(tag)} for tag in events.Tags()["tensors"]}
    assert texts["samples"].keys() == {2, 3}
    assert sample_columns(run["rollouts"][3]) == TOY_COLUMNS
    assert texts["samples"][3] == markdown_table(TOY_COLUMNS, sample_rows(3, run["rollouts"][3]))
    assert "| 3 | Write about the " in texts["samples"][3]
    assert "Doubles its vowels" in texts["events"][2]
    [hparams_dir] = {Path(p).parent for p in glob.glob(str(run["root"] / "tensorboard" / "*" / "events.*"))}
    hp = EventAccumulator(str(hparams_dir))
    hp.Reload()
    start = plugin_data_pb2.HParamsPluginData.FromString(hp.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    assert start.session_start_info.hparams["trainer.lr"].number_value == pytest.approx(1e-3)
    assert start.session_start_info.hparams["task.name"].string_value == "toytask:ToyTask"


def wandb_records(path: str) -> list:
    """The protobuf records of a W&B run file (`run-<id>.wandb`: a LevelDB-style log of 32 KiB
    blocks, each record under a 7-byte header: CRC, length, kind full/first/middle/last)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, parts, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            out.append(wandb_internal_pb2.Record.FromString(parts))
    return out


@needs("wandb")
def test_wandb_offline_run_holds_every_metric_the_config_and_the_tables(run):
    [run_dir] = glob.glob(str(run["tmp"] / "wandb" / "wandb" / "offline-run-*"))
    [log_file] = glob.glob(f"{run_dir}/run-*.wandb")
    records = wandb_records(log_file)
    series: dict[str, dict[int, float]] = {}
    config = {}
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for k, v in items.items():
                if isinstance(v, (int, float)):
                    series.setdefault(k, {})[items["_step"]] = v
        elif kind == "config":
            config.update({u.key: json.loads(u.value_json) for u in r.config.update})
        elif kind == "run":
            assert (r.run.project, r.run.display_name) == ("dynalize-test", "tracked")
    check_numbers(run, series)
    assert config["trainer.lr"] == pytest.approx(1e-3) and config["penalties.enabled"] is True
    tables = {Path(p).name.split("_")[0] + "_" + Path(p).name.split("_")[1]: json.loads(Path(p).read_text())
              for p in glob.glob(f"{run_dir}/files/media/table/*.table.json")}
    assert {"samples_2", "samples_3", "events_2"} <= set(tables)
    assert tables["samples_3"]["columns"] == TOY_COLUMNS
    assert tables["samples_3"]["data"][0][2] == first_reply(run, 3)
    assert tables["events_2"]["data"][0][2:5] == ["add", "p001", "Doubles its vowels"]


@needs("trackio")
def test_trackio_holds_every_metric_the_config_and_the_tables(run, monkeypatch):
    monkeypatch.setenv("TRACKIO_DIR", str(run["tmp"] / "trackio"))
    from trackio.sqlite_storage import SQLiteStorage

    logs = SQLiteStorage.get_logs("dynalize-test", "tracked")
    series: dict[str, dict[int, float]] = {}
    tables: dict[str, dict[int, list]] = {}
    for row in logs:
        for k, v in row.items():
            if isinstance(v, (int, float)) and k != "step":
                series.setdefault(k, {})[row["step"]] = v
            elif isinstance(v, dict) and v.get("_type") == "trackio.table":
                tables.setdefault(k, {})[row["step"]] = v["_value"]
    check_numbers(run, series)
    assert tables["samples"].keys() == {2, 3}
    assert tables["samples"][3][0]["reply"] == first_reply(run, 3)
    assert tables["events"][2][0]["title"] == "Doubles its vowels"
    config = SQLiteStorage.get_run_config("dynalize-test", "tracked")
    assert config["trainer.lr"] == pytest.approx(1e-3) and config["task.name"] == "toytask:ToyTask"
    assert "allow_val_change" not in config  # only the run's settings


@needs("mlflow")
def test_mlflow_holds_every_metric_the_config_and_the_tables(run, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{run['tmp'] / 'mlruns'}")
    [mlrun] = client.search_runs([client.get_experiment_by_name("dynalize-test").experiment_id])
    assert mlrun.info.run_name == "tracked"
    keys = ("reward/mean", "rm/mean", "loss", "penalties/active", "time/step", "staleness/0", "staleness/1",
            "eval/vowels", "penalty/p001/prevalence")
    check_numbers(run, {k: {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, k)} for k in keys})
    assert float(mlrun.data.params["trainer.lr"]) == pytest.approx(1e-3)
    artifacts = Path(client.download_artifacts(mlrun.info.run_id, "samples"))
    assert sorted(p.name for p in artifacts.iterdir()) == ["step_000002.json", "step_000003.json"]
    table = json.loads((artifacts / "step_000003.json").read_text())
    assert table["columns"] == TOY_COLUMNS and table["data"][0][2] == first_reply(run, 3)


def test_sample_table_takes_one_rollout_per_prompt_with_its_scores():
    rows = [{"prompt_id": p, "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": f"about {p}"}],
             "replies": [f"{p} {i}", "again"], "scores": {"rm": 0.5 + i}, "verdicts": {"p001": i == 1, "p002": True},
             "reward": float(i)} for p in ("a", "b", "c") for i in range(2)]
    assert sample_rows(7, rows, n=2) == [[7, "about a", "a 0\n\nagain", 0.5, "p002", 0.0],
                                         [7, "about b", "b 0\n\nagain", 0.5, "p002", 0.0]]
    assert sample_columns(rows) == TOY_COLUMNS
    assert markdown_table(TOY_COLUMNS, sample_rows(7, rows, n=1)).splitlines()[2] == \
        "| 7 | about a | a 0 again | 0.5 | p002 | 0 |"  # one line per row


def test_a_tracker_whose_library_is_missing_stops_the_run_with_one_line(toy_overrides, tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert main([*toy_overrides, "report_to=[tensorboard, wandb]"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: config error: report_to: wandb needs wandb, which is not installed: pip install 'dynalize[trackers]'"
    assert not (tmp_path / "default").exists()


def test_an_unknown_tracker_is_one_line(toy_overrides, capsys):
    assert main([*toy_overrides, "report_to=[tensorbored]"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "report_to" in err and "'tensorboard', 'wandb'" in err
