"""Named detectors: penalties beyond regexes that a judge decides locally, with no LLM.

A detector is a name, a one-line description and a Python predicate (reply, context) -> bool,
where `context` is the transcript of the conversation the reply answers (judge.prompting.transcript,
None when the judge is not shown it). Each looks at text in general (repetition, a restated
prompt, drift off the prompt's topic, unfinished or malformed sentences), never at a task's
vocabulary, so the lexical
proposer can test it on any run like a word pattern (LexicalConfig.detectors) and a penalty may
name one (`Penalty.detector`) instead of carrying a regex. Every judge decides such a penalty with
`judge_detectors` (in a worker thread; an LLM judge never sees it). All are deterministic and run
in time linear in the reply's length; their thresholds are the module constants below.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from itertools import islice
from dataclasses import dataclass
from typing import Any, Sequence

import regex

from .surface import STOP_WORDS, WORD

REPEAT_SENTENCE_WORDS = 4
"""repetition: a sentence of at least this many words that occurs twice (case and spacing aside)."""
REPEAT_NGRAM = 4
REPEAT_NGRAM_SHARE = 0.3
"""repetition: or, in a reply of at least 2·REPEAT_NGRAM words, this share of its word
REPEAT_NGRAM-grams repeat one seen earlier in the reply (a loop such as "I can help. I can help you. I can help")."""
REPEAT_TOKEN_RUN = 6
"""repetition: or the same whitespace-separated token this many times in a row (". . . . . .")."""
REPEAT_UNIT_RUN = 8
"""repetition: or, inside one token, the same unit of 1-3 characters this many times in a row
("!!!!!!!!", "hahahahahahahaha"); rules of dashes, equals signs, underscores, stars, hashes or
tildes (markdown) are not loops."""
OFF_TOPIC_MIN_WORDS = 5
"""off_topic: both the reply and the conversation need this many distinct content words to be judged."""
OFF_TOPIC_MAX_SHARED = 0.05
"""off_topic: triggered when at most this share of the reply's distinct content words (none, for
a reply of fewer than 20) occur in the conversation it answers."""
ECHO_SHARE = 0.5
ECHO_WORDS = 12
ECHO_MIN_WORDS = 3
"""echo: the reply repeats, word for word (case and punctuation aside), a run of consecutive words
of a user message of the conversation it answers that is at least ECHO_SHARE of that message, or
ECHO_WORDS words of a longer one, and never fewer than ECHO_MIN_WORDS: a restatement of what was
asked, not the few words an answer takes up from its question. Set before any run was scored
with it."""
CONTENT_WORD_CHARS = 3
"""A content word: a word of at least this many letters that is not a stop word (plural -s dropped)."""
UNFINISHED_MIN_WORDS = 3
"""unfinished: a reply of at least this many words whose last sentence has no closing mark."""
RUN_ON_WORDS = 60
"""run_on: a sentence (a stretch without . ! ? ; : or a line break) of more than this many words."""
SHOUTING_MIN_LETTERS = 20
SHOUTING_SHARE = 0.5
"""shouting: over at least SHOUTING_MIN_LETTERS letters, more than this share upper case."""

_ROLE_LINE = regex.compile(r"(?m)^\[(\w+)\]\n")
_SENTENCE_END = regex.compile(r"(?<=[.!?…])\s+|\n+")
_CLOSERS = " \t\r\n\"'”’)]}*_`>"
"""What may follow a reply's last mark: space, closing quotes and brackets, markdown emphasis."""
_FINAL_MARKS = set(".!?…:;")
_DOUBLED = regex.compile(r"(?i)(?<!\w)(\p{L}+)\s+\1(?!\w)")
_RUN_ON_SPLIT = regex.compile(r"[.!?…;:]+|\n")
_PAIRS = {")": "(", "]": "[", "}": "{", "”": "“"}
_BRACKETS = regex.compile(r"[()\[\]{}“”]")
_LETTER, _UPPER = regex.compile(r"\p{L}"), regex.compile(r"\p{Lu}")


def _words(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(text)]


def content_words(text: str) -> set[str]:
    """The distinct content words of `text`: lower case, no stop words, a plural -s dropped."""
    out = set()
    for w in _words(text):
        if len(w) >= CONTENT_WORD_CHARS and w not in STOP_WORDS and w.isalpha():
            out.add(w[:-1] if len(w) > CONTENT_WORD_CHARS and w.endswith("s") and not w.endswith("ss") else w)
    return out


_UNIT_RUN = regex.compile(r"([^\s\-=_*#~]{1,3}?)\1{%d,}" % (REPEAT_UNIT_RUN - 1))


def _token_run(reply: str) -> bool:
    """The same token REPEAT_TOKEN_RUN times in a row, or a unit looping inside one token."""
    run, last = 0, None
    for token in reply.split():
        run = run + 1 if token == last else 1
        if run >= REPEAT_TOKEN_RUN:
            return True
        last = token
    return _UNIT_RUN.search(reply) is not None


def repetition(reply: str, context: str | None = None) -> bool:
    """The reply repeats itself: a sentence twice, a looping share of repeated word n-grams, or a
    degenerate run of one token or one unit (repeated punctuation, "ha" looping)."""
    if _token_run(reply):
        return True
    seen: set[tuple[str, ...]] = set()
    for sentence in _SENTENCE_END.split(reply):
        words = tuple(_words(sentence))
        if len(words) >= REPEAT_SENTENCE_WORDS:
            if words in seen:
                return True
            seen.add(words)
    words = _words(reply)
    if len(words) < 2 * REPEAT_NGRAM:
        return False
    grams = [tuple(words[i:i + REPEAT_NGRAM]) for i in range(len(words) - REPEAT_NGRAM + 1)]
    repeats = sum(c - 1 for c in Counter(grams).values())
    return repeats / len(grams) >= REPEAT_NGRAM_SHARE


def off_topic(reply: str, context: str | None = None) -> bool:
    """The reply shares (almost) no content word with the conversation it answers."""
    if context is None:
        raise ValueError("off_topic needs the conversation the reply answers (penalties.judge.context: true)")
    mine, theirs = content_words(reply), content_words(context)
    if len(mine) < OFF_TOPIC_MIN_WORDS or len(theirs) < OFF_TOPIC_MIN_WORDS:
        return False
    return len(mine & theirs) <= OFF_TOPIC_MAX_SHARED * len(mine)


def user_messages(context: str) -> list[str]:
    """What the user said in a transcript (judge.prompting.transcript: each message under its
    `[role]` line); the whole text when it has no role lines."""
    parts = _ROLE_LINE.split(context)
    if len(parts) == 1:
        return [context]
    return [parts[i + 1] for i in range(1, len(parts) - 1, 2) if parts[i] == "user"]


def echo(reply: str, context: str | None = None) -> bool:
    """The reply restates what the user said: a run of consecutive words of one of their messages,
    half of it or `ECHO_WORDS` words (`ECHO_SHARE`)."""
    if context is None:
        raise ValueError("echo needs the conversation the reply answers (penalties.judge.context: true)")
    mine = _words(reply)
    for message in user_messages(context):
        theirs = _words(message)
        n = min(ECHO_WORDS, max(ECHO_MIN_WORDS, math.ceil(ECHO_SHARE * len(theirs))))
        if len(theirs) < n or len(mine) < n:
            continue
        said = {tuple(theirs[i:i + n]) for i in range(len(theirs) - n + 1)}
        if any(tuple(mine[i:i + n]) in said for i in range(len(mine) - n + 1)):
            return True
    return False


def unfinished(reply: str, context: str | None = None) -> bool:
    """The reply's last sentence has no closing mark (. ! ? … : ;), or it stops inside a code block."""
    if len(list(islice(WORD.finditer(reply), UNFINISHED_MIN_WORDS))) < UNFINISHED_MIN_WORDS:
        return False
    if reply.count("```") % 2 == 1:  # it stops inside a code block
        return True
    if reply.rstrip().endswith("```"):  # it ends with a closed code block
        return False
    return reply.rstrip(_CLOSERS)[-1:] not in _FINAL_MARKS


def doubled_word(reply: str, context: str | None = None) -> bool:
    """The same word twice in a row ("the the"), any case."""
    return _DOUBLED.search(reply) is not None


def unbalanced(reply: str, context: str | None = None) -> bool:
    """Brackets (), [], {} or curly quotes that do not pair up, or an odd number of straight double quotes."""
    stack: list[str] = []
    for ch in _BRACKETS.findall(reply):
        if ch in "([{“":
            stack.append(ch)
        elif ch in _PAIRS:
            if not stack or stack.pop() != _PAIRS[ch]:
                return True
    return bool(stack) or reply.count('"') % 2 == 1


def run_on(reply: str, context: str | None = None) -> bool:
    """A sentence of more than RUN_ON_WORDS words without a stop (. ! ? ; : or a line break)."""
    return any(len(WORD.findall(part)) > RUN_ON_WORDS for part in _RUN_ON_SPLIT.split(reply))


def shouting(reply: str, context: str | None = None) -> bool:
    """Most of the reply's letters are upper case."""
    letters = len(_LETTER.findall(reply))
    if letters < SHOUTING_MIN_LETTERS:
        return False
    return len(_UPPER.findall(reply)) > SHOUTING_SHARE * letters


@dataclass(frozen=True)
class Detector:
    """A named check of a reply: `title` names the penalty it makes, `needs_context` whether it
    reads the conversation (it cannot be decided without one)."""

    name: str
    title: str
    description: str
    fn: Callable[[str, str | None], bool]
    needs_context: bool = False
    relevance_held: bool = False
    """Tested, as wording is, on the reward net of relevance (penalties.relevance): a reply that
    takes the prompt up shows it more often, and a reward may pay for that (echo). The others keep
    the plain reward (`off_topic` is relevance itself)."""

    def __call__(self, reply: str, context: str | None = None) -> bool:
        return bool(self.fn(reply, context))


DETECTORS: dict[str, Detector] = {d.name: d for d in (
    Detector("repetition", "Replies repeat themselves",
             "The reply repeats a sentence, or loops over the same phrases.", repetition),
    Detector("off_topic", "Replies drift off the conversation's topic",
             "The reply shares almost no content word with the conversation it answers.", off_topic,
             needs_context=True),
    Detector("echo", "Replies restate the prompt",
             "The reply repeats, word for word, half or more of what the user said (or a dozen words of it): it "
             "restates the prompt.", echo, needs_context=True, relevance_held=True),
    Detector("unfinished", "Replies end mid-sentence",
             "The reply's last sentence has no closing punctuation: it stops mid-sentence.", unfinished),
    Detector("doubled_word", "Replies double a word",
             'The reply writes the same word twice in a row ("the the").', doubled_word),
    Detector("unbalanced", "Replies leave brackets or quotes unbalanced",
             "The reply opens brackets or quotes it does not close (or closes ones never opened).", unbalanced),
    Detector("run_on", "Replies run sentences on",
             f"The reply has a sentence of more than {RUN_ON_WORDS} words without a stop.", run_on),
    Detector("shouting", "Replies shout in capitals",
             "Most of the reply's letters are upper case.", shouting),
)}
"""Every named detector, by name (the values LexicalConfig.detectors and Penalty.detector take)."""


def detector(name: str) -> Detector:
    """The detector called `name`; ValueError naming the known ones otherwise."""
    try:
        return DETECTORS[name]
    except KeyError:
        raise ValueError(f"unknown detector {name!r}; known: {', '.join(DETECTORS)}") from None


def judge_detectors(texts: Sequence[str], contexts: Sequence[str | None], checks: Sequence[Any],
                    out: Sequence[Any], stats: Any) -> str | None:
    """Decide every check that names a detector (`check.detector`) on each text, into `out[i]`
    (a judge.verdicts.Judgement: `verdicts`, `failed`). An unknown detector, one that raises, or
    one that needs a context it is not given fails that verdict (False, in `failed`), counted in
    `stats.failures`; decided verdicts count in `stats.detector`. Returns the last failure's
    reason in one line, or None."""
    error = None
    for c in checks:
        try:
            d: Detector | None = detector(c.detector)
        except ValueError as e:
            d, reason = None, str(e)
        for j, text, ctx in zip(out, texts, contexts):
            if d is not None:
                try:
                    j.verdicts[c.id] = d(text, ctx)
                    stats.detector += 1
                    continue
                except Exception as e:  # noqa: BLE001 - a failing check fails its verdict, counted
                    reason = f"{type(e).__name__}: {e}"
            j.verdicts[c.id] = False
            j.failed.add(c.id)
            stats.failures += 1
            error = f"detector {c.detector!r} of {c.id}: {reason}"[:300]
    return error
