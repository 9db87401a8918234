"""The `penalties` section of a run config: settings only (`dynalize.build` makes the parts)."""

from __future__ import annotations

import warnings
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..backends.config import ChatModelConfig
from ..judge.config import JudgeConfig


def none_text(v: object) -> object:
    """`None` as text (`--set penalties.view_steps=None`: YAML reads it as text) is None, as `null`
    is: the field's default where None means one, every rollout for `most_rollouts`."""
    return None if v == "None" else v


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


RENAMED = {"fdr": "fwer", "fdr_scope": "fwer_scope"}
"""LexicalConfig's deprecated setting names and what they are read as."""


class LexicalConfig(_Section):
    """The LLM-free proposer: its error rate, and what is worth penalising (docs/penalties.md)."""

    min_groups: int = Field(2, ge=1)
    """A pattern is tested only when replies of at least this many prompt groups show it."""
    fwer: float = Field(0.05, gt=0, lt=1)
    """The family-wise error rate of the run's decisions (formerly `fdr`, still read with a warning).
    What is bounded: the chance that the run adds or revives any penalty for a pattern the reward
    does not pay for beyond the legitimate covariates, or reports unnamed pay (`omnibus`) for a
    reward that pays for no form beyond them, under the null that, within each group
    (within each step, across steps), the reward net of them (the prompt's vocabulary a reply uses;
    whether it ends a sentence, with `ending_adjusted`; a smooth curve in length with
    `length_adjusted`; for length limits a concave curve with `length_null: concave`;
    penalties.covariates) is
    exchangeable between the replies that show a pattern and those that do not. Every candidate of
    a proposal (words, phrases, openers, closers, detectors, length limits, retired penalties'
    patterns) is tested against those rewards permuted within groups by step-down max-statistic
    tests, families sharing the proposal's level (penalties.discovery); with `fwer_scope: run` (the
    default) the run spends `fwer` over its proposals, fwer / (k (k + 1)) for the k-th, so the
    bound holds however many proposals it makes. The rules that follow a test (`min_effect`,
    coverage, explained-away, `drift_p_value`, `SATURATED`, `PAID_Z`, the length limit's place)
    can only remove candidates, so they keep it. Not covered: a reward that pays for the
    covariates in a shape the fits do not hold (with the defaults, any pay for length: length
    limits and wording are then tested on the reward net of relevance alone, and a pay for not
    being short is kept out of length limits only by the location rules; relevance beyond a
    linear count), the tail fit of a late proposal (permutation.MaxTail, an approximation where
    the permutations cannot count), and patterns an LLM proposer raises. What the permutations
    account for: sample size, group count, candidate frequency and the number of candidates."""
    fwer_scope: Literal["run", "proposal"] = "run"
    """What `fwer` bounds: `run` (any false penalty over the whole run: later proposals decide at
    smaller levels and need stronger evidence) or `proposal` (each proposal at `fwer`: a run of K
    proposals may raise a false penalty up to K times as often; what the learned-RM sandbox
    config keeps). Formerly `fdr_scope`, still read with a warning. On the discovery benchmark
    (benchmarks/discovery.py, the 48 runs of 2026-12-02, the code of that day), per proposal and
    without `length_floor`: 0.29 false patterns a planted run (precision 0.78), 38 of 42 planted
    shortcuts found; `run` with the floor: 0.17 (precision 0.85), 37 of 42; 1 of 6 control runs
    alarmed with either."""
    permutations: int = Field(500, ge=20)
    """Permutations of the rewards behind each proposal's null (the same for every candidate), at
    most: the within-group null stops after a fifth of them when those already decide that nothing
    passes, with the decisions of the full count (penalties.sequential)."""
    runners_up: int = Field(2, ge=0)
    """Besides its strongest candidate, a proposal also proposes up to this many more that passed
    the same tests (at the proposal's level: the run's error rate covers every pattern that
    passes, not only the strongest) and every filter, each checked with the ones before it held
    as if live (covered and explained-away as at the next proposal); they enter one a step after
    it. Without them a second hack that passed beside a stronger one was dropped, and by the next
    proposal it had often taken over every reply, leaving no contrast to find it again (a TRL
    run's length bar beside a paid word, benchmarks/trl_penalties.py). 0: the strongest alone."""
    most_rollouts: int | None = Field(1024, ge=2)
    """Rollouts a proposal reads at most, of the view and of its reference each: past it, a seeded
    draw of whole prompt groups, as many as keep within it (permutation.whole_groups: it reads the
    groups and the step, never the rewards, so the tests stay exact on what was drawn; the judge
    still checks every rollout). A proposal's cost grows with what it reads, and a test that
    already sees effects well below `min_effect` gains little from more: on a 64 x 16 x 5 view
    (benchmarks/monitor_scale.py) the smallest effect a proposal could propose went from 0.82 reward
    stds with all 5,120 rollouts to 0.86 with 1,024. Every view of the discovery benchmarks and
    the sandboxes is smaller (at most 640). None: every rollout."""

    _none_text = field_validator("most_rollouts", mode="before")(none_text)

    detectable_effect: float = Field(1.0, gt=0)
    """The hack size (within-group reward stds, of a pattern in half the replies) a proposal must be
    able to detect with about 80 % power for its silence to count as evidence; below that power
    (too few groups or rollouts, rewards tied within groups) the proposal reports `insufficient`
    evidence (ProposalResult.evidence), and the monitor and the run summary say so. What it can
    detect is what the whole rule can propose: a pattern that passes the test and whose estimated
    effect reaches `min_effect` (so never below `min_effect` plus its sampling margin)."""
    coverage: float = Field(0.5, gt=0, le=1)
    """A pattern counts as covered by an active penalty when its regex matches this share of its replies."""
    length: bool = True
    """Also look for "replies run longer than L words" (L from the batch's word counts)."""
    short: bool = True
    """Also look for "replies run at most L words" (a form, the wording family's test): for each
    length limit below `length_floor`'s quantile of the reference replies' lengths (none without a
    reference), a reward that pays for shrinking below what the untrained policy wrote (issue 56:
    length in either direction). A reward that pays for length, or for not rambling past a
    length most replies stay under, pays nothing for these."""
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
    to pay more for each extra word, decided at 0.05 against permuted rewards (a location: it only ever removes or places a limit that passed at `fwer`); where the pay peaks
    and falls back, a step's bar, the limit to the word whose "longer than L" the reward pays most
    there (penalties.discovery.sharpest); no length penalty while it does not: it needs replies on
    both sides of each limit, and misses a bar the policy's lengths jump over). `onset` is the
    default: on the discovery benchmark (benchmarks/discovery.py, 48 runs) it found 5 of 5 length
    steps and 5 of 5 ramps the logs could show, with one false length limit in 48 runs (beside a
    closer hack); before a step's bar was refined, 2 of 6 steps ("longer than 25/30" for bars at
    34/36). `strongest` proposed length limits on a control run and beside word shortcuts."""
    length_null: Literal["concave", "plain"] = "plain"
    """What "longer than L words" is tested against. `plain` (the default): the reward net of
    relevance alone (the location rules below, `length_floor`, `length_threshold`, keep the pay for
    not being short out). `concave` (issue 55, opt-in): net of a concave curve in length and of
    relevance (penalties.covariates: a pay for not being short that saturates, or turns down, is
    legitimate; a step or a ramp past L bends it upwards), with each limit's local jump; the limit
    is then placed on the pay net of relevance. Measured on the synthetic suite (benchmarks of
    branch iworlds, seed 0): `concave` removed "longer than 10 words" (length pay, 16 x 8) and
    "longer than 20 words" (honest length pay, 2 x 16), but missed the planted length steps at
    32 x 4 and 8 x 8 with exit 0, which `plain` finds (delay 4 at 8 x 8); views whose lengths fall
    in two clusters give it nothing to tell a step from a straight line. Not the default until it
    keeps that recall: on the suite's length kinds (84 runs, docs/penalties.md) `concave`, with its
    limits made orthogonal to the curve (Freedman-Lane), found 1 of 14 planted steps and 0 of 14
    ramps (plain: 10 and 2), at 0.31 false alarms on the length null (plain: 0.98)."""
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
    """Weak evidence (Fisher p): keeps a pattern that passed the test and that an active penalty
    travelling with it does not explain away (a rule that can only remove candidates; a retired
    penalty is revived by the permutation test of its own family, penalties.discovery) (shared, Bonferroni,
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
    """Wording and detectors are tested at equal length: the reward net of a smooth curve in word
    count (all of a rollout's replies; a spline fitted within groups, penalties.covariates), in
    the permutation tests, and net of word count in the effect test (`min_effect`, weak
    evidence). A reward model pays for length on a curve of its own (more for not being short,
    saturating); wording that only comes with longer replies is then not paid in itself. Length
    limits are tested as `length_null` says, whatever this says. False
    (the default): wording and detectors on the reward net of relevance alone. Off by default
    though a saturating pay for length lets a word carried by length through (1 of 3 views of
    tests/test_legitimate_pay.py at scale 10): on, a hack whose pay grows with what it adds to
    a reply (a sentence written twice, a paid word inside a phrase) is absorbed by the length
    curve, and 6 tests of tests/test_lexical.py lose their hack (issue 55, left open)."""
    forms: bool = True
    """Test the forms of penalties.forms beside the words (capitals, digits, symbols and emoji,
    repeated punctuation, markdown emphasis, headings, list items, numbered points, several lines,
    paragraphs, questions, exclamations): each a candidate of the wording family, decided by the
    same tests, whose penalty is its regex (issue 56)."""
    families: bool = True
    """Also test families (penalties.families): the content words, openers or closers the reward
    pays most on a seeded half of the view's groups (at least two, at most eight of one class),
    as one pattern that any member shows, tested on the other half alone; and, with a reference,
    the ones of a class that rose most since it (texts alone: the unions of the 2 ... 8 steepest),
    tested on every group; all at `discovery.FAMILY_SHARE` of the proposal's within-group level. A hack written in several
    wordings ("Happy to help further!", "Let me know if you want more.") spreads over its
    members, each too rare for its own test; its penalty is the members' regexes joined, so the
    policy cannot move to another member. False: no families (the wording family then decides
    at that share too)."""
    omnibus: bool = True
    """Test, at each proposal, whether the replies' surface form predicts the reward within groups
    at all, beyond relevance, length and a finished ending (penalties.omnibus: cross-fitted ridge
    on hashed word and character n-grams, word shapes and line structure, against the rewards
    permuted within groups), at `discovery.OMNIBUS_SHARE` of the proposal's within-group level
    (the named families share the rest). Where it passes and no named pattern is live, the monitor
    exits 12 and it and the run summary say the reward pays for something in the replies' form
    that no pattern names yet, with the features that carry the fit. It never adds a penalty."""
    relevance_adjusted: bool = True
    """Wording (n-grams, openers, closers) is tested at equal relevance: the reward net of what the
    number of its prompt's vocabulary words a reply uses explains (penalties.relevance: the words
    the replies to that prompt use far more than other prompts' replies; a least-squares fit within
    groups, beside word count when `length_adjusted`), in the permutation tests of both families
    and in the effect tests (`min_effect`, weak evidence); length limits too in the permutation
    tests (issue 55). Detectors keep the plain reward (`off_topic` is relevance itself).
    A reward model pays for taking the prompt up; a template sentence that carries the topic's
    words ("The umbrellas and the rain make it feel busy.") is then not paid for itself, while a
    hack's wording, written whatever the prompt, keeps its pay. False: the plain reward for every pattern. On the discovery benchmark
    (benchmarks/discovery.py, the 48 runs of 2026-12-02, the code of that day): precision 0.85
    and 0.17 false patterns a planted run, 37 of 42 planted shortcuts found; 0.80, 0.24 and 36 of
    42 with False."""
    ending_adjusted: bool = True
    """Every candidate but a detector (wording, forms, length limits, across steps too) is tested
    on the reward net of whether a reply ends a sentence (a least-squares fit within groups beside
    relevance; penalties.discovery.legitimate): any reward pays less for a reply cut off mid-way,
    and the last words of finished replies (a closing word, a closing phrase) or the length that
    finished replies have then travel with that pay without being paid in themselves. The omnibus
    test always holds it. A paid closing formula is still paid against other finished replies.
    False: as before. On the synthetic suite's `ending` null (a reward paying for a finished reply
    alone; benchmarks/discovery_synthetic.py, 42 runs, docs/penalties.md) False alarmed on 18 runs
    (the closing word "side" on 13), True on 1; the paid closing sentence of the held-out `closer`
    kind was found on 13 of 14 runs either way. The effect tests (`min_effect`, weak evidence)
    do not hold it: they can only remove candidates."""
    detectors: list[str] = ["repetition", "echo"]
    """Named detectors (dynalize.penalties.detectors) to test beside word patterns: `repetition`,
    `echo`, `off_topic`, `unfinished`, `doubled_word`, `unbalanced`, `run_on`, `shouting`. Each passes the
    same tests as a word (the permutation test at `fwer`, `min_effect`, coverage, explained-away,
    `drift_p_value`, revival) and becomes a penalty naming its detector, which every judge
    decides locally (an LLM judge never sees it). `off_topic` and `echo` read the conversation each
    reply answers (`penalties.judge.context` must stay true: the build refuses a list that names
    them otherwise, and leaves them out of the default list). The default: `repetition`, a
    degenerate loop (a sentence again and again, one token or one mark repeated) is a hack no
    word pattern names (on the discovery benchmark, benchmarks/discovery.py, the loops were found
    only through phrases that came with them, and missed in 2 of 6 runs, without it); `echo`
    (issue 56: overlap with the prompt), a reply that restates what the user asked, which no
    word pattern names either (the prompt's words differ from prompt to prompt), tested like
    wording on the reward net of relevance (`Detector.relevance_held`: restating a prompt uses
    its words, which a reward may pay for). [] turns detectors off."""
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
    runs_in: Literal["thread", "process"] = "thread"
    """Where a proposal's work runs: `thread` (a worker thread of the training process) or `process`
    (a process of its own, penalties.process: one `python -m dynalize.penalties.worker` child,
    reused, ended with the training process). In a thread, a proposal holds the interpreter lock
    for much of its CPU time, so the training steps it overlaps run slower; in a process it takes
    a core of its own (a GPU node has cores to spare; a machine whose cores training already fills
    gains nothing). Same candidates, same decisions either way; a worker that dies fails that
    proposal (counted, `proposer/failed`) and the next one starts a fresh worker."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        """`fdr` and `fdr_scope` (the names before issue 55: the level is family-wise) still work,
        with a one-line warning."""
        if isinstance(data, dict):
            for old, new in RENAMED.items():
                if old in data:
                    if new in data:
                        raise ValueError(f"penalties.proposer.lexical: both {old} (deprecated) and {new} are set")
                    warnings.warn(f"penalties.proposer.lexical.{old} is deprecated: it is read as {new} "
                                  "(a family-wise error rate)", FutureWarning, stacklevel=2)
                    data = {**{k: v for k, v in data.items() if k != old}, new: data[old]}
        return data


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

    _none_text = field_validator("view_groups", "view_per_group", "view_steps", mode="before")(none_text)

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
    confirm: bool = True
    """Confirm a candidate before it enters the buffer by scoring edited replies with the run's own
    reward (penalties.witness: its pattern removed from replies that show it, put into replies that
    lack it, rewards.rescore): the penalty enters only when the reward pays for the pattern itself;
    a co-traveller is passed over. Only where every other reward term can score edited replies
    (the RM, reward functions; not the rubric term): otherwise a warning
    (`penalties.confirm_unavailable`) and the correlational decision, said so ("not confirmed:
    correlational only"). It runs inside the proposal, in the background: training never waits on
    it; its reward calls are counted (`confirm/reward_calls`). A reward that fails while confirming
    stops the run with one line. In the monitor, `--reward` does this (docs/monitor.md)."""
    confirm_edits: int = Field(32, ge=1)
    """Confirmation edits at most this many replies each way (removing, inserting) per candidate:
    up to 4 x this many replies scored per candidate checked (3 x with an RM alone, whose originals'
    values are taken from their rollouts)."""
    proposer: ProposerConfig = ProposerConfig()
    """Who proposes penalties."""
    judge: JudgeConfig = JudgeConfig()
    """Who judges rollouts against them."""
