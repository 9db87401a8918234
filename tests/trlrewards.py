"""Reward functions written for TRL's GRPOTrainer, importable by path (`trlrewards:...`) for
tests/test_from_trl.py: they record what they were given, or fail in the ways a user's do."""

CALLS: list[dict] = []
"""Every call of `graded`: the keyword arguments it got."""


def graded(prompts, completions, answer, **kwargs):
    """1 when the reference answer's length matches the reply's word count, else 0 (a made-up rule:
    what counts is that `answer` arrives, one per completion)."""
    CALLS.append({"prompts": prompts, "completions": completions, "answer": answer, **kwargs})
    return [float(len(c[0]["content"].split()) % 2 == len(a) % 2) for c, a in zip(completions, answer)]


def every_other(completions, **kwargs):
    """A score for even positions, None (not applicable) for odd ones."""
    return [None if i % 2 else 2.0 for i in range(len(completions))]


def nan_reward(completions, **kwargs):
    return [float("nan")] * len(completions)


def short_reward(completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def raising_reward(completions, **kwargs):
    raise ValueError("the grader's database is down")


def rm_nan(replies):
    """A reward_model.engine=python function (dynalize's own convention) returning NaN."""
    return [float("nan")] * len(replies)


def rm_inf(replies):
    return [float("inf")] * len(replies)


def rm_short(replies):
    return [0.0] * (len(replies) - 1)


def exiting_reward(completions, **kwargs):
    raise SystemExit(0)
