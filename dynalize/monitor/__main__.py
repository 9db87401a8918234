"""`python -m dynalize.monitor ROLLOUTS --out DIR`: hack discovery on any RL run's rollouts.

Replays Dynalize's proposer, buffer rules and judge over the rollouts a run logged (plain
JSONL/CSV/parquet, TRL, verl, OpenRLHF: dynalize/monitor/readers.py) and answers "is my run
being hacked, by what, since when": a table of discovered patterns, a run-like output folder the
reports read (metrics.jsonl, rollouts/, penalties.jsonl, report.html) and an exit status.
Nothing of training changes; the policy never sees a penalty.

Run it again on the same --out as the run writes more steps: it continues where it stopped,
exactly as one replay of all steps would. `--follow` polls the rollouts until interrupted:
it waits for them to appear, reads a file being written as far as it is complete, and writes
summary.json and report.html as it goes (`Watch`). Nothing is written before the rollouts and
--out are checked (outdir.py).

Exit status: 0 no discovered pattern is live at the last step, and the latest proposal could have
seen one; 10 one or more are (the reward pays for them now); 11 none is live but the evidence is
insufficient (too few groups or rollouts, rewards tied within groups, or no proposal yet: the line
says which); 2 bad input, an unusable --out or --reward, or a file system error (one line); 3 the judge,
the proposer or the --reward kept failing (the line says which);
1 an unexpected error; 130 interrupted (what was monitored is kept).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..tasks.data import MAX_ROW_CHARS
from .readers import FORMATS

from ..penalties.config import PenaltiesConfig

if TYPE_CHECKING:  # the replay (numpy, scipy) is loaded after the arguments are parsed (`--help` stays quick)
    from .readers import MonitoredRollout, Reading
    from .replay import Monitor
    from .stream import LogTail
    from .vanished import VanishedSteps

MONITOR_DEFAULTS: dict[str, Any] = {"enabled": True, "view_groups": 64, "view_per_group": 64}
"""Over PenaltiesConfig's defaults: the proposer reads whole batches (nothing trains, so a larger
view costs no training time); `view_steps` follows `every` (every rollout since the last proposal)."""


def _weights(text: str) -> list[float]:
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    if not all(math.isfinite(w) for w in weights):
        raise argparse.ArgumentTypeError(f"weights must be finite numbers, got {text!r}")
    return weights


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dynalize.monitor", description=__doc__.splitlines()[0],
                                 epilog="Formats, columns, --follow and exit statuses: docs/monitor.md.")
    ap.add_argument("rollouts", type=Path, help="a rollout file or folder (see --format)")
    ap.add_argument("--out", type=Path, required=True, help="the monitor's folder (created, or continued)")
    ap.add_argument("--format", default="auto", choices=FORMATS, help="what wrote the rollouts (default: detected)")
    ap.add_argument("--column", action="append", default=[], metavar="NAME=COLUMN",
                    help="the column holding step, prompt, completion, messages, reward or group (repeatable)")
    ap.add_argument("--reward-weights", type=_weights, metavar="W1,W2,...",
                    help="TRL: the run's reward_weights, one per reward function in the trainer's order, when "
                    "its output folder holds no training_args.bin to read them from")
    ap.add_argument("--max-row-chars", type=int, default=MAX_ROW_CHARS, metavar="N",
                    help=f"refuse a rollout row longer than N characters (default {MAX_ROW_CHARS:,})")
    ap.add_argument("--config", type=Path, help="YAML with a `penalties:` section (a dynalize run config "
                    "works) or a bare penalties mapping: proposer thresholds, view sizes, judge")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a penalties setting, e.g. --set proposer.lexical.min_effect=0.6 (repeatable)")
    ap.add_argument("--proposer", default=None, metavar="lexical|SPEC",
                    help="`lexical` (LLM-free, default) or an LLM as a chat-model JSON object or YAML file")
    ap.add_argument("--judge", default=None, metavar="regex|SPEC",
                    help="`regex` (default: penalties need a regex) or an LLM judge (chat-model JSON or YAML file)")
    ap.add_argument("--reward", default=None, metavar="MODULE:FUNCTION|URL",
                    help="the run's reward (a TRL reward function, or an HTTP endpoint): each discovered pattern is "
                    "then confirmed by scoring replies edited to remove or add it (docs/monitor.md)")
    ap.add_argument("--every", type=int, help="propose every K monitored steps (step %% K == 0; default 5)")
    ap.add_argument("--merge-steps", type=int, default=1, metavar="K",
                    help="monitor K consecutive logged steps as one (small logged batches, OpenRLHF's one sample a step)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the proposer's sample of each batch")
    ap.add_argument("--domain", default="", help="what the policy is asked to do, shown to an LLM proposer and judge")
    ap.add_argument("--follow", action="store_true",
                    help="keep polling the rollouts for new steps, waiting for them to appear (Ctrl-C stops)")
    ap.add_argument("--poll", type=float, default=30.0, help="--follow: seconds between polls")
    ap.add_argument("--max-polls", type=int, default=None, help="--follow: stop after this many polls")
    ap.add_argument("--no-html", action="store_true", help="skip writing DIR/report.html")
    args = ap.parse_args(argv)
    if args.every is not None and args.every < 1 or args.merge_steps < 1:
        ap.error("--every and --merge-steps must be >= 1")
    if args.max_row_chars < 1 or args.poll < 0 or (args.max_polls or 0) < 0:
        ap.error("--max-row-chars must be >= 1, --poll and --max-polls >= 0")
    return args


def penalties_config(args: argparse.Namespace) -> PenaltiesConfig:
    """The penalty settings: monitor defaults, then --config, --proposer/--judge, --every, --set."""
    import yaml
    from pydantic import ValidationError

    from ..config import _set_dotted, parse_override
    from ..errors import ConfigError, one_line
    from .readers import MonitorInputError

    data: dict[str, Any] = dict(MONITOR_DEFAULTS)
    if args.config is not None:
        try:
            loaded = yaml.safe_load(args.config.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
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
    from .readers import MonitorInputError

    try:
        return read_chat_spec(text, flag)
    except BenchmarkError as e:
        raise MonitorInputError(f"monitor: {e}") from None


def source_of(args: argparse.Namespace) -> dict[str, Any]:
    return {"rollouts": str(args.rollouts), "format": args.format, "columns": list(args.column),
            "merge_steps": args.merge_steps}


def open_monitor(args: argparse.Namespace) -> Monitor | PenaltiesConfig:
    """The monitor --out holds (its settings must not change), or the settings of a new one:
    checked, nothing written (`Watch` starts it once the rollouts read). --out is locked."""
    from .outdir import STATE
    from .readers import MonitorInputError

    if not (args.out / STATE).exists():
        return penalties_config(args)
    from .replay import Monitor

    m = Monitor.load(args.out)
    if args.config or args.overrides or args.proposer or args.judge or args.every:
        wanted = penalties_config(args).model_dump(mode="json")
        if wanted != m.cfg.model_dump(mode="json"):
            raise MonitorInputError(f"monitor: {args.out} was started with other penalty settings "
                                    f"(see its config.yaml): continue without them, or use a new --out")
    if m.source.get("merge_steps", 1) != args.merge_steps:
        raise MonitorInputError(f"monitor: {args.out} was started with --merge-steps {m.source.get('merge_steps')}")
    return m


def columns(args: argparse.Namespace) -> dict[str, str]:
    from .readers import MonitorInputError

    out = {}
    for item in args.column:
        name, sep, col = item.partition("=")
        if not sep or not name or not col:
            raise MonitorInputError(f"monitor: --column expects NAME=COLUMN, got {item!r}")
        out[name.strip()] = col.strip()
    return out


def input_signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    """Name, size and modification time of every data file at `path`: equal at two polls means
    the run wrote nothing in between."""
    from .readers import DATA_SUFFIXES

    try:
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in DATA_SUFFIXES)
        return tuple((str(p), (st := p.stat()).st_size, st.st_mtime_ns) for p in files if p.is_file())
    except OSError:
        return ()


class Watch:
    """One invocation: --out and the settings checked, --out locked, then polls of the rollouts
    into the monitor folder. Nothing is written before the rollouts read without a problem (the
    folder made to hold the lock is removed again if nothing was)."""

    def __init__(self, args: argparse.Namespace):
        from ..errors import ConfigError
        from ..folderlock import hold_folder
        from .outdir import out_problem
        from .readers import MonitorInputError, ReadOptions

        self.args = args
        self.options: ReadOptions = ReadOptions(columns(args), args.reward_weights, args.max_row_chars,
                                                growing=args.follow)
        if (problem := out_problem(args.out, args.rollouts)) is not None:
            raise MonitorInputError(f"monitor: {problem}")
        self.reward = None
        if args.reward is not None:  # checked before anything is written, as a judge's endpoint is
            from .reward import load_reward, preflight

            self.reward = load_reward(args.reward)
            preflight(self.reward, args.reward)
        try:  # one writer per folder (dynalize.folderlock): the folder is made, empty, to hold the lock
            self.lock = hold_folder(args.out, "monitor folder --out")
        except ConfigError as e:  # held by another process
            raise MonitorInputError(f"monitor: {str(e).removeprefix('config error: ')}") from None
        try:
            opened = open_monitor(args)
        except BaseException:
            self.lock.release(remove_created=True)
            raise
        self.m: Monitor | None = None if isinstance(opened, PenaltiesConfig) else opened
        if self.m is not None:
            self.confirm(self.m)
        self.cfg = opened if self.m is None else self.m.cfg
        self.last_signature: tuple | None = None
        self.said: set[str] = set()
        self.done = 0
        self._vanished: VanishedSteps | None = None
        self.tail: LogTail | None = None
        """A JSONL log read step by step (stream.py); None: the log is read whole at each poll."""

    def release(self) -> None:
        """Let go of --out's lock; remove the folder made for it when nothing was written."""
        self.lock.release(remove_created=self.m is None)

    def say(self, line: str) -> None:
        """Print a waiting line once."""
        if line not in self.said:
            self.said.add(line)
            console().print(f"[dim]{line}[/]", highlight=False)

    def poll(self) -> int:
        """Read the rollouts and monitor their new steps; the steps monitored. Following, the
        newest step waits for a later one, or for the files to stay unchanged over a poll (the
        run stopped writing: its last step is complete), or for TRL to say training finished."""
        import anyio

        from .readers import by_step

        if (log := self.jsonl_log()) is not None:
            return self.poll_stream(*log)
        follow = self.args.follow
        before = input_signature(self.args.rollouts) if follow else None
        quiet = follow and before == self.last_signature
        reading = self.read(quiet)
        if reading is None:
            return 0
        steps = by_step(reading.rollouts, self.args.merge_steps)
        if self.m is not None:
            self.m.check_unchanged(steps)
        after = input_signature(self.args.rollouts) if follow else None
        self.last_signature = after
        finished = reading.final_step is not None and max(r.step for r in reading.rollouts) >= reading.final_step
        complete = quiet and before == after and not reading.waiting  # nothing half-written left
        hold = follow and not complete and not finished
        if self.m is None:
            from .replay import Monitor

            self.m = Monitor(self.args.out, self.cfg, seed=self.args.seed, domain=self.args.domain)
            self.confirm(self.m)
            self.m.start(source_of(self.args))
        if follow and (line := self.vanished().check(reading.files, set(self.m.done))):  # a rotating writer
            console().print(f"[yellow]{line}[/]", highlight=False, soft_wrap=True)  # one line, never wrapped
        n = anyio.run(monitor_once, self.m, steps, hold)
        self.done += n
        if n and follow:
            write_outputs(self.m, self.args)
        return n

    def confirm(self, m: Monitor) -> None:
        """With --reward: every candidate the proposer offers is confirmed with it (penalties.witness)."""
        if self.reward is None:
            return
        from ..penalties.discovery import level
        from ..penalties.witness import ConfirmingProposer, Witness

        lexical = m.cfg.proposer.lexical
        m.term.proposer = ConfirmingProposer(m.term.proposer, Witness(self.reward, seed=self.args.seed),
                                             lambda k: level(lexical, k))

    def jsonl_log(self) -> tuple[list[Path], Any] | None:
        """A plain or verl JSONL log's files and row reader (read step by step: stream.py), else None
        (read whole). Once streaming, the log stays a JSONL log (a poll before its files appear waits)."""
        from .readers import MonitorInputError, NotYetError, jsonl_log

        try:
            log = jsonl_log(self.args.rollouts, self.args.format, self.options)
        except NotYetError as e:
            if self.tail is None:
                return None  # the whole read says what is awaited, or refuses
            if not self.args.follow:
                raise
            self.say(f"waiting: {str(e).removeprefix('monitor: ')}")
            return [], None
        if log is None and self.tail is not None:
            raise MonitorInputError(f"monitor: {self.args.rollouts} now holds files other than JSONL, which were "
                                    f"read line by line so far: monitor it into a new --out")
        return log

    def poll_stream(self, files: list[Path], rollout: Any) -> int:
        """Monitor the steps the lines appended to `files` since the last poll complete; the steps
        monitored. The newest step waits for a later one, or (following) for the files to stay
        unchanged over a poll with no line left half-written."""
        from .stream import LogTail

        follow = self.args.follow
        if self.tail is None:
            self.tail = LogTail(self.options, self.args.merge_steps)
        before = input_signature(self.args.rollouts) if follow else None
        quiet = follow and before == self.last_signature
        n = 0
        if files:
            for step, rows in self.tail.steps(files, rollout, "wait" if follow and not quiet else
                                              "try" if follow else "strict"):
                n += self.monitor_step(step, rows)
        after = input_signature(self.args.rollouts) if follow else None
        self.last_signature = after
        if not follow or quiet and before == after and not self.tail.waiting:
            if (last := self.tail.flush()) is not None:
                n += self.monitor_step(*last)
        for line in self.tail.waiting:
            self.say(f"waiting: {line}")
        if follow and self.m is not None and (line := self.vanished().check(files, set(self.m.done))):
            console().print(f"[yellow]{line}[/]", highlight=False, soft_wrap=True)
        self.done += n
        if n and follow:
            write_outputs(self.m, self.args)
        return n

    def monitor_step(self, step: int, rows: list[MonitoredRollout]) -> int:
        """One complete step of a streamed log: refused if its rows changed since it was monitored,
        skipped if it was, else monitored (the monitor folder started at the first)."""
        import anyio

        if self.m is None:
            from .replay import Monitor

            self.m = Monitor(self.args.out, self.cfg, seed=self.args.seed, domain=self.args.domain)
            self.confirm(self.m)
            self.m.start(source_of(self.args))
        self.m.check_unchanged({step: rows})
        return anyio.run(monitor_once, self.m, {step: rows}, False)

    def vanished(self) -> VanishedSteps:
        """The steps whose files vanished before they were read (vanished.py), for this invocation."""
        from .readers import detect_format
        from .vanished import VanishedSteps

        if self._vanished is None:
            fmt = detect_format(self.args.rollouts) if self.args.format == "auto" else self.args.format
            self._vanished = VanishedSteps(self.args.out, fmt, self.args.merge_steps)
        return self._vanished

    def read(self, quiet: bool) -> Reading | None:
        """The rollouts, or None while following and there are none yet (a line says what is
        awaited). Once the files were quiet over a poll, a last line without its newline is
        taken when it reads whole (a writer that ends no line), else still awaited."""
        from dataclasses import replace

        from .readers import MonitorInputError, NotYetError, read_source

        reading: Reading | None = None
        try:
            reading = read_source(self.args.rollouts, self.args.format, self.options)
            waiting = reading.waiting
        except NotYetError as e:
            if not self.args.follow:
                raise
            waiting = [str(e).removeprefix("monitor: ")]
        if waiting and quiet:
            try:
                return read_source(self.args.rollouts, self.args.format, replace(self.options, growing=False))
            except MonitorInputError:
                pass
        for line in waiting:
            self.say(f"waiting: {line}")
        return reading


async def monitor_once(m: Monitor, steps: dict[int, list[MonitoredRollout]], hold_last: bool) -> int:
    """Monitor every new step (the newest held back with `hold_last`); the steps done."""
    last_done = max(m.done) if m.done else None
    todo = [s for s in steps if last_done is None or s > last_done]
    if hold_last and todo:
        todo = todo[:-1]
    for s in todo:
        metrics = await m.step(s, steps[s])
        console().print(f"step {s}: {metrics['rollouts']} rollouts, reward {metrics['reward/mean']:.3f}, "
                        f"{int(metrics['penalties/active'])} live pattern(s)")
        if (why := m.stop_reason()) is not None:
            raise StoppedError(why)
    return len(todo)


class StoppedError(RuntimeError):
    """The judge or proposer kept failing: the monitor stops (exit 3) with this line."""


def console():
    """Rich output on stderr; redirected to a log, wide enough that the table's rows stay whole."""
    from rich.console import Console

    return Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def write_outputs(m: Monitor, args: argparse.Namespace) -> None:
    """summary.json and report.html as of the last monitored step, each written whole."""
    import json

    from .outdir import write_atomic
    from .summary import co_travellers, last_evidence, patterns, summary_json

    from .vanished import with_vanished

    last, found = patterns(m.out)
    evidence = last_evidence(m.out)
    summary = summary_json(last, found, evidence, co_travellers(m.out))
    write_atomic(m.out / "summary.json", json.dumps(with_vanished(summary, m.out), indent=1))
    if not args.no_html and last is not None:
        from ..analysis.html import render_page
        from ..analysis.runs import Run

        write_atomic(m.out / "report.html", render_page([Run(m.out)]))


def report(m: Monitor, args: argparse.Namespace) -> int:
    from .summary import co_travellers, exit_status, last_evidence, patterns, summary_table, verdict

    last, found = patterns(m.out)
    evidence = last_evidence(m.out)
    console().print(summary_table(last, found))
    for c in co_travellers(m.out):  # what the reward's confirmation kept out of the buffer
        console().print(f"step {c['step']}: {c['title']!r} {c['said']}", highlight=False, soft_wrap=True)
    console().print(verdict(last, found, evidence))
    from .vanished import note

    if said := note(m.out):
        console().print(f"[yellow]warning: {said}[/]", highlight=False, soft_wrap=True)
    write_outputs(m, args)
    return exit_status(found, evidence, last)


def filesystem_line(e: OSError, out: Path) -> str | None:
    """One line for a full disk, a read-only folder or a path that is not a folder, naming the
    path (the --out folder when the error does not say); None for any other error."""
    import errno

    from ..runlog import FILESYSTEM_ERRORS

    if e.errno not in FILESYSTEM_ERRORS | {errno.ENOENT}:
        return None
    where = f"{e.filename or out}: "
    return (f"monitor: file system error: {where}{e.strerror or e} (what was monitored before is kept: "
            f"fix the cause, then run the same command again)")


def remember_ctrl_c() -> tuple[list[bool], Any]:
    """Ctrl-C raises KeyboardInterrupt as always, and is remembered (the list fills), so a library
    that absorbs it (a task that takes the event loop's cancellation for its own) cannot keep a
    --follow monitor running; and the handler it replaced (None: none replaced). Only where Python's
    own handler is in place: a process started with Ctrl-C ignored keeps ignoring it."""
    import threading

    seen: list[bool] = []
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return seen, None

    def interrupted(signum, frame):
        seen.append(True)
        raise KeyboardInterrupt

    return seen, signal.signal(signal.SIGINT, interrupted)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ..errors import ConfigError
    from .readers import NotYetError

    watch = None
    ctrl_c, replaced = remember_ctrl_c()
    try:
        watch = Watch(args)
        watch.poll()
        polls = 0
        while args.follow and (args.max_polls is None or polls < args.max_polls):
            if ctrl_c:  # pressed during a poll and absorbed there
                raise KeyboardInterrupt
            time.sleep(args.poll)
            polls += 1
            watch.poll()
        if ctrl_c:
            raise KeyboardInterrupt
        if watch.m is None:  # following, and the rollouts never appeared
            raise NotYetError(f"monitor: no rollouts at {args.rollouts} after {polls} poll(s); nothing written")
        status = report(watch.m, args)
        from .replay import append_note

        append_note(args.out, {"time": time.time(), "steps_monitored": watch.done, "exit": status, **source_of(args)})
        return status
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    except StoppedError as e:
        print(f"monitor stopped: {e}", file=sys.stderr)
        return 3
    except OSError as e:
        if (line := filesystem_line(e, args.out)) is None:
            raise
        print(line, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if watch is not None and watch.m is not None:
            report(watch.m, args)
            print("monitor interrupted: what was monitored is kept; run again to continue", file=sys.stderr)
        else:
            print("monitor interrupted before any rollout was read: nothing written", file=sys.stderr)
        return 130
    finally:
        if watch is not None:
            watch.release()
        if replaced is not None:
            signal.signal(signal.SIGINT, replaced)


if __name__ == "__main__":
    sys.exit(main())
