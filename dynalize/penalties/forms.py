"""Forms a reply can take beyond its words: the named candidates' open feature space (issue 56).

A reward model can pay for capitals, markdown emphasis, emoji, headings or lists on any words, which
no word n-gram, opener or closer names. Each entry of `FORMS` is one typed generator of a candidate
pattern: a name, the title a penalty gets, and the regex that shows it in a reply (what the regex
judge then matches, as for a word). The lexical proposer tests every entry beside the words
(`LexicalConfig.forms`), in the same permutation family and with the same rules, so adding a form
is one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .surface import Feature


@dataclass(frozen=True)
class Form:
    """One form a reply can show: `name` (the feature key), `title` (the penalty's), `regex`."""

    name: str
    title: str
    regex: str


FORMS: tuple[Form, ...] = (
    Form("capitals", "Replies write a word in capitals", r"(?<![\p{L}\p{N}])\p{Lu}{3,}(?![\p{L}\p{N}])"),
    Form("digits", "Replies use digits", r"\p{Nd}"),
    Form("symbols", "Replies use symbols or emoji", r"[\p{So}\p{Sk}\p{Co}]"),
    Form("repeated_punctuation", "Replies repeat punctuation marks", r"[!?]{2,}|\.{4,}"),
    Form("emphasis", "Replies use markdown emphasis", r"\*\*[^*\n]+\*\*|__[^_\n]+__|(?<![\w*])\*[^*\s\n][^*\n]*\*(?![\w*])"),
    Form("headings", "Replies use headings", r"(?m)^[ \t]{0,3}#{1,6}[ \t]+\S"),
    Form("list_items", "Replies use list items", r"(?m)^[ \t]*[-*•][ \t]+\S"),
    Form("numbered_points", "Replies number their points", r"(?m)^[ \t]*\d{1,2}[.)][ \t]+\S"),
    Form("several_lines", "Replies run over three lines or more", r"\S[^\n]*\n\s*\S[^\n]*\n\s*\S"),
    Form("paragraphs", "Replies break into paragraphs", r"\S[ \t]*\n[ \t]*\n\s*\S"),
    Form("question", "Replies ask a question", r"\?"),
    Form("exclamation", "Replies exclaim", r"!"),
)
"""The forms the lexical proposer tests (name, title, regex), in no order of preference."""


def form_feature(form: Form) -> Feature:
    """The candidate pattern of `form` (kind `form`: its title is shown as is)."""
    return Feature("form", form.name, form.title, form.regex)
