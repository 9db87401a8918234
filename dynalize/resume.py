"""What a resume may change: the settings locked on `--resume`, the defaults frozen at a run's first
start, and the rule for `steps`.

A resume continues *the same run*: everything that changes the reward, the data or what a step
computes is locked (`RESUME_LOCKED`, a key and everything under it, minus `RESUME_FREE`); a
resume that changes one stops with one line naming it. Defaults derived from other settings are
resolved once, at the first start, and stored in config.yaml (`freeze_derived`: e.g. an annealed
Rubric Dropout's `anneal_steps` = the first `steps`), so extending a run trains exactly as a run
started with the larger `steps`. `steps` may grow; a value below the steps already done is refused.
Anything else may change on resume (docs/reliability.md lists it): the learning rate and other
trainer settings, generation lengths, endpoints, models and budgets of the judge, proposer and
simulated users, checkpoint/eval cadence, trackers, failure limits.
"""

from __future__ import annotations

from typing import Any

from .config import ConfigError, RunConfig, flatten

RESUME_LOCKED = ("seed", "batch_size", "group_size", "policy", "task", "reward_model", "reward_funcs", "reward_weights",
                 "penalties.enabled", "penalties.lam", "penalties.weight",
                 "rubric.enabled", "rubric.coef", "rubric.dropout", "rubric.reweight", "rubric.judge_dropped",
                 "rubric.judge.engine", "rubric.judge.predicate", "rubric.judge.prompt")
"""Settings a resume may not change (a key and everything under it): what is trained, on which
prompts, in which batch shape, for which reward (the RM and its input length, the penalty weight and its rule,
the rubric term's coefficient, Rubric Dropout's masks and schedule, POW3R reweighting, what the
rubric judge is asked, the reward functions and their weights)."""

RESUME_FREE = ("reward_model.batch_size",)
"""Keys under `RESUME_LOCKED` that only change speed, not results."""


def is_locked(key: str) -> bool:
    """Whether the dotted setting `key` may not change on resume."""
    under = lambda k: key == k or key.startswith(k + ".")  # noqa: E731
    return any(under(k) for k in RESUME_LOCKED) and not any(under(k) for k in RESUME_FREE)


def freeze_derived(cfg: RunConfig) -> RunConfig:
    """`cfg` with the defaults that derive from other settings resolved, as a run's first start
    stores them: an annealed Rubric Dropout's `anneal_steps` (None: this `steps`), and the task
    settings its Args class names in `frozen_defaults` (e.g. a prompt `template`), so that a
    later change of a default never changes a saved run."""
    dropout = cfg.rubric.dropout
    if dropout.schedule != "constant" and dropout.anneal_steps is None:
        cfg = cfg.model_copy(deep=True)
        cfg.rubric.dropout.anneal_steps = cfg.steps
    return frozen_task_defaults(cfg)


def frozen_task_defaults(cfg: RunConfig) -> RunConfig:
    """`cfg` with the task settings its Args class names in `frozen_defaults` set (their defaults
    where the config gives none)."""
    args = task_args_class(cfg)
    if missing := [k for k in getattr(args, "frozen_defaults", ()) if k not in cfg.task.args]:
        cfg = cfg.model_copy(deep=True)
        cfg.task.args.update({k: args.model_fields[k].default for k in missing})
    return cfg


def task_args_class(cfg: RunConfig) -> Any:
    """The settings class of the task `cfg` names (None when it does not resolve, or the task is an
    instance given from Python, which takes no `task.args`)."""
    from .plugins import OBJECT_PREFIX, import_object
    from .tasks.base import task_class

    try:
        if cfg.task.name.startswith(OBJECT_PREFIX) and not isinstance(import_object(cfg.task.name, "task"), type):
            return None
        return task_class(cfg.task.name).Args
    except ConfigError:
        return None


def with_old_defaults(cfg: RunConfig, saved: RunConfig) -> RunConfig:
    """`cfg` with the task settings the saved run's config.yaml lacks set to the defaults of the
    time before they were frozen (the task's Args `defaults_before_frozen`): a run saved then
    resumes as it started."""
    args = task_args_class(saved)
    old = {k: v for k, v in getattr(args, "defaults_before_frozen", {}).items()
           if k not in saved.task.args and k not in cfg.task.args}
    if not old:
        return cfg
    cfg = cfg.model_copy(deep=True)
    cfg.task.args.update(old)
    return cfg


def resume_conflict(saved: RunConfig, new: RunConfig) -> str | None:
    """One line naming the first locked setting `new` changes from `saved`, or None."""
    a, b = flatten(saved.model_dump(mode="json")), flatten(new.model_dump(mode="json"))
    for key in sorted(set(a) | set(b)):
        if is_locked(key) and a.get(key) != b.get(key):
            return (f"config error: --resume cannot change {key} ({a.get(key)!r} -> {b.get(key)!r}): it changes "
                    f"what the run is; start a new run (another name=) instead")
    return None


def resume_config(saved: RunConfig, new: RunConfig) -> RunConfig:
    """The settings a resume runs with: `new` (the saved config plus overrides, or a `--config`
    file), its derived defaults taken from the run's first start (a run from before they were
    frozen: derived from the saved `steps`), checked against `saved`; ConfigError naming a change
    to a locked setting."""
    saved, new = with_old_defaults(saved, saved), with_old_defaults(new, saved)
    saved = freeze_derived(saved)
    if new.rubric.dropout.anneal_steps is None and saved.rubric.dropout.anneal_steps is not None:
        new = new.model_copy(deep=True)
        new.rubric.dropout.anneal_steps = saved.rubric.dropout.anneal_steps
    new = frozen_task_defaults(new)
    if problem := resume_conflict(saved, new):
        raise ConfigError(problem)
    return new


def steps_problem(steps: int, done: int) -> str | None:
    """Why a resume cannot run to `steps` when `done` steps are already trained (None if it can)."""
    if steps < done:
        return (f"config error: --resume with steps={steps}, but the run has already trained {done} steps: "
                f"steps may only grow (steps={done} or more; a shorter run is a new run, another name=)")
    return None
