"""The Task plugin interface: what a domain supplies to dynalize.

A task gives its prompts (train and held-out splits), says how a rollout unfolds (one policy
reply by default, or several with a simulated user between them), what the reward model sees of
a reply, and a short description of the domain that proposer and judge prompts include.

A new domain is one subclass plus one YAML file naming it as `my_pkg.my_module:MyTask`.

Hooks that read per-prompt data (an answer, a persona, a rubric: `Prompt.meta`) declare an
optional `prompt` argument (`evaluate`: `conversations`); dynalize passes it only to hooks whose
signature names it, so tasks without it run unchanged (dynalize.hooks).
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..backends.base import RewardModel, RMInput
from ..errors import ConfigError, describe, one_line
from ..hooks import owner_name, stopped_process
from ..plugins import OBJECT_PREFIX, import_object
from ..types import Message, Penalty, Prompt

Split = Literal["train", "eval"]


class TaskArgs(BaseModel):
    """A task's own settings (the `task.args` block of the config). Subclass to add fields."""

    model_config = ConfigDict(extra="forbid")


class Task(abc.ABC):
    """One domain. Subclasses set `Args` to their own TaskArgs subclass."""

    Args: ClassVar[type[TaskArgs]] = TaskArgs
    description: ClassVar[str] = "A general assistant task."
    max_turns: ClassVar[int] = 1
    """Policy replies per rollout; > 1 makes the task multi-turn (see `user_reply`)."""

    def __init__(self, args: TaskArgs, seed: int = 0):
        self.args = args
        self.seed = seed

    @abc.abstractmethod
    def prompts(self, split: Split) -> list[Prompt]:
        """The prompts of a split, in a fixed order (the loop shuffles by seed)."""

    def rm_input(self, conversation: list[Message], reply: str, prompt: Prompt | None = None) -> RMInput:
        """What the RM reads for `reply` to `conversation` (everything before the reply: the
        prompt's messages, then earlier replies and user turns) of `prompt`: by default the chat
        with the reply."""
        return [*conversation, Message("assistant", reply)]

    def split_reasoning(self, reply: str) -> tuple[str, str]:
        """(reasoning, final reply). RM and judge see only the final reply. Default: no reasoning."""
        return "", reply

    async def user_reply(self, conversation: list[Message], prompt: Prompt | None = None) -> str | None:
        """Multi-turn only: the simulated user's next message, or None to end the conversation.
        `conversation`: the prompt's messages and every turn since, ending with the policy's
        latest reply; `prompt`: the prompt it started from (e.g. a persona in its `meta`)."""
        return None

    def reward_model(self) -> RewardModel | None:
        """A reward model the task supplies itself (config `reward_model.engine: task`)."""
        return None

    def planted_matches(self, penalties: list[Penalty]) -> list[str | None] | None:
        """A task that plants its hacks (the sandboxes) knows the answer: for each penalty, the
        planted feature it catches, or None for one that catches none (a false penalty). None
        (the default): the task plants nothing, and a run's summary says nothing of it."""
        return None

    async def evaluate(self, prompts: list[Prompt], replies: list[str],
                       conversations: list[list[Message]] | None = None) -> dict[str, float]:
        """Optional held-out quality metrics (e.g. the sandbox's gold score), logged as
        `eval/<name>`. One entry per eval rollout: its prompt, its last policy reply, and its
        whole conversation (the prompt's messages, then every reply and user turn)."""
        return {}


BUILTIN_TASKS = {
    "sandbox": "dynalize.tasks.sandbox:SandboxTask",
    "sandbox_multiturn": "dynalize.tasks.sandbox.multiturn:SandboxMultiturnTask",
    "creative_writing": "dynalize.tasks.creative_writing:CreativeWritingTask",
    "counseling": "dynalize.tasks.counseling:CounselingTask",
    "counseling_multiturn": "dynalize.tasks.counseling:CounselingMultiturnTask",
    "rubric": "dynalize.tasks.rubric:RubricTask",
    "rubric_world": "dynalize.tasks.rubric_world:RubricWorldTask",
}


class UnknownTaskError(ConfigError):
    pass


def task_class(name: str) -> type[Task]:
    """Resolve a built-in task name or an importable `module:Class` path."""
    target = BUILTIN_TASKS.get(name, name)
    if ":" not in target:
        known = ", ".join(sorted(BUILTIN_TASKS))
        raise UnknownTaskError(f"unknown task {name!r}: use one of {known} or 'package.module:Class'")
    try:
        cls: Any = import_object(target, "task")
    except ConfigError as e:
        raise UnknownTaskError(str(e)) from None
    if isinstance(cls, Task):  # an instance given to dynalize.train
        return type(cls)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise UnknownTaskError(f"task {name!r} is not a dynalize.tasks.base.Task subclass")
    return cls


def build_task(name: str, args: dict[str, Any], seed: int) -> Task:
    """Instantiate a task, validating its `args` against the task's own Args model. A task that
    raises while starting (a missing file, a bad column) stops the run with one line. A task
    instance given to dynalize.train is used as it is (and takes no `args`)."""
    cls = task_class(name)
    if name.startswith(OBJECT_PREFIX) and isinstance(given := import_object(name, "task"), Task):
        if args:
            raise ConfigError("config error: task.args: the task was given as an instance, which has its "
                              "settings already: give its class to set task.args")
        return given
    try:
        parsed = cls.Args.model_validate(args)
    except ValidationError as e:
        raise ConfigError(one_line(e, loc_prefix="task.args.", model=cls.Args)) from None
    try:
        return cls(parsed, seed=seed)
    except ConfigError:
        raise
    except (SystemExit, KeyboardInterrupt) as e:  # user code ending the process: never a silent exit 0
        raise stopped_process(owner_name("task", cls), "__init__", e) from None
    except Exception as e:  # noqa: BLE001 - the task's own code: report it, in one line
        raise ConfigError(f"task {name!r} failed to start: {describe(e)}") from None


def task_prompts(task: Task, name: str, split: Split) -> list[Prompt]:
    """`task.prompts(split)`, checked: each is a Prompt with at least one message.
    A task that raises, or a bad prompt, stops the run with one line."""
    try:
        prompts = list(task.prompts(split))
    except ConfigError:
        raise
    except (SystemExit, KeyboardInterrupt) as e:
        raise stopped_process(owner_name("task", task), "prompts", e) from None
    except Exception as e:  # noqa: BLE001 - the task's own code: report it, in one line
        raise ConfigError(f"task {name!r} failed to give its {split} prompts: {describe(e)}") from None
    for i, p in enumerate(prompts):
        if not isinstance(p, Prompt):
            raise ConfigError(f"task {name!r}: {split} prompt {i} is a {type(p).__name__}, not a Prompt")
        if not p.messages:
            raise ConfigError(f"task {name!r}: {split} prompt {p.id!r} has an empty message list")
    return prompts
