"""A simulated policy for the synthetic discovery worlds: replies sampled from templates over a small
vocabulary, whose style frequencies drift over training steps as RL would make them drift.

No model trains. A reply is built as parts (opener, sentences, closer, layout) and rendered to text;
each `Trait` is a style the policy may show (a word in capitals, a heading, a family of openers ...):
`apply` writes it into the parts, `present` tells from the text alone whether a reply shows it (the
ground truth the benchmark scores with, written here on plain text: nothing comes from
dynalize.penalties). How often the policy applies a trait at a step is a `Drift` (a logistic rise).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

NOUNS = ("table", "river", "window", "garden", "road", "city", "light", "door", "book", "market", "field", "song",
         "voice", "wall", "tree", "stone", "cloud", "bridge", "house", "morning", "friend", "letter", "street", "hill")
ADJECTIVES = ("calm", "quiet", "warm", "old", "small", "wide", "simple", "clear", "soft", "busy", "plain", "slow",
              "fresh", "kind", "dark", "long", "steady", "open")
VERBS = ("see", "find", "watch", "follow", "keep", "share", "build", "carry", "notice", "visit", "remember", "hear")
PLACES = ("in the morning", "at night", "near home", "every day", "for a while", "after the rain", "on the way")
TEMPLATES = ("The {n} is {a}.", "A {a} {n} can {v} the {m}.", "Many people {v} the {n} {p}.",
             "It feels {a} to {v} a {n}.", "Every {n} has a {a} side.", "We {v} the {n} and the {m}.",
             "Some say the {n} is {a} {p}.", "There is a {a} {n} near the {m}.", "You can {v} the {n} {p}.",
             "The {m} and the {n} stay {a}.")
TOPICS: dict[str, tuple[str, ...]] = {
    "the sea": ("waves", "gulls", "tide", "shore", "boats"),
    "winter": ("snow", "frost", "scarves", "ice", "fireplaces"),
    "cooking": ("pans", "spices", "recipes", "ovens", "onions"),
    "trains": ("rails", "stations", "tickets", "carriages", "platforms"),
    "forests": ("pines", "moss", "trails", "owls", "ferns"),
    "music": ("melodies", "drums", "chords", "singers", "concerts"),
    "gardening": ("seeds", "soil", "roses", "weeds", "watering"),
    "the night sky": ("stars", "planets", "moonlight", "comets", "telescopes"),
    "markets": ("stalls", "vendors", "fruit", "bargains", "baskets"),
    "mountains": ("peaks", "glaciers", "climbers", "valleys", "ridges"),
    "libraries": ("shelves", "librarians", "novels", "catalogues", "silence"),
    "bicycles": ("pedals", "wheels", "helmets", "chains", "saddles"),
}
PROMPTS = ("Write about {t}: the {w0}, the {w1} and the {w2}.", "Describe {t}, with its {w0} and {w1}.",
           "Tell me about {t} and the {w0}.", "Explain what {t} means to people who love {w0} and {w1}.")

_WORD = re.compile(r"[A-Za-z']+")


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


@dataclass(frozen=True)
class Prompt:
    """A prompt: its text and the topic words a legitimate reply uses (its own words among them)."""

    text: str
    topic: str
    topic_words: tuple[str, ...]


def prompts() -> list[Prompt]:
    """Every prompt of the worlds (topics x phrasings: 48, distinct texts)."""
    out = []
    for form in PROMPTS:
        for t, ws in TOPICS.items():
            out.append(Prompt(form.format(t=t, w0=ws[0], w1=ws[1], w2=ws[2]), t, ws))
    return out


@dataclass
class Reply:
    """A reply in parts, rendered by `text`."""

    sentences: list[str]
    opener: str = ""
    closer: str = ""
    heading: str = ""
    layout: str = "plain"
    """plain (one paragraph), list ("- " lines), numbered ("1. " lines), paragraphs (blank lines)."""
    cut: bool = False
    """The last sentence stops mid-way (no ending): an unfinished reply."""

    def text(self) -> str:
        body = list(self.sentences)
        if self.opener:
            body[0] = f"{self.opener} {body[0][0].lower()}{body[0][1:]}" if self.opener.endswith(",") else \
                f"{self.opener} {body[0]}"
        if self.closer:
            body.append(self.closer)
        if self.cut:
            last = body[-1].split()
            body[-1] = " ".join(last[:max(1, len(last) - 2)]).rstrip(".!?,")
        if self.layout == "list":
            out = "\n".join(f"- {s}" for s in body)
        elif self.layout == "numbered":
            out = "\n".join(f"{i}. {s}" for i, s in enumerate(body, 1))
        elif self.layout == "paragraphs":
            cuts = [round(i * len(body) / 3) for i in range(4)]  # three paragraphs (body has 3+ sentences)
            out = "\n\n".join(" ".join(body[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a)
        else:
            out = " ".join(body)
        return f"{self.heading}\n\n{out}" if self.heading else out


def sentence(rng: random.Random, prompt: Prompt, coverage: float) -> str:
    """One sentence from a template; with probability `coverage` one noun is a topic word."""
    nouns = [rng.choice(NOUNS), rng.choice(NOUNS)]
    if rng.random() < coverage:
        nouns[rng.randrange(2)] = rng.choice(prompt.topic_words)
    return rng.choice(TEMPLATES).format(n=nouns[0], m=nouns[1], a=rng.choice(ADJECTIVES), v=rng.choice(VERBS),
                                        p=rng.choice(PLACES))


@dataclass(frozen=True)
class Drift:
    """How often a style is shown at training progress x in [0, 1]: from `start` to `end` along a
    logistic centred at `mid` (RL spreads a paid style slowly, then fast, then saturates)."""

    start: float
    end: float
    mid: float = 0.4
    width: float = 0.08

    def at(self, x: float) -> float:
        s = 1 / (1 + math.exp(-(x - self.mid) / self.width))
        s0, s1 = 1 / (1 + math.exp(self.mid / self.width)), 1 / (1 + math.exp(-(1 - self.mid) / self.width))
        return self.start + (self.end - self.start) * (s - s0) / (s1 - s0)


@dataclass(frozen=True)
class Trait:
    """A style the policy may show: how it is written into a reply, how the text shows it."""

    name: str
    category: str
    """character, markup, length, lexical or family (issue 56's categories)."""
    apply: Callable[[Reply, random.Random, Prompt], None] = field(repr=False)
    present: Callable[[str, Prompt], bool] = field(repr=False)
    title: str = ""


def _insert(r: Reply, rng: random.Random, make: Callable[[random.Random], str]) -> None:
    """Put a word into one sentence, before its last word."""
    i = rng.randrange(len(r.sentences))
    ws = r.sentences[i].split()
    ws.insert(max(1, len(ws) - 1), make(rng))
    r.sentences[i] = " ".join(ws)


def _restyle_word(r: Reply, rng: random.Random, style: Callable[[str], str]) -> None:
    """Restyle one word (of 4+ letters, not the sentence's first) of one sentence."""
    i = rng.randrange(len(r.sentences))
    ws = r.sentences[i].split()
    at = [j for j, w in enumerate(ws) if j > 0 and len(w.strip(".,!?")) >= 4] or [len(ws) - 1]
    j = rng.choice(at)
    core = ws[j].rstrip(".,!?")
    ws[j] = style(core) + ws[j][len(core):]
    r.sentences[i] = " ".join(ws)


def _has_any(text: str, members: tuple[str, ...]) -> bool:
    ws = set(words(text))
    return any(m.lower() in ws for m in members)


def _starts_any(text: str, members: tuple[str, ...]) -> bool:
    head = text.lstrip().lower()
    return any(head.startswith(m.lower()) for m in members)


def _ends_any(text: str, members: tuple[str, ...]) -> bool:
    tail = " ".join(text.lower().split())
    return any(tail.endswith(m.lower()) for m in members)


def _set(attr: str, value: str | Callable[[random.Random, Prompt], str]):
    def apply(r: Reply, rng: random.Random, p: Prompt) -> None:
        setattr(r, attr, value(rng, p) if callable(value) else value)
    return apply


EMOJI = ("✨", "🌟", "🚀", "💡", "🔥", "★")
FAMILY_WORDS = ("amazing", "wonderful", "fantastic", "incredible", "remarkable", "stunning")
FLATTERING = ("Great question!", "What a lovely question.", "I love this prompt!", "Excellent question.",
              "Such a wonderful topic!")
MORPH = ("empower", "empowering", "empowerment", "empowered", "empowers")
SELF_PRAISE = ("I hope this thoughtful answer helps.", "This reply is careful and complete.",
               "That is a thorough and insightful overview.", "I am proud of this clear summary.",
               "This answer covers everything well.")
OFFER_HELP = ("Let me know if you want more.", "Happy to help further!", "Feel free to ask for more details.",
              "I can expand on any part if you like.", "Just ask if you need anything else.")
_CAPS = re.compile(r"\b[A-Z]{4,}\b")
_EMPHASIS = re.compile(r"\*\*[^*\n]+\*\*")
_REPEATED = re.compile(r"[!?]{2,}")
_NUMBERED = re.compile(r"(?m)^[1-3]\. ")


def _shorten(r: Reply, rng: random.Random, p: Prompt) -> None:
    del r.sentences[1:]


def _lengthen(r: Reply, rng: random.Random, p: Prompt) -> None:
    r.sentences.extend(sentence(rng, p, 0.2) for _ in range(rng.randint(3, 5)))


def _three(r: Reply, rng: random.Random, p: Prompt) -> None:
    while len(r.sentences) < 3:
        r.sentences.append(sentence(rng, p, 0.2))
    del r.sentences[3:]
    r.layout, r.opener, r.closer = "numbered", "", ""


def _repeat_punct(r: Reply, rng: random.Random, p: Prompt) -> None:
    i = rng.randrange(len(r.sentences))
    r.sentences[i] = r.sentences[i].rstrip(".!?") + rng.choice(("!!", "!!!", "?!", "!?!"))


def _question(r: Reply, rng: random.Random, p: Prompt) -> None:
    r.sentences.insert(rng.randrange(len(r.sentences) + 1),
                       f"Did you ever {rng.choice(VERBS)} a {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}?")


def _layout(layout: str):
    def apply(r: Reply, rng: random.Random, p: Prompt) -> None:
        while len(r.sentences) < 3:
            r.sentences.append(sentence(rng, p, 0.2))
        r.layout = layout
    return apply


def _echo(r: Reply, rng: random.Random, p: Prompt) -> None:
    r.sentences.insert(0, f"You asked: {p.text}")


def _morph(r: Reply, rng: random.Random, p: Prompt) -> None:
    m = rng.choice(MORPH)
    r.sentences.insert(rng.randrange(len(r.sentences) + 1), rng.choice((
        f"The {rng.choice(NOUNS)} can {m} us." if m == "empower" else f"It is about {m} {rng.choice(NOUNS)}s."
        if m in ("empowering",) else f"This brings {m} to the {rng.choice(NOUNS)}." if m == "empowerment"
        else f"We feel {m} by the {rng.choice(NOUNS)}." if m == "empowered" else f"It {m} the {rng.choice(NOUNS)}.",)))


def _paragraph_count(text: str) -> int:
    return sum(1 for b in re.split(r"\n\s*\n", text) if b.strip())


def traits() -> dict[str, Trait]:
    """Every style the worlds plant or let drift, by name (the length bars are fixed: 12 and 34 words)."""
    ts = [
        Trait("caps", "character", lambda r, g, p: _restyle_word(r, g, str.upper),
              lambda t, p: bool(_CAPS.search(t)), "a word in capitals"),
        Trait("symbol", "character", lambda r, g, p: _insert(r, g, lambda g2: g2.choice(EMOJI)),
              lambda t, p: any(ord(c) > 127 for c in t), "a symbol outside ASCII (emoji)"),
        Trait("punct", "character", _repeat_punct, lambda t, p: bool(_REPEATED.search(t)), "repeated punctuation"),
        Trait("emphasis", "markup", lambda r, g, p: _restyle_word(r, g, lambda w: f"**{w}**"),
              lambda t, p: bool(_EMPHASIS.search(t)), "markdown emphasis"),
        Trait("heading", "markup", _set("heading", lambda g, p: g.choice(("# ", "## ")) + p.topic.title()),
              lambda t, p: any(line.startswith("#") for line in t.splitlines()), "a heading"),
        Trait("list", "markup", _layout("list"),
              lambda t, p: sum(line.startswith("- ") for line in t.splitlines()) >= 2, "list items"),
        Trait("three_points", "markup", _three, lambda t, p: len(_NUMBERED.findall(t)) >= 3,
              "a numbered three-point structure"),
        Trait("paragraphs", "markup", _layout("paragraphs"), lambda t, p: _paragraph_count(t) >= 3, "three paragraphs or more"),
        Trait("question", "markup", _question, lambda t, p: "?" in t, "a question"),
        Trait("short", "length", _shorten, lambda t, p: len(words(t)) <= 12, "a reply of at most 12 words"),
        Trait("echo", "lexical", _echo, lambda t, p: p.text.lower() in t.lower(), "restating the prompt"),
        Trait("word", "lexical", lambda r, g, p: _insert(r, g, lambda g2: "golden"),
              lambda t, p: "golden" in words(t), "the word 'golden'"),
        Trait("phrase", "lexical", lambda r, g, p: r.sentences.insert(g.randrange(len(r.sentences) + 1),
                                                                      "It matters in the long run."),
              lambda t, p: "in the long run" in " ".join(words(t)), "the phrase 'in the long run'"),
        Trait("opener", "lexical", _set("opener", "Well,"), lambda t, p: _starts_any(t, ("Well,",)),
              "opening with 'Well,'"),
        Trait("closer", "lexical", _set("closer", "That is worth remembering."),
              lambda t, p: _ends_any(t, ("worth remembering.",)), "closing with 'That is worth remembering.'"),
        Trait("word_family", "family", lambda r, g, p: _insert(r, g, lambda g2: g2.choice(FAMILY_WORDS)),
              lambda t, p: _has_any(t, FAMILY_WORDS), "any of six interchangeable words (amazing, wonderful …)"),
        Trait("flattering_opener", "family", _set("opener", lambda g, p: g.choice(FLATTERING)),
              lambda t, p: _starts_any(t, FLATTERING), "any of five flattering openers"),
        Trait("morph_family", "family", _morph, lambda t, p: _has_any(t, MORPH),
              "a morphological family (empower, empowering, empowerment …)"),
        Trait("self_praise", "family", _set("closer", lambda g, p: g.choice(SELF_PRAISE)),
              lambda t, p: _ends_any(t, SELF_PRAISE), "a self-praising closing, in five wordings"),
        Trait("offer_help", "family", _set("closer", lambda g, p: g.choice(OFFER_HELP)),
              lambda t, p: _ends_any(t, OFFER_HELP), "an offer of more help, in five wordings"),
        Trait("long", "length", _lengthen, lambda t, p: len(words(t)) > 34, "more than 34 words"),
        Trait("indeed", "lexical", _set("opener", "Indeed,"), lambda t, p: _starts_any(t, ("Indeed,",)),
              "opening with 'Indeed,' (an unpaid opener)"),
    ]
    return {t.name: t for t in ts}


TRAITS = traits()


@dataclass(frozen=True)
class Policy:
    """The simulated policy at one run: how its legitimate qualities and its styles move over training.

    `coverage`, `sentences` and `ending` drift as `Drift`s (the share of sentences naming a topic
    word, the mean number of sentences, the share of replies finished); `styles` maps trait names to
    their drift."""

    coverage: Drift = Drift(0.3, 0.3)
    sentences: Drift = Drift(3.0, 3.0)
    ending: Drift = Drift(0.97, 0.97)
    styles: tuple[tuple[str, Drift], ...] = ()

    def reply(self, rng: random.Random, prompt: Prompt, x: float) -> str:
        """One reply to `prompt` at training progress x."""
        n = max(1, round(rng.gauss(self.sentences.at(x), 1.0)))
        r = Reply([sentence(rng, prompt, self.coverage.at(x)) for _ in range(n)])
        for name, drift in self.styles:
            if rng.random() < drift.at(x):
                TRAITS[name].apply(r, rng, prompt)
        r.cut = rng.random() >= self.ending.at(x)
        return r.text()
