"""MindEval (multi-turn mental-health support), run as the benchmark runs it, on a policy checkpoint.

Files, read from a checkout of the benchmark's repository (`bench_dir`), nothing of it executed:

    data/profiles.jsonl        {"member_attributes": {...}, "member_narrative": "..."} per line
    mindeval/prompts.py        string.Template constants and version dicts: the clinician system
                               prompt (INTERACTION_CLINICIAN_VERSION_DICT["v0_1"]) and the patient's
                               (INTERACTION_MEMBER_VERSION_DICT["v0_2"])
    mindeval/judge_prompts.py  the judge templates (JUDGE_PROMPT_TEMPLATE_VERSION_DICT,
                               "v0_1_w_length_guidelines" = the length-guideline variant)

Protocol: a profile is its attributes plus `member_narrative`. The policy plays the clinician:
its messages start as [system: clinician template filled from the profile, user: "Hello"]; the
patient simulator's as [system: patient template, assistant: "Hello"]. For 10 turns the clinician
replies (thinking stripped; empty → "...") and the patient answers (same). The judge gets one user
message: the judge template filled with the profile and the conversation
(`<member>…</member>\n<therapist>…</therapist>…`, starting with the member's "Hello"). Each of the
five criteria is read as `Name: score` (1–6 scale); a missing one counts 3, as upstream, and is
counted. A conversation's score is the mean of the five; the checkpoint's is the mean over
profiles (unrounded, as the benchmark's `df.mean()`), with a bootstrap 95% CI. `strict=True` also
treats a score outside 1–6 as missing. The patient and the judge are called with JUDGE_SAMPLING /
PATIENT_SAMPLING unless their specs say otherwise. A failed judge call is judged again on a rerun,
and a conversation whose patient call failed is held again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any

import anyio

from ..backends.base import ChatModel, SamplingParams
from ..types import Message
from .common import Benchmark, BenchmarkError, BenchResult, bootstrap_ci, mean_or_none, progress
from .policy import PolicySampler
from .pytemplates import PromptModule, TemplateLayoutError

PROFILES = "data/profiles.jsonl"
PROMPTS_MODULE = "mindeval/prompts.py"
JUDGE_MODULE = "mindeval/judge_prompts.py"
CLINICIAN_DICT = "INTERACTION_CLINICIAN_VERSION_DICT"
MEMBER_DICT = "INTERACTION_MEMBER_VERSION_DICT"
JUDGE_DICT = "JUDGE_PROMPT_TEMPLATE_VERSION_DICT"
CRITERIA = (
    "Clinical Accuracy & Competence",
    "Ethical & Professional Conduct",
    "Assessment & Response",
    "Therapeutic Relationship & Alliance",
    "AI-Specific Communication Quality",
)
MISSING_SCORE = 3.0
SCALE = (1.0, 6.0)
EMPTY_REPLY = "..."
JUDGE_SAMPLING = {"temperature": None, "max_tokens": 16000}
"""The benchmark's judge call (README, run_benchmark.sh): `max_completion_tokens` 16000 and no
temperature (the server's default); its `reasoning_effort: high` is left to the spec, since an
endpoint that does not reason may refuse the key."""
PATIENT_SAMPLING = {"temperature": None, "max_tokens": 16000}
"""The benchmark's patient call: as the judge's (README, run_benchmark.sh)."""
TIMEOUT = 600.0
"""Seconds per patient or judge request (ours: room for 16000 tokens of reasoning)."""


@dataclass
class MindEvalAssets:
    """Profiles and the clinician, patient and judge templates."""

    profiles: list[dict[str, Any]]
    clinician: Template
    member: Template
    judge: Template

    @classmethod
    def load(cls, bench_dir: str | Path, clinician: str = "v0_1", member: str = "v0_2",
             judge: str = "v0_1_w_length_guidelines") -> MindEvalAssets:
        """Templates by version key of the benchmark's dicts, or by constant name."""
        root = Path(bench_dir)
        try:
            prompts = PromptModule(root / PROMPTS_MODULE, "mindeval")
            judges = PromptModule(root / JUDGE_MODULE, "mindeval")
            templates = (prompts.lookup(clinician, CLINICIAN_DICT), prompts.lookup(member, MEMBER_DICT),
                         judges.lookup(judge, JUDGE_DICT))
        except TemplateLayoutError as e:
            raise BenchmarkError(str(e)) from None
        return cls(load_profiles(root / PROFILES), *templates)


def load_profiles(path: Path) -> list[dict[str, Any]]:
    """Each row's `member_attributes` with `member_narrative` added (the benchmark's profile dict)."""
    if not path.is_file():
        raise BenchmarkError(f"mindeval: {path} not found (is --bench-dir a checkout of mind-eval?)")
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise BenchmarkError(f"mindeval: {path} line {i}: not valid JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("member_attributes"), dict):
            raise BenchmarkError(f"mindeval: {path} line {i}: no member_attributes object")
        out.append({**row["member_attributes"], "member_narrative": row.get("member_narrative", "")})
    if not out:
        raise BenchmarkError(f"mindeval: {path} has no profiles")
    return out


def fill(template: Template, what: str, index: int, **values: Any) -> str:
    try:
        return template.substitute(**values)
    except KeyError as e:
        raise BenchmarkError(f"mindeval: profile {index} has no field {e.args[0]!r} that the {what} "
                             f"template uses") from None
    except ValueError as e:
        raise BenchmarkError(f"mindeval: the {what} template is not a valid string.Template: {e}") from None


# --- the protocol's pieces ---------------------------------------------------------------------

def separate_thinking(text: str, begin: str = "<think>", end: str = "</think>") -> tuple[str, str]:
    """(thinking, reply) as the benchmark splits them: a `<think>…</think>` block, else text up to a
    lone `</think>`; the reply is stripped."""
    m = re.search(f"{re.escape(begin)}(.*?){re.escape(end)}", text, re.DOTALL)
    if m:
        return m.group(1).strip(), text[m.end():].strip()
    parts = text.split(end)
    if len(parts) > 1:
        return parts[0].replace(begin, "").strip(), parts[1].strip()
    return "", text.strip()


def conversation_str(messages: list[Message]) -> str:
    """The benchmark's transcript: user turns as <member>, assistant turns as <therapist>."""
    out = ""
    for m in messages:
        role = "member" if m.role == "user" else "therapist"
        out += f"<{role}>\n{m.content}\n</{role}>\n"
    return out.strip()


@dataclass
class Judgment:
    """The five criteria of one conversation, the defaults used, and the mean."""

    scores: dict[str, float]
    missing: list[str]
    out_of_range: list[str]

    @property
    def score(self) -> float:
        return sum(self.scores.values()) / len(self.scores)


def parse_judgment(text: str, strict: bool = False) -> Judgment:
    """Each criterion as `Name: score`; missing → 3 (counted); outside 1–6 counted (→ 3 if strict)."""
    scores, missing, out = {}, [], []
    for name in CRITERIA:
        m = re.search(rf"{re.escape(name)}:\s*(\d+\.?\d*)", text)
        if m is None:
            scores[name] = MISSING_SCORE
            missing.append(name)
            continue
        v = float(m.group(1))
        if not SCALE[0] <= v <= SCALE[1]:
            out.append(name)
            if strict:
                v = MISSING_SCORE
        scores[name] = v
    return Judgment(scores, missing, out)


# --- the protocol, end to end ------------------------------------------------------------------

@dataclass
class MindEvalSettings:
    turns: int = 10
    temperature: float = 1.0
    max_tokens: int = 1024
    judge_sampling: dict[str, Any] = field(default_factory=lambda: dict(JUDGE_SAMPLING))
    """Sent with every judge call (a None value is not sent)."""
    patient_sampling: dict[str, Any] = field(default_factory=lambda: dict(PATIENT_SAMPLING))
    """Sent with every patient call (a None value is not sent)."""
    strict: bool = False
    limit: int | None = None
    n_boot: int = 500
    seed: int = 0


@dataclass
class _Session:
    """One conversation: `talking` (turns to go), `talked` (to judge), `scored`, or failed:
    `patient_error` (held again on a rerun), `judge_error` (judged again on a rerun)."""

    index: int
    profile: dict[str, Any]
    clinician: list[Message]
    member: list[Message]
    clinician_thinking: list[str] = field(default_factory=list)
    member_thinking: list[str] = field(default_factory=list)
    status: str = "talking"
    patient_error: str | None = None
    judge_raw: str | None = None
    judge_thinking: str | None = None
    judge_text: str | None = None
    judge_error: str | None = None
    judgment: Judgment | None = None

    @property
    def interaction(self) -> list[Message]:
        return self.clinician[1:]

    def record(self) -> dict[str, Any]:
        """The raw record; `judge_raw` is the judge's whole reply, `judge_text` the part parsed."""
        j = self.judgment
        return {"profile_index": self.index, "member_profile": self.profile,
                "interaction": [m.to_dict() for m in self.interaction],
                "clinician_thinking_traces": self.clinician_thinking, "member_thinking_traces": self.member_thinking,
                "status": self.status, "patient_error": self.patient_error, "judge_raw": self.judge_raw,
                "judge_thinking": self.judge_thinking, "judge_text": self.judge_text, "judge_error": self.judge_error,
                "scores": j.scores if j else None, "score": j.score if j else None,
                "missing": j.missing if j else None, "out_of_range": j.out_of_range if j else None}


def new_session(assets: MindEvalAssets, index: int, profile: dict[str, Any]) -> _Session:
    return _Session(index, profile,
                    clinician=[Message("system", fill(assets.clinician, "clinician", index, **profile)),
                               Message("user", "Hello")],
                    member=[Message("system", fill(assets.member, "patient", index, **profile)),
                            Message("assistant", "Hello")])


def sessions_from_records(records: list[dict[str, Any]], assets: MindEvalAssets,
                          rejudge: bool = False) -> list[_Session]:
    """The conversations of saved raw records: a failed conversation starts again, a failed
    judgement (every judgement when `rejudge`) is to be judged again."""
    out = []
    for i, r in enumerate(records, 1):
        profile, turns = r.get("member_profile"), r.get("interaction")
        if not isinstance(profile, dict) or not isinstance(turns, list) or not isinstance(r.get("profile_index"), int):
            raise BenchmarkError(f"mindeval: saved record {i} has no member_profile, interaction or profile_index")
        x = new_session(assets, r["profile_index"], profile)
        if r.get("status") in ("patient_error", "talking"):
            out.append(x)
            continue
        x.clinician = [x.clinician[0], *(Message(t["role"], t["content"]) for t in turns)]
        x.member = []  # the conversation is over: only the judge reads it
        x.clinician_thinking = list(r.get("clinician_thinking_traces") or [])
        x.member_thinking = list(r.get("member_thinking_traces") or [])
        x.status = r.get("status", "talked")
        if x.status == "scored" and not rejudge:
            x.judge_raw, x.judge_thinking = r.get("judge_raw"), r.get("judge_thinking")
            x.judge_text = r.get("judge_text")
            x.judgment = Judgment(dict(r.get("scores") or {}), list(r.get("missing") or []),
                                  list(r.get("out_of_range") or []))
        else:
            x.status = "talked"
        out.append(x)
    return out


async def run_mindeval(policy: PolicySampler | None, patient: ChatModel | None, judge: ChatModel,
                       assets: MindEvalAssets, settings: MindEvalSettings | None = None, show_progress: bool = True,
                       records: list[dict[str, Any]] | None = None, rejudge: bool = False) -> BenchResult:
    """Hold every profile's conversation with `policy` as clinician, then judge each and score; or,
    given the saved `records` of an earlier run, hold its failed conversations again and judge what
    is not judged yet (every conversation if `rejudge`)."""
    s = settings or MindEvalSettings()
    if records is None:
        profiles = assets.profiles[: s.limit] if s.limit else assets.profiles
        sessions = [new_session(assets, i, p) for i, p in enumerate(profiles)]
    else:
        sessions = sessions_from_records(records, assets, rejudge)
    with progress(show_progress) as bar:
        talking = [x for x in sessions if x.status == "talking"]
        if talking:
            if policy is None or patient is None:
                raise BenchmarkError("mindeval: conversations to hold but no policy or patient")
            talk = bar.add_task("mindeval: conversations (turns)", total=s.turns)
            for turn in range(s.turns):
                await _turn(policy, patient, talking, s, turn)
                bar.advance(talk)
            for x in talking:
                if x.status == "talking":
                    x.status = "talked"
        todo = [x for x in sessions if x.status == "talked"]
        judging = bar.add_task("mindeval: judging", total=len(todo))

        async def one(x: _Session) -> None:
            await _judge(judge, assets, x, s)
            bar.advance(judging)

        async with anyio.create_task_group() as tg:
            for x in todo:
                tg.start_soon(one, x)
    return summarize(sessions, s)


class MindEval(Benchmark):
    """MindEval for the checkpoint driver (`roles`: the patient's and judge's RoleModels)."""

    def __init__(self, patient: ChatModel | None, judge: ChatModel, assets: MindEvalAssets,
                 settings: MindEvalSettings, *, record: dict[str, Any] | None = None, roles: tuple[Any, ...] = (),
                 show_progress: bool = True):
        self.patient, self.judge, self.assets, self.s = patient, judge, assets, settings
        self.roles, self.show_progress, self.settings = roles, show_progress, record or {}

    async def run(self, policy: PolicySampler | None, records: list[dict[str, Any]] | None = None,
                  rejudge: bool = False) -> BenchResult:
        return await run_mindeval(policy, self.patient, self.judge, self.assets, self.s, self.show_progress,
                                  records, rejudge)

    def needs_policy(self, records: list[dict[str, Any]]) -> bool:
        return any(r.get("status") in ("patient_error", "talking") for r in records)


async def _turn(policy: PolicySampler, patient: ChatModel, sessions: list[_Session], s: MindEvalSettings,
                turn: int) -> None:
    sessions = [x for x in sessions if x.status == "talking"]
    sampling = SamplingParams(max_new_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed * 1000 + turn)
    texts = await policy.sample([x.clinician for x in sessions], sampling)
    for x, raw in zip(sessions, texts):
        thinking, reply = separate_thinking(raw)
        reply = reply or EMPTY_REPLY
        x.clinician_thinking.append(thinking)
        x.clinician.append(Message("assistant", reply))
        x.member.append(Message("user", reply))

    async def member(x: _Session) -> None:
        try:
            raw = await patient.chat(x.member, **s.patient_sampling)
        except Exception as e:  # noqa: BLE001 - the conversation stops, counted, and is held again on a rerun
            x.status, x.patient_error = "patient_error", f"{type(e).__name__}: {e}"
            return
        thinking, reply = separate_thinking(raw)
        reply = reply or EMPTY_REPLY
        x.member_thinking.append(thinking)
        x.member.append(Message("assistant", reply))
        x.clinician.append(Message("user", reply))

    async with anyio.create_task_group() as tg:
        for x in sessions:
            tg.start_soon(member, x)


async def _judge(judge: ChatModel, assets: MindEvalAssets, x: _Session, s: MindEvalSettings) -> None:
    prompt = fill(assets.judge, "judge", x.index, **{**x.profile, "conversation_str": conversation_str(x.interaction)})
    try:
        raw = await judge.chat([Message("user", prompt)], **s.judge_sampling)
    except Exception as e:  # noqa: BLE001 - a failed judge call is counted and judged again on a rerun
        x.status, x.judge_error = "judge_error", f"{type(e).__name__}: {e}"
        return
    x.judge_raw = raw
    x.judge_thinking, x.judge_text = separate_thinking(raw)
    x.judgment = parse_judgment(x.judge_text, s.strict)
    x.status = "scored"


def summarize(sessions: list[_Session], s: MindEvalSettings) -> BenchResult:
    """Mean over judged conversations, CI, per-criterion means, and counts of defaults and failures."""
    judged = [x.judgment for x in sessions if x.judgment is not None]
    per = [j.score for j in judged]
    criteria = {name: sum(j.scores[name] for j in judged) / len(judged) for name in CRITERIA} if judged else {}
    counts = {
        "conversations": len(sessions), "scored": len(judged),
        "judge_errors": sum(x.status == "judge_error" for x in sessions),
        "patient_errors": sum(x.status == "patient_error" for x in sessions),
        "missing_scores": sum(len(j.missing) for j in judged),
        "all_missing": sum(len(j.missing) == len(CRITERIA) for j in judged),
        "out_of_range": sum(len(j.out_of_range) for j in judged),
        "empty_clinician_replies": sum(m.role == "assistant" and m.content == EMPTY_REPLY
                                       for x in sessions for m in x.interaction),
    }
    warnings = []
    if counts["all_missing"]:
        warnings.append(f"{counts['all_missing']} judge replies named none of the five criteria (each counted 3, "
                        f"as the benchmark does): a judge cut short by its max_tokens looks like this")
    return BenchResult(score=mean_or_none(per), ci=bootstrap_ci(per, s.n_boot, seed=s.seed), criteria=criteria,
                       counts=counts, raw=[x.record() for x in sessions],
                       failed=counts["judge_errors"] + counts["patient_errors"], warnings=warnings)
