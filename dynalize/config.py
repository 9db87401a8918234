"""Typed experiment config: YAML files plus dotted overrides (`trainer.lr=1e-6`).

Every field is documented where it is declared. Unknown keys and wrong types fail with one line
naming the key (`ConfigError`).
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, ValidationError, field_validator, model_validator

from .backends.config import url_credential_problem
from .errors import ConfigError, one_line
from .penalties.config import PenaltiesConfig
from .rubrics.config import RubricConfig
from .yamlload import safe_load

__all__ = ["ConfigError", "RunConfig", "config_yaml", "dump_config", "flatten", "load_config", "parse_override",
           "read_yaml", "validate"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, hide_input_in_errors=True)


class LoraConfig(Section):
    """LoRA adapters trained through peft instead of the full weights (docs/learner.md)."""

    r: int = Field(16, gt=0)
    """Rank of each adapter."""
    alpha: float = Field(32.0, gt=0)
    """Scale numerator: the update is (alpha / r) · B·A."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input while training (zeroed with `trainer.disable_dropout`)."""
    target_modules: list[str] | str = "all-linear"
    """Modules that get adapters: names (e.g. [q_proj, v_proj]) or peft's `all-linear` (every
    linear layer but the output head)."""


class PolicyConfig(Section):
    """The model being trained: where it is, its dtype, and optionally LoRA adapters."""

    path: str = "tiny:policy"
    """Model directory, or `tiny:<name>` for a tiny model built locally (see dynalize.tiny)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of learner and generator."""
    lora: LoraConfig | None = None
    """Train LoRA adapters (peft) on the frozen base instead of all weights: the optimizer holds
    the adapters' state only; the generator and `policy/` checkpoints get merged weights, the
    checkpoint's `adapter/` the adapter alone. Off (null) by default."""


class GeneratorConfig(Section):
    """How rollouts are sampled: the engine and its sampling settings."""

    engine: str = "hf"
    """Generation engine: `hf` (transformers), `vllm` (in-process), `remote` (vLLM servers)."""
    max_new_tokens: int = Field(64, gt=0)
    """Longest reply, in tokens."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; the learner scales logits by it too."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold (1 = off)."""
    min_p: float = Field(0.0, ge=0, lt=1)
    """Min-p sampling threshold (0 = off)."""
    batch_size: int = Field(64, gt=0)
    """hf: sequences generated in one forward batch."""
    hf_fast: Literal["auto", "on", "off"] = "auto"
    """hf: the fast path, a static KV cache with a compiled decoding step (torch.compile in CUDA-graph
    mode) on a GPU. `auto` = on with CUDA, off on a CPU; `on` on a CPU uses the static cache without
    compiling. Sampling and logprobs are those of the plain path (docs/vllm.md, "The HF generator on a GPU")."""

    @field_validator("hf_fast", mode="before")
    @classmethod
    def _yaml_on_off(cls, v: Any) -> Any:
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v  # YAML reads on/off as booleans
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """vllm: share of GPU memory the engine may take."""
    max_model_len: int = Field(2048, gt=0)
    """vllm: longest prompt + reply, in tokens."""
    enable_sleep_mode: bool = False
    """vllm: allow sleep()/wake_up() when colocated on one GPU with the learner."""
    base_urls: list[str] = []
    """remote: roots of the vLLM servers (e.g. http://node1:8000); requests are spread over them.
    Never a key in them (user info, a key-like query parameter): refused, without being printed."""

    @field_validator("base_urls")
    @classmethod
    def _no_key_in_urls(cls, v: list[str]) -> list[str]:
        for url in v:
            if problem := url_credential_problem(url):
                raise ValueError(problem)
        return v
    served_model_name: str | None = None
    """remote: the model name the servers serve (default: policy.path)."""
    checkpoint_dir: str | None = None
    """remote: where weight pushes are written; must be readable by every server."""


class RewardModelConfig(Section):
    """The reward model whose score is the `rm` reward term."""

    enabled: bool = True
    """Add the reward model's score to the reward (`rm`); false for a rubric-only reward."""
    engine: str = "task"
    """`task` (the task supplies its RM), `hf` (sequence classifier), or `python` (a function)."""
    path: str | None = None
    """`hf`: model directory or `tiny:<name>`. `python`: `module:function` taking a list of texts."""
    batch_size: int = Field(16, gt=0)
    """Items scored in one forward batch."""
    max_length: int = Field(2048, gt=0)
    """Longest RM input in tokens; longer inputs are truncated (from the left for chats)."""


BUILTIN_LOSSES = ("prime", "ppo_clip")


class LossConfig(Section):
    """The policy-gradient loss and how advantages are scaled."""

    name: str = "prime"
    """`prime`: prime-rl's masked token-level IS loss. `ppo_clip`: PPO's clipped surrogate. Or
    `module:function`, a loss of one's own: called as `function(logprobs, gen_logprobs,
    advantages, loss_mask, num_loss_tokens, **kwargs)` like the built-in ones (dynalize/grpo.py),
    it returns a `grpo.LossOutput` (worked example: docs/learner.md)."""
    kwargs: dict[str, Any] = {}
    """`module:function` losses: keyword arguments passed to the function."""
    mask_threshold: float = Field(0.2, gt=0)
    """prime: mask tokens where π_θ − π_gen > t with A > 0, or < −t with A < 0."""
    log_ratio_coef: float = Field(1e-3, ge=0)
    """prime: weight of the (log r)² term."""
    kl_mask_type: Literal["all", "unmasked", "masked"] = "all"
    """prime: the tokens the (log r)² term acts on, as prime-rl names them: `all` policy tokens
    (prime-rl's default), `unmasked` (inside the trust region only: a masked token gets no
    gradient at all, dynalize's behaviour before this option) or `masked` (outside it only)."""
    clip_eps: float = Field(0.2, gt=0)
    """ppo_clip: clip the ratio to [1 − eps, 1 + eps]."""
    std_normalize: bool | Literal["group", "batch"] = False
    """Divide advantages by a reward std (off by default, as in Dr. GRPO / prime-rl): `true` or
    `group`, the group's (TRL's `scale_rewards: group`, its default); `batch`, the whole batch's
    (TRL's `scale_rewards: batch`); `false`, none (TRL's `none`). Advantages stay centred per group."""

    @field_validator("name")
    @classmethod
    def _known_loss(cls, name: str) -> str:
        module, sep, attr = name.partition(":")
        if name not in BUILTIN_LOSSES and not (sep and module.strip() and attr.strip()):
            raise ValueError(f"should be {' or '.join(repr(n) for n in BUILTIN_LOSSES)}, or 'module:function' "
                             f"for a loss of one's own; got {name!r}")
        return name


class ReferenceKLConfig(Section):
    """A KL penalty to a frozen reference: per policy token, a term whose expected gradient is
    β · ∇KL(π_θ ‖ π_ref), stale samples included (docs/learner.md, "KL to a reference model")."""

    beta: float = Field(0.0, ge=0)
    """Weight of the penalty (0: off, as in TRL and prime-rl)."""
    placement: Literal["loss", "advantage"] = "loss"
    """`loss`: β · r · k added to the loss per policy token (TRL's GRPO, verl's `use_kl_loss`);
    `advantage`: −β · x, detached, added to each token's advantage (prime-rl's), with r = π_θ / π_gen
    the policy loss's importance ratio (x, k: `estimator`). Summed over policy tokens / num_loss_tokens,
    unmasked and unclipped by the policy loss."""
    estimator: Literal["k1", "k2", "k3"] = "k3"
    """The per-token estimate of KL(π_θ ‖ π_ref) logged as `kl/ref`, x = log π_θ − log π_ref: `k3` =
    e^(−x) − 1 + x (TRL's, ≥ 0) or `k2` = x²/2 (r detached) in the loss, `k1` = x as an advantage;
    the other pairings' gradients are not the KL's: refused. Each gradient per token: r · x · ∇log π_θ."""
    reference: str | None = None
    """The reference: a model directory or `tiny:<name>`; null = the initial policy
    (`policy.path`; with `policy.lora`, the base with its adapters switched off: no second copy)."""
    log: bool = False
    """Compute and log the KL (`kl/ref` in metrics.jsonl) every step also when beta is 0. With
    beta > 0 it is always logged. Without LoRA this holds a frozen copy of the reference."""

    @property
    def active(self) -> bool:
        return self.beta > 0 or self.log

    def penalty_problem(self) -> str | None:
        """Why the penalty would not do what it says, or None; checked at run start (build.check_config),
        not by a validator, so that a resumed run's saved settings load and an override mends them."""
        if self.beta == 0 or (self.estimator == "k1") == (self.placement == "advantage"):
            return None
        if self.estimator == "k1":
            return ("estimator k1 as a loss term has expected gradient 0 on the policy's samples (a silent "
                    "no-op): set trainer.kl.placement=advantage for k1, or trainer.kl.estimator=k3 or k2")
        return (f"placement advantage takes estimator k1 (a detached {self.estimator} advantage's gradient "
                f"is not the KL's): set trainer.kl.estimator=k1, or trainer.kl.placement=loss")


class TrainerConfig(Section):
    """The learner: optimizer, gradient clipping, micro-batching or packing, loss, reference KL (docs/learner.md)."""

    lr: float = Field(1e-6, gt=0)
    """AdamW learning rate (constant after `warmup_steps`)."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warmup: optimizer step k (counted from 1, over the whole run, a resume included)
    uses `lr × min(1, k / warmup_steps)`. A count, not a share of `steps`, so extending a run
    trains exactly as a run started with the larger `steps`. 0 (default): `lr` from the first step."""
    weight_decay: float = Field(0.01, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Clip the global gradient norm to this."""
    micro_batch_size: int = Field(16, gt=0)
    """Sequences per forward/backward; gradients accumulate over the batch."""
    micro_batch_tokens: int | None = Field(None, gt=0)
    """Sequence packing: micro-batches of at most this many tokens, sequences bin-packed into
    one row each, every sequence attending only to itself (position ids restart per sequence);
    no padding. Null (default): `micro_batch_size` sequences padded to the longest. A sequence
    longer than the budget gets a micro-batch of its own."""
    disable_dropout: bool = True
    """Zero every dropout probability of the policy (LoRA's included) before training (TRL's
    GRPOConfig option of that name; TRL 1.16 defaults it to false): with dropout on, two forward
    passes on the same tokens differ and the importance ratio is not 1 on-policy. False keeps the
    model's dropout."""
    master_weights: Literal["float32", "policy"] = "float32"
    """The weights the optimizer updates: `float32` master weights, with forward and backward in
    `policy.dtype` under autocast (mixed precision); or `policy`: train in `policy.dtype` itself
    (half the memory, but a bf16 weight cannot take an update much smaller than 1/256 of itself,
    so at lr 1e-6 most updates round away). The generator always gets weights in `policy.dtype`."""
    loss: LossConfig = LossConfig()
    """The policy-gradient loss."""
    kl: ReferenceKLConfig = ReferenceKLConfig()
    """A KL penalty to a frozen reference policy (off by default: beta 0)."""


class TaskConfig(Section):
    """The domain: its prompts, held-out evaluation and (optionally) reward model."""

    name: str = "sandbox"
    """A built-in task (`sandbox`, ...) or an importable `module:Class`."""
    args: dict[str, Any] = {}
    """The task's own settings, validated by the task."""


class RunConfig(Section):
    """A whole run: the top-level settings and one section per part."""

    name: str = "default"
    """Run name: outputs go to `<output_dir>/<name>/`."""
    output_dir: str = "runs"
    """Parent folder of run directories."""
    seed: int = 0
    """Seeds data order, sampling and the proposer's view (tiny models are built from seed 0)."""
    steps: int = Field(20, gt=0, le=10**9)
    """Training steps (at most 10⁹: far past any run; a larger number is a typo, and would be
    accepted only to fail when it is used)."""
    batch_size: int = Field(64, gt=0)
    """Rollouts per step (prompts per step × group_size)."""
    group_size: int = Field(8, gt=1)
    """G: samples per prompt."""
    async_level: int = Field(1, ge=0)
    """How many batches generation runs ahead of training (batch k uses policy k − async_level)."""
    max_off_policy_steps: int = Field(8, ge=0)
    """Drop rollouts sampled by a policy more than this many versions old."""
    max_left_out_rate: float | None = Field(0.2, ge=0, le=1)
    """Stop the run (checkpoint first, exit 3) when more than this share of the rollouts scored over
    the last `left_out_window` steps was left out of the update: a group with a rollout some term
    could not score (a failed judge verdict) trains on nothing (docs/reliability.md). A few failed
    verdicts can cost many times their share in rollouts. None: never stop."""
    left_out_window: int = Field(5, ge=1)
    """Steps (with rollouts scored) that `max_left_out_rate` looks back over."""
    checkpoint_every: int = Field(10, ge=0)
    """Save a resumable checkpoint every N steps (0 = only at the end)."""
    eval_every: int = Field(0, ge=0)
    """Run the task's held-out evaluation every N steps (0 = never)."""
    eval_samples: int = Field(4, gt=0)
    """Replies sampled per held-out prompt at each evaluation."""
    progress: bool = True
    """Show a live progress bar."""
    preflight: bool = True
    """Before the run directory is made and any model loads, send one short request to every
    API-backed model the run uses (judges, proposer, dedup model, a task's simulated user, remote
    generator servers): one that cannot be reached, refuses the key (401/403) or does not serve the
    model stops the run with one line naming the role and the endpoint (exit 2). dynalize/preflight.py."""
    report_to: list[Literal["tensorboard", "wandb", "trackio", "mlflow"]] = []
    """Experiment trackers to log to, any of them (default none; `pip install -e ".[trackers]"`):
    every metric per step, this config as hyper-parameters, the reward terms' events (penalties
    added, retired, revived) and a table of sample rollouts every `eval_every` steps and at the
    end. TensorBoard writes to `<run>/tensorboard/`; wandb, trackio and mlflow go where their own
    settings send them (e.g. WANDB_MODE=offline and WANDB_DIR, TRACKIO_DIR, MLFLOW_TRACKING_URI)."""
    tracker_project: str = "dynalize"
    """The project (wandb, trackio) or experiment (mlflow) the run is logged under, as `name`."""
    export_final: bool = True
    """At the end of the run, write the final policy to `<run>/final/`: a plain transformers
    model directory with its tokenizer and chat template (`python -m dynalize.export` exports
    any checkpoint)."""
    torch_threads: int = Field(0, ge=0)
    """CPU threads per torch call (0 = auto: half the cores, since generation and training overlap)."""
    policy: PolicyConfig = PolicyConfig()
    generator: GeneratorConfig = GeneratorConfig()
    reward_model: RewardModelConfig = RewardModelConfig()
    reward_funcs: list[str] = []
    """TRL-style reward functions (`module:function`, or from Python the functions themselves),
    each called as TRL's GRPOTrainer calls it, with the row's columns as keyword arguments
    (dynalize/rewards/functions.py); their weighted sum is the `reward_funcs` term, added to the RM
    and the rubric term where those are on (`reward_model.enabled: false` for functions alone)."""
    reward_weights: list[FiniteFloat] | None = None
    """One weight per `reward_funcs` entry (None: 1 each), as TRL's `reward_weights`; finite numbers
    (a NaN or inf weight would make every reward NaN or inf)."""
    trainer: TrainerConfig = TrainerConfig()
    task: TaskConfig = TaskConfig()
    penalties: PenaltiesConfig = PenaltiesConfig()
    """Dynalize's evolving penalties (off = the RM-only baseline)."""
    rubric: RubricConfig = RubricConfig()
    """Rubric rewards: per-prompt weighted criteria a judge checks, Rubric Dropout, POW3R-style
    reweighting, and the proxy/gold measurement (off by default)."""

    @field_validator("name")
    @classmethod
    def _one_folder_name(cls, v: str) -> str:
        if problem := run_name_problem(v):
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _batch_divides(self) -> "RunConfig":
        if self.batch_size % self.group_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of group_size ({self.group_size})"
            )
        return self

    @model_validator(mode="after")
    def _has_a_reward(self) -> "RunConfig":
        if not (self.reward_model.enabled or self.rubric.enabled or self.reward_funcs):
            raise ValueError("the reward needs reward_model.enabled, rubric.enabled or reward_funcs (or several)")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(f"reward_weights has {len(self.reward_weights)} weights for {len(self.reward_funcs)} "
                             f"reward_funcs: give one per function")
        return self

    @property
    def prompts_per_step(self) -> int:
        return self.batch_size // self.group_size

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name


def run_name_problem(name: str) -> str | None:
    """Why `name` cannot be a run's folder name inside `output_dir` (None if it can): it must be
    one plain path component, so a run never writes outside `output_dir` or takes it over."""
    if not name.strip():
        return "must not be empty"
    if name in (".", ".."):
        return f"must be a folder name, not {name!r}"
    if "/" in name or "\\" in name:
        return "must be one folder name inside output_dir (no / or \\)"
    if any(unicodedata.category(c).startswith("C") for c in name):
        return "must not hold control characters (a newline, a tab)"
    if len(name.encode("utf-8")) > 200:
        return "must be at most 200 bytes long"
    return None


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config error: {dotted}: {k!r} is not a section")
        node = child
    node[keys[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b=3` → ("a.b", 3); the value is read as YAML (numbers, booleans, lists)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"config error: override {item!r} is not of the form key=value")
    try:
        value = safe_load(raw, f"override {key.strip()}") if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and "\n" in raw.strip():  # YAML folds a newline into a space: keep it, checked as given
        value = raw
    return key.strip(), value


def validate(data: dict[str, Any]) -> RunConfig:
    """Validate a plain dict, raising ConfigError with a one-line message."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(one_line(e, model=RunConfig)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config error: no such config file: {p}")
    try:
        data = safe_load(p.read_text(encoding="utf-8"), str(p)) or {}  # aliases bounded (dynalize.yamlload)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"config error: {p} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config error: {p} must hold a mapping at the top level")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Config from an optional YAML file, then dotted overrides applied in order."""
    data = read_yaml(path) if path else {}
    for item in overrides:
        key, value = parse_override(item)
        _set_dotted(data, key, value)
    return validate(data)


def flatten(tree: dict[str, Any], sep: str = ".", prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` → `{"a<sep>b": 1}`; an empty section adds no key (a missing key reads as None)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, sep, f"{prefix}{k}{sep}"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_yaml(cfg: RunConfig) -> str:
    """The fully resolved config as YAML (what config.yaml and `--print-config` hold)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def dump_config(cfg: RunConfig, path: Path) -> None:
    """Write the fully resolved config as YAML (whole or not at all: a crash leaves the old file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(config_yaml(cfg), encoding="utf-8")
    tmp.replace(path)
