"""The lexical proposer's work in a process of its own (`penalties.proposer.lexical.runs_in: process`).

A proposal is CPU work in Python and numpy (features, permutation tests). In a thread of the
training process it holds the interpreter lock much of the time, so the training steps it
overlaps run slower (TRL's step time, docs/from_trl.md). In a process of its own it takes a core
of its own instead, as a GPU node has to spare.

The worker is one `python -m dynalize.penalties.worker` child per proposer, started at its first
proposal and reused. It reads pickled requests on stdin and writes pickled replies on stdout; it
ends when its stdin closes, so a training process that dies, however it dies, takes it along. It
never runs the user's script again (multiprocessing's spawn, and anyio's process workers, import
the main module in the child: an unguarded TRL script would start training there). A candidate's
last veto (`LexicalProposer.accept`: the reward's confirmation, penalties.witness) stays in the
training process: the worker asks for it, candidate by candidate, and waits for the answer.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import IO, Any, Callable

from .candidate import Candidate, ProposalResult

PROTOCOL = pickle.HIGHEST_PROTOCOL


class ProposerProcessError(RuntimeError):
    """The worker ended or sent what is not a reply: the proposal fails (counted), the next one
    starts a fresh worker."""


def send_message(stream: IO[bytes], message: Any) -> None:
    """One pickled message, flushed (the two ends' protocol: penalties.worker reads and writes these)."""
    pickle.dump(message, stream, protocol=PROTOCOL)
    stream.flush()


class ProposerProcess:
    """`best(cfg, view, accept)`: `LexicalProposer(cfg).best(view)` computed in the worker, as its
    ProposalResult (the candidate in `accepted`); `accept` (or None) is asked in this process for
    each candidate the worker would accept. One proposal at a time (a lock)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.started = 0
        """Workers started: the first at the first proposal (its imports, a few seconds, delay that
        proposal, never a step; a rank that never proposes starts none), a fresh one after each that ended."""

    def start(self) -> int:
        """Start the worker now, if none runs; its process id (to pin it to a core, say)."""
        with self._lock:
            return self._worker().pid

    def _worker(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        import dynalize

        root = str(Path(dynalize.__file__).resolve().parents[1])  # the same dynalize as this process's
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self._proc = subprocess.Popen([sys.executable, "-m", "dynalize.penalties.worker"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=env)  # stderr: this process's (its log lines)
        weakref.finalize(self, _close, self._proc, True)  # garbage-collected, or this process exits
        self.started += 1
        return self._proc

    def best(self, cfg: Any, view: Any, accept: Callable[[Candidate], bool] | None) -> ProposalResult:
        with self._lock:
            proc = self._worker()
            try:
                self._post(proc, ("propose", cfg, view, accept is not None))
                while (reply := self._receive(proc))[0] == "accept?":  # the last veto, asked here
                    candidate = reply[1]
                    self._post(proc, (bool(accept(candidate)) if accept is not None else True, candidate))
            except BaseException:  # mid-exchange (a veto that raised, Ctrl-C): the worker waits for what never comes
                self.close(kill=True)
                raise
            if reply[0] == "error":
                raise ProposerProcessError(reply[1])
            return reply[1]

    def _post(self, proc: subprocess.Popen[bytes], message: Any) -> None:
        try:
            assert proc.stdin is not None
            send_message(proc.stdin, message)
        except OSError as e:
            raise self._ended(proc, e) from None

    def _receive(self, proc: subprocess.Popen[bytes]) -> tuple:
        try:
            assert proc.stdout is not None
            reply = pickle.load(proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError) as e:
            raise self._ended(proc, e) from None
        if not isinstance(reply, tuple) or not reply or reply[0] not in ("accept?", "done", "error"):
            raise self._ended(proc, ValueError(f"not a reply: {type(reply).__name__}"))
        return reply

    def _ended(self, proc: subprocess.Popen[bytes], e: BaseException) -> ProposerProcessError:
        try:
            code: int | None = proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        return ProposerProcessError(f"the proposer's process ended during a proposal (exit {code}; "
                                    f"{type(e).__name__}: {e})")

    def close(self, kill: bool = False) -> None:
        if self._proc is not None:
            _close(self._proc, kill)
            self._proc = None


def _close(proc: subprocess.Popen[bytes], kill: bool = False) -> int | None:
    """End the worker: close its stdin (it ends once idle; killed past 10 s, or at once with `kill`)."""
    if kill:
        proc.kill()
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
