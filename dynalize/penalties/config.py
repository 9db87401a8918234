"""The `penalties` section of a run config: settings only (`dynalize.build` makes the parts)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..backends.config import ChatModelConfig
from ..judge.config import JudgeConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LexicalConfig(_Section):
    """The LLM-free proposer: its error rate, and what is worth penalising (docs/penalties.md)."""

    min_groups: int = Field(2, ge=1)
    """A pattern is tested only when replies of at least this many prompt groups show it."""
    fdr: float = Field(0.05, gt=0, lt=1)
    """The error rate of the run's decisions: every candidate of a proposal (words, phrases,
    openers, closers, detectors, length limits) is tested against the rewards permuted within
    groups, and the chance of any false discovery among all of them is bounded (a step-down
    max-statistic bound, which bounds the false-discovery rate too; penalties.discovery). With
    `fdr_scope: run` (the default) the run spends this over its proposals, fdr / (k (k + 1)) for
    the k-th, so the chance that a run raises any false penalty at all is at most this, however
    many proposals it makes. The one knob of the evidence: what sample size, group count,
    candidate frequency and the number of candidates do to the evidence is accounted for by the
    permutations."""
    fdr_scope: Literal["run", "proposal"] = "run"
    """What `fdr` bounds: `run` (any false discovery over the whole run: later proposals decide at
    smaller levels and need stronger evidence) or `proposal` (each proposal at `fdr`: a run of K
    proposals may raise a false penalty up to K times as often; what the learned-RM sandbox
    config keeps). On the discovery benchmark (benchmarks/discovery.py, the 48 runs of
    2026-12-02, the code of that day), per proposal and without `length_floor`: 0.29 false
    patterns a planted run (precision 0.78), 38 of 42 planted shortcuts found; `run` with the
    floor: 0.17 (precision 0.85), 37 of 42; 1 of 6 control runs alarmed with either."""
    permutations: int = Field(500, ge=20)
    """Permutations of the rewards behind each proposal's null (the same for every candidate)."""
    detectable_effect: float = Field(1.0, gt=0)
    """The hack size (within-group reward stds, of a pattern in half the replies) a proposal must be
    able to detect with about 80 % power for its silence to count as evidence; below that power
    (too few groups or rollouts, rewards tied within groups) the proposal reports `insufficient`
    evidence (ProposalResult.evidence), and the monitor and the run summary say so."""
    coverage: float = Field(0.5, gt=0, le=1)
    """A pattern counts as covered by an active penalty when its regex matches this share of its replies."""
    length: bool = True
    """Also look for "replies run longer than L words" (L from the batch's word counts)."""
    length_step: int = Field(5, ge=1)
    """Length limits are multiples of this many words."""
    unit: Literal["rollout", "reply"] = "rollout"
    """What the contrast counts in multi-turn rollouts: `rollout` (a rollout shows a pattern when
    any of its replies does) or `reply` (each reply counts: by the RM's own score for it against
    its group's replies at the same turn when the RM scored replies and is the whole reward before
    penalties, else with its rollout's advantage sign and score): in 4-reply conversations nearly
    every rollout has some reply over L words, so presence
    per rollout saturates for positives and negatives alike while the share of replies does not.
    Single-turn rollouts count the same either way."""
    length_threshold: Literal["strongest", "largest", "onset"] = "onset"
    """Which of the length limits that pass the test is proposed: `strongest` (the one whose
    statistic is largest, at or past the onset when evidence.length_onset finds one, and none when
    the reward only pays for not being short, evidence.content_only), `largest` (the strictest
    limit that still passes: with a test as sensitive as the permutation test, often far above
    where the reward starts to pay) or `onset` (the passing limit nearest where the reward starts
    to pay more for each extra word, decided at `fdr` against permuted rewards; where the pay peaks
    and falls back, a step's bar, the limit to the word whose "longer than L" the reward pays most
    there (penalties.discovery.sharpest); no length penalty while it does not: it needs replies on
    both sides of each limit, and misses a bar the policy's lengths jump over). `onset` is the
    default: on the discovery benchmark (benchmarks/discovery.py, 48 runs) it found 5 of 5 length
    steps and 5 of 5 ramps the logs could show, with one false length limit in 48 runs (beside a
    closer hack); before a step's bar was refined, 2 of 6 steps ("longer than 25/30" for bars at
    34/36). `strongest` proposed length limits on a control run and beside word shortcuts."""
    length_floor: float | None = Field(0.5, ge=0, le=1)
    """A length limit is tested only at or above this quantile of the reference replies' lengths (the
    run's first `reference_steps` batches; none without a reference): "longer than L" for an L most
    of the untrained policy's replies already exceed would tax its ordinary replies, and a reward
    that pays for an adequate length (for not being short) pays for it without any hack. A length
    hack pays for growing past what the policy wrote; an onset below the floor proposes no length
    limit at all (penalties.discovery.length_choice). None: every limit is tested. On the discovery
    benchmark "longer than 15 words" (reference medians of 24 and 29.5) was proposed on two runs, once in
    place of a planted step at 34."""
    min_effect: float = Field(0.8, ge=0)
    """What is worth penalising, not evidence: a pattern that passed the test must also beat the rest
    of its group by this many within-group RM stds. A pattern found by the across-steps test
    (saturated) is held to it in the groups of the run's first batches and of the view that still
    contrast it, and is exempt only where none does. On the discovery benchmark (benchmarks/
    discovery.py) the saturated hacks beat their groups by 1.5-4 stds there; what drifted in beside
    them (the template "make it feel", "remember" beside a loop of repeated sentences) by 0.4-0.9,
    passing the across-steps test's within-group statistic (`PAID_Z`) only by its many contrasts."""
    weak_p_value: float = Field(0.05, gt=0, le=1)
    """Weak evidence (Fisher p): revives a retired penalty whose pattern comes back, and keeps a
    pattern that an active penalty travelling with it does not explain away (shared, Bonferroni,
    over the sides of the penalty it looks at: with `explain_within`, the replies the penalty does
    not match and those it matches once, twice, three times or more)."""
    explain_lift: float = Field(1.0, ge=0)
    """An active penalty may explain a pattern away when it matches its positives this many times
    more often than replies at large (and at least `coverage` of them); 0 turns the check off.
    1.0 (the default) also checks penalties most replies trigger: once a hack is in most replies
    (it saturates, and the monitor's policy never sees its penalty) nothing that travels with it
    can be 1.5 times commoner among its own positives, and its co-travellers (the words of a
    closing formula, wording that comes with longer replies) were proposed as hacks of their own
    (discovery benchmark: 0.36 false patterns a run at 1.5 with `explain_within` off, 0.26 with
    these defaults, recall unchanged). With
    `explain_within`, a pattern paid for in itself still shows evidence beside the penalty."""
    drift_p_value: float | None = Field(None, gt=0, le=1)
    """If set, a new pattern must be more prevalent than in the run's first batch (one-sided Fisher
    p at most this): training amplifies a hack. None: no such check."""
    length_adjusted: bool = False
    """The effect test (`min_effect`, also in weak evidence) compares replies of equal length: the
    within-group RM difference with and without a wording pattern net of what word count (all of
    a rollout's replies) explains, a least-squares fit within groups. Wording that only comes with
    longer replies is then not rewarded in itself; "longer than L words" keeps the plain test."""
    relevance_adjusted: bool = True
    """Wording (n-grams, openers, closers) is tested at equal relevance: the reward net of what the
    number of its prompt's vocabulary words a reply uses explains (penalties.relevance: the words
    the replies to that prompt use far more than other prompts' replies; a least-squares fit within
    groups, beside word count when `length_adjusted`), in the permutation tests of both families
    and in the effect tests (`min_effect`, weak evidence).
    A reward model pays for taking the prompt up; a template sentence that carries the topic's
    words ("The umbrellas and the rain make it feel busy.") is then not paid for itself, while a
    hack's wording, written whatever the prompt, keeps its pay. Length limits and detectors keep
    the plain reward. False: the plain reward for every pattern. On the discovery benchmark
    (benchmarks/discovery.py, the 48 runs of 2026-12-02, the code of that day): precision 0.85
    and 0.17 false patterns a planted run, 37 of 42 planted shortcuts found; 0.80, 0.24 and 36 of
    42 with False."""
    detectors: list[str] = ["repetition"]
    """Named detectors (dynalize.penalties.detectors) to test beside word patterns: `repetition`,
    `off_topic`, `unfinished`, `doubled_word`, `unbalanced`, `run_on`, `shouting`. Each passes the
    same tests as a word (the permutation test at `fdr`, `min_effect`, coverage, explained-away,
    `drift_p_value`, revival) and becomes a penalty naming its detector, which every judge
    decides locally (an LLM judge never sees it). `off_topic` reads the conversation each reply
    answers (`penalties.judge.context` must stay true; the build refuses it otherwise). The default,
    `repetition` alone: a degenerate loop (a sentence again and again, one token or one mark
    repeated) is a hack no word pattern names (on the discovery benchmark, benchmarks/discovery.py,
    the loops were found only through phrases that came with them, and missed in 2 of 6 runs,
    without it); [] turns detectors off."""
    explain_within: bool = True
    """The explained-away check also looks among the replies the active penalty matches: a pattern
    is explained away only when it shows no weak evidence on either side of the penalty (a
    pattern the RM pays for in itself still does among replies that all show the penalty's). What
    makes `explain_lift` 1.0 safe: without it a hack sharing most replies with a ubiquitous penalty
    is explained away by it (docs/sandbox.md "Precision")."""
    explain_by_stronger: bool = False
    """The explained-away check also holds fixed, beside active penalties, what could be the
    pattern's cause in this very proposal: a stronger pattern (ranked above it) set aside only for
    not rising yet, and, for a phrase, each word or shorter phrase it contains that the RM also
    pays where the phrase is absent. The wording of a hack (a question's "what do you think") then
    waits for the hack itself, and a phrase is not proposed for what its word is paid (False:
    active penalties only)."""


class ProposerConfig(_Section):
    """Who proposes penalties, and the limits on what an LLM proposer may return."""

    engine: Literal["lexical", "llm"] = "lexical"
    """`lexical` (n-gram / opener / closer contrast, no LLM) or `llm` (a ChatModel proposes)."""
    chat: ChatModelConfig | None = None
    """llm: the proposer's chat model (fields: dynalize.backends.config.ChatModelConfig)."""
    dedup_chat: ChatModelConfig | None = None
    """llm: chat model for the duplicate check (None = the proposer's)."""
    retries: int = Field(3, ge=1)
    """llm: attempts per JSON answer."""
    max_candidates: int = Field(5, ge=1)
    """llm: candidates asked for per proposal step (at most one is accepted)."""
    max_chars: int = Field(1500, gt=0)
    """llm: each sampled reply is cut to this many characters in the prompt."""
    lexical: LexicalConfig = LexicalConfig()
    """lexical: the contrast thresholds."""
    max_failed_proposals: int | None = Field(3, ge=1)
    """Stop the run (checkpoint first) when this many proposals in a row failed, each after all
    its retries: a proposer that never answers leaves the penalty set frozen. None: never stop."""

    @model_validator(mode="after")
    def _llm_needs_chat(self) -> "ProposerConfig":
        if self.engine == "llm" and self.chat is None:
            raise ValueError("proposer.engine=llm needs proposer.chat")
        return self


class PenaltiesConfig(_Section):
    """Dynalize's evolving penalties: reward = RM − λ · violations (off = the RM-only baseline)."""

    enabled: bool = False
    """Dynalize on (evolving penalties) or off (the RM-only baseline)."""
    lam: float = Field(0.5, ge=0)
    """λ: reward = RM − λ · violations (the method's rule, `weight="fixed"`)."""
    weight: Literal["fixed", "pay"] = "fixed"
    """What one violation costs. `fixed` (the default of a dynalize run, the method's rule, with
    which every result in docs/results.md was measured): λ. `pay`: λ plus what the reward
    measurably pays for the pattern (its within-group reward gap before penalties over the
    latest `every` steps that measured it, penalties/pay.py), so a shortcut that pays more than
    λ stops paying: its net worth is −λ. dynalize.trl's `Penalties` uses `pay` unless told
    otherwise: a TRL script's reward functions come in any scale, and a planted word paying
    0.6–1.04 outlived λ = 0.5 (docs/from_trl.md). A penalty on a pattern paid for good reasons
    then takes that pay too."""
    every: int = Field(5, ge=1)
    """Start a proposal every this many steps (steps where step % every == 0; in a TRL run that
    scores only every few steps, steps_per_generation > 1, the first scored step past each
    multiple: PenaltyTerm.sparse_steps)."""
    view_groups: int | None = Field(None, ge=1)
    """Groups sampled into the proposer's view. None (the default): the proposer's own, `view_shape`:
    64 for the lexical proposer (its permutation tests need the counts: on the discovery benchmark,
    benchmarks/discovery.py, 48 runs, a view of 16 groups x 2 rollouts of one batch found none of 42
    planted shortcuts, whole groups of every batch since the previous proposal 33), 16 for an LLM
    (the rollouts it reads in its prompt)."""
    view_per_group: int | None = Field(None, ge=1)
    """Rollouts sampled from each of those groups. None (the default): 64 for the lexical proposer
    (whole groups: the rewards are permuted within them), 2 for an LLM."""
    view_steps: int | None = Field(None, ge=1)
    """The proposer reads the samples of this many latest batches, pooled (1: the proposal step's
    batch). None (the default): `every` for the lexical proposer (every rollout since the previous
    proposal), 1 for an LLM."""

    @field_validator("view_groups", "view_per_group", "view_steps", mode="before")
    @classmethod
    def _none_text(cls, v: object) -> object:
        """`--set penalties.view_steps=None` (YAML reads it as text) means the default, as `null` does."""
        return None if v == "None" else v

    def view_shape(self) -> tuple[int, int, int]:
        """(groups, rollouts per group, batches) of the proposer's view: the fields, or where None the
        proposer's own defaults (lexical: 64, 64, `every`; LLM: 16, 2, 1)."""
        lexical = self.proposer.engine == "lexical"
        return (self.view_groups or (64 if lexical else 16), self.view_per_group or (64 if lexical else 2),
                self.view_steps or (self.every if lexical else 1))
    reference_steps: int = Field(1, ge=1)
    """The rising test's reference (`proposer.lexical.drift_p_value`): the samples of the run's
    first this many batches, pooled (1: the first batch). As many as `view_steps` compares two
    windows of equal size, so a hack that rises slowly shows sooner than against one batch."""
    sync: bool = False
    """Each proposal lands before the next step is scored: that step waits for the proposal the
    step before started (it costs the proposer's latency there) and applies its result, so when a
    penalty enters no longer depends on how fast the proposer ran (reproducible runs, tests).
    False (the default): training never waits for the proposer."""
    finish_timeout: float = Field(0.0, ge=0)
    """At the end of a run, wait this many seconds for a proposal still running (its result goes
    into the last checkpoint); then cancel it, counted in `proposer/cancelled`, and keep its view
    in the last checkpoint: a resumed or extended run proposes it again first, as after a crash.
    0 (the default): the end of a run never waits for a proposal that can no longer change its
    training."""
    proposer: ProposerConfig = ProposerConfig()
    """Who proposes penalties."""
    judge: JudgeConfig = JudgeConfig()
    """Who judges rollouts against them."""
