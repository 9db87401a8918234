"""Token cost of the run's API-backed models (judges, proposer, ...), from the API's `usage`.

The judge runs on every rollout: its tokens are a run's main running cost on a hosted API. Each
reward term names its chat models by role (`RewardTerm.chat_models`: `proxy judge`, `gold judge`,
`penalty judge`, `proposer`, `dedup`); a model that counts its replies' usage (the openai engine's
`usage`) is metered: per step `tokens/<role>/prompt` and `tokens/<role>/completion` (the step's
calls, its held-out evaluation included), with `_total` over the run (kept across a resume).
"""

from __future__ import annotations

from typing import Any

KINDS = ("prompt", "completion")


def usage_of(chat: Any) -> dict[str, int] | None:
    """The usage counters of a chat model or of the model a wrapper holds (None: it counts none)."""
    for m in (chat, getattr(chat, "model", None)):
        usage = getattr(m, "usage", None)
        if isinstance(usage, dict):
            return usage
    return None


def slug(role: str) -> str:
    return role.replace(" ", "_")


class TokenMeter:
    """Per-step and total tokens of each metered role."""

    def __init__(self, chats: dict[str, Any]):
        self.usages: dict[str, dict[str, int]] = {}
        for role, chat in chats.items():
            u = usage_of(chat) if chat is not None else None
            if u is not None and all(u is not v for v in self.usages.values()):  # a model in two roles: once
                self.usages[role] = u
        self.seen = {role: {k: u.get(f"{k}_tokens", 0) for k in KINDS} for role, u in self.usages.items()}
        self.totals: dict[str, dict[str, int]] = {role: dict.fromkeys(KINDS, 0) for role in self.usages}

    def metrics(self) -> dict[str, float]:
        """The tokens since the last call, and the run's totals, per role."""
        out: dict[str, float] = {}
        for role, u in self.usages.items():
            for k in KINDS:
                now = u.get(f"{k}_tokens", 0)
                delta, self.seen[role][k] = now - self.seen[role][k], now
                self.totals[role][k] += delta
                out[f"tokens/{slug(role)}/{k}"] = float(delta)
                out[f"tokens/{slug(role)}/{k}_total"] = float(self.totals[role][k])
        return out

    def state_dict(self) -> dict[str, Any]:
        return {role: dict(t) for role, t in self.totals.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for role, t in (state or {}).items():
            if role in self.totals:
                self.totals[role] = {k: int(t.get(k, 0)) for k in KINDS}


def cost_lines(record: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, "prompt N + completion M tokens") of a metrics line's totals, for summaries."""
    roles = sorted({k.split("/")[1] for k in record if k.startswith("tokens/") and k.endswith("_total")})
    return [(role.replace("_", " "), f"prompt {int(record.get(f'tokens/{role}/prompt_total', 0)):,} + completion "
                                     f"{int(record.get(f'tokens/{role}/completion_total', 0)):,} tokens")
            for role in roles]
