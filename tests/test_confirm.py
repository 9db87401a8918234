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
    bar = result.co_travellers[0]["confirmation"]
    with_control = bar["deletions"] + bar["insertions"]
    # the opener: 32 edits each way and their replies; the bar: each edit with a control, 3 replies
    assert result.rejected == {"co_traveller": 1} and result.reward_calls == 128 + 3 * with_control


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


def varied_lengths(n: int = 96, seed: int = 0) -> ProposerView:
    """Replies of 3 to 16 sentences (about 8 to 70 words) on 24 prompts."""
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        text = " ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 5))).capitalize() + "."
                        for _ in range(rng.randint(2, 16)))
        samples.append(ViewSample(f"s{i:03d}", i // 4, text, 0.0, "+" if i % 2 else "-",
                                  contexts=[f"[user]\nprompt {i // 4}"]))
    return ProposerView(step=5, samples=samples)


def by_length(pay):
    """A reward paying `pay(words)` for a reply's length alone, with noise."""
    return lambda prompts, completions: [pay(len(c.split())) + noise(p, c) for p, c in zip(prompts, completions)]


def saturating(words: int) -> float:
    return 2.0 * (1.0 - 2.718281828 ** (-words / 15))


@pytest.mark.parametrize("limit", [10, 20, 30])
def test_a_length_bar_on_a_reward_that_pays_for_not_being_short_is_not_confirmed(limit):
    # issue 55's length null: padding earns, but no more past the bar than before it (before this
    # control, "longer than 10 words" was confirmed on the calibration suite's length null)
    c = Witness(by_length(saturating)).check(Candidate("long", "d", regex=length_feature(limit).regex),
                                             varied_lengths(), alpha=0.01)
    assert c.state == REJECTED, c.to_dict()
    assert c.deletions + c.insertions >= 24, c.to_dict()


@pytest.mark.parametrize("extra", [lambda w: 0.8 * (w > 30), lambda w: 0.08 * max(0, w - 30)],
                         ids=["step", "ramp"])
def test_a_length_bar_the_reward_pays_for_beside_that_curve_is_confirmed(extra):
    c = Witness(by_length(lambda w: saturating(w) + extra(w))).check(
        Candidate("long", "d", regex=length_feature(30).regex), varied_lengths(), alpha=0.01)
    assert c.state == CONFIRMED, c.to_dict()


def test_a_length_control_stops_short_of_the_bar_on_either_side():
    from dynalize.penalties.edits import delete, form_of, insert, length_control, words_in
    form = form_of(length_feature(20).regex)
    short = "Cats sleep near warm stoves. They wake at dawn."
    padded = insert(form, short)
    control = length_control(form, short, padded)
    assert words_in(short) < words_in(control) <= 20 < words_in(padded) and control.startswith(short)
    long = " ".join(["Cats sleep near warm stoves and wake at dawn."] * 4)  # 36 words
    trimmed = delete(form, long)
    control = length_control(form, long, trimmed)
    assert words_in(control) <= 10 < words_in(trimmed) <= 20  # 16 past the bar: 16 below it, or half of it
    assert length_control(form, "Cats sleep.", insert(form, "Cats sleep.")) is not None
    assert length_control(form_of(length_feature(3).regex), "Cats sleep near.", insert(form_of(
        length_feature(3).regex), "Cats sleep near.")) is None  # no padding sentence fits under 3 words
