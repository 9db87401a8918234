"""Confirmation inside a TRL run (issue 57; dynalize.trl.confirm): `Penalties` driven as
GRPOTrainer drives it, the script's reward functions scoring replies edited to remove or add a
candidate's pattern, with the dataset's columns and TRL's trainer_state, before the candidate
enters the buffer. The world and its reward functions are tests/confirmworld.py's."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import structlog

pytest.importorskip("trl")

import confirmworld as W  # noqa: E402
from dynalize.penalties.confirm import CONFIRMED, confirmation_text  # noqa: E402
from dynalize.penalties.witness import ConfirmingProposer  # noqa: E402
from dynalize.trl import Penalties  # noqa: E402
from dynalize.trl.callback import PenaltiesFailed  # noqa: E402

SETTINGS = {"every": 1, "sync": True}
GROUP = 8


@pytest.fixture(autouse=True)
def _fresh():
    W.SEEN.clear()
    W.CALLS.clear()


def step_inputs(step: int, planted: str, state, chat: bool = False) -> dict:
    """One TRL reward call: 12 prompts x 8 completions, every other one carrying `planted`, and the
    dataset's column `topic`."""
    prompts, completions, topics = [], [], []
    for t in W.TOPICS:
        for i in range(GROUP):
            text = W.reply(t, step * 100 + i, planted)
            prompts.append([{"role": "user", "content": f"Write about the {t}."}] if chat else f"Write about the {t}.")
            completions.append([{"role": "assistant", "content": text}] if chat else text)
            topics.append(t)
    return {"prompts": prompts, "completions": completions, "completion_ids": [[1, 2]] * len(prompts),
            "topic": topics, "trainer_state": state}


def train(p: Penalties, out: Path, planted: str, steps: int = 2, chat: bool = False) -> None:
    """Drive `p` over `steps` TRL steps as GRPOTrainer does (functions, then the penalties, then
    the step's end); PenaltiesFailed as on_step_end raises it."""
    state = SimpleNamespace(global_step=0)
    args = SimpleNamespace(reward_weights=None, num_generations=GROUP, output_dir=str(out))
    p.on_train_begin(args, state, SimpleNamespace())
    try:
        for step in range(steps):
            state.global_step = step
            kwargs = step_inputs(step, planted, state, chat)
            for f in p.reward_funcs:
                f(**kwargs)
            p.on_step_end(args, state, SimpleNamespace(should_training_stop=False))
    finally:
        p.on_train_end(args, state, SimpleNamespace())


SEEN_ROWS: list[tuple[str, str, object]] = []
LOCKED: list[bool] = []


def pays_indeed_by_topic(prompts, completions, topic, trainer_state, **kwargs):
    """confirmworld's pays_indeed, recording each call's column, prompt and trainer_state, and
    whether the callback's lock was held."""
    LOCKED.append(PENALTIES[0].lock.locked())
    for p, t in zip(prompts, topic):
        SEEN_ROWS.append((p if isinstance(p, str) else p[-1]["content"], t, trainer_state))
    return W.pays_indeed(prompts, completions)


PENALTIES: list[Penalties] = []


@pytest.mark.parametrize("chat", [False, True])
def test_in_trl_a_penalty_the_reward_functions_pay_for_is_confirmed_with_its_pay(tmp_path, chat):
    SEEN_ROWS.clear(), LOCKED.clear(), PENALTIES.clear()
    p = Penalties([pays_indeed_by_topic], penalties=SETTINGS, html=False)
    PENALTIES.append(p)
    train(p, tmp_path, W.PAID, chat=chat)
    assert isinstance(p.term.proposer, ConfirmingProposer)
    [live] = p.term.buffer.active()
    c = live.history[0]["confirmation"]
    assert "indeed" in live.title.lower() and c["state"] == CONFIRMED and c["lo"] <= 1.0 <= c["hi"]
    assert confirmation_text(c).startswith(f"reward pays {c['pay']:+.3g} [")
    # the functions scored edited replies (the paid sentence put into replies that lacked it) ...
    own = {W.reply(t, i, W.PAID) for t in W.TOPICS for i in range(200)}
    assert [t for t in W.SEEN if W.PAID.split(",")[0] in t and t not in own]
    assert len(W.CALLS) > 2 and W.CALLS[:2] == [96, 96]  # TRL's two calls, then the confirmation's
    # ... each with its row's column and TRL's trainer_state, under the lock TRL's calls hold too
    assert all(f"the {t}." in prompt for prompt, t, _ in SEEN_ROWS) and len(SEEN_ROWS) > 192
    assert all(s is SEEN_ROWS[0][2] for _, _, s in SEEN_ROWS)
    assert all(LOCKED)
    assert p.term.totals["confirm/reward_calls"] == c["reward_calls"] > 0
    [pattern] = json.loads((tmp_path / "dynalize" / "summary.json").read_text())["patterns"]
    assert pattern["confirmed"] == confirmation_text(c)  # what the run folder says of it


def pays_length_alone(prompts, completions, **kwargs):
    """+1 for a reply past 20 words, and nothing else: a deletion that leaves it past 20 changes nothing."""
    W.CALLS.append(len(completions))
    return [float(len(W._text(c).split()) > 20) for c in completions]


def test_in_trl_a_co_traveller_is_not_proposed(tmp_path):
    # the functions pay for length past 20 words; "moreover" comes with the sentence that makes a reply long
    p = Penalties([pays_length_alone], penalties={**SETTINGS, "proposer": {"lexical": {"length": False}}},
                  html=False)
    with structlog.testing.capture_logs() as logs:
        train(p, tmp_path, W.LONG)
    assert not p.term.buffer.active() and not p.term.pending
    rejected = p.term.evidence["co_travellers"]
    assert any("moreover" in c["title"].lower() for c in rejected)
    assert all(c["confirmation"]["state"] == "rejected" for c in rejected)
    said = [e for e in logs if e["event"] == "proposer.co_traveller"]
    assert len(said) == p.term.totals["proposer/rejected/co_traveller"] >= len(rejected)


def test_in_trl_reward_functions_that_fail_while_confirming_stop_training_with_one_line(tmp_path):
    p = Penalties([W.fails_on_edits], penalties=SETTINGS, html=False)
    with pytest.raises(PenaltiesFailed) as e:
        train(p, tmp_path, W.PAID, steps=3)
    said = str(e.value)
    assert "\n" not in said and "the reward confirming discovered patterns failed: " in said
    assert "fails_on_edits" in said and "the scoring server is down" in said
    assert not p.term.buffer.active()  # never a silent fallback to the correlational decision


def reads_ids(prompts, completions, completion_ids, **kwargs):
    return W.pays_indeed(prompts, completions)


def test_in_trl_a_function_that_reads_completion_ids_keeps_the_correlational_decision_and_says_why(tmp_path):
    p = Penalties([reads_ids], penalties=SETTINGS, html=False)
    with structlog.testing.capture_logs() as logs:
        train(p, tmp_path, W.PAID)
    [warned] = [e for e in logs if e["event"] == "penalties.confirm_unavailable"]
    assert "completion_ids" in warned["reason"] and W.CALLS == [96, 96]
    [live] = p.term.buffer.active()
    said = confirmation_text(live.history[0]["confirmation"])
    assert said.startswith("not confirmed: correlational only (confirmation unavailable: reward function 'reads_ids'")


def test_in_trl_confirm_false_calls_the_functions_only_for_trl(tmp_path):
    p = Penalties([W.pays_indeed], penalties={**SETTINGS, "confirm": False}, html=False)
    train(p, tmp_path, W.PAID)
    assert W.CALLS == [96, 96] and not isinstance(p.term.proposer, ConfirmingProposer)
    [live] = p.term.buffer.active()
    assert "confirmation" not in live.history[0]


def without_seconds(value):
    """`value` with every `seconds` field (how long a confirmation took) left out."""
    if isinstance(value, dict):
        return {k: without_seconds(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [without_seconds(v) for v in value]
    return value


def test_in_trl_a_run_resumed_from_a_checkpoint_confirms_as_an_uninterrupted_one(tmp_path):
    straight = Penalties([W.pays_indeed], penalties=SETTINGS, html=False)
    train(straight, tmp_path / "straight", W.PAID, steps=4)
    # the same run, stopped after step 2's checkpoint and resumed from it
    out = tmp_path / "resumed"
    first = Penalties([W.pays_indeed], penalties=SETTINGS, html=False)
    state = SimpleNamespace(global_step=0)
    args = SimpleNamespace(reward_weights=None, num_generations=GROUP, output_dir=str(out))
    first.on_train_begin(args, state, SimpleNamespace())
    for step in range(2):
        state.global_step = step
        for f in first.reward_funcs:
            f(**step_inputs(step, W.PAID, state))
    state.global_step = 2
    (out / "checkpoint-2").mkdir(parents=True)
    first.on_save(args, state, SimpleNamespace())
    first.on_train_end(args, state, SimpleNamespace())
    resumed = Penalties([W.pays_indeed], penalties=SETTINGS, html=False)
    resumed.on_train_begin(args, state, SimpleNamespace())  # global_step 2: reads checkpoint-2
    for step in range(2, 4):
        state.global_step = step
        for f in resumed.reward_funcs:
            f(**step_inputs(step, W.PAID, state))
    resumed.on_train_end(args, state, SimpleNamespace())
    [live] = resumed.term.buffer.active()
    assert live.history[0]["confirmation"]["state"] == CONFIRMED
    assert without_seconds(resumed.term.buffer.to_json()) == without_seconds(straight.term.buffer.to_json())


class TwoRanks:
    """The main process of two (batch.Processes): the other rank's part of each gather is the
    second half of the step's groups, scored by confirmworld's pays_indeed, with its columns."""

    rank, count, main = 0, 2, True
    other: list = []

    def gather(self, value):
        return [value, TwoRanks.other.pop(0)]

    def broadcast(self, value):
        return value


def test_in_trl_with_two_processes_the_other_rank_s_rows_are_confirmed_with_their_own_columns(tmp_path, monkeypatch):
    import dynalize.trl.callback as callback

    SEEN_ROWS.clear(), LOCKED.clear(), PENALTIES.clear()
    monkeypatch.setattr(callback, "Processes", TwoRanks)
    p = Penalties([pays_indeed_by_topic], penalties=SETTINGS, html=False)
    PENALTIES.append(p)
    state = SimpleNamespace(global_step=0)
    args = SimpleNamespace(reward_weights=None, num_generations=GROUP, output_dir=str(tmp_path))
    p.on_train_begin(args, state, SimpleNamespace())
    half = 6 * GROUP  # rank 0: the first 6 topics' groups; rank 1: the other 6
    for step in range(2):
        state.global_step = step
        kwargs = step_inputs(step, W.PAID, state)
        mine = {k: v[:half] if isinstance(v, list) else v for k, v in kwargs.items()}
        theirs = {k: v[half:] for k, v in kwargs.items() if isinstance(v, list)}
        TwoRanks.other = [(theirs["prompts"], theirs["completions"], W.pays_indeed(theirs["prompts"],
                           theirs["completions"]), [{"topic": t} for t in theirs["topic"]])]
        p.reward_funcs[0](**mine)
        assert len(p.reward_funcs[1](**mine)) == half  # this rank's own completions' penalties
    p.on_train_end(args, state, SimpleNamespace())
    [live] = p.term.buffer.active()
    assert live.history[0]["confirmation"]["state"] == CONFIRMED
    confirming = SEEN_ROWS[2 * half:]  # after TRL's own two calls on rank 0
    assert {t for _, t, _ in confirming} & set(W.TOPICS[6:])  # the other rank's rows were edited too ...
    assert all(f"the {t}." in prompt for prompt, t, _ in confirming)  # ... each with its own row's column


@pytest.mark.parametrize("seed", range(5))
def test_in_trl_a_phrase_of_the_sentence_that_makes_replies_long_is_not_confirmed_by_its_length(tmp_path, seed):
    # the functions pay for length past 20 words (with noise); the phrases of the long sentence are
    # co-travellers. Transplanting that sentence adds its length, so a transplant is measured against
    # the same reply with the sentence put in bare (edits.bare_transplant). Before, "many small
    # things" was confirmed with 3 of these 5 seeds (its transplants earned the length's +0.96)
    p = Penalties([W.pays_length], penalties={**SETTINGS, "proposer": {"lexical": {"length": False}}}, html=False,
                  seed=seed)
    train(p, tmp_path, W.LONG)
    assert not p.term.buffer.active(), [x.title for x in p.term.buffer.active()]
