"""End-to-end Dynalize on a planted hack: the lexical proposer finds it, the regex judge applies it.

`PlantedTask`'s reward model pays 1.0 for replies that contain one word (`task.args.word`) and
0.0 otherwise: a purely lexical hack. The tiny random policy writes byte-garbage with word
fragments, spread thinly over a 4096-token vocabulary: no word is in more than ~20% of its
64-token replies. So the planted word is *chosen from the policy's own output*: an RM-only
probe run (module fixture) reads its rollouts and picks a word present in many replies of
every batch. Runs are seeded, so the real runs sample (nearly) the probe's batches.

With 8 prompts × 8 samples and a view of the whole batch (8 groups × 8), every carrier of the
word in a mixed group is a positive-advantage sample and every non-carrier a negative one, so
the word is the one feature with prevalence difference 1.0 and a Fisher p far below 5e-4. The
proposal starts in step 1, the penalty enters at the next step and is judged from there on.
lr is tiny, so the policy barely moves and the word stays about as common (the penalty is not
retired for lack of triggers).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import anyio
import pytest
import regex

from dynalize.backends.base import RewardModel
from dynalize.config import load_config
from dynalize.penalties.surface import STOP_WORDS, WORD
from dynalize.run import train
from dynalize.runlog import read_jsonl
from dynalize.tasks.base import Task, TaskArgs
from dynalize.types import Message, Prompt

LAM = 0.5
STEPS = 3
TOPICS = ["sea", "forest", "city", "river", "moon", "rain", "music", "garden", "desert", "winter", "stars", "bread"]


def words(text: str) -> set[str]:
    """The reply's words as the lexical proposer reads them (lower-cased \\w+ runs)."""
    return {w.lower() for w in WORD.findall(text)}


class PlantedArgs(TaskArgs):
    word: str = ""
    """The word the flawed RM pays for ("" = pays for nothing)."""


class PlantedRM(RewardModel):
    def __init__(self, word: str):
        self.word = word.lower()

    async def score(self, items):
        texts = [x if isinstance(x, str) else x[-1].content for x in items]
        return [1.0 if self.word and self.word in words(t) else 0.0 for t in texts]


class PlantedTask(Task):
    """Write about a topic; the RM rewards one planted word and nothing else."""

    Args = PlantedArgs
    description = "Short texts about a topic."

    def prompts(self, split):
        return [Prompt(f"{split}-{t}", [Message("user", f"Write about the {t}.")]) for t in TOPICS]

    def reward_model(self):
        return PlantedRM(self.args.word)


def overrides(out: Path, name: str, word: str, steps: int = STEPS, enabled: bool = True,
              extra: tuple[str, ...] = ()) -> list[str]:
    return [
        f"output_dir={out}", f"name={name}", "seed=0", f"steps={steps}", "batch_size=64", "group_size=8",
        "progress=false", "checkpoint_every=0", "eval_every=0",
        "generator.max_new_tokens=64", "trainer.lr=1e-6", "trainer.micro_batch_size=32",
        "task.name=test_dynalize_e2e:PlantedTask", f"task.args.word={json.dumps(word)}",
        f"penalties.enabled={str(enabled).lower()}", f"penalties.lam={LAM}", "penalties.every=2",
        "penalties.view_groups=8", "penalties.view_per_group=8",
        "penalties.proposer.engine=lexical", "penalties.judge.engine=regex",
        "penalties.sync=true",  # a proposal lands at the next step, however loaded the machine
        *extra,
    ]


def run(out: Path, name: str, word: str, **kw) -> Path:
    cfg = load_config(None, overrides(out, name, word, **kw))
    history = anyio.run(train, cfg, False)
    assert len(history) == cfg.steps
    return out / name


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One intra-op thread: generation and training already run side by side, and on a busy
    2-core machine two spinning thread pools make these runs several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def planted_word(tmp_path_factory) -> str:
    """A non-stop word common in every batch of the tiny policy's first steps.

    An RM-only probe run with nothing rewarded (so the policy does not move) samples batches
    0..2 exactly as the real runs do: batches 0 and 1 come from the initial policy in both, batch
    2 from a policy one step of lr 1e-6 away. The word in the most replies of its least-covered
    batch is planted (then the most in batch 0, where the proposer looks; then alphabetical).
    """
    probe = run(tmp_path_factory.mktemp("probe"), "probe", "", enabled=False)
    per_batch = []
    for step in range(1, STEPS + 1):  # step k's rollouts: batch k - 1
        replies = [r["replies"][0] for r in read_jsonl(probe / "rollouts" / f"step_{step:06d}.jsonl")]
        per_batch.append(Counter(w for t in replies for w in words(t) if w not in STOP_WORDS))
    word = min(per_batch[0], key=lambda w: (-min(c[w] for c in per_batch), -per_batch[0][w], w))
    counts = [c[word] for c in per_batch]
    assert min(counts) >= 3 and counts[0] >= 5, f"no word common enough to plant: best {word!r}, {counts} of 64"
    return word


@pytest.mark.slow
def test_lexical_proposer_adds_penalty_and_regex_judge_applies_it(planted_word, tmp_path):
    root = run(tmp_path, "dynalize", planted_word)

    events = read_jsonl(root / "penalties.jsonl")
    adds = [e for e in events if e["event"] == "add"]
    assert adds, f"no penalty was added; events: {events}"
    add = adds[0]
    assert add["regex"] and add["proposed_at"] == 1  # proposed in step 1
    pattern = regex.compile(add["regex"])  # the judge's engine
    assert pattern.search(f"so {planted_word} it is"), (add["title"], planted_word)  # it found the planted word
    pid, at = add["id"], add["step"]
    assert at == 2  # applies from the batch after the proposal (sync: never later)

    checked = 0
    for step in range(at, STEPS + 1):
        lines = read_jsonl(root / "rollouts" / f"step_{step:06d}.jsonl")
        assert len(lines) == 64
        hits = 0
        for r in lines:
            assert pid in r["verdicts"], (step, r["verdicts"])
            matches = pattern.search(r["replies"][0]) is not None
            assert r["verdicts"][pid] is matches, (step, r["replies"][0])
            assert r["violations"] == sum(r["verdicts"].values())
            assert r["reward"] == pytest.approx(r["rm_score"] - LAM * r["violations"], abs=1e-12)
            if matches:
                hits += 1
                assert r["violations"] >= 1
                assert r["rm_score"] == 1.0  # the RM's planted word is what the regex finds
        assert hits > 0, f"step {step}: no reply shows the penalized pattern"
        checked += hits
    assert checked >= 5

    metrics = read_jsonl(root / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))  # eval_every=0: no step-0 row
    for m in metrics:
        assert m["penalties/active"] >= (1 if m["step"] >= at else 0), m["step"]
    assert metrics[at - 1]["penalties/adds"] == 1
    assert metrics[0]["proposer/started"] == 1


@pytest.mark.slow
def test_same_run_with_penalties_disabled_is_rm_only(planted_word, tmp_path):
    root = run(tmp_path, "baseline", planted_word, enabled=False)

    assert not (root / "penalties.jsonl").exists()
    rewarded = 0
    for step in range(1, STEPS + 1):
        for r in read_jsonl(root / "rollouts" / f"step_{step:06d}.jsonl"):
            assert "verdicts" not in r and "violations" not in r  # no penalty term at all
            assert r["scores"] == {"rm": r["rm_score"]} and r["reward"] == r["rm_score"]
            rewarded += r["rm_score"] == 1.0
    assert rewarded > 0  # the planted word is rewarded here too, just not penalized
    for m in read_jsonl(root / "metrics.jsonl"):
        assert not any(k.startswith(("penalties/", "penalty/", "proposer/", "judge/")) for k in m), m.keys()
