"""The orchestrator: generate → score → train, with generation running ahead.

Per step k:
  1. make sure batches k … k + async_level are queued on the generation worker; batch j is
     sampled by the policy the learner had after step j − async_level;
  2. take batch k; drop rollouts older than `max_off_policy_steps` versions (counted);
  3. score: RM on every policy reply, then (Dynalize) the penalty judge; reward → advantages;
  4. start a background proposal on this batch (Dynalize; training never waits for it);
  5. one learner step, then push the new weights to the generator (queued behind the batches
     already being generated, so the schedule is deterministic and a resume is exact);
  6. log metrics and rollouts, evaluate, checkpoint.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import grpo
from .backends.base import Generator, Learner, RewardModel, SamplingParams
from .config import RunConfig
from .rollouts import rm_inputs, sample_groups
from .runlog import RunDir, append_jsonl, save_checkpoint
from .tasks.base import Task
from .types import Batch, Prompt, Rollout, TrainSequence

log = structlog.get_logger("dynalize.loop")


@dataclass
class Parts:
    """Everything the loop joins. Built from the config by dynalize.build."""

    cfg: RunConfig
    task: Task
    tokenizer: Any
    generator: Generator
    reward_model: RewardModel
    learner: Learner
    run: RunDir
    penalties: Any = None  # dynalize.penalties.engine.PenaltyEngine when Dynalize is on


def derived_seed(*parts: Any) -> int:
    """A stable 63-bit seed from any values (for per-batch sampling, data order, masks)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class PromptOrder:
    """Batch k's prompts: consecutive slices of per-epoch seeded shuffles. A pure function of k."""

    def __init__(self, prompts: list[Prompt], per_step: int, seed: int):
        self.prompts, self.per_step, self.seed = prompts, per_step, seed

    def position(self, step: int) -> int:
        return step * self.per_step

    def batch(self, step: int) -> list[Prompt]:
        n = len(self.prompts)
        out = []
        for pos in range(self.position(step), self.position(step) + self.per_step):
            epoch, i = divmod(pos, n)
            order = list(range(n))
            random.Random(derived_seed(self.seed, "data", epoch)).shuffle(order)
            out.append(self.prompts[order[i]])
        return out


class Future:
    """A result that one task sets and others await."""

    def __init__(self) -> None:
        self._done = anyio.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def set(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error
        self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def wait(self) -> Any:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class GenerationWorker:
    """Runs generator jobs strictly in submission order (batches, weight pushes, evals)."""

    def __init__(self, tg: anyio.abc.TaskGroup):
        self._send, self._recv = anyio.create_memory_object_stream[tuple[Callable[[], Awaitable[Any]], Future]](math.inf)
        tg.start_soon(self._serve)

    def submit(self, job: Callable[[], Awaitable[Any]]) -> Future:
        fut = Future()
        self._send.send_nowait((job, fut))
        return fut

    async def _serve(self) -> None:
        async with self._recv:
            async for job, fut in self._recv:
                try:
                    fut.set(await job())
                except Exception as e:  # delivered to whoever awaits the job
                    fut.set(error=e)


def split_stale(groups: list[list[Rollout]], version: int, max_off_policy: int) -> tuple[list[list[Rollout]], int, Counter]:
    """Keep rollouts at most `max_off_policy` versions old; groups left with < 2 rollouts go too."""
    staleness = Counter(version - r.policy_version for g in groups for r in g)
    kept = [[r for r in g if version - r.policy_version <= max_off_policy] for g in groups]
    kept = [g for g in kept if len(g) >= 2]
    dropped = sum(len(g) for g in groups) - sum(len(g) for g in kept)
    return kept, dropped, staleness


async def set_rm_scores(p: Parts, rollouts: list[Rollout]) -> None:
    """RM score per policy reply, on the conversation up to it, in one RM call; a rollout's
    `rm_score` is the mean over its replies."""
    inputs = [(r, x) for r in rollouts for x in rm_inputs(p.task, r)]
    scores = await p.reward_model.score([x for _, x in inputs])
    for r in rollouts:
        r.rm_scores = []
    for (r, _), s in zip(inputs, scores):
        r.rm_scores.append(float(s))
    for r in rollouts:
        r.rm_score = statistics.fmean(r.rm_scores)


async def score_batch(p: Parts, batch: Batch) -> None:
    """RM scores, RM-only advantages, then the penalty judge (Dynalize) or reward = RM (baseline)."""
    rollouts = batch.rollouts
    await set_rm_scores(p, rollouts)
    for g in batch.groups:
        mean = statistics.fmean(r.rm_score for r in g)
        for r in g:
            r.rm_advantage = r.rm_score - mean
    if p.penalties is not None:
        await p.penalties.score(batch.step, batch)
    else:
        for r in rollouts:
            r.reward = r.rm_score


def set_advantages(batch: Batch, std_normalize: bool) -> None:
    for g in batch.groups:
        adv = grpo.group_advantages(torch.tensor([[r.reward for r in g]], dtype=torch.float64), std_normalize)
        for r, a in zip(g, adv[0].tolist()):
            r.advantage = a


def _stats(name: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {f"{name}/mean": statistics.fmean(values), f"{name}/std": statistics.pstdev(values),
            f"{name}/min": min(values), f"{name}/max": max(values)}


def batch_metrics(rollouts: list[Rollout]) -> dict[str, float]:
    lengths = [float(sum(r.loss_mask)) for r in rollouts]
    return {
        **_stats("reward", [r.reward for r in rollouts]),
        **_stats("rm", [r.rm_score for r in rollouts]),
        **_stats("advantage", [r.advantage for r in rollouts]),
        "advantage/abs_mean": statistics.fmean(abs(r.advantage) for r in rollouts) if rollouts else 0.0,
        **_stats("gen_len", lengths),
        "truncated_frac": statistics.fmean(r.truncated for r in rollouts) if rollouts else 0.0,
    }


class Trainer:
    """Holds the loop's state; `run` drives the steps."""

    def __init__(self, parts: Parts, start_step: int = 0, inflight: dict[int, list[list[Rollout]]] | None = None,
                 dropped_total: int = 0):
        self.p = parts
        cfg = parts.cfg
        self.order = PromptOrder(parts.task.prompts("train"), cfg.prompts_per_step, cfg.seed)
        self.eval_prompts = parts.task.prompts("eval") if cfg.eval_every else []
        self.start_step = start_step
        self.preloaded = inflight or {}
        self.dropped_total = dropped_total
        self.batches: dict[int, Future] = {}
        self.history: list[dict[str, Any]] = []

    def sampling(self, *seed_parts: Any) -> SamplingParams:
        g = self.p.cfg.generator
        return SamplingParams(max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p,
                              min_p=g.min_p, seed=derived_seed(self.p.cfg.seed, *seed_parts))

    def queue_batch(self, step: int) -> None:
        if step in self.batches:  # batches past the last step are generated too: the final
            return                 # checkpoint keeps them, so extending a run stays exact
        if step in self.preloaded:
            fut = Future()
            fut.set((self.preloaded.pop(step), 0.0))
            self.batches[step] = fut
            return
        prompts = self.order.batch(step)

        async def job():
            t0 = time.perf_counter()
            groups = await sample_groups(self.p.generator, self.p.tokenizer, self.p.task, prompts,
                                         self.p.cfg.group_size, self.sampling("batch", step))
            return groups, time.perf_counter() - t0

        self.batches[step] = self.worker.submit(job)

    async def evaluate(self, version: int) -> dict[str, float]:
        """Held-out replies from the current policy, scored by the task (e.g. sandbox gold)."""
        n = self.p.cfg.eval_samples
        groups = await sample_groups(self.p.generator, self.p.tokenizer, self.p.task, self.eval_prompts, n,
                                     self.sampling("eval"))
        rollouts = [r for g in groups for r in g]
        replies = [r.replies[-1] for r in rollouts]
        prompts = [pr for pr in self.eval_prompts for _ in range(n)]
        metrics = await self.p.task.evaluate(prompts, replies)
        await set_rm_scores(self.p, rollouts)
        metrics = {**metrics, "rm": statistics.fmean(r.rm_score for r in rollouts)}
        append_jsonl(self.p.run.root / "eval" / "task.jsonl", {"version": version, **metrics})
        self.p.run.log_rollouts(version, rollouts, name="eval")
        return {f"eval/{k}": v for k, v in metrics.items()}

    async def run(self) -> list[dict[str, Any]]:
        cfg, p = self.p.cfg, self.p
        (p.run.root / "eval").mkdir(exist_ok=True)
        async with anyio.create_task_group() as tg:
            self.worker = GenerationWorker(tg)
            if self.eval_prompts and self.start_step == 0:
                await self.worker.submit(lambda: self.evaluate(0)).wait()
            with _progress(cfg) as bar:
                task = bar.add_task("training", total=cfg.steps, completed=self.start_step, info="")
                for step in range(self.start_step, cfg.steps):
                    record = await self.step(step, tg)
                    self.history.append(record)
                    bar.update(task, advance=1, info=f"reward {record.get('reward/mean', float('nan')):+.3f}"
                                                     f"  rm {record.get('rm/mean', float('nan')):+.3f}")
            tg.cancel_scope.cancel()  # background proposals still running are not waited for
        return self.history

    async def step(self, step: int, tg: anyio.abc.TaskGroup) -> dict[str, Any]:
        cfg, p = self.p.cfg, self.p
        t_step = time.perf_counter()
        for j in range(step, step + cfg.async_level + 1):
            self.queue_batch(j)

        groups, gen_time = await self.batches.pop(step).wait()
        groups, dropped, staleness = split_stale(groups, p.learner.version, cfg.max_off_policy_steps)
        self.dropped_total += dropped
        if dropped:
            log.warning("dropped stale rollouts", step=step, dropped=dropped, total=self.dropped_total)
        batch = Batch(step=step, groups=groups)

        t0 = time.perf_counter()
        if groups:
            await score_batch(p, batch)
            set_advantages(batch, cfg.trainer.loss.std_normalize)
        score_time = time.perf_counter() - t0
        if p.penalties is not None and groups:
            p.penalties.maybe_propose(step, batch, tg)

        t0 = time.perf_counter()
        train_metrics: dict[str, float] = {}
        if groups:
            seqs = [TrainSequence.from_rollout(r) for r in batch.rollouts]
            train_metrics = await anyio.to_thread.run_sync(p.learner.train_step, seqs)
        train_time = time.perf_counter() - t0

        t0 = time.perf_counter()
        version = p.learner.version

        async def push() -> float:
            t = time.perf_counter()
            await p.generator.update_weights(p.learner.policy_state(), version)
            return time.perf_counter() - t

        sync_time = await self.worker.submit(push).wait()  # queued behind the batches generating
        wait_time = time.perf_counter() - t0 - sync_time

        rollouts = batch.rollouts
        record: dict[str, Any] = {
            "step": step,
            "policy_version": version,
            **batch_metrics(rollouts),
            **train_metrics,
            "staleness": {str(k): v for k, v in sorted(staleness.items())},
            "dropped": dropped,
            "dropped_total": self.dropped_total,
        }
        if p.penalties is not None:
            record.update(p.penalties.metrics())
        if self.eval_prompts and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            record.update(await self.worker.submit(lambda: self.evaluate(version)).wait())
        step_time = time.perf_counter() - t_step
        tokens = sum(len(r.completion_ids) for r in rollouts)
        record.update({
            "time/step": step_time, "time/generate": gen_time, "time/score": score_time,
            "time/train": train_time, "time/weight_sync": sync_time, "time/wait_for_generation": wait_time,
            "rollouts_per_s": len(rollouts) / step_time, "tokens_per_s": tokens / step_time,
        })
        p.run.log_rollouts(step, rollouts)
        p.run.log_metrics(record)
        log.debug("step", **{k: v for k, v in record.items() if not isinstance(v, dict)})

        if (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0) or step + 1 == cfg.steps:
            await self.checkpoint(step + 1)
        return record

    async def checkpoint(self, next_step: int) -> None:
        """Everything needed to continue at `next_step` exactly, including batches generated ahead."""
        p = self.p
        inflight = {k: (await fut.wait())[0] for k, fut in sorted(self.batches.items())}
        state = {
            "step": next_step,
            "data_position": self.order.position(next_step),
            "learner_version": p.learner.version,
            "generator_version": p.generator.version,
            "dropped_total": self.dropped_total,
            "penalties": p.penalties.state_dict() if p.penalties is not None else None,
        }
        save_checkpoint(p.run.checkpoint_path(next_step), p.learner, state, inflight)
        log.info("checkpoint", step=next_step, path=str(p.run.checkpoint_path(next_step)))


def _progress(cfg: RunConfig) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), disable=not cfg.progress,
    )
