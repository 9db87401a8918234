"""RubricWorldTask: "Write about <topic>." with a per-prompt weighted rubric, for CPU experiments.

Prompts are the sandbox's (the policy is the sandbox's pre-trained `tiny:sandbox-policy`); each
carries a rubric built from the world's templates for its topic (`lists`), each criterion's
`data` holding the gold check and the proxy's (flawed) one. Training prompts get the training
rubric; held-out prompts, on other topics, the evaluation rubric (out of distribution). The
judges are `judges.proxy_verdict` and `judges.gold_verdict`; the task itself reports only
lengths (the rubric term's evaluation does the proxy/gold measurement).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from ...rubrics.criteria import META_KEY, Criterion
from ...types import Message, Prompt
from ..base import Split, Task, TaskArgs
from ..sandbox.grammar import prompt_text
from ..sandbox.topics import Topic, split_topics
from ..text import length_metrics
from .checks import fill
from .lists import CriterionTemplate, Flaw, default_eval_rubric, default_flaws, default_rubric


class RubricWorldArgs(TaskArgs):
    """Settings of the rubric world (`task.args`)."""

    rubric: list[CriterionTemplate] = Field(default_factory=default_rubric)
    """The training rubric's templates (dynalize/tasks/rubric_world/lists.py)."""
    eval_rubric: list[CriterionTemplate] = Field(default_factory=default_eval_rubric)
    """The held-out rubric's templates (out of distribution)."""
    flaws: list[Flaw] = Field(default_factory=default_flaws)
    """The proxy judge's flaws: cues it checks instead of some criteria's substance."""
    n_train_topics: int = Field(100, gt=0)
    """Topics of the training prompts."""
    n_eval_topics: int = Field(30, gt=0)
    """Held-out topics, disjoint from the training ones."""
    topic_seed: int = 0
    """Seed of the shuffle that splits topics."""

    @model_validator(mode="after")
    def _flaws_name_criteria(self) -> "RubricWorldArgs":
        ids = {t.id for t in self.rubric} | {t.id for t in self.eval_rubric}
        unknown = [f.criterion for f in self.flaws if f.criterion not in ids]
        if unknown:
            raise ValueError(f"flaws name criteria no rubric has: {', '.join(unknown)}")
        for name, templates in (("rubric", self.rubric), ("eval_rubric", self.eval_rubric)):
            if not any(t.weight > 0 for t in templates):
                raise ValueError(f"{name} needs at least one positive-weight criterion")
            if len({t.id for t in templates}) != len(templates):
                raise ValueError(f"{name}: criterion ids repeat")
        return self


def _fill_check(spec: dict, topic: Topic) -> dict:
    """A check with its `words` filled in for `topic` (so a stored rubric reads without the templates)."""
    out = dict(spec)
    if "words" in out:
        out["words"] = [fill(str(w), topic) for w in out["words"]]
    if isinstance(out.get("of"), list):
        out["of"] = [_fill_check(s, topic) for s in out["of"]]
    elif isinstance(out.get("of"), dict):
        out["of"] = _fill_check(out["of"], topic)
    return out


def build_rubric(templates: list[CriterionTemplate], flaws: list[Flaw], topic: Topic) -> list[Criterion]:
    """The rubric of a prompt about `topic`."""
    proxy = {f.criterion: f.check for f in flaws}
    return [Criterion(t.id, fill(t.text, topic, name=True), t.weight, tuple(t.tags),
                      data={"topic": topic.name, "gold": _fill_check(t.gold, topic),
                            "proxy": _fill_check(proxy.get(t.id, t.gold), topic)})
            for t in templates]


class RubricWorldTask(Task):
    """Write a few sentences about a topic, graded by a rubric; a rubric-hacking world for CPU runs."""

    Args = RubricWorldArgs
    description = "Short writing: the user names a topic and the assistant writes a few sentences about it."

    def __init__(self, args: RubricWorldArgs, seed: int = 0):
        super().__init__(args, seed)
        self.args: RubricWorldArgs = args
        train, held_out = split_topics(args.n_train_topics, args.n_eval_topics, args.topic_seed)
        self._prompts = {"train": [self.prompt(t, args.rubric) for t in train],
                         "eval": [self.prompt(t, args.eval_rubric) for t in held_out]}

    def prompt(self, topic: Topic, templates: list[CriterionTemplate]) -> Prompt:
        rubric = build_rubric(templates, self.args.flaws, topic)
        return Prompt(id="world-" + topic.id.removeprefix("sandbox-"), messages=[Message("user", prompt_text(topic))],
                      meta={"topic": topic.name, META_KEY: [c.to_dict() for c in rubric]})

    def prompts(self, split: Split) -> list[Prompt]:
        return list(self._prompts[split])

    async def evaluate(self, prompts: list[Prompt], replies: list[str]) -> dict[str, float]:
        """Reply lengths; the rubric term adds the proxy/gold measurement (`eval/rubric/...`)."""
        return length_metrics(replies)
