"""Confirmation inside a run: the run's own reward as the reward penalties.witness scores edited
replies with (issue 57; penalties.confirm, docs/penalties.md "Confirmation inside a run").

A candidate penalty is confirmed by taking its pattern out of replies that show it and putting
it into replies that lack it, then scoring originals and edits with the reward being hacked. In
a dynalize run that reward is the sum of the run's terms other than the penalties (each term
applies its own weights: the RM's mean over replies, the reward functions' `reward_weights`),
exactly what the proposer's view calls a reply's reward before penalties. `Rescorer` is that sum
as a `penalties.witness.RewardFn`:

- it keeps the rollouts of the batches the proposer's view reads (`remember`, called by the
  penalty term as it observes each batch), indexed as the view lists its replies: (the prompt a
  reply answers, `witness.prompt_of` of its context; the reply);
- a (prompt, edited reply) pair becomes a copy of the original rollout with that reply's text
  replaced (`with_reply`): the same prompt, row columns (`meta`), earlier and later turns; in a
  multi-turn rollout only that reply changes (the prompt of a reply is the conversation before
  it), so its reward is the rollout's, with the edit in it;
- the copies are scored by each term's `rescore` (RewardTerm.rescorable: the RM term, the reward
  functions term) on the run's event loop, through the same engines as training (the call comes
  from the proposal's worker thread: `anyio.from_thread.run` with the loop's token), and summed.

Training never waits on it: the proposal runs in the background and the witness inside it; a
proposal cancelled at the run's end stops at its next reward call. A rollout no longer kept (a
proposal restarted from a checkpoint, or the first proposals after a resume, whose views hold
batches the resumed process never saw) cannot be rebuilt: the witness edits only the replies
whose rollouts are kept (`knows`), and a check left with none is `not_confirmable`, said so. Any other failure of the reward
fails the proposal and stops the run with one line (ConfirmingProposer.failure).

`confirm_in_run` wires it where the run's terms are built (dynalize.build): on by default
(`penalties.confirm`), unavailable, with one warning, where a term cannot score edited replies
(the rubric term), the penalties then saying "not confirmed: correlational only (why)".
"""

from __future__ import annotations

import math
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import structlog

from ..penalties.views import contexts_of
from ..penalties.witness import NotScorable, prompt_of
from ..types import Batch, Message, Rollout
from .base import RewardTerm

if TYPE_CHECKING:
    from .penalties import PenaltyTerm

log = structlog.get_logger("dynalize.rewards.rescore")

NOT_KEPT = ("the rollouts it read are no longer kept (a proposal restarted from a checkpoint): edited replies "
            "cannot be rebuilt")


def reply_parts(r: Rollout) -> list[str]:
    """The replies of `r` as the proposer's view lists them (ViewSample.parts)."""
    return list(r.replies) if len(r.replies) > 1 else [r.text]


def reply_contexts(r: Rollout) -> list[str | None]:
    """What each of `reply_parts(r)` answers, as the view keeps it (views.contexts_of), or None each
    where its turns do not line up with its replies."""
    contexts = contexts_of(r)
    n = len(reply_parts(r))
    return contexts if len(contexts) == n else [None] * n


def with_reply(rollout: Rollout, k: int, text: str) -> Rollout:
    """A copy of `rollout` whose `k`-th policy reply reads `text`: the same prompt (messages and
    meta: a row's columns), the other replies and user turns kept; scores, info, reward and
    advantage cleared (a row to score, never to train on). Its token fields are the original's
    when the text is unchanged, else empty (an edited reply was never tokenized)."""
    replies = list(rollout.replies) or [""]
    same = replies[k] == text
    replies[k] = text
    turns, seen = [], 0
    for m in rollout.turns:
        if m.role == "assistant":
            if seen == k:
                m = Message("assistant", text)
            seen += 1
        turns.append(m)
    keep = {} if same else {"completion_ids": [], "logprobs": [], "loss_mask": []}
    return replace(rollout, replies=replies, turns=turns, scores={}, info={}, reward=0.0, advantage=0.0,
                   **keep)  # type: ignore[arg-type]


class Rescorer:
    """The run's reward before penalties (`terms`, summed) as a witness RewardFn (module docstring)."""

    takes_originals = True
    """The witness passes `originals=`: the reply each completion is an edit of (how its rollout is found)."""

    def __init__(self, terms: list[RewardTerm]):
        self.terms = terms
        self.calls = 0
        """Replies scored so far (edits, and originals whose value is not taken from the rollout)."""
        self.last_scored = 0
        """Replies the latest call scored (witness.Witness counts them as the check's reward calls)."""
        self._batches: dict[int, Batch] = {}
        self._lock = threading.Lock()
        self._index: dict[tuple[str, str], tuple[Rollout, int]] = {}
        self._indexed: tuple[tuple[int, int], ...] = ()
        self._token: Any = None
        self._loop_thread: int | None = None
        self._step = 0

    def remember(self, batch: Batch, keep_from: int | None = None) -> None:
        """Keep `batch`'s rollouts (edited copies are built from them), and forget the batches
        before step `keep_from` (those no view that may still be confirmed reads). Called on the
        run's event loop, whose token the reward calls go back through."""
        if self._token is None:
            self._token, self._loop_thread = anyio.lowlevel.current_token(), threading.get_ident()
        with self._lock:
            self._batches[batch.step] = batch
            self._step = max(self._step, batch.step)
            if keep_from is not None and (old := [s for s in self._batches if s < keep_from]):
                for step in old:
                    del self._batches[step]
                self._index, self._indexed = {}, ()  # no reference left to the batches forgotten

    def kept(self) -> list[int]:
        """The steps of the batches kept."""
        with self._lock:
            return sorted(self._batches)

    def _lookup(self) -> dict[tuple[str, str], tuple[Rollout, int]]:
        """(prompt, reply) -> (rollout, reply index) over the kept batches, built in the proposal's
        thread (off the loop) when they changed."""
        with self._lock:
            batches, index, indexed = dict(self._batches), self._index, self._indexed
        steps = tuple((step, id(b)) for step, b in sorted(batches.items()))  # a batch replaced is new
        if steps != indexed:
            index = {}
            for step, _ in steps:
                for r in batches[step].rollouts:
                    for k, (reply, ctx) in enumerate(zip(reply_parts(r), reply_contexts(r))):
                        index.setdefault((prompt_of(ctx), reply), (r, k))
            with self._lock:
                if tuple((step, id(b)) for step, b in sorted(self._batches.items())) == steps:
                    self._index, self._indexed = index, steps
        return index

    def knows(self, prompt: str, reply: str) -> bool:
        """Whether the rollout of `reply` to `prompt` is kept (the witness edits only those: after
        a resume, a view's replies of batches before it are not)."""
        return (prompt, reply) in self._lookup()

    def rows(self, prompts: list[str], completions: list[str], originals: list[str] | None = None) -> list[Rollout]:
        """Each completion as an edited copy of the kept rollout whose reply (`originals[i]`, or
        the completion itself) answers `prompts[i]`; NotScorable when one is not kept."""
        return [with_reply(r, k, completion) for (r, k), completion in
                zip(self._found(prompts, completions, originals), completions)]

    def _found(self, prompts: list[str], completions: list[str],
               originals: list[str] | None) -> list[tuple[Rollout, int]]:
        """The kept (rollout, reply index) each completion is an edit of; NotScorable when one is not kept."""
        index = self._lookup()
        out = []
        for prompt, original in zip(prompts, originals or completions, strict=True):
            if (found := index.get((prompt, original))) is None:
                raise NotScorable(NOT_KEPT)
            out.append(found)
        return out

    def recorded(self, r: Rollout) -> float | None:
        """`r`'s reward before penalties as the run scored it, where every term's rescoring would
        give it again (RewardTerm.rescore_repeats_score) and recorded a finite value; else None."""
        values = [r.scores.get(t.name) for t in self.terms]
        if not all(t.rescore_repeats_score for t in self.terms) or not all(
                isinstance(v, int | float) and math.isfinite(v) for v in values):
            return None
        return math.fsum(values)  # type: ignore[arg-type]

    def __call__(self, prompts: list[str], completions: list[str], originals: list[str] | None = None) -> list[float]:
        """The reward before penalties of each (prompt, completion), from the proposal's worker
        thread: the terms' `rescore` run on the run's event loop. An unchanged reply's value is
        taken from its rollout where the terms would repeat it (`recorded`): only edits are scored."""
        check_cancelled()
        found = self._found(prompts, completions, originals)
        scores = [self.recorded(r) if completion == original else None
                  for (r, _), completion, original in zip(found, completions, originals or completions)]
        todo = [i for i, x in enumerate(scores) if x is None]
        if todo:
            if self._token is None or threading.get_ident() == self._loop_thread:
                raise RuntimeError("the run's reward is called from the proposal's worker thread, never from the "
                                   "event loop's own thread")
            rows = [with_reply(*found[i], completions[i]) for i in todo]
            for i, x in zip(todo, anyio.from_thread.run(self.score, Batch(self._step, [rows]), token=self._token)):
                scores[i] = x
        self.calls += len(todo)
        self.last_scored = len(todo)
        return scores  # type: ignore[return-value]

    async def score(self, batch: Batch) -> list[float]:
        """Σ over the terms of each one's `rescore` of `batch`."""
        per = [await t.rescore(batch) for t in self.terms]
        for t, values in zip(self.terms, per):
            if len(values) != len(batch.rollouts):
                raise RuntimeError(f"reward term {t.name!r} gave {len(values)} values for {len(batch.rollouts)} "
                                   f"edited replies")
        return [math.fsum(v) for v in zip(*per)]


def check_cancelled() -> None:
    """Raise the loop's cancellation in a worker thread whose proposal was cancelled (the run's
    end: `PenaltyTerm.finish`); nothing outside an anyio worker thread."""
    try:
        anyio.from_thread.check_cancelled()
    except RuntimeError:  # not an anyio worker thread (NoEventLoopError): nothing to check
        pass


def unavailable(terms: list[RewardTerm]) -> str | None:
    """Why the run's reward before penalties cannot score edited replies, or None."""
    if not terms:
        return "the run has no reward term besides the penalties"
    return next((why for t in terms if (why := t.not_rescorable())), None)


def confirm_in_run(term: "PenaltyTerm", others: list[RewardTerm]) -> Rescorer | None:
    """Put confirmation between `term`'s proposer and its buffer, scored by `others` (the run's
    other terms), when `penalties.confirm` and every one of them can rescore; else warn once
    (`penalties.confirm_unavailable`) and mark what the term adds "not confirmed: correlational
    only (why)". Returns the Rescorer, or None."""
    from ..penalties.discovery import level
    from ..penalties.witness import ConfirmingProposer, Witness

    cfg = term.cfg
    if not cfg.confirm:
        return None
    if why := unavailable(others):
        log.warning("penalties.confirm_unavailable", reason=why,
                    said="discovered penalties keep the correlational decision (not confirmed: correlational only); "
                         "set penalties.confirm: false to silence this")
        term.unconfirmed = f"confirmation unavailable: {why}"
        return None
    rescorer = Rescorer(others)
    lexical = cfg.proposer.lexical
    term.proposer = ConfirmingProposer(term.proposer, Witness(rescorer, cfg.confirm_edits, seed=term.seed),
                                       lambda k: level(lexical, k))
    term.rescorer = rescorer
    return rescorer
