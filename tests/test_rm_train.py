"""`python -m dynalize.rm train`: the Bradley–Terry loss, learning a separable toy set, the RM reading
what the task's `rm_input` gives, the trained RM loaded by the existing `hf` engine, the scale
kept, and bad pair files as one-line errors."""

import json
import math
import random
import statistics
from pathlib import Path

import anyio
import pytest
import torch
import yaml
from datasets import Dataset

from dynalize.backends.hf import HFRewardModel, encode_rm_input, load_tokenizer
from dynalize.build import build_reward_model, build_reward_trainer, model_dir
from dynalize.config import load_config
from dynalize.rm.__main__ import main as rm_main
from dynalize.rm.config import RMTrainConfig
from dynalize.rm.pairfile import parse_pair, read_pairs
from dynalize.rm.train import PairReader, bt_loss, pair_accuracy, split_pairs, tokenized
from dynalize.tasks.base import Task
from dynalize.types import Message, Prompt

TOPICS = ["sea", "forest", "city", "river", "mountain", "garden", "desert", "moon", "stars", "rain"]


def toy_pairs(path: Path, n: int = 200, seed: int = 0) -> Path:
    """Separable pairs: the chosen reply says "calm", the rejected one "loud"; the rest is noise."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        t, a, b = rng.choice(TOPICS), rng.choice(TOPICS), rng.choice(TOPICS)
        rows.append({"prompt": f"Write about the {t}.", "chosen": f"The {a} is calm, like the {b}.",
                     "rejected": f"The {a} is loud, like the {b}.", "prompt_id": t})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class ReplyOnlyTask(Task):
    """A task whose RM reads the reply alone, as raw text (as creative_writing's does)."""

    def prompts(self, split):
        return [Prompt(t, [Message("user", f"Write about the {t}.")], meta={"topic": t}) for t in TOPICS]

    def rm_input(self, conversation, reply, prompt):
        return f"[{prompt.meta.get('topic', '?')}] {reply}"


def test_bt_loss_is_the_trainers_loss():
    cfg = RMTrainConfig(base="tiny:rm", pairs="unused", out="unused-out", seed=0)
    base = model_dir("tiny:rm")
    tok = load_tokenizer(base)
    rows = [parse_pair({"prompt": "Write.", "chosen": f"calm {i}", "rejected": f"loud {i}"}, "t") for i in range(4)]
    columns = tokenized(tok, PairReader(None), rows, 64)
    trainer = build_reward_trainer(cfg, base, tok, Dataset.from_dict(columns))
    batch = trainer.data_collator([{"chosen_ids": c, "rejected_ids": r}
                                   for c, r in zip(columns["chosen_ids"], columns["rejected_ids"])])
    model = trainer.model.eval()
    batch = {k: v.to(model.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    with torch.no_grad():
        loss = trainer.compute_loss(model, dict(batch))
        scores = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 0]
    chosen, rejected = scores[:4], scores[4:]
    expected = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    by_hand = statistics.fmean(bt_loss(m) for m in (chosen - rejected).tolist())
    assert by_hand == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("ratio, batch_size, grad_accum, warmup", [(1.0, 2, 1, 5), (0.5, 2, 2, 2), (0.0, 4, 1, 0)])
def test_warmup_ratio_is_a_share_of_the_optimizer_steps(tmp_path, ratio, batch_size, grad_accum, warmup):
    cfg = RMTrainConfig(base="tiny:rm", pairs="unused", out=str(tmp_path / "out"), seed=0, warmup_ratio=ratio,
                        batch_size=batch_size, grad_accum=grad_accum, lr_scheduler="linear",
                        trainer_args={"logging_steps": 1})
    base = model_dir("tiny:rm")
    tok = load_tokenizer(base)
    rows = [parse_pair({"prompt": "Write.", "chosen": f"calm {i}", "rejected": f"loud {i}"}, "t") for i in range(10)]
    trainer = build_reward_trainer(cfg, base, tok, Dataset.from_dict(tokenized(tok, PairReader(None), rows, 64)))
    assert trainer.args.warmup_steps == warmup
    trainer.train()
    lrs = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    steps = math.ceil(math.ceil(10 / batch_size) / grad_accum)
    assert len(lrs) == steps  # the count the warmup was taken from is the trainer's own
    if ratio == 1.0:  # warming up over the whole run: the rate only rises
        assert lrs == sorted(lrs) and lrs[-1] < cfg.lr


def test_pair_accuracy_and_loss_by_hand():
    m = pair_accuracy([2.0, 0.0, 1.0], [1.0, 0.0, 3.0])  # margins 1, 0 (a tie is not right), -2
    assert m["accuracy"] == pytest.approx(1 / 3) and m["margin"] == pytest.approx(-1 / 3)
    assert bt_loss(0.0) == pytest.approx(0.693147, rel=1e-5) and bt_loss(-100.0) == 100.0


def test_the_held_out_split_is_seeded_and_per_file():
    a = split_pairs("original", "x", list(range(50)), 0.1, None, seed=0)
    b = split_pairs("original", "y", list(range(50)), 0.1, None, seed=0)
    c = split_pairs("new", "x", list(range(50)), 0.1, None, seed=0)
    assert a.held_out == b.held_out and len(a.held_out) == 5 and len(a.train) == 45
    assert a.held_out != c.held_out
    assert len(split_pairs("original", "x", list(range(50)), 0.1, 2, seed=0).held_out) == 2


def test_the_rm_reads_what_the_tasks_rm_input_gives(tmp_path):
    tok = load_tokenizer(model_dir("tiny:rm"))
    rows = read_pairs(toy_pairs(tmp_path / "p.jsonl", 3))
    columns = tokenized(tok, PairReader(ReplyOnlyTask(ReplyOnlyTask.Args())), rows, 64)
    assert columns["chosen_ids"][0] == encode_rm_input(tok, f"[{rows[0].prompt_id}] {rows[0].chosen}", 64)
    chat = tokenized(tok, PairReader(None), rows, 64)  # no task: the chat with the reply, through the template
    msgs = [*rows[0].prompt, Message("assistant", rows[0].chosen)]
    assert chat["chosen_ids"][0] == encode_rm_input(tok, msgs, 64)
    assert tok.decode(chat["chosen_ids"][0]).count("<|im_start|>") == 2


@pytest.mark.slow
def test_a_separable_toy_set_is_learned_and_the_rm_loads_through_the_hf_engine(tmp_path, capsys):
    pairs, extra = toy_pairs(tmp_path / "original.jsonl", 200), toy_pairs(tmp_path / "new.jsonl", 60, seed=1)
    out = tmp_path / "rm"
    assert rm_main(["train", "--base", "tiny:rm", "--pairs", str(pairs), "--extra", str(extra), "--out", str(out),
                    "lr=1e-3", "epochs=2", "batch_size=16", "threads=1", "eval_fraction=0.2",
                    "trainer_args.disable_tqdm=true"]) == 0
    summary = json.loads((out / "rm_training.json").read_text())
    assert summary["held_out_pairs"] == {"original": 40, "new": 12}
    assert summary["train_pairs"] == {"original": 160, "new": 48}
    assert summary["after"]["original"]["accuracy"] == 1.0 and summary["after"]["new"]["accuracy"] == 1.0
    assert summary["before"]["original"]["accuracy"] < 0.9  # a random head: no better than chance by construction
    assert summary["after"]["original"]["loss"] < summary["before"]["original"]["loss"]
    assert "100.0%" in capsys.readouterr().err  # the accuracy table
    assert not (out / "training_args.bin").exists()
    # the run's own factory loads it: reward_model.engine hf, unchanged
    cfg = load_config(overrides=["reward_model.engine=hf", f"reward_model.path={out}"])
    rm = build_reward_model(cfg, task=None)
    assert isinstance(rm, HFRewardModel)
    held = split_pairs("original", str(pairs), read_pairs(pairs), 0.2, 1000, 0).held_out
    chosen, rejected = PairReader(None).items(held)
    scores = anyio.run(rm.score, chosen + rejected)
    assert all(c > r for c, r in zip(scores[:len(held)], scores[len(held):]))
    assert pair_accuracy(scores[:len(held)], scores[len(held):])["margin"] == pytest.approx(
        summary["after"]["original"]["margin"], rel=1e-4)


@pytest.mark.slow
def test_keep_scale_spreads_scores_as_the_previous_rm_did(tmp_path):
    pairs = toy_pairs(tmp_path / "p.jsonl", 120)
    first, second, third = tmp_path / "v1", tmp_path / "v2", tmp_path / "v3"
    common = ["lr=1e-3", "batch_size=16", "threads=1", "trainer_args.disable_tqdm=true"]
    assert rm_main(["train", "--base", "tiny:rm", "--pairs", str(pairs), "--out", str(first), "epochs=1", *common]) == 0
    # from the RM itself (the base is the previous RM) and from a bare LM with previous= naming the RM it replaces
    assert rm_main(["train", "--base", str(first), "--pairs", str(pairs), "--out", str(second), "epochs=3",
                    "keep_scale=true", *common]) == 0
    assert rm_main(["train", "--base", "tiny:policy", "--pairs", str(pairs), "--out", str(third), "epochs=3",
                    f"previous={first}", "keep_scale=true", *common]) == 0
    rows = split_pairs("original", str(pairs), read_pairs(pairs), 0.1, 1000, 0).train  # all 108: the sample is all
    items = [x for pair in zip(*PairReader(None).items(rows)) for x in pair]
    spread = [statistics.pstdev(anyio.run(HFRewardModel(str(d), max_length=2048).score, items))
              for d in (first, second, third)]
    assert spread[1] == pytest.approx(spread[0], rel=1e-3) and spread[2] == pytest.approx(spread[0], rel=1e-3)
    for d in (second, third):
        summary = json.loads((d / "rm_training.json").read_text())
        assert summary["scale"] != pytest.approx(1.0, abs=0.05)  # the rescaling did something
        assert summary["previous"] == str(first) and summary["before"]["original"]["pairs"] == 12


def test_keep_scale_without_a_previous_rm_is_refused(tmp_path, capsys):
    pairs = toy_pairs(tmp_path / "p.jsonl", 8)
    assert rm_main(["train", "--base", "tiny:policy", "--pairs", str(pairs), "--out", str(tmp_path / "o"),
                    "keep_scale=true"]) == 2
    assert "keep_scale needs a previous RM" in capsys.readouterr().err
    assert rm_main(["train", "--base", "tiny:policy", "--pairs", str(pairs), "--out", str(tmp_path / "o"),
                    "previous=tiny:policy"]) == 2
    assert "is not a reward model" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("line, problem", [
    ("not json", "not valid JSON"),
    ('{"prompt": "x", "chosen": "a"}', "missing rejected"),
    ('{"prompt": "x", "chosen": "a", "rejected": "a"}', "the same text"),
    ('{"prompt": 3, "chosen": "a", "rejected": "b"}', "prompt must be a string or a list of messages"),
    ('{"prompt": [{"role": "bot", "content": "x"}], "chosen": "a", "rejected": "b"}', "prompt[0] must be"),
    ('{"prompt": "x", "chosen": "", "rejected": "b"}', "chosen must be a non-empty string"),
    ('[1, 2]', "expected a JSON object"),
])
def test_bad_pair_files_are_one_line_errors_and_write_nothing(tmp_path, capsys, line, problem):
    good = json.dumps({"prompt": "x", "chosen": "a", "rejected": "b"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good + "\n" + line + "\n")
    out = tmp_path / "out"
    assert rm_main(["train", "--base", "tiny:rm", "--pairs", str(tmp_path / "good.jsonl"), "--out", str(out)]) == 2
    assert "pair file not found" in capsys.readouterr().err
    (tmp_path / "good.jsonl").write_text(good + "\n")
    assert rm_main(["train", "--base", "tiny:rm", "--pairs", str(tmp_path / "good.jsonl"), "--extra", str(bad),
                    "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{bad} line 2: " in err and problem in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_empty_pair_files_settings_and_outputs_are_refused(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("\n")
    assert rm_main(["train", "--base", "tiny:rm", "--pairs", str(tmp_path / "empty.jsonl"), "--out", "x"]) == 2
    assert "empty.jsonl has no rows" in capsys.readouterr().err
    good = toy_pairs(tmp_path / "p.jsonl", 4)
    assert rm_main(["train", "--base", "tiny:rm", "--pairs", str(good), "--out", "x", "lr=-1"]) == 2
    assert "lr" in capsys.readouterr().err
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    assert rm_main(["train", "--base", "tiny:rm", "--pairs", str(good), "--out", str(used)]) == 2
    assert "not empty" in capsys.readouterr().err and (used / "keep.txt").read_text() == "mine"
    assert rm_main(["train", "--base", str(tmp_path / "nope"), "--pairs", str(good), "--out", "x"]) == 2
    assert "--base" in capsys.readouterr().err
    assert rm_main(["train", "--base", "tiny:rm", "--pairs", str(good), "--out", "x", "--task", str(tmp_path)]) == 2
    assert "no config.yaml" in capsys.readouterr().err


def test_task_comes_from_a_name_or_a_run_directory(tmp_path):
    from dynalize.rm.__main__ import parse_train_args

    run = tmp_path / "run"
    run.mkdir()
    task = {"name": "sandbox", "args": {"n_eval_topics": 5}}
    (run / "config.yaml").write_text(yaml.safe_dump({"name": "x", "task": task}))
    common = ["--base", "tiny:rm", "--pairs", "p.jsonl", "--out", "o"]
    assert parse_train_args([*common, "--task", str(run)]).task.model_dump() == task
    assert parse_train_args([*common, "--task", "creative_writing"]).task.name == "creative_writing"
    assert parse_train_args(common).task is None
    cfg = parse_train_args([*common, "--task", "sandbox", "task.args.n_train_topics=7", "lr=2e-6"])
    assert cfg.task.args == {"n_train_topics": 7} and cfg.lr == 2e-6
