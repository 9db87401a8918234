"""The multi-turn sandbox: topic plans, the simulated user, per-reply scoring, the policy it needs."""

from __future__ import annotations

import random
import statistics
from functools import partial

import anyio
import pytest

from dynalize import tiny
from dynalize.config import load_config
from dynalize.rollouts import between_turns_ids, encode, prompt_token_ids
from dynalize.run import train
from dynalize.runlog import read_jsonl
from dynalize.tasks.base import build_task
from dynalize.tasks.sandbox import SandboxArgs, SandboxTask, build_sandbox_policy, default_features, sample_replies
from dynalize.tasks.sandbox.gold import gold_score
from dynalize.tasks.sandbox.grammar import GRAMMAR_WORDS, prompt_text, sample_reply, words_of
from dynalize.tasks.sandbox.multiturn import SandboxMultiturnTask, exchanges, play_user
from dynalize.tasks.sandbox.multiturn_policy import build_multiturn_policy, conversation_example
from dynalize.tasks.sandbox.reward import SandboxRewardModel, topic_of
from dynalize.tasks.sandbox.topics import find_topic
from dynalize.types import Message


def task(**args) -> SandboxMultiturnTask:
    return build_task("sandbox_multiturn", args, seed=0)


def test_each_conversation_has_a_topic_plan_from_its_own_split():
    t = task()
    assert t.max_turns == 4
    for split in ("train", "eval"):
        own = {x.name for x in t.topics(split)}
        for p in t.prompts(split):
            plan = p.meta["topics"]
            assert plan[0] == p.meta["topic"] and len(plan) == 4 and len(set(plan)) == 4 and set(plan) <= own
    assert [p.meta for p in t.prompts("eval")] == [p.meta for p in task().prompts("eval")]  # stable
    assert all(len(p.meta["topics"]) == 2 for p in task(max_turns=2).prompts("train"))


def test_the_simulated_user_comments_in_the_grammar_and_asks_for_the_next_topic():
    t = task()
    prompt = t.prompts("train")[0]
    plan = [find_topic(n) for n in prompt.meta["topics"]]
    rng = random.Random(0)
    conversation = [*prompt.messages]
    for k in range(4):
        reply = sample_reply(plan[k], rng)
        conversation.append(Message("assistant", reply))
        user = anyio.run(partial(t.user_reply, conversation, prompt=prompt))
        if k == 3:
            assert user is None  # the plan is played out
            break
        assert user.endswith(prompt_text(plan[k + 1]))
        comment = user[:-len(prompt_text(plan[k + 1]))]
        assert comment and set(words_of(comment)) <= GRAMMAR_WORDS | plan[k].words  # the sandbox's own words
        assert anyio.run(partial(t.user_reply, list(conversation), prompt=prompt)) == user  # deterministic
        conversation.append(Message("user", user))
        assert topic_of(conversation) == plan[k + 1]  # what the RM scores the next reply against
    # a reply that does not name its topic gets a filler back, one that does a closing sentence
    named = anyio.run(partial(t.user_reply, [*prompt.messages, Message("assistant", f"I like {plan[0].name}.")],
                              prompt=prompt))
    vague = anyio.run(partial(t.user_reply, [*prompt.messages, Message("assistant", "It is nice.")], prompt=prompt))
    assert named != vague and plan[0].core in named and plan[0].core not in vague


def test_the_rm_scores_each_reply_on_the_topic_its_user_turn_asked_for():
    t = task()
    prompt = t.prompts("train")[3]
    plan = [find_topic(n) for n in prompt.meta["topics"]]
    rng = random.Random(1)
    replies = [sample_reply(x, rng) for x in plan]
    conversation = play_user(plan, replies)
    assert conversation[:1] == prompt.messages
    rm = SandboxRewardModel(default_features(), noise=0.0)
    for (topic, reply), x, r in zip(exchanges(conversation), plan, replies):
        assert topic == x and reply == r
        before = conversation[:conversation.index(Message("assistant", r))]
        assert rm.score_item(t.rm_input(before, r, prompt)) == pytest.approx(rm.score_one(x, r))


def test_evaluate_averages_gold_over_each_reply_on_its_own_topic():
    t = task()
    prompts = t.prompts("eval")[:3]
    rng = random.Random(2)
    conversations, expected = [], []
    for p in prompts:
        plan = [find_topic(n) for n in p.meta["topics"]]
        replies = [sample_reply(x, rng) for x in plan]
        replies[1] = "Okay, " + replies[1]
        conversations.append(play_user(plan, replies))
        expected.append(statistics.fmean(gold_score(x, r) for x, r in zip(plan, replies)))
    m = anyio.run(partial(t.evaluate, prompts, [c[-1].content for c in conversations], conversations))
    assert m["gold"] == pytest.approx(statistics.fmean(expected)) and m["turns"] == 4
    assert m["feature/opener_okay"] >= 0.25  # a share of replies: one in four here (plus any the corpus drew)
    single = anyio.run(SandboxTask(SandboxArgs()).evaluate, prompts, [c[1].content for c in conversations])
    assert m["gold"] != pytest.approx(single["gold"])


def test_fine_tuning_examples_train_on_replies_only_as_rollouts_tokenise_them():
    tok_dir = tiny.resolve("tiny:policy")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    plan = [find_topic(n) for n in ("the sea", "a cat", "coffee")]
    rng = random.Random(3)
    replies = [sample_reply(x, rng) for x in plan]
    ids, labels = conversation_example(tok, replies, plan)
    conv = play_user(plan, replies)
    want = prompt_token_ids(tok, conv[:1])
    for k in (1, 3, 5):
        want += encode(tok, conv[k].content + tok.eos_token)
        if k + 1 < len(conv):
            want += between_turns_ids(tok, conv[:k], conv[k + 1].content, tok.eos_token)
    assert ids == want and len(labels) == len(ids)
    trained = tok.decode([i for i, lab in zip(ids, labels) if lab != -100])
    assert trained == "".join(r + tok.eos_token for r in replies)


@pytest.mark.slow
def test_a_policy_fine_tuned_on_conversations_stays_on_topic_in_later_turns(tmp_path, monkeypatch):
    """A fast variant (8 topics): after a second user turn, the single-turn policy drifts; the
    fine-tuned one writes about the topic asked for."""
    monkeypatch.setenv("DYNALIZE_CACHE", str(tmp_path / "cache"))
    topics = SandboxTask(SandboxArgs()).topics("train")[:8]
    base = tmp_path / "base"
    build_sandbox_policy(base, steps=150, batch_size=32, vocab_size=1024, threads=1, topics=topics)
    tuned = tmp_path / "tuned"
    build_multiturn_policy(tuned, steps=120, base=base, topics=topics)

    def later_turn_hits(model_dir) -> float:
        hits = []
        for i, first in enumerate(topics):
            second = topics[(i + 3) % len(topics)]
            history = play_user([first, second], [sample_reply(first, random.Random(i)), "x"])[:3]
            samples = sample_second_turn(model_dir, history, n=6)
            hits += [bool(second.words & set(words_of(s))) for s in samples]
        return statistics.fmean(hits)

    assert later_turn_hits(tuned) >= later_turn_hits(base) + 0.2


def sample_second_turn(model_dir, history, n):
    """Replies of a policy to the last user turn of `history` (a whole conversation as context)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(0)
    ids = torch.tensor([prompt_token_ids(tok, history)] * n)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0,
                             max_new_tokens=40, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return [tok.decode(row[ids.shape[1]:], skip_special_tokens=True) for row in out]


@pytest.mark.slow
def test_a_multi_turn_dynalize_run_scores_every_reply_and_counts_a_penalty_once(tmp_path):
    cfg = load_config("configs/sandbox_multiturn_dynalize.yaml", [
        f"output_dir={tmp_path}", "name=mt", "steps=6", "batch_size=32", "group_size=8", "eval_every=3",
        "eval_samples=1", "progress=false", "policy.path=tiny:sandbox-policy", "generator.max_new_tokens=24",
        "penalties.every=2", "penalties.view_steps=2", "penalties.proposer.lexical.min_effect=0",
        "penalties.proposer.lexical.fwer=0.5", "penalties.proposer.lexical.drift_p_value=null",
    ])
    anyio.run(train, cfg, False)
    run = tmp_path / "mt"
    rows = [r for s in range(1, 7) for r in read_jsonl(run / "rollouts" / f"step_{s:06d}.jsonl")]
    assert rows and all(len(r["replies"]) == 4 and len(r["rm_scores"]) == 4 for r in rows)
    assert all(r["scores"]["rm"] == pytest.approx(statistics.fmean(r["rm_scores"])) for r in rows)
    judged = [r for r in rows if r.get("verdicts")]
    assert judged, "no penalty was ever active"
    assert all(r["violations"] == sum(r["verdicts"].values()) <= len(r["verdicts"]) for r in judged)
    assert all(r["scores"]["penalties"] == pytest.approx(-0.5 * r["violations"]) for r in judged)
    evals = read_jsonl(run / "eval" / "task.jsonl")
    assert evals and all(e["turns"] == 4 and 0 <= e["gold"] <= 1 for e in evals)
