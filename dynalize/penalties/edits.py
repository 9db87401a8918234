"""Edits that take a pattern out of a reply, or put it into one, with the rest of the reply kept.

What confirmation (penalties.confirm, penalties.witness) scores with the reward: a reply that
shows a pattern without it (`delete`), a reply that lacks it with it (`insert`). Each edit is a
pure function of the text; each is checked with the pattern's own regex (a deletion must leave no
match, an insertion must make one), and None when it cannot be made.

The pattern kinds are those the lexical proposer writes (penalties.surface), read back from the
regex, so a live penalty is edited as a fresh candidate is:
- `opener` (`Replies open with "X"`): X removed (the next letter capitalised) / X put first;
- `marker` (an opener that is line markup: "-", "*", "1.", "#", ">"): the marker removed from
  every line that starts with it / each sentence made an item on its own line (a list marker),
  or the first sentence made a line of its own behind the marker (a heading, a quote): a list
  is paid for as a list, not its first dash;
- `question`, `punct` (the reply ends with "?" or "!"...): the mark made a full stop / made the mark;
- `last_word` (ends with the word W): W removed / W put last;
- `phrase` (a word or phrase, anywhere): every occurrence removed, the text tidied / the phrase
  opening the reply's last sentence ("Indeed, the ..."), or its first where the replies that show
  it have it there (`opens_replies`);
- `length` ("longer than L words"): the least contentful sentences dropped (the first kept: it
  frames the reply) until L words, cut at L words if one sentence is longer / content-free
  sentences (`PADDING`) appended past L words. The content is held fixed as far as a length can
  be: what is measured is the pay for length itself, not for what longer replies say;
- `family` (any of several of the kinds above, penalties.families: their regexes joined): each
  member shown removed by its own deletion, so a closing offer leaves a finished sentence; put in
  by `transplant` only (a carrier's sentence, where the replies have it);
- `regex` (any other regex, e.g. an LLM proposer's): its matches removed; no insertion.
Text patterns (`TEXT_KINDS`) are also put in by `transplant`: the sentence that carries them in
another reply (`carrier_sentence`), which confirmation uses (penalties.witness), beside the same
reply with that sentence put in bare, the pattern deleted from it (`bare_transplant`): the pay of
the pattern is what the first earns over the second, not what the rest of its sentence (words,
length, content) earns.
A detector's pattern, or a penalty with no regex (an LLM's free description), is not editable
(`form_of` returns None): its decision stays correlational.
"""

from __future__ import annotations

from dataclasses import dataclass

import regex

from .surface import STOP_WORDS, TOKEN, WORD, WORD_END, WORD_START, length_limit

OPENER = r"(?i)\A\s*"
TRAILER = r"[\s\"')\]*_]*\Z"
QUESTION = r"\?" + TRAILER
PADDING = ("That is the short of it.", "In other words, that is all there is to it.",
           "So, to put it another way, that is how it is.", "That is what it comes down to, all in all.")
"""Content-free sentences a length insertion pads with (no topic word, nothing a rubric pays)."""
TIMEOUT = 1.0
"""Seconds an edit's regex may take on one reply (a pathological pattern: the edit is not made)."""

_MARKER = regex.compile(r"[-*+#>]+|\d+[.)]")
"""An opener that is markup at a line's start (a list item, a heading, a quote, a numbered item)."""
_LIST_ITEM = regex.compile(r"[-*+]|\d+[.)]")
_ENDED = regex.compile(r"[.!?][\"')\]*_]*\Z")
_SENTENCE = regex.compile(r"[^.!?\n]+(?:[.!?]+[\"')\]]*|\n+|\Z)\s*")
_FINAL_MARK = regex.compile(r"[.!?;:,]*(" + TRAILER[:-2] + r")\Z")


@dataclass(frozen=True)
class Form:
    """A pattern as an edit sees it: its kind, its regex and what an insertion writes (`text`),
    or the word limit of a length pattern."""

    kind: str
    regex: str
    text: str = ""
    limit: int = 0
    members: tuple[Form, ...] = ()
    """A family's members (`family`), each its own form."""


def _unescape(s: str) -> str:
    return regex.sub(r"\\(.)", r"\1", s)


def form_of(pattern: str | None, detector: str | None = None) -> Form | None:
    """The editable form of a penalty's regex, or None (a detector, no regex, a regex that does not
    compile): no edit can express it, and its decision stays correlational."""
    if detector or not pattern:
        return None
    try:
        regex.compile(pattern)
    except regex.error:
        return None
    if (limit := length_limit(pattern)) is not None:
        return Form("length", pattern, limit=limit)
    if pattern.startswith(OPENER):
        body = pattern[len(OPENER):].removesuffix(WORD_END)
        text = " ".join(_unescape(t) for t in body.split(r"\s+"))
        return Form("marker" if _MARKER.fullmatch(text) else "opener", pattern, text)
    if pattern == QUESTION:
        return Form("question", pattern, "?")
    if pattern.endswith(TRAILER) and regex.fullmatch(r"(?:\\?[^\w\s\\])+", pattern[:-len(TRAILER)]):
        return Form("punct", pattern, _unescape(pattern[:-len(TRAILER)]))
    if (members := _members(pattern)) is not None:
        return Form("family", pattern, members=members)
    word_first = "(?i)" + WORD_START
    if pattern.startswith(word_first) and pattern.endswith(r"\W*\Z"):
        return Form("last_word", pattern, _unescape(pattern[len(word_first):-len(r"\W*\Z")]))
    if pattern.startswith(word_first) and pattern.endswith(WORD_END):
        words = pattern[len(word_first):-len(WORD_END)].split(r"\W+")
        return Form("phrase", pattern, " ".join(_unescape(w) for w in words))
    return Form("regex", pattern)


def _alternatives(pattern: str) -> list[str]:
    """`pattern`'s top-level alternatives (escapes and character classes respected)."""
    out, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
        i += 1
    return [*out, pattern[start:]]


def _members(pattern: str) -> tuple[Form, ...] | None:
    """A family's members (penalties.families.family_feature: `(?:member)|(?:member)...`, each
    member's leading `(?i)` made local as `(?i:...)`), or None when `pattern` is not one whose every
    member is an editable kind."""
    parts = _alternatives(pattern)
    if len(parts) < 2 or not all(p.startswith("(?:") and p.endswith(")")
                                 and len(_alternatives(p[3:-1])) == 1 for p in parts):
        return None
    inner = [p[3:-1] for p in parts]
    regexes = [f"(?i){p[4:-1]}" if p.startswith("(?i:") and p.endswith(")") and len(_alternatives(p[4:-1])) == 1
               else p for p in inner]
    forms = [form_of(r) for r in regexes]
    if any(f is None or f.kind in ("regex", "family", "length") for f in forms):
        return None
    return tuple(f for f in forms if f is not None)


def shows(form: Form, text: str) -> bool | None:
    """Whether `text` shows the pattern (None: its regex ran past `TIMEOUT`)."""
    try:
        return regex.search(form.regex, text, timeout=TIMEOUT) is not None
    except TimeoutError:
        return None


def delete(form: Form, text: str) -> str | None:
    """`text` without the pattern, kept well formed; None when it does not show it or no edit
    leaves a reply without it."""
    if not shows(form, text):
        return None
    try:
        edited = _DELETE[form.kind](form, text)
    except TimeoutError:  # a pathological regex on this reply: no edit, as `shows` says
        return None
    return edited if edited and edited.strip() and shows(form, edited) is False else None


def insert(form: Form, text: str, first: bool = False) -> str | None:
    """`text` with the pattern; None when it already shows it, or the kind has no insertion
    (`regex`), or the edit does not make the regex match. A phrase opens the reply's last
    sentence, or its first with `first` (where the replies that show it have it: `opens_replies`)."""
    if form.kind not in _INSERT or shows(form, text) is not False:
        return None
    edited = _phrase_in_sentence(form, text, first) if form.kind == "phrase" else _INSERT[form.kind](form, text)
    return edited if edited and shows(form, edited) else None


TEXT_KINDS = ("opener", "phrase", "last_word", "family", "regex")
"""Patterns that are text within a sentence: put in by `transplant` (a sentence that carries
them, from a reply to another prompt), so what is inserted is the pattern as the replies write
it (the whole paid phrase around a fragment of it), and a word that is paid only as content for
its own prompt (a topic noun) earns nothing elsewhere."""


def carrier_sentence(form: Form, text: str) -> str | None:
    """The sentence of `text` that shows the pattern (the last such for `last_word` or a family of
    closers, else the first), or None (a match across sentences)."""
    found = [m.group().strip() for m in _SENTENCE.finditer(text) if m.group().strip() and shows(form, m.group().strip())]
    return (found[-1] if _closing(form) else found[0]) if found else None


def _closing(form: Form) -> bool:
    """Whether the pattern is a reply's last word (a closer, or a family of closers)."""
    return form.kind == "last_word" or bool(form.members) and all(m.kind == "last_word" for m in form.members)


def transplant(form: Form, text: str, sentence: str, first: bool = False) -> str | None:
    """`text` with `sentence` (a carrier's, `carrier_sentence`) put first or last; None when
    `text` already shows the pattern or the result does not."""
    if shows(form, text) is not False:
        return None
    edited = _place(form, text, sentence, first)
    return edited if shows(form, edited) else None


def bare_transplant(form: Form, text: str, sentence: str, first: bool = False) -> str | None:
    """`text` with `sentence` put where `transplant` puts it, the pattern deleted from it: what
    the transplant adds besides the pattern. None when nothing of the sentence is left (the
    pattern is the whole sentence, so the transplant adds only itself), or the result shows it."""
    bare = delete(form, sentence)
    if bare is None or not WORD.search(bare) or shows(form, text) is not False:
        return None
    placed = _place(form, text, bare, first)
    return placed if shows(form, placed) is False else None


def _place(form: Form, text: str, sentence: str, first: bool) -> str:
    body = text.strip()
    if first or form.kind == "opener":
        return f"{sentence} {body}"
    stop = "" if _ENDED.search(body) else "."
    return f"{body}{stop} {sentence}"


# --- deletions --------------------------------------------------------------------------------


def tidy(text: str) -> str:
    """Text left after removing words: no doubled spaces, no space before punctuation, no
    punctuation left alone at a sentence's start, each sentence capitalised."""
    text = regex.sub(r"(\A\s*|[.!?\n]\s+)[,;:.!?]+\s*", r"\1", text)
    text = regex.sub(r"[ \t]{2,}", " ", text)
    text = regex.sub(r"[ \t]+([,.;:!?])", r"\1", text)
    text = regex.sub(r"([,;:])(?:\s*[,;:])+", r"\1", text)
    text = regex.sub(r"[,;:]+([.!?])", r"\1", text)
    text = regex.sub(r"(\A\s*|[.!?]\s+)(\p{Ll})", lambda m: m.group(1) + m.group(2).upper(), text)
    return text.strip()


def _remove_all(form: Form, text: str) -> str:
    return tidy(regex.sub(form.regex, " ", text, timeout=TIMEOUT))


def _remove_members(form: Form, text: str) -> str:
    """Each member the text shows removed by its own deletion, until none is left (removing a
    closer can leave another member last)."""
    for _ in range(2 * len(form.members)):
        shown = next((m for m in form.members if shows(m, text)), None)
        if shown is None or not text.strip():
            break
        text = _DELETE[shown.kind](shown, text)
    return text


def _remove_opener(form: Form, text: str) -> str:
    m = regex.search(form.regex, text)
    return tidy(regex.sub(r"\A[\s,;:!.\-\u2013\u2014]*", "", text[m.end():]))


def _end_with(text: str, mark: str) -> str:
    """`text` with its final punctuation replaced by `mark` (closing quotes and markup kept)."""
    m = _FINAL_MARK.search(text)
    return text[:m.start()] + mark + m.group(1)


def _full_stop(form: Form, text: str) -> str:
    m = regex.search(form.regex, text)
    return text[:m.start()].rstrip(".!?") + "." + text[m.start() + len(form.text):]


def _remove_last_word(form: Form, text: str) -> str:
    m = regex.search(form.regex, text)
    head = text[:m.start()].rstrip(" \t,;:-")
    return _end_with(head, ".") if head else ""


def _shorten(form: Form, text: str) -> str:
    """At most `form.limit` words: the least contentful sentences dropped (never the first), then
    the words past the limit cut."""
    sentences = [s for s in _SENTENCE.findall(text) if s.strip()]
    words = [len(TOKEN.findall(s)) for s in sentences]
    order = sorted(range(1, len(sentences)), key=lambda i: (_content(sentences[i]), -i))
    dropped: set[int] = set()
    for i in order:
        if sum(words) - sum(words[j] for j in dropped) <= form.limit:
            break
        dropped.add(i)
    kept = " ".join(s.strip() for i, s in enumerate(sentences) if i not in dropped)
    tokens = TOKEN.findall(kept)
    if len(tokens) > form.limit:
        kept = _end_with(" ".join(tokens[:form.limit]).rstrip(",;:"), ".")
    return kept


def _content(sentence: str) -> float:
    """The share of a sentence's words that carry content (not stop words)."""
    words = [w.lower() for w in WORD.findall(sentence)]
    return sum(w not in STOP_WORDS for w in words) / max(1, len(words))


def _unmark(form: Form, text: str) -> str:
    """Every line's leading marker of the marker's kind (a list's dashes, numbers, '#'s) removed."""
    kind = r"\d+[.)]" if form.text[:1].isdigit() else regex.escape(form.text[0]) + "+"
    return "\n".join(regex.sub(rf"\A(\s*){kind}\s+", r"\1", line) for line in text.splitlines()).strip()


def _mark(form: Form, text: str) -> str:
    """A list marker: each sentence an item on its own line (numbered from 1); a heading or quote
    marker: put first."""
    sentences = [m.group().strip() for m in _SENTENCE.finditer(text) if m.group().strip()] or [text.strip()]
    if not _LIST_ITEM.fullmatch(form.text):  # a heading or a quote: the first sentence, on its own line
        return f"{form.text} {sentences[0]}\n" + " ".join(sentences[1:])
    if form.text[:1].isdigit():
        return "\n".join(f"{i}{form.text[-1]} {x}" for i, x in enumerate(sentences, 1))
    return "\n".join(f"{form.text} {x}" for x in sentences)


_DELETE = {"opener": _remove_opener, "marker": _unmark, "question": _full_stop, "punct": _full_stop,
           "last_word": _remove_last_word, "phrase": _remove_all, "regex": _remove_all, "length": _shorten,
           "family": _remove_members}


# --- insertions -------------------------------------------------------------------------------


def _put_first(form: Form, text: str) -> str:
    body = text.lstrip()
    sep = ", " if regex.search(r"\w\Z", form.text) else " "
    if body[:1].isupper() and body[1:2].islower() and not regex.search(r"[.!?:]\W*\Z", form.text):
        body = body[0].lower() + body[1:]
    return form.text + sep + body


def _end_mark(form: Form, text: str) -> str:
    return _end_with(text.rstrip(), form.text)


def _put_last(form: Form, text: str) -> str:
    body = text.rstrip()
    m = _FINAL_MARK.search(body)
    mark = body[m.start():m.start(1)]
    return f"{body[:m.start()]} {form.text}{mark or '.'}{m.group(1)}"


def opens_replies(form: Form, texts: list[str]) -> bool:
    """Whether most of `texts` (replies that show a phrase) have it in their first sentence."""
    def in_first(text: str) -> bool:
        first = next((m.group() for m in _SENTENCE.finditer(text) if m.group().strip()), "")
        return shows(form, first) is True
    return sum(map(in_first, texts)) * 2 > len(texts)


def _phrase_in_sentence(form: Form, text: str, first: bool) -> str:
    starts = [m.start() for m in _SENTENCE.finditer(text) if m.group().strip()]
    at = (starts[0] if first else starts[-1]) if starts else 0
    rest = text[at:].lstrip()
    lead = text[:at]
    if rest[:1].isupper() and rest[1:2].islower():
        rest = rest[0].lower() + rest[1:]
    phrase = form.text[:1].upper() + form.text[1:]
    return f"{lead}{phrase}, {rest}"


def _pad(form: Form, text: str) -> str:
    out, i = text.rstrip(), 0
    if out and not _ENDED.search(out):
        out += "."
    while len(TOKEN.findall(out)) <= form.limit:
        out += " " + PADDING[i % len(PADDING)]
        i += 1
    return out


_INSERT = {"opener": _put_first, "marker": _mark, "question": _end_mark, "punct": _end_mark, "last_word": _put_last,
           "phrase": _phrase_in_sentence, "length": _pad}
