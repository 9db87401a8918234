"""Rollout mechanics: single- and multi-turn token sequences, loss masks, RM inputs."""

import anyio
import pytest
import torch

from dynalize.backends.base import SamplingParams
from dynalize.backends.hf import HFGenerator, load_tokenizer
from dynalize import tiny
from dynalize.rewards.rm import rm_inputs
from dynalize.rollouts import between_turns_ids, prompt_token_ids, sample_groups
from dynalize.tasks.base import Task, TaskArgs
from dynalize.types import Message, Prompt


class ChatTask(Task):
    """Multi-turn: the user answers twice, then (for odd prompts) ends after the first reply."""

    max_turns = 3

    def prompts(self, split):
        return [Prompt(f"p{i}", [Message("system", "Be kind."), Message("user", f"Hello {i}")]) for i in range(2)]

    async def user_reply(self, conversation):
        replies = sum(m.role == "assistant" for m in conversation)
        if conversation[1].content.endswith("1"):
            return None
        return f"user turn {replies}"


@pytest.fixture(scope="module")
def generator():
    return HFGenerator(tiny.resolve("tiny:policy"))


def _turn_spans(mask):
    spans, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def test_multi_turn_mask_covers_exactly_the_policy_replies(generator):
    task = ChatTask(TaskArgs())
    tok = generator.tokenizer
    groups = anyio.run(sample_groups, generator, tok, task, task.prompts("train"), 2,
                       SamplingParams(max_new_tokens=12, seed=3))
    long, short = groups[0][0], groups[1][0]
    assert len(long.replies) == 3 and len(short.replies) == 1
    assert [m.role for m in long.turns] == ["assistant", "user", "assistant", "user", "assistant"]
    spans = _turn_spans(long.loss_mask)
    assert len(spans) == 3
    for (a, b), reply in zip(spans, long.replies):
        assert tok.decode(long.completion_ids[a:b], skip_special_tokens=True) == reply
    # every non-policy token has logprob 0; the user's words sit in unmasked tokens only
    assert all(lp == 0.0 for lp, m in zip(long.logprobs, long.loss_mask) if not m)
    between = tok.decode([t for t, m in zip(long.completion_ids, long.loss_mask) if not m])
    assert "user turn 1" in between and "user turn 2" in between
    # the whole sequence is what the chat template renders for the conversation (no shift)
    full = tok.decode(long.prompt_ids + long.completion_ids)
    rendered = tok.apply_chat_template([m.to_dict() for m in long.messages + long.turns], tokenize=False)
    if not long.truncated:
        assert rendered.startswith(full)
    assert len(long.logprobs) == len(long.completion_ids) == len(long.loss_mask)


def test_rm_inputs_give_each_reply_its_conversation_so_far(generator):
    task = ChatTask(TaskArgs())
    groups = anyio.run(sample_groups, generator, generator.tokenizer, task, task.prompts("train")[:1], 2,
                       SamplingParams(max_new_tokens=6, seed=1))
    r = groups[0][0]
    inputs = rm_inputs(task, r)
    assert len(inputs) == 3
    assert [len(x) for x in inputs] == [3, 5, 7]  # system, user, reply; + user, reply; ...
    assert inputs[1][-1].content == r.replies[1] and inputs[1][-2].content == "user turn 1"


def test_single_turn_prompt_ids_follow_the_template(generator):
    tok = generator.tokenizer
    ids = prompt_token_ids(tok, [Message("user", "Write about the sea.")])
    assert tok.decode(ids) == "<|im_start|>user\nWrite about the sea.<|im_end|>\n<|im_start|>assistant\n"


def test_between_turn_ids_follow_a_template_that_is_not_prefix_stable(qwen3_style_policy):
    tok = load_tokenizer(qwen3_style_policy)
    conversation = [Message("system", "Be kind."), Message("user", "Hello")]
    # the template renders the last assistant turn with an empty think block, earlier ones without
    alone = tok.apply_chat_template([*map(Message.to_dict, conversation), {"role": "assistant", "content": "R"}],
                                    tokenize=False)
    assert alone.endswith("<think>\n\n</think>\n\nR<|im_end|>\n")
    ids = between_turns_ids(tok, conversation, "And then?", "<|im_end|>")
    assert tok.decode(ids) == "\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n"
    truncated = between_turns_ids(tok, conversation, "And then?", None)  # the reply ran out of tokens
    assert tok.decode(truncated) == "<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n"


def test_multi_turn_rollout_on_a_qwen3_style_template(generator, qwen3_style_policy):
    tok = load_tokenizer(qwen3_style_policy)
    task = ChatTask(TaskArgs())
    [[r, _]] = anyio.run(sample_groups, generator, tok, task, task.prompts("train")[:1], 2,
                         SamplingParams(max_new_tokens=8, seed=5))
    assert len(r.replies) == 3
    spans = _turn_spans(r.loss_mask)
    for (_, end), (start, _), user in zip(spans, spans[1:], ["user turn 1", "user turn 2"]):
        between = tok.decode(r.completion_ids[end:start])
        assert between.endswith(f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


class ContextBlindTask(ChatTask):
    """Two turns, the user never ends the conversation early."""

    max_turns = 2

    async def user_reply(self, conversation):
        return "go on"


def test_turns_of_a_conversation_do_not_share_their_random_stream():
    """With all weights zero the policy's next-token distribution is uniform whatever the context,
    so a reply is nothing but its random numbers: turns drawing the same numbers would be equal."""
    gen = HFGenerator(tiny.resolve("tiny:policy"))
    anyio.run(gen.update_weights, {k: torch.zeros_like(v) for k, v in gen.model.state_dict().items()}, 1)
    task = ContextBlindTask(TaskArgs())
    groups = anyio.run(sample_groups, gen, gen.tokenizer, task, task.prompts("train"), 2,
                       SamplingParams(max_new_tokens=6, seed=11))
    rollouts = [r for g in groups for r in g]
    assert all(len(r.replies) == 2 for r in rollouts)
    spans = [_turn_spans(r.loss_mask) for r in rollouts]
    turn_ids = [[r.completion_ids[a:b] for a, b in s] for r, s in zip(rollouts, spans)]
    assert all(first != second for first, second in turn_ids)
    assert len({tuple(t[0]) for t in turn_ids}) == len(rollouts)  # and the requests of a turn differ
    again = anyio.run(sample_groups, gen, gen.tokenizer, task, task.prompts("train"), 2,
                      SamplingParams(max_new_tokens=6, seed=11))
    assert [r.completion_ids for g in again for r in g] == [r.completion_ids for r in rollouts]  # still exact


def test_a_models_generation_config_does_not_reshape_sampling(tmp_path):
    """A shipped generation_config.json (here a strong repetition penalty, top-k and no repeated
    bigrams) must not change what is sampled: the generator reports logprobs of softmax(logits / T),
    so it must sample from exactly that."""
    import shutil

    from transformers import GenerationConfig

    plain = tiny.resolve("tiny:policy")
    shipped = tmp_path / "policy"
    shutil.copytree(plain, shipped)
    eos = GenerationConfig.from_pretrained(plain).eos_token_id
    GenerationConfig(repetition_penalty=1.3, top_k=20, top_p=0.8, temperature=0.7, no_repeat_ngram_size=2,
                     do_sample=True, eos_token_id=eos).save_pretrained(shipped)
    prompts = [[5, 6, 7, 8], [40, 41], [100, 7, 300, 12, 9]] * 3
    sampling = SamplingParams(max_new_tokens=24, seed=4)
    a = anyio.run(HFGenerator(plain).generate, prompts, sampling)
    b = anyio.run(HFGenerator(str(shipped)).generate, prompts, sampling)
    assert [c.token_ids for c in b] == [c.token_ids for c in a]
    assert [c.logprobs for c in b] == [c.logprobs for c in a]


def test_rollouts_carry_their_prompts_meta(generator):
    tok = generator.tokenizer
    prompt = Prompt("m0", [Message("user", "Hi")], meta={"answer": 42})
    [[a, b]] = anyio.run(sample_groups, generator, tok, ChatTask(TaskArgs()), [prompt], 2,
                         SamplingParams(max_new_tokens=4, seed=1))
    assert a.meta == b.meta == {"answer": 42}
