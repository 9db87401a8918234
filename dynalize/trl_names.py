"""TRL's `GRPOConfig` names, and what each is in dynalize: an unknown config key that is one of
them gets "TRL's X is dynalize's Y" instead of a spelling guess (docs/from_trl.md has the table).

Each entry: TRL's name → (dynalize's setting, or None where there is no equivalent; a note).
"""

from __future__ import annotations

TRL_NAMES: dict[str, tuple[str | None, str]] = {
    # the batch and the group
    "num_generations": ("group_size", "samples per prompt, G"),
    "per_device_train_batch_size": ("batch_size", "rollouts per step, all of them (prompts per step x group_size)"),
    "gradient_accumulation_steps": ("trainer.micro_batch_size", "every step trains on the whole batch; "
                                    "micro_batch_size (or micro_batch_tokens) sets how much goes through at once"),
    "generation_batch_size": ("batch_size", "each step generates one batch and trains on it"),
    "steps_per_generation": ("async_level", "generation runs async_level batches ahead of training"),
    "max_steps": ("steps", "training steps"),
    "num_train_epochs": ("steps", "dynalize counts steps, not epochs (prompts cycle in a seeded order)"),
    "seed": ("seed", "a top-level setting"),
    # optimisation
    "learning_rate": ("trainer.lr", "AdamW learning rate"),
    "weight_decay": ("trainer.weight_decay", "dynalize's default is 0.01, TRL's 0.0"),
    "adam_beta1": ("trainer.betas", "a pair: [beta1, beta2]"),
    "adam_beta2": ("trainer.betas", "a pair: [beta1, beta2]"),
    "max_grad_norm": ("trainer.max_grad_norm", "global gradient-norm clip"),
    "warmup_steps": ("trainer.warmup_steps", "linear warmup, in optimizer steps"),
    "warmup_ratio": ("trainer.warmup_steps", "a count of steps, not a share of the run"),
    "lr_scheduler_type": (None, "the learning rate is constant after warmup (TRL's default decays it linearly)"),
    "disable_dropout": ("trainer.disable_dropout", "dynalize's default is true, TRL 1.16's false"),
    "optim": (None, "the optimizer is AdamW"),
    # the loss
    "loss_type": ("trainer.loss.name", "'prime' (default) or 'ppo_clip', or a 'module:function' of one's own"),
    "epsilon": ("trainer.loss.clip_eps", "with trainer.loss.name: ppo_clip"),
    "epsilon_high": (None, "ppo_clip clips symmetrically (trainer.loss.clip_eps); a loss of one's own can do more"),
    "beta": ("trainer.kl.beta", "weight of the KL to the reference policy (0 = off, as in TRL)"),
    "scale_rewards": ("trainer.loss.std_normalize", "'group' = true or group, 'batch' = batch, 'none'/false = false "
                      "(dynalize's default)"),
    "num_iterations": (None, "each batch gets one optimizer step"),
    "importance_sampling_level": (None, "ratios are per token"),
    "mask_truncated_completions": (None, "truncated replies train as they are; truncated_frac is logged"),
    "reward_weights": ("reward_weights", "a top-level setting, one weight per reward_funcs entry"),
    "multi_objective_aggregation": (None, "the weighted reward functions are summed, then centred per group "
                                    "(TRL's sum_then_normalize)"),
    "sync_ref_model": (None, "the reference stays the initial policy (or trainer.kl.reference)"),
    # generation
    "max_completion_length": ("generator.max_new_tokens", "longest reply, in tokens"),
    "max_prompt_length": ("generator.max_model_len", "vllm: prompt + reply; prompts are not truncated"),
    "temperature": ("generator.temperature", "sampling temperature"),
    "top_p": ("generator.top_p", "nucleus sampling"),
    "min_p": ("generator.min_p", "min-p sampling"),
    "top_k": (None, "sampling takes temperature, top_p and min_p"),
    "repetition_penalty": (None, "sampling takes temperature, top_p and min_p"),
    "generation_kwargs": (None, "sampling takes temperature, top_p and min_p"),
    "use_vllm": ("generator.engine", "'vllm' (in-process) or 'remote' (vLLM servers)"),
    "vllm_mode": ("generator.engine", "colocate = 'vllm', server = 'remote'"),
    "vllm_server_base_url": ("generator.base_urls", "a list of server roots"),
    "vllm_gpu_memory_utilization": ("generator.gpu_memory_utilization", "vllm's share of GPU memory"),
    # the model
    "model_init_kwargs": ("policy.dtype", "the policy is loaded from policy.path in policy.dtype"),
    "torch_dtype": ("policy.dtype", "float32, bfloat16 or float16"),
    "dtype": ("policy.dtype", "float32, bfloat16 or float16"),
    "bf16": ("policy.dtype", "bfloat16; trainer.master_weights sets the optimizer's copy"),
    "gradient_checkpointing": (None, "not used; trainer.micro_batch_tokens bounds memory per pass"),
    "use_peft": ("policy.lora", "LoRA adapters: policy.lora: {r: 16, alpha: 32}"),
    "peft_config": ("policy.lora", "LoRA adapters: policy.lora: {r: 16, alpha: 32}"),
    # logging and saving
    "output_dir": ("output_dir", "runs go to <output_dir>/<name>/"),
    "run_name": ("name", "the run's folder name"),
    "logging_steps": (None, "every step is logged to metrics.jsonl (and to report_to)"),
    "report_to": ("report_to", "a top-level list: tensorboard, wandb, trackio, mlflow"),
    "log_completions": ("report_to", "every step's rollouts are in rollouts/; trackers get a sample table"),
    "save_steps": ("checkpoint_every", "a resumable checkpoint every N steps"),
    "save_strategy": ("checkpoint_every", "a resumable checkpoint every N steps"),
    "save_total_limit": (None, "checkpoints are kept"),
    "eval_steps": ("eval_every", "held-out evaluation every N steps"),
    "eval_strategy": ("eval_every", "held-out evaluation every N steps"),
    "per_device_eval_batch_size": ("eval_samples", "replies per held-out prompt"),
    "num_generations_eval": ("eval_samples", "replies per held-out prompt"),
    "resume_from_checkpoint": (None, "continue a run with --resume RUN_DIR (dynalize.train(..., resume=RUN_DIR))"),
    "push_to_hub": (None, "export with python -m dynalize.export (dynalize.export), then push the folder"),
    "shuffle_dataset": (None, "prompts are always drawn in a seeded order"),
    "remove_unused_columns": (None, "every column of a row reaches the reward functions"),
}


def trl_hint(key: str) -> str | None:
    """What TRL's setting `key` is in dynalize ("TRL's X is dynalize's Y (note)"), or None for
    a name that is not TRL's."""
    if key not in TRL_NAMES:
        return None
    ours, note = TRL_NAMES[key]
    if ours is None:
        return f"TRL's {key} has no dynalize equivalent: {note} (docs/from_trl.md)"
    return f"TRL's {key} is dynalize's {ours} ({note}; docs/from_trl.md)"
