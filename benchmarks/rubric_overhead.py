"""What Rubric Dropout costs over fixed-rubric training: judge calls and time, side by side.

    python benchmarks/rubric_overhead.py [--repeats 15] [--step-time S]

Scores the same batches with the rubric term of each arm (fixed rubric, dropout f = 0.3 and 0.5,
POW3R-style reweighting), interleaved and repeated, in two shapes:

  world   the rubric world's batch (16 prompts x 8 samples, 10 criteria), its rule-based judge
  paper   the paper's batch shape (32 prompts x 16 samples, 15 criteria per rubric), an LLM judge
          (a scripted chat model answering instantly: the full prompt / JSON path, no network)

and prints per arm: judge calls per step, verdicts asked, characters of judge prompts, the
median time of the score phase, its difference from the fixed rubric's, and that difference as
a share of a training step (`--step-time`, default: the median step time of a fixed-rubric world
run, measured here over a few steps, or read from runs/rubric_table_default/base_s0 if present).
Dropout sends each reply's full rubric to the judge (`rubric.judge_dropped`, the default), so the
calls and prompts are those of the fixed rubric; what it adds is drawing one mask per group.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dynalize.backends.chat import ScriptedChatModel  # noqa: E402
from dynalize.build import build_criteria_judge  # noqa: E402
from dynalize.judge.judge import RUBRIC_PROMPT, Judge  # noqa: E402
from dynalize.rewards.rubric import RubricTerm  # noqa: E402
from dynalize.rubrics.config import RubricConfig, RubricJudgeConfig  # noqa: E402
from dynalize.rubrics.criteria import Criterion  # noqa: E402
from dynalize.rubrics.dropout import DropoutSpec, keep_mask  # noqa: E402
from dynalize.runlog import read_jsonl  # noqa: E402
from dynalize.tasks.base import build_task  # noqa: E402
from dynalize.types import Batch, Message, Rollout  # noqa: E402

ARMS = {"fixed": {}, "dropout 0.3": {"dropout": {"f": 0.3}}, "dropout 0.5": {"dropout": {"f": 0.5}},
        "POW3R-style": {"reweight": {"method": "pow3r_port"}}}
WORDS = "the a sea river calm deep bright waves salt gulls wind and of to is are in it".split()


def rollout(prompt_id: str, meta: dict, rng: random.Random, group: int) -> Rollout:
    reply = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))).capitalize() + "."
    return Rollout(prompt_id=prompt_id, group=group, prompt_ids=[1], completion_ids=[2], logprobs=[0.0],
                   loss_mask=[1], replies=[reply], policy_version=0, messages=[Message("user", "Write.")],
                   meta=meta, turns=[Message("assistant", reply)])


def world_batches(n: int) -> tuple[list[Batch], dict]:
    task = build_task("rubric_world", {}, seed=0)
    prompts = task.prompts("train")
    rng = random.Random(0)
    batches = []
    for step in range(n):
        chosen = rng.sample(prompts, 16)
        batches.append(Batch(step, [[rollout(p.id, p.meta, rng, g) for _ in range(8)] for g, p in enumerate(chosen)]))
    judge = {"engine": "local", "predicate": "dynalize.tasks.rubric_world:proxy_verdict"}
    return batches, judge


def paper_batches(n: int) -> tuple[list[Batch], None]:
    rng = random.Random(1)
    batches = []
    for step in range(n):
        groups = []
        for g in range(32):
            crit = [Criterion(f"q{step}-{g}#{k}", f"Mentions {rng.choice(WORDS)} and {rng.choice(WORDS)} clearly",
                              rng.choice([-5, -2, 1, 3, 5, 7, 9]) if k else 5) for k in range(15)]
            meta = {"rubric": [c.to_dict() for c in crit]}
            groups.append([rollout(f"q{step}-{g}", meta, rng, g) for _ in range(16)])
        batches.append(Batch(step, groups))
    return batches, None


class Counting:
    """A scripted LLM judge that counts calls and prompt characters."""

    def __init__(self) -> None:
        self.calls = 0
        self.chars = 0

    def __call__(self, messages: list[Message]) -> str:
        import re

        self.calls += 1
        self.chars += sum(len(m.content) for m in messages)
        keys = re.findall(r"^- (c\d+): ", messages[-1].content, flags=re.M)
        return json.dumps({k: (len(k) + self.calls) % 3 == 0 for k in keys})


def make_term(arm: str, judge_spec: dict | None) -> tuple[RubricTerm, Counting | None]:
    cfg = RubricConfig(enabled=True, **ARMS[arm])
    if judge_spec is None:
        counter = Counting()
        judge = Judge(ScriptedChatModel(counter), RubricJudgeConfig(engine="llm", chat={"engine": "scripted",
                                                                                         "path": "x:y"}),
                      prompt=RUBRIC_PROMPT)
        return RubricTerm(cfg, judge, steps=100), counter
    return RubricTerm(cfg, build_criteria_judge(RubricJudgeConfig(**judge_spec)), steps=100), None


def measure(batches: list[Batch], judge_spec: dict | None, repeats: int) -> dict[str, dict[str, float]]:
    times: dict[str, list[float]] = {a: [] for a in ARMS}
    stats: dict[str, dict[str, float]] = {}
    for arm in ARMS:  # warm-up: imports, caches, the first thread pool
        anyio.run(make_term(arm, judge_spec)[0].score, batches[0])
    for r in range(repeats):
        order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))  # interleaved, both orders
        for arm in order:
            term, counter = make_term(arm, judge_spec)
            t0 = time.perf_counter()
            for b in batches:
                anyio.run(term.score, b)
            times[arm].append((time.perf_counter() - t0) / len(batches))
            m = term.metrics()
            stats[arm] = {"calls": (counter.calls if counter else 0) / len(batches),
                          "verdicts": term.totals["rubric/verdicts"] / len(batches),
                          "chars": (counter.chars if counter else 0) / len(batches),
                          "kept": m.get("rubric/kept_frac", 1.0)}
    for arm in ARMS:
        stats[arm]["ms"] = 1000 * statistics.median(times[arm])
    return stats


def world_step_time() -> float:
    runs = ROOT / "runs" / "rubric_table_default" / "base_s0" / "metrics.jsonl"
    if runs.is_file():
        return statistics.median(m["time/step"] for m in read_jsonl(runs))
    from dynalize.config import load_config
    from dynalize.run import train
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(ROOT / "configs" / "rubric_world.yaml", [f"output_dir={tmp}", "steps=5", "eval_every=0",
                                                                   "progress=false"])
        history = anyio.run(train, cfg, False, "benchmark")
    return statistics.median(h["time/step"] for h in history[1:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--step-time", type=float, default=None, help="seconds per training step to compare with")
    args = ap.parse_args(argv)
    step = args.step_time or world_step_time()
    print(f"## Rubric Dropout's cost over fixed-rubric training (score phase; step time {step:.2f} s)\n")
    print("| shape | arm | judge calls / step | verdicts asked / step | judge prompt chars / step | kept fraction "
          "| score ms (median) | vs fixed, ms | vs fixed, % of a step |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for shape, (batches, spec) in {"world": world_batches(4), "paper": paper_batches(2)}.items():
        stats = measure(batches, spec, args.repeats)
        base = stats["fixed"]["ms"]
        for arm, s in stats.items():
            extra = s["ms"] - base
            print(f"| {shape} | {arm} | {s['calls']:.0f} | {s['verdicts']:.0f} | {s['chars']:.0f} | {s['kept']:.2f} "
                  f"| {s['ms']:.1f} | {extra:+.1f} | {100 * extra / (1000 * step):+.2f}% |")
    print(f"\n{args.repeats} repeats, arms interleaved; world judge: the world's rule-based proxy (no LLM calls); "
          "paper judge: a scripted chat model (full prompt rendering and JSON parsing, no network).")
    crit = [Criterion(f"c{k}", "x", float(k % 7) - 1.0 or 2.0) for k in range(15)]
    spec = DropoutSpec(f=0.5)
    n = 20000
    t0 = time.perf_counter()
    for i in range(n):
        keep_mask(crit, spec, f"instance-{i}", i)
    per = (time.perf_counter() - t0) / n
    print(f"Drawing one group's keep-mask (15 criteria, f = 0.5): {1e6 * per:.1f} µs; for the paper's 32 groups a "
          f"step, {1e3 * 32 * per:.2f} ms.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
