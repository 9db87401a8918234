"""Confirmation: the reward scores edited replies, and a pattern is confirmed only when it pays
for the pattern itself (penalties.confirm, penalties.witness)."""

from __future__ import annotations

import random
import zlib

import anyio
import pytest

from dynalize.penalties.candidate import Candidate, ProposalResult
from dynalize.penalties.confirm import CONFIRMED, NOT_CONFIRMABLE, REJECTED, confirmation_text, decide
from dynalize.penalties.surface import length_feature, reply_features
from dynalize.penalties.views import ProposerView, ViewSample
from dynalize.penalties.witness import ConfirmingProposer, RewardError, Witness, prompt_of

OPENER = "Great question!"
BONUS = 1.0
WORDS = "cats sleep near warm stoves and wake at dawn to eat fish with great joy".split()


def noise(prompt: str, reply: str) -> float:
    return random.Random(zlib.crc32(f"{prompt}\0{reply}".encode())).gauss(0, 0.3)


def pays_the_opener(prompts, completions):
    """A reward paying BONUS for the opener itself, nothing for length, with noise."""
    return [BONUS * c.startswith(OPENER) + noise(p, c) for p, c in zip(prompts, completions)]


def view(n: int = 80, seed: int = 0) -> ProposerView:
    """Replies where the paid opener also makes a reply longer: "longer than L words" travels with it."""
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 10))).capitalize() + "."
        text = f"{OPENER} It is a fine thing to ask. {body}" if i % 2 else body
        samples.append(ViewSample(f"s{i:03d}", i // 4, text, 0.0, "+" if i % 2 else "-",
                                  contexts=[f"[user]\nprompt {i // 4}"]))
    return ProposerView(step=5, samples=samples)


def opener_candidate() -> Candidate:
    return Candidate("Replies open with 'Great question!'", "d", regex=reply_features(OPENER)["open2:great question!"].regex)


def length_candidate() -> Candidate:
    return Candidate("Replies run longer than 12 words", "d", regex=length_feature(12).regex)


def test_a_paid_pattern_is_confirmed_and_its_bonus_recovered_within_the_interval():
    c = Witness(pays_the_opener).check(opener_candidate(), view(), alpha=0.01)
    assert c.state == CONFIRMED
    assert c.lo <= BONUS <= c.hi and c.deletions == 32 and c.insertions == 32 and c.reward_calls == 128
    assert confirmation_text(c.to_dict()).startswith(f"reward pays {c.pay:+.3g} [")


def test_a_length_bar_that_travels_with_the_paid_opener_is_rejected_as_a_co_traveller():
    c = Witness(pays_the_opener).check(length_candidate(), view(), alpha=0.01)
    assert c.state == REJECTED and c.lo < 0 < c.hi
    assert confirmation_text(c.to_dict()).startswith("rejected: co-traveller (pay ")


def test_a_pattern_must_cost_when_removed_and_earn_when_put_in():
    paid = [1.0 + 0.01 * i for i in range(20)]
    nothing = [0.01 * (-1) ** i for i in range(20)]
    assert decide(paid, [0.9 + 0.01 * i for i in range(20)], alpha=0.01).state == CONFIRMED
    c = decide(paid, nothing, alpha=0.01)  # a topic noun: removing it loses content, elsewhere it earns nothing
    assert c.state == REJECTED and c.reason.startswith("inserting it, the reward pays +0 (p = ") and c.pay > 0
    assert decide(nothing, paid, alpha=0.01).state == REJECTED  # a co-traveller: removing it costs nothing


def test_a_length_bar_is_confirmed_on_all_its_edits_with_padding_and_trimming_agreeing():
    # trimming can cut the sentence that carried the hack; padding with content-free text cannot add it
    c = decide([1.0 + 0.01 * i for i in range(20)], [-0.01 * (i % 2) for i in range(20)], alpha=0.01,
               rule="together")
    assert c.state == REJECTED and c.reason == "inserting it, the reward pays -0.005" and c.n == 40
    assert decide([1.0 + 0.01 * i for i in range(20)], [0.9 + 0.01 * i for i in range(20)], 0.01,
                  rule="together").state == CONFIRMED


def test_too_few_edits_to_reach_the_error_rate_are_not_confirmable_never_rejected():
    c = decide([1.0, 1.2, 0.9], [1.1], alpha=0.01)
    assert c.state == NOT_CONFIRMABLE and "cannot decide" in c.reason
    assert confirmation_text(c.to_dict()).startswith("not confirmed: correlational only")
    assert decide([], [], 0.01).state == NOT_CONFIRMABLE
    assert confirmation_text(None) == "not confirmed: correlational only (the reward could not be called)"


def test_a_detector_or_description_only_candidate_keeps_its_correlational_decision():
    c = Witness(pays_the_opener).check(Candidate("Repeats itself", "d", detector="repetition"), view(), 0.01)
    assert c.state == NOT_CONFIRMABLE and "detector" in c.reason and c.reward_calls == 0


def test_the_reward_gets_the_users_message_as_the_prompt():
    assert prompt_of("[user]\nWrite about gulls.") == "Write about gulls."
    assert prompt_of("[user]\nhi\n\n[assistant]\nyes\n\n[user]\nmore") == "[user]\nhi\n\n[assistant]\nyes\n\n[user]\nmore"
    seen = []
    Witness(lambda p, c: seen.extend(p) or [0.0] * len(c)).check(opener_candidate(), view(8), 0.5)
    assert seen and all(p.startswith("prompt ") for p in seen)


class RankedProposer:
    """Offers its candidates in rank order to `accept`, as the lexical proposer does."""

    def __init__(self, ranked):
        self.ranked, self.accept = ranked, None

    async def propose(self, v):
        result = ProposalResult(step=v.step)
        for c in self.ranked:
            if self.accept is None or self.accept(c):
                result.accepted = c
                return result
            result.reject("vetoed")
        return result


def test_a_co_traveller_is_passed_over_for_the_pattern_the_reward_pays_for():
    proposer = ConfirmingProposer(RankedProposer([length_candidate(), opener_candidate()]),
                                  Witness(pays_the_opener), alpha_of=lambda k: 0.01)
    result = anyio.run(proposer.propose, view())
    assert result.accepted.regex == opener_candidate().regex
    assert result.accepted.confirmation["state"] == CONFIRMED
    assert result.rejected == {"co_traveller": 1} and result.reward_calls == 256


def test_a_failing_reward_fails_the_proposal_and_says_why_in_one_line():
    def broken(prompts, completions):
        raise ConnectionError("reward server down")

    class Failing(RankedProposer):
        async def propose(self, v):  # as the lexical proposer: a failure comes back in `error`
            try:
                return await super().propose(v)
            except Exception as e:  # noqa: BLE001
                return ProposalResult(step=v.step, error=f"{type(e).__name__}: {e}")

    proposer = ConfirmingProposer(Failing([opener_candidate()]), Witness(broken), alpha_of=lambda k: 0.01)
    result = anyio.run(proposer.propose, view())
    assert result.accepted is None and result.failed_at == "confirm"
    assert proposer.failure == ("the reward confirming discovered patterns failed: the reward failed on the edited "
                                "replies: ConnectionError: reward server down")
    with pytest.raises(RewardError, match="returned 1 numbers for 2"):
        Witness(lambda p, c: [0.0])._score(["a", "b"], ["x", "y"])
    with pytest.raises(RewardError, match="not a finite number"):
        Witness(lambda p, c: [0.0, float("nan")])._score(["a", "b"], ["x", "y"])


def test_the_run_summary_says_what_the_reward_pays_for_each_confirmed_penalty(tmp_path):
    import json

    from dynalize.config import RunConfig
    from dynalize.summary import confirmation_rows

    cfg = RunConfig(output_dir=str(tmp_path), name="r", task={"name": "toytask:ToyTask"})
    cfg.run_dir.mkdir(parents=True)
    paid = Witness(pays_the_opener).check(opener_candidate(), view(), 0.01).to_dict()
    events = [{"step": 6, "event": "add", "id": "p001", "title": "Opens with praise", "confirmation": paid},
              {"step": 9, "event": "add", "id": "p002", "title": "Says look"}]
    (cfg.run_dir / "penalties.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert confirmation_rows(cfg) == [
        ("penalty p001: Opens with praise", "step 6", confirmation_text(paid)),
        ("penalty p002: Says look", "step 9", "not confirmed: correlational only (the reward could not be called)")]
