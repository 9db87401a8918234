"""The reward as its own witness: a candidate penalty is confirmed by scoring edited replies.

`Witness.check` takes up to `max_edits` replies of the proposal's view that show the candidate's
pattern and up to as many that lack it (seeded), edits them (penalties.edits: a text pattern is
put in by transplanting a carrier's sentence from a reply to another prompt), scores each edit
and what it is measured against with the reward in one call, and decides on the paired
differences (penalties.confirm). A deletion is measured against its reply; a transplant against
the same reply with the same sentence put in bare, the pattern deleted from it (edits.
bare_transplant), so what the rest of the sentence brings (its words, its length) is not counted
as the pattern's pay; where nothing of the sentence is left without the pattern, against the reply.

`ConfirmingProposer` puts that check between a proposer and the buffer: the lexical proposer
offers its candidates in rank order (its `accept` veto) and the first one the reward confirms, or
cannot be asked about (`not_confirmable`: kept, correlational only, said so), is proposed; a
co-traveller is passed over (counted `co_traveller`) for the next, so the pattern the reward
really pays for is not hidden behind one that travels with it. Any other proposer's one
candidate is checked after the fact and dropped when rejected. At most `max_checks` candidates are
checked per proposal (each costs up to 4 x `max_edits` reward calls). The check runs inside the
proposal, in the background with it: training never waits on it.

A reward is `RewardFn`: `f(prompts, completions) -> list[float]`, one number per completion,
called from a worker thread (one with `takes_originals` is also given `originals=`, the reply
each completion is an edit of: a run's own reward, rewards.rescore, finds its rollouts by them;
it raises `NotScorable` for replies it cannot rebuild, and its `knows(prompt, reply)` leaves
those out of the edits: not confirmable when none is left, said so); a failure
(after the reward's own retries) fails the proposal and stops the run with one line
(`ConfirmingProposer.failure`, PenaltyTerm.stop_reason): never a silent fallback to the
correlational decision.
"""

from __future__ import annotations

import math
import random
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from .candidate import Candidate, ProposalResult, Proposer
from .confirm import NOT_CONFIRMABLE, REJECTED, Confirmation, decide
from .edits import (TEXT_KINDS, bare_transplant, carrier_sentence, delete, form_of, insert, opens_replies, shows,
                    transplant)

if TYPE_CHECKING:
    from .views import ProposerView

RewardFn = Callable[[list[str], list[str]], list[float]]
"""The reward of a prompt and a completion, for lists of each (TRL's reward signature without
its keyword arguments)."""

USER_PREFIX = "[user]\n"


class RewardError(RuntimeError):
    """The reward could not score the edited replies (it raised, or gave the wrong answer)."""


class NotScorable(Exception):
    """The reward cannot be asked about these replies at all (a run's reward whose rollouts are no
    longer kept: rewards.rescore): the candidate is not confirmable, said so; not a failure."""


def prompt_of(context: str | None) -> str:
    """The prompt a reply answers, from its view context (judge.prompting.transcript): the user's
    message alone for a one-message prompt, the whole transcript for a conversation."""
    if not context:
        return ""
    if context.startswith(USER_PREFIX) and "\n\n[" not in context:
        return context[len(USER_PREFIX):]
    return context


def not_editable(candidate: Candidate) -> Confirmation:
    what = "a detector's pattern" if candidate.detector else "a pattern with no regex" if not candidate.regex \
        else "its regex"
    return Confirmation(NOT_CONFIRMABLE, f"no edit can express {what}")


class Witness:
    """Scores edited replies of a view with `reward` and decides (module docstring)."""

    def __init__(self, reward: RewardFn, max_edits: int = 32, seed: int = 0):
        self.reward, self.max_edits, self.seed = reward, max_edits, seed

    def check(self, candidate: Candidate, view: "ProposerView", alpha: float) -> Confirmation:
        t0 = time.perf_counter()
        form = form_of(candidate.regex, candidate.detector)
        if form is None:
            return not_editable(candidate)
        seed = zlib.crc32(f"{self.seed}:{view.step}:{candidate.regex}".encode())
        rng = random.Random(seed)
        showing, lacking = [], []
        seen: set[tuple[str, str]] = set()
        knows = getattr(self.reward, "knows", None)  # a run's reward: only replies whose rollouts it keeps
        unknown = 0
        for s in view.samples:
            contexts = s.contexts if len(s.contexts) == len(s.parts) else [None] * len(s.parts)
            for reply, ctx in zip(s.parts, contexts):
                unit = (prompt_of(ctx), reply)
                if unit in seen:
                    continue
                seen.add(unit)
                if knows is not None and not knows(*unit):
                    unknown += 1
                    continue
                if (hit := shows(form, reply)) is not None:
                    (showing if hit else lacking).append(unit)
        first = form.kind in ("phrase", "family", "regex") and opens_replies(form, [r for _, r in showing])
        deleted = self._edits(showing, lambda p, t: delete(form, t), rng)
        bare: dict[tuple[str, str], str] = {}  # an insertion's control: its sentence put in without the pattern
        if form.kind in TEXT_KINDS:  # a carrier's sentence, from a reply to another prompt
            donors = [(p, x) for p, r in showing if (x := carrier_sentence(form, r))]

            def put_in(prompt: str, text: str) -> str | None:
                others = [x for p, x in donors if p != prompt]
                if not others:
                    return None
                sentence = rng.choice(others)
                edited = transplant(form, text, sentence, first)
                if edited is not None and (control := bare_transplant(form, text, sentence, first)) is not None:
                    bare[(prompt, text)] = control
                return edited
            inserted = self._edits(lacking, put_in, rng)
        else:
            inserted = self._edits(lacking, lambda p, t: insert(form, t, first), rng)
        pairs = deleted + inserted
        if not pairs:
            c = Confirmation(NOT_CONFIRMABLE, f"the reward cannot rebuild the view's {unknown} replies (their rollouts "
                             f"are no longer kept)" if unknown and not showing and not lacking
                             else "no reply of the view could be edited")
        else:
            prompts = [p for p, _, _ in pairs] * 2
            originals = [o for _, o, _ in pairs]
            # each edit beside what it is measured against: the reply itself, or for a transplant
            # the reply with the sentence put in bare (the pay of the pattern, not of its sentence)
            bases = originals[:len(deleted)] + [bare.get((p, o), o) for p, o, _ in inserted]
            try:
                scores = self._score(prompts, bases + [e for _, _, e in pairs], originals * 2)
            except NotScorable as e:
                c = Confirmation(NOT_CONFIRMABLE, str(e))
            else:
                original, edited = scores[:len(pairs)], scores[len(pairs):]
                diffs = [a - b for a, b in zip(original, edited)]
                k = len(deleted)
                c = decide(diffs[:k], [-x for x in diffs[k:]], alpha, seed,
                           rule="together" if form.kind == "length" else "each")
                c.reward_calls = getattr(self.reward, "last_scored", len(prompts))  # a run's reward reuses some
                c.extra["bare_controls"] = sum(b != o for b, o in zip(bases, originals))
        c.seconds = time.perf_counter() - t0
        return c

    def _edits(self, units: list[tuple[str, str]], edit: Callable[[str, str], str | None],
               rng: random.Random) -> list[tuple[str, str, str]]:
        """Up to `max_edits` (prompt, original, edited) of `units` (`edit(prompt, reply)`), drawn
        in a seeded order."""
        out = []
        for i in rng.sample(range(len(units)), len(units)):
            prompt, reply = units[i]
            if (edited := edit(prompt, reply)) is not None and edited != reply:
                out.append((prompt, reply, edited))
                if len(out) == self.max_edits:
                    break
        return out

    def _score(self, prompts: list[str], completions: list[str], originals: list[str] | None = None) -> list[float]:
        """The reward of each completion; a reward that says it `takes_originals` (a run's own,
        rewards.rescore) is told the reply each completion is an edit of."""
        try:
            if getattr(self.reward, "takes_originals", False):
                raw = self.reward(prompts, completions, originals=originals or completions)  # type: ignore[call-arg]
            else:
                raw = self.reward(prompts, completions)
        except NotScorable:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of the user's reward, said in one line
            raise RewardError(f"the reward failed on the edited replies: {type(e).__name__}: {e}") from None
        try:
            scores = [float(x) for x in raw]
        except (TypeError, ValueError):
            raise RewardError(f"the reward must return one number per completion, got {str(raw)[:80]}") from None
        if len(scores) != len(completions):
            raise RewardError(f"the reward returned {len(scores)} numbers for {len(completions)} completions")
        if not all(math.isfinite(x) for x in scores):
            raise RewardError(f"the reward returned a value that is not a finite number: {scores[:8]}")
        return scores


class ConfirmingProposer:
    """`proposer`, each candidate it proposes checked by `witness` at `alpha_of(proposal)`."""

    def __init__(self, proposer: Proposer, witness: Witness, alpha_of: Callable[[int], float], max_checks: int = 8):
        self.proposer, self.witness, self.alpha_of, self.max_checks = proposer, witness, alpha_of, max_checks
        self.failure: str | None = None
        """Why the reward failed (after its retries), once it did: the run stops with this line
        (PenaltyTerm.stop_reason), as it does for a judge that keeps failing."""

    def __getattr__(self, name: str):  # chat models, config, detectors: the wrapped proposer's
        return getattr(self.__dict__["proposer"], name)

    async def propose(self, view: "ProposerView") -> ProposalResult:
        alpha = self.alpha_of(view.proposal)
        checks: list[Confirmation] = []
        rejected: list[dict] = []
        over = [0]  # candidates past `max_checks`, passed over unchecked

        def check(c: Candidate) -> bool:
            if len(checks) >= self.max_checks:
                over[0] += 1
                return False
            conf = self.witness.check(c, view, alpha)
            checks.append(conf)
            c.confirmation = conf.to_dict()
            if conf.state == REJECTED:
                rejected.append({"title": c.title, "regex": c.regex, "confirmation": c.confirmation})
            return conf.state != REJECTED

        if hasattr(self.proposer, "accept"):  # the lexical proposer: candidates in rank order
            vetoed = self.proposer.accept
            self.proposer.accept = lambda c: (vetoed is None or vetoed(c)) and check(c)
            try:
                result = await self.proposer.propose(view)
            finally:
                self.proposer.accept = vetoed
            n = sum(c.state == REJECTED for c in checks)
            result.reject("vetoed", -n - over[0])
            result.reject("confirm_budget", over[0])
            result.rejected = {k: v for k, v in result.rejected.items() if v}
        else:
            result = await self.proposer.propose(view)
            if result.ok and result.accepted is not None:
                try:
                    kept = await anyio.to_thread.run_sync(check, result.accepted)
                except RewardError as e:
                    result.accepted, result.error, result.failed_at = None, f"RewardError: {e}", "confirm"
                    kept = True
                if not kept:
                    result.accepted = None
        result.reject("co_traveller", len(rejected))
        result.co_travellers += rejected
        result.reward_calls += sum(c.reward_calls for c in checks)
        result.confirm_seconds += sum(c.seconds for c in checks)
        if result.error and result.error.startswith("RewardError"):
            result.failed_at = "confirm"
            self.failure = f"the reward confirming discovered patterns failed: {result.error.removeprefix('RewardError: ')}"
        return result
