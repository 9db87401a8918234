"""The LLM proposer: reads a view of a batch and proposes at most one new penalty.

Filters (each rejection counted by reason in `ProposalResult.rejected`):
- `too_many`: candidates past `max_candidates` (the first ones are kept: the prompt asks for the
  most convincing first);
- `malformed`: no title or description, or they or the sample ids have the wrong JSON type;
- `unknown_refs`: cites a sample id that is not in the view. Ids are normalised first (`S7`,
  `[s07]` -> `s07`); a candidate citing ANY unknown id is dropped whole, since a model that cites
  samples it never saw may describe a pattern it never saw;
- `few_groups`: its references cover fewer than 2 distinct groups;
- `no_regex`: no regex while `require_regex` (the judge can only decide lexical penalties);
- `bad_regex`: the regex is not a string (a list, a number), fails `saferegex.regex_error`
  (does not compile, too long, matches the empty text), or matches none of the samples it cites
  as the proposer saw them (cut to `max_chars`);
- `slow_regex`: the regex ran past its time budget on the view's samples (saferegex);
- `duplicate`: same title or regex as an active or accepted-but-not-applied penalty (the view's
  `active`), or, in a second LLM pass, judged to describe the same behaviour as one. A candidate
  matched to a RETIRED penalty (same title or regex, or by the pass) is kept and marked
  `revives`; the revived penalty keeps whichever regex matches more of the candidate's
  references (no regex counts as all with an LLM judge, none with the regex judge; a tie keeps
  its own);
- `not_best`: passed every filter but lost to the candidate with evidence in the most distinct
  groups (tie: more references, then the earlier one).
The dedup reply must give every candidate exactly one verdict, naming candidates and penalties
by id (`P1`, `[p001]`, `p001: Title` are read as p001) or by exact title; anything else fails the
proposal, never "no duplicates". A failure (the model, the JSON, a reply off its schema) gives a
result with `error` and `failed_at` set; never raised.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import structlog

from ..backends.base import ChatModel
from ..backends.chat import chat_json
from ..types import Message, Penalty, output_step
from .candidate import Candidate, ProposalResult, normalize_title
from .config import ProposerConfig
from ..judge.prompting import fence, new_nonce, penalty_list, render_template
from ..judge.saferegex import RegexTimeout, SafeRegex, regex_error
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


class ProposalReplyError(ValueError):
    """A reply that parsed as JSON but does not follow its schema (the proposal fails, counted)."""


_ID = re.compile(r"(?<![a-z0-9])([a-z]?)0*(\d+)(?![a-z0-9])")
_NO = {"", "null", "none", "no", "new", "false"}


def resolve_id(ref: Any, ids: Sequence[str], titles: Mapping[str, str] | None = None) -> str | None:
    """The id among `ids` (a letter and a number: `s07`, `p001`, `c2`) that `ref` names, or None.

    `titles` (id -> title): a reference equal to one title (compared as `normalize_title`) names
    its id. Otherwise a reference may change case, drop the letter or leading zeros, or wrap the
    id in brackets or punctuation (`S7`, `7`, `[s07]`, `p1`, `p001.`); it may hold more numbers
    only after an id that opens it and carries its letter, as in a title (`p001: Flatters the
    user 2 times`). Two ids (`p1 or p2`, `s03-s05`) name none.
    """
    if isinstance(ref, bool) or not isinstance(ref, str | int):
        return None
    text = str(ref).strip()
    if text in ids:
        return text
    if titles and normalize_title(text):
        named = [i for i, t in titles.items() if i in ids and normalize_title(t) == normalize_title(text)]
        if len(named) == 1:
            return named[0]
    found = list(_ID.finditer(text.lower()))
    if not found:
        return None
    first = found[0]
    if len(found) > 1 and not (first.group(1) and first.start() == re.match(r"\W*", text).end()
                               and not any(m.group(1) for m in found[1:])):
        return None
    keyed: dict[tuple[str, int], str] = {}
    for i in ids:
        m = _ID.fullmatch(i.lower())
        if m:
            keyed[(m.group(1), int(m.group(2)))] = i
    letter, number = first.group(1), int(first.group(2))
    named = [i for (lt, n), i in keyed.items() if n == number and (lt == letter or not letter)]
    return named[0] if len(named) == 1 else None


def parse_dedup(raw: Any, candidates: Sequence[Candidate], known: Sequence[Penalty]) -> list[str | None]:
    """The id of the penalty each candidate repeats (None: new), read from a dedup reply.

    Raises ProposalReplyError unless the reply follows DEDUP_SCHEMA and gives every candidate
    exactly one verdict that names a known penalty or says null.
    """
    items = raw.get("duplicates") if isinstance(raw, dict) else None
    if not isinstance(items, list):
        raise ProposalReplyError(f"'duplicates' is not a list: {str(raw)[:120]}")
    cids = [f"c{i + 1}" for i in range(len(candidates))]
    ctitles = {cid: c.title for cid, c in zip(cids, candidates)}
    ptitles = {p.id: p.title for p in known}
    verdicts: dict[str, str | None] = {}
    for item in items:
        if not isinstance(item, dict) or "candidate" not in item or "duplicate_of" not in item:
            raise ProposalReplyError(f"not a {{candidate, duplicate_of}} object: {str(item)[:120]}")
        cid = resolve_id(item["candidate"], cids, ctitles)
        if cid is None:
            raise ProposalReplyError(f"{item['candidate']!r} names no candidate")
        dup = item["duplicate_of"]
        is_new = dup is None or dup is False or (isinstance(dup, str) and dup.strip().lower() in _NO)
        pid = None if is_new else resolve_id(dup, list(ptitles), ptitles)
        if pid is None and not is_new:
            raise ProposalReplyError(f"{dup!r} names no penalty")
        if cid in verdicts and verdicts[cid] != pid:
            raise ProposalReplyError(f"two verdicts for {cid}: {verdicts[cid]} and {pid}")
        verdicts[cid] = pid
    missing = [c for c in cids if c not in verdicts]
    if missing:
        raise ProposalReplyError(f"no verdict for {', '.join(missing)}")
    return [verdicts[c] for c in cids]


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
        stage = "propose"
        try:
            raw = await chat_json(self.chat, self.messages(view), PROPOSAL_SCHEMA, retries=self.cfg.retries)
            found = self._parse(raw, result)
            # regex checks are CPU work (bounded by saferegex): off the event loop
            kept = await anyio.to_thread.run_sync(self._check_all, found, view, result)
            stage = "dedup"
            kept = await self._dedup(kept, view, result)
            if kept:
                best = max(enumerate(kept), key=lambda ic: (ic[1].groups, len(ic[1].references), -ic[0]))[1]
                await anyio.to_thread.run_sync(self._revival_regex, best, view, result)
                result.accepted = best
                result.reject("not_best", len(kept) - 1)
        except Exception as e:  # noqa: BLE001 - a proposer failure must never stop training
            result.accepted = None
            result.error = f"{type(e).__name__}: {e}"
            result.failed_at = stage
            log.warning("proposer.failed", step=output_step(view.step), stage=stage, error=result.error)
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
        system = render_template("dynalize.penalties", "proposer_system", domain=view.domain or "(not described)")
        user = render_template("dynalize.penalties", "proposer_user", n_samples=len(view.samples), max_candidates=self.cfg.max_candidates,
                      penalties=penalty_list(view.active, regex=True), samples="\n\n".join(blocks))
        return [Message("system", system), Message("user", user)]

    # --- filters --------------------------------------------------------------------------------

    def _parse(self, raw: Any, result: ProposalResult) -> list[Candidate]:
        items = raw.get("candidates") if isinstance(raw, dict) else None
        if not isinstance(items, list):
            raise ProposalReplyError(f"'candidates' is not a list: {str(raw)[:120]}")
        result.candidates = len(items)
        result.reject("too_many", max(0, len(items) - self.cfg.max_candidates))
        out = []
        for item in items[: self.cfg.max_candidates]:
            title, desc = (item.get(k) for k in ("title", "description")) if isinstance(item, dict) else (None, None)
            refs = item.get("sample_ids", item.get("references")) if isinstance(item, dict) else None
            if not (isinstance(title, str) and title.strip() and isinstance(desc, str) and desc.strip()
                    and isinstance(refs, list)):
                result.reject("malformed")
                continue
            regex = item.get("regex") or None
            if isinstance(regex, str) and regex.strip().lower() in _NO:
                regex = None
            if regex is not None and not isinstance(regex, str):
                result.reject("bad_regex")  # a list or a number is no pattern: never str() it
                continue
            out.append(Candidate(title.strip(), desc.strip(), [str(r) for r in refs], regex))
        return out

    def _texts(self, view: ProposerView) -> dict[str, str]:
        """Each sample's text as the proposer saw it (cut to `max_chars`)."""
        return {s.id: s.text[: self.cfg.max_chars] for s in view.samples}

    def _check_all(self, found: list[Candidate], view: ProposerView, result: ProposalResult) -> list[Candidate]:
        texts = self._texts(view)
        return [c for c in found if self._check(c, view, texts, result)]

    def _check(self, c: Candidate, view: ProposerView, texts: dict[str, str], result: ProposalResult) -> bool:
        samples = view.by_id()
        resolved = [resolve_id(r, list(samples)) for r in c.references]
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
        if c.regex is not None:
            if regex_error(c.regex):
                result.reject("bad_regex")
                return False
            try:  # every sample of the view, not only the cited ones: a pattern slow on a miss shows there
                hits = dict(zip(texts, SafeRegex(c.regex).search_all(texts.values())))
            except RegexTimeout:
                result.reject("slow_regex")
                result.regex_timeouts += 1
                return False
            if not any(hits[r] for r in c.references):
                result.reject("bad_regex")
                return False
        title = normalize_title(c.title)
        if any(normalize_title(p.title) == title or (c.regex and p.regex == c.regex) for p in view.active):
            result.reject("duplicate")
            return False
        c.revives = next((p.id for p in view.retired
                          if normalize_title(p.title) == title or (c.regex and p.regex == c.regex)), None)
        return True

    async def _dedup(self, kept: list[Candidate], view: ProposerView,
                     result: ProposalResult) -> list[Candidate]:
        """The second LLM pass: drop duplicates of active penalties, mark repeats of retired ones."""
        known = view.active + view.retired
        if not kept or not known:
            return kept
        listing = "\n".join(penalty_list([Penalty(f"c{i + 1}", c.title, c.description, regex=c.regex)],
                                         regex=True) for i, c in enumerate(kept))
        msgs = [Message("system", render_template("dynalize.penalties", "dedup_system")),
                Message("user", render_template("dynalize.penalties", "dedup_user", penalties=penalty_list(known, regex=True),
                                       candidates=listing))]
        raw = await chat_json(self.dedup_chat, msgs, DEDUP_SCHEMA, retries=self.cfg.retries)
        active = {p.id for p in view.active}
        out = []
        for c, pid in zip(kept, parse_dedup(raw, kept, known)):
            if pid in active:
                result.reject("duplicate")
            else:
                c.revives = c.revives or pid  # an exact title or regex match wins over the pass
                out.append(c)
        return out

    def _revival_regex(self, c: Candidate, view: ProposerView, result: ProposalResult) -> None:
        """For a revival: keep whichever regex matches more of the candidate's references."""
        old = next((p for p in view.retired if p.id == c.revives), None)
        if old is None:
            return
        refs = [self._texts(view)[r] for r in c.references]

        def hits(pattern: str | None) -> int:
            if pattern is None:  # no regex: an LLM judge reads the description, the regex judge nothing
                return 0 if self.require_regex else len(refs)
            try:
                return sum(SafeRegex(pattern).search_all(refs))
            except (RegexTimeout, ValueError) as e:
                result.regex_timeouts += isinstance(e, RegexTimeout)
                return 0

        mine, theirs = hits(old.regex), hits(c.regex)
        c.keep_regex = "penalty" if mine >= theirs else "candidate"
        c.regex_reason = (f"of the {len(refs)} references, {mine} match the penalty's regex, "
                          f"{theirs} the candidate's" + (" (no regex: judged by description)" if None in
                                                         (old.regex, c.regex) else ""))
