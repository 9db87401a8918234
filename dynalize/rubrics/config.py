"""The `rubric` section of a run config: settings only (`dynalize.build` makes the parts).

A rubric-rewarded run reads each prompt's rubric from its meta (`Prompt.meta["rubric"]`, see
`dynalize.rubrics.criteria`), has a judge check every reply against it, and adds
`coef · R̃` to the reward: the rubric score over the criteria the step's keep-mask kept
(Rubric Dropout; f = 0 keeps all: fixed-rubric training), optionally with POW3R-style weights.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..judge.config import JudgeConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DropoutConfig(_Section):
    """Rubric Dropout: which positive criteria count in each group's reward (docs/rubrics.md)."""

    f: float = Field(0.0, ge=0, lt=1)
    """Rubric Dropout's fraction: each unprotected positive criterion is dropped from a group's
    reward with this probability (one mask per group, drawn from SHA256(instance id, step)).
    0 = fixed-rubric training."""
    min_keep: int = Field(3, ge=1)
    """At least this many positive criteria are kept (all of them when a rubric has fewer)."""
    protected_tags: list[str] = []
    """Criteria with any of these tags are never dropped (negative-weight criteria never are). Tags
    match case-insensitively (RaR's `category:essential` tags are lower-cased on load); a tag no
    criterion of the training data carries stops the run at start-up, as do the next three fields'."""
    protected_ids: list[str] = []
    """Criteria with these ids (matched exactly) are never dropped."""
    tag_rates: dict[str, float] = {}
    """Own drop rates by tag, e.g. {"axis:accuracy": 0.1} to spare accuracy criteria (a criterion
    with several such tags takes the lowest); annealed like f."""
    id_rates: dict[str, float] = {}
    """Own drop rates by criterion id (win over tag rates); annealed like f."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """`constant` f, or f decaying to 0 over `anneal_steps` (linearly or along a half cosine)."""
    anneal_steps: int | None = Field(None, gt=0)
    """Steps over which an annealed f reaches 0 (None: the run's `steps` at its first start, stored
    in config.yaml then, so extending the run keeps the schedule: dynalize/resume.py)."""

    @model_validator(mode="after")
    def _rates_are_probabilities(self) -> "DropoutConfig":
        for name, rates in (("tag_rates", self.tag_rates), ("id_rates", self.id_rates)):
            bad = {k: v for k, v in rates.items() if not 0 <= v <= 1}
            if bad:
                raise ValueError(f"{name} must be probabilities in [0, 1], got {bad}")
        return self

    @property
    def active(self) -> bool:
        """Whether any criterion can be dropped (a rate of 0 drops nothing)."""
        return self.f > 0 or any(self.tag_rates.values()) or any(self.id_rates.values())


class NoiseConfig(_Section):
    """The noise control for Rubric Dropout (dynalize/rubrics/noise.py): the fixed rubric's reward plus
    zero-mean Gaussian noise with the variance dropout at `f` would inject (Observation 1)."""

    f: float = Field(0.0, ge=0, lt=1)
    """The dropout fraction whose variance is injected: rollout i's reward gets noise of variance
    f(1 − f) Σ_{w_k>0} w_k² δ_ik² / W² (δ_ik its verdict on k minus the group's mean, W the positive
    weight total), drawn from SHA256("noise", instance id, step). 0 = off. Logged: `rubric/noise_std`."""


class ReweightConfig(_Section):
    """POW3R-style criterion weights for the training reward: the paper's port or the fuller form."""

    method: Literal["none", "pow3r_port", "pow3r"] = "none"
    """Criterion weights for the training reward: `none` (human weights), `pow3r_port` (the port
    the Rubric Dropout paper compared against: the group's own contrast, applied at once, no
    category balancing), `pow3r` (EMA-smoothed, one-visit lag, within-category balancing).
    Evaluation always uses the human weights (dynalize/rubrics/reweight.py)."""
    min_factor: float = Field(0.1, ge=0, le=1)
    """A criterion's factor is min_factor + (1 − min_factor) · 4p(1 − p): saturated and
    unreachable criteria keep this much of their weight."""
    ema: float = Field(0.9, ge=0, lt=1)
    """pow3r: weight of the past in each (instance, criterion)'s smoothed factor."""
    category_prefix: str | None = "axis:"
    """pow3r: a criterion's category is its first tag with this prefix (HealthBench: `axis:`);
    each category keeps its human share of the weight. None: no categories."""


class RubricJudgeConfig(JudgeConfig):
    """A judge of rubric criteria (the training proxy or the gold judge): local deciders or an LLM."""

    engine: Literal["local", "llm"] = "local"  # type: ignore[assignment]
    """`local`: no LLM, each criterion decided by its own `regex` or else by `predicate`;
    `llm`: criteria with a regex locally, the rest by `chat` in one call per reply."""
    predicate: str | None = None
    """local: `module:function(reply, criterion, conversation) -> bool` deciding the criteria
    that have no regex (e.g. a task's rule-based checker)."""
    prompt: Literal["rubric", "penalty"] = "rubric"
    """The prompt an LLM judge reads: `rubric` (prompts/rubric_judge_*.txt: criteria met or not)
    or `penalty` (prompts/judge_*.txt: behaviours present or not). `batched` protocol only."""
    protocol: Literal["batched", "healthbench", "researchqa"] = "batched"
    """llm: how each reply is asked. `batched`: one call covering every criterion (our prompt,
    yes/no); `healthbench`: one call per criterion with HealthBench's grader template, re-asked
    until `criteria_met` is a boolean; `researchqa`: criteria in batches of 8 rated on
    ResearchQA's five levels (graded verdicts), re-asked on a wrong count. The benchmark's own
    score in the loop (docs/evaluation.md); set `chat` to the benchmark's grader sampling."""
    attempts: int | None = Field(None, ge=1)
    """healthbench / researchqa: grader calls per criterion (healthbench) or batch (researchqa)
    before it fails. None: the protocol's (healthbench 10, a bound where the official code has
    none; researchqa 3, the official)."""
    batch_size: int = Field(8, ge=1)
    """researchqa: criteria per call (the official 8)."""

    @model_validator(mode="after")
    def _predicate_is_local(self) -> "RubricJudgeConfig":
        if self.predicate and self.engine != "local":
            raise ValueError("predicate is for engine 'local' (an llm judge decides with its chat model)")
        if self.protocol != "batched" and self.engine != "llm":
            raise ValueError(f"protocol {self.protocol!r} asks an LLM grader: it needs engine 'llm'")
        return self


class RubricConfig(_Section):
    """Rubric rewards: per-prompt weighted criteria a judge checks, with Rubric Dropout (docs/rubrics.md)."""

    enabled: bool = False
    """Add the rubric term to the reward (the task's prompts must carry rubrics in their meta)."""
    coef: float = Field(1.0, ge=0)
    """The term is `coef · R̃` (R̃ in [min, 1]: pitfalls can take it below 0)."""
    dropout: DropoutConfig = DropoutConfig()
    """Rubric Dropout."""
    reweight: ReweightConfig = ReweightConfig()
    """POW3R-style criterion reweighting."""
    noise: NoiseConfig = NoiseConfig()
    """The noise control: dropout's variance added to the reward instead of a mask (a control arm
    for "is dropout better than noise?"; usually with `dropout.f: 0`)."""
    judge: RubricJudgeConfig = RubricJudgeConfig()
    """The training judge: the *proxy* of the measurement protocol."""
    judge_dropped: bool = True
    """Send dropped criteria to the judge too. True: each reply's one judge call covers its full
    rubric (the same calls as fixed-rubric training), the reward uses the kept verdicts, and the
    full-rubric reward is logged every step (`rubric/full`). False: the call lists only the kept
    criteria (shorter prompts; the in-domain full-rubric reward is then not logged per step)."""
    gold_judge: RubricJudgeConfig | None = None
    """The gold judge of the measurement protocol (any engine), used only at evaluation. Its
    verdicts are never cached, so the reviewers' check re-judges identical text. None: proxy only."""
    eval_anchors: int = Field(32, ge=0)
    """The reviewers' check: this many replies of the first evaluation are kept and graded again
    by gold at every evaluation, interleaved with the new replies (`eval/rubric/anchor_gold`:
    does gold move on identical text?). 0: off."""
    per_criterion_limit: int = Field(64, ge=0)
    """Log per-criterion met rates at evaluation only when at most this many distinct criterion
    ids occur (per-tag rates are always logged)."""
