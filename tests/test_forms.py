"""The named candidates' open feature space (issue 56 point 2): forms a reward can pay for on any
words (penalties.forms) are proposed as one penalty each, decided like a word."""

from __future__ import annotations

import regex

from dynalize.penalties.forms import FORMS
from test_omnibus import propose, samples

SHOWN = {"capitals": "the RIVER runs", "digits": "at 7 o'clock", "symbols": "a lamp ✨ glows",
         "repeated_punctuation": "what a morning!!", "emphasis": "a **quiet** harbor",
         "headings": "## Harbor\nthe boats", "list_items": "notes:\n- a lamp\n- a stone",
         "numbered_points": "1. a lamp\n2. a stone", "several_lines": "one\ntwo\nthree",
         "paragraphs": "one.\n\ntwo.", "question": "is it raining?", "exclamation": "it rains!"}


def test_each_form_shows_in_its_example_and_not_in_plain_prose():
    assert set(SHOWN) == {f.name for f in FORMS}
    for f in FORMS:
        assert regex.search(f.regex, SHOWN[f.name]), f.name
        assert not regex.search(f.regex, "The river runs past the quiet harbor, and a lamp glows."), f.name


def emphasised(words, rng):
    i = rng.randrange(len(words))
    return words[:i] + [f"**{words[i]}**"] + words[i + 1:]


def capitalised(words, rng):
    i = rng.randrange(len(words))
    return words[:i] + [words[i].upper()] + words[i + 1:]


def test_a_reward_paid_for_bold_or_capitals_on_any_word_gets_one_penalty_for_the_form():
    for mark, title in ((emphasised, "Replies use markdown emphasis"), (capitalised, "Replies write a word in capitals")):
        c, _ = propose(samples(32, 0, 1.0, mark))
        assert c is not None and c.title == title, (mark.__name__, c and c.title)
        assert regex.search(c.regex, {"emphasised": "a **quiet** harbor", "capitalised": "a QUIET harbor"}[mark.__name__])
