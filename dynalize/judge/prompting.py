"""Prompt templates (package data) and how untrusted text is embedded in them.

Rollout texts are data, never instructions: `fence` wraps them in tags that carry a random
per-call nonce the text cannot contain, so a reply cannot close its own block.
"""

from __future__ import annotations

import secrets
from functools import cache
from importlib import resources
from string import Template
from typing import TYPE_CHECKING, Any, Iterable, Sequence, TypeVar

if TYPE_CHECKING:
    from ..types import Message, Penalty, Rollout

Owner = TypeVar("Owner")


@cache
def load_template(package: str, name: str) -> Template:
    """The template `prompts/<name>.txt` of `package` (slots written `$slot`)."""
    text = resources.files(package).joinpath("prompts", f"{name}.txt").read_text("utf-8")
    return Template(text)


def render_template(package: str, name: str, /, **slots: object) -> str:
    """Template `name` of `package` with every slot filled (a missing slot raises KeyError)."""
    return load_template(package, name).substitute({k: str(v) for k, v in slots.items()}).strip()


def render(name: str, /, **slots: object) -> str:
    """The judge's template `name` (dynalize/judge/prompts/) with every slot filled."""
    return render_template("dynalize.judge", name, **slots)


def new_nonce(*texts: str) -> str:
    """A random tag code that occurs in none of `texts` (so none of them can close the tag)."""
    while True:
        nonce = secrets.token_hex(8)
        if not any(nonce in t for t in texts):
            return nonce


def fence(label: str, text: str, nonce: str) -> str:
    """`text` between `<label-nonce>` and `</label-nonce>`; the nonce must not occur in `text`."""
    if nonce in text:
        raise ValueError("the nonce occurs in the fenced text")
    return f"<{label}-{nonce}>\n{text}\n</{label}-{nonce}>"


def penalty_list(penalties: Sequence["Penalty"], *, regex: bool = False) -> str:
    """Penalties as prompt lines `- p003: Title. Description`, or `(none)`; with `regex`, each
    line ends with ` [regex: <pattern>]`, ` [detector: <name>]` or ` [no regex]`."""
    def line(p: "Penalty") -> str:
        detector = getattr(p, "detector", None)
        shown = ("" if not regex else f" [regex: {p.regex}]" if p.regex
                 else f" [detector: {detector}]" if detector else " [no regex]")
        return f"- {p.id}: {p.title}. {p.description}{shown}"

    return "\n".join(line(p) for p in penalties) or "(none)"


def criteria_list(criteria: Sequence[Any], keys: Sequence[str]) -> str:
    """Rubric criteria as prompt lines `- c3: <text>` under the keys the judge answers with."""
    return "\n".join(f"- {k}: {c.text}" for k, c in zip(keys, criteria)) or "(none)"


def transcript(conversation: Sequence["Message"]) -> str | None:
    """The conversation a reply answers, as the judge reads it: each message under its role,
    system messages left out; None when nothing is left."""
    shown = [f"[{m.role}]\n{m.content}" for m in conversation if m.role != "system"]
    return "\n\n".join(shown) or None


def judge_inputs(owned: Iterable[tuple[Owner, "Rollout"]], context: bool
                 ) -> tuple[list[str], list[str | None], list[Owner]]:
    """Every policy reply of the rollouts, each with what it answers (its transcript when `context`,
    else None) and the owner given with its rollout: what a judge assesses for a batch."""
    texts: list[str] = []
    contexts: list[str | None] = []
    owners: list[Owner] = []
    for owner, r in owned:
        for conversation, reply in r.exchanges():
            texts.append(reply)
            contexts.append(transcript(conversation) if context else None)
            owners.append(owner)
    return texts, contexts, owners


def load_verbatim(name: str) -> str:
    """A benchmark's own prompt kept verbatim in `dynalize/judge/prompts/<name>.txt`: the leading
    lines starting with `%%` (naming its source) are dropped, and the rest is stripped, as sent."""
    text = resources.files("dynalize.judge").joinpath("prompts", f"{name}.txt").read_text("utf-8")
    lines = text.splitlines(keepends=True)
    while lines and lines[0].startswith("%%"):
        lines.pop(0)
    return "".join(lines).strip()
