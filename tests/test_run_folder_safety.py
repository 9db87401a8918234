"""A run writes only inside its own folder and only its own files; the commands that read runs
(report, export, eval --bench rubric) never write over a run's files; damaged files, a full disk,
a read-only target and configs that cannot be are one line and exit 2, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dynalize.config import read_yaml
from dynalize.export import main as export_main
from dynalize.report import main as report_main
from dynalize.run import main
from dynalize.runlog import read_jsonl
from test_bad_input import earlier, fails_cleanly, finished_run, restore_logging, snapshot, toy  # noqa: F401


def one_error_line(err: str, needle: str) -> str:
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("error: ") and needle in lines[-1], lines[-5:]
    assert "Traceback" not in err
    return lines[-1]


@pytest.fixture
def small_disk(tmp_path):
    """`small_disk(size, read_only=False)`: a folder on a tmpfs of `size` (root only; else skipped)."""
    mounted = []

    def mount(size: str = "1m", read_only: bool = False) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True).returncode != 0:
            pytest.skip("mounting a tmpfs is not permitted here (needs root)")
        mounted.append(folder)
        if read_only:
            (folder / "ro").mkdir()
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
            return folder / "ro"
        return folder

    yield mount
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], check=False)


# --- 2. a run writes only inside its own folder ------------------------------------------------

def test_a_new_run_whose_checkpoints_link_to_another_runs_is_refused(tmp_path, earlier, capsys):
    other = tmp_path / "runs" / "other"
    other.mkdir()
    (other / "checkpoints").symlink_to(earlier / "checkpoints")
    before = snapshot(earlier)
    assert main(["--log-level", "ERROR", *toy(tmp_path, "other")]) == 2
    one_error_line(capsys.readouterr().err, f"{other / 'checkpoints'} is a link to")
    assert snapshot(earlier) == before


def test_a_resume_whose_eval_folder_links_out_is_refused(tmp_path, earlier, capsys):
    shared = tmp_path / "shared_eval"
    shutil.move(earlier / "eval", shared)
    (shared / "task.jsonl").write_text("".join(json.dumps({"step": s, "x": 1}) + "\n" for s in range(6)))
    (earlier / "eval").symlink_to(shared)
    before = snapshot(shared)
    fails_cleanly(["--resume", str(earlier), "steps=3"], capsys, tmp_path, "outside the run folder")
    assert snapshot(shared) == before


# --- 3. report outputs never land on a run's files; a resume trims only the run's logs ----------

@pytest.mark.parametrize("where", [["--html", "metrics.jsonl"], ["--out", "checkpoints/step_000001"],
                                   ["--out", "."]])
def test_report_outputs_inside_a_run_are_refused(tmp_path, earlier, capsys, where):
    flag, inside = where
    before = snapshot(earlier)
    assert report_main([str(earlier), flag, str(earlier / inside), "--no-plots"]) == 2
    one_error_line(capsys.readouterr().err, "a report never writes over a run's files")
    assert snapshot(earlier) == before


def test_report_writes_under_the_runs_plots_folder(tmp_path, earlier):
    assert report_main([str(earlier), "--html", str(earlier / "plots" / "page.html")]) == 0
    assert (earlier / "plots" / "page.html").read_text().startswith("<!")


@pytest.mark.slow
def test_a_resume_keeps_a_users_file_named_like_a_term(tmp_path, earlier, capsys):
    mine = "".join(json.dumps({"step": s, "note": "mine"}) + "\n" for s in range(1, 6))
    (earlier / "rm.jsonl").write_text(mine)  # an RM-only run: its `rm` term writes no log
    assert main(["--log-level", "ERROR", "--resume", str(earlier), "steps=2"]) == 0
    assert (earlier / "rm.jsonl").read_text() == mine


# --- 8. one line, not a traceback --------------------------------------------------------------

def test_a_damaged_metrics_line_is_one_line_for_resume_and_report(tmp_path, earlier, capsys):
    with open(earlier / "metrics.jsonl", "a") as f:
        f.write("[1, 2, 3]\n")
    fails_cleanly(["--resume", str(earlier), "steps=3"], capsys, tmp_path, "line 3 holds a JSON list, not an object")
    before = snapshot(earlier)
    assert report_main([str(earlier), "--html", str(tmp_path / "page.html")]) == 2
    one_error_line(capsys.readouterr().err, "metrics.jsonl is damaged: line 3 holds a JSON list")
    assert snapshot(earlier) == before and not (tmp_path / "page.html").exists()


def test_a_binary_rollouts_file_is_one_line_for_the_report(tmp_path, earlier, capsys):
    (earlier / "rollouts" / "step_000002.jsonl").write_bytes(bytes(range(256)) * 4)
    assert report_main([str(earlier), "--html", str(tmp_path / "page.html")]) == 2
    one_error_line(capsys.readouterr().err, "step_000002.jsonl is damaged: not UTF-8 text")


@pytest.mark.slow
def test_a_full_disk_while_writing_a_checkpoint_names_the_path(tmp_path, capsys, small_disk):
    disk = small_disk("3m")
    assert main(["--log-level", "ERROR", *toy(disk), "steps=3"]) == 2  # toy(disk): runs under disk/runs
    line = one_error_line(capsys.readouterr().err, "No space left on device")
    assert f"{disk / 'runs' / 'run' / 'checkpoints'}" in line and "then --resume the run" in line


def test_a_full_html_target_leaves_no_partial_page(earlier, capsys, small_disk):
    disk = small_disk("64k")
    (disk / "filler").write_bytes(b"x" * 60_000)
    assert report_main([str(earlier), "--html", str(disk / "page.html")]) == 2
    one_error_line(capsys.readouterr().err, "No space left on device")
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]


def test_export_to_a_full_or_read_only_target_is_one_line_and_leaves_nothing(earlier, capsys, small_disk):
    full = small_disk("256k")
    assert export_main([str(earlier), "--out", str(full / "model")]) == 2
    one_error_line(capsys.readouterr().err, f"{full}")
    assert list(full.iterdir()) == []
    read_only = small_disk("1m", read_only=True)
    assert export_main([str(earlier), "--out", str(read_only / "model")]) == 2
    one_error_line(capsys.readouterr().err, "Read-only file system")


def test_export_of_a_run_whose_config_names_no_dtype_is_one_line(tmp_path, earlier, capsys):
    cfg = read_yaml(earlier / "config.yaml")
    cfg["policy"]["dtype"] = "float8"
    (earlier / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert export_main([str(earlier), "--out", str(tmp_path / "model")]) == 2
    one_error_line(capsys.readouterr().err, "policy.dtype is 'float8', not one of float32, bfloat16, float16")
    assert not (tmp_path / "model").exists()


def test_lora_target_modules_that_match_nothing_are_one_line_and_leave_no_run_folder(tmp_path, capsys):
    assert main(["--log-level", "ERROR", *toy(tmp_path), "policy.lora.r=4",
                 "policy.lora.target_modules=[no_such_layer]"]) == 2
    one_error_line(capsys.readouterr().err, "policy.lora.target_modules ['no_such_layer'] match no module")
    assert not (tmp_path / "runs" / "run").exists()


def test_regrading_damaged_held_out_replies_is_one_line_and_writes_nothing(tmp_path, capsys):
    from dynalize.config import dump_config, validate
    from dynalize.eval.__main__ import main as eval_main
    from test_rubric_e2e import sample_config

    run = tmp_path / "s"
    (run / "rollouts").mkdir(parents=True)
    dump_config(validate(sample_config(tmp_path)), run / "config.yaml")
    criteria = [{"id": "c1", "text": "Says hello.", "weight": 1.0, "tags": []}]
    good = {"prompt_id": "p0", "group": 0, "prompt": [{"role": "user", "content": "Hi?"}], "replies": ["hello"],
            "rubric_criteria": criteria}
    (run / "rollouts" / "eval_000000.jsonl").write_text(json.dumps(good) + "\n")
    (run / "rollouts" / "eval_000002.jsonl").write_text(
        json.dumps(good) + "\n" + json.dumps({**good, "replies": 7}) + "\n")
    assert eval_main(["--run", str(run), "--bench", "rubric", "--no-progress", "--log-level", "ERROR"]) == 2
    one_error_line(capsys.readouterr().err, "eval_000002.jsonl: rollout 2 is damaged")
    assert not (run / "eval").exists()


# --- 10. a config's aliases are bounded ---------------------------------------------------------

def alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\ntask:\n  args:\n    extra: *a%d\n" % (levels - 1)


def test_a_config_of_nested_aliases_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    assert len(path.read_text()) < 1500
    assert main(["--config", str(path), "--print-config"]) == 2
    one_error_line(capsys.readouterr().err, "its aliases expand to more than 100,000 values")


def test_a_config_with_a_few_aliases_loads_as_written(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("base: &b {lr: 1.0e-5}\ntrainer: *b\n")
    assert read_yaml(path) == {"base": {"lr": 1e-5}, "trainer": {"lr": 1e-5}}
