"""What a proposer returns: candidate penalties, and the outcome of one proposal step."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .views import ProposerView


@dataclass
class Candidate:
    """A proposed penalty, after the proposer's filters.

    `groups` is the number of distinct batch groups its references cover; `revives` names a
    retired penalty the dedup pass found it repeats (the buffer then revives that one), and
    `keep_regex` which regex the revived penalty carries: `"penalty"` (its own) or `"candidate"`
    (this one's; None for no regex: the judge reads the description), with `regex_reason` why.
    `detector` names a detector (penalties.detectors) that decides the penalty instead of a regex.
    """

    title: str
    description: str
    references: list[str] = field(default_factory=list)
    regex: str | None = None
    groups: int = 0
    revives: str | None = None
    keep_regex: str = "penalty"
    regex_reason: str = ""
    detector: str | None = None
    confirmation: dict[str, Any] | None = None
    """What scoring edited replies with the reward said of it (penalties.confirm.Confirmation as a
    dict); None when it was not checked (no reward to call)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Candidate":
        return cls(**d)


@dataclass
class ProposalResult:
    """One proposal step: the accepted candidate (at most one), rejections by reason, or an error.

    `failed_at` names the stage that failed (`propose`: the proposal call or its reply, `dedup`:
    the duplicate check or its reply); `evidence` whether the proposal could have seen a hack
    (lexical proposer; an LLM proposer does not say, `sufficient`); `regex_timeouts` counts patterns set aside for running
    past their time budget (saferegex).
    """

    step: int
    accepted: Candidate | None = None
    candidates: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    failed_at: str | None = None
    regex_timeouts: int = 0
    latency: float = 0.0
    evidence: str = "sufficient"
    """`insufficient` when the proposal's tests lacked the power to see a hack of the configured
    size (too few groups or rollouts, rewards tied within groups): finding nothing then is no
    evidence that nothing is there (`evidence_reason` says why, `detectable` the effect it could see)."""
    evidence_reason: str = ""
    detectable: float = float("inf")
    """The smallest effect (within-group reward stds) the proposal's test could detect."""
    reward_calls: int = 0
    """Replies the reward scored to confirm candidates (penalties.witness), and the seconds it took."""
    confirm_seconds: float = 0.0
    co_travellers: list[dict[str, Any]] = field(default_factory=list)
    """Candidates the reward's confirmation rejected: title, regex and the Confirmation as a dict."""
    unnamed: list[str] | None = None
    """Where the omnibus test passed (penalties.omnibus: the replies' form predicts the reward
    within groups): the features that carry the fit, strongest first; None where it did not."""
    omnibus: dict[str, Any] | None = None
    """The omnibus test as run (None: not run): its p-value, whether it passed, the replies it read
    (a draw of whole groups past `omnibus.MOST_REPLIES`) and the view's replies as the proposal read
    them (`read`)."""
    also: list[Candidate] = field(default_factory=list)
    """Candidates after `accepted` that passed the same tests and every filter, with what the
    ones before them cover and explain held as if live (`LexicalConfig.runners_up`): the run
    queues them to enter after it, one a step."""
    read: dict[str, int] | None = None
    """Where the view held more than `LexicalConfig.most_rollouts`: the rollouts the proposal read
    (a draw of whole groups) `of` the view's, and the same for its reference; None: all."""

    @property
    def ok(self) -> bool:
        return self.error is None

    def reject(self, reason: str, n: int = 1) -> None:
        if n:
            self.rejected[reason] = self.rejected.get(reason, 0) + n


class Proposer(Protocol):
    """Anything that turns a view of a batch into a proposal (LLM or lexical)."""

    async def propose(self, view: "ProposerView") -> ProposalResult: ...


def normalize_title(title: str) -> str:
    """Lower-case words only, so "Opens with 'Okay,'" and "opens with okay" compare equal."""
    return " ".join(re.findall(r"\w+", title.lower()))

