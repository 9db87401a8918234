"""User code that tries to stop the process never passes for a finished run: a `SystemExit` from a
reward function or a task hook is a bug in that code (exit 1, one line naming the hook and the
line that raised it); a `KeyboardInterrupt` from it takes the run's interrupted path (exit 130, one
line, no asyncio traceback). Before, `SystemExit(0)` in a reward ended the run with exit 0 at step 1,
with no metrics, checkpoint or final model."""

from __future__ import annotations

import os
import sys

import pytest

from dynalize.run import main
from toytask import ToyTask


def exits(texts):
    raise SystemExit(0)


def interrupts(texts):
    raise KeyboardInterrupt


class ExitingTask(ToyTask):
    """A task whose `split_reasoning` hook calls sys.exit."""

    def split_reasoning(self, reply):
        import sys

        sys.exit(3)


class ExitingAtStart(ToyTask):
    """A task that calls sys.exit(0) while it starts."""

    def __init__(self, args, seed=0):
        raise SystemExit(0)


def run(tmp_path, capsys, *extra) -> tuple[int, list[str]]:
    code = main([f"output_dir={tmp_path}", "name=run", "steps=2", "batch_size=8", "group_size=4", "progress=false",
                 "generator.max_new_tokens=8", "checkpoint_every=0", "torch_threads=1", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line or "asyncio" in line for line in err), err
    return code, err


@pytest.mark.parametrize("what, settings", [
    ("score of reward function test_user_code_stops:exits (the batch of step 1) raised SystemExit(0) at ",
     ["task.name=toytask:ToyTask", "reward_model.engine=python", "reward_model.path=test_user_code_stops:exits"]),
    ("split_reasoning of task test_user_code_stops:ExitingTask raised SystemExit(3) at ",
     ["task.name=test_user_code_stops:ExitingTask", "reward_model.engine=task"]),
    ("__init__ of task test_user_code_stops:ExitingAtStart raised SystemExit(0) at ",
     ["task.name=test_user_code_stops:ExitingAtStart", "reward_model.engine=task"]),
])
def test_system_exit_in_user_code_is_exit_1_naming_the_hook_not_a_finished_run(what, settings, tmp_path, capsys):
    code, err = run(tmp_path, capsys, *settings)
    assert code == 1
    assert err[-1].startswith(f"error: {what}") and "test_user_code_stops.py:" in err[-1], err
    assert err[-1].endswith("user code must not end the process (the run is not finished); raise an exception instead")
    assert not (tmp_path / "run" / "final").exists()


def test_keyboard_interrupt_in_a_reward_function_is_the_interrupted_path_in_one_line(tmp_path, capsys):
    code, err = run(tmp_path, capsys, "task.name=toytask:ToyTask", "reward_model.engine=python",
                    "reward_model.path=test_user_code_stops:interrupts")
    assert code == 130
    assert err[-1].startswith("interrupted: score of reward function test_user_code_stops:interrupts (the batch of step 1) raised "
                              "KeyboardInterrupt at "), err
    assert err[-1].endswith("metrics and rollouts written so far are kept")
    assert [line for line in err if not line.endswith(f"terms=['rm']")] == [err[-1]]  # the run's first log line, then it


def test_the_line_named_is_the_users_even_where_an_installed_library_wraps_sys_exit():
    """wandb replaces sys.exit with a wrapper of its own: the line named must still be the user's."""
    import sysconfig

    from dynalize.hooks import HookError, user_code

    library = {}
    exec(compile("def wrapped_exit(code):\n    raise SystemExit(code)\n",
                 os.path.join(sysconfig.get_path("purelib"), "somelib", "exit_hooks.py"), "exec"), library)
    calls_exit = sys._getframe().f_lineno + 3

    def reward():
        library["wrapped_exit"](0)

    with pytest.raises(HookError) as caught:
        with user_code("reward function f", "score"):
            reward()
    assert f"raised SystemExit(0) at {__file__}:{calls_exit}:" in str(caught.value)
