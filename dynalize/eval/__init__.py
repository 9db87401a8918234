"""Benchmark protocols on saved checkpoints: EQ-Bench Creative Writing v3 (`eqbench`) and MindEval
(`mindeval`), read from local checkouts of the benchmarks (never shipped here), and the resumable
checkpoint driver behind `python -m dynalize.eval`. See docs/evaluation.md."""

from .checkpoints import evaluate_run, find_checkpoints
from .common import Benchmark, BenchmarkError, BenchResult, bootstrap_ci
from .policy import PolicySampler, load_policy

__all__ = ["BenchResult", "Benchmark", "BenchmarkError", "PolicySampler", "bootstrap_ci", "evaluate_run",
           "find_checkpoints", "load_policy"]
