"""Every rank's output, read from the run folder and prefixed with its node and rank.

Layout written by the batch script: ``logs/slurm-<id>.{out,err}`` for the batch shell and
``logs/attempt-<K>/<node>.{out,err}`` for each node's launcher, whose lines torchrun and
accelerate prefix with ``[rank<N>]: ``. Only regular files inside the run's own ``logs`` folder
are read; symlinks are skipped, so a crafted run folder cannot point ``logs`` elsewhere.
The tee's pieces are put back into each writer's lines, and a progress bar shows as its last
state (:mod:`clustertrain.runs.bars`). What follows a rank's failure is folded to a line per run
unless asked for raw (:mod:`clustertrain.runs.fold`).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from clustertrain import protocol
from clustertrain.files import RunFolderError, open_regular, printable, read_regular
from clustertrain.jobstate import JobState
from clustertrain.runs import Run, bars, fold, folderstate, follow_mode, tasks
from clustertrain.runs.follow import (
    ATTEMPT,
    CYCLE_S,
    MAX_PARTIAL,
    LogFile,
    Tail,
    list_log_files,
)
from clustertrain.runs.inotify import Watcher

# torchelastic's failure report (ChildFailedError), which torchrun and accelerate print: a
# heading, then a field a line. Read line by line, each pattern anchored to its field's name:
# one regular expression across the whole text (three lazy ".*?" with DOTALL) backtracked for
# over a minute on 46 kB of a rank's stderr.
_CAUSE_LINES = 40  # the report's fields follow its heading within these
_CAUSE_FIELDS = {
    "time": re.compile(r"\btime\s*: (\S+)"),
    "rank": protocol.REPORT_RANK,
    "exit": protocol.REPORT_EXIT,
}
# A log's end is where a failure is reported, and a log may be gigabytes: its tail is read.
_TAIL_BYTES = 1 << 20
# srun's words when Slurm declares a node of the step down (NODE_FAIL).
_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)", re.MULTILINE)
# The scheduler is not cheap to poll (Slurm's docs warn against squeue loops); files are
# (clustertrain.runs.follow).
STATE_POLL_S = 3.0


@dataclass(frozen=True)
class Filter:
    rank: int | None = None
    node: str | None = None
    errors: bool = False
    # Every line as written (each rank's, put back together), nothing folded or collapsed.
    raw: bool = False

    def wants_file(self, log: LogFile) -> bool:
        return (not self.errors or log.stream == "err") and (
            self.node is None or log.node == self.node
        )

    def wants_rank(self, rank: int | None) -> bool:
        return self.rank is None or rank == self.rank

    def words(self) -> list[str]:
        """``logs``' options that select what this selects (for a login node's clustertrain)."""
        words = ["--rank", str(self.rank)] if self.rank is not None else []
        words += ["--node", self.node] if self.node else []
        return words + [flag for flag, on in (("--errors", self.errors), ("--raw", self.raw)) if on]


def log_files(run: Run) -> list[LogFile]:
    """The job's log files, attempt by attempt: the batch shell first, then each node."""
    return list_log_files(run.logs_dir, run.job_id)


class _Reader:
    """One log file's lines in order, put back together, labelled, filtered and, unless raw,
    each bar to its last state and the consequences of a failure folded. ``progress`` hears
    the bars still moving."""

    def __init__(
        self, run: Run, log: LogFile, filters: Filter, prefix: str, progress: bars.Progress | None
    ) -> None:
        self.log, self.filters, self.prefix, self.progress = log, filters, prefix, progress
        try:
            where = str(log.path.relative_to(run.path))
        except ValueError:
            where = str(log.path)
        self.splitter = bars.Splitter()
        self.collapser = bars.Collapser(hold=not filters.raw)
        self.folder = None if filters.raw else fold.Folder(printable(where))

    def feed(self, line: str) -> Iterator[str]:
        for said in self.splitter.feed(line):
            yield from self._collapsed(said)

    def finish(self) -> Iterator[str]:
        for said in self.splitter.finish():
            yield from self._collapsed(said)
        yield from self._folded(self.collapser.finish())
        yield from self._shown(self.folder.finish() if self.folder is not None else [])

    def _collapsed(self, line: bars.Line) -> Iterator[str]:
        done, moving = self.collapser.feed(line)
        yield from self._folded(done)
        if moving is not None and self.progress is not None and self._wanted(moving):
            self.progress(self._key(moving), self._text(moving), moving.text)

    def _folded(self, lines: Iterable[bars.Line]) -> Iterator[str]:
        if self.folder is not None:
            lines = [shown for line in lines for shown in self.folder.feed(line)]
        return self._shown(lines)

    def _shown(self, lines: Iterable[bars.Line]) -> Iterator[str]:
        for line in lines:
            if self._wanted(line):
                if self.progress is not None:
                    self.progress(self._key(line), None, "")  # its bar, if any, is done
                yield self._text(line)

    def _wanted(self, line: bars.Line) -> bool:
        """A line this filter selects: a bar is progress, never among --errors."""
        bar = self.filters.errors and bars.is_bar(line.text)
        return self.filters.wants_rank(line.rank) and not bar

    def _key(self, line: bars.Line) -> str:
        """``node1 rank3``: whose line."""
        node = self.log.node
        if line.rank is not None:
            return f"{self.prefix}{node} rank{line.rank}"
        if line.local is not None:
            return f"{self.prefix}{node} local{line.local}"
        return self.prefix + (node if node == "batch" else f"{node} launcher")

    def _text(self, line: bars.Line) -> str:
        """``node1 rank3 | text``, ``!`` for stderr's lines but a bar's."""
        err = self.log.stream == "err" and not bars.is_bar(line.text)
        return f"{self._key(line)} {'!' if err else '|'} {printable(line.text)}"


def hang(run: Run) -> str | None:
    """What the watchdog said of the newest attempt that hung (clustertrain.node.watchdog)."""
    found = None
    if run.logs_dir.is_symlink():
        return None
    for folder in _numbered(run.logs_dir, ATTEMPT):
        # The steps restarted after a hang in order (heartbeats-hung-K), then the last one.
        hung = _numbered(folder, re.compile(re.escape(protocol.HEARTBEAT_DIR) + r"-hung-(\d+)"))
        for beats in [*hung, folder / protocol.HEARTBEAT_DIR]:
            if beats.is_symlink():
                continue
            try:
                said = read_regular(beats / protocol.HANG_FILE, 64 << 10, within=run.folder)
            except RunFolderError:
                continue
            found = said.decode("utf-8", "replace").strip() or found
    return printable(found) if found else None


def _numbered(folder: Path, name: re.Pattern[str]) -> list[Path]:
    """The subfolders of ``folder`` whose names ``name`` matches, by the number it captures."""
    try:
        found = [
            (m, p)
            for p in folder.iterdir()
            if (m := name.fullmatch(p.name)) and not p.is_symlink()  # never out of the run
        ]
    except OSError:
        return []
    return [p for m, p in sorted(found, key=lambda pair: int(pair[0][1]))]


def root_cause(lines: list[str]) -> dict[str, tuple[str, ...]] | None:
    """The fields of the first failure report among ``lines`` that has them all (time, rank
    and local rank, exit code), each field's captured words; None without one."""
    for at, line in enumerate(lines):
        if protocol.REPORT_ROOT not in line:
            continue
        found: dict[str, tuple[str, ...]] = {}
        for below in lines[at + 1 : at + 1 + _CAUSE_LINES]:
            for name, pattern in _CAUSE_FIELDS.items():
                if name not in found and (match := pattern.search(below)):
                    found[name] = match.groups()
        if len(found) == len(_CAUSE_FIELDS):
            return found
    return None


# What the batch script (setup lines) and each node's launch script (node_setup lines) print
# when one of the job's setup lines fails (templates/slurm/sbatch.sh.j2, launch.sh.j2).
_SETUP_FAILED = re.compile(
    r"clustertrain: (?:node_)?setup line [0-9]{1,4} failed (?:on \S{1,64} )?\(exit [0-9]{1,3}\): .*"
)


def setup_line(lines: Iterable[str]) -> str | None:
    """Which of the job's setup lines failed, and how, as the last of ``lines`` (a log's
    tail: the batch shell's, or a node launcher's) that says so; None if none does."""
    found = [line for line in lines if _SETUP_FAILED.fullmatch(line)]
    return printable(found[-1].removeprefix("clustertrain: "))[:300] if found else None


def lost_nodes(run: Run) -> list[str]:
    """The nodes Slurm declared failed under the job's steps, as srun reported them in the
    batch shell's log, every attempt's, in order."""
    path = run.logs_dir / f"slurm-{run.job_id}.err"
    try:
        text = read_regular(path, 1 << 20, True, run.folder).decode("utf-8", "replace")
    except RunFolderError:
        return []
    return list(dict.fromkeys(printable(node) for node in _NODE_FAILURE.findall(text)))


def _views(run: Run) -> list[tuple[str, Run]]:
    """What to read: the job, or each task of a sweep with a ``task K `` prefix."""
    return [(f"task {t.task_number} ", t) for t in tasks(run)] or [("", run)]


def read_all(run: Run, filters: Filter) -> Iterator[str]:
    for prefix, view in _views(run):
        for log in log_files(view):
            if not filters.wants_file(log):
                continue
            reader = _Reader(run, log, filters, prefix, None)
            for line in _lines(log.path, view.folder):
                yield from reader.feed(line)
            yield from reader.finish()


def _lines(path: Path, within: Path) -> Iterator[str]:
    """The lines of a log (:func:`bars.read_lines`), never through a symlink: a log may be
    gigabytes, or planted."""
    try:
        handle = open_regular(path, within)
    except RunFolderError:
        return
    with handle:
        yield from bars.read_lines(handle, MAX_PARTIAL)


def follow(
    run: Run,
    filters: Filter,
    job_state: Callable[[], JobState],
    out: TextIO,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] | None = None,
) -> JobState:
    """Print new lines from every log as they are written, until the job ends; return its state.
    ``say`` hears when the scheduler cannot be reached, and when it is back. On a terminal the
    bars still moving are drawn in place below them, once a cycle (:class:`bars.Board`);
    elsewhere a bar is printed once, its last state, as reading the logs afterwards does."""
    board = bars.Board(out, live=out.isatty() and os.environ.get("TERM") != "dumb")

    def nap(seconds: float) -> None:
        board.draw()
        sleep(seconds)

    def told(message: str) -> None:
        board.close()  # stderr's line goes below the board, which is drawn again next cycle
        (say or _say)(message)

    progress = board.update if board.live else None
    lines = follow_lines(run, filters, job_state, clock, nap, told, progress)
    try:
        while True:
            try:
                board.print(next(lines))
            except StopIteration as end:
                return end.value  # type: ignore[no-any-return]
    finally:
        board.close()


def follow_lines(
    run: Run,
    filters: Filter,
    job_state: Callable[[], JobState],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] | None = None,
    progress: bars.Progress | None = None,
) -> Generator[str, None, JobState]:
    """Yield new lines from every log as they are written, until the job ends; the generator's
    return value is the final state.

    Only complete lines are yielded; a final pass after the job ends catches the last ones.
    How the files are watched or polled, at any number of them: :mod:`clustertrain.runs.follow`
    (which of the two: :mod:`clustertrain.runs.follow_mode`, whose ``$CLUSTERTRAIN_FOLLOW``
    is checked here). While ``job_state`` raises
    :class:`~clustertrain.errors.SchedulerUnreachable`, the run folder says when the job ends
    (:class:`clustertrain.runs.folderstate.Watch`). ``say`` (by default stderr) hears when the
    scheduler cannot be reached and when it is back, and once if inotify cannot be had.
    ``progress`` hears each bar while it moves.
    """
    watch = folderstate.Watch(run, job_state, say or _say, clock)
    watcher = follow_mode.watcher(run.logs_dir, say or _say)
    try:
        return (yield from _followed(run, filters, watch, watcher, clock, sleep, progress))
    finally:
        if watcher is not None:
            watcher.close()


def _followed(
    run: Run,
    filters: Filter,
    watch: folderstate.Watch,
    watcher: Watcher | None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    progress: bars.Progress | None,
) -> Generator[str, None, JobState]:
    """:func:`follow_lines`' loop, with what it watches the files with (None: polling)."""
    tails = [
        (p, Tail(v.logs_dir, v.job_id, filters.wants_file, clock, v.folder, watcher))
        for p, v in _views(run)
    ]
    readers: dict[Path, _Reader] = {}

    def formatted(prefix: str, found: Iterator[tuple[LogFile, bytes]]) -> Iterator[str]:
        for log, raw in found:
            if log.path not in readers:
                readers[log.path] = _Reader(run, log, filters, prefix, progress)
            yield from readers[log.path].feed(raw.decode("utf-8", "replace"))

    next_state = clock()
    while True:
        for prefix, tail in tails:
            yield from formatted(prefix, tail.poll())
        if clock() >= next_state:
            state = watch.state()
            if state.finished:
                for prefix, tail in tails:
                    yield from formatted(prefix, tail.finish())
                for reader in readers.values():
                    yield from reader.finish()
                return state
            next_state = clock() + watch.wait_s(STATE_POLL_S)
        sleep(CYCLE_S)


def _say(message: str) -> None:
    print(f"clustertrain: {printable(message)}", file=sys.stderr, flush=True)
