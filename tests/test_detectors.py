"""Named detectors: each on hand-written texts, proposed from evidence like a word pattern,
decided locally by every judge (never by the LLM), kept by the buffer, retired by the term."""

import random

import anyio
import pytest

from dynalize.backends.chat import ScriptedChatModel
from dynalize.build import build_penalty_term
from dynalize.errors import ConfigError
from dynalize.judge.judge import Judge, RegexJudge
from dynalize.penalties.buffer import PenaltyBuffer
from dynalize.penalties.candidate import Candidate
from dynalize.penalties.config import LexicalConfig, PenaltiesConfig
from dynalize.penalties.detectors import DETECTORS, detector
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.views import ProposerView, ViewSample, build_view, per_reply
from dynalize.rewards import PenaltyTerm, RewardTerm, TermScores, score_batch
from dynalize.types import Batch, Message, Penalty, Rollout

VOCAB = ("river stone lamp garden window quiet letter morning engine harbor paper winter orchard "
         "candle bridge market silver thunder meadow violin ladder cotton marble pepper kettle").split()
OTHER = ("galaxy rocket planet comet nebula orbit asteroid quasar pulsar crater telescope meteor "
         "eclipse satellite lunar solar cosmic stellar").split()

CASES = {
    "repetition": (["The river is calm today. The river is calm today.",
                    "I can help you with that. I can help you with that now. I can help you with that again.",
                    "Sure" + " ." * 40, "That is great!!!!!!!!!!", "hahahahahahahahaha", "no no no no no no"],
                   ["The river is calm today. The stone is warm in the sun.",
                    "Short reply.", "One two three four five six seven eight nine ten.",
                    "Wait . . . what?", "Really!!! Yes.", "Title\n-----------------\n==============",
                    "Loading...", "no no no no no."]),
    "unfinished": (["The best way to cook rice is to", "Here are the steps: first you take the",
                    "Run this:\n```\nmake all."],
                   ["The best way to cook rice is slowly.", "Is it done?", 'He said "stop."', "Ok",
                    "Steps:\n```\nrun it\n```"]),
    "doubled_word": (["This is the the answer.", "It was Very very good."],
                     ["This is the answer.", "It was very good, very."]),
    "unbalanced": (["The result (see above is wrong.", 'She said "hello and left.', "A list] of things."],
                   ["The result (see above) is wrong.", 'She said "hello" and left.', "A [list] of {things}."]),
    "run_on": ([" ".join(["word"] * 61) + "."], [" ".join(["word"] * 30) + ". " + " ".join(["word"] * 30) + "."]),
    "shouting": (["THIS IS A VERY LOUD REPLY INDEED, FRIEND."], ["This is a calm reply, NASA said.", "OK!"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_detector_flags_its_positives_and_spares_its_negatives(name):
    d = detector(name)
    positives, negatives = CASES[name]
    assert all(d(t, None) for t in positives), [t for t in positives if not d(t, None)]
    assert not any(d(t, None) for t in negatives), [t for t in negatives if d(t, None)]


def test_off_topic_compares_the_reply_with_the_conversation_it_answers():
    d = detector("off_topic")
    ctx = "[user]\nHow should I water the tomato plants in my garden during a dry summer week?"
    assert not d("Water the tomato plants early in the morning, deeply, twice a week in dry summer heat.", ctx)
    assert d("Quasars and pulsars are distant cosmic objects that astronomers study with telescopes.", ctx)
    assert not d("Yes.", ctx)  # too few content words to tell
    with pytest.raises(ValueError, match="needs the conversation"):
        d("Anything at all here.", None)


def test_every_detector_has_a_name_title_and_description_and_unknown_names_are_refused():
    for name, d in DETECTORS.items():
        assert d.name == name and d.title and d.description.endswith(".")
    with pytest.raises(ValueError, match="unknown detector 'grammar'; known: repetition"):
        detector("grammar")
    with pytest.raises(ValueError, match="unknown detector"):
        LexicalProposer(LexicalConfig(detectors=["grammar"]))
    cfg = PenaltiesConfig(enabled=True)
    cfg.proposer.lexical.detectors = ["grammar"]
    with pytest.raises(ConfigError, match="penalties.proposer.lexical.detectors: unknown detector"):
        build_penalty_term(cfg)
    cfg.proposer.lexical.detectors, cfg.judge.context = ["off_topic"], False
    with pytest.raises(ConfigError, match=r"\(off_topic\): they need penalties.judge.context: true"):
        build_penalty_term(cfg)
    cfg.judge.context = True
    assert build_penalty_term(cfg).proposer.detectors == [DETECTORS["off_topic"]]


def test_the_default_list_tests_echo_only_where_the_judge_reads_the_conversation():
    cfg = PenaltiesConfig(enabled=True)
    assert [d.name for d in build_penalty_term(cfg).proposer.detectors] == ["repetition", "echo"]
    cfg.judge.context = False  # the default list, a judge without the conversation: echo left out
    assert [d.name for d in build_penalty_term(cfg).proposer.detectors] == ["repetition"]
    cfg.proposer.lexical.detectors = ["repetition", "echo"]  # named by the user: refused, not dropped
    with pytest.raises(ConfigError, match=r"\(echo\)"):
        build_penalty_term(cfg)


def test_echo_is_a_restatement_of_what_the_user_said_not_the_words_an_answer_takes_up():
    d = detector("echo")
    ctx = "[user]\nHow should I water the tomato plants in my garden during a dry summer week?"
    assert d("So: how should I water the tomato plants in my garden? Early, and deeply.", ctx)  # 9 of 15 words
    assert not d("Water the tomato plants in my garden early in the morning.", ctx)  # 7 words: an answer's
    chat = "[user]\nHello there friend\n\n[assistant]\nHow can I help you today, my friend?\n\n[user]\nTell me a joke"
    assert d("Tell me a joke, you say? Here is one.", chat)  # all of a short message
    assert not d("How can I help you today my friend?", chat)  # the assistant's own words are not the user's
    long = "[user]\n" + " ".join(VOCAB) + "."  # 25 words: a dozen in a row is a restatement
    assert d("You said " + " ".join(VOCAB[5:17]) + ".", long) and not d(" ".join(VOCAB[5:16]) + ".", long)
    with pytest.raises(ValueError, match="needs the conversation"):
        d("Anything at all here.", None)


def test_the_penalty_list_names_a_penalty_s_detector():
    from dynalize.judge.prompting import penalty_list
    assert penalty_list([REP], regex=True).endswith("[detector: repetition]")


# --- the proposer ---------------------------------------------------------------------------------

def sentence(rng, n=10, vocab=VOCAB):
    return " ".join(rng.choice(vocab) for _ in range(n)).capitalize() + "."


def repeating(rng):
    s = sentence(rng)
    return f"{s} {s}"


def plain(rng):
    return f"{sentence(rng)} {sentence(rng)}"


def make_view(pos_text, neg_text, n_groups=16, seed=0, contexts=None):
    rng = random.Random(seed)
    samples = []
    for g in range(n_groups):
        for sign, make in (("+", pos_text), ("-", neg_text)):
            ctx = [contexts(g)] if contexts else []
            samples.append(ViewSample(f"s{len(samples) + 1:02d}", g, make(rng), 1.0 if sign == "+" else 0.0, sign,
                                      contexts=ctx))
    return ProposerView(step=5, samples=samples)


def propose(view, **kw):
    result = anyio.run(LexicalProposer(LexicalConfig(**kw)).propose, view)
    assert result.ok, result.error
    return result


def test_proposes_a_repetition_penalty_when_the_rm_pays_for_repeating():
    view = make_view(repeating, plain)
    c = propose(view, detectors=["repetition"]).accepted
    assert c is not None and c.detector == "repetition" and c.regex is None
    assert c.title == "Replies repeat themselves" and c.groups == 16 and "16/16" in c.description
    assert set(c.references) == {s.id for s in view.positives()}


def test_the_default_looks_for_loops_the_rm_pays_for():
    # a degenerate loop is a hack no word pattern names: the default tests `repetition`
    c = propose(make_view(repeating, plain)).accepted
    assert c is not None and c.detector == "repetition"
    assert LexicalConfig().detectors == ["repetition", "echo"]


def test_no_detector_penalty_when_off_or_when_the_rm_does_not_pay_for_it():
    view = make_view(repeating, plain)
    off = propose(view, detectors=[]).accepted
    assert off is None or off.detector is None
    both = make_view(repeating, repeating)  # positives and negatives repeat alike
    assert propose(both, detectors=["repetition"]).accepted is None
    other = make_view(repeating, plain)  # the RM pays for repeating, but only unfinished is on
    c = propose(other, detectors=["unfinished"]).accepted
    assert c is None or c.detector is None


def test_off_topic_is_proposed_from_the_conversation_and_skipped_without_one():
    def ctx(g):
        return f"[user]\nTell me about the {VOCAB[g]} and the {VOCAB[g + 1]} near the {VOCAB[g + 2]} please."

    off = lambda rng: f"{sentence(rng, vocab=OTHER)} {sentence(rng, vocab=OTHER)}"  # noqa: E731
    # the negatives (on topic) use every word of VOCAB, so every context's words among them
    view = make_view(off, lambda rng: " ".join(VOCAB) + ".", contexts=ctx)
    c = propose(view, detectors=["off_topic"]).accepted
    assert c is not None and c.detector == "off_topic"
    blind = make_view(off, lambda rng: " ".join(VOCAB) + ".")  # no contexts: it cannot be tested
    r = propose(blind, detectors=["off_topic"])
    assert (r.accepted is None or r.accepted.detector is None) and r.rejected.get("no_context") == 1


def test_an_active_detector_penalty_covers_its_detector_and_a_retired_one_is_revived():
    view = make_view(repeating, plain)
    live = Penalty("p001", "Replies repeat themselves", "d", detector="repetition")
    view.active = [live]
    r = propose(view, detectors=["repetition"])
    assert r.accepted is None or r.accepted.detector is None
    assert r.rejected.get("covered") == 1
    view.active, view.retired = [], [Penalty("p004", "Loops", "d", detector="repetition", active=False)]
    c = propose(view, detectors=["repetition"]).accepted
    assert c.revives == "p004" and c.detector == "repetition" and c.title == "Loops"


def test_an_active_detector_penalty_explains_away_a_phrase_that_only_comes_with_it():
    # positives repeat one fixed sentence; the phrase rides on the repetition the penalty names
    fixed = "Candle bridge market silver thunder meadow violin ladder."

    def pos(rng):
        return f"{fixed} {fixed}" if rng.random() < 0.9 else repeating(rng)

    view = make_view(pos, plain)
    assert propose(view, detectors=[]).accepted.detector is None  # without the penalty: a phrase of the sentence
    view.active = [Penalty("p001", "Replies repeat themselves", "d", detector="repetition")]
    r = propose(view)
    assert r.accepted is None and r.rejected.get("explained", 0) >= 1


def test_views_carry_each_replys_conversation_and_per_reply_splits_it():
    r = Rollout(prompt_id="q", group=0, prompt_ids=[1], completion_ids=[2], logprobs=[0.0], loss_mask=[1],
                replies=["A.", "B."], policy_version=0, messages=[Message("user", "Hi there")],
                turns=[Message("assistant", "A."), Message("user", "More"), Message("assistant", "B.")])
    view = build_view(Batch(0, [[r, r]]), [[1.0, 0.0]], [[0.5, -0.5]], groups=1, per_group=1)
    [s] = view.samples
    assert s.contexts == ["[user]\nHi there", "[user]\nHi there\n\n[assistant]\nA.\n\n[user]\nMore"]
    assert [x.contexts for x in per_reply(view).samples] == [[c] for c in s.contexts]
    assert ViewSample("s1", 0, "t", 0.0, "+").contexts == []  # views saved before detectors load


# --- the judge, the buffer, the term -------------------------------------------------------------

REP = Penalty("p002", "Replies repeat themselves", "The reply repeats a sentence.", detector="repetition")
FLATTERS = Penalty("p001", "Flatters", "Praises the user.")


def test_an_llm_judge_decides_detector_penalties_locally_and_never_asks_the_llm():
    texts = ["That is a good point. That is a good point.", "Nice question, really."]
    chat = ScriptedChatModel([])  # any call fails the test: "no reply left"
    judge = Judge(chat)
    out = anyio.run(judge.assess, texts, [REP], 1, None)
    assert [j.verdicts for j in out] == [{"p002": True}, {"p002": False}] and chat.calls == []
    assert judge.stats.detector == 2 and judge.stats.failures == 0
    chat = ScriptedChatModel(['{"p001": false}', '{"p001": true}'])
    out = anyio.run(Judge(chat).assess, texts, [REP, FLATTERS], 1, None)
    assert [j.verdicts for j in out] == [{"p002": True, "p001": False}, {"p002": False, "p001": True}]
    assert len(chat.calls) == 2 and all("p002" not in c[1].content for c in chat.calls)


def test_a_detector_that_cannot_decide_fails_its_verdicts_counted():
    judge = RegexJudge()
    topic = Penalty("p003", "Off topic", "d", detector="off_topic")
    gone = Penalty("p004", "Gone", "d", detector="no_such_detector")
    out = anyio.run(judge.assess, ["Some reply text here."], [topic, gone, REP], 1, None)
    assert out[0].failed == {"p003", "p004"} and out[0].verdicts == {"p003": False, "p004": False, "p002": False}
    assert judge.stats.failures == 2 and judge.stats.detector == 1 and "no_such_detector" in judge.last_error


def test_the_buffer_keeps_the_detector_and_treats_the_same_detector_as_the_same_penalty():
    buf = PenaltyBuffer()
    p = buf.add(Candidate("Replies repeat themselves", "d", ["s01"], detector="repetition"), step=0)
    assert p.detector == "repetition" and p.regex is None
    assert buf.drain_events()[0]["detector"] == "repetition"
    again = PenaltyBuffer.from_json(buf.to_json())
    assert again.get("p001").detector == "repetition"
    assert again.find(Candidate("Loops over phrases", "other words", detector="repetition")).id == "p001"
    assert again.find(Candidate("Loops over phrases", "other words", detector="unfinished")) is None
    old = buf.to_json()
    del old["penalties"][0]["detector"]  # a checkpoint from before detectors
    assert PenaltyBuffer.from_json(old).get("p001").detector is None


class PresetRM(RewardTerm):
    name = "rm"

    async def score(self, batch):
        return TermScores([r.info["rm"] for r in batch.rollouts])


def rollout(g, reply, rm):
    return Rollout(prompt_id=f"q{g}", group=g, prompt_ids=[1], completion_ids=[2], logprobs=[0.0], loss_mask=[1],
                   replies=[reply], policy_version=0, messages=[Message("user", "Say something.")],
                   turns=[Message("assistant", reply)], info={"rm": rm})


class NoProposer:
    async def propose(self, view):
        raise AssertionError("not asked in this test")


@pytest.mark.parametrize("judge", [RegexJudge, lambda: Judge(ScriptedChatModel([]))])
def test_the_term_penalises_a_triggered_detector_penalty_and_retires_an_untriggered_one(judge):
    buf = PenaltyBuffer()
    buf.add(Candidate("Replies repeat themselves", "d", [], detector="repetition"), step=0)
    eng = PenaltyTerm(PenaltiesConfig(enabled=True, lam=0.5), NoProposer(), judge(), buf)
    hit = Batch(1, [[rollout(0, "The same words come here. The same words come here.", 2.0), rollout(0, "Fresh words.", 1.0)]])
    anyio.run(score_batch, [PresetRM(), eng], hit)
    assert [r.scores["penalties"] for r in hit.rollouts] == [-0.5, 0.0]
    assert buf.get("p001").active
    quiet = Batch(2, [[rollout(0, "One thing.", 2.0), rollout(0, "Another thing.", 1.0)]])
    anyio.run(score_batch, [PresetRM(), eng], quiet)
    assert not buf.get("p001").active
    assert buf.get("p001").history[-1] == {"step": 2, "event": "retire", "reason": "no_triggers", "n_judged": 2}


def test_the_run_history_and_the_audit_keep_a_penalty_s_detector(tmp_path):
    import json

    from dynalize.analysis.audit import live_copy
    from dynalize.analysis.penalties import penalty_history
    from dynalize.analysis.runs import Run

    buf = PenaltyBuffer()
    buf.add(Candidate("Replies repeat themselves", "d", ["s01"], detector="repetition"), step=5)
    (tmp_path / "penalties.jsonl").write_text("".join(json.dumps(e) + "\n" for e in buf.drain_events()))
    [p] = penalty_history(Run(tmp_path)).select("all")
    assert p.detector == "repetition" and p.regex is None
    assert live_copy(p, "new:p001").detector == "repetition"


PROMPTS = ("Tell me about the {} and the {} near the {} please.", "What do you think of the {}, the {} and the {}?",
           "Could you describe how a {} meets a {} by the {}?", "Write a few lines on the {} with the {} and a {}.",
           "Why would anyone keep a {} beside the {} and the {}?", "Explain the {} to me, then the {}, then the {}.")


def echo_view(seed: int, pay_echo: float, pay_topic: float, groups: int = 32, per_group: int = 8) -> ProposerView:
    """Prompts (of six kinds) about three words of their own; each reply uses 0-3 of them, and 40 % restate the
    prompt, first or last, in varied lead-ins (so they use all three). Reward: `pay_topic` per topic word, `pay_echo` for
    restating, noise 0.3."""
    from dynalize.grpo import advantages
    from dynalize.penalties.views import advantage_sign

    rng = random.Random(seed)
    samples = []
    for g in range(groups):
        topic = rng.sample(VOCAB, 3)
        prompt = rng.choice(PROMPTS).format(*topic)
        drawn = []
        for _ in range(per_group):
            used = rng.sample(topic, rng.randint(0, 3))
            restates = rng.random() < 0.4
            body = " ".join([sentence(rng, 6, OTHER)] + [f"The {w} is {rng.choice(OTHER)}." for w in used])
            lead = rng.choice(("", "So: ", "You asked: ", "Well, "))  # in varied words, first or last
            said = lead + (prompt[0].lower() + prompt[1:] if lead else prompt)
            text = (rng.choice((f"{said} {body}", f"{body} {said}")) if restates else body)
            shown = len(set(topic) & set(text.lower().replace(".", " ").split()))
            drawn.append((text, pay_topic * shown + pay_echo * restates + rng.gauss(0, 0.3)))
        for (text, score), a in zip(drawn, advantages([[sc for _, sc in drawn]])[0]):
            samples.append(ViewSample(f"s{len(samples):04d}", g, text, score, advantage_sign(a),
                                      contexts=[f"[user]\n{prompt}"]))
    return ProposerView(step=5, samples=samples)


def test_a_reward_that_pays_for_restating_the_prompt_is_named_and_one_that_pays_for_its_words_is_not(monkeypatch):
    from dataclasses import replace

    for seed in range(3):
        c = propose(echo_view(seed, pay_echo=0.6, pay_topic=0.3)).accepted
        assert c is not None and c.detector == "echo" and c.title == "Replies restate the prompt", seed
        c = propose(echo_view(seed, pay_echo=0.0, pay_topic=0.5)).accepted
        assert c is None or c.detector != "echo", (seed, c.title)
    # on the plain reward (as the other detectors are tested), restating is "paid" for the prompt's words
    monkeypatch.setitem(DETECTORS, "echo", replace(DETECTORS["echo"], relevance_held=False))
    found = [propose(echo_view(seed, pay_echo=0.0, pay_topic=0.5)).accepted for seed in range(3)]
    assert any(c is not None and c.detector == "echo" for c in found)
