"""Task data loaders: every file format, bad data as one-line errors before any model loads,
and the shipped configs."""

import json
from pathlib import Path

import pytest

from dynalize.config import ConfigError, load_config
from dynalize.run import main
from dynalize.tasks.base import task_class
from dynalize.tasks.data import DataError, held_out, read_rows

ROWS = [{"prompt": "A door in the sea.", "n": 1}, {"prompt": "The last bus.", "n": 2},
        {"prompt": "Snow in June.", "n": 3}]
REPO = Path(__file__).resolve().parent.parent


def write(path: Path, rows: list[dict], fmt: str) -> Path:
    """`rows` saved as `fmt`; returns the path read_rows takes."""
    if fmt == "jsonl":
        path = path.with_suffix(".jsonl")
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif fmt == "csv":
        import pandas as pd

        path = path.with_suffix(".csv")
        pd.DataFrame(rows).to_csv(path, index=False)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = path.with_suffix(".parquet")
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        import datasets

        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


FORMATS = ["jsonl", "csv", "parquet", "datasets"]
FIRST_PLACE = {"jsonl": "line 1", "csv": "line 2", "parquet": "row 0", "datasets": "row 0"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_the_same_rows(fmt, tmp_path):
    path = write(tmp_path / "data", ROWS, fmt)
    rows = read_rows(path, required=["prompt"])
    assert [r.data["prompt"] for r in rows] == ["A door in the sea.", "The last bus.", "Snow in June."]
    assert [int(r.data["n"]) for r in rows] == [1, 2, 3]
    assert rows[0].where == f"{path} {FIRST_PLACE[fmt]}"


@pytest.mark.parametrize(("fmt", "place"), [("jsonl", "line 2"), ("csv", "line 3"), ("parquet", "row 1"),
                                             ("datasets", "row 1")])
def test_missing_field_names_file_place_and_field(fmt, place, tmp_path):
    rows = [dict(ROWS[0]), {"prompt": None, "n": 5}, dict(ROWS[2])]
    path = write(tmp_path / "data", rows, fmt)
    with pytest.raises(DataError) as e:
        read_rows(path, required=["prompt"])
    assert str(e.value) == f"data error: {path} {place}: missing field 'prompt'"


def test_jsonl_lines_count_blank_lines_and_csv_lines_count_quoted_newlines(tmp_path):
    j = tmp_path / "d.jsonl"
    j.write_text('{"prompt": "a"}\n\n{"other": 1}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"d\.jsonl line 3: missing field 'prompt'$"):
        read_rows(j, ["prompt"])
    c = tmp_path / "d.csv"
    c.write_text('prompt,n\n"two\nlines",1\n\n,2\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"d\.csv line 5: missing field 'prompt'$"):
        read_rows(c, ["prompt"])
    assert read_rows(c)[0].data == {"prompt": "two\nlines", "n": "1"}


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_non_utf8_input_is_a_clear_error(suffix, tmp_path):
    path = tmp_path / f"latin1{suffix}"
    text = '{"prompt": "caf\u00e9"}\n' if suffix == ".jsonl" else "prompt\ncaf\u00e9\n"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(DataError) as e:
        read_rows(path, ["prompt"])
    line = 1 if suffix == ".jsonl" else 2
    assert str(e.value).startswith(f"data error: {path} is not UTF-8 text (line {line}, byte ")


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_data_is_a_clear_error(fmt, tmp_path):
    if fmt == "jsonl":
        path = tmp_path / "empty.jsonl"
        path.write_text("\n", encoding="utf-8")
    elif fmt == "csv":
        path = tmp_path / "empty.csv"
        path.write_text("prompt,n\n", encoding="utf-8")
    else:
        import pyarrow as pa

        path = tmp_path / "empty"
        schema = pa.schema([("prompt", pa.string())])
        if fmt == "parquet":
            import pyarrow.parquet as pq

            path = path.with_suffix(".parquet")
            pq.write_table(schema.empty_table(), path)
        else:
            import datasets

            datasets.Dataset(schema.empty_table()).save_to_disk(str(path))
    with pytest.raises(DataError) as e:
        read_rows(path, ["prompt"])
    assert str(e.value) == f"data error: {path} has no rows"


def test_missing_file_unknown_format_bad_json_and_dataset_dict(tmp_path):
    with pytest.raises(DataError, match="^data error: no such data file: .*nope.jsonl$"):
        read_rows(tmp_path / "nope.jsonl")
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(DataError, match=r"unknown data format '\.txt'"):
        read_rows(tmp_path / "d.txt")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.jsonl line 2: not valid JSON"):
        read_rows(tmp_path / "bad.jsonl")
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS)})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"holds several splits \(train, test\)"):
        read_rows(tmp_path / "dd")
    assert len(read_rows(tmp_path / "dd" / "train", ["prompt"])) == 3  # a split's subfolder loads
    assert issubclass(DataError, ConfigError)


def test_held_out_is_seeded_and_never_empty_or_everything():
    assert held_out(100, 0.1, seed=3) == held_out(100, 0.1, seed=3)
    assert held_out(100, 0.1, seed=3) != held_out(100, 0.1, seed=4)
    assert len(held_out(100, 0.1, 0)) == 10
    assert len(held_out(5, 0.01, 0)) == 1 and len(held_out(2, 0.9, 0)) == 1
    assert held_out(1, 0.5, 0) == set() and held_out(10, 0.0, 0) == set()


# --- through `python -m dynalize.run`: exit 2, one line, no model loaded ------------------------

@pytest.fixture
def no_models(monkeypatch):
    """Fail the test if anything tries to load a model. Afterwards, undo `main`'s logging setup:
    it binds structlog to this test's captured stderr, which pytest closes."""
    import structlog

    import dynalize.backends.accelerate as acc
    import dynalize.build as build

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the data error")

    monkeypatch.setattr(acc, "AccelerateLearner", boom)
    monkeypatch.setattr(build, "build_reward_model", boom)
    monkeypatch.setattr(build, "build_generator", boom)
    yield
    structlog.reset_defaults()


def _run(tmp_path, capsys, task, data, *extra):
    code = main([f"output_dir={tmp_path / 'runs'}", "progress=false", f"task.name={task}",
                 f"task.args.train_file={data}", "reward_model.engine=hf", "reward_model.path=tiny:rm",
                 "batch_size=8", "group_size=4", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def test_run_exits_2_on_a_missing_field(tmp_path, capsys, no_models):
    data = write(tmp_path / "cw", [ROWS[0], {"chosen_story": "x"}], "jsonl")
    code, err = _run(tmp_path, capsys, "creative_writing", data)
    assert code == 2 and err == [f"error: data error: {data} line 2: missing field 'prompt'"]


def test_run_exits_2_on_non_utf8_conversations(tmp_path, capsys, no_models):
    data = tmp_path / "c.jsonl"
    data.write_bytes('{"messages": [{"role": "user", "content": "\u00e9"}]}\n'.encode("latin-1"))
    code, err = _run(tmp_path, capsys, "counseling", data)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: data error: {data} is not UTF-8 text")


def test_run_exits_2_with_fewer_prompts_than_a_batch(tmp_path, capsys, no_models):
    rows = [ROWS[0], ROWS[0], ROWS[1], ROWS[2]]  # 3 unique prompts
    data = write(tmp_path / "cw", rows, "csv")
    code, err = _run(tmp_path, capsys, "creative_writing", data, "batch_size=16", "task.args.eval_fraction=0")
    assert code == 2
    assert err == ["error: config error: task 'creative_writing' has 3 training prompts, fewer than one batch "
                   "(4 = batch_size / group_size)"]


def test_run_exits_2_when_a_one_prompt_file_cannot_be_split(tmp_path, capsys, no_models):
    data = write(tmp_path / "one", [ROWS[0]], "jsonl")
    code, err = _run(tmp_path, capsys, "creative_writing", data, "group_size=8")
    assert code == 2
    assert err == [f"error: data error: {data} has 1 prompt: eval_fraction 0.05 cannot hold one out for evaluation "
                   f"and keep one for training (give an eval_file, or set eval_fraction: 0)"]


def test_run_exits_2_when_it_should_evaluate_without_held_out_prompts(tmp_path, capsys, no_models):
    data = write(tmp_path / "cw", ROWS, "jsonl")
    code, err = _run(tmp_path, capsys, "creative_writing", data, "batch_size=4", "task.args.eval_fraction=0",
                     "eval_every=5")
    assert code == 2
    assert err == ["error: config error: eval_every is 5 but task 'creative_writing' has no held-out prompts to "
                   "evaluate on (set eval_every: 0, or give the task held-out prompts)"]


def test_run_exits_2_on_a_missing_data_file(tmp_path, capsys, no_models):
    code, err = _run(tmp_path, capsys, "counseling_multiturn", tmp_path / "none.jsonl")
    assert code == 2 and err == [f"error: data error: no such data file: {tmp_path / 'none.jsonl'}"]


# --- shipped configs -------------------------------------------------------------------------

MY_CONFIGS = ["creative_writing", "counseling", "counseling_multiturn"]


CHAT_MODEL_CONFIGS = ("judge.yaml", "patient.yaml")  # benchmark chat models (tests/test_eval_runs.py builds them)


@pytest.mark.parametrize("path", [p for p in sorted((REPO / "configs").glob("*.yaml"))
                                  if p.name not in CHAT_MODEL_CONFIGS], ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    cfg = load_config(path)
    assert cfg.batch_size % cfg.group_size == 0


@pytest.mark.parametrize("name", MY_CONFIGS)
def test_task_configs_have_the_papers_settings(name):
    cfg = load_config(REPO / "configs" / f"{name}.yaml")
    assert (cfg.batch_size, cfg.group_size, cfg.generator.temperature) == (512, 16, 1.0)
    assert cfg.penalties.enabled and cfg.penalties.lam == 0.5
    assert cfg.policy.dtype == "bfloat16" and cfg.reward_model.engine == "hf"
    assert cfg.task.name == name
    args = task_class(name).Args.model_validate(cfg.task.args)  # task args validate too
    assert args.train_file
    if name == "creative_writing":
        assert cfg.reward_model.path == "SAA-Lab/Llama8B-CreativeWritingVerifier"
        assert cfg.reward_model.max_length == 2048
    if name == "counseling_multiturn":
        assert args.max_turns == 4 and args.user_simulator.engine == "openai"


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_over_max_row_chars_names_file_row_and_size(fmt, tmp_path):
    from dynalize.tasks.data import MAX_ROW_CHARS

    huge = {"prompt": "word " * (MAX_ROW_CHARS // 5 + 10), "n": 9}
    data = write(tmp_path / "big", [ROWS[0], huge, ROWS[1]], fmt)
    place = {"jsonl": "line 2", "csv": "line 3", "parquet": "row 1", "datasets": "row 1"}[fmt]
    with pytest.raises(DataError, match=rf"{place}: a row of [\d,]+ characters, over max_row_chars=200,000"):
        read_rows(data)


def test_run_exits_2_on_one_huge_row_before_any_model_loads(tmp_path, capsys, no_models):
    rows = [*ROWS, {"prompt": "x" * 5_000_000, "n": 4}]  # 5 MB in one row
    data = write(tmp_path / "cw", rows, "jsonl")
    code, err = _run(tmp_path, capsys, "creative_writing", data)
    assert code == 2 and err == [f"error: data error: {data} line 4: a row of {len(json.dumps(rows[-1])):,} characters, over "
                                 f"max_row_chars=200,000 (raise task.args.max_row_chars if it is meant to be that long)"]
    code, err = _run(tmp_path, capsys, "creative_writing", data, "task.args.max_row_chars=6000000", "--print-config")
    assert code == 0
