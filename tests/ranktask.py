"""The toy task, recording which training process does the orchestrator's work: each call of its
reward model, its prompts and its held-out evaluation appends this process's RANK to `record`."""

import os

from toytask import ToyArgs, ToyTask, VowelRM


class RankArgs(ToyArgs):
    record: str = ""
    """A file each orchestrator call appends `<what> <RANK>` to."""


def note(path: str, what: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{what} {os.environ.get('RANK', 'none')}\n")


class RecordingRM(VowelRM):
    def __init__(self, record: str):
        super().__init__()
        self.record = record

    async def score(self, items):
        note(self.record, "score")
        return await super().score(items)


class RankTask(ToyTask):
    Args = RankArgs

    def prompts(self, split):
        note(self.args.record, "prompts")
        return super().prompts(split)

    def reward_model(self):
        return RecordingRM(self.args.record)

    async def evaluate(self, prompts, replies):
        note(self.args.record, "evaluate")
        return await super().evaluate(prompts, replies)
