"""The LLM proposer: reads a view of a batch and proposes at most one new penalty.

Filters (each rejection counted by reason in `ProposalResult.rejected`):
- `malformed`: no title or description;
- `unknown_refs`: cites a sample id that is not in the view. Ids are normalised first (`S7`,
  `[s07]` -> `s07`); a candidate citing ANY unknown id is dropped whole, since a model that cites
  samples it never saw may describe a pattern it never saw;
- `few_groups`: its references cover fewer than 2 distinct groups;
- `no_regex`: no regex while `require_regex` (the judge can only decide lexical penalties);
- `bad_regex`: the regex does not compile, matches the empty text, or matches none of the
  samples it cites;
- `duplicate`: same title or regex as an active penalty, or, in a second LLM pass, judged to
  describe the same behaviour as one. A candidate the pass matches to a RETIRED penalty is kept
  and marked `revives`, so the buffer brings that penalty back;
- `not_best`: passed every filter but lost to the candidate with evidence in the most distinct
  groups (tie: more references, then the earlier one).
A failure (the model, the JSON, the dedup pass) gives a result with `error` set; never raised.
"""

from __future__ import annotations

import re
import time
from typing import Any

import structlog

from ..backends.base import ChatModel
from ..backends.chat import chat_json
from ..types import Message
from .candidate import Candidate, ProposalResult, normalize_title, regex_error
from .config import ProposerConfig
from .prompting import fence, new_nonce, penalty_list, render
from .views import ProposerView

log = structlog.get_logger("dynalize.penalties.proposer")

PROPOSAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"candidates": {"type": "array", "items": {
        "type": "object",
        "properties": {"title": {"type": "string"}, "description": {"type": "string"},
                       "sample_ids": {"type": "array", "items": {"type": "string"}},
                       "regex": {"type": ["string", "null"]}},
        "required": ["title", "description", "sample_ids"]}}},
    "required": ["candidates"],
}

DEDUP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"duplicates": {"type": "array", "items": {
        "type": "object",
        "properties": {"candidate": {"type": "string"}, "duplicate_of": {"type": ["string", "null"]}},
        "required": ["candidate", "duplicate_of"]}}},
    "required": ["duplicates"],
}


def resolve_sample_id(ref: Any, ids: list[str]) -> str | None:
    """The view id `ref` names (`S7`, `[s07]`, `7` -> `s07`), or None if it names none."""
    ref = str(ref).strip()
    if ref in ids:
        return ref
    m = re.fullmatch(r"\W*s?(\d+)\W*", ref.lower())
    by_number = {int(i[1:]): i for i in ids if i[1:].isdigit()}
    return by_number.get(int(m.group(1))) if m else None


class LLMProposer:
    """Proposes penalties with `chat`; checks duplicates with `dedup_chat` (default: `chat`).

    `require_regex`: reject candidates without a regex (when the judge can only decide lexical
    penalties).
    """

    def __init__(self, chat: ChatModel, cfg: ProposerConfig | None = None, dedup_chat: ChatModel | None = None,
                 *, require_regex: bool = False):
        self.chat = chat
        self.dedup_chat = dedup_chat or chat
        self.cfg = cfg or ProposerConfig()
        """Retries, candidates per step, characters per sample (penalties.config.ProposerConfig)."""
        self.require_regex = require_regex

    async def propose(self, view: ProposerView) -> ProposalResult:
        """Ask, filter, deduplicate, keep the best. Errors come back in `result.error`."""
        result = ProposalResult(step=view.step)
        t0 = time.perf_counter()
        try:
            raw = await chat_json(self.chat, self.messages(view), PROPOSAL_SCHEMA, retries=self.cfg.retries)
            found = self._parse(raw, result)
            kept = [c for c in found if self._check(c, view, result)]
            kept = await self._dedup(kept, view, result)
            if kept:
                best = max(enumerate(kept), key=lambda ic: (ic[1].groups, len(ic[1].references), -ic[0]))[1]
                result.accepted = best
                result.reject("not_best", len(kept) - 1)
        except Exception as e:  # noqa: BLE001 - a proposer failure must never stop training
            result.accepted = None
            result.error = f"{type(e).__name__}: {e}"
            log.warning("proposer.failed", step=view.step, error=result.error)
        result.latency = time.perf_counter() - t0
        return result

    def messages(self, view: ProposerView) -> list[Message]:
        """The proposer's prompt; every sample text is fenced as data."""
        texts = [s.text[: self.cfg.max_chars] for s in view.samples]
        nonce = new_nonce(*texts)
        blocks = []
        for s, text in zip(view.samples, texts):
            cut = " (cut)" if len(s.text) > self.cfg.max_chars else ""
            blocks.append(f"[{s.id}] group {s.group} | RM score {s.score:.3f} | advantage {s.sign}{cut}\n"
                          + fence("sample", text, nonce))
        system = render("proposer_system", domain=view.domain or "(not described)")
        user = render("proposer_user", n_samples=len(view.samples), max_candidates=self.cfg.max_candidates,
                      penalties=penalty_list(view.active), samples="\n\n".join(blocks))
        return [Message("system", system), Message("user", user)]

    # --- filters --------------------------------------------------------------------------------

    def _parse(self, raw: Any, result: ProposalResult) -> list[Candidate]:
        items = raw.get("candidates", []) if isinstance(raw, dict) else raw if isinstance(raw, list) else []
        out = []
        for item in items if isinstance(items, list) else []:
            result.candidates += 1
            if not isinstance(item, dict):
                result.reject("malformed")
                continue
            title, desc = str(item.get("title") or "").strip(), str(item.get("description") or "").strip()
            refs = item.get("sample_ids") or item.get("references") or []
            regex = item.get("regex") or None
            if isinstance(regex, str) and regex.strip().lower() in ("null", "none"):
                regex = None
            if not title or not desc or not isinstance(refs, list):
                result.reject("malformed")
                continue
            out.append(Candidate(title, desc, [str(r) for r in refs], None if regex is None else str(regex)))
        return out

    def _check(self, c: Candidate, view: ProposerView, result: ProposalResult) -> bool:
        samples = view.by_id()
        resolved = [resolve_sample_id(r, list(samples)) for r in c.references]
        if any(r is None for r in resolved):
            result.reject("unknown_refs")
            return False
        c.references = list(dict.fromkeys(r for r in resolved if r is not None))
        c.groups = len({samples[r].group for r in c.references})
        if c.groups < 2:
            result.reject("few_groups")
            return False
        if c.regex is None and self.require_regex:
            result.reject("no_regex")
            return False
        if c.regex is not None and (regex_error(c.regex) or not any(
                re.search(c.regex, samples[r].text) for r in c.references)):
            result.reject("bad_regex")
            return False
        title = normalize_title(c.title)
        if any(normalize_title(p.title) == title or (c.regex and p.regex == c.regex) for p in view.active):
            result.reject("duplicate")
            return False
        return True

    async def _dedup(self, kept: list[Candidate], view: ProposerView,
                     result: ProposalResult) -> list[Candidate]:
        """The second LLM pass: drop duplicates of active penalties, mark repeats of retired ones."""
        known = view.active + view.retired
        if not kept or not known:
            return kept
        listing = "\n".join(f"- c{i + 1}: {c.title}. {c.description}" for i, c in enumerate(kept))
        msgs = [Message("system", render("dedup_system")),
                Message("user", render("dedup_user", penalties=penalty_list(known), candidates=listing))]
        raw = await chat_json(self.dedup_chat, msgs, DEDUP_SCHEMA, retries=self.cfg.retries)
        active = {p.id for p in view.active}
        retired = {p.id for p in view.retired}
        dropped: set[int] = set()
        for item in raw.get("duplicates", []) if isinstance(raw, dict) else []:
            if not isinstance(item, dict):
                continue
            m = re.fullmatch(r"\s*c?(\d+)\s*", str(item.get("candidate", "")).lower())
            idx = int(m.group(1)) - 1 if m else -1
            dup = item.get("duplicate_of")
            if not 0 <= idx < len(kept) or not isinstance(dup, str):
                continue  # unknown candidates and "null" answers change nothing
            if dup.strip() in active:
                dropped.add(idx)
            elif dup.strip() in retired:
                kept[idx].revives = dup.strip()
        result.reject("duplicate", len(dropped))
        return [c for i, c in enumerate(kept) if i not in dropped]
