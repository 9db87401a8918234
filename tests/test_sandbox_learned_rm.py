"""The sandbox's learned RM: pairs the formula RM labels, the tiny Bradley–Terry RM trained on them
(`tiny:sandbox-rm`), which inherits the planted preferences it was never told, at the formula's
scale, and loads through the `hf` engine."""

import json
import random
import statistics
from pathlib import Path

import anyio
import pytest
import yaml

from dynalize.backends.hf import HFRewardModel
from dynalize.build import model_dir
from dynalize.rm.pairfile import read_pairs
from dynalize.tasks.sandbox import SandboxRewardModel, default_features
from dynalize.tasks.sandbox.grammar import corpus, prompt_text
from dynalize.tasks.sandbox.learned_rm import ORIGINAL_PAIRS, TRAINING, labelled_pairs, reply_pool
from dynalize.tasks.sandbox.topics import ALL_TOPICS, find_topic
from dynalize.types import Message

ROOT = Path(__file__).resolve().parents[1]


def test_pairs_prefer_what_the_formula_rm_scores_higher():
    judge = SandboxRewardModel(default_features())
    pool = reply_pool(seed=3, corpus_per_topic=6, policy_per_topic=0)
    pairs = labelled_pairs(pool, judge, 300, seed=3)
    assert len(pairs) == 300 and len({(p.chosen, p.rejected) for p in pairs}) == 300
    for p in pairs:
        topic = find_topic(p.prompt[0].content.removeprefix("Write about ").rstrip("."))
        assert p.prompt[0].content == prompt_text(topic) and p.prompt_id == topic.id
        assert p.chosen in pool[topic.name] and p.rejected in pool[topic.name]
        assert judge.score_one(topic, p.chosen) > judge.score_one(topic, p.rejected)
    assert len({p.prompt_id for p in pairs}) == len(ALL_TOPICS)  # topics in turn


def test_the_retraining_config_is_the_learned_rms_own_recipe():
    cfg = yaml.safe_load((ROOT / "configs" / "rm" / "sandbox_retrain.yaml").read_text())
    assert {k: cfg[k] for k in TRAINING} == TRAINING
    assert cfg["base"] == "tiny:sandbox-policy" and cfg["task"] == {"name": "sandbox"}


@pytest.mark.slow
def test_the_learned_rm_inherits_the_planted_preferences_at_the_formulas_scale():
    rm_dir = Path(model_dir("tiny:sandbox-rm"))  # built once per cache (about a minute)
    summary = json.loads((rm_dir / "rm_training.json").read_text())
    assert summary["after"]["original"]["accuracy"] >= 0.65 and summary["after"]["original"]["pairs"] == 400
    assert len(read_pairs(rm_dir / ORIGINAL_PAIRS)) == 4000
    rm = HFRewardModel(str(rm_dir), max_length=256)
    formula = SandboxRewardModel(default_features(), noise=0)
    features = default_features()
    clean = [(t, r) for t, r in corpus(1500, seed=77) if not any(f.present(r) for f in features)][:200]

    def scores(replies):
        return anyio.run(rm.score, [[Message("user", prompt_text(t)), Message("assistant", r)] for t, r in replies])

    base = scores(clean)
    spread = statistics.pstdev(base) / statistics.pstdev([formula.score_one(t, r) for t, r in clean])
    assert 0.5 < spread < 2.0  # scaled to the formula's spread (on other replies: not exactly 1)
    for f in features:
        rng = random.Random(0)
        with_f = scores([(t, f.insert(r, rng)) for t, r in clean])
        up = statistics.fmean(b > a for a, b in zip(base, with_f))
        assert up > 0.5, f"the learned RM does not pay for {f.label}: up on {up:.2f} of replies"
