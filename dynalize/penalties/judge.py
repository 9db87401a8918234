"""The judge: binary verdicts of every active penalty on a text, in one pass per text.

Penalties with a regex are decided locally; the rest go to a ChatModel in one call per text
(per policy reply in multi-turn) asking for `{penalty_id: true|false}`. Ids the model invents
are ignored; a reply missing ids is retried (chat_json), and ids still missing after the
retries, or every id of a call that yields no JSON object at all, count as not triggered and as
failures. Texts are fenced as data (see prompting.fence). Complete LLM answers are cached by
(text, context, buffer version).
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from typing import Any, Sequence

import anyio
import structlog

from ..backends.base import ChatModel
from ..backends.chat import ChatJSONError, chat_json, parse_json
from ..types import Message, Penalty
from .config import JudgeConfig
from .prompting import fence, new_nonce, penalty_list, render

log = structlog.get_logger("dynalize.penalties.judge")

_TRUE = {"true", "yes", "y", "1", "triggered"}
_FALSE = {"false", "no", "n", "0", "not triggered"}


@dataclass
class JudgeStats:
    """Counters since the last reset: LLM calls, failed calls, missing verdicts, cache hits, latency."""

    calls: int = 0
    failed_calls: int = 0
    failures: int = 0
    cache_hits: int = 0
    lexical: int = 0
    latency_sum: float = 0.0
    latency_max: float = 0.0

    def metrics(self, prefix: str = "judge/") -> dict[str, float]:
        out = {f"{prefix}{f.name}": float(getattr(self, f.name))
               for f in fields(self) if f.name != "latency_sum"}
        out[f"{prefix}latency_mean"] = self.latency_sum / self.calls if self.calls else 0.0
        return out

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, type(getattr(self, f.name))())


@dataclass
class Judgement:
    """Verdicts for one text (every penalty id present) and the ids the judge failed to decide."""

    verdicts: dict[str, bool]
    failed: set[str] = field(default_factory=set)


def as_bool(value: Any) -> bool | None:
    """A verdict from a JSON value (true/false, "yes"/"no", 1/0), or None if it is not one."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().lower()
        return True if v in _TRUE else False if v in _FALSE else None
    return None


def parse_verdicts(raw: Any, ids: Sequence[str]) -> tuple[dict[str, bool], set[str]]:
    """(verdicts for `ids`, ids without a usable verdict). Unknown keys are ignored."""
    if isinstance(raw, dict) and isinstance(raw.get("verdicts"), dict) and not set(ids) & set(raw):
        raw = raw["verdicts"]
    if not isinstance(raw, dict):
        raw = {}
    verdicts, failed = {}, set()
    for pid in ids:
        v = as_bool(raw.get(pid))
        if v is None:
            failed.add(pid)
        verdicts[pid] = bool(v)
    return verdicts, failed


def salvage(raw: str) -> Any:
    """The JSON in a reply that failed the schema check (e.g. some ids missing), or None."""
    try:
        return parse_json(raw)
    except ValueError:
        return None


def verdict_schema(ids: Sequence[str]) -> dict[str, Any]:
    """The JSON schema of an answer: one boolean per penalty id, nothing else."""
    return {"type": "object", "properties": {i: {"type": "boolean"} for i in ids},
            "required": list(ids), "additionalProperties": False}


class Judge:
    """Judges texts against penalties. Without a `chat` model only regex penalties get verdicts."""

    def __init__(self, chat: ChatModel | None = None, cfg: JudgeConfig | None = None):
        self.chat = chat
        self.cfg = cfg or JudgeConfig()
        """Retries, concurrency and cache size (penalties.config.JudgeConfig)."""
        self.stats = JudgeStats()
        self._cache: OrderedDict[tuple[str, str | None, int], dict[str, bool]] = OrderedDict()
        self._limiter: anyio.CapacityLimiter | None = None
        self._regexes: dict[str, re.Pattern[str] | None] = {}

    async def judge(self, texts: list[str], penalties: list[Penalty], buffer_version: int,
                    contexts: Sequence[str | None] | None = None) -> list[dict[str, bool]]:
        """One `{penalty_id: triggered}` per text; undecided verdicts are False (and counted)."""
        return [j.verdicts for j in await self.assess(texts, penalties, buffer_version, contexts)]

    async def assess(self, texts: list[str], penalties: list[Penalty], buffer_version: int,
                     contexts: Sequence[str | None] | None = None) -> list[Judgement]:
        """Like `judge`, also saying which verdicts failed. `contexts[i]` is what text i replies to."""
        ctxs = list(contexts) if contexts is not None else [None] * len(texts)
        if len(ctxs) != len(texts):
            raise ValueError(f"{len(ctxs)} contexts for {len(texts)} texts")
        out = [Judgement({}) for _ in texts]
        lexical = [p for p in penalties if p.regex]
        semantic = [p for p in penalties if not p.regex]
        for text, j in zip(texts, out):
            for p in lexical:
                rx = self._compiled(p.regex or "")
                if rx is None:
                    j.verdicts[p.id] = False
                    j.failed.add(p.id)
                    self.stats.failures += 1
                else:
                    j.verdicts[p.id] = rx.search(text) is not None
                    self.stats.lexical += 1
        if semantic:
            await self._judge_semantic(texts, ctxs, semantic, buffer_version, out)
        return out

    def messages(self, text: str, penalties: Sequence[Penalty], context: str | None = None,
                 nonce: str | None = None) -> list[Message]:
        """The judge's prompt for one text; `text` and `context` are fenced as data."""
        nonce = nonce or new_nonce(text, context or "")
        ctx = ""
        if context:
            ctx = (f"\nThe conversation the reply answers is between <context-{nonce}> and "
                   f"</context-{nonce}>:\n{fence('context', context, nonce)}\n")
        user = render("judge_user", penalties=penalty_list(penalties), context=ctx, nonce=nonce,
                      reply=fence("reply", text, nonce), ids=", ".join(p.id for p in penalties))
        return [Message("system", render("judge_system")), Message("user", user)]

    # --- internals ------------------------------------------------------------------------------

    def _compiled(self, regex: str) -> re.Pattern[str] | None:
        if regex not in self._regexes:
            try:
                self._regexes[regex] = re.compile(regex)
            except re.error:
                log.warning("judge.bad_regex", regex=regex)
                self._regexes[regex] = None
        return self._regexes[regex]

    async def _judge_semantic(self, texts: list[str], ctxs: list[str | None], penalties: list[Penalty],
                              version: int, out: list[Judgement]) -> None:
        ids = [p.id for p in penalties]
        if self.chat is None:
            for j in out:
                j.verdicts.update(dict.fromkeys(ids, False))
                j.failed.update(ids)
            self.stats.failures += len(ids) * len(out)
            return
        keys = [(t, c, version) for t, c in zip(texts, ctxs)]
        answers: dict[tuple[str, str | None, int], Judgement] = {}
        todo = []
        for key in dict.fromkeys(keys):  # unique, in order
            if key in self._cache:
                self._cache.move_to_end(key)
                answers[key] = Judgement(dict(self._cache[key]))
            else:
                todo.append(key)
        self.stats.cache_hits += len(keys) - len(todo)  # cached texts, and repeats within this call
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.cfg.max_concurrency)

        async def one(key: tuple[str, str | None, int]) -> None:
            answers[key] = await self._call(key, penalties, ids)

        async with anyio.create_task_group() as tg:
            for key in todo:
                tg.start_soon(one, key)
        for key, j in zip(keys, out):
            j.verdicts.update(answers[key].verdicts)
            j.failed.update(answers[key].failed)

    async def _call(self, key: tuple[str, str | None, int], penalties: list[Penalty],
                    ids: list[str]) -> Judgement:
        text, context, _ = key
        assert self._limiter is not None and self.chat is not None
        async with self._limiter:
            t0 = time.perf_counter()
            try:
                raw = await chat_json(self.chat, self.messages(text, penalties, context),
                                      verdict_schema(ids), retries=self.cfg.retries)
            except ChatJSONError as e:  # retried already; keep what the last answer did decide
                raw = salvage(e.raw)
            except Exception as e:  # noqa: BLE001 - a judge failure must never stop training
                log.warning("judge.call_failed", error=f"{type(e).__name__}: {e}")
                raw = None
            failed_call = not isinstance(raw, dict)
            dt = time.perf_counter() - t0
        self.stats.calls += 1
        self.stats.latency_sum += dt
        self.stats.latency_max = max(self.stats.latency_max, dt)
        if failed_call:
            self.stats.failed_calls += 1
            self.stats.failures += len(ids)
            return Judgement(dict.fromkeys(ids, False), set(ids))
        verdicts, failed = parse_verdicts(raw, ids)
        self.stats.failures += len(failed)
        if not failed:
            self._cache[key] = dict(verdicts)
            while len(self._cache) > self.cfg.cache_size:
                self._cache.popitem(last=False)
        return Judgement(verdicts, failed)


class RegexJudge(Judge):
    """Lexical penalties only, no ChatModel: the default judge for CPU runs.

    A penalty without a regex gets False and counts as a failure (build the proposer with
    `require_regex=True` when pairing it with this judge).
    """

    def __init__(self) -> None:
        super().__init__(chat=None)
