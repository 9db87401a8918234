"""The lexical proposer's worker process (penalties.process starts it: `runs_in: process`).

One proposal per request read from stdin (the settings, the view, and whether a last veto is to
be asked), its result (the candidate in `accepted`) written to stdout, until stdin closes. The veto is asked of
the training process, candidate by candidate. Whatever prints goes to stderr, never into a reply.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import IO, Any

from .candidate import Candidate, ProposalResult
from .lexical import LexicalProposer
from .process import send_message


class _ParentGone(BaseException):
    """The training process is gone (its pipes closed): the worker ends, quietly."""


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The worker's loop: one proposal per request, until stdin closes."""

    def exchange(message: tuple) -> Any:
        try:
            send_message(replies, message)
            return pickle.load(requests) if message[0] == "accept?" else None
        except (OSError, EOFError):
            raise _ParentGone from None

    def accept(c: Candidate) -> bool:
        verdict, answered = exchange(("accept?", c))
        c.__dict__.update(answered.__dict__)  # what the veto wrote on it (its confirmation)
        return verdict

    while True:
        try:
            _, cfg, view, vetoed = pickle.load(requests)
        except (OSError, EOFError):
            return
        try:
            result = ProposalResult(step=view.step)
            result.accepted = LexicalProposer(cfg, accept if vetoed else None).best(view, result)
            message: tuple = ("done", result)
        except Exception as e:  # noqa: BLE001 - a proposal's failure is the training process's to count
            message = ("error", f"{type(e).__name__}: {e}")
        except _ParentGone:
            return
        try:
            exchange(message)
        except _ParentGone:
            return


def main() -> None:
    import argparse
    import signal

    argparse.ArgumentParser(prog="python -m dynalize.penalties.worker", description=(
        "The lexical proposer's worker (penalties.proposer.lexical.runs_in: process): started by the training "
        "process, never by hand. It reads pickled proposals on stdin and writes pickled results on stdout, "
        "and ends when stdin closes.")).parse_args()

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the training process's to handle
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # whatever prints goes to stderr, never into a reply
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
