"""Dynalize inside TRL's `GRPOTrainer`: evolving penalties as a reward function and a callback,
or the monitor live in the training loop (docs/from_trl.md "Penalties in a TRL run").

```python
from dynalize.trl import Penalties

penalties = Penalties(reward_funcs)                # wraps the script's reward functions
trainer = GRPOTrainer(..., reward_funcs=penalties.reward_funcs, callbacks=[penalties])
```
"""

from __future__ import annotations

from ..extras import installed, missing

if not installed("trl"):  # one line, the extras' wording, not a traceback into TRL's absence
    raise ImportError(str(missing("trl", "dynalize.trl", extra="trl"))) from None

from .callback import HackDetected, Penalties, PenaltiesError, PenaltiesFailed

__all__ = ["HackDetected", "Penalties", "PenaltiesError", "PenaltiesFailed"]
