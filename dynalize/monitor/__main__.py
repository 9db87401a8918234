"""`python -m dynalize.monitor ROLLOUTS --out DIR`: hack discovery on any RL run's rollouts.

Replays Dynalize's proposer, buffer rules and judge over the rollouts a run logged (plain
JSONL/CSV/parquet, TRL, verl, OpenRLHF: dynalize/monitor/readers.py) and answers "is my run
being hacked, by what, since when": a table of discovered patterns, a run-like output folder the
reports read (metrics.jsonl, rollouts/, penalties.jsonl, report.html) and an exit status.
Nothing of training changes; the policy never sees a penalty.

Run it again on the same --out as the run writes more steps: it continues where it stopped,
exactly as one replay of all steps would. `--follow` polls the rollouts until interrupted.

Exit status: 0 no discovered pattern is live at the last step, and the latest proposal could have
seen one; 10 one or more are (the reward pays for them now); 11 none is live but the evidence is
insufficient (too few groups or rollouts, rewards tied within groups, or no proposal yet: the line
says which); 2 bad input; 3 the judge or proposer kept failing (the line says which);
1 an unexpected error; 130 interrupted (what was monitored is kept).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import yaml
from rich.console import Console

from pydantic import ValidationError

from ..config import _set_dotted, parse_override
from ..errors import ConfigError, one_line
from ..folderlock import hold_folder
from ..penalties.config import PenaltiesConfig
from ..runlog import filesystem_problem
from .readers import FORMATS, MonitorInputError, by_step, read_rollouts
from .replay import STATE, Monitor, append_note
from .summary import exit_status, last_evidence, patterns, summary_json, summary_table, verdict

console = Console(stderr=True)

MONITOR_DEFAULTS: dict[str, Any] = {"enabled": True, "view_groups": 64, "view_per_group": 64}
"""Over PenaltiesConfig's defaults: the proposer reads whole batches (nothing trains, so a larger
view costs no training time); `view_steps` follows `every` (every rollout since the last proposal)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dynalize.monitor", description=__doc__.splitlines()[0],
                                 epilog="Formats and columns: docs/monitor.md.")
    ap.add_argument("rollouts", type=Path, help="a rollout file or folder (see --format)")
    ap.add_argument("--out", type=Path, required=True, help="the monitor's folder (created, or continued)")
    ap.add_argument("--format", default="auto", choices=FORMATS, help="what wrote the rollouts (default: detected)")
    ap.add_argument("--column", action="append", default=[], metavar="NAME=COLUMN",
                    help="the column holding step, prompt, completion, messages, reward or group (repeatable)")
    ap.add_argument("--config", type=Path, help="YAML with a `penalties:` section (a dynalize run config "
                    "works) or a bare penalties mapping: proposer thresholds, view sizes, judge")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a penalties setting, e.g. --set proposer.lexical.min_effect=0.6 (repeatable)")
    ap.add_argument("--proposer", default=None, metavar="lexical|SPEC",
                    help="`lexical` (LLM-free, default) or an LLM as a chat-model JSON object or YAML file")
    ap.add_argument("--judge", default=None, metavar="regex|SPEC",
                    help="`regex` (default: penalties need a regex) or an LLM judge (chat-model JSON or YAML file)")
    ap.add_argument("--every", type=int, help="propose every K monitored steps (step %% K == 0; default 5)")
    ap.add_argument("--merge-steps", type=int, default=1, metavar="K",
                    help="monitor K consecutive logged steps as one (small logged batches, OpenRLHF's one sample a step)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the proposer's sample of each batch")
    ap.add_argument("--domain", default="", help="what the policy is asked to do, shown to an LLM proposer and judge")
    ap.add_argument("--follow", action="store_true", help="keep polling the rollouts for new steps (Ctrl-C stops)")
    ap.add_argument("--poll", type=float, default=30.0, help="--follow: seconds between polls")
    ap.add_argument("--max-polls", type=int, default=None, help="--follow: stop after this many polls")
    ap.add_argument("--no-html", action="store_true", help="skip writing DIR/report.html")
    args = ap.parse_args(argv)
    if args.every is not None and args.every < 1 or args.merge_steps < 1:
        ap.error("--every and --merge-steps must be >= 1")
    return args


def penalties_config(args: argparse.Namespace) -> PenaltiesConfig:
    """The penalty settings: monitor defaults, then --config, --proposer/--judge, --every, --set."""
    data: dict[str, Any] = dict(MONITOR_DEFAULTS)
    if args.config is not None:
        try:
            loaded = yaml.safe_load(args.config.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as e:
            raise MonitorInputError(f"monitor: --config {args.config}: {str(e).splitlines()[0]}") from None
        if not isinstance(loaded, dict):
            raise MonitorInputError(f"monitor: --config {args.config}: expected a mapping")
        data.update(loaded.get("penalties", loaded))
        data["enabled"] = True
    if args.proposer not in (None, "lexical"):
        data["proposer"] = {**(data.get("proposer") or {}), "engine": "llm", "chat": _spec(args.proposer, "--proposer")}
    elif args.proposer == "lexical":
        data["proposer"] = {**(data.get("proposer") or {}), "engine": "lexical"}
    if args.judge not in (None, "regex"):
        data["judge"] = {**(data.get("judge") or {}), "engine": "llm", "chat": _spec(args.judge, "--judge")}
    elif args.judge == "regex":
        data["judge"] = {**(data.get("judge") or {}), "engine": "regex"}
    if args.every is not None:
        data["every"] = args.every
    if "view_steps" not in data:
        data["view_steps"] = int(data.get("every", PenaltiesConfig.model_fields["every"].default))
    try:
        for item in args.overrides:
            _set_dotted(data, *parse_override(item))
        return PenaltiesConfig.model_validate(data)
    except ConfigError as e:
        raise MonitorInputError(f"monitor: {e}") from None
    except ValidationError as e:
        raise MonitorInputError(f"monitor: {one_line(e, prefix='penalties')}") from None


def _spec(text: str, flag: str) -> dict[str, Any]:
    from ..eval.common import BenchmarkError, read_chat_spec

    try:
        return read_chat_spec(text, flag)
    except BenchmarkError as e:
        raise MonitorInputError(f"monitor: {e}") from None


def source_of(args: argparse.Namespace) -> dict[str, Any]:
    return {"rollouts": str(args.rollouts), "format": args.format, "columns": list(args.column),
            "merge_steps": args.merge_steps}


def open_monitor(args: argparse.Namespace) -> Monitor:
    """A new monitor folder, or the one --out holds (its settings must not change)."""
    if (args.out / STATE).exists():
        m = Monitor.load(args.out)
        if args.config or args.overrides or args.proposer or args.judge or args.every:
            wanted = penalties_config(args).model_dump(mode="json")
            if wanted != m.cfg.model_dump(mode="json"):
                raise MonitorInputError(f"monitor: {args.out} was started with other penalty settings "
                                        f"(see its config.yaml): continue without them, or use a new --out")
        if m.source.get("merge_steps", 1) != args.merge_steps:
            raise MonitorInputError(f"monitor: {args.out} was started with --merge-steps {m.source.get('merge_steps')}")
        return m
    if args.out.exists() and any(args.out.iterdir()):
        raise MonitorInputError(f"monitor: {args.out} exists and is not a monitor folder: choose a new --out")
    m = Monitor(args.out, penalties_config(args), seed=args.seed, domain=args.domain)
    m.start(source_of(args))
    return m


def columns(args: argparse.Namespace) -> dict[str, str]:
    out = {}
    for item in args.column:
        name, sep, col = item.partition("=")
        if not sep or not name or not col:
            raise MonitorInputError(f"monitor: --column expects NAME=COLUMN, got {item!r}")
        out[name.strip()] = col.strip()
    return out


async def monitor_once(m: Monitor, args: argparse.Namespace, hold_last: bool) -> int:
    """Monitor every new step of the rollouts (the newest held back with `hold_last`); steps done."""
    steps = by_step(read_rollouts(args.rollouts, args.format, columns(args)), args.merge_steps)
    m.check_unchanged(steps)
    last_done = max(m.done) if m.done else None
    todo = [s for s in steps if last_done is None or s > last_done]
    if hold_last and todo:
        todo = todo[:-1]
    for s in todo:
        metrics = await m.step(s, steps[s])
        console.print(f"step {s}: {metrics['rollouts']} rollouts, reward {metrics['reward/mean']:.3f}, "
                      f"{int(metrics['penalties/active'])} live pattern(s)")
        if (why := m.stop_reason()) is not None:
            raise StoppedError(why)
    return len(todo)


class StoppedError(RuntimeError):
    """The judge or proposer kept failing: the monitor stops (exit 3) with this line."""


def report(m: Monitor, args: argparse.Namespace) -> int:
    last, found = patterns(m.out)
    evidence = last_evidence(m.out)
    console.print(summary_table(last, found))
    line = verdict(last, found, evidence)
    console.print(line)
    (m.out / "summary.json").write_text(json.dumps(summary_json(last, found, evidence), indent=1), encoding="utf-8")
    if not args.no_html and last is not None:
        from ..analysis.html import write_html_report
        from ..analysis.runs import Run

        write_html_report([Run(m.out)], m.out / "report.html")
    return exit_status(found, evidence)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    m = None
    try:
        lock = hold_folder(args.out, "monitor folder --out")  # one writer per folder (dynalize.folderlock)
    except (ConfigError, OSError) as e:  # held by another process, not a folder, a read-only parent
        print(f"monitor: {filesystem_problem(e, 'nothing was written') or str(e).removeprefix('config error: ')}",
              file=sys.stderr)
        return 2
    try:
        m = open_monitor(args)
        done = anyio.run(monitor_once, m, args, args.follow)
        polls = 0
        while args.follow and (args.max_polls is None or polls < args.max_polls):
            time.sleep(args.poll)
            polls += 1
            done += anyio.run(monitor_once, m, args, True)
        status = report(m, args)
        append_note(m.out, {"time": time.time(), "steps_monitored": done, "exit": status, **source_of(args)})
        return status
    except MonitorInputError as e:
        print(str(e), file=sys.stderr)
        return 2
    except StoppedError as e:
        print(f"monitor stopped: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        if m is not None:
            report(m, args)
        print("monitor interrupted: what was monitored is kept; run again to continue", file=sys.stderr)
        return 130
    finally:
        lock.release(remove_created=m is None)


if __name__ == "__main__":
    sys.exit(main())
