"""The discovery benchmark's corpus: real training runs, one planted shortcut each (or none).

Each run is trained from the tiny pre-trained sandbox policy (`tiny:sandbox-policy`, built locally
and cached; nothing is downloaded) on the sandbox's prompts ("Write about <topic>."), with the
reward of benchmarks/discovery_worlds.py, by one of two frameworks:

- `trl`: TRL's `GRPOTrainer`, two reward functions (honest, shortcut), `log_completions=True`,
  `logging_steps` = the shape's `log_every`: the logs are `RUN/trl/completions/*.parquet`;
- `dynalize`: `dynalize.train` with a Python reward, Dynalize's penalties on with their defaults
  (the in-run proposer): `RUN/dynalize/<run>/` with rollouts/ and penalties.jsonl; a multi-turn
  shape uses the multi-turn sandbox task (`tiny:sandbox-policy-multiturn`).

`RUN/meta.json` records the spec, the logs' path and the seconds the run took; it is written
last, so a run without it is unfinished (generation redoes it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from discovery_worlds import RunSpec, reward  # noqa: E402

META = "meta.json"


def topic_words(name: str) -> frozenset[str]:
    from dynalize.tasks.sandbox.topics import find_topic

    t = find_topic(name)
    return t.words if t else frozenset()


def _train_topics(seed: int) -> list[Any]:
    from dynalize.tasks.sandbox.topics import split_topics

    train, _ = split_topics(100, 30, 0)
    topics = list(train)
    random.Random(seed).shuffle(topics)
    return topics


def train_trl(spec: RunSpec, out: Path) -> Path:
    """A GRPOTrainer run on CPU; returns the folder holding its `completions/`."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOTrainer

    import dynalize.build  # noqa: F401  (registers the tasks' tiny models)
    from dynalize import tiny
    from dynalize.tasks.sandbox.grammar import prompt_text

    s = spec.shape
    path = tiny.resolve("tiny:sandbox-policy")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    topics = _train_topics(spec.seed)
    rows = [{"prompt": [{"role": "user", "content": prompt_text(t)}], "topic": t.name}
            for t in (topics[i % len(topics)] for i in range(s.prompts * (s.steps + 2)))]

    def honest(prompts, completions, topic, **kw):
        return [reward(c[-1]["content"], topic_words(tp), None) for c, tp in zip(completions, topic)]

    def shortcut(prompts, completions, **kw):
        return [spec.shortcut.bonus(c[-1]["content"]) for c in completions]

    work = out / "trl"
    args = trl_config(spec, work)
    funcs = [honest] + ([shortcut] if spec.shortcut else [])
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    torch.manual_seed(spec.seed)
    trainer.train()
    save_trl_args(args, work)
    trainer.save_state()  # trainer_state.json: the log history names the reward functions
    return work


def trl_config(spec: RunSpec, work: Path) -> Any:
    """The run's GRPOConfig: the shape's batch (one generation per step), lr and logging cadence."""
    from trl import GRPOConfig

    s = spec.shape
    n = s.prompts * s.group
    micro = min(16, n)
    return GRPOConfig(
        output_dir=str(work), per_device_train_batch_size=micro, gradient_accumulation_steps=n // micro,
        num_generations=s.group, max_completion_length=64, temperature=1.0, top_p=1.0, top_k=0, beta=0.0,
        learning_rate=s.lr, lr_scheduler_type="constant", warmup_steps=0, max_steps=s.steps,
        logging_steps=s.log_every, log_completions=True, num_completions_to_print=1, report_to=[],
        save_strategy="no", use_cpu=True, bf16=False, fp16=False, disable_tqdm=True, seed=spec.seed,
        shuffle_dataset=False, dataloader_num_workers=0,
        reward_weights=[1.0] * (2 if spec.shortcut else 1),  # stated (the default, all 1), so the saved args say
    )


def save_trl_args(args: Any, work: Path) -> None:
    """`training_args.bin` beside completions/, as the Trainer saves it with a model: what the
    monitor reads the reward functions (and their weights) from."""
    import torch

    torch.save(args, work / "training_args.bin")


def train_dynalize(spec: RunSpec, out: Path) -> Path:
    """A dynalize run with Dynalize's penalties at their defaults; returns its run folder."""
    import dynalize

    s = spec.shape

    def rm(replies: list[str], prompts=None) -> list[float]:
        out = []
        for text, p in zip(replies, prompts or [None] * len(replies)):
            names = (p.meta.get("topics") or [p.meta.get("topic")]) if p is not None else []
            tw = frozenset().union(*(topic_words(n) for n in names if n))
            out.append(reward(text, tw, spec.shortcut))
        return out

    multi = s.turns > 1
    cfg: dict[str, Any] = {
        "name": spec.name, "output_dir": str(out / "dynalize"), "seed": spec.seed, "steps": s.steps,
        "batch_size": s.prompts * s.group, "group_size": s.group, "eval_every": 0, "checkpoint_every": 0,
        "torch_threads": 1, "progress": False, "export_final": False,
        "policy": {"path": "tiny:sandbox-policy-multiturn" if multi else "tiny:sandbox-policy"},
        "generator": {"max_new_tokens": 64}, "trainer": {"lr": s.lr},
        "task": {"name": "sandbox_multiturn" if multi else "sandbox",
                 "args": {"max_turns": s.turns} if multi else {}},
        "reward_model": {"engine": "python", "path": rm},
        "penalties": {"enabled": True},
    }
    return dynalize.train(cfg).run_dir


def generate(spec: RunSpec, root: Path) -> dict[str, Any]:
    """Train `spec` into `root/<name>/` (remade from scratch) and write its meta.json."""
    out = root / spec.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    logs = (train_trl if spec.shape.framework == "trl" else train_dynalize)(spec, out)
    meta = spec.to_dict() | {"logs": str(Path(logs).resolve().relative_to(out.resolve())),
                             "seconds": round(time.perf_counter() - t0, 1)}
    (out / META).write_text(json.dumps(meta, indent=1))
    return meta


def finished(root: Path) -> list[dict[str, Any]]:
    """meta.json of every finished run under `root`, by name."""
    return sorted((json.loads(p.read_text()) for p in root.glob(f"*/{META}")), key=lambda m: m["name"])


def main() -> None:
    """`python discovery_runs.py SPEC_JSON ROOT`: train one run (a subprocess of discovery.py)."""
    ap = argparse.ArgumentParser(description="Train one run of the discovery corpus (benchmarks/discovery.py "
                                             "starts it, one process a run).")
    ap.add_argument("spec", help="the run's RunSpec, as JSON")
    ap.add_argument("root", type=Path, help="the corpus folder the run is written into")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    spec = RunSpec.from_dict(json.loads(args.spec))
    meta = generate(spec, args.root)
    print(json.dumps({"name": meta["name"], "seconds": meta["seconds"]}))


if __name__ == "__main__":
    main()
