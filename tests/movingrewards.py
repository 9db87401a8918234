"""Reward functions for tests/test_run_folder_moves.py, importable by path (`movingrewards:...`) in a
real run process: at the batch of step `MOVE_AT_STEP` one renames the run folder and makes a new,
empty folder at its path (what `mv runs/x runs/x.old && mkdir runs/x` does mid-run); another
removes it."""

import os
import shutil
from pathlib import Path


def _at_the_step(trainer_state) -> bool:
    return trainer_state.global_step + 1 == int(os.environ["MOVE_AT_STEP"])


def renames_the_run_folder(completions, trainer_state, **kwargs):
    if _at_the_step(trainer_state):
        run = Path(os.environ["RUN_FOLDER"])
        os.rename(run, run.with_name(run.name + ".old"))
        run.mkdir()
    return [float(len(str(c))) for c in completions]


def removes_the_run_folder(completions, trainer_state, **kwargs):
    if _at_the_step(trainer_state):
        shutil.rmtree(os.environ["RUN_FOLDER"])
    return [float(len(str(c))) for c in completions]
