"""The judge: binary verdicts of every check (active penalties, or a rubric's criteria) on a
text, in one pass per text. Penalties and rubric criteria go through the same code; what
differs is the prompt (`JudgePrompt`: its templates, how it lists the checks, the answer keys).

Penalties with a regex are decided locally, in a worker thread, each pattern within a time
budget (saferegex), and so are penalties naming a detector (penalties.detectors: an LLM never
sees them; a detector that fails fails its verdicts, counted). A pattern that does not compile
or runs past its budget fails its verdicts, is counted (`regex_timeouts`) and is set aside
for the run (`unusable_regexes`; the penalty term retires its penalty). A judge given a Python `predicate` decides the checks without a
regex with it (a rule-based judge, no LLM: a predicate that raises or returns a non-bool fails
that verdict, counted). The rest go to a ChatModel in one call per text (per policy reply
in multi-turn) asking for `{penalty_id: true|false}` (for rubric criteria, `{c1: ..., cN: ...}`). Ids the model invents are ignored; a reply
missing ids, or with a verdict that is not true/false (a cut answer), is retried (chat_json),
and ids still without a verdict after the retries, or every id of a call that yields no JSON
object at all, are asked once more in a new call (`reasks`, within the step's budget: a transient
fault need not cost the rollout's group), then count as failures (`failed`; the penalty term never reads them as "not
triggered"). LLM calls share a time budget per `assess` (once per training step,
`time_budget_s`): verdicts not in by then fail too. Texts, contexts and the penalty list are
fenced as data (see prompting.fence). Complete LLM answers are cached by (text, context,
buffer version, or for a rubric a hash of its criteria).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Sequence

import anyio
import structlog

from ..backends.base import ChatModel
from ..backends.chat import ChatJSONError, chat_json
from ..errors import describe
from ..types import Message
from ..penalties.detectors import judge_detectors
from .config import JudgeConfig
from .prompting import criteria_list, fence, new_nonce, penalty_list, render, transcript
from .saferegex import RegexTimeout, SafeRegex, UnsafeRegex
from .stats import FailureWindow, JudgeStats
from .usage import CountedChat
from .verdicts import Checkable, Judgement, Predicate, parse_verdicts, salvage, verdict_problem, verdict_schema

log = structlog.get_logger("dynalize.judge")


@dataclass(frozen=True)
class JudgePrompt:
    """How an LLM judge is asked: templates (prompts/<name>.txt), how the checks are listed and
    fenced, and whether the answer's keys are positional (`c1`..`cN`, for rubric criteria whose
    ids can be long) or the checks' own ids (penalties: `p001`)."""

    system: str
    user: str
    listing: Callable[[Sequence[Any], Sequence[str]], str]
    label: str
    """The fence tag of the list (`<label-nonce>`)."""
    positional: bool = False


PENALTY_PROMPT = JudgePrompt("judge_system", "judge_user", lambda items, keys: penalty_list(items), "penalties")
RUBRIC_PROMPT = JudgePrompt("rubric_judge_system", "rubric_judge_user", criteria_list, "rubric", positional=True)


class Judge:
    """Judges texts against checks (penalties or rubric criteria). Without a `chat` model or a
    `predicate`, only checks with a regex get verdicts."""

    def __init__(self, chat: ChatModel | None = None, cfg: JudgeConfig | None = None, *, domain: str = "",
                 predicate: Predicate | None = None, prompt: JudgePrompt = PENALTY_PROMPT, role: str = "judge"):
        self.role = role
        """Which judge this is in the run (`penalty judge`, `proxy judge`, `gold judge`): named in every
        warning it logs, and given to its chat model's own warnings (`label`)."""
        if chat is not None and getattr(chat, "label", "") is None:
            chat.label = role
        self.stats = JudgeStats()
        self.chat = CountedChat(chat, self.stats) if chat is not None else None
        """The chat model, each request counted in `stats` (usage.CountedChat)."""
        self.predicate = predicate
        """Decides the checks without a regex locally (no LLM call)."""
        self.prompt = prompt
        """How the LLM is asked (penalties or rubric criteria)."""
        self.cfg = cfg or JudgeConfig()
        """Retries, time budget and cache size (penalties.config.JudgeConfig); `max_concurrency`
        is applied to the chat model by `dynalize.build` (a call waiting out a backoff holds no slot)."""
        self.domain = domain
        """The task's description (Task.description), shown in the prompt."""
        self.last_error: str | None = None
        """Why the latest failed verdicts failed, in one line (shown when the run stops on failures)."""
        self.unusable_regexes: dict[str, str] = {}
        """Patterns set aside for the run (bad, or past their time budget once), with the reason."""
        self.window = FailureWindow(self.cfg.max_failure_rate, self.cfg.failure_window)
        """Failed verdicts over the last judged steps (the term adds each step's; `stop_reason`)."""
        self._cache: OrderedDict[tuple[str, str | None, Hashable], dict[str, bool]] = OrderedDict()

    async def judge(self, texts: list[str], penalties: Sequence[Checkable], buffer_version: Hashable,
                    contexts: Sequence[str | None] | None = None) -> list[dict[str, bool]]:
        """One `{penalty_id: triggered}` per text; undecided verdicts are False (and counted)."""
        return [j.verdicts for j in await self.assess(texts, penalties, buffer_version, contexts)]

    async def assess(self, texts: list[str], penalties: Sequence[Checkable], buffer_version: Hashable,
                     contexts: Sequence[str | None] | None = None) -> list[Judgement]:
        """Like `judge`, also saying which verdicts failed. `contexts[i]` is what text i replies to;
        `buffer_version` names the set of checks in the cache key (for a rubric: a hash of it), beside their ids."""
        ctxs = list(contexts) if contexts is not None else [None] * len(texts)
        if len(ctxs) != len(texts):
            raise ValueError(f"{len(ctxs)} contexts for {len(texts)} texts")
        out = [Judgement({}) for _ in texts]
        detected = [p for p in penalties if getattr(p, "detector", None)]  # never sent to the LLM
        penalties = [p for p in penalties if not getattr(p, "detector", None)]
        lexical = [p for p in penalties if p.regex]
        local = [p for p in penalties if not p.regex] if self.predicate else []
        semantic = [p for p in penalties if not p.regex and not self.predicate]
        if detected and texts:
            error = await anyio.to_thread.run_sync(judge_detectors, texts, ctxs, detected, out, self.stats)
            self.last_error = error or self.last_error
        if lexical and texts:  # off the event loop: matching is CPU work (bounded, see saferegex)
            await anyio.to_thread.run_sync(self._judge_lexical, texts, lexical, out)
        if local and texts:
            await anyio.to_thread.run_sync(self._judge_predicate, texts, ctxs, local, out)
        if semantic:
            await self._judge_semantic(texts, ctxs, semantic, buffer_version, out)
        return out

    def context_of(self, conversation: Sequence[Message]) -> str | None:
        """What this judge is shown of the conversation a reply answers: its transcript (system
        messages left out) when `cfg.context`, else None. Protocol judges render it their way."""
        return transcript(conversation) if self.cfg.context else None

    def keys(self, checks: Sequence[Checkable]) -> list[str]:
        """The answer's keys for `checks`: their ids, or `c1`..`cN` for a positional prompt."""
        return [f"c{i + 1}" for i in range(len(checks))] if self.prompt.positional else [c.id for c in checks]

    def messages(self, text: str, penalties: Sequence[Checkable], context: str | None = None,
                 nonce: str | None = None) -> list[Message]:
        """The judge's prompt for one text; `text`, `context` and the checks are fenced as data
        (penalty titles and descriptions are written by the proposer from rollout text)."""
        keys = self.keys(penalties)
        listing = self.prompt.listing(penalties, keys)
        nonce = nonce or new_nonce(text, context or "", listing)
        ctx = ""
        if context:
            ctx = (f"\nThe conversation the reply answers is between <context-{nonce}> and "
                   f"</context-{nonce}>:\n{fence('context', context, nonce)}\n")
        items = fence(self.prompt.label, listing, nonce)
        user = render(self.prompt.user, penalties=items, items=items, context=ctx, nonce=nonce,
                      reply=fence("reply", text, nonce), ids=", ".join(keys))
        system = render(self.prompt.system, domain=self.domain or "(not described)")
        return [Message("system", system), Message("user", user)]

    # --- internals ------------------------------------------------------------------------------

    def _judge_lexical(self, texts: list[str], penalties: list[Checkable], out: list[Judgement]) -> None:
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
                    log.warning("judge.unusable_regex", role=self.role, penalty=p.id, regex=pattern,
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

    def _judge_predicate(self, texts: list[str], ctxs: list[str | None], checks: list[Checkable],
                         out: list[Judgement]) -> None:
        """Each check without a regex decided by the predicate; a raise or a non-bool fails the verdict."""
        assert self.predicate is not None
        for j, text, ctx in zip(out, texts, ctxs):
            for c in checks:
                try:
                    v = self.predicate(text, c, ctx)
                except Exception as e:  # noqa: BLE001 - a bad check fails its verdict, counted
                    v = e
                if isinstance(v, bool):
                    j.verdicts[c.id] = v
                    self.stats.predicate += 1
                    continue
                j.verdicts[c.id] = False
                j.failed.add(c.id)
                self.stats.failures += 1
                self.last_error = f"predicate on {c.id}: {type(v).__name__}: {v}"[:300]
                log.warning("judge.predicate_failed", role=self.role, check=c.id, result=self.last_error)

    async def _judge_semantic(self, texts: list[str], ctxs: list[str | None], penalties: list[Checkable],
                              version: Hashable, out: list[Judgement]) -> None:
        ids = [p.id for p in penalties]
        if self.chat is None:
            for j in out:
                j.verdicts.update(dict.fromkeys(ids, False))
                j.failed.update(ids)
            self.stats.failures += len(ids) * len(out)
            return
        # the ids too: callers that pass one constant version (an audit, then its comparison
        # under tagged ids) must not read each other's answers
        checks = (version, tuple(ids))
        keys = [(t, c, checks) for t, c in zip(texts, ctxs)]
        answers: dict[tuple[str, str | None, Hashable], Judgement] = {}
        todo = []
        for key in dict.fromkeys(keys):  # unique, in order
            if key in self._cache:
                self._cache.move_to_end(key)
                answers[key] = Judgement(dict(self._cache[key]))
            else:
                todo.append(key)
        self.stats.cache_hits += len(keys) - len(todo)  # cached texts, and repeats within this call

        async def one(key: tuple[str, str | None, Hashable]) -> None:
            j = await self._call(key, penalties, ids)
            for _ in range(self.cfg.reasks):  # a failed verdict is asked again, within the budget
                if not j.failed:
                    break
                self.stats.reasked += 1
                again = await self._call(key, penalties, ids)
                decided = j.failed - again.failed
                self.stats.recovered += len(decided)
                j = Judgement({**j.verdicts, **{i: again.verdicts[i] for i in decided}}, j.failed & again.failed)
            self.stats.failures += len(j.failed)
            answers[key] = j

        with anyio.move_on_after(self.cfg.time_budget_s):
            async with anyio.create_task_group() as tg:
                for key in todo:
                    tg.start_soon(one, key)
        late = [key for key in todo if key not in answers]
        if late:
            self.stats.timed_out += len(late)
            self.stats.failures += len(late) * len(ids)
            self.last_error = f"no verdict within the judge's time budget ({self.cfg.time_budget_s}s per step)"
            log.warning("judge.time_budget", role=self.role, calls_cut=len(late), budget_s=self.cfg.time_budget_s)
            for key in late:
                answers[key] = Judgement(dict.fromkeys(ids, False), set(ids))
        for key, j in zip(keys, out):
            j.verdicts.update(answers[key].verdicts)
            j.failed.update(answers[key].failed)

    async def _call(self, key: tuple[str, str | None, Hashable], penalties: list[Checkable],
                    ids: list[str]) -> Judgement:
        text, context, _ = key
        asked = self.keys(penalties)
        assert self.chat is not None  # it bounds its own requests in flight (see build_penalty_term)
        t0 = time.perf_counter()
        error = None
        try:
            raw = await chat_json(self.chat, self.messages(text, penalties, context), verdict_schema(asked),
                                  retries=self.cfg.retries, check=lambda value: verdict_problem(value, asked))
        except ChatJSONError as e:  # retried already; keep what the last answer did decide
            error = describe(e)
            raw = await anyio.to_thread.run_sync(salvage, e.raw, abandon_on_cancel=True)  # the budget holds
        except Exception as e:  # noqa: BLE001 - a judge failure must never stop training
            error = describe(e)
            log.warning("judge.call_failed", role=self.role, error=error)
            raw = None
        failed_call = not isinstance(raw, dict)
        dt = time.perf_counter() - t0
        self.stats.calls += 1
        self.stats.latency_sum += dt
        self.stats.latency_max = max(self.stats.latency_max, dt)
        if failed_call:  # the caller counts the verdicts that stay failed (`failures`)
            self.last_error = error or "no JSON object in the answer"
            self.stats.failed_calls += 1
            return Judgement(dict.fromkeys(ids, False), set(ids))
        by_key, failed_keys = parse_verdicts(raw, asked)
        verdicts = {i: by_key[k] for i, k in zip(ids, asked)}
        failed = {i for i, k in zip(ids, asked) if k in failed_keys}
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
