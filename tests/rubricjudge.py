"""Scripted judges and a reward function for rubric tests (named in YAML as `rubricjudge:<name>`)."""

import json
import re


def _listed(messages):
    user = messages[-1].content
    keys = re.findall(r"^- (c\d+): (.*)$", user, flags=re.M)
    reply = user.split("<reply-")[1].split(">", 1)[1].rsplit("</reply-", 1)[0]
    return keys, reply


def lenient(messages) -> str:
    """A proxy: every positive-sounding criterion met when the reply has more than 3 words."""
    keys, reply = _listed(messages)
    return json.dumps({k: len(reply.split()) > 3 for k, _ in keys})


def strict(messages) -> str:
    """A gold judge: a criterion met when the reply shares a word of 5+ letters with it."""
    keys, reply = _listed(messages)
    words = {w.lower() for w in re.findall(r"[A-Za-z]{5,}", reply)}
    return json.dumps({k: bool(words & {w.lower() for w in re.findall(r"[A-Za-z]{5,}", text)}) for k, text in keys})


def length_reward(replies):
    """A Python RM: longer replies score higher."""
    return [min(len(r), 200) / 200 for r in replies]


def broken_for_some(messages) -> str:
    """A proxy that never answers (prose, no JSON) on about half the replies, the same ones every time."""
    import hashlib

    keys, _ = _listed(messages)
    user = messages[-1].content
    nonce = re.search(r"<reply-([0-9a-f]+)>", user).group(1)  # random per call: left out of the hash
    if hashlib.sha256(user.replace(nonce, "").encode()).digest()[0] % 2 == 0:
        return "I cannot judge this reply."
    return json.dumps({k: True for k, _ in keys})


def lenient_or_nothing(messages) -> str:
    """A proxy that gives no verdicts on about half of the rubrics (by their first criterion's text:
    those groups are left out), lenient's on the others."""
    keys, reply = _listed(messages[:2])  # the first question, also when asked again
    if sum(map(ord, keys[0][1])) % 2:
        return "no verdicts today"
    return json.dumps({k: len(reply.split()) > 3 for k, _ in keys})


def odd_keys(messages) -> str:
    """A judge that marks met exactly the criteria listed at odd positions (c1, c3, ...): it disagrees
    with any other rule on some criterion of every rubric of two or more criteria."""
    keys, _ = _listed(messages[:2])
    return json.dumps({k: int(k[1:]) % 2 == 1 for k, _ in keys})
