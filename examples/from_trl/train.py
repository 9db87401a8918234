"""The TRL script's pieces (examples/from_trl/trl_script.py) trained with dynalize, unchanged:
its dataset, its reward functions (which read the dataset's `answer` column), their weights.

Run it from anywhere:  python examples/from_trl/train.py   (writes runs/from-trl/)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # trl_script, beside this file

import dynalize
from trl_script import dataset, reward_funcs, reward_weights

CONFIG = {
    "name": "from-trl",
    "steps": 3,
    "batch_size": 8,                          # TRL's per_device_train_batch_size: rollouts per step
    "group_size": 4,                          # TRL's num_generations
    "progress": False,
    "policy": {"path": "tiny:policy"},        # a tiny local model; a chat model directory for real runs
    "generator": {"max_new_tokens": 16},      # TRL's max_completion_length
    "trainer": {"lr": 1e-4, "loss": {"std_normalize": "group"}},  # TRL's learning_rate, scale_rewards="group"
    "task": {"name": "prompts", "args": {"train_file": dataset, "eval_fraction": 0}},
    "reward_model": {"enabled": False},       # the reward is the functions' alone, as in TRL
    "reward_funcs": reward_funcs,
    "reward_weights": reward_weights,
}

if __name__ == "__main__":
    result = dynalize.train(CONFIG)
    m = result.metrics
    print(f"run: {result.run_dir}, {m['step']} steps, reward {m['reward/mean']:.3f}, "
          f"format {m['rewards/format_reward/mean']:.3f}")
    print(dynalize.export(result.run_dir, result.run_dir.parent / "from-trl-policy", overwrite=True))
