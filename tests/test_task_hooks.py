"""Task hooks as a domain's author meets them: each hook sees its prompt when it asks for it,
evaluation sees whole conversations, and task code that fails is one error naming the hook."""

import re

import anyio
import pytest

from dynalize import tiny
from dynalize.backends.base import RewardModel
from dynalize.backends.hf import load_tokenizer
from dynalize.build import build_reward_model
from dynalize.config import load_config
from dynalize.hooks import HookError, declares
from dynalize.loop import Orchestrator, Parts
from dynalize.rewards.base import score_batch
from dynalize.rewards.rm import RMTerm
from dynalize.rollouts import sample_groups
from dynalize.run import main, summary_table
from dynalize.runlog import RunDir
from dynalize.tasks.base import Task, TaskArgs
from dynalize.types import Batch, Message, Prompt
from toytask import ScriptedGenerator, VowelRM

PERSONAS = {"p0": "grumpy", "p1": "cheerful"}


class PersonaTask(Task):
    """Multi-turn: the simulated user speaks as the persona in its prompt's meta."""

    max_turns = 3

    def __init__(self, args, seed=0):
        super().__init__(args, seed)
        self.seen = []

    def prompts(self, split):
        return [Prompt(pid, [Message("user", f"Hello from {pid}")], meta={"persona": persona})
                for pid, persona in PERSONAS.items()]

    def rm_input(self, conversation, reply, prompt):
        self.seen.append(("rm_input", prompt.id, len(conversation)))
        return f"{prompt.meta['persona']}: {reply}"

    async def user_reply(self, conversation, prompt):
        self.seen.append(("user_reply", prompt.id, len(conversation)))
        return f"({prompt.meta['persona']}) go on"

    async def evaluate(self, prompts, replies, conversations):
        self.seen.append(("evaluate", [p.id for p in prompts], replies, conversations))
        return {"user_turns": sum(m.role == "user" for c in conversations for m in c) / len(conversations)}


class OldStyleTask(PersonaTask):
    """The same hooks written without the optional arguments: still called, without them."""

    def rm_input(self, conversation, reply):
        return reply

    async def user_reply(self, conversation):
        return "go on"

    async def evaluate(self, prompts, replies):
        return {"n": float(len(replies))}


class PromptRM(RewardModel):
    """Scores 1 when the item was made for the prompt it comes with (its persona leads it)."""

    def __init__(self):
        self.calls = []

    async def score(self, items, prompts):
        self.calls.append((items, prompts))
        return [float(x.startswith(p.meta["persona"])) for x, p in zip(items, prompts)]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(tiny.resolve("tiny:policy"))


def numbered(tok):
    count = iter(range(1000))
    return ScriptedGenerator(tok, lambda text: f"reply {next(count)}")


def test_hooks_get_their_prompt_and_the_reward_model_one_prompt_per_reply(tok):
    task = PersonaTask(TaskArgs())
    groups = anyio.run(sample_groups, numbered(tok), tok, task, task.prompts("train"), 2, sampling())
    for g, pid in zip(groups, PERSONAS):
        for r in g:
            persona = PERSONAS[pid]
            assert r.prompt == Prompt(pid, [Message("user", f"Hello from {pid}")], {"persona": persona})
            assert [m.content for m in r.turns if m.role == "user"] == [f"({persona}) go on"] * 2
    rm = PromptRM()
    anyio.run(score_batch, [RMTerm(rm, task)], Batch(0, groups))
    [(items, prompts)] = rm.calls
    assert len(items) == len(prompts) == 4 * 3  # every policy reply of every rollout, each with its prompt
    assert [p.id for p in prompts] == ["p0"] * 6 + ["p1"] * 6
    assert all(r.scores["rm"] == 1.0 for g in groups for r in g)
    # each hook saw its own prompt, with the conversation as docs/add_a_domain.md's table says
    assert ("user_reply", "p1", 2) in task.seen and ("user_reply", "p1", 4) in task.seen
    assert [s for s in task.seen if s[0] == "rm_input" and s[1] == "p0"][:3] == [
        ("rm_input", "p0", 1), ("rm_input", "p0", 3), ("rm_input", "p0", 5)]


def test_hooks_written_without_the_optional_arguments_run_unchanged(tok):
    task = OldStyleTask(TaskArgs())
    assert not declares(task.user_reply, "prompt") and declares(PersonaTask(TaskArgs()).user_reply, "prompt")
    groups = anyio.run(sample_groups, numbered(tok), tok, task, task.prompts("train"), 2, sampling())
    assert all(len(r.replies) == 3 for g in groups for r in g)
    anyio.run(score_batch, [RMTerm(VowelRM(), task)], Batch(0, groups))  # score(items) alone
    assert all(0 <= r.scores["rm"] <= 1 for g in groups for r in g)


def reward_of_persona(replies, prompts):
    return [float(p.meta["persona"] == "grumpy") for p in prompts]


def reward_of_length(replies):
    return [float(len(r)) for r in replies]


@pytest.mark.parametrize(("fn", "expected"), [("reward_of_persona", [1.0, 0.0]), ("reward_of_length", [7.0, 7.0])])
def test_python_reward_function_gets_prompts_when_it_names_them(fn, expected, tok):
    cfg = load_config(None, ["reward_model.engine=python", f"reward_model.path=test_task_hooks:{fn}"])
    task = OldStyleTask(TaskArgs())
    task.max_turns = 1
    groups = anyio.run(sample_groups, numbered(tok), tok, task, task.prompts("train"), 1, sampling())
    anyio.run(score_batch, [RMTerm(build_reward_model(cfg, task), task)], Batch(0, groups))
    assert [g[0].scores["rm"] for g in groups] == expected


def parts(tmp_path, task, tok, terms=()):
    cfg = load_config(None, [f"output_dir={tmp_path}", "eval_every=1", "eval_samples=2", "batch_size=4",
                             "group_size=2"])
    run = RunDir(tmp_path / "run")
    run.create()
    return Parts(cfg=cfg, task=task, tokenizer=tok, generator=numbered(tok), learner=None, terms=list(terms), run=run)


def test_evaluate_gets_whole_conversations_and_the_last_replies(tmp_path, tok):
    task = PersonaTask(TaskArgs())
    metrics = anyio.run(Orchestrator(parts(tmp_path, task, tok)).evaluate, 0)
    assert metrics == {"eval/user_turns": 3.0}  # the opening message and two replies
    [(_, ids, replies, conversations)] = [s for s in task.seen if s[0] == "evaluate"]
    assert ids == ["p0", "p0", "p1", "p1"]  # eval_samples rollouts per held-out prompt
    for reply, convo in zip(replies, conversations):
        assert [m.role for m in convo] == ["user", "assistant", "user", "assistant", "user", "assistant"]
        assert convo[-1].content == reply and convo[0].content.startswith("Hello from")
    old = OldStyleTask(TaskArgs())
    assert anyio.run(Orchestrator(parts(tmp_path, old, tok)).evaluate, 0) == {"eval/n": 4.0}


def test_summary_table_shows_the_tasks_own_eval_metrics():
    cfg = load_config(None, [])
    row = {"step": 0, "dropped_total": 0, "rollouts_per_s": 1.0, "time/step": 1.0, "reward/mean": 0.5}
    history = [{**row, "eval/accuracy": 0.25, "eval/rm": 0.1}, {**row, "step": 1}, {**row, "step": 2, "eval/accuracy": 0.75}]
    shown = {r: (first, last) for r, first, last in zip(*(c._cells for c in summary_table(cfg, history).columns))}
    assert shown["eval/accuracy"] == ("0.250", "0.750") and shown["eval/rm"] == ("0.100", "0.100")


# --- task code that fails ----------------------------------------------------------------------

class FailingUser(PersonaTask):
    async def user_reply(self, conversation, prompt):
        return conversation[5].content  # fails after the first reply


class NotText(PersonaTask):
    async def user_reply(self, conversation, prompt):
        return 42


class FailingRMInput(PersonaTask):
    def rm_input(self, conversation, reply, prompt):
        return prompt.meta["answer"]


class BadMetrics(PersonaTask):
    async def evaluate(self, prompts, replies, conversations):
        return 0.5


class ShortRM(RewardModel):
    async def score(self, items):
        return [0.0]


def sampling():
    from dynalize.backends.base import SamplingParams

    return SamplingParams(max_new_tokens=8)


def test_a_failing_user_reply_is_one_error_naming_the_hook_and_task(tok):
    task = FailingUser(TaskArgs())
    with pytest.raises(HookError) as info:  # four conversations failed: one error, not a group of four
        anyio.run(sample_groups, numbered(tok), tok, task, task.prompts("train"), 2, sampling())
    e = info.value
    assert str(e) == "user_reply of task test_task_hooks:FailingUser raised IndexError: list index out of range"
    assert isinstance(e.__cause__, IndexError) and e.hook == "user_reply"
    with pytest.raises(HookError, match=r"user_reply of task test_task_hooks:NotText raised TypeError: returned a "
                                        r"int, not a str or None"):
        anyio.run(sample_groups, numbered(tok), tok, NotText(TaskArgs()), task.prompts("train"), 2, sampling())


def test_failures_while_scoring_and_evaluating_name_their_hook(tmp_path, tok):
    task = FailingRMInput(TaskArgs())
    task.max_turns = 1
    groups = anyio.run(sample_groups, numbered(tok), tok, task, task.prompts("train"), 2, sampling())
    with pytest.raises(HookError, match=r"^rm_input of task test_task_hooks:FailingRMInput raised KeyError: 'answer'$"):
        anyio.run(score_batch, [RMTerm(VowelRM(), task)], Batch(0, groups))
    with pytest.raises(HookError, match=r"^score of reward model test_task_hooks:ShortRM \(the batch of step 1\) raised EngineError: "
                                        r"returned 1 scores for 4 replies$"):
        anyio.run(score_batch, [RMTerm(ShortRM(), PersonaTask(TaskArgs()))], Batch(0, groups))
    with pytest.raises(HookError, match=r"^evaluate of task test_task_hooks:BadMetrics raised TypeError: returned "
                                        r"0.5, not a dict of metric name → number$"):
        anyio.run(Orchestrator(parts(tmp_path, BadMetrics(TaskArgs()), tok)).evaluate, 0)


def test_the_cli_reports_task_code_failing_in_one_block(tmp_path, capsys):
    code = main([f"output_dir={tmp_path}", "name=fails", "progress=false", "task.name=test_task_hooks:FailingUser",
                 "policy.path=tiny:policy", "reward_model.engine=python",
                 "reward_model.path=test_task_hooks:reward_of_length", "batch_size=4", "group_size=2", "steps=2",
                 "generator.max_new_tokens=4"])
    err = capsys.readouterr().err
    assert code == 1
    block = err[err.index("error: "):]
    assert block.startswith("error: user_reply of task test_task_hooks:FailingUser raised IndexError: list index "
                            "out of range\nTraceback (most recent call last):\n")
    assert "ExceptionGroup" not in err and "anyio" not in block and len(block.splitlines()) < 12
    assert block.count("list index out of range") == 2  # the headline and the original error's own line
    assert re.search(r'test_task_hooks.py", line \d+, in user_reply\n +return conversation\[5\]', block)
    assert not (tmp_path / "fails" / "metrics.jsonl").exists()  # the failed step logged nothing
