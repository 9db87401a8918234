"""The orchestrator: each training step runs the same phases, in this order.

  collect     take batch k from the generation worker, which runs `async_level` batches ahead
              (batch j is sampled by the policy of step j − async_level); drop rollouts older
              than `max_off_policy_steps` versions, counted;
  score       every reward term scores the batch, concurrently; reward = the sum of the terms;
              a group with a rollout some term could not score (a failed judge verdict), or
              whose simulated user failed (`user_failed`), is left out of the update, counted
              (`left_out`, `user_sim/failed`), never read as clean;
  advantages  group-relative advantages of that reward (dynalize.grpo), computed once;
  propose     terms that learn from the scored batch start their background work (Dynalize's
              proposer); training never waits for it;
  train       one learner step; the new weights are queued to the generator behind the batches
              it is already generating, so the schedule, and a resume, are exact;
  log         metrics and rollouts (also to the trackers of `report_to`), then held-out
              evaluation and a checkpoint when due; a reward term that says the run cannot go
              on (`stop_reason`) stops it, after a checkpoint (RunStopped).

`Orchestrator.state_dict()` is everything a checkpoint needs to continue exactly.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import grpo
from .backends.base import Generator, Learner, SamplingParams
from .checkpoint import save_checkpoint
from .config import RunConfig
from .cost import TokenMeter
from .errors import RunStopped
from .hooks import optional, owner_name, unwrap_hook_errors, user_code
from .judge.stats import FailureWindow
from .rewards.base import RewardTerm, score_batch
from .rollouts import USER_FAILED, sample_groups
from .runlog import RunDir, rollout_from_state, rollout_to_state
from .schedule import Future, GenerationWorker, PromptOrder, derived_seed, split_stale
from .tasks.base import Task
from .trackers import Trackers
from .types import Batch, Rollout, TrainSequence, output_step

log = structlog.get_logger("dynalize.loop")


@dataclass
class Parts:
    """Everything the loop joins. Built from the config by dynalize.build."""

    cfg: RunConfig
    task: Task
    tokenizer: Any
    generator: Generator
    learner: Learner
    terms: list[RewardTerm]
    """The reward is the sum of these terms (e.g. `rm`, `penalties`)."""
    run: RunDir

    def term(self, name: str) -> RewardTerm | None:
        return next((t for t in self.terms if t.name == name), None)


class PhaseTimer:
    """Seconds spent per named phase of one step, as `time/<phase>` metrics."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.seconds.items()}


def set_advantages(batch: Batch, std_normalize: grpo.StdScope) -> None:
    """Each rollout's advantage: its reward against its group's (dynalize.grpo)."""
    adv = grpo.advantages([[r.reward for r in g] for g in batch.groups], std_normalize)
    for g, a in zip(batch.groups, adv):
        for r, x in zip(g, a):
            r.advantage = x


STEP_FIELDS = ("step", "proposed_at")
"""Fields of a term's events that name a batch (terms count batches from 0)."""


def step_labelled(event: dict[str, Any], batch: int) -> dict[str, Any]:
    """A term's event (`batch` when it names none) with its batch numbers as the step they happened
    in (batch k is step k + 1: the convention of every output, training steps completed)."""
    out = {"step": batch, **event}
    return {k: output_step(v) if k in STEP_FIELDS and isinstance(v, int) else v for k, v in out.items()}


def _stats(name: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {f"{name}/mean": statistics.fmean(values), f"{name}/std": statistics.pstdev(values),
            f"{name}/min": min(values), f"{name}/max": max(values)}


def batch_metrics(rollouts: list[Rollout], terms: list[str]) -> dict[str, float]:
    """Reward, per-term score, advantage and length statistics of a scored batch."""
    lengths = [float(sum(r.loss_mask)) for r in rollouts]
    out = _stats("reward", [r.reward for r in rollouts])
    for name in terms:
        out.update(_stats(name, [r.scores[name] for r in rollouts]))
    return {
        **out,
        **_stats("advantage", [r.advantage for r in rollouts]),
        "advantage/abs_mean": statistics.fmean(abs(r.advantage) for r in rollouts) if rollouts else 0.0,
        **_stats("gen_len", lengths),
        "truncated_frac": statistics.fmean(r.truncated for r in rollouts) if rollouts else 0.0,
    }


class Orchestrator:
    """Runs the training steps; holds the state a checkpoint saves (`state_dict`)."""

    def __init__(self, parts: Parts):
        self.p = parts
        cfg = parts.cfg
        self.order = PromptOrder(parts.task.prompts("train"), cfg.prompts_per_step, cfg.seed)
        self.eval_prompts = parts.task.prompts("eval") if cfg.eval_every else []
        self.next_step = 0
        self.dropped_total = 0
        self.left_out_total = 0
        self.user_failed_total = 0  # conversations whose simulated user failed (rollouts.USER_FAILED)
        self.user_error: str | None = None  # the last such failure's reason, for the stop line
        self.unscored_by: dict[str, int] = {}  # rollouts each term could not score: the stop line's causes
        self.left_out = FailureWindow(cfg.max_left_out_rate, cfg.left_out_window)
        """Rollouts left out and scored over the last steps: `max_left_out_rate`'s stop rule. Not
        checkpointed, like the judge's window: a resume after fixing the cause starts afresh."""
        self.eval_rows = 0  # lines in eval/task.jsonl: a resume trims the file back to them
        self.history: list[dict[str, Any]] = []
        self.batches: dict[int, Future] = {}
        self._restored: dict[int, list[list[Rollout]]] = {}  # batches generated ahead, from a checkpoint
        self._generator_version: int | None = None  # set on resume: the version to push before step one
        self.worker: GenerationWorker | None = None
        self.last_checkpoint: Path | None = None  # written by this process (its manifest hashed as it was)
        self.trackers = Trackers(cfg)  # report_to: TensorBoard, W&B, Trackio, MLflow
        self.tokens = TokenMeter({role: chat for t in parts.terms for role, chat in t.chat_models().items()})

    # --- resumable state --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue at `next_step` exactly (batches generated ahead included).
        Every queued batch must be done (`checkpoint` waits for them)."""
        p = self.p
        inflight = {str(k): [[rollout_to_state(r) for r in g] for g in fut.result()[0]]
                    for k, fut in sorted(self.batches.items())}
        return {
            "step": self.next_step,
            "data_position": self.order.position(self.next_step),
            "learner_version": p.learner.version,
            "generator_version": p.generator.version,
            "dropped_total": self.dropped_total,
            "left_out_total": self.left_out_total,
            "user_failed_total": self.user_failed_total,
            "eval_rows": self.eval_rows,
            "tokens": self.tokens.state_dict(),
            "terms": {t.name: t.state_dict() for t in p.terms},
            "inflight": inflight,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state` (the learner's own state is loaded with the checkpoint)."""
        self.next_step = state["step"]
        self.dropped_total = state["dropped_total"]
        self.left_out_total = state.get("left_out_total", 0)
        self.user_failed_total = state.get("user_failed_total", 0)
        self.eval_rows = state.get("eval_rows", 0)
        self.tokens.load_state_dict(state.get("tokens", {}))
        self._generator_version = state["generator_version"]
        self._restored = {int(k): [[rollout_from_state(r) for r in g] for g in groups]
                          for k, groups in state.get("inflight", {}).items()}
        for term in self.p.terms:
            if term.name in state.get("terms", {}):
                term.load_state_dict(state["terms"][term.name])

    # --- the run ----------------------------------------------------------------------------------

    async def run(self) -> list[dict[str, Any]]:
        """Train up to `cfg.steps`; the metrics of each step. Task code that fails raises one
        HookError (dynalize.hooks), not the task groups' nested exception groups."""
        self.trackers.start()
        try:
            with unwrap_hook_errors():
                return await self._run()
        finally:
            self.trackers.finish()

    async def _run(self) -> list[dict[str, Any]]:
        cfg, p = self.p.cfg, self.p
        p.run.create()
        async with anyio.create_task_group() as tg:
            self.worker = GenerationWorker(tg)
            if self._generator_version is not None:  # resumed: the generator samples the saved policy
                await p.generator.update_weights(p.learner.policy_state(), self._generator_version)
            if self.eval_prompts and self.next_step == 0:  # step 0: before any training, in metrics.jsonl too
                first = {"step": 0, **await self.worker.submit(lambda: self.evaluate(0, 0)).wait(),
                         **self.tokens.metrics()}
                p.run.log_metrics(first)
                self.trackers.log_step(first, {}, [])
            with _progress(cfg) as bar:
                task = bar.add_task("training", total=cfg.steps, completed=self.next_step, info="")
                while self.next_step < cfg.steps:
                    record = await self.step(tg)
                    self.history.append(record)
                    bar.update(task, advance=1, info=f"reward {record.get('reward/mean', float('nan')):+.3f}"
                                                     f"  rm {record.get('rm/mean', float('nan')):+.3f}")
            tg.cancel_scope.cancel()  # background work: terms landed or cancelled it at the last step (finish)
        return self.history

    async def step(self, tg: anyio.abc.TaskGroup) -> dict[str, Any]:
        """One training step: the phases of the module docstring."""
        cfg, p, step = self.p.cfg, self.p, self.next_step
        timer = PhaseTimer()
        record: dict[str, Any] = {"step": step + 1}  # steps completed once this one is: what it is labelled
        with timer("step"):
            with timer("collect"):
                batch, gen_time = await self.collect(step, record)
            events: dict[str, list[dict[str, Any]]] = {}
            train_metrics: dict[str, float] = {}
            rollouts = batch.rollouts  # all of them go to the log, trained on or not
            if batch.groups:
                with timer("score"):
                    events = await score_batch(p.terms, batch)
                batch = self.leave_out_unscored(batch, record)
            if batch.groups:
                with timer("advantages"):
                    set_advantages(batch, cfg.trainer.loss.std_normalize)
                with timer("propose"):
                    for term in p.terms:
                        term.observe(batch, tg)
                with timer("train"):
                    seqs = [TrainSequence.from_rollout(r) for r in batch.rollouts]
                    train_metrics = await anyio.to_thread.run_sync(p.learner.train_step, seqs)
            with timer("sync"):
                version, sync_time = await self.push_weights()
            record.update({"policy_version": version, **batch_metrics(batch.rollouts, [t.name for t in p.terms]),
                           **train_metrics})
            if step + 1 == cfg.steps:  # background work lands in the last metrics and checkpoint
                with timer("finish"):
                    for term in p.terms:
                        await term.finish()
            for term in p.terms:
                record.update(term.metrics())
            if self.eval_prompts and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
                with timer("eval"):
                    record.update(await self.worker.submit(lambda: self.evaluate(step + 1, version)).wait())
        tokens = sum(len(r.completion_ids) for r in rollouts)
        seconds = timer.seconds
        record.update(self.tokens.metrics())  # the API-backed models' tokens, this step's evaluation included
        record.update({
            **timer.metrics(), "time/generate": gen_time, "time/weight_sync": sync_time,
            "time/wait_for_generation": seconds["sync"] - sync_time,
            "rollouts_per_s": len(rollouts) / seconds["step"], "tokens_per_s": tokens / seconds["step"],
        })
        p.run.log_rollouts(step + 1, rollouts)
        events = {name: [step_labelled(e, step) for e in lines] for name, lines in events.items()}
        for name, lines in events.items():
            p.run.log_events(name, lines)
        p.run.log_metrics(record)
        self.trackers.log_step(record, events, rollouts)
        log.debug("step", **{k: v for k, v in record.items() if not isinstance(v, dict)})
        self.next_step = step + 1
        stop = p.run.moved or next((why for t in p.terms if (why := t.stop_reason())), None) or self.left_out_stop()
        due = cfg.checkpoint_every and self.next_step % cfg.checkpoint_every == 0
        if stop or due or self.next_step == cfg.steps:
            await self.checkpoint()
        stop = stop or p.run.moved  # the run folder moved while the checkpoint was written: it went there too
        if stop:
            log.error("run.stopped", step=output_step(step), reason=stop)
            raise RunStopped(f"{stop} (stopped after step {step + 1}; checkpoint written: fix the cause, then "
                             f"--resume {p.run.root})")
        return record

    # --- the phases ---------------------------------------------------------------------------------

    def leave_out_unscored(self, batch: Batch, record: dict[str, Any]) -> Batch:
        """`batch` without the groups that hold a rollout some term could not score, or whose
        simulated user failed mid-conversation: their rewards, hence every advantage in the group,
        are unknown. Each rollout left out is marked (`left_out`) and counted in `record`."""
        failed_users = [r.info[USER_FAILED] for r in batch.rollouts if r.info.get(USER_FAILED)]
        self.user_failed_total += len(failed_users)
        self.user_error = failed_users[-1] if failed_users else self.user_error
        if self.p.task.max_turns > 1:  # a simulated user takes part
            record.update({"user_sim/failed": len(failed_users), "user_sim/failed_total": self.user_failed_total})
        for r in batch.rollouts:
            for term in r.info.get("unscored") or []:
                self.unscored_by[term] = self.unscored_by.get(term, 0) + 1
        kept, left_out = [], 0
        for g in batch.groups:
            if any(r.info.get("unscored") or r.info.get(USER_FAILED) for r in g):
                left_out += len(g)
                for r in g:
                    r.info["left_out"] = True
            else:
                kept.append(g)
        self.left_out_total += left_out
        self.left_out.add(left_out, len(batch.rollouts))
        if left_out:
            log.warning("groups with unscored rollouts are left out of the update", step=output_step(batch.step),
                        rollouts=left_out, total=self.left_out_total)
        record.update({"left_out": left_out, "left_out_total": self.left_out_total,
                       "left_out_rate": left_out / len(batch.rollouts) if batch.rollouts else 0.0})
        return Batch(step=batch.step, groups=kept)

    def left_out_stop(self) -> str | None:
        """One line when more than `max_left_out_rate` of the rollouts scored over the last
        `left_out_window` steps were left out of the update, else None."""
        if (over := self.left_out.over_limit()) is None:
            return None
        n, scored = over
        user = (f", or whose simulated user failed ({self.user_failed_total} conversations so far; last error: "
                f"{self.user_error})" if self.user_error else "")
        causes = "; ".join(f"{count} by {term}" + (" (every reward function returned None for it)"
                                                     if term == "reward_funcs" else
                                                     " (a judge verdict failed: see judge/failed_verdicts and the "
                                                     "judge's last error)")
                           for term, count in sorted(self.unscored_by.items()))
        held = f": their groups held a rollout a term could not score (so far {causes})" if causes else ""
        return (f"{n} of {scored} rollouts ({n / scored:.0%}) were left out of the update over the last "
                f"{len(self.left_out.steps)} steps, more than max_left_out_rate={self.left_out.max_rate}{held}{user}")

    async def collect(self, step: int, record: dict[str, Any]) -> tuple[Batch, float]:
        """Batch `step`, with stale rollouts dropped (counted in `record`), and its generation time."""
        for j in range(step, step + self.p.cfg.async_level + 1):
            self.queue_batch(j)
        groups, gen_time = await self.batches.pop(step).wait()
        groups, dropped, staleness = split_stale(groups, self.p.learner.version, self.p.cfg.max_off_policy_steps)
        self.dropped_total += dropped
        if dropped:
            log.warning("dropped stale rollouts", step=output_step(step), dropped=dropped, total=self.dropped_total)
        record.update({"staleness": {str(k): v for k, v in sorted(staleness.items())}, "dropped": dropped,
                       "dropped_total": self.dropped_total})
        return Batch(step=step, groups=groups), gen_time

    def queue_batch(self, step: int) -> None:
        """Have batch `step` generated (after every job already queued), unless it is already."""
        if step in self.batches:  # batches past the last step are generated too: the final
            return                 # checkpoint keeps them, so extending a run stays exact
        if step in self._restored:
            fut = Future()
            fut.set((self._restored.pop(step), 0.0))
            self.batches[step] = fut
            return
        prompts = self.order.batch(step)

        async def job():
            t0 = time.perf_counter()
            groups = await sample_groups(self.p.generator, self.p.tokenizer, self.p.task, prompts,
                                         self.p.cfg.group_size, self.sampling("batch", step))
            return groups, time.perf_counter() - t0

        assert self.worker is not None
        self.batches[step] = self.worker.submit(job)

    async def push_weights(self) -> tuple[int, float]:
        """Queue the learner's weights to the generator; (policy version, seconds the push took)."""
        p = self.p
        version = p.learner.version

        async def push() -> float:
            t = time.perf_counter()
            await p.generator.update_weights(p.learner.policy_state(), version)
            return time.perf_counter() - t

        assert self.worker is not None
        return version, await self.worker.submit(push).wait()  # queued behind the batches generating

    def sampling(self, *seed_parts: Any) -> SamplingParams:
        g = self.p.cfg.generator
        return SamplingParams(max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p,
                              min_p=g.min_p, seed=derived_seed(self.p.cfg.seed, *seed_parts))

    async def evaluate(self, step: int, version: int | None = None) -> dict[str, float]:
        """Held-out replies from the current policy (after `step` training steps; its weights' `version`,
        by default `step`), scored by the task (e.g. sandbox gold), the RM, and each term's own
        evaluation (`RewardTerm.evaluate`: the rubric term's proxy/gold measurement)."""
        version = step if version is None else version
        n = self.p.cfg.eval_samples
        groups = await sample_groups(self.p.generator, self.p.tokenizer, self.p.task, self.eval_prompts, n,
                                     self.sampling("eval"))
        rollouts = [r for g in groups for r in g]
        replies = [r.replies[-1] for r in rollouts]
        prompts = [pr for pr in self.eval_prompts for _ in range(n)]
        task = self.p.task
        with user_code(owner_name("task", task), "evaluate"):
            metrics = await task.evaluate(prompts, replies, **optional(
                task.evaluate, conversations=[r.conversation for r in rollouts]))
            if not isinstance(metrics, dict) or not all(isinstance(v, (int, float)) for v in metrics.values()):
                raise TypeError(f"returned {metrics!r:.80}, not a dict of metric name → number")
        if failed := sum(bool(r.info.get(USER_FAILED)) for r in rollouts):  # conversations cut short, counted
            metrics = {**metrics, "user_sim_failed": failed}
        batch = Batch(step, groups)
        rm = self.p.term("rm")
        if rm is not None:
            await score_batch([rm], batch)
            metrics = {**metrics, "rm": statistics.fmean(r.scores["rm"] for r in rollouts)}
        for term in self.p.terms:  # e.g. the rubric term's proxy/gold measurement
            metrics.update(await term.evaluate(batch))
        self.p.run.log_eval({"step": step, "version": version, **metrics})
        self.eval_rows += 1
        self.p.run.log_rollouts(step, rollouts, name="eval")
        return {f"eval/{k}": v for k, v in metrics.items()}

    async def checkpoint(self) -> None:
        """Save everything needed to continue at `next_step` exactly, batches generated ahead included."""
        for fut in self.batches.values():
            await fut.wait()
        path = self.p.run.checkpoint_path(self.next_step)
        save_checkpoint(path, self.p.learner, self.state_dict())
        self.last_checkpoint = path
        log.info("checkpoint", step=self.next_step, path=str(path))


def _progress(cfg: RunConfig) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), disable=not cfg.progress,
    )
