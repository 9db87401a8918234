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
profiles, with a bootstrap 95% CI. `strict=True` also treats a score outside 1–6 as missing.
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
from .common import BenchmarkError, BenchResult, bootstrap_ci, mean_or_none, progress
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
    strict: bool = False
    limit: int | None = None
    n_boot: int = 500
    seed: int = 0


@dataclass
class _Session:
    index: int
    profile: dict[str, Any]
    clinician: list[Message]
    member: list[Message]
    clinician_thinking: list[str] = field(default_factory=list)
    member_thinking: list[str] = field(default_factory=list)
    status: str = "pending"
    judge_raw: str | None = None
    judgment: Judgment | None = None

    @property
    def interaction(self) -> list[Message]:
        return self.clinician[1:]

    def record(self) -> dict[str, Any]:
        j = self.judgment
        return {"profile_index": self.index, "member_profile": self.profile,
                "interaction": [m.to_dict() for m in self.interaction],
                "clinician_thinking_traces": self.clinician_thinking, "member_thinking_traces": self.member_thinking,
                "status": self.status, "judge_raw": self.judge_raw,
                "scores": j.scores if j else None, "score": j.score if j else None,
                "missing": j.missing if j else None, "out_of_range": j.out_of_range if j else None}


async def run_mindeval(policy: PolicySampler, patient: ChatModel, judge: ChatModel, assets: MindEvalAssets,
                       settings: MindEvalSettings | None = None, show_progress: bool = True) -> BenchResult:
    """Hold every profile's conversation with `policy` as clinician, then judge each and score."""
    s = settings or MindEvalSettings()
    profiles = assets.profiles[: s.limit] if s.limit else assets.profiles
    sessions = [_Session(i, p,
                         clinician=[Message("system", fill(assets.clinician, "clinician", i, **p)),
                                    Message("user", "Hello")],
                         member=[Message("system", fill(assets.member, "patient", i, **p)),
                                 Message("assistant", "Hello")])
                for i, p in enumerate(profiles)]
    with progress(show_progress) as bar:
        talk = bar.add_task("mindeval: conversations (turns)", total=s.turns)
        for turn in range(s.turns):
            await _turn(policy, patient, sessions, s, turn)
            bar.advance(talk)
        judging = bar.add_task("mindeval: judging", total=len(sessions))

        async def one(x: _Session) -> None:
            await _judge(judge, assets, x, s)
            bar.advance(judging)

        async with anyio.create_task_group() as tg:
            for x in sessions:
                if x.status == "pending":
                    tg.start_soon(one, x)
                else:
                    bar.advance(judging)
    return summarize(sessions, s)


async def _turn(policy: PolicySampler, patient: ChatModel, sessions: list[_Session], s: MindEvalSettings,
                turn: int) -> None:
    sessions = [x for x in sessions if x.status == "pending"]
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
            raw = await patient.chat(x.member)
        except Exception as e:  # noqa: BLE001 - the conversation stops unjudged, counted
            x.status, x.judge_raw = "patient_error", f"[ERROR: {type(e).__name__}: {e}]"
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
        raw = await judge.chat([Message("user", prompt)])
    except Exception as e:  # noqa: BLE001 - one failed judge call loses one conversation, counted
        x.status, x.judge_raw = "judge_error", f"[ERROR: {type(e).__name__}: {e}]"
        return
    x.judge_raw = separate_thinking(raw)[1]
    x.judgment = parse_judgment(x.judge_raw, s.strict)
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
    return BenchResult(score=mean_or_none(per), ci=bootstrap_ci(per, s.n_boot, seed=s.seed), criteria=criteria,
                       counts=counts, raw=[x.record() for x in sessions])
