"""HFChatModel on a tiny local model (built into a temporary cache, no download)."""

from __future__ import annotations

import anyio
import pytest
import torch

from dynalize import tiny
from dynalize.build import build_chat_model
from dynalize.backends.hf_chat import HFChatModel
from dynalize.types import Message

MSGS = [Message("system", "You write stories."), Message("user", "Write about the sea.")]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DYNALIZE_CACHE", str(tmp_path_factory.mktemp("dynalize_cache")))
        yield HFChatModel(tiny.resolve("tiny:policy"), device="cpu")


def greedy_reference(model: HFChatModel, n: int) -> str:
    """Greedy decoding by hand: argmax of the logits, token by token."""
    tok = model.tokenizer
    text = tok.apply_chat_template([m.to_dict() for m in MSGS], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"].to(model.model.device)
    new = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model.model(ids).logits[0, -1].argmax())
            if nxt == tok.eos_token_id:
                break
            new.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]], device=ids.device)], dim=1)
    return tok.decode(new, skip_special_tokens=True)


def test_greedy_reply_is_deterministic_and_only_new_text(model):
    async def main():
        return [await model.chat(MSGS, temperature=0, max_tokens=12) for _ in range(2)]

    a, b = anyio.run(main)
    assert isinstance(a, str) and a == b
    assert a == greedy_reference(model, 12)
    assert "Write about the sea" not in a and "<|im_start|>" not in a


def test_seeded_sampling_reproducible_without_touching_global_rng(model):
    state = torch.get_rng_state()

    async def main():
        kw = dict(temperature=1.0, top_p=0.95, min_p=0.01, max_tokens=16)
        return (await model.chat(MSGS, seed=5, **kw), await model.chat(MSGS, seed=5, **kw),
                await model.chat(MSGS, seed=6, **kw))

    a, b, c = anyio.run(main)
    assert a == b and a != c
    assert torch.equal(torch.get_rng_state(), state)


def test_concurrent_calls_are_serialised(model):
    results = []

    async def one():
        results.append(await model.chat(MSGS, max_tokens=8))

    async def main():
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(one)

    anyio.run(main)
    assert len(results) == 4 and len(set(results)) == 1
    assert results[0] == greedy_reference(model, 8)


def test_unknown_sampling_key_raises(model):
    with pytest.raises(TypeError, match="unknown sampling key.*stop"):
        anyio.run(lambda: model.chat(MSGS, stop=["\n"]))
    assert model.supports_json_schema is False


def test_factory_builds_hf_with_default_sampling(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNALIZE_CACHE", str(tmp_path))
    m = build_chat_model({"engine": "hf", "path": "tiny:policy", "max_tokens": 3})
    assert isinstance(m, HFChatModel) and m.default_sampling == {"temperature": 0.0, "max_tokens": 3}
    out = anyio.run(m.chat, MSGS)
    assert out == greedy_reference(m, 3)
