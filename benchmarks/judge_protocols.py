"""What a held-out evaluation costs the gold judge under each protocol: batched vs HealthBench's
per-item and ResearchQA's batches of 8 (issue 29).

    python benchmarks/judge_protocols.py [--replies 32] [--criteria 6 12 20] [--reply-chars 4500]

Synthetic held-out replies at user sizes (a user turn of ~300 characters, replies of
`--reply-chars` characters, about 1,000+ tokens) graded by each protocol's judge
(`dynalize.judge`) against a scripted grader that always answers validly, so every number is the
protocol's own request pattern: requests, characters sent (`judge/prompt_chars`, counted by
usage.CountedChat as a run logs them) and ≈ tokens sent (characters / 4, an estimate; real
tokenizers differ). The grader's own replies are scripted here, so their size is not shown
(HealthBench's grader writes an explanation per item, so per-item replies cost more output too).
Nothing is timed: the table is counts, the same on any machine.
"""

from __future__ import annotations

import argparse
import json
import re

import anyio
from rich.console import Console
from rich.table import Table

from dynalize.backends.chat import ScriptedChatModel
from dynalize.judge.healthbench import HealthBenchJudge
from dynalize.judge.judge import RUBRIC_PROMPT, Judge
from dynalize.judge.researchqa import ResearchQAJudge
from dynalize.rubrics.config import RubricJudgeConfig
from dynalize.rubrics.criteria import Criterion
from dynalize.types import Message

CFG = RubricJudgeConfig(engine="llm", chat={"engine": "scripted", "path": "x:y"}, cache_size=0, time_budget_s=None)
WORDS = ("the patient should rest drink water and see a doctor if the pain lasts more than two days "
         "because persistent symptoms can point to an underlying condition ").split()


def text(chars: int, seed: int) -> str:
    out, k = [], seed
    while sum(len(w) + 1 for w in out) < chars:
        out.append(WORDS[k % len(WORDS)])
        k = k * 7 + 3
    return " ".join(out)


def answer(messages: list[Message]) -> str:
    user = messages[-1].content
    if "# Rubric item" in user:
        return json.dumps({"explanation": "It does.", "criteria_met": True})
    if "Questions:\n" in user:
        n = user.split("Questions:\n", 1)[1].split("\n\nOutput:", 1)[0].count("\n") + 1
        return "\n".join(["Mostly"] * n)
    return json.dumps({k: True for k in re.findall(r"^- (c\d+): ", user, flags=re.M)})


def measure(kind: str, replies: int, criteria: int, reply_chars: int) -> dict[str, float]:
    chat = ScriptedChatModel(answer)
    judge = {"batched": lambda: Judge(chat, CFG, prompt=RUBRIC_PROMPT),
             "healthbench": lambda: HealthBenchJudge(chat, CFG),
             "researchqa": lambda: ResearchQAJudge(chat, CFG)}[kind]()
    rubric = [Criterion(f"k{i}", f"States that {text(90, i)}.", 5.0 - i % 7) for i in range(criteria)]
    if not any(c.weight > 0 for c in rubric):
        rubric[0] = Criterion("k0", rubric[0].text, 5.0)
    conversation = [Message("user", text(300, 1))]
    texts = [f"Reply {r}: " + text(reply_chars, r + 11) for r in range(replies)]  # distinct: none is a repeat
    contexts = [judge.context_of(conversation)] * replies
    out = anyio.run(lambda: judge.assess(texts, rubric, "v", contexts))
    assert not any(j.failed for j in out), kind
    s = judge.stats
    return {"requests": s.requests / replies, "chars": s.prompt_chars / replies, "tokens": s.prompt_chars / 4 / replies}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replies", type=int, default=32)
    ap.add_argument("--criteria", type=int, nargs="+", default=[6, 12, 20])
    ap.add_argument("--reply-chars", type=int, default=4500)
    args = ap.parse_args()
    t = Table(title=f"gold judge cost per reply graded ({args.replies} replies of {args.reply_chars} characters)")
    for col in ("criteria", "protocol", "requests", "characters sent", "≈ tokens sent", "× batched (tokens)"):
        t.add_column(col, justify="right")
    for k in args.criteria:
        rows = {kind: measure(kind, args.replies, k, args.reply_chars) for kind in ("batched", "healthbench", "researchqa")}
        for kind, r in rows.items():
            t.add_row(str(k), kind, f"{r['requests']:.1f}", f"{r['chars']:,.0f}", f"{r['tokens']:,.0f}",
                      f"{r['tokens'] / rows['batched']['tokens']:.1f}")
    Console().print(t)


if __name__ == "__main__":
    main()
