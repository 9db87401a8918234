"""A Generator on one or more vLLM OpenAI-compatible servers (`python -m vllm.entrypoints.openai.api_server`),
for scale-out: the learner pushes weights through a shared checkpoint directory. See docs/vllm.md.

Sampling: one `/v1/completions` request per prompt (prompt as token ids, its own seed derived from
the batch seed: one request for a whole group would share one seed and so one sample), with
`logprobs=0` and `return_token_ids=true` (vLLM >= 0.10; `return_tokens_as_token_ids` is read as a
fallback). Each request goes to the server with the fewest requests in flight from this client
(round-robin among ties); transient failures (connection errors, timeouts, 429, 5xx) are retried with
backoff, on any server.

Weights: `update_weights` writes the state as safetensors under `checkpoint_dir` (a path every server
can read: the same machine's /dev/shm, or a shared filesystem), then, on every server:
`POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`,
`POST /reset_prefix_cache`, `POST /update_weight_version`. These endpoints exist only when the server
runs with `VLLM_SERVER_DEV_MODE=1`.

Logprobs follow the server's `--logprobs-mode`; start it with `processed_logprobs` (or `raw_logprobs`
at temperature 1 with top-p/min-p, see dynalize.backends.vllm.choose_logprobs_mode) to match HFGenerator.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import structlog
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential, wait_random

from .base import Completion, EngineError, Generator, SamplingParams
from .secrets import mask_secrets

log = structlog.get_logger("dynalize.backends.remote")

DEV_MODE_HINT = "start the vLLM server with VLLM_SERVER_DEV_MODE=1 to enable its weight-reload endpoints"


class _Transient(Exception):
    """A failure worth retrying (possibly on another server)."""


def _token_ids(choice: dict[str, Any]) -> list[int]:
    ids = choice.get("token_ids")
    if ids is not None:
        return [int(t) for t in ids]
    tokens = (choice.get("logprobs") or {}).get("tokens") or []
    if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return [int(t.split(":", 1)[1]) for t in tokens]
    raise EngineError("the server returned no token ids: it needs vLLM >= 0.10 (`return_token_ids`)")


class RemoteGenerator(Generator):
    """Samples from the policy served by vLLM OpenAI-compatible servers at `base_urls`.

    `base_urls`: server roots, e.g. `http://10.0.0.2:8000` (a trailing `/v1` is accepted).
    `model`: the served model name. `tokenizer_path`: the policy's model directory (for its EOS
    ids and nothing else). `checkpoint_dir`: where weight pushes are written (readable by the servers).
    """

    def __init__(self, base_urls: list[str] | str, model: str, *, tokenizer_path: str,
                 checkpoint_dir: str | None = None, api_key_env: str | None = None, timeout: float = 600.0,
                 max_retries: int = 3, max_concurrency: int = 512, keep_checkpoints: int = 2,
                 retry_wait: float = 0.5):
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("RemoteGenerator needs at least one base URL")
        self.base_urls = [u.rstrip("/").removesuffix("/v1") for u in urls]
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.keep_checkpoints = max(1, keep_checkpoints)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else (
            Path("/dev/shm") / f"dynalize-weights-{os.getpid()}")
        self.api_key_env = api_key_env
        from transformers import AutoTokenizer

        from .vllm import eos_token_ids  # pure helper: does not import vllm

        directory = tokenizer_path
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.eos_ids = eos_token_ids(self.tokenizer, directory)
        self.version = 0
        self.last_sync_seconds: float | None = None
        self.in_flight = [0] * len(self.base_urls)
        self._rr = itertools.count()
        self._backoff = wait_exponential(multiplier=retry_wait, max=30) + wait_random(0, retry_wait)
        self._client: httpx.AsyncClient | None = None
        self._lock: anyio.Lock | None = None
        self._written: list[Path] = []

    def __repr__(self) -> str:
        return f"RemoteGenerator({self.base_urls!r}, model={self.model!r})"

    # --- plumbing -------------------------------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {}
            key = os.environ.get(self.api_key_env) if self.api_key_env else None
            if key:
                headers["Authorization"] = f"Bearer {key}"
            limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
            self._client = httpx.AsyncClient(timeout=self.timeout, headers=headers, limits=limits)
            self._lock = anyio.Lock()
        return self._client

    def _pick(self) -> int:
        """The server with the fewest of our requests in flight; round-robin among ties."""
        low = min(self.in_flight)
        ties = [i for i, n in enumerate(self.in_flight) if n == low]
        return ties[next(self._rr) % len(ties)]

    async def _post(self, server: int, path: str, json: Any = None, params: dict[str, Any] | None = None) -> Any:
        url = self.base_urls[server] + path
        try:
            resp = await self._http().post(url, json=json, params=params)
        except (httpx.TransportError, httpx.TimeoutException) as e:
            raise _Transient(f"{url}: {type(e).__name__}: {e}") from None
        if resp.status_code == 429 or resp.status_code >= 500:
            raise _Transient(mask_secrets(f"{url}: HTTP {resp.status_code}: {resp.text[:200]}"))
        if resp.status_code == 404 and path != "/v1/completions":
            raise EngineError(f"{url}: not found; {DEV_MODE_HINT}")
        if resp.status_code >= 400:
            raise EngineError(mask_secrets(f"{url}: HTTP {resp.status_code}: {resp.text[:500]}"))
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise _Transient(f"{url}: unreadable JSON body") from None

    async def _retrying(self, fn, *args: Any) -> Any:
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(self.max_retries + 1), wait=self._backoff,
                                               retry=retry_if_exception_type(_Transient), reraise=True):
                with attempt:
                    return await fn(*args)
        except _Transient as e:
            raise EngineError(f"vLLM server failed after {self.max_retries + 1} attempt(s): {e}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    # --- sampling -------------------------------------------------------------------------------

    def body(self, prompt: list[int], sampling: SamplingParams, seed: int | None) -> dict[str, Any]:
        """The `/v1/completions` request for one prompt."""
        body: dict[str, Any] = {
            "model": self.model, "prompt": list(prompt), "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "min_p": sampling.min_p, "top_k": 0,
            # a key left out would take the model's generation_config.json value on the server
            "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "n": 1, "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
            "stop_token_ids": list(self.eos_ids), "skip_special_tokens": True,
        }
        if seed is not None:
            body["seed"] = seed
        return body

    async def _complete_once(self, body: dict[str, Any]) -> Completion:
        server = self._pick()
        self.in_flight[server] += 1
        try:
            data = await self._post(server, "/v1/completions", body)
        finally:
            self.in_flight[server] -= 1
        try:
            choice = data["choices"][0]
            ids = _token_ids(choice)
            logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        except (KeyError, IndexError, TypeError) as e:
            raise EngineError(f"{self.base_urls[server]}: unexpected completion response ({e!r})") from None
        if len(logprobs) != len(ids):
            raise EngineError(f"{self.base_urls[server]}: {len(logprobs)} logprobs for {len(ids)} tokens")
        stopped = bool(ids) and ids[-1] in self.eos_ids
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(ids, logprobs, text, "stop" if stopped else "length")

    async def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        from .vllm import derive_seeds

        self._http()
        assert self._lock is not None
        out: list[Completion | None] = [None] * len(prompts)
        limiter = anyio.CapacityLimiter(self.max_concurrency)

        async def one(i: int, body: dict[str, Any]) -> None:
            async with limiter:
                out[i] = await self._retrying(self._complete_once, body)

        async with self._lock:  # a weight push waits for the batch in flight
            async with anyio.create_task_group() as tg:
                for i, (p, seed) in enumerate(zip(prompts, derive_seeds(sampling.seed, len(prompts)))):
                    tg.start_soon(one, i, self.body(p, sampling, seed))
        return out  # type: ignore[return-value]

    # --- weights --------------------------------------------------------------------------------

    def _write(self, state: dict[str, Any], version: int) -> Path:
        from .vllm import save_safetensors

        final = self.checkpoint_dir / f"v{version:06d}"
        tmp = self.checkpoint_dir / f".v{version:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        save_safetensors(state, tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)  # servers never see a half-written checkpoint
        return final

    async def _reload(self, server: int, directory: Path, version: int) -> None:
        await self._retrying(self._post, server, "/collective_rpc",
                             {"method": "reload_weights", "kwargs": {"weights_path": str(directory)}})
        await self._retrying(self._post, server, "/reset_prefix_cache")
        await self._retrying(self._post, server, "/update_weight_version", {"new_version": str(version)})

    async def update_weights(self, state: dict[str, Any], version: int) -> None:
        self._http()
        assert self._lock is not None
        async with self._lock:
            start = time.perf_counter()
            directory = await anyio.to_thread.run_sync(self._write, state, version)
            async with anyio.create_task_group() as tg:
                for server in range(len(self.base_urls)):
                    tg.start_soon(self._reload, server, directory, version)
            self.version = version
            self.last_sync_seconds = time.perf_counter() - start
            if directory not in self._written:
                self._written.append(directory)
            while len(self._written) > self.keep_checkpoints:
                shutil.rmtree(self._written.pop(0), ignore_errors=True)
        log.debug("remote.update_weights", version=version, servers=len(self.base_urls),
                  seconds=round(self.last_sync_seconds, 3))

    async def server_versions(self) -> list[str | None]:
        """Each server's weight version (`GET /weight_info`, dev mode)."""
        out = []
        for url in self.base_urls:
            resp = await self._http().get(url + "/weight_info")
            out.append(resp.json().get("weight_version") if resp.status_code == 200 else None)
        return out

    async def sleep(self, level: int = 1) -> None:
        """Free the servers' GPU memory (`POST /sleep`; servers need --enable-sleep-mode and dev mode)."""
        for server in range(len(self.base_urls)):
            await self._retrying(self._post, server, "/sleep", None, {"level": level})

    async def wake_up(self) -> None:
        for server in range(len(self.base_urls)):
            await self._retrying(self._post, server, "/wake_up")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        for d in self._written:
            shutil.rmtree(d, ignore_errors=True)
        self._written.clear()


def build_remote_generator(path: str, base_urls: list[str] | str, model: str | None = None,
                           checkpoint_dir: str | None = None, **kw: Any) -> RemoteGenerator:
    """The `remote` generator engine: `path` is the policy (tokenizer), `model` the served name
    (default: `path`, as `vllm serve PATH` names it)."""
    return RemoteGenerator(base_urls, model or path, tokenizer_path=path, checkpoint_dir=checkpoint_dir, **kw)
