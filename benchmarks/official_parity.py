"""Our HealthBench and ResearchQA harnesses against the official code, on the same grader replies.

    python benchmarks/official_parity.py --simple-evals ~/src/simple-evals --researchqa ~/src/ResearchQA \
        [--examples 60] [--seed 3]

Reads your checkouts (nothing is downloaded) and runs, side by side, the official scoring on a
synthetic set in the official format (seeded: rubrics with negative points, tags at both levels,
several turns) and ours, with one deterministic fake grader answering both (a hash of the prompt
decides; some replies are malformed: not JSON, `"true"` as a string, a fenced block, a wrong
number of ratings). HealthBench: `HealthBenchEval.grade_sample` per example, then
`_aggregate_get_clipped_mean` with numpy's global state seeded as ours, against
`dynalize.eval.healthbench`; every metric (means, n_samples, bootstrap stds) is compared.
ResearchQA: `compute_coverage` against `dynalize.eval.researchqa`, per item and overall.
The official modules' own imports that need the network or an API key (blobfile, the OpenAI
sampler, openai) are replaced by small stand-ins; `pip install retry tqdm` for ResearchQA's.
Exit status 1 when a number differs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import hashlib
import json
import random
import sys
import tempfile
import types
from pathlib import Path

import anyio
import numpy as np
from rich.console import Console
from rich.table import Table

from dynalize.backends.base import ChatModel
from dynalize.eval.healthbench import HealthBenchSettings, load_examples, run_healthbench
from dynalize.eval.researchqa import ResearchQASettings, load_items, run_researchqa


def _h(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest(), 16)


def hb_reply(prompt: str, attempt: int) -> str:
    """Deterministic per (prompt, attempt): sometimes malformed first, then a verdict."""
    h = _h(prompt)
    if attempt == 0 and h % 5 == 0:
        return ["not json at all", '{"criteria_met": "true"}', '{"explanation": "x"}'][h % 3]
    met = "true" if (h >> 8) % 3 else "false"
    body = f'{{"explanation": "e", "criteria_met": {met}}}'
    return f"```json\n{body}\n```" if (h >> 4) % 2 else body


def rq_reply(prompt: str, attempt: int, n: int) -> str:
    h = _h(prompt)
    labels = ["Not at all", "Barely", "Moderately", "Mostly", "Completely"]
    k = n - 1 if (attempt == 0 and h % 4 == 0) or h % 11 == 0 else n  # wrong counts; some never right
    return "\n".join(labels[(h >> (3 * i)) % 5] for i in range(k))


class Attempts:
    """Counts how often each prompt was sent, so both harnesses see the same reply sequence."""

    def __init__(self):
        self.seen: dict[str, int] = {}

    def next(self, prompt: str) -> int:
        n = self.seen.get(prompt, 0)
        self.seen[prompt] = n + 1
        return n


def synthetic_healthbench(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    tags = ["axis:accuracy", "axis:completeness", "axis:communication", "level:cluster", "cluster:triage"]
    rows = []
    for i in range(n):
        rubrics = [{"criterion": f"Criterion {i}.{k}: says thing {rng.randint(0, 999)}.",
                    "points": rng.choice([-5, -2, 1, 2, 3, 5, 7, 2.5, 4]), "tags": rng.sample(tags, rng.randint(0, 3))}
                   for k in range(rng.randint(1, 9))]
        if not any(r["points"] > 0 for r in rubrics):
            rubrics.append({"criterion": f"Criterion {i}.p", "points": 4, "tags": ["axis:accuracy"]})
        prompt = [{"role": "user", "content": f"Question {i}?"}]
        if rng.random() < 0.3:
            prompt += [{"role": "assistant", "content": "Tell me more."}, {"role": "user", "content": "It hurts."}]
        rows.append({"prompt": prompt, "prompt_id": f"p{i}", "rubrics": rubrics,
                     "example_tags": rng.sample(["theme:a", "theme:b", "theme:c"], rng.randint(0, 2))})
    return rows


def reply_to(conversation_last: str) -> str:
    return f"An answer to {conversation_last}"


class Policy:
    async def sample(self, conversations, sampling):
        return [reply_to(c[-1].content) for c in conversations]


def official_healthbench(checkout: Path, rows: list[dict], seed: int) -> tuple[float, dict]:
    pkg = Path(tempfile.mkdtemp()) / "se"
    (pkg / "sampler").mkdir(parents=True)
    (pkg / "healthbench_eval.py").write_text((checkout / "healthbench_eval.py").read_text())
    (pkg / "__init__.py").write_text("")
    (pkg / "sampler" / "__init__.py").write_text("")
    (pkg / "sampler" / "chat_completion_sampler.py").write_text(
        "OPENAI_SYSTEM_MESSAGE_API = 'You are a helpful assistant.'\nclass ChatCompletionSampler: pass\n")
    (pkg / "common.py").write_text(
        "import jinja2\nHTML_JINJA = ''\njinja_env = jinja2.Environment()\n"
        "def map_with_progress(f, xs, num_threads=1, pbar=False):\n    return [f(x) for x in xs]\n")
    (pkg / "types.py").write_text(
        "from dataclasses import dataclass, field\nfrom typing import Any\nEval = object\nMessageList = list\n"
        "class SamplerBase: pass\n"
        "@dataclass\nclass SamplerResponse:\n    response_text: str\n    response_metadata: dict\n"
        "    actual_queried_message_list: list\n"
        "@dataclass\nclass SingleEvalResult:\n    score: Any = None\n    metrics: dict = field(default_factory=dict)\n"
        "    html: Any = None\n    convo: Any = None\n    example_level_metadata: Any = None\n"
        "@dataclass\nclass EvalResult:\n    score: Any = None\n    metrics: Any = None\n    htmls: Any = None\n"
        "    convos: Any = None\n    metadata: Any = None\n")
    sys.modules.setdefault("blobfile", types.ModuleType("blobfile"))
    sys.path.insert(0, str(pkg.parent))
    from se import healthbench_eval as off  # type: ignore[import-not-found]
    from se.types import SamplerResponse, SingleEvalResult  # type: ignore[import-not-found]

    attempts = Attempts()

    def grader(messages):
        prompt = messages[-1]["content"]
        return SamplerResponse(hb_reply(prompt, attempts.next(prompt)), {}, messages)

    ev = off.HealthBenchEval.__new__(off.HealthBenchEval)
    ev.grader_model = grader
    results = []
    for r in rows:
        metrics, _, _ = ev.grade_sample(r["prompt"], reply_to(r["prompt"][-1]["content"]), r["example_tags"],
                                        [off.RubricItem.from_dict(d) for d in r["rubrics"]])
        results.append(SingleEvalResult(score=metrics["overall_score"], metrics=metrics))
    np.random.seed(seed)
    agg = off._aggregate_get_clipped_mean(results)
    return float(agg.score), {k: float(v) for k, v in agg.metrics.items()}


class OurHBGrader(ChatModel):
    def __init__(self):
        self.attempts = Attempts()

    async def chat(self, messages, **sampling):
        prompt = messages[-1].content
        return hb_reply(prompt, self.attempts.next(prompt))


def ours_healthbench(path: Path, seed: int) -> tuple[float, dict]:
    res = anyio.run(lambda: run_healthbench(Policy(), OurHBGrader(), load_examples(path), HealthBenchSettings(seed=seed),
                                            None, False, False))
    return float(res.score), res.extra["metrics"]


def official_researchqa(checkout: Path, data: Path, answers: dict) -> tuple[float | None, dict]:
    sys.modules.setdefault("openai", types.ModuleType("openai"))
    sys.path.insert(0, str(checkout))
    import compute_coverage as off  # type: ignore[import-not-found]

    attempts = Attempts()

    def call_gpt(prompt, model="x"):
        n = prompt.split("Questions:\n", 1)[1].split("\n\nOutput:", 1)[0].count("\n") + 1
        return rq_reply(prompt, attempts.next(prompt), n).strip()

    off.call_gpt = call_gpt
    with tempfile.TemporaryDirectory() as d:
        resp, out = Path(d) / "r.json", Path(d) / "o.json"
        resp.write_text(json.dumps(answers))
        import time as _t

        sleep, _t.sleep = _t.sleep, lambda s: None  # the retry decorator's waits change nothing
        try:
            off.compute_coverage(str(data), str(resp), str(out))
        finally:
            _t.sleep = sleep
        judged = json.loads(out.read_text())
    per = {k: off.compute_coverage_score(v) for k, v in judged.items()}
    return (sum(per.values()) / len(per) if per else None), per


class OurRQGrader(ChatModel):
    def __init__(self):
        self.attempts = Attempts()

    async def chat(self, messages, **sampling):
        prompt = messages[-1].content
        n = prompt.split("Questions:\n", 1)[1].split("\n\nOutput:", 1)[0].count("\n") + 1
        return rq_reply(prompt, self.attempts.next(prompt), n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simple-evals", type=Path, help="a checkout of openai/simple-evals")
    ap.add_argument("--researchqa", type=Path, help="a checkout of realliyifei/ResearchQA")
    ap.add_argument("--examples", type=int, default=60)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    t = Table(title="official code vs ours, same grader replies")
    for col in ("benchmark", "numbers compared", "official score", "our score", "max |difference|", "same keys"):
        t.add_column(col, justify="right")
    bad = False
    work = Path(tempfile.mkdtemp())
    if args.simple_evals:
        rows = synthetic_healthbench(args.examples, args.seed)
        path = work / "hb.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with contextlib.redirect_stdout(io.StringIO()):  # the official code prints each re-ask
            s1, m1 = official_healthbench(args.simple_evals, rows, args.seed)
        s2, m2 = ours_healthbench(path, args.seed)
        diff = max([abs(m1[k] - m2.get(k, float("nan"))) for k in m1] + [abs(s1 - s2)])
        same = list(m1) == list(m2)
        bad |= not same or diff != 0  # the same arithmetic: equal to the last bit
        t.add_row("HealthBench", str(len(m1) + 1), f"{s1:.6f}", f"{s2:.6f}", f"{diff:.2e}", str(same))
    if args.researchqa:
        rng = random.Random(args.seed)
        items = [{"id": f"q{i}", "general_domain": "d", "subdomain": "s", "field": "f", "query": f"Query {i}?",
                  "date": "2025", "rubric": [{"rubric_item": f"Does it cover {i}.{k}?", "type": "general"}
                                             for k in range(rng.randint(1, 20))]} for i in range(args.examples)]
        data = work / "rq.json"
        data.write_text(json.dumps(items))
        answers = {it["id"]: {"answer": reply_to(it["query"])} for it in items}
        logging.disable(logging.CRITICAL)  # the official script logs every item
        with contextlib.redirect_stderr(io.StringIO()):
            s1, per1 = official_researchqa(args.researchqa, data, answers)
        logging.disable(logging.NOTSET)
        res = anyio.run(lambda: run_researchqa(Policy(), OurRQGrader(), load_items(data), ResearchQASettings(),
                                               None, False, False))
        per2 = {r["id"]: r["coverage"] for r in res.raw if r["status"] == "scored"}
        diff = max([abs(per1[k] - per2.get(k, float("nan"))) for k in per1] + [abs((s1 or 0) - (res.score or 0))])
        same = set(per1) == set(per2)
        bad |= not same or diff != 0  # the same arithmetic: equal to the last bit
        t.add_row("ResearchQA", f"{len(per1) + 1} ({res.counts['skipped']} items skipped by both)", f"{s1:.6f}",
                  f"{res.score:.6f}", f"{diff:.2e}", str(same))
    Console().print(t)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
