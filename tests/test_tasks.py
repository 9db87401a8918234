"""The creative-writing and counselling tasks: prompts, RM inputs, reasoning, the simulated patient,
multi-turn scoring, and short training runs."""

import hashlib
import json
import re
import statistics
from pathlib import Path

import anyio
import pytest

from dynalize import tiny
from dynalize.backends.base import Completion, Generator, RewardModel, SamplingParams
from dynalize.backends.chat import ScriptedChatModel
from dynalize.backends.hf import load_tokenizer
from dynalize.config import ConfigError, load_config
from dynalize.rewards import RMTerm, score_batch
from dynalize.rewards.rm import rm_inputs
from dynalize.rollouts import sample_groups
from dynalize.run import train
from dynalize.runlog import read_jsonl
from dynalize.tasks.base import build_task
from dynalize.tasks.counseling import SESSION_CUE, offline_patient
from dynalize.tasks.text import split_reasoning_tags
from dynalize.tasks.data import DataError
from dynalize.types import Batch, Message

REPO = Path(__file__).resolve().parent.parent
STORY_PROMPTS = ["[WP] A door in the sea.", "[WP] The last bus.", "[WP] A door in the sea.", "[WP] Snow in June.",
                 "[WP] The last bus.", "[WP] A map of your house."]


def jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def litbench(path: Path, prompts=STORY_PROMPTS) -> str:
    return jsonl(path, [{"prompt": p, "chosen_story": f"good {i}", "rejected_story": f"bad {i}",
                         "chosen_upvotes": 10 + i, "rejected_upvotes": i} for i, p in enumerate(prompts)])


def conversations(path: Path, n: int = 4) -> str:
    rows = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"I feel stuck at work, day {i}."}]}
            for i in range(n)]
    rows[1]["messages"] = [{"role": "system", "content": "Listen first."},
                           {"role": "Patient", "content": "I argued with my sister."},
                           {"role": "counsellor", "content": "That sounds hard."},
                           {"role": "client", "content": "We have not spoken since."}]
    return jsonl(path, rows)


# --- creative writing ------------------------------------------------------------------------

def test_creative_writing_dedupes_prompts_with_stable_ids(tmp_path):
    task = build_task("creative_writing", {"train_file": litbench(tmp_path / "lb.jsonl"), "eval_fraction": 0}, 0)
    train = task.prompts("train")
    assert [p.meta["writing_prompt"] for p in train] == ["[WP] A door in the sea.", "[WP] The last bus.",
                                                         "[WP] Snow in June.", "[WP] A map of your house."]
    assert [p.meta["pairs"] for p in train] == [2, 2, 1, 1]
    assert train[0].id == "cw-" + hashlib.sha256(b"[WP] A door in the sea.").hexdigest()[:12]
    assert train[1].messages == [Message("user", "[WP] The last bus.")]  # as written: no template asked for
    assert task.prompts("eval") == []


def test_creative_writing_splits_by_fraction_or_eval_file(tmp_path):
    data = litbench(tmp_path / "lb.jsonl")
    a = build_task("creative_writing", {"train_file": data, "eval_fraction": 0.5, "split_seed": 1}, 0)
    b = build_task("creative_writing", {"train_file": data, "eval_fraction": 0.5, "split_seed": 1}, 7)
    assert [p.id for p in a.prompts("eval")] == [p.id for p in b.prompts("eval")]  # seeded by split_seed only
    assert len(a.prompts("train")) == 2 and len(a.prompts("eval")) == 2
    assert not {p.id for p in a.prompts("train")} & {p.id for p in a.prompts("eval")}
    held = litbench(tmp_path / "held.jsonl", ["[WP] Quiet planet."])
    c = build_task("creative_writing", {"train_file": data, "eval_file": held, "template": "Story: {prompt}",
                                        "system_prompt": "You write fiction.", "max_train_prompts": 3}, 0)
    assert len(c.prompts("train")) == 3
    assert c.prompts("eval")[0].messages == [Message("system", "You write fiction."),
                                             Message("user", "Story: [WP] Quiet planet.")]
    with pytest.raises(ConfigError, match="task.args.template"):
        build_task("creative_writing", {"train_file": data, "template": "no slot"}, 0)


def test_creative_writing_rm_reads_the_raw_story_only(tmp_path):
    task = build_task("creative_writing", {"train_file": litbench(tmp_path / "lb.jsonl")}, 0)
    convo = task.prompts("train")[0].messages
    assert task.rm_input(convo, "Once upon a time.") == "Once upon a time."
    assert task.split_reasoning("<think>plot</think>Once upon a time.") == ("plot", "Once upon a time.")


def test_sample_data_files_load():
    lb = build_task("creative_writing", {"train_file": str(REPO / "examples/data/litbench_sample.jsonl"),
                                         "eval_fraction": 0}, 0)
    assert len(lb.prompts("train")) == 6
    c = build_task("counseling", {"train_file": str(REPO / "examples/data/counseling_sample.jsonl"),
                                  "eval_fraction": 0}, 0)
    assert [p.id for p in c.prompts("train")] == [f"sample-{i}" for i in range(1, 9)]


# --- counselling -----------------------------------------------------------------------------

def test_counseling_prompts_map_roles_and_rm_reads_the_chat_with_the_reply(tmp_path):
    task = build_task("counseling", {"train_file": conversations(tmp_path / "c.jsonl"), "eval_fraction": 0,
                                     "system_prompt": "You are a counsellor."}, 0)
    p0, p1 = task.prompts("train")[:2]
    assert p0.messages == [Message("system", "You are a counsellor."), Message("user", "I feel stuck at work, day 0.")]
    assert [m.role for m in p1.messages] == ["system", "user", "assistant", "user"]
    assert p1.messages[0].content == "Listen first."  # the data's own system message is kept
    x = task.rm_input(p1.messages, "I hear you.")
    assert isinstance(x, list) and x == [*p1.messages, Message("assistant", "I hear you.")]


@pytest.mark.parametrize(("messages", "problem"), [
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
     "messages: the last message must be from the user (the policy writes the next reply)"),
    ([{"role": "user", "content": "hi"}, {"role": "system", "content": "x"}, {"role": "user", "content": "a"}],
     "messages[1]: only the first message may be a system message"),
    ([{"role": "doctor", "content": "hi"}], "messages[0]: unknown role 'doctor' (use system, user or assistant)"),
    ([{"role": "user"}], "messages[0]: missing field 'content'"),
    ([], "field 'messages' must be a non-empty list of {role, content} messages"),
])
def test_counseling_rejects_bad_conversations_with_file_and_line(messages, problem, tmp_path):
    path = jsonl(tmp_path / "c.jsonl", [{"id": "ok", "messages": [{"role": "user", "content": "hi"}]},
                                        {"id": "bad", "messages": messages}])
    with pytest.raises(DataError) as e:
        build_task("counseling", {"train_file": path}, 0)
    assert str(e.value) == f"data error: {path} line 2: {problem}"


def test_counseling_ids_are_unique_or_hashed(tmp_path):
    one = {"messages": [{"role": "user", "content": "hi"}]}
    path = jsonl(tmp_path / "c.jsonl", [{"id": "a", **one}, {"id": "a", **one}])
    with pytest.raises(DataError, match=r"line 2: duplicate id 'a' \(first at .*c\.jsonl line 1\)"):
        build_task("counseling", {"train_file": path}, 0)
    path = jsonl(tmp_path / "d.jsonl", [one, {"messages": [{"role": "user", "content": "yo"}]}])
    ids = [p.id for p in build_task("counseling", {"train_file": path, "eval_fraction": 0}, 0).prompts("train")]
    assert len(set(ids)) == 2 and all(i.startswith("c-") for i in ids)


def test_counseling_reads_messages_from_csv(tmp_path):
    import pandas as pd

    msgs = json.dumps([{"role": "user", "content": "Hello, I am tired."}])
    pd.DataFrame([{"id": "x", "messages": msgs}]).to_csv(tmp_path / "c.csv", index=False)
    task = build_task("counseling", {"train_file": str(tmp_path / "c.csv"), "eval_fraction": 0}, 0)
    assert task.prompts("train")[0].messages == [Message("user", "Hello, I am tired.")]


TAGS = ("<think>", "</think>")


@pytest.mark.parametrize(("reply", "expected"), [
    ("<think>plan it</think>\nI hear you.", ("plan it", "I hear you.")),
    ("plan it</think>I hear you.", ("plan it", "I hear you.")),   # Qwen3: the template opened the block
    ("<think>plan it, never closed", ("plan it, never closed", "")),
    ("I hear you.", ("", "I hear you.")),
    ("Hi <think>x</think> there", ("x", "Hi  there")),
])
def test_reasoning_split(reply, expected, tmp_path):
    assert split_reasoning_tags(reply, TAGS) == expected
    task = build_task("counseling", {"train_file": conversations(tmp_path / "c.jsonl")}, 0)
    assert task.split_reasoning(reply) == expected


def test_reasoning_split_with_custom_tags_or_none(tmp_path):
    data = conversations(tmp_path / "c.jsonl")
    custom = build_task("counseling", {"train_file": data, "reasoning_tags": ["[R]", "[/R]"]}, 0)
    assert custom.split_reasoning("[R]why[/R]Okay.") == ("why", "Okay.")
    assert custom.split_reasoning("<think>a</think>b") == ("", "<think>a</think>b")
    off = build_task("counseling", {"train_file": data, "reasoning_tags": None}, 0)
    assert off.split_reasoning("<think>a</think>b") == ("", "<think>a</think>b")


# --- multi-turn ------------------------------------------------------------------------------

class FakeGenerator(Generator):
    """Replies `<think>n</think>reply n` (n counts calls), as token ids of the tiny tokenizer."""

    def __init__(self, tokenizer):
        self.tok, self.n = tokenizer, 0

    async def generate(self, prompts, sampling):
        out = []
        for _ in prompts:
            self.n += 1
            text = f"<think>{self.n}</think>reply {self.n}"
            ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            out.append(Completion(ids, [-0.5] * len(ids), text, "stop"))
        return out

    async def update_weights(self, state, version):
        self.version = version


class LengthRM(RewardModel):
    """Score = number of messages the RM sees (deterministic, differs per reply)."""

    def __init__(self):
        self.seen = []

    async def score(self, items):
        self.seen += items
        return [float(len(x)) for x in items]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(tiny.resolve("tiny:policy"))


def multiturn(tmp_path, **args):
    return build_task("counseling_multiturn", {"train_file": conversations(tmp_path / "c.jsonl"),
                                               "eval_fraction": 0, **args}, 0)


def test_max_turns_is_set_on_the_instance_and_capped_at_4(tmp_path):
    assert multiturn(tmp_path, max_turns=3).max_turns == 3
    assert multiturn(tmp_path).max_turns == 4
    with pytest.raises(ConfigError, match="task.args.max_turns"):
        multiturn(tmp_path, max_turns=5)


def test_rollout_runs_to_max_turns_with_role_swapped_simulator(tmp_path, tok):
    task = multiturn(tmp_path, max_turns=3)
    task.simulator = ScriptedChatModel(lambda msgs: f"patient {len(msgs)}")
    prompt = task.prompts("train")[0]
    [[r]] = anyio.run(sample_groups, FakeGenerator(tok), tok, task, [prompt], 1, SamplingParams())
    assert r.replies == ["reply 1", "reply 2", "reply 3"] and r.reasoning == ["1", "2", "3"]
    assert [m.role for m in r.turns] == ["assistant", "user", "assistant", "user", "assistant"]
    assert [m.content for m in r.turns if m.role == "user"] == ["patient 4", "patient 6"]
    # the simulator plays the patient: its own lines are `assistant`, the counsellor's `user`
    first, second = task.simulator.calls
    assert first == [Message("system", task.persona), Message("user", SESSION_CUE),
                     Message("assistant", "I feel stuck at work, day 0."), Message("user", "reply 1")]
    assert second[4:] == [Message("assistant", "patient 4"), Message("user", "reply 2")]
    assert "[END]" in task.persona and "{end_marker}" not in task.persona
    inputs = rm_inputs(task, r)
    assert [len(x) for x in inputs] == [2, 4, 6]
    assert inputs[2][-1] == Message("assistant", "reply 3") and inputs[1][-2] == Message("user", "patient 4")


def test_end_marker_ends_early_and_reward_is_the_mean_of_reply_scores(tmp_path, tok):
    task = multiturn(tmp_path, end_marker="<<bye>>")
    # the patient ends once the policy has replied twice (the policy's lines are `user` to it)
    task.simulator = ScriptedChatModel(lambda msgs: "Thanks. <<bye>>" if sum(
        m.role == "user" and m.content.startswith("reply") for m in msgs) >= 2 else "<think>hm</think>Go on?")
    prompts = task.prompts("train")[:2]
    groups = anyio.run(sample_groups, FakeGenerator(tok), tok, task, prompts, 2, SamplingParams())
    for r in (r for g in groups for r in g):
        assert len(r.replies) == 2 and [m.role for m in r.turns] == ["assistant", "user", "assistant"]
        assert r.turns[1].content == "Go on?"  # the simulator's own reasoning is removed
    rm = LengthRM()
    anyio.run(score_batch, [RMTerm(rm, task)], Batch(0, groups))
    a, b = groups[0][0], groups[1][0]
    assert a.info["rm_scores"] == [2.0, 4.0] and a.scores["rm"] == 3.0 == a.reward
    assert b.info["rm_scores"] == [5.0, 7.0] and b.scores["rm"] == 6.0  # 4 prompt messages (system first) + reply
    assert len(rm.seen) == 8 and all(x[-1].role == "assistant" for x in rm.seen)


def test_user_reply_ends_on_empty_and_reads_a_persona_file(tmp_path):
    (tmp_path / "p.txt").write_text("You are Sam. Say {end_marker} to stop.", encoding="utf-8")
    task = multiturn(tmp_path, persona_file=str(tmp_path / "p.txt"), end_marker="DONE")
    assert task.persona == "You are Sam. Say DONE to stop."
    task.simulator = ScriptedChatModel(["  ", "<think>only thinking"])
    convo = [Message("user", "hi"), Message("assistant", "hello")]
    assert anyio.run(task.user_reply, convo) is None
    assert anyio.run(task.user_reply, convo) is None
    with pytest.raises(ConfigError, match="set persona or persona_file, not both"):
        multiturn(tmp_path, persona="x", persona_file="y")
    with pytest.raises(DataError, match="no such persona file"):
        multiturn(tmp_path, persona_file=str(tmp_path / "missing.txt"))
    with pytest.raises(ConfigError, match="task.args.user_simulator.engine"):
        multiturn(tmp_path, user_simulator={"engine": "telepathy"})


def test_each_conversation_is_played_with_the_persona_of_its_row(tmp_path, tok):
    rows = [{"id": "a", "messages": [{"role": "user", "content": "hi"}],
             "meta": {"persona": "You are Ana. Say {end_marker} to stop.", "age": 29}},
            {"id": "b", "messages": [{"role": "user", "content": "hello"}]}]
    task = build_task("counseling_multiturn", {"train_file": jsonl(tmp_path / "p.jsonl", rows), "eval_fraction": 0,
                                               "persona": "You are the default patient.", "end_marker": "BYE"}, 0)
    a, b = task.prompts("train")
    assert a.meta == {"persona": "You are Ana. Say {end_marker} to stop.", "age": 29} and b.meta == {}
    task.simulator = ScriptedChatModel(lambda msgs: "BYE")
    anyio.run(sample_groups, FakeGenerator(tok), tok, task, [a, b], 2, SamplingParams())
    # the patient model's system message, by the conversation's opening line (its own, after the cue)
    seen = {call[2].content: call[0].content for call in task.simulator.calls}
    assert seen == {"hi": "You are Ana. Say BYE to stop.", "hello": "You are the default patient."}
    assert len(task.simulator.calls) == 4


def test_row_meta_is_an_object_in_jsonl_and_csv_and_persona_must_be_text(tmp_path):
    csv = tmp_path / "p.csv"
    csv.write_text('id,messages,meta\nx,"[{""role"": ""user"", ""content"": ""hi""}]","{""persona"": ""Sam""}"\n'
                   'y,"[{""role"": ""user"", ""content"": ""yo""}]",\n', encoding="utf-8")
    task = build_task("counseling", {"train_file": str(csv), "eval_fraction": 0}, 0)
    assert [p.meta for p in task.prompts("train")] == [{"persona": "Sam"}, {}]
    for meta, problem in [([1, 2], "field 'meta' must be an object (key: value), got list"),
                          ("{not json", "field 'meta' is not a JSON object")]:
        data = jsonl(tmp_path / "bad.jsonl", [{"messages": [{"role": "user", "content": "hi"}], "meta": meta}])
        with pytest.raises(DataError, match=rf"^data error: {data} line 1: {re.escape(problem)}$"):
            build_task("counseling", {"train_file": data, "eval_fraction": 0}, 0)
    data = jsonl(tmp_path / "bad.jsonl", [{"messages": [{"role": "user", "content": "hi"}], "meta": {"persona": 7}}])
    build_task("counseling", {"train_file": data, "eval_fraction": 0}, 0)  # single-turn: no persona to play
    with pytest.raises(DataError, match="line 1: meta.persona must be a non-empty string"):
        build_task("counseling_multiturn", {"train_file": data, "eval_fraction": 0}, 0)


def test_offline_patient_answers_then_ends(tmp_path):
    task = multiturn(tmp_path)
    convo = [Message("user", "hi")]
    replies = []
    for i in range(5):
        convo.append(Message("assistant", f"counsellor {i}"))
        reply = anyio.run(task.user_reply, convo)
        replies.append(reply)
        if reply is None:
            break
        convo.append(Message("user", reply))
    assert replies[-1] is None and len(replies) == 4  # three canned answers, then [END]
    assert offline_patient([Message("assistant", "x")]).startswith("I guess")


# --- two-step training runs ------------------------------------------------------------------

def _train(tmp_path, name, task, data, *extra):
    cfg = load_config(None, [
        f"output_dir={tmp_path}", f"name={name}", "steps=2", "batch_size=8", "group_size=4", "progress=false",
        "checkpoint_every=0", "generator.max_new_tokens=8", "trainer.micro_batch_size=8",
        "reward_model.engine=hf", "reward_model.path=tiny:rm", f"task.name={task}",
        f"task.args.train_file={data}", *extra])
    history = anyio.run(train, cfg, False)
    return history, read_jsonl(tmp_path / name / "rollouts" / "step_000002.jsonl")  # the second step's


@pytest.mark.slow
def test_two_step_creative_writing_run(tmp_path):
    history, lines = _train(tmp_path, "cw", "creative_writing", litbench(tmp_path / "lb.jsonl"))
    assert [h["step"] for h in history] == [1, 2] and len(lines) == 8
    assert all(len(x["rm_scores"]) == 1 and x["prompt_id"].startswith("cw-") for x in lines)


@pytest.mark.slow
def test_two_step_counseling_run(tmp_path):
    history, lines = _train(tmp_path, "c", "counseling", conversations(tmp_path / "c.jsonl"), "eval_every=1",
                            "eval_samples=1", "task.args.eval_fraction=0.25")
    assert [h["step"] for h in history] == [1, 2] and len(lines) == 8
    assert "eval/words" in history[-1] and "eval/rm" in history[-1]


@pytest.mark.slow
def test_two_step_multiturn_run(tmp_path):
    history, lines = _train(tmp_path, "mt", "counseling_multiturn", conversations(tmp_path / "c.jsonl"),
                            "task.args.max_turns=2", "penalties.enabled=true")
    assert [h["step"] for h in history] == [1, 2] and len(lines) == 8
    for x in lines:  # the offline patient answers once; max_turns=2 stops after the second reply
        assert [t["role"] for t in x["turns"]] == ["assistant", "user", "assistant"]
        assert x["turns"][1]["content"].startswith("I guess") and len(x["rm_scores"]) == 2
        assert x["rm_score"] == pytest.approx(statistics.fmean(x["rm_scores"]))
        assert x["reward"] == pytest.approx(x["rm_score"] - 0.5 * x["violations"])
    assert "penalties/active" in history[-1]


@pytest.mark.slow
def test_shipped_multiturn_config_runs_on_a_qwen3_style_template(tmp_path, qwen3_style_policy, capsys):
    """configs/counseling_multiturn.yaml as shipped, with only its placeholders swapped for local
    stand-ins: a tiny policy whose chat template is Qwen3-style, the tiny RM, the sample data and
    the scripted patient; small batches and replies so that it runs on a CPU."""
    from dynalize.run import main

    code = main(["--config", str(REPO / "configs" / "counseling_multiturn.yaml"),
                 f"output_dir={tmp_path}", "name=mt", "progress=false", "steps=3", "batch_size=8", "group_size=4",
                 f"policy.path={qwen3_style_policy}", "policy.dtype=float32", "generator.max_new_tokens=8",
                 "reward_model.path=tiny:rm", f"task.args.train_file={REPO / 'examples/data/counseling_sample.jsonl'}",
                 "task.args.user_simulator.engine=scripted",
                 "task.args.user_simulator.path=dynalize.tasks.counseling:offline_patient"])
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    assert f"config={REPO / 'configs' / 'counseling_multiturn.yaml'}" in err  # the run names its base config
    metrics = read_jsonl(tmp_path / "mt" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3] and "eval/rm" in metrics[-1]  # step 0: the first evaluation
    for line in read_jsonl(tmp_path / "mt" / "rollouts" / "step_000003.jsonl"):
        # the offline patient answers three times: four policy replies, each scored, each judged
        assert [t["role"] for t in line["turns"]] == ["assistant", "user"] * 3 + ["assistant"]
        assert len(line["rm_scores"]) == 4 and "verdicts" in line
        assert line["policy_tokens"] < line["completion_tokens"]  # the patient's turns are not trained on
