"""How dynalize calls user code: a task's hooks, a task's reward model, a reward function.

Optional arguments. A hook gets an optional argument only if its signature names it: a task
whose `user_reply(self, conversation, prompt)` names `prompt` receives the conversation's
`Prompt` (its id, messages and `meta`); one whose `user_reply(self, conversation)` does not
is called as before. So tasks and reward functions written before an argument existed keep
working unchanged, one name per hook, and a new one declares only what it reads. (The other
way, a second hook name for each new argument, doubles what an author must learn.)

Errors. An exception in user code becomes one `HookError` that names the hook and its owner
("user_reply of task my_pkg.tutor:TutorTask raised IndexError: ...") and is chained to the
original (`__cause__`, with the traceback into the user's code); a ConfigError (a bad input the
user fixes, e.g. a reward function returning the wrong number of scores) passes as it is. User code
that tries to end the process is caught too: a `SystemExit` (`sys.exit()` in a reward function) is
a bug in that code, not the end of the run, and inside the event loop it would end the process
with its own status (0: a run that looks finished, at step 1, with nothing saved); it becomes a
one-line HookError naming the hook and the line that raised it. A `KeyboardInterrupt` becomes a
HookError whose `error` is the interrupt (the CLI takes its interrupted path, exit 130), instead of
asyncio's traceback of a task that raised it. Hooks run concurrently in anyio
task groups, which wrap errors in (nested) exception groups; `unwrap_hook_errors` turns a group
of HookErrors back into the first of them, so the CLI shows one error once.
"""

from __future__ import annotations

import inspect
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .backends.secrets import mask_secrets
from .errors import ConfigError

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def declares(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` (a function or bound method) has a parameter called `name` that can be
    passed by keyword."""
    try:
        param = inspect.signature(fn).parameters.get(name)
    except (TypeError, ValueError):  # no signature to read (some builtins)
        return False
    return param is not None and param.kind in _NAMED


def optional(fn: Callable[..., Any], **values: Any) -> dict[str, Any]:
    """The keyword arguments among `values` that `fn` declares."""
    return {k: v for k, v in values.items() if declares(fn, k)}


def owner_name(kind: str, obj: Any) -> str:
    """`kind module:QualName` for an object or the class of an instance, as a config names it."""
    target = obj if inspect.isclass(obj) or inspect.isroutine(obj) else type(obj)
    return f"{kind} {target.__module__}:{target.__qualname__}"


class HookError(RuntimeError):
    """User code raised: `hook` of `owner` (e.g. "task my_pkg.tutor:TutorTask") failed with
    `error`, which is also the `__cause__`. The message is masked (`mask_secrets`): user code that
    quotes a key in its exception (a failed request's URL or header) never shows it."""

    def __init__(self, owner: str, hook: str, error: BaseException, message: str | None = None):
        self.owner, self.hook, self.error = owner, hook, error
        super().__init__(mask_secrets(message or f"{hook} of {owner} raised {type(error).__name__}: {error}"))


_INSTALLED = tuple(sorted({sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}))
"""Where installed libraries live: a library that wraps `sys.exit` (wandb does) is not where the
user's code ended the process."""


def stopped_process(owner: str, hook: str, e: SystemExit | KeyboardInterrupt) -> HookError:
    """The HookError for user code that tried to end the process: one line naming the hook and
    where the code raised, the innermost frame outside installed libraries (the traceback is not
    shown: that line says it all)."""
    frames = traceback.extract_tb(e.__traceback__)
    own = [f for f in frames if not f.filename.startswith(_INSTALLED)] or frames
    where = f" at {own[-1].filename}:{own[-1].lineno}" if own else ""
    if isinstance(e, KeyboardInterrupt):
        return HookError(owner, hook, e.with_traceback(None), f"{hook} of {owner} raised KeyboardInterrupt{where}")
    return HookError(owner, hook, e.with_traceback(None),
                     f"{hook} of {owner} raised SystemExit({e.code!r}){where}: user code must not end the process "
                     f"(the run is not finished); raise an exception instead")


@contextmanager
def user_code(owner: str, hook: str) -> Iterator[None]:
    """Run user code: an exception becomes a HookError naming `hook` of `owner`."""
    try:
        yield
    except (HookError, ConfigError):  # a ConfigError is already one line for the user (exit 2)
        raise
    except (SystemExit, KeyboardInterrupt) as e:
        raise stopped_process(owner, hook, e) from None
    except Exception as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # the traceback starts where the user's code was called
        raise HookError(owner, hook, e.with_traceback(tb)) from e


def leaf_errors(group: BaseExceptionGroup) -> Iterator[BaseException]:
    """The errors inside `group` and the groups nested in it."""
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            yield from leaf_errors(e)
        else:
            yield e


@contextmanager
def unwrap_hook_errors() -> Iterator[None]:
    """Around a task group: when every error it raised is a HookError (the same hook failing in
    several concurrent calls, say), raise the first alone instead of the group."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = list(leaf_errors(group))
        if not leaves or not all(isinstance(e, HookError) for e in leaves):
            raise
        raise leaves[0] from leaves[0].error
