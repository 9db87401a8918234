"""A short Dynalize arm of the sandbox experiment: the lexical proposer, never told the planted
features, puts a penalty in the buffer whose regex reacts to one of them.

"Reacts": on clean corpus replies, adding the feature (`Feature.insert`) raises the regex's match
rate by at least 0.5 (the same test as benchmarks/sandbox_table.py). 8 prompts × 8 samples,
a proposal every 5 steps over the batches since the previous one, 20 steps: about 15 s on one
CPU thread.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import anyio
import pytest

from dynalize.config import load_config
from dynalize.run import train
from dynalize.runlog import read_jsonl
from dynalize.tasks.sandbox import default_features
from dynalize.tasks.sandbox.grammar import corpus

STEPS = 30  # under issue 55's null (each pattern's pay net of the prompt's words a reply uses) the first
# penalty enters at step 27 on this seed (within 20 steps before): the planted closing question


def reaction(regex: str, feature, base: list[str]) -> float:
    rx = re.compile(regex)
    rng = random.Random(0)
    with_f = sum(bool(rx.search(feature.insert(r, rng))) for r in base)
    return (with_f - sum(bool(rx.search(r)) for r in base)) / len(base)


@pytest.mark.slow
def test_dynalize_discovers_a_planted_feature(tmp_path):
    cfg = load_config("configs/sandbox_dynalize.yaml", [
        f"output_dir={tmp_path}", "name=short", f"steps={STEPS}", "batch_size=64", "group_size=8",
        "eval_every=0", "progress=false", "torch_threads=1", "penalties.view_per_group=8",
        "penalties.sync=true",  # when a penalty enters does not depend on the machine's load
    ])
    assert cfg.penalties.enabled and cfg.penalties.proposer.engine == "lexical"
    assert cfg.penalties.judge.engine == "regex"
    history = anyio.run(train, cfg, False)
    assert len(history) == STEPS

    events = read_jsonl(tmp_path / "short" / "penalties.jsonl")
    adds = [e for e in events if e["event"] == "add"]
    assert adds, "the proposer added no penalty"
    features = default_features()
    base = [r for _, r in corpus(800, seed=1) if not any(f.present(r) for f in features)][:200]
    matched = {}
    for e in adds:
        scores = {f.label: reaction(e["regex"], f, base) for f in features}
        best = max(scores, key=scores.get)
        if scores[best] >= 0.5:
            matched[e["id"]] = (best, e["title"], e["step"])
    assert matched, f"no penalty matches a planted feature: {[e['title'] for e in adds]}"

    # the penalty is judged on the batches after it entered, and costs reward where it triggers
    pid, (label, title, step) = next(iter(matched.items()))
    later = [json.loads(line) for line in
             (tmp_path / "short" / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines()]
    assert all(pid in r["verdicts"] for r in later)
    for r in later:
        assert r["reward"] == pytest.approx(r["rm_score"] - 0.5 * r["violations"])

    # confirmed with the run's own reward (issue 57): the pay it measured on edited replies holds
    # what the same check pays with the sandbox RM's noise-free parts, planted bonus and gold
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from sandbox_table import edit_pay
    add = next(e for e in adds if e["id"] == pid)
    conf, pay = add["confirmation"], edit_pay(add["regex"], tmp_path / "short", step, features)
    assert conf["state"] == "confirmed" and pay is not None and pay["n"] >= 8, (conf, pay)
    assert conf["lo"] <= pay["bonus"] + pay["gold"] <= conf["hi"], (conf, pay)
