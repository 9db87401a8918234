"""The rubric world: rubric hacking and Rubric Dropout on a CPU in minutes.

The sandbox's prompts and pre-trained policy ("Write about <topic>.", `tiny:sandbox-policy`),
each prompt with a weighted rubric (`lists`: templates filled for its topic), a gold judge that
checks each criterion's substance and a proxy judge that some criteria fool with cheap cues
(`judges`, `checks`). Only this package knows the rubric and flaw lists.
"""

from .judges import gold_verdict, proxy_verdict
from .lists import LISTS, CriterionTemplate, Flaw
from .task import RubricWorldArgs, RubricWorldTask, build_rubric

__all__ = ["LISTS", "CriterionTemplate", "Flaw", "RubricWorldArgs", "RubricWorldTask", "build_rubric",
           "gold_verdict", "proxy_verdict"]
