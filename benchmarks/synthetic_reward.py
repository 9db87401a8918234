"""The synthetic worlds' reward as a reward function (TRL's signature), for `--reward`.

`python -m dynalize.monitor LOGS --out DIR --reward synthetic_reward:reward` scores replies as the
world named by the environment variable `SYNTHETIC_WORLD` (`kind:seed:shape`) does: its
honest reward plus the planted shortcut's pay, with the world's noise drawn from a seed of the
prompt and the reply (the same reply is always scored the same). The benchmark sets the variable
for each run (synthetic_score.score_run).
"""

from __future__ import annotations

import functools
import os
import random

from synthetic_policy import Prompt, prompts
from synthetic_worlds import make_world

VARIABLE = "SYNTHETIC_WORLD"


@functools.cache
def _world(name: str):
    kind, seed, shape = name.split(":")
    return make_world(kind, int(seed), shape)


def reward(prompts: list[str], completions: list[str], **kwargs) -> list[float]:  # noqa: ARG001 - TRL's signature
    world = _world(os.environ[VARIABLE])
    known = _prompts()
    return [world.reward(c, known.get(p) or Prompt(p, "", ()), random.Random(f"{p}\0{c}"))
            for p, c in zip(prompts, completions)]


@functools.cache
def _prompts():
    return {p.text: p for p in prompts()}
