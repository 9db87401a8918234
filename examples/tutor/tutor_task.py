"""Tutor: a multi-turn domain for dynalize, written outside the package (see docs/add_a_domain.md)."""

import statistics

from pydantic import Field

from dynalize.tasks.base import Split, Task, TaskArgs
from dynalize.types import Message, Prompt

STUDENTS = [  # one persona per conversation: it travels in the prompt's `meta`
    {"name": "Ana", "question": "Why is it hot in summer?", "belief": "the Earth is closer to the Sun then",
     "doubt": "But a fire feels hotter when I stand closer to it.", "key": "tilt"},
    {"name": "Ben", "question": "Why does ice float?", "belief": "ice is full of tiny air bubbles",
     "doubt": "But the ice cubes I make look solid all the way through.", "key": "dense"},
    {"name": "Chen", "question": "Why is the sky blue?", "belief": "it reflects the colour of the sea",
     "doubt": "But the sky is blue in the desert too.", "key": "scatter"},
    {"name": "Dara", "question": "Where does a tree's wood come from?", "belief": "the tree takes it out of the soil",
     "doubt": "But what else could it be made of?", "key": "air"},
    {"name": "Eli", "question": "Why do the phases of the Moon change?", "belief": "the Earth's shadow covers part of it",
     "doubt": "But then what is the shadow in an eclipse?", "key": "angle"},
    {"name": "Fay", "question": "Do heavy things fall faster?", "belief": "a brick falls faster than a pebble",
     "doubt": "But a feather falls slowly.", "key": "same"},
]


class TutorArgs(TaskArgs):
    """Settings of the tutor task: the `task.args` block of the YAML."""

    max_turns: int = Field(3, ge=1)
    """Tutor replies per conversation at most (a student who comes round ends it sooner)."""
    n_eval: int = Field(2, ge=1)
    """How many students to hold out for evaluation."""


class TutorTask(Task):
    """Tutor a student out of a misconception, over several turns."""

    Args = TutorArgs
    description = "Tutoring: a student shares a belief about a science question and the assistant helps them understand."

    def __init__(self, args: TutorArgs, seed: int = 0):
        super().__init__(args, seed)
        self.max_turns = args.max_turns

    def prompts(self, split: Split) -> list[Prompt]:
        cut = len(STUDENTS) - self.args.n_eval
        students = STUDENTS[:cut] if split == "train" else STUDENTS[cut:]
        return [Prompt(f"tutor-{s['name']}", [Message("user", f"Hi, I'm {s['name']}. {s['question']} "
                                                                  f"I think {s['belief']}.")], meta=s)
                for s in students]

    async def user_reply(self, conversation: list[Message], prompt: Prompt) -> str | None:
        """The student of this conversation (its prompt's meta): won over once the tutor's latest
        reply uses the key idea, which ends the conversation; otherwise still in doubt."""
        student = prompt.meta
        if student["key"] in conversation[-1].content.lower():
            return None
        return f"Sorry, I still don't get it. {student['doubt']}"

    async def evaluate(self, prompts: list[Prompt], replies: list[str],
                       conversations: list[list[Message]]) -> dict[str, float]:
        """Over whole conversations: the share of students won over, and the tutor replies it took."""
        won = [came_round(c, p.meta["key"]) for p, c in zip(prompts, conversations)]
        used = [sum(m.role == "assistant" for m in c) for c in conversations]
        return {"convinced": statistics.fmean(won), "tutor_replies": statistics.fmean(used)}


def came_round(conversation: list[Message], key: str) -> bool:
    """Whether a tutor reply in the conversation used the key idea."""
    return any(key in m.content.lower() for m in conversation if m.role == "assistant")
