"""The sandbox experiment's analysis arm: a Dynalize run whose false penalties are blocked.

    python benchmarks/sandbox_oracle_run.py --config configs/sandbox_dynalize.yaml [key=value ...]

The same command line as `python -m dynalize.run`, with one change: the lexical proposer gets a
veto (`LexicalProposer.accept`) that turns down every candidate whose regex matches no planted
feature of the run's `task.args.features` (the benchmark's matching, `sandbox_table.match_feature`),
so it proposes its best candidate that does match one. Comparing this arm's gold with the plain
Dynalize run of the same seed measures what the false penalties cost. The proposer itself never
sees the list; this arm is an analysis, never a way to train.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sandbox_table import clean_replies, match_feature  # noqa: E402

import dynalize.build  # noqa: E402
from dynalize.penalties.lexical import LexicalProposer  # noqa: E402
from dynalize.run import main, parse_args, resolve_config  # noqa: E402
from dynalize.tasks.base import task_class  # noqa: E402
from dynalize.tasks.sandbox import Feature  # noqa: E402  (the benchmark may know the list)


def oracle(features: list[Feature]):
    """A veto that accepts a candidate only when its regex matches one of `features`."""
    base = clean_replies(features)
    return lambda candidate: match_feature(candidate.regex, features, base)[0] is not None


def run(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = resolve_config(args)
    features = task_class(cfg.task.name).Args.model_validate(cfg.task.args).features
    dynalize.build.LexicalProposer = functools.partial(LexicalProposer, accept=oracle(features))
    return main(argv)


if __name__ == "__main__":
    sys.exit(run())
