"""EQ-Bench Creative Writing v3, run as the benchmark runs it, on a policy checkpoint.

Files, read from a checkout of the benchmark's repository (`bench_dir`):

    data/creative_writing_prompts_v3.json   {"<id>": {"category", "title", "writing_prompt" (with <SEED>),
                                              "seed_modifiers": [...]}, ...}
    data/creative_writing_criteria.txt      one criterion per line (negative ones included)
    data/negative_criteria.txt              the lower-is-better criteria, one per line
    data/creative_writing_judging_prompt.txt  a str.format template with {writing_prompt},
                                              {test_model_response}, {creative_writing_criteria},
                                              {lower_is_better_criteria}

Protocol (the benchmark's core/benchmark.py, core/conversation.py, core/scoring.py, utils/api.py):
iteration i (1..3) of a prompt writes with `seed_modifiers[(i−1) % len]` in place of `<SEED>`, one
user message, temperature 0.7, min_p 0.1, 4000 tokens; up to 3 attempts while the reply (after
reasoning is cut up to `</think>`, stripped) is under 500 characters, else the piece fails. The
judge (JUDGE_SAMPLING: temperature 0, max_tokens 1000, min_p 0.1) sees the base prompt with the
literal `<SEED>` left in, the criteria one per line as "- name", the negative criteria joined with
", ". Its reply loses reasoning only as the benchmark's client strips it (when a `<think>` and a
`</think>` tag both occur, up to the first `</think>`; then the same for `<reasoning>`).
Every `Name: s` / `Name: [s]` line with s ≤ 20 is a score; negative criteria count as 20 − s; a
piece's score is the mean of its scores, the benchmark's the mean over pieces on 0–20 and ×5 on
0–100, each rounded to 2 decimals, with a bootstrap 95% CI over pieces on 0–20. A piece whose
judge call failed or whose reply holds no score is judged again on a rerun, as the benchmark
re-queues it. `strict=True` keeps only the listed criteria names (faithful mode keeps every name).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog

from ..backends.base import ChatModel, SamplingParams
from ..types import Message
from .common import Benchmark, BenchmarkError, BenchResult, bootstrap_ci, mean_or_none, progress
from .policy import PolicySampler

log = structlog.get_logger("dynalize.eval.eqbench")

FILES = {
    "prompts": "data/creative_writing_prompts_v3.json",
    "criteria": "data/creative_writing_criteria.txt",
    "negative": "data/negative_criteria.txt",
    "judge_prompt": "data/creative_writing_judging_prompt.txt",
}
SCORE_MAX = 20.0
SCORE_PATTERN_PLAIN = r"(.*?):\s*(?:Score\s+)?(-?\d+(?:\.\d+)?)"
"""`Name: 15` or `Name: Score 15` (the benchmark's first pattern)."""
SCORE_PATTERN_BRACKETS = r"(.*?):\s*\[(-?\d+(?:\.\d+)?)\]"
"""`Name: [15]` (the benchmark's second pattern)."""
REASONING_ENDS = ("</think>", "</thinking>", "</reasoning>")
"""Where the policy's reasoning ends (its chat template may open the block in the prompt)."""
JUDGE_REASONING_PAIRS = (("<think>", "</think>"), ("<reasoning>", "</reasoning>"))
"""The blocks the benchmark's client strips from a judge reply, in this order (utils/api.py)."""
JUDGE_SAMPLING = {"temperature": 0.0, "max_tokens": 1000, "min_p": 0.1}
"""The benchmark's judge call: temperature 0.0, max_tokens 1000 (core/conversation.py), and the
client's min_p default 0.1, sent to every endpoint but api.openai.com (utils/api.py)."""
JUDGE_TIMEOUT = 240.0
"""Seconds per judge request: the benchmark client's `request_timeout` (utils/api.py)."""


@dataclass
class WritingPrompt:
    id: str
    writing_prompt: str
    seed_modifiers: list[str]
    category: str = ""
    title: str = ""


@dataclass
class EQBenchAssets:
    """The benchmark's prompts, criteria and judge template."""

    prompts: list[WritingPrompt]
    criteria: list[str]
    negative: list[str]
    judge_template: str

    @classmethod
    def load(cls, bench_dir: str | Path) -> EQBenchAssets:
        root = Path(bench_dir)
        paths = {k: root / v for k, v in FILES.items()}
        for p in paths.values():
            if not p.is_file():
                raise BenchmarkError(f"eqbench: {p} not found (is --bench-dir a checkout of creative-writing-bench?)")
        try:
            raw = json.loads(paths["prompts"].read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise BenchmarkError(f"eqbench: {paths['prompts']} is not valid JSON (line {e.lineno})") from None
        if not isinstance(raw, dict):
            raise BenchmarkError(f"eqbench: {paths['prompts']} must hold a JSON object of prompts by id")
        prompts = []
        for pid, obj in raw.items():
            if not isinstance(obj, dict) or not isinstance(obj.get("writing_prompt"), str):
                raise BenchmarkError(f"eqbench: prompt {pid!r} in {paths['prompts']} has no writing_prompt")
            seeds = obj.get("seed_modifiers") or []
            if not seeds:
                log.warning("eqbench.prompt_without_seed_modifiers", prompt=pid)  # the benchmark skips these too
                continue
            prompts.append(WritingPrompt(str(pid), obj["writing_prompt"], [str(s) for s in seeds],
                                         str(obj.get("category", "")), str(obj.get("title", ""))))
        assets = cls(prompts, _lines(paths["criteria"]), _lines(paths["negative"]),
                     paths["judge_prompt"].read_text(encoding="utf-8"))
        try:
            fill_judge_prompt(assets.judge_template, "", "", assets.criteria, assets.negative)
        except (KeyError, IndexError, ValueError) as e:
            raise BenchmarkError(f"eqbench: {paths['judge_prompt']} is not a str.format template with only "
                                 f"the benchmark's four fields ({type(e).__name__}: {e})") from None
        return assets


def _lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --- the protocol's pieces ---------------------------------------------------------------------

def seed_modifier(prompt: WritingPrompt, iteration: int) -> str:
    """The seed modifier of iteration `iteration` (1-based): seed_modifiers[(i − 1) % len]."""
    return prompt.seed_modifiers[(iteration - 1) % len(prompt.seed_modifiers)]


def split_reasoning(text: str) -> tuple[str, str]:
    """The policy's (reasoning, reply): everything up to the first `</think>` (or `</thinking>`,
    `</reasoning>`) is reasoning; without a closing tag the whole text is the reply."""
    for end in REASONING_ENDS:
        at = text.find(end)
        if at >= 0:
            return text[:at], text[at + len(end):]
    return "", text


def strip_judge_reasoning(text: str) -> tuple[str, str]:
    """A judge reply's (stripped part, the text that is parsed), as the benchmark's client strips it:
    when both `<think>` and `</think>` occur anywhere, everything up to the end of the first
    `</think>` goes; then the same for `<reasoning>`/`</reasoning>`. A lone closing tag, or a
    `<thinking>` block, stays and is parsed."""
    answer = text
    for begin, end in JUDGE_REASONING_PAIRS:
        if begin in answer and end in answer:
            answer = answer[answer.find(end) + len(end):]
    return text[: len(text) - len(answer)], answer


def fill_judge_prompt(template: str, writing_prompt: str, response: str, criteria: list[str],
                      negative: list[str]) -> str:
    """The judge's prompt, filled as the benchmark fills it (str.format)."""
    return template.format(
        writing_prompt=writing_prompt,
        test_model_response=response,
        creative_writing_criteria="\n".join("- " + c for c in criteria),
        lower_is_better_criteria=", ".join(negative),
    )


def parse_judge_scores(text: str) -> dict[str, float]:
    """Every `Name: score` / `Name: [score]` with score ≤ 20, by name (a later match wins)."""
    scores: dict[str, float] = {}
    for pattern in (SCORE_PATTERN_PLAIN, SCORE_PATTERN_BRACKETS):
        for name, value in re.findall(pattern, text):
            if float(value) <= SCORE_MAX:
                scores[name.strip()] = float(value)
    return scores


def scores_over_max(text: str) -> int:
    """How many parsed scores the ≤ 20 rule dropped."""
    return sum(float(v) > SCORE_MAX for p in (SCORE_PATTERN_PLAIN, SCORE_PATTERN_BRACKETS)
               for _, v in re.findall(p, text))


def piece_score(scores: dict[str, float], criteria: list[str], negative: list[str],
                strict: bool = False) -> float | None:
    """Mean of a piece's scores (0–20) with negatives inverted as 20 − s; None if nothing is left.

    Faithful mode uses every parsed name; `strict` only the listed criteria (criteria ∪ negative).
    """
    listed = set(criteria) | set(negative)
    values = []
    for name, s in scores.items():
        if strict and name not in listed:
            continue
        v = SCORE_MAX - s if name in negative else s
        if v <= SCORE_MAX:  # a negative criterion scored below 0 inverts past 20: dropped, as upstream
            values.append(v)
    return mean_or_none(values)


# --- the protocol, end to end ------------------------------------------------------------------

@dataclass
class EQBenchSettings:
    iterations: int = 3
    temperature: float = 0.7
    min_p: float = 0.1
    max_tokens: int = 4000
    attempts: int = 3
    min_chars: int = 500
    judge_sampling: dict[str, Any] = field(default_factory=lambda: dict(JUDGE_SAMPLING))
    """Sent with every judge call (a None value is not sent)."""
    strict: bool = False
    limit: int | None = None
    n_boot: int = 500
    seed: int = 0


JUDGED = ("scored", "no_value")
"""Statuses of a piece the judge rated; `unparsed` and `judge_error` are judged again on a rerun."""


@dataclass
class _Piece:
    prompt: WritingPrompt
    iteration: int
    attempts: list[int] = field(default_factory=list)
    response: str | None = None
    reasoning: str = ""
    status: str = "pending"
    judge_raw: str | None = None
    judge_text: str | None = None
    judge_error: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    score: float | None = None

    @property
    def seed(self) -> str:
        return seed_modifier(self.prompt, self.iteration)

    @property
    def text(self) -> str:
        return self.prompt.writing_prompt.replace("<SEED>", self.seed)

    def reset_judgement(self) -> None:
        self.status = "generated"
        self.judge_raw = self.judge_text = self.judge_error = None
        self.scores, self.score = {}, None

    def record(self) -> dict[str, Any]:
        """The raw record: `response` and `reasoning` are the accepted attempt's (the last one's when
        every attempt was too short); `judge_raw` the judge's whole reply, `judge_text` what was parsed."""
        return {"prompt_id": self.prompt.id, "title": self.prompt.title, "category": self.prompt.category,
                "iteration": self.iteration, "seed_modifier": self.seed, "prompt": self.text,
                "attempt_chars": self.attempts, "response": self.response, "reasoning": self.reasoning,
                "status": self.status, "judge_raw": self.judge_raw, "judge_text": self.judge_text,
                "judge_error": self.judge_error, "scores": self.scores, "piece_score": self.score}


def pieces_from_records(records: list[dict[str, Any]], assets: EQBenchAssets, rejudge: bool = False) -> list[_Piece]:
    """The pieces of saved raw records; failed judgements (every judgement when `rejudge`) reset."""
    prompts = {p.id: p for p in assets.prompts}
    pieces = []
    for i, r in enumerate(records, 1):
        prompt = prompts.get(str(r.get("prompt_id")))
        if prompt is None or not isinstance(r.get("iteration"), int) or "status" not in r:
            raise BenchmarkError(f"eqbench: saved record {i} (prompt {r.get('prompt_id')!r}) does not match the "
                                 f"prompts file (is --bench-dir the checkout it was generated from?)")
        p = _Piece(prompt, r["iteration"], list(r.get("attempt_chars") or []), r.get("response"),
                   r.get("reasoning") or "", r["status"], r.get("judge_raw"), r.get("judge_text"),
                   r.get("judge_error"), dict(r.get("scores") or {}), r.get("piece_score"))
        if p.text != r.get("prompt"):
            raise BenchmarkError(f"eqbench: saved record {i} was written from another version of prompt "
                                 f"{prompt.id!r} (is --bench-dir the checkout it was generated from?)")
        if p.status == "pending" or (p.status == "generated" and not p.response):
            raise BenchmarkError(f"eqbench: saved record {i} holds no finished generation (status {p.status!r})")
        if p.status in ("unparsed", "judge_error") or (rejudge and p.status in JUDGED):
            p.reset_judgement()
        pieces.append(p)
    return pieces


async def run_eqbench(policy: PolicySampler | None, judge: ChatModel, assets: EQBenchAssets,
                      settings: EQBenchSettings | None = None, show_progress: bool = True,
                      records: list[dict[str, Any]] | None = None, rejudge: bool = False) -> BenchResult:
    """Generate every piece with `policy`, judge each with `judge`, and score the checkpoint; or, given
    the saved `records` of an earlier run, judge its failed pieces again (all of them if `rejudge`)."""
    s = settings or EQBenchSettings()
    if records is None:
        prompts = assets.prompts[: s.limit] if s.limit else assets.prompts
        pieces = [_Piece(p, i) for p in prompts for i in range(1, s.iterations + 1)]
    else:
        pieces = pieces_from_records(records, assets, rejudge)
    with progress(show_progress) as bar:
        todo = [p for p in pieces if p.status == "pending"]
        if todo:
            if policy is None:
                raise BenchmarkError("eqbench: pieces to generate but no policy")  # pragma: no cover
            await _generate(policy, todo, s, bar)
        await _judge(judge, assets, [p for p in pieces if p.status == "generated"], s, bar)
    return summarize(pieces, assets, s)


class EQBench(Benchmark):
    """EQ-Bench Creative Writing v3 for the checkpoint driver (`roles`: the judge's RoleModel)."""

    def __init__(self, judge: ChatModel, assets: EQBenchAssets, settings: EQBenchSettings, *,
                 record: dict[str, Any] | None = None, roles: tuple[Any, ...] = (), show_progress: bool = True):
        self.judge, self.assets, self.s, self.roles, self.show_progress = judge, assets, settings, roles, show_progress
        self.settings = record or {}

    async def run(self, policy: PolicySampler | None, records: list[dict[str, Any]] | None = None,
                  rejudge: bool = False) -> BenchResult:
        return await run_eqbench(policy, self.judge, self.assets, self.s, self.show_progress, records, rejudge)


async def _generate(policy: PolicySampler, pieces: list[_Piece], s: EQBenchSettings, bar) -> None:
    task = bar.add_task("eqbench: writing", total=len(pieces))
    pending = list(pieces)
    for attempt in range(1, s.attempts + 1):
        if not pending:
            break
        sampling = SamplingParams(max_new_tokens=s.max_tokens, temperature=s.temperature, min_p=s.min_p,
                                  seed=s.seed * 1000 + attempt)
        texts = await policy.sample([[Message("user", p.text)] for p in pending], sampling)
        for p, raw in zip(pending, texts):
            reasoning, reply = split_reasoning(raw)
            p.response, p.reasoning = reply.strip(), reasoning
            p.attempts.append(len(p.response))
            if len(p.response) >= s.min_chars:
                p.status = "generated"
                bar.advance(task)
        pending = [p for p in pending if p.status != "generated"]
    for p in pending:
        p.status = "too_short"
        bar.advance(task)


async def _judge(judge: ChatModel, assets: EQBenchAssets, pieces: list[_Piece], s: EQBenchSettings, bar) -> None:
    task = bar.add_task("eqbench: judging", total=len(pieces))

    async def one(p: _Piece) -> None:
        prompt = fill_judge_prompt(assets.judge_template, p.prompt.writing_prompt, p.response or "",
                                   assets.criteria, assets.negative)
        try:
            raw = await judge.chat([Message("user", prompt)], **s.judge_sampling)
        except Exception as e:  # noqa: BLE001 - a failed judge call is counted and judged again on a rerun
            p.status, p.judge_error = "judge_error", f"{type(e).__name__}: {e}"
        else:
            p.judge_raw, p.judge_text = raw, strip_judge_reasoning(raw)[1]
            p.scores = parse_judge_scores(p.judge_text)
            p.score = piece_score(p.scores, assets.criteria, assets.negative, s.strict)
            p.status = "scored" if p.score is not None else "no_value" if p.scores else "unparsed"
        bar.advance(task)

    async with anyio.create_task_group() as tg:
        for p in pieces:
            tg.start_soon(one, p)


def summarize(pieces: list[_Piece], assets: EQBenchAssets, s: EQBenchSettings) -> BenchResult:
    """Score and CI (over pieces the judge rated, as the benchmark), per-criterion means (raw 0–20
    judge scores), counts, and the benchmark's own fields: `score_0_20` and its CI, 2 decimals."""
    judged = [p for p in pieces if p.status in JUDGED]
    values = [p.score for p in judged]
    mean20 = mean_or_none([v for v in values if v is not None])
    ci20 = bootstrap_ci(values, s.n_boot, seed=s.seed, digits=2)
    listed = set(assets.criteria) | set(assets.negative)
    criteria = {}
    for name in dict.fromkeys([*assets.criteria, *assets.negative]):
        vals = [p.scores[name] for p in judged if name in p.scores]
        if vals:
            criteria[name] = sum(vals) / len(vals)
    status = Counter(p.status for p in pieces)
    counts = {
        "pieces": len(pieces), "scored": status["scored"], "too_short": status["too_short"],
        "judge_errors": status["judge_error"], "unparsed": status["unparsed"], "no_value": status["no_value"],
        "retries": sum(max(0, len(p.attempts) - 1) for p in pieces),
        "scores_over_20": sum(scores_over_max(p.judge_text or "") for p in judged),
        "unlisted_names": sum(1 for p in judged for n in p.scores if n not in listed),
        "missing_criteria": sum(1 for p in judged for n in listed if n not in p.scores),
    }
    warnings = []
    if pieces and status["too_short"] == len(pieces):
        warnings.append(f"every piece ({len(pieces)}) was shorter than {s.min_chars} characters after reasoning "
                        f"was cut, in all {s.attempts} attempts: no score. The replies are in the raw file "
                        f"(`response`, `reasoning`); a reasoning policy may need a larger --max-tokens")
    extra = {"score_0_20": None if mean20 is None else round(mean20, 2),
             "ci_low_0_20": ci20[0] if ci20 else None, "ci_high_0_20": ci20[1] if ci20 else None}
    return BenchResult(score=None if mean20 is None else round(mean20 * 5, 2),
                       ci=None if ci20 is None else (round(ci20[0] * 5, 2), round(ci20[1] * 5, 2)),
                       criteria=criteria, counts=counts, raw=[p.record() for p in pieces],
                       failed=status["judge_error"] + status["unparsed"], extra=extra, warnings=warnings)
