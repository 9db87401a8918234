"""A tiny real TRL GRPOTrainer run with dynalize.trl.Penalties (tests/test_trl_penalties.py; run
as a script under `accelerate launch` by the two-process test).

The proposer is scripted (`ScriptedProposer`): proposal k proposes PATTERNS[k], so when each
penalty enters and whether it stays is decided by the completions the tiny random policy writes,
and not by whether a tiny run holds enough evidence for the lexical proposer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dynalize.penalties.candidate import Candidate, ProposalResult

PATTERNS = [r"[a-z]", r"\d", r"qqqzzzxxx", r"[A-Z]"]
"""What the scripted proposals propose, in turn (the third matches nothing: it retires)."""


class ScriptedProposer:
    """Proposal k (ProposerView.proposal, from 1; a checkpoint keeps the count) accepts
    PATTERNS[(k - 1) % len(PATTERNS)]."""

    async def propose(self, view):
        k = view.proposal
        pattern = PATTERNS[(k - 1) % len(PATTERNS)]
        return ProposalResult(step=view.step, accepted=Candidate(f"pattern {k - 1}", f"replies matching {pattern}",
                                                                 regex=pattern, groups=2), candidates=1)


def honest(completions, **kwargs):
    return [min(len(c[0]["content"]), 40) / 40 for c in completions]


def shortcut(completions, **kwargs):
    return [None if i % 5 == 4 else 0.5 * ("a" in c[0]["content"]) for i, c in enumerate(completions)]


def train(out: Path, *, steps: int = 4, save_steps: int = 0, resume: bool = False, observe_only: bool = False,
          on_hack: str = "continue", every: int = 2, sync: bool = True, seed: int = 0):
    """Train `steps` steps into `out` (TRL's output_dir); (trainer, penalties)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from dynalize import tiny
    from dynalize.trl import Penalties

    path = tiny.resolve("tiny:policy")
    rows = [{"prompt": [{"role": "user", "content": f"Write about topic {i}."}]} for i in range(64)]
    # confirm: False: the scripted proposals are what these tests follow (confirmation: tests/test_trl_confirm.py)
    penalties = Penalties([honest, shortcut], penalties={"every": every, "sync": sync, "confirm": False},
                          observe_only=observe_only, on_hack=on_hack, html=False)
    penalties.term.proposer = ScriptedProposer()
    args = GRPOConfig(output_dir=str(out), num_generations=4, per_device_train_batch_size=8, max_completion_length=12,
                      learning_rate=1e-3, max_steps=steps, logging_steps=1, report_to=[], use_cpu=True, seed=seed,
                      save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500, disable_tqdm=True,
                      shuffle_dataset=False, temperature=1.0, top_k=0, beta=0.0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=penalties.reward_funcs,
                          args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=AutoTokenizer.from_pretrained(path), callbacks=[penalties])
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    torch.manual_seed(seed)
    trainer.train(resume_from_checkpoint=resume or None)
    return trainer, penalties


if __name__ == "__main__":  # torchrun --nproc_per_node 2 tests/trl_tiny_run.py OUT: each rank writes what it returned
    from accelerate import PartialState

    out = Path(sys.argv[1])
    returned: list[list] = []
    trainer, penalties = None, None

    from dynalize.trl import callback as cb

    original = cb.Penalties.__call__

    def spy(self, **kwargs):
        got = original(self, **kwargs)
        returned.append(got)
        return got

    cb.Penalties.__call__ = spy
    trainer, penalties = train(out)
    rank = PartialState().process_index
    (out / f"rank{rank}.json").write_text(json.dumps({"returned": returned, "buffer": penalties.term.buffer.to_json(),
                                                      "status": penalties.status}))
