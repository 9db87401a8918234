"""The judge: binary verdicts of every active penalty on a text, in one pass per text.

Penalties with a regex are decided locally, in a worker thread, each pattern within a time
budget (saferegex): a pattern that does not compile or runs past its budget fails its verdicts,
is counted (`regex_timeouts`) and is set aside for the run (`unusable_regexes`; the penalty
term retires its penalty). The rest go to a ChatModel in one call per text (per policy reply
in multi-turn) asking for `{penalty_id: true|false}`. Ids the model invents are ignored; a reply
missing ids, or with a verdict that is not true/false (a cut answer), is retried (chat_json),
and ids still without a verdict after the retries, or every id of a call that yields no JSON
object at all, count as failures (`failed`; the penalty term never reads them as "not
triggered"). LLM calls share a time budget per `assess` (once per training step,
`time_budget_s`): verdicts not in by then fail too. Texts, contexts and the penalty list are
fenced as data (see prompting.fence). Complete LLM answers are cached by (text, context,
buffer version).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from typing import Any, Sequence

import anyio
import structlog

from ..backends.base import ChatModel
from ..backends.chat import ChatJSONError, chat_json, parse_json
from ..errors import describe
from ..types import Message, Penalty
from .config import JudgeConfig
from .prompting import fence, new_nonce, penalty_list, render
from .saferegex import RegexTimeout, SafeRegex, UnsafeRegex

log = structlog.get_logger("dynalize.penalties.judge")

_TRUE = {"true", "yes", "y", "1", "triggered"}
_FALSE = {"false", "no", "n", "0", "not triggered"}


@dataclass
class JudgeStats:
    """Counters since the last reset: LLM calls, failed calls, calls cut by the time budget,
    missing verdicts, cache hits, regex verdicts, regexes that ran past their time budget, latency."""

    calls: int = 0
    failed_calls: int = 0
    timed_out: int = 0
    failures: int = 0
    cache_hits: int = 0
    lexical: int = 0
    regex_timeouts: int = 0
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


def verdict_problem(raw: Any, ids: Sequence[str]) -> str | None:
    """Why an answer lacks a true/false verdict for some id (a cut or garbled answer), or None."""
    failed = parse_verdicts(raw, ids)[1]
    return f"no true/false verdict for {', '.join(sorted(failed))}" if failed else None


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

    def __init__(self, chat: ChatModel | None = None, cfg: JudgeConfig | None = None, *, domain: str = ""):
        self.chat = chat
        self.cfg = cfg or JudgeConfig()
        """Retries, time budget and cache size (penalties.config.JudgeConfig); `max_concurrency`
        is applied to the chat model by `dynalize.build` (a call waiting out a backoff holds no slot)."""
        self.domain = domain
        """The task's description (Task.description), shown in the prompt."""
        self.stats = JudgeStats()
        self.last_error: str | None = None
        """Why the latest failed verdicts failed, in one line (shown when the run stops on failures)."""
        self.unusable_regexes: dict[str, str] = {}
        """Patterns set aside for the run (bad, or past their time budget once), with the reason."""
        self._cache: OrderedDict[tuple[str, str | None, int], dict[str, bool]] = OrderedDict()

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
        if lexical and texts:  # off the event loop: matching is CPU work (bounded, see saferegex)
            await anyio.to_thread.run_sync(self._judge_lexical, texts, lexical, out)
        if semantic:
            await self._judge_semantic(texts, ctxs, semantic, buffer_version, out)
        return out

    def messages(self, text: str, penalties: Sequence[Penalty], context: str | None = None,
                 nonce: str | None = None) -> list[Message]:
        """The judge's prompt for one text; `text`, `context` and the penalties are fenced as data
        (penalty titles and descriptions are written by the proposer from rollout text)."""
        listing = penalty_list(penalties)
        nonce = nonce or new_nonce(text, context or "", listing)
        ctx = ""
        if context:
            ctx = (f"\nThe conversation the reply answers is between <context-{nonce}> and "
                   f"</context-{nonce}>:\n{fence('context', context, nonce)}\n")
        user = render("judge_user", penalties=fence("penalties", listing, nonce), context=ctx, nonce=nonce,
                      reply=fence("reply", text, nonce), ids=", ".join(p.id for p in penalties))
        system = render("judge_system", domain=self.domain or "(not described)")
        return [Message("system", system), Message("user", user)]

    # --- internals ------------------------------------------------------------------------------

    def _judge_lexical(self, texts: list[str], penalties: list[Penalty], out: list[Judgement]) -> None:
        """Each regex penalty over all `texts` within its budget; an unusable pattern fails its verdicts."""
        for p in penalties:
            pattern = p.regex or ""
            hits = None
            if pattern not in self.unusable_regexes:
                try:
                    hits = SafeRegex(pattern).search_all(texts)
                except UnsafeRegex as e:
                    self.unusable_regexes[pattern] = e.reason
                except RegexTimeout as e:
                    self.stats.regex_timeouts += 1
                    self.unusable_regexes[pattern] = f"too slow: {e}"
                if hits is None:
                    log.warning("judge.unusable_regex", penalty=p.id, regex=pattern,
                                reason=self.unusable_regexes[pattern])
            if hits is None:
                for j in out:
                    j.verdicts[p.id] = False
                    j.failed.add(p.id)
                self.stats.failures += len(out)
                self.last_error = f"regex of {p.id} unusable: {self.unusable_regexes[pattern]}"
                continue
            for j, hit in zip(out, hits):
                j.verdicts[p.id] = hit
            self.stats.lexical += len(out)

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

        async def one(key: tuple[str, str | None, int]) -> None:
            answers[key] = await self._call(key, penalties, ids)

        with anyio.move_on_after(self.cfg.time_budget_s):
            async with anyio.create_task_group() as tg:
                for key in todo:
                    tg.start_soon(one, key)
        late = [key for key in todo if key not in answers]
        if late:
            self.stats.timed_out += len(late)
            self.stats.failures += len(late) * len(ids)
            self.last_error = f"no verdict within the judge's time budget ({self.cfg.time_budget_s}s per step)"
            log.warning("judge.time_budget", calls_cut=len(late), budget_s=self.cfg.time_budget_s)
            for key in late:
                answers[key] = Judgement(dict.fromkeys(ids, False), set(ids))
        for key, j in zip(keys, out):
            j.verdicts.update(answers[key].verdicts)
            j.failed.update(answers[key].failed)

    async def _call(self, key: tuple[str, str | None, int], penalties: list[Penalty],
                    ids: list[str]) -> Judgement:
        text, context, _ = key
        assert self.chat is not None  # it bounds its own requests in flight (see build_penalty_term)
        t0 = time.perf_counter()
        error = None
        try:
            raw = await chat_json(self.chat, self.messages(text, penalties, context), verdict_schema(ids),
                                  retries=self.cfg.retries, check=lambda value: verdict_problem(value, ids))
        except ChatJSONError as e:  # retried already; keep what the last answer did decide
            error = describe(e)
            raw = await anyio.to_thread.run_sync(salvage, e.raw)
        except Exception as e:  # noqa: BLE001 - a judge failure must never stop training
            error = describe(e)
            log.warning("judge.call_failed", error=error)
            raw = None
        failed_call = not isinstance(raw, dict)
        dt = time.perf_counter() - t0
        self.stats.calls += 1
        self.stats.latency_sum += dt
        self.stats.latency_max = max(self.stats.latency_max, dt)
        if failed_call:
            self.last_error = error or "no JSON object in the answer"
            self.stats.failed_calls += 1
            self.stats.failures += len(ids)
            return Judgement(dict.fromkeys(ids, False), set(ids))
        verdicts, failed = parse_verdicts(raw, ids)
        self.stats.failures += len(failed)
        if failed:
            self.last_error = error or f"no valid verdict for {', '.join(sorted(failed))}"
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
