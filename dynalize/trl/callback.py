"""`Penalties`: Dynalize's evolving penalties in a TRL `GRPOTrainer`, as one object that is both a
reward function and a `TrainerCallback`.

`Penalties(reward_funcs)` wraps the script's reward functions: `penalties.reward_funcs` is them,
each unchanged for TRL (same name, same scores, so TRL logs `rewards/<name>/mean` as before) and
recording what it returned, then the penalty function itself (`rewards/penalties/...`), which TRL
calls after them. The reward before penalties is taken from those recorded scores, weighted as
TRL weights them (`reward_weights`): exactly the numbers TRL sums, of this very call. (TRL's own
per-function columns hold the same numbers, but only in its private `_logs` and only after the
step is scored: too late to penalise it.)

Each call judges every completion of the step against the live penalties (the oldest accepted
proposal enters first, at most one a step; untriggered penalties retire) and returns
minus the cost of the penalties each violates (by default here `lam` plus each one's measured
pay, penalties.weight and penalties/pay.py; `−lam · violations` with weight "fixed"); every `every`
steps (TRL's step: `trainer_state.global_step + 1`) it hands the step's completions, rewards and
groups to the proposer in the background, as a dynalize run does
(dynalize.rewards.penalties.PenaltyTerm). `observe_only=True` is the monitor live: the same, and
nothing added to the reward.

With several processes, each gathers its completions to the main process, which alone judges,
proposes and writes; the penalties, the buffer and the metrics are broadcast back before TRL sums
the rewards, so every rank returns the main process's verdicts for its own completions.
With `penalties.confirm` (the default), each candidate is confirmed before it enters the buffer by
scoring edited copies of the step's completions with the same reward functions (dynalize.trl.confirm).
"""

from __future__ import annotations

import functools
import inspect
import json
import threading
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import ValidationError
from transformers import TrainerCallback

from ..build import build_penalty_term
from ..errors import one_line
from ..monitor.outdir import write_atomic
from ..monitor.replay import logged_step, step_metrics
from ..monitor.summary import LIVE_EXIT
from ..penalties.config import PenaltiesConfig
from ..rewards.functions import RESERVED_COLUMNS
from ..rewards.rescore import confirm_in_run
from .background import Background
from .batch import PenaltiesError, Processes, scorable, to_batch, weighted_sum
from .confirm import TrlRewardFunctions
from .outputs import RunFolder, status_of

log = structlog.get_logger("dynalize.trl")

STATE_FILE = "dynalize_penalties.json"
"""The penalty term's state in each TRL checkpoint folder (`checkpoint-N/`)."""
STATE_VERSION = 1
TRACKED = ("penalties/", "penalty/", "proposer/accepted_total", "proposer/failed_total", "proposer/in_flight",
           "proposer/pending", "judge/failure_rate", "judge/failed_verdicts_total", "buffer/version")
"""The metrics (prefixes) that go into TRL's logs; the run folder's metrics.jsonl keeps them all."""


class HackDetected(RuntimeError):
    """`on_hack="raise"`: a discovered pattern is live; the message is the monitor's verdict."""


class PenaltiesFailed(RuntimeError):
    """The judge or the proposer kept failing (the monitor's exit 3): the line says which."""


TRL_WEIGHT = "pay"
"""`penalties.weight` unless the settings name one: a violation costs λ plus what the reward pays
for the pattern (penalties/pay.py), since a TRL script's rewards come in any scale."""


TRL_RUNS_IN = "process"
"""`penalties.proposer.lexical.runs_in` unless the settings name one: TRL trains in the process that
calls the reward functions, so a proposal in a thread of it slows the steps it overlaps; in a
process of its own it takes a spare core (docs/from_trl.md, "Step time")."""


def penalties_config(settings: PenaltiesConfig | dict[str, Any] | None) -> PenaltiesConfig:
    """A run's `penalties` section (docs/penalties.md), on; `weight` is TRL_WEIGHT and the lexical
    proposer's `runs_in` TRL_RUNS_IN unless set."""
    try:
        given = settings if isinstance(settings, PenaltiesConfig) else PenaltiesConfig.model_validate(settings or {})
    except ValidationError as e:
        raise PenaltiesError(one_line(e, prefix="dynalize.trl: penalties")) from None
    update: dict[str, Any] = {"enabled": True}
    if "weight" not in given.model_fields_set:
        update["weight"] = TRL_WEIGHT
    lexical = given.proposer.lexical
    if "runs_in" not in lexical.model_fields_set:
        update["proposer"] = given.proposer.model_copy(
            update={"lexical": lexical.model_copy(update={"runs_in": TRL_RUNS_IN})})
    return given.model_copy(update=update)


def callable_name(func: Any) -> str:
    """The name TRL gives a reward function (trl.trainer.utils.get_callable_name)."""
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


class RecordedReward:
    """A user's reward function, unchanged for TRL, its scores kept for the penalties."""

    def __init__(self, owner: "Penalties", index: int, func: Any):
        self.owner, self.index, self.func = owner, index, func
        self.__name__ = callable_name(func)

    def __call__(self, **kwargs: Any) -> list[float | None]:
        with self.owner.lock:  # never beside the confirmation's call of the same function (trl.confirm)
            scores = self.func(**kwargs)
        self.owner.record(self.index, list(scores), kwargs)
        return scores


class Penalties(TrainerCallback):
    """Evolving penalties (or, `observe_only`, the monitor) for one TRL `GRPOTrainer` run.

    reward_funcs: the script's reward functions (sync callables), in the trainer's order.
    penalties: the `penalties` settings of a dynalize run (dict or PenaltiesConfig): `lam`, `weight`
        (`pay` here unless set: TRL_WEIGHT), `every`, `sync`, the proposer and judge (lexical and
        regex by default, any LLM by the same settings).
    observe_only: judge and propose, add nothing to the reward (the monitor, live).
    out: the run-like folder (default `<output_dir>/dynalize`).
    on_hack: when a discovered pattern is live: `continue`, `stop` (TRL's `should_training_stop`)
        or `raise` (HackDetected).
    """

    def __init__(self, reward_funcs: Any, *, penalties: PenaltiesConfig | dict[str, Any] | None = None,
                 observe_only: bool = False, out: str | Path | None = None,
                 on_hack: Literal["continue", "stop", "raise"] = "continue", seed: int = 0, domain: str = "",
                 html: bool = True):
        funcs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
        for f in funcs:
            if isinstance(f, str) or not callable(f) or hasattr(f, "config"):
                raise PenaltiesError(f"dynalize.trl: {f!r} is not a reward function: Penalties wraps Python reward "
                                     f"functions (reward models, by name or as modules, are not supported)")
            if inspect.iscoroutinefunction(f) or inspect.iscoroutinefunction(getattr(f, "__call__", None)):
                raise PenaltiesError(f"dynalize.trl: {callable_name(f)} is async: Penalties wraps synchronous reward "
                                     f"functions only")
        if on_hack not in ("continue", "stop", "raise"):
            raise PenaltiesError(f"dynalize.trl: on_hack must be continue, stop or raise, not {on_hack!r}")
        self.cfg = penalties_config(penalties)
        self.observe_only, self.on_hack, self.html = observe_only, on_hack, html
        self.seed, self.domain = seed, domain
        self.out = Path(out) if out is not None else None
        self.term = build_penalty_term(self.cfg, domain=domain, seed=seed)
        self.term.label = logged_step  # its batches carry TRL's step (global_step + 1): log lines say it
        self.term.sparse_steps = True  # steps_per_generation > 1: TRL scores once every few steps
        self.__name__ = "penalties"
        self.lock = threading.Lock()
        """Held by every call of a wrapped function: TRL's, and the confirmation's (trl.confirm)."""
        self.reward_funcs: list[Any] = [RecordedReward(self, i, f) for i, f in enumerate(funcs)]
        if not observe_only:
            self.reward_funcs.append(self)
        self._scores: list[list[float | None] | None] = [None] * len(funcs)
        self.status: int | None = None
        """The monitor's exit status after the latest step: 0, 10 (LIVE_EXIT), 11 (insufficient) or 12 (unnamed pay)."""
        self.verdict = ""
        """The monitor's sentence, at the end of training (or when `on_hack` stops it)."""
        self.folder: RunFolder | None = None
        self._bg: Background | None = None
        self._procs: Processes | None = None
        self._group_size = 0
        self._weights: list[float] = []
        self._model: Any = None
        self._stop: str | None = None
        self._resumed_evidence: dict[str, Any] | None = None
        self._confirming: TrlRewardFunctions | None = None

    # --- the reward function ----------------------------------------------------------------------

    def record(self, index: int, scores: list[float | None], kwargs: dict[str, Any]) -> None:
        self._scores[index] = scores
        if self.observe_only and all(s is not None for s in self._scores):
            self._step(kwargs)

    def __call__(self, **kwargs: Any) -> list[float | None]:
        if any(s is None for s in self._scores):
            raise PenaltiesError("dynalize.trl: the penalties were called before the functions they wrap: pass "
                                 "reward_funcs=penalties.reward_funcs to the trainer")
        return self._step(kwargs)

    def _step(self, kwargs: dict[str, Any]) -> list[float | None]:
        """Judge this call's completions (all processes'), propose in the background, log; the
        penalty of each of this process's completions (None where TRL has no reward to add it to)."""
        scores, self._scores = self._scores, [None] * len(self._scores)
        if self._procs is None or self._bg is None:
            raise PenaltiesError("dynalize.trl: Penalties must also be one of the trainer's callbacks: "
                                 "GRPOTrainer(..., callbacks=[penalties])")
        before = weighted_sum(scores, self._weights)  # type: ignore[arg-type]
        if self._model is not None and not self._model.training:  # TRL's evaluation: penalties shape training only
            return [None] * len(before)
        state = kwargs["trainer_state"]
        columns = None
        if self._confirming is not None:  # an edited copy is scored with its row's columns
            self._confirming.state = state
            named = [k for k, v in kwargs.items() if k not in RESERVED_COLUMNS and isinstance(v, list | tuple)
                     and len(v) == len(before)]  # the dataset's columns, one value per completion
            columns = [{k: kwargs[k][i] for k in named} for i in range(len(before))]
        parts = self._procs.gather((kwargs["prompts"], kwargs["completions"], before, columns))
        failure: BaseException | None = None
        result: dict[str, Any] | None = None
        if self._procs.main:
            try:
                result = self._main_step(state.global_step + 1, parts)
            except Exception as e:  # the other ranks wait for the broadcast: they stop too, never hang
                failure, result = e, {"error": f"{type(e).__name__}: {e}"}
        result = self._procs.broadcast(result)
        if failure is not None:
            raise failure
        if "error" in result:
            raise PenaltiesFailed(f"dynalize.trl: the main process failed: {result['error']}")
        if not self._procs.main:
            self._bg.call(self.term.buffer.load_json, result["buffer"])
        self.status, self._stop = result["status"], result["stop"]
        state.penalties_status = self.status
        if result["verdict"]:
            self.verdict = result["verdict"]
        if (log_metric := kwargs.get("log_metric")) is not None:
            for k, v in result["metrics"].items():
                log_metric(k, v)
        start = sum(len(p[2]) for p in parts[:self._procs.rank])
        return result["penalties"][start:start + len(before)]

    def _main_step(self, step: int, parts: list[Any]) -> dict[str, Any]:
        assert self._bg is not None and self.folder is not None
        prompts = [p for part in parts for p in part[0]]
        completions = [c for part in parts for c in part[1]]
        before = [b for part in parts for b in part[2]]
        columns = None if self._confirming is None else [c for part in parts for c in part[3]]
        batch = to_batch(step, prompts, completions, before, self._group_size, columns)
        scored = self._bg.call(self.term.score, batch)
        unscored = scored.unscored or [False] * len(batch.rollouts)
        for r, info, failed, b in zip(batch.rollouts, scored.info, unscored, before):
            r.info.update(info)
            unknown = ["penalties"] * failed + ["reward"] * (b is None)
            if unknown:  # recorded as null, never as a number
                r.info["unscored"] = unknown
            if b is None:  # TRL leaves it out of its group's baseline
                r.info["left_out"] = True
        kept = scorable(batch)
        metrics = self._bg.call(step_metrics, kept, self.term) if kept.groups else {"step": step}
        penalties: list[float | None] = []
        for r, b, failed, p in zip(batch.rollouts, before, unscored, scored.values):
            r.scores["penalties"] = 0.0 if self.observe_only else p
            r.reward += r.scores["penalties"]
            penalties.append(None if b is None or failed else p)  # no reward to add to, or no verdict
        self._bg.call(self.term.observe, kept, self._bg.tg)
        self.folder.write_step(batch, scored.events, metrics, self.term.evidence)
        status = self._bg.call(status_of, self.term)
        stop = self._bg.call(self.term.stop_reason)
        verdict = self.folder.verdict() if status == LIVE_EXIT and self.on_hack != "continue" else ""
        tracked = {k: float(v) for k, v in metrics.items() if k.startswith(TRACKED) and isinstance(v, int | float)}
        return {"penalties": penalties, "metrics": tracked, "status": status, "stop": stop, "verdict": verdict,
                "buffer": self._bg.call(self.term.buffer.to_json)}

    # --- the callback -----------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        n = len(self.reward_funcs)
        weights = list(args.reward_weights) if args.reward_weights is not None else [1.0] * n
        if len(weights) != n:
            raise PenaltiesError(f"dynalize.trl: reward_weights has {len(weights)} weights for {n} functions: pass "
                                 f"reward_funcs=penalties.reward_funcs")
        if not self.observe_only and weights[-1] != 1.0:
            raise PenaltiesError(f"dynalize.trl: the penalties' reward weight (the last of reward_weights) is "
                                 f"{weights[-1]}; it must be 1.0 (the penalty's size is penalties.lam)")
        self._weights = weights[:len(self._scores)]
        if self.cfg.confirm and self._confirming is None:
            wrapped = [f for f in self.reward_funcs if isinstance(f, RecordedReward)]
            confirming = TrlRewardFunctions([(f.__name__, f.func, w) for f, w in zip(wrapped, self._weights)],
                                            self.lock)
            if confirm_in_run(self.term, [confirming]) is not None:  # else unavailable: warned, said per penalty
                self._confirming = confirming
        self._group_size, self._model = args.num_generations, model
        self._procs = Processes()
        self._bg = Background()
        resumed = state.global_step if state.global_step > 0 else None
        if resumed is not None:
            self._load(Path(args.output_dir) / f"checkpoint-{resumed}" / STATE_FILE, resumed)
        if self._procs.main:
            self.folder = RunFolder(self.out or Path(args.output_dir) / "dynalize")
            self.folder.start(self._config(args), resumed)
            self.folder.evidence_written = self._resumed_evidence

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._stop is not None:
            raise PenaltiesFailed(f"dynalize.trl: {self._stop}")
        if self.status == LIVE_EXIT and self.on_hack == "stop":
            log.warning("penalties.hack_live", verdict=self.verdict)
            control.should_training_stop = True
        elif self.status == LIVE_EXIT and self.on_hack == "raise":
            raise HackDetected(self.verdict)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The term's state (buffer, proposer's views, queued and unfinished proposals) into the
        checkpoint folder TRL just wrote. With `sync`, a proposal in flight finishes first, so a
        resumed run applies it at the same step an uninterrupted one does."""
        if self._bg is None or self._procs is None:
            return
        if self.cfg.sync:
            self._bg.call(self.term.settle)
        if not self._procs.main:  # it alone proposes: the others hold the buffer only
            return
        term = self._bg.call(self.term.state_dict)
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        assert self.folder is not None
        self.folder.write_evidence(term["evidence"])
        record = {"version": STATE_VERSION, "step": state.global_step, "penalties": self.cfg.model_dump(mode="json"),
                  "observe_only": self.observe_only, "seed": self.seed, "term": term,
                  "evidence_written": self.folder.evidence_written}
        write_atomic(folder / STATE_FILE, json.dumps(record, ensure_ascii=False))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Cancel a proposal still running (counted; a resumed run proposes it again), write
        summary.json and report.html, say the verdict."""
        if self._bg is None or self._procs is None:
            return
        try:
            self._bg.call(self.term.finish)
            if self._procs.main and self.folder is not None:
                self.folder.write_evidence(self.term.evidence)
                self.verdict = self.folder.finish(self.html)
                log.info("penalties.verdict", verdict=self.verdict, folder=str(self.folder.out))
            self.verdict = self._procs.broadcast(self.verdict)
            state.penalties_verdict = self.verdict
        finally:
            self._bg.close()
            self._bg = None

    # --- internals --------------------------------------------------------------------------------

    def _load(self, path: Path, step: int) -> None:
        """The state a checkpoint holds; one line when it holds none or other settings."""
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise PenaltiesError(f"dynalize.trl: resuming at step {step}: {path} is not a readable penalties state "
                                 f"({type(e).__name__}); it is written by Penalties into each checkpoint") from None
        if record.get("version") != STATE_VERSION or record.get("step") != step:
            raise PenaltiesError(f"dynalize.trl: {path} was written by another version or for another step")
        if record["penalties"] != self.cfg.model_dump(mode="json") or record["observe_only"] != self.observe_only:
            raise PenaltiesError(f"dynalize.trl: {path} was saved with other penalty settings: resume with the same "
                                 f"Penalties(...) arguments")
        assert self._bg is not None
        self._bg.call(self.term.load_state_dict, record["term"])
        self._resumed_evidence = record.get("evidence_written")

    def _config(self, args: Any) -> dict[str, Any]:
        return {"name": Path(args.output_dir).name, "trl": {"output_dir": str(args.output_dir),
                "num_generations": args.num_generations, "reward_weights": self._weights},
                "observe_only": self.observe_only, "seed": self.seed,
                "penalties": self.cfg.model_dump(mode="json")}
