"""Folding what follows a rank's failure, so that a failed job's logs read in one screen.

When one rank raises, the rest of the job reports the consequences at length: every launcher
prints torchelastic's ``ChildFailedError`` traceback and failure report, c10d prints C++ stack
frames for each closed store connection, the launchers that Slurm then stops print a
``SignalException`` traceback, and the other ranks' collectives end with "Connection closed by
peer". Seen on a 2-node MNIST job: ~190 such lines around the two that said what went wrong.

A :class:`Folder` reads one log file's lines in order and replaces each run of such lines of one
writer (a rank, or the launcher) with one line that counts them and names the file. Everything
else passes through unchanged, a rank's own traceback included, and a progress bar
(:func:`clustertrain.runs.bars.is_bar`) is no part of any run. A traceback is held until its
exception line decides whether it is a consequence; a folded run until the writer's next line
that is not part of it, or the end of the file. The decision depends only on the lines, never on
how they were split into reads, so following a job prints what reading it afterwards does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from clustertrain.runs.bars import Line, is_bar

TRACEBACK = "Traceback (most recent call last):"
# Python's words between the tracebacks of one chain: the chain is folded or shown as a whole.
_CHAINING = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
# What a rank says when it fails only because a peer died first (gloo, NCCL, c10d store).
PEER_FAILED = re.compile(
    r"Connection closed by peer|remote worker crash|Connection reset|"
    r"NCCL communicator was aborted|recvValueWithTimeout failed"
)
# c10d's warning when the store's host went away ("[W1204 23:20:35.03 TCPStore.cpp:138] [c10d]
# recvValueWithTimeout failed on SocketImpl(...): Failed to recv, got 0 bytes. ..."), and the C++
# stack frames that c10d prints after it (torch 2.x).
_C10D_LOST = re.compile(
    r"^\[[WE]\d{4} [^\]]*\] \[c10d\] .*(?:Failed to recv|Broken pipe|Connection reset)"
)
_C10D_FRAMES = re.compile(
    r"^Exception raised from \S+ at |^frame #\d+: |^<omitting python frames>$"
)
# torchelastic's notices while it stops the ranks of a failed group: one line each, folded only
# inside a run they continue.
_STOPPING = re.compile(
    r"closing signal SIG[A-Z]+$|has failed to shutdown the rendezvous|"
    r"has failed to send a keep-alive heartbeat"
)
# Lines that only follow a failure, wherever they stand, and what to call them: Slurm's words of
# the steps and tasks it ended (srun's "task 0: Exited with exit code 1", slurmstepd's "STEP
# 42.0 ... CANCELLED"; a job's own end, DUE TO TIME LIMIT and the like, is no consequence), and
# torch's words once NCCL's first error has been said (ProcessGroupNCCL.cpp).
CONSEQUENCE_LINES = (
    (re.compile(r"^srun: error: \S+: tasks? [\d,-]+: (?:Exited with exit code \d+|Killed|"
                r"Terminated)$|^srun: (?:Job step aborted|launch/slurm: _step_signal|"
                r"error: Timed out waiting for job step)|"
                r"\*\*\* STEP \S+ ON \S+ CANCELLED AT \S+ \*\*\*$"),
     "Slurm's stop of the steps"),
    (re.compile(r"Some NCCL operations have failed or timed out|"
                r"we are taking the entire process down|"
                r"Process group watchdog thread terminated with exception|"
                r"\[PG [^]]*\] (?:Aborting|Abort) communicators?"),
     "NCCL's abort after the first error"),
)  # fmt: skip
# torchelastic's log tailer, when a rank's log ended under it at exit: an error line, then its
# traceback (torch/distributed/elastic/multiprocessing/tail_log.py: logger.exception).
LOG_TAILER = re.compile(r"\berror in log tailer for \S+")
# An exception line that ends a traceback which is only a consequence, and what to call it.
_CONSEQUENCES = (
    (re.compile(r"^torch\.distributed\.elastic\.multiprocessing\.errors\.ChildFailedError:"),
     "a launcher's failure report"),
    (re.compile(r"^torch\.distributed\.elastic\.multiprocessing\.api\.SignalException:"),
     "a launcher stopped by a signal"),
    (re.compile(r"RendezvousConnectionError:|^torch\.distributed\.DistNetworkError: .*"
                r"(?:Failed to recv|Broken pipe|Connection reset)"),
     "a lost rendezvous store"),
    (PEER_FAILED, "a lost peer"),
)  # fmt: skip
_REPORT_RULE = re.compile(r"^=+$")
# Bounds on what is held: a traceback whose exception line never comes is shown, and a report
# whose closing rule never comes stops being folded.
MAX_HELD = 500
MIN_FOLDED = 3


@dataclass
class _Writer:
    """What one writer of the file has in hand: an open folded run (its count, kinds and first
    lines, never the whole of it) and a pending traceback."""

    count: int = 0
    head: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    # Whether the last traceback was folded, while only blank and chaining lines follow it; and
    # that fate once a chaining line says the next traceback belongs to the same chain.
    last: bool | None = None
    chained: bool | None = None
    inherited: bool | None = None
    report_rules: int = 0

    def run_ended(self) -> bool:
        """An open run that no traceback or report in progress may still extend."""
        return bool(self.count) and not self.pending and not self.report_rules

    def fold(self, texts: list[str], kind: str | None) -> None:
        self.count += len(texts)
        self.head.extend(texts[: MIN_FOLDED - len(self.head)])
        if kind is not None and kind not in self.kinds:
            self.kinds.append(kind)


def _lines(key: tuple[int | None, int | None], texts: list[tuple[str, int]]) -> Iterator[Line]:
    return (Line(key[0], key[1], text, folded) for text, folded in texts)


def _kind(exception_line: str) -> str | None:
    for pattern, kind in _CONSEQUENCES:
        if pattern.search(exception_line):
            return kind
    return None


_TAILER = "a launcher's log tailer"


def _line_kind(text: str) -> str | None:
    """What a line that is not part of a traceback is a consequence of, if it is one."""
    if _C10D_FRAMES.match(text):
        return "c10d stack frames"
    if _C10D_LOST.match(text):
        return "a lost peer"
    if LOG_TAILER.search(text):
        return _TAILER
    return next((kind for pattern, kind in CONSEQUENCE_LINES if pattern.search(text)), None)


def _ends_traceback(text: str) -> bool:
    """A traceback's exception line: Python indents every frame, source and caret line."""
    return bool(text) and not text[0].isspace() and text != TRACEBACK


class Folder:
    """One log file's lines in, the same lines out with consequence runs folded (see above).

    ``where`` names the file in the summary line, as the reader finds it in the run folder.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self._writers: dict[tuple[int | None, int | None], _Writer] = {}

    def feed(self, line: Line) -> Iterator[Line]:
        if is_bar(line.text):
            # A progress bar says nothing of a failure: it neither ends a traceback (as its
            # exception line would) nor closes a run.
            yield line
            return
        key = (line.rank, line.local)
        writer = self._writers.setdefault(key, _Writer())
        shown = self._step(writer, line.text)
        if shown:
            # The file has moved on: another writer's finished run is summed up where it ended,
            # not at the end of the file.
            for other_key, other in self._writers.items():
                if other is not writer and other.run_ended():
                    yield from _lines(other_key, self._close(other))
        yield from _lines(key, shown)

    def finish(self) -> Iterator[Line]:
        """The end of the file: what is still held, as it would be shown."""
        for key, writer in self._writers.items():
            held, writer.pending = writer.pending, []
            yield from _lines(key, [*self._close(writer), *((t, 0) for t in held)])
        self._writers.clear()

    def _step(self, writer: _Writer, text: str) -> list[tuple[str, int]]:
        if writer.pending:
            return self._in_traceback(writer, text)
        if writer.report_rules:
            writer.fold([text], None)
            writer.report_rules -= bool(_REPORT_RULE.match(text))
            if writer.count > MAX_HELD:
                writer.report_rules = 0
            return []
        if text == TRACEBACK:
            writer.pending, writer.inherited, writer.chained = [text], writer.chained, None
            return []
        if text in _CHAINING:
            writer.chained = writer.last
        elif text.strip():
            writer.last = writer.chained = None
            kind = _line_kind(text)
            if kind == _TAILER:  # its traceback, next, is the tailer's: folded with it
                writer.chained = True
            if kind is None and not (writer.count and _STOPPING.search(text)):
                return [*self._close(writer), (text, 0)]
            writer.fold([text], kind)
            return []
        # A blank or chaining line belongs to the run it follows, if any.
        if writer.count:
            writer.fold([text], None)
            return []
        return [(text, 0)]

    def _in_traceback(self, writer: _Writer, text: str) -> list[tuple[str, int]]:
        writer.pending.append(text)
        if not _ends_traceback(text) and len(writer.pending) <= MAX_HELD:
            return []
        held, writer.pending = writer.pending, []
        kind = _kind(text) if _ends_traceback(text) else None
        folds = writer.inherited if writer.inherited is not None else kind is not None
        writer.last = folds
        if not folds:
            return [*self._close(writer), *((t, 0) for t in held)]
        writer.fold(held, kind)
        if kind == "a launcher's failure report":
            writer.report_rules = 2  # the report sits between two rules of "="
        return []

    def _close(self, writer: _Writer) -> list[tuple[str, int]]:
        count, head, kinds = writer.count, writer.head, writer.kinds
        writer.count, writer.head, writer.kinds, writer.report_rules = 0, [], [], 0
        if count < MIN_FOLDED:
            return [(text, 0) for text in head]
        what = ", ".join(kinds) or "consequences"
        return [
            (f"... {count} lines folded ({what}); see them with --raw or in {self.where}", count)
        ]
