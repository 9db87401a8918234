"""A TRL GRPO script as one writes it for TRL: a conversational dataset with a reference answer,
two reward functions that read it, and their weights. examples/from_trl/train.py trains these
same pieces with dynalize, unchanged.

With TRL installed, `python examples/from_trl/trl_script.py` trains them with TRL's GRPOTrainer
(on the model it names; dynalize's example uses a tiny local one).
"""

import re

from datasets import Dataset

# The dataset: conversational prompts and a column the rewards grade against ("answer").
QUESTIONS = [("What is 2 + 3?", "5"), ("What is 7 - 4?", "3"), ("What is 3 * 3?", "9"), ("What is 8 / 2?", "4"),
             ("What is 6 + 6?", "12"), ("What is 9 - 1?", "8"), ("What is 5 * 2?", "10"), ("What is 1 + 1?", "2"),
             ("What is 4 + 3?", "7"), ("What is 10 - 4?", "6")]
dataset = Dataset.from_list([
    {"prompt": [{"role": "system", "content": "Answer with <answer>NUMBER</answer>."},
                {"role": "user", "content": q}],
     "answer": a}
    for q, a in QUESTIONS])


def accuracy_reward(completions, answer, **kwargs):
    """1 when the reply's <answer> is the reference answer, 0 otherwise; None when it gives no <answer>
    (not applicable: the format reward covers it)."""
    rewards = []
    for completion, ref in zip(completions, answer):
        found = re.search(r"<answer>(.*?)</answer>", completion[0]["content"])
        rewards.append(None if found is None else float(found.group(1).strip() == ref))
    return rewards


def format_reward(completions, **kwargs):
    """1 for a reply of the form <answer>...</answer>, 0 otherwise."""
    return [1.0 if re.fullmatch(r"\s*<answer>.*?</answer>\s*", c[0]["content"], re.S) else 0.0 for c in completions]


reward_funcs = [accuracy_reward, format_reward]
reward_weights = [1.0, 0.5]

if __name__ == "__main__":
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir="runs/trl-grpo", num_generations=4, per_device_train_batch_size=8,
                      max_completion_length=32, learning_rate=1e-5, max_steps=3, reward_weights=reward_weights)
    GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=reward_funcs, args=args,
                train_dataset=dataset).train()
