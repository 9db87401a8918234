"""Settings of `python -m dynalize.rm pairs` and `python -m dynalize.rm train` (settings only:
`dynalize.rm.pairs` and `dynalize.rm.train` do the work). Every key can come from a YAML file
(`--config`) or a dotted override (`lr=2e-6`, `trainer_args.bf16=true`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..config import TaskConfig


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, hide_input_in_errors=True)


class PairsConfig(Settings):
    """How preference pairs are cut from a run's rollouts (docs/rm_retraining.md, "The pair rule")."""

    run: str
    """The run directory whose training rollouts (`rollouts/step_*.jsonl`) are read."""
    out: str
    """The pair file to write (JSONL, one pair per line; format in dynalize/rm/pairfile.py)."""
    percentile: float = Field(75.0, ge=0, lt=100)
    """A chosen reply's RM score must be above this percentile ..."""
    scope: Literal["prompt", "run"] = "prompt"
    """... of its own prompt's replies (`prompt`), or of every reply read from the run (`run`).
    Per prompt by default: the RM's scores differ by prompt (some prompts score high whatever the
    reply), so a run-wide cut takes its chosen replies from the prompts the RM favours and leaves
    the others without pairs; per prompt, every prompt contributes its own best clean replies."""
    pairs_per_prompt: int = Field(4, gt=0)
    """Pairs made per prompt at most (each chosen and each rejected reply used once before any is reused)."""
    steps: str | None = None
    """Training steps to read: `10-99`, `0,5,40-60`, `50-` (from step 50 on); None: every step."""
    dedup: bool = True
    """Count a reply text once per prompt (its RM score averaged, its penalties pooled): the
    percentile is over distinct replies, and no pair repeats."""
    rejudge: bool = False
    """Judge every reply again against every penalty the run ever accepted (the full discovered
    list) instead of reading the verdicts recorded in training, which cover only the penalties
    active at each step (a reply from before a hack was discovered reads as clean there)."""
    judge: str | None = None
    """With `rejudge`: the LLM judge for penalties without a regex (a chat-model spec: JSON or a
    YAML/JSON file, as `python -m dynalize.report audit --judge`); regex penalties are matched locally."""
    judge_concurrency: int = Field(16, gt=0)
    """With `judge`: calls in flight at once."""
    rejected: Literal["random", "highest"] = "random"
    """Which penalised replies are paired first: a random order, or the highest RM scores first
    (the hacks the RM over-pays most)."""
    seed: int = 0
    """Seed of the random orders."""


class RMTrainConfig(Settings):
    """Bradley–Terry training of a reward model with TRL's RewardTrainer (dynalize/rm/train.py)."""

    base: str
    """The model to start from: a sequence-classification RM directory (retraining), a causal LM
    directory (a fresh reward head is added), or `tiny:<name>`."""
    pairs: str
    """The original preference pairs (JSONL, dynalize/rm/pairfile.py)."""
    extra: list[str] = []
    """Further pair files (e.g. from `python -m dynalize.rm pairs`), trained on together with `pairs`."""
    out: str
    """Where the trained RM goes: a transformers sequence-classification directory that
    `reward_model: {engine: hf, path: OUT}` loads, with `rm_training.json` (the metrics)."""
    overwrite: bool = False
    """Replace a non-empty `out` (otherwise refused)."""
    task: TaskConfig | None = None
    """The task whose `rm_input` decides what the RM reads of a pair (raw text or a chat through
    its template), exactly as in a run; None: the conversation plus the reply, as the default task
    hook gives it."""
    eval_fraction: float = Field(0.1, ge=0, lt=1)
    """Share of each pair file held out (seeded) for the before / after accuracy."""
    max_eval_pairs: int | None = Field(1000, gt=0)
    """At most this many held-out pairs per file."""
    lr: float = Field(1e-5, gt=0)
    """Learning rate (AdamW)."""
    epochs: float = Field(1.0, gt=0)
    """Passes over the training pairs."""
    batch_size: int = Field(8, gt=0)
    """Pairs per device per step."""
    grad_accum: int = Field(1, gt=0)
    """Gradient accumulation steps."""
    max_length: int = Field(2048, gt=0)
    """Tokens of one RM input at most (cut as the `hf` engine cuts: raw text from the right, a chat from the left)."""
    weight_decay: float = Field(0.0, ge=0)
    warmup_ratio: float = Field(0.03, ge=0, le=1)
    """Share of the optimizer steps over which the learning rate warms up linearly (1.0: all of them)."""
    lr_scheduler: str = "linear"
    """A transformers scheduler name (`linear`, `cosine`, `constant`, ...)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of the model as loaded (bfloat16 for large RMs on GPUs)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory (large RMs)."""
    center_rewards_coefficient: float | None = None
    """TRL's penalty on the mean reward's square (keeps scores centred), None: off."""
    previous: str | None = None
    """The RM the trained one replaces (a directory or `tiny:<name>`), when training starts from
    something else (e.g. the base LM it was made from): its held-out accuracy is the "before"
    column. None: the base, when the base is an RM (has a one-output head)."""
    keep_scale: bool = False
    """After training, rescale the reward head so the new RM's scores spread (standard deviation)
    as the previous RM's do on the replies of up to 512 training pairs: reward mixes tuned against
    it (Dynalize's λ) keep their weight. Needs a previous RM."""
    eval_batch_size: int = Field(32, gt=0)
    """RM inputs per forward pass when measuring accuracy (through the `hf` engine)."""
    seed: int = 0
    """Seed of the held-out split, the data order and a fresh head."""
    threads: int | None = Field(None, gt=0)
    """torch CPU threads (None: torch's default)."""
    trainer_args: dict[str, Any] = {}
    """Further `trl.RewardConfig` / `transformers.TrainingArguments` keys (e.g. `bf16`, `fsdp`,
    `deepspeed`, `optim`, `logging_steps`), passed as they are; they win over the keys above."""
