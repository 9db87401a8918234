"""Credentials are never shown: `mask_secrets` hides every credential-shaped string in a message
from an endpoint (an error body that quotes the Authorization header, a URL with a key in it).
It is the one masking of endpoint messages: the openai engine's, the remote generator's and the
preflight's. (A URL that carries a key is refused as a setting: `config.url_credential_problem`.)

    mask_secrets('bad request; you sent Bearer abc123def456')   # 'bad request; you sent Bearer ***'
"""

from __future__ import annotations

import re

from .config import looks_like_key

MASK = "***"

_KEY_TOKEN = (r"(?:sk-|(?:sk|pk|rk)_(?:live|test)_|hf_|gsk_|gh[pousr]_|github_pat_|r8_|npm_|glpat-|pypi-|nvapi-|pplx-"
              r"|xox[abprse]-)[A-Za-z0-9_\-]{6,}|AIza[A-Za-z0-9_\-]{16,}|(?:AKIA|ASIA|AGPA|AIDA|AROA)[A-Z0-9]{16}"
              r"|eyJ[A-Za-z0-9_\-]{8,}(?:\.[A-Za-z0-9_\-]+)*")
_PATTERNS = [
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[^\s\"',;}\]]+"), lambda m: f"{m[1]}{m[2]}{MASK}"),
    (re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(?!bearer\b|basic\b)[^\s\"',;}\]]+"),
     lambda m: f"{m[1]}{MASK}"),
    (re.compile(r"(?i)(\w+://)[^/\s@]*@"), lambda m: f"{m[1]}{MASK}@"),  # userinfo: user:key@host
    (re.compile(r"(?i)(\b(?:x-)?(?:api[-_]?key|access[-_]?token|password|secret|client[-_]?secret|"
                r"subscription[-_]?key)[\"']?\s*[=:]\s*[\"']?)[^\s&\"',;}\]]+"), lambda m: f"{m[1]}{MASK}"),
    (re.compile(r"(?i)((?:[?&;]|\b)(?:key|token|sig|signature|auth|code)=)[^\s&\"',;}\]#]+"), lambda m: f"{m[1]}{MASK}"),
    (re.compile(rf"(?<![A-Za-z0-9])(?:{_KEY_TOKEN})"), lambda m: MASK),
    (re.compile(r"(?<![A-Za-z0-9_\-])[A-Za-z0-9_]{32,}(?![A-Za-z0-9_\-])"),
     lambda m: MASK if looks_like_key(m[0]) else m[0]),  # a long random-looking token
]


def mask_secrets(text: str, *known: str | None) -> str:
    """`text` with the `known` secret values (e.g. the key a request sent) and every
    credential-shaped string masked as ***: Authorization values (`Bearer …`, `Basic …`,
    `Authorization: …`), a URL's user info, key-like `name=value` pairs (api-key, token,
    password, ...), known key formats (sk-, hf_, ghp_, AKIA…, JWTs, ...) and long high-entropy
    tokens."""
    for value in known:
        if value:
            text = text.replace(value, MASK)
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text
