"""Build a run's parts from its settings: the one place that maps config names to classes.

Model paths are resolved here, once: `tiny:<name>` is built into the cache on first use and
every engine receives a model directory. Settings live in the config modules
(`dynalize.config`, `penalties.config`, `backends.config`); nothing there imports an engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ValidationError

from . import tiny
from .backends.base import ChatModel, Generator, RewardModel
from .backends.chat import LimitedChatModel, ScriptedChatModel
from .backends.config import ChatModelConfig
from .build_penalties import judge_chat, penalty_term
from .config import RunConfig
from .errors import ConfigError, one_line
from .extras import optional_import, require
from .hooks import declares
from .loop import Parts
from .judge.healthbench import HealthBenchJudge
from .judge.judge import PENALTY_PROMPT, RUBRIC_PROMPT, Judge
from .judge.researchqa import ResearchQAJudge
from .plugins import import_object
from .penalties.config import PenaltiesConfig
from .rewards import PenaltyTerm, RewardTerm, RMTerm, RubricTerm
from .rewards.functions import FunctionsTerm, RewardFunction, function_name, reserved_column
from .rewards.rescore import confirm_in_run
from .rubrics.config import RubricJudgeConfig
from .rubrics.criteria import Criterion, RubricError, rubric_from_meta
from .rubrics.dropout import unmatched
from .runlog import RunDir
from .tasks.base import BUILTIN_TASKS, Task, build_task, task_class, task_prompts
from .trackers import check_installed as check_trackers_installed

log = structlog.get_logger("dynalize.build")

GENERATORS = ("hf", "vllm", "remote")
REWARD_MODELS = ("task", "hf", "python")


class UnknownEngineError(ConfigError):
    pass


def _unknown(kind: str, name: str, known: tuple[str, ...]) -> UnknownEngineError:
    return UnknownEngineError(f"unknown {kind} engine {name!r}: use one of {', '.join(known)}")


def model_dir(path: str) -> str:
    """The model directory `path` names: a directory as it is, `tiny:<name>` built (once) into the cache."""
    if path.startswith(tiny.TINY_PREFIX) and not tiny.known(path):
        for name in BUILTIN_TASKS:  # built-in tasks register the tiny models they pre-train
            try:
                task_class(name)
            except Exception:  # noqa: BLE001 - a task with missing optional deps must not break the others
                pass
    return tiny.resolve(path)


# --- chat models -----------------------------------------------------------------------------------

def build_chat_model(cfg: ChatModelConfig | dict[str, Any] | BaseModel) -> ChatModel:
    """The chat model `cfg` describes (a ChatModelConfig or a dict of its fields)."""
    data = cfg.model_dump() if isinstance(cfg, BaseModel) else dict(cfg)
    try:
        c = ChatModelConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(one_line(e, prefix="chat model config", model=ChatModelConfig)) from None
    sampling = {"temperature": c.temperature, "max_tokens": c.max_tokens}
    if c.engine == "openai":
        if not c.base_url or not c.model:
            raise ConfigError("chat model config: the openai engine needs both base_url and model")
        from .backends.openai import OpenAIChatModel

        return OpenAIChatModel(c.base_url, c.model, api_key_env=c.api_key_env, timeout=c.timeout,
                               max_retries=c.max_retries, max_concurrency=c.max_concurrency,
                               default_sampling=sampling, retry_wait=c.retry_wait,
                               max_response_bytes=c.max_response_bytes, requests_per_minute=c.requests_per_minute,
                               tokens_per_minute=c.tokens_per_minute)
    if c.engine == "hf":
        if not c.path:
            raise ConfigError("chat model config: the hf engine needs path (a model directory or tiny:<name>)")
        from .backends.hf_chat import HFChatModel

        return HFChatModel(model_dir(c.path), default_sampling=sampling)
    if c.engine == "vllm":
        if not c.path:
            raise ConfigError("chat model config: the vllm engine needs path (a model directory or tiny:<name>)")
        from transformers import AutoConfig

        from .backends.vllm_chat import VLLMChatModel

        directory = model_dir(c.path)
        longest = getattr(AutoConfig.from_pretrained(directory), "max_position_embeddings", None) or 4096
        return VLLMChatModel(directory, default_sampling=sampling, max_model_len=min(4096, longest))
    if not c.path:
        raise ConfigError("chat model config: the scripted engine needs path='module:attr' (replies or a function)")
    return LimitedChatModel(ScriptedChatModel(import_object(c.path, "scripted chat engine: path")), c.max_concurrency)


# --- generator and reward model ----------------------------------------------------------------

def build_generator(cfg: RunConfig, policy_dir: str) -> Generator:
    g = cfg.generator
    if g.engine == "hf":
        from .backends.hf import HFGenerator

        return HFGenerator(policy_dir, dtype=cfg.policy.dtype, batch_size=g.batch_size, fast=g.hf_fast)
    if g.engine == "vllm":
        from .backends.vllm import build_vllm_generator

        return build_vllm_generator(policy_dir, cfg.policy.dtype, gpu_memory_utilization=g.gpu_memory_utilization,
                                    max_model_len=g.max_model_len, temperature=g.temperature, top_p=g.top_p,
                                    min_p=g.min_p, enable_sleep_mode=g.enable_sleep_mode, seed=cfg.seed)
    if g.engine == "remote":
        from .backends.remote import build_remote_generator

        return build_remote_generator(policy_dir, g.base_urls, model=g.served_model_name or cfg.policy.path,
                                      checkpoint_dir=g.checkpoint_dir)
    raise _unknown("generator", g.engine, GENERATORS)


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
        return HFRewardModel(model_dir(rm.path), batch_size=rm.batch_size, max_length=rm.max_length)
    if rm.engine == "python":
        from .backends.function import FunctionRewardModel

        if not rm.path or ":" not in rm.path:
            raise UnknownEngineError("reward_model.path must be 'module:function' for engine 'python'")
        fn = import_object(rm.path, "reward function")
        return FunctionRewardModel(fn, name=rm.path, pass_prompts=declares(fn, "prompts"))
    raise _unknown("reward model", rm.engine, REWARD_MODELS)


# --- reward terms ------------------------------------------------------------------------------

def build_penalty_term(cfg: PenaltiesConfig, *, domain: str = "", seed: int = 0,
                       chat_factory=build_chat_model) -> PenaltyTerm:
    """Dynalize's term: proposer, judge and an empty buffer, as `cfg` says (build_penalties)."""
    return penalty_term(cfg, domain=domain, seed=seed, chat_factory=chat_factory)


def build_criteria_judge(cfg: RubricJudgeConfig, *, domain: str = "", cache: bool = True,
                         chat_factory=build_chat_model, role: str = "proxy judge") -> Judge:
    """A judge of rubric criteria: local (regexes, then `predicate`) or an LLM, with the rubric or
    the penalty prompt, asking each reply as `cfg.protocol` says (batched, or a benchmark's way).
    `cache=False`: every verdict is asked anew (the gold judge)."""
    if not cache:
        cfg = cfg.model_copy(update={"cache_size": 0})
    predicate = import_object(cfg.predicate, "rubric judge predicate") if cfg.predicate else None
    chat = judge_chat(cfg, chat_factory) if cfg.engine == "llm" else None
    prompt = RUBRIC_PROMPT if cfg.prompt == "rubric" else PENALTY_PROMPT
    if cfg.protocol == "healthbench":
        return HealthBenchJudge(chat, cfg, domain=domain, attempts=cfg.attempts, role=role)
    if cfg.protocol == "researchqa":
        return ResearchQAJudge(chat, cfg, domain=domain, attempts=cfg.attempts, batch_size=cfg.batch_size, role=role)
    return Judge(chat, cfg, domain=domain, predicate=predicate, prompt=prompt, role=role)


def check_rubrics(cfg: RunConfig, task: Task) -> None:
    """Every prompt the rubric term will read carries a usable rubric, and a local judge without a
    predicate can decide each criterion (one line naming the first that fails)."""
    r = cfg.rubric
    judges = [("rubric.judge", r.judge)] + ([("rubric.gold_judge", r.gold_judge)] if r.gold_judge else [])
    undecidable = [name for name, j in judges if j.engine == "local" and not j.predicate]
    trained: list[Criterion] = []
    for split in ["train", "eval"] if cfg.eval_every else ["train"]:
        for p in task_prompts(task, cfg.task.name, split):  # type: ignore[arg-type]
            try:
                found = rubric_from_meta(p.meta)
            except RubricError as e:
                raise ConfigError(f"config error: rubric.enabled: task {cfg.task.name!r} prompt {p.id!r}: {e}") from None
            if found is None:
                raise ConfigError(f"config error: rubric.enabled needs prompts with a rubric, but task "
                                  f"{cfg.task.name!r} {split} prompt {p.id!r} has no meta['rubric']")
            if split == "train":
                trained += found
            bare = next((c for c in found if not c.regex), None)
            if undecidable and bare is not None:
                raise ConfigError(f"config error: {undecidable[0]} is local without a predicate, so it decides only "
                                  f"criteria with a regex, but prompt {p.id!r} criterion {bare.id!r} has none: set "
                                  f"{undecidable[0]}.predicate, or engine: llm with a chat model")
    d = r.dropout
    if problem := unmatched(d.protected_ids, d.protected_tags, d.id_rates, d.tag_rates, trained):
        raise ConfigError(f"config error: {problem}")


def build_rubric_term(cfg: RunConfig, task: Task, chat_factory=build_chat_model) -> RubricTerm:
    """The rubric term: the training (proxy) judge, the gold judge if set, dropout and weights."""
    r = cfg.rubric
    check_rubrics(cfg, task)
    if r.dropout.active and not cfg.trainer.loss.std_normalize:
        log.warning("rubric dropout with mean-only advantages: each group's advantages scale with 1 / (its "
                    "kept positive weight); Proposition 1 (the normaliser cancels) needs "
                    "trainer.loss.std_normalize: true")
    judge = build_criteria_judge(r.judge, domain=task.description, chat_factory=chat_factory)
    gold = None
    if r.gold_judge is not None:
        gold = build_criteria_judge(r.gold_judge, domain=task.description, cache=False, chat_factory=chat_factory,
                                    role="gold judge")
    return RubricTerm(r, judge, gold, steps=cfg.steps)


def build_reward_terms(cfg: RunConfig, task: Task) -> list[RewardTerm]:
    """The terms whose sum is the reward, any combination: the RM, the rubric term, Dynalize's penalties."""
    terms: list[RewardTerm] = []
    if cfg.reward_model.enabled:
        owner = f"reward function {cfg.reward_model.path}" if cfg.reward_model.engine == "python" else None
        terms.append(RMTerm(build_reward_model(cfg, task), task, owner))
    if cfg.rubric.enabled:
        terms.append(build_rubric_term(cfg, task))
    if cfg.reward_funcs:
        terms.append(build_functions_term(cfg, alone=not terms))
        for split in ("train", "eval"):  # a column named like a TRL argument would stand for it
            if problem := reserved_column(task_prompts(task, cfg.task.name, split)):  # type: ignore[arg-type]
                raise ConfigError(problem)
    if cfg.penalties.enabled:
        term = build_penalty_term(cfg.penalties, domain=task.description, seed=cfg.seed)
        confirm_in_run(term, list(terms))  # penalties.confirm: candidates scored edited with the terms above
        terms.append(term)
    return terms


def build_functions_term(cfg: RunConfig, alone: bool = True) -> FunctionsTerm:
    """The `reward_funcs` term: each entry imported (or the object given from Python), named by
    its `__name__` as TRL names it, weighted by `reward_weights`."""
    weights = cfg.reward_weights or [1.0] * len(cfg.reward_funcs)
    functions = []
    for path, weight in zip(cfg.reward_funcs, weights):
        if ":" not in path:  # TRL takes a reward model's id here too
            raise ConfigError(f"config error: reward_funcs: {path!r} is not 'module:function'; a reward model "
                              f"(TRL's reward_funcs=\"model-id\") is dynalize's reward_model (engine hf, path)")
        fn = import_object(path, "reward function (reward_funcs)")
        if not callable(fn):
            raise ConfigError(f"config error: reward_funcs: {path!r} is not a function")
        functions.append(RewardFunction(function_name(fn), fn, weight))
    return FunctionsTerm(functions, steps=cfg.steps, alone=alone)


# --- reward-model training ----------------------------------------------------------------------

def build_reward_trainer(cfg: Any, base_dir: str, tokenizer: Any, train_dataset: Any) -> Any:
    """TRL's RewardTrainer for `dynalize.rm.train` (an `RMTrainConfig`): the base loaded as a
    one-output sequence classifier, the pairs already tokenized, nothing saved along the way.
    `cfg.trainer_args` are passed to `trl.RewardConfig` as they are and win over the rest."""
    import torch

    trl = optional_import("trl", "config error: training a reward model")
    RewardConfig, RewardTrainer = trl.RewardConfig, trl.RewardTrainer

    import math
    import os

    # transformers reads a `warmup_steps` under 1 as a ratio and 1 or more as a count, so a ratio
    # of 1.0 would be one step: pass the count of the run's optimizer steps instead (each process
    # sees its share of the batches; a last partial accumulation still steps, as in the Trainer).
    world = max(1, int(os.environ.get("WORLD_SIZE", "1")))
    batches = math.ceil(len(train_dataset) / (cfg.batch_size * world))
    optimizer_steps = math.ceil(cfg.epochs * max(1, math.ceil(batches / cfg.grad_accum)))
    args = dict(
        output_dir=cfg.out, learning_rate=cfg.lr, num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.grad_accum,
        weight_decay=cfg.weight_decay, warmup_steps=math.ceil(optimizer_steps * cfg.warmup_ratio),
        lr_scheduler_type=cfg.lr_scheduler,
        gradient_checkpointing=cfg.gradient_checkpointing, center_rewards_coefficient=cfg.center_rewards_coefficient,
        seed=cfg.seed, data_seed=cfg.seed, max_length=None, bf16=False, fp16=False, save_strategy="no",
        report_to="none", model_init_kwargs={"dtype": cfg.dtype}, remove_unused_columns=True,
        dataloader_pin_memory=torch.cuda.is_available(),
    )
    try:
        rc = RewardConfig(**(args | dict(cfg.trainer_args)))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config error: trainer_args: {' '.join(str(e).split())[:300]}") from None
    return RewardTrainer(model=base_dir, args=rc, train_dataset=train_dataset, processing_class=tokenizer)


# --- the whole run -------------------------------------------------------------------------------

def check_config(cfg: RunConfig) -> None:
    """Fail before any model loads: unknown engine or task names, model paths that do not exist."""
    if cfg.generator.engine not in GENERATORS:
        raise _unknown("generator", cfg.generator.engine, GENERATORS)
    if cfg.reward_model.enabled and cfg.reward_model.engine not in REWARD_MODELS:
        raise _unknown("reward model", cfg.reward_model.engine, REWARD_MODELS)
    task_class(cfg.task.name)
    check_trackers_installed(cfg.report_to)
    _check_model_dir("policy.path", cfg.policy.path)
    rm = cfg.reward_model
    if rm.enabled and rm.engine == "hf" and rm.path:
        _check_model_dir("reward_model.path", rm.path)
    if cfg.trainer.kl.active and cfg.trainer.kl.reference:
        _check_model_dir("trainer.kl.reference", cfg.trainer.kl.reference)
    if cfg.policy.lora is not None:
        require("peft", "config error: policy.lora")
    if problem := cfg.trainer.kl.penalty_problem():
        raise ConfigError(f"config error: trainer.kl: {problem}")
    if cfg.trainer.kl.active and cfg.trainer.kl.reference and cfg.policy.lora:
        raise ConfigError("config error: trainer.kl.reference must be null with policy.lora (the reference is "
                          "the base with its adapters off)")


def _check_model_dir(key: str, path: str) -> None:
    """A model directory must exist and hold a model (`config.json`, as save_pretrained writes)."""
    if path.startswith(tiny.TINY_PREFIX):
        return
    if not Path(path).exists():
        raise ConfigError(f"config error: {key} does not exist: {path}")
    if not (Path(path) / "config.json").is_file():
        raise ConfigError(f"config error: {key} {path} holds no model (no config.json; a directory "
                          f"written by save_pretrained is needed)")


def build_parts(cfg: RunConfig) -> Parts:
    """Task, generator, learner, reward terms and run directory: everything the loop joins."""
    from .backends.hf import load_tokenizer

    check_config(cfg)
    task = build_task(cfg.task.name, cfg.task.args, cfg.seed)
    n_train = len(task_prompts(task, cfg.task.name, "train"))
    if n_train < cfg.prompts_per_step:
        raise ConfigError(f"config error: task {cfg.task.name!r} has {n_train} training prompts, fewer than "
                          f"one batch ({cfg.prompts_per_step} = batch_size / group_size)")
    if cfg.eval_every and not task_prompts(task, cfg.task.name, "eval"):
        raise ConfigError(f"config error: eval_every is {cfg.eval_every} but task {cfg.task.name!r} has no held-out "
                          f"prompts to evaluate on (set eval_every: 0, or give the task held-out prompts)")
    terms = build_reward_terms(cfg, task)
    policy = model_dir(cfg.policy.path)
    learner = build_learner(cfg)
    return Parts(cfg=cfg, task=task, tokenizer=load_tokenizer(policy), generator=build_generator(cfg, policy),
                 learner=learner, terms=terms, run=RunDir(cfg.run_dir))


def build_learner(cfg: RunConfig):
    """The Accelerate learner of `cfg` (every training process builds one): LoRA, a loss named by
    import path (ConfigError if it cannot be imported), the KL reference's model directory."""
    from .backends.accelerate import AccelerateLearner
    from .config import BUILTIN_LOSSES

    loss = cfg.trainer.loss.name
    loss_fn = None if loss in BUILTIN_LOSSES else import_object(loss, "loss function (trainer.loss.name)")
    if loss_fn is not None and not callable(loss_fn):
        raise ConfigError(f"config error: trainer.loss.name {loss!r} is not a function")
    kl = cfg.trainer.kl
    reference = model_dir(kl.reference) if kl.active and kl.reference else None
    return AccelerateLearner(model_dir(cfg.policy.path), cfg.trainer, temperature=cfg.generator.temperature,
                             dtype=cfg.policy.dtype, lora=cfg.policy.lora, loss_fn=loss_fn, reference=reference,
                             seed=cfg.seed)
