"""Judges that ask a benchmark's own way (`rubric.*_judge.protocol`): the base they share.

`batched` is the criteria judge itself (one call per reply, every criterion in it, our prompt);
`healthbench` (one call per criterion, healthbench.HealthBenchJudge) and `researchqa` (criteria
in batches of 8 on a five-level scale, researchqa.ResearchQAJudge) replace only how one reply is
asked (`_call`): the cache, the time budget, the failure window and the counters stay the
Judge's, and a criterion the protocol could not decide is failed, never "unmet".
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Literal

from .judge import RUBRIC_PROMPT, Judge
from .levels import Verdict
from .verdicts import Judgement


Protocol = Literal["batched", "healthbench", "researchqa"]
"""The protocols a rubric judge can run (`RubricJudgeConfig.protocol`; dynalize.build picks the class)."""


class ProtocolJudge(Judge):
    """A criteria judge whose calls follow a benchmark protocol; `attempts` bounds its re-asks."""

    default_attempts = 3

    def __init__(self, *args: Any, attempts: int | None = None, **kwargs: Any):
        kwargs.setdefault("prompt", RUBRIC_PROMPT)
        super().__init__(*args, **kwargs)
        self.attempts = attempts or self.default_attempts
        """Grader calls per item (healthbench) or batch (researchqa) before it fails."""
        if self.cfg.reasks:  # the protocol's own re-asks (`attempts`) are the only ones, as officially
            self.cfg = self.cfg.model_copy(update={"reasks": 0})

    def _settle(self, key: tuple[str, str | None, Hashable], ids: list[str],
                answers: list[tuple[Verdict | None, str | None]]) -> Judgement:
        """One text's Judgement from each id's (verdict or None, error); cached when whole."""
        verdicts: dict[str, Verdict] = {i: (False if v is None else v) for i, (v, _) in zip(ids, answers)}
        failed = {i for i, (v, _) in zip(ids, answers) if v is None}  # counted by the caller (`failures`)
        if failed:
            self.last_error = next((e for v, e in answers if v is None and e), None) or "no verdict"
        elif self.cfg.cache_size:
            self._cache[key] = dict(verdicts)  # type: ignore[assignment]
            while len(self._cache) > self.cfg.cache_size:
                self._cache.popitem(last=False)
        return Judgement(verdicts, failed)
