"""Credentials are never shown: `mask_secrets` hides every credential-shaped string in a message
from an endpoint (an error body that quotes the Authorization header, a URL with a key in it),
and `url_credential_problem` refuses a URL that carries a key, as a pasted key is refused in
`api_key_env` (the key goes in an environment variable; nothing else is a place for it).

    mask_secrets('bad request; you sent Bearer abc123def456')   # 'bad request; you sent Bearer ***'
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

from .config import KEY_FORMATS, looks_like_key

MASK = "***"

KEY_PARAMS = {"apikey", "key", "token", "accesstoken", "auth", "authorization", "password", "passwd", "pwd",
              "secret", "clientsecret", "sig", "signature", "code", "xapikey", "subscriptionkey", "session"}
"""Query-parameter names (lower case, `-` and `_` dropped) that carry a credential."""

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
    credential-shaped string masked as ***: Authorization values (Bearer/Basic/token), a URL's
    user info, key-like `name=value` pairs (api-key, token, password, ...), known key formats
    (sk-, hf_, ghp_, AKIA…, JWTs, ...) and long high-entropy tokens."""
    for value in known:
        if value:
            text = text.replace(value, MASK)
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


def url_credential_problem(url: str) -> str | None:
    """Why `url` may not be an endpoint setting because it carries a key (None when it carries
    none): user info (`user:key@host`), a key-like query parameter (`?api-key=…`) or a query value
    that looks like a key. The key itself is never repeated."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None  # not a URL at all: the engine's own checks report it
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return ("must not hold credentials (user info before @): put the key in the environment variable "
                "that api_key_env names")
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name.lower().replace("-", "").replace("_", "") in KEY_PARAMS or KEY_FORMATS.match(value):
            return (f"must not hold a key (query parameter {name[:40]!r}): put the key in the environment variable "
                    f"that api_key_env names")
    if any(KEY_FORMATS.match(p) for p in parts.path.split("/")):
        return "must not hold a key (in its path): put the key in the environment variable that api_key_env names"
    return None
