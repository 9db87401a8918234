"""The proposer's view of a batch: a seeded sample of rollouts, each with its score before
penalties (the RM score in an RM-only run) and the sign of that score's advantage, plus the
current penalties.

By default 2 rollouts from each of 16 groups (32 in all), drawn with an RNG seeded from
(seed, step) so a run is reproducible. Each sample gets a short id (`s07`) the proposer cites.
`pool_views` joins the views of several recent batches into one (a statistical proposer needs
more replies than one batch gives), and a view may carry a `reference`: a sample of the first
batch of the run, i.e. of what the policy wrote before training, for proposers that ask whether
a pattern is growing. Each sample keeps the conversation each of its replies answers, as the
judge reads it (`contexts`), for detectors that compare a reply with its prompt.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field, replace

from ..judge.prompting import transcript
from ..types import Batch, Penalty, Rollout


@dataclass
class ViewSample:
    """One rollout as the proposer sees it. `group` is its group's index in the batch."""

    id: str
    group: int
    text: str
    score: float
    """The reward before penalties (the RM score when the RM is the only other term)."""
    sign: str
    """"+", "-" or "0": the sign of that score's advantage within its group."""
    replies: list[str] = field(default_factory=list)
    """The policy's replies one by one (multi-turn rollouts; `text` joins them). Empty: `text` is
    the one reply."""
    contexts: list[str | None] = field(default_factory=list)
    """What each of `parts` answers: the conversation before it as the judge reads it
    (judge.prompting.transcript), for detectors that compare a reply with its prompt (off_topic).
    Empty when not known (views saved before detectors)."""
    reply_scores: list[float] = field(default_factory=list)
    """Each reply's own score before penalties, when the reward scores replies one by one (a
    multi-turn rollout whose reward before penalties is the mean of its RM's per-reply scores);
    empty otherwise. `per_reply` then compares each reply with the replies of its group at the same
    turn by its own score, instead of lending it the rollout's."""
    origin: int | None = None
    """The group of the rollout a reply came from, when `per_reply` grouped replies more finely (by
    turn); None: `group` is the rollout's group."""
    batch: int | None = None
    """The step of the batch it was drawn from (the across-steps test compares samples of one step
    with each other); None where not known (views saved before it was kept)."""

    @property
    def parts(self) -> list[str]:
        """The replies the judge reads one by one: `replies`, or `[text]`."""
        return self.replies or [self.text]


@dataclass
class ProposerView:
    """What one proposal step looks at. `retired` lets the dedup pass spot revivals."""

    step: int
    samples: list[ViewSample]
    active: list[Penalty] = field(default_factory=list)
    retired: list[Penalty] = field(default_factory=list)
    domain: str = ""
    reference: list[ViewSample] = field(default_factory=list)
    proposal: int = 1
    """Which proposal of the run this is (1-based): its share of the run's error rate
    (penalties.permutation.proposal_level)."""

    def by_id(self) -> dict[str, ViewSample]:
        return {s.id: s for s in self.samples}

    def positives(self) -> list[ViewSample]:
        return [s for s in self.samples if s.sign == "+"]

    def negatives(self) -> list[ViewSample]:
        return [s for s in self.samples if s.sign == "-"]


def prompt_group(s: ViewSample) -> int:
    """The prompt group `s` comes from (its rollout's group), however `per_reply` regrouped it."""
    return s.group if s.origin is None else s.origin


def advantage_sign(advantage: float, eps: float = 1e-9) -> str:
    """"+", "-" or "0" ("0" within `eps` of zero, e.g. a group whose scores are all equal)."""
    return "+" if advantage > eps else "-" if advantage < -eps else "0"


def group_centred(scores: list[list[float]]) -> list[list[float]]:
    """Each score minus its group's mean: the advantage GRPO gives it before any std
    normalisation (grpo.advantages), computed without an engine (the monitor imports no torch)."""
    return [[x - sum(g) / len(g) for x in g] for g in scores]


def view_rng(seed: int, step: int) -> random.Random:
    """An RNG that depends only on (seed, step), the same in every process and Python version."""
    digest = hashlib.sha256(f"dynalize-view:{seed}:{step}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def build_view(batch: Batch, scores: list[list[float]], advantages: list[list[float]], *, seed: int = 0,
               step: int | None = None, groups: int = 16, per_group: int = 2,
               active: list[Penalty] | None = None, retired: list[Penalty] | None = None,
               domain: str = "", reply_scores: list[list[list[float]]] | None = None) -> ProposerView:
    """Sample `per_group` rollouts from each of `groups` groups of `batch` (fewer if it is smaller).

    `scores[g][i]` and `advantages[g][i]` belong to rollout i of group g: the reward before
    penalties and its group advantage; `reply_scores[g][i]`, if given, its replies' own scores
    (ViewSample.reply_scores; [] where not known). Samples are listed group by group, with ids `s01`, `s02`,
    ... in that order. Texts are copied, so the view does not change when the batch does.
    """
    step = batch.step if step is None else step
    rng = view_rng(seed, step)
    nonempty = [i for i, g in enumerate(batch.groups) if g]
    chosen = sorted(rng.sample(nonempty, min(groups, len(nonempty))))
    samples: list[ViewSample] = []
    width = max(2, len(str(len(chosen) * per_group)))
    for gi in chosen:
        group = batch.groups[gi]
        for i in rng.sample(range(len(group)), min(per_group, len(group))):
            sid = f"s{len(samples) + 1:0{width}d}"
            replies = group[i].replies
            own = [float(x) for x in reply_scores[gi][i]] if reply_scores is not None and len(replies) > 1 else []
            samples.append(ViewSample(sid, gi, group[i].text, float(scores[gi][i]),
                                      advantage_sign(advantages[gi][i]), list(replies) if len(replies) > 1 else [],
                                      contexts_of(group[i]), own, batch=step))
    return ProposerView(step=step, samples=samples, active=list(active or []),
                        retired=list(retired or []), domain=domain)


def own_reply_scores(per_reply: list[float], replies: int, before: float) -> list[float]:
    """`per_reply` (a reward model's scores of a rollout's `replies` replies, one each) as the
    replies' own scores before penalties, when the score before penalties is their mean (the RM
    is the only other term); [] otherwise (no share of the score can be put on one reply) and for
    single-reply rollouts. What `ViewSample.reply_scores` holds."""
    if len(per_reply) < 2 or len(per_reply) != replies:
        return []
    mean = sum(per_reply) / len(per_reply)
    return [float(x) for x in per_reply] if abs(mean - before) <= 1e-9 * max(1.0, abs(before)) else []


def contexts_of(r: Rollout) -> list[str | None]:
    """What each policy reply of `r` answers, as the judge reads it; [] when its turns do not
    line up with its replies (a rollout built without turns answers its prompt)."""
    exchanges = r.exchanges()
    if len(exchanges) == max(1, len(r.replies)):
        return [transcript(conversation) for conversation, _ in exchanges]
    return [transcript(r.messages)] if len(r.replies) <= 1 and not r.turns else []


def pool_views(views: list[ProposerView], *, step: int | None = None, active: list[Penalty] | None = None,
               retired: list[Penalty] | None = None, domain: str = "",
               reference: list[ViewSample] | None = None, proposal: int = 1) -> ProposerView:
    """One view of the samples of `views` (oldest first). Several views are renumbered: ids `s001`,
    ... and groups 0, 1, ... over the distinct (view, group) pairs, so groups of different batches
    stay apart; a single view keeps its samples as they are."""
    samples: list[ViewSample] = list(views[0].samples) if len(views) == 1 else []
    total = sum(len(v.samples) for v in views)
    width = max(2, len(str(total)))
    group_of: dict[tuple[int, int], int] = {}
    for vi, v in enumerate(views if len(views) > 1 else []):
        for s in v.samples:
            g = group_of.setdefault((vi, s.group), len(group_of))
            samples.append(replace(s, id=f"s{len(samples) + 1:0{width}d}", group=g))
    last = views[-1].step if views else 0
    return ProposerView(step=last if step is None else step, samples=samples, active=list(active or []),
                        retired=list(retired or []), domain=domain, reference=list(reference or []),
                        proposal=proposal)


def distinct_reference(view: ProposerView) -> ProposerView:
    """`view` with its reference's samples renumbered `r001`, ... where any shares an id with a
    sample of the view. The reference is the first batches' view, numbered as every view is (`s001`,
    ...), and a proposer keys what it computes per sample (features, lengths) by id: a shared id
    would give a sample of the view the reference's replies."""
    if not {s.id for s in view.reference} & {s.id for s in view.samples}:
        return view
    width = max(3, len(str(len(view.reference))))
    return replace(view, reference=[replace(s, id=f"r{i:0{width}d}") for i, s in enumerate(view.reference, 1)])


def per_reply(view: ProposerView) -> ProposerView:
    """`view` with each multi-turn sample split into one sample per reply (ids `<id>.<k>`); its
    reference too. Single-reply samples stay as they are.

    A reply with its own score (`reply_scores`) is compared with the replies of its group at the
    same turn: it takes its own score, the group (rollout group, turn) and the sign of its score
    against that group's mean, since the RM paid it for itself. Without one, a reply takes its
    rollout's group, score and sign."""
    def split(samples: list[ViewSample]) -> list[ViewSample]:
        out: list[ViewSample] = []
        turn_group: dict[tuple[int, int], int] = {}
        top = max((s.group for s in samples), default=-1) + 1  # new groups are numbered after the old
        for s in samples:
            if not s.replies:
                out.append(s)
                continue
            ctxs = s.contexts if len(s.contexts) == len(s.replies) else [None] * len(s.replies)
            own = len(s.reply_scores) == len(s.replies)
            for k, (r, c) in enumerate(zip(s.replies, ctxs)):
                part = replace(s, id=f"{s.id}.{k + 1}", text=r, replies=[], contexts=[c] if c is not None else [],
                               reply_scores=[])
                if own:
                    g = turn_group.setdefault((s.group, k), top + len(turn_group))
                    part = replace(part, score=float(s.reply_scores[k]), group=g, origin=prompt_group(s))
                out.append(part)
        members: dict[int, list[float]] = {}
        for s in out:
            if s.origin is not None:
                members.setdefault(s.group, []).append(s.score)
        return [replace(s, sign=advantage_sign(s.score - sum(members[s.group]) / len(members[s.group])))
                if s.origin is not None else s for s in out]

    return replace(view, samples=split(view.samples), reference=split(view.reference))


def rollout_id(sample_id: str) -> str:
    """The rollout a (possibly per-reply) sample id belongs to: `s07.2` -> `s07`."""
    return sample_id.split(".", 1)[0]
