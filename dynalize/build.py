"""Build the parts of a run from its config: task, engines, penalties. The only place that maps
config names to engine classes."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from . import tiny
from .backends.base import Generator, RewardModel
from .config import ConfigError, RunConfig
from .tasks.base import Task, build_task


class UnknownEngineError(ConfigError):
    pass


def _unknown(kind: str, name: str, known: list[str]) -> UnknownEngineError:
    return UnknownEngineError(f"unknown {kind} engine {name!r}: use one of {', '.join(known)}")


def build_generator(cfg: RunConfig) -> Generator:
    g = cfg.generator
    if g.engine == "hf":
        from .backends.hf import HFGenerator

        return HFGenerator(cfg.policy.path, dtype=cfg.policy.dtype, batch_size=g.batch_size)
    if g.engine == "vllm":
        from .backends.vllm import build_vllm_generator

        return build_vllm_generator(cfg.policy.path, cfg.policy.dtype, gpu_memory_utilization=g.gpu_memory_utilization,
                                    max_model_len=g.max_model_len, temperature=g.temperature, top_p=g.top_p,
                                    min_p=g.min_p, enable_sleep_mode=g.enable_sleep_mode, seed=cfg.seed)
    if g.engine == "remote":
        from .backends.remote import build_remote_generator

        return build_remote_generator(cfg.policy.path, g.base_urls, model=g.served_model_name,
                                      checkpoint_dir=g.checkpoint_dir)
    raise _unknown("generator", g.engine, GENERATORS)


class FunctionRewardModel(RewardModel):
    """A plain Python function `f(list[str]) -> list[float]` over the replies' text."""

    def __init__(self, fn: Any):
        self.fn = fn

    async def score(self, items):
        texts = [x if isinstance(x, str) else x[-1].content for x in items]
        return [float(s) for s in self.fn(texts)]


def _import_function(path: str) -> Any:
    module, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise UnknownEngineError(f"cannot import reward function {path!r}: {e}") from None


def build_reward_model(cfg: RunConfig, task: Task) -> RewardModel:
    rm = cfg.reward_model
    if rm.engine == "task":
        model = task.reward_model()
        if model is None:
            raise UnknownEngineError(f"task {cfg.task.name!r} supplies no reward model: set reward_model.engine")
        return model
    if rm.engine == "hf":
        from .backends.hf import HFRewardModel

        if not rm.path:
            raise UnknownEngineError("reward_model.path is required for engine 'hf'")
        return HFRewardModel(rm.path, batch_size=rm.batch_size, max_length=rm.max_length)
    if rm.engine == "python":
        if not rm.path or ":" not in rm.path:
            raise UnknownEngineError("reward_model.path must be 'module:function' for engine 'python'")
        return FunctionRewardModel(_import_function(rm.path))
    raise _unknown("reward model", rm.engine, REWARD_MODELS)


GENERATORS = ["hf", "vllm", "remote"]
REWARD_MODELS = ["task", "hf", "python"]


def check_config(cfg: RunConfig) -> None:
    """Fail before any model loads: unknown engine or task names, model paths that do not exist."""
    from .tasks.base import task_class

    if cfg.generator.engine not in GENERATORS:
        raise _unknown("generator", cfg.generator.engine, GENERATORS)
    if cfg.reward_model.engine not in REWARD_MODELS:
        raise _unknown("reward model", cfg.reward_model.engine, REWARD_MODELS)
    task_class(cfg.task.name)
    if not cfg.policy.path.startswith(tiny.TINY_PREFIX) and not Path(cfg.policy.path).exists():
        raise FileNotFoundError(f"policy.path does not exist: {cfg.policy.path}")
    rm = cfg.reward_model
    if rm.engine == "hf" and rm.path and not rm.path.startswith(tiny.TINY_PREFIX) and not Path(rm.path).exists():
        raise FileNotFoundError(f"reward_model.path does not exist: {rm.path}")


def build_parts(cfg: RunConfig, run_dir: Path):
    """Task, generator, reward model, learner, penalties: everything the loop joins."""
    from .backends.accelerate import AccelerateLearner
    from .loop import Parts
    from .runlog import RunDir
    from .backends.hf import load_tokenizer

    check_config(cfg)
    task = build_task(cfg.task.name, cfg.task.args, cfg.seed)
    n_train = len(task.prompts("train"))
    if n_train < cfg.prompts_per_step:
        raise ConfigError(f"config error: task {cfg.task.name!r} has {n_train} training prompts, fewer than "
                          f"one batch ({cfg.prompts_per_step} = batch_size / group_size)")
    reward_model = build_reward_model(cfg, task)
    learner = AccelerateLearner(cfg.policy.path, cfg.trainer, temperature=cfg.generator.temperature,
                                dtype=cfg.policy.dtype)
    generator = build_generator(cfg)
    penalties = None
    if cfg.penalties.enabled:
        from .penalties.config import build_penalty_engine

        penalties = build_penalty_engine(cfg.penalties, domain=task.description, run_dir=run_dir, seed=cfg.seed)
    return Parts(cfg=cfg, task=task, tokenizer=load_tokenizer(cfg.policy.path), generator=generator,
                 reward_model=reward_model, learner=learner, run=RunDir(run_dir), penalties=penalties)
