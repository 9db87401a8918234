"""Train from Python: the data a list of dicts, the reward a function, the settings a dict.

Run it from anywhere:  python examples/python_api/train.py   (writes runs/python-api/)
"""

import dynalize

# The built-in creative_writing task reads rows with a "prompt" field: from a file, a Hub id
# ("hub:ORG/NAME:train"), a datasets.Dataset, or, as here, a list of dicts.
ROWS = [{"prompt": f"A short scene about {topic}."} for topic in
        ["the sea", "a lighthouse", "a lost key", "the last train", "a garden at night", "an old map",
         "a storm", "a letter", "the moon", "a market"]]


def concise(replies: list[str]) -> list[float]:
    """The reward: one score per reply, here higher for replies of about twelve words."""
    return [1.0 - min(abs(len(r.split()) - 12), 12) / 12 for r in replies]


CONFIG = {
    "name": "python-api",
    "steps": 3,
    "batch_size": 8,
    "group_size": 4,
    "progress": False,
    "policy": {"path": "tiny:policy"},  # a tiny local model; a chat model directory for real runs
    "generator": {"max_new_tokens": 16},
    "task": {"name": "creative_writing", "args": {"train_file": ROWS, "eval_fraction": 0.2}},
    "reward_model": {"engine": "python", "path": concise},
}

if __name__ == "__main__":
    result = dynalize.train(CONFIG, **{"trainer.lr": 1e-4})
    print(f"run: {result.run_dir}, {result.metrics['step']} steps, reward {result.metrics['reward/mean']:.3f}")
    # `concise` and ROWS live in this script, so only Python can continue the run: give the same
    # objects again with resume= (python -m dynalize.run --resume refuses, naming the setting).
    more = dynalize.train(CONFIG, resume=result.run_dir, steps=5, **{"trainer.lr": 1e-4})
    for metric, first, last in more.summary:
        print(f"{metric:<40} {first:>8} {last:>10}")
