"""Following a job's log files while it runs: every line, within a second, at any number of files.

A 2,048-node job writes 4,096 node files per attempt (``logs/attempt-K/<node>.{out,err}``),
and run folders live on shared filesystems (NFS, Lustre), where inotify does not see what other
nodes write. So the follower polls, and spends its polling where the lines are:

- **Files**: each check is one ``stat``; a file that grew is read from its offset. Files that
  grew in the last ``QUIET_AFTER_S`` are checked every cycle (``CYCLE_S``); every file, quiet
  or not, is checked once per ``SWEEP_CYCLES`` cycles, a slice of them each cycle, so the cost
  is even and a quiet file's first new line waits at most ``CYCLE_S * SWEEP_CYCLES``.
- **Folders**: a folder is listed again when its mtime changes (a new file), and at least every
  ``RESCAN_S`` whatever its mtime says (an NFS client may cache a folder's attributes).
- **Memory**: per file an offset and at most one partial line (``MAX_PARTIAL`` bytes, less what
  its ``\r`` overwrote: a progress bar never ends its line); nothing of the history is kept.
- **The end**: after the job ends, a last pass opens every file and reads it to its end (an
  open makes an NFS client revalidate), so no line is lost to a stale ``stat``.

Only regular files inside the run's own ``logs`` folder are read; symlinks are skipped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from clustertrain import protocol
from clustertrain.files import RunFolderError, open_regular
from clustertrain.runs import bars

CYCLE_S = 0.25
SWEEP_CYCLES = 3
QUIET_AFTER_S = 5.0
RESCAN_S = 2.0
MAX_PARTIAL = 1 << 20
# At most this much of one file is read at a time: a log that grew by a gigabyte is read over
# several cycles (the rest at the next), never held whole.
READ_CHUNK = 8 << 20
ATTEMPT = re.compile(re.escape(protocol.ATTEMPT_DIR) + r"(\d+)")
_NODE_FILE = re.compile(r"([A-Za-z0-9._-]+)\.(out|err)")


@dataclass(frozen=True)
class LogFile:
    """One log file: whose lines (``node``, or ``batch`` for the batch shell) and which stream."""

    path: Path
    attempt: int
    node: str
    stream: str

    @property
    def key(self) -> tuple[int, bool, str, bool]:
        return (self.attempt, self.node != "batch", self.node, self.stream != "out")


def list_log_files(logs: Path, job_id: str) -> list[LogFile]:
    """Every log file of a job, attempt by attempt: the batch shell first, then each node."""
    return _scan(logs, job_id, lambda folder: True)


def _scan(
    logs: Path,
    job_id: str,
    list_attempt: Callable[[os.DirEntry[str]], bool],
    known: Container[str] = (),
) -> list[LogFile]:
    """The log files under ``logs`` (never through a symlinked ``logs``), in order; node files
    only from the attempt folders ``list_attempt`` accepts, leaving out the ``known`` ones."""
    if logs.is_symlink() or not logs.is_dir():
        return []
    found: list[LogFile] = []
    for entry in _entries(str(logs)):
        found.extend(_batch_log(entry, job_id))
        attempt = ATTEMPT.fullmatch(entry.name)
        if attempt and entry.is_dir(follow_symlinks=False) and list_attempt(entry):
            found.extend(_node_logs(entry.path, int(attempt[1]), known))
    return sorted(found, key=lambda log: log.key)


def _entries(folder: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError:
        return []


def _batch_log(entry: os.DirEntry[str], job_id: str) -> list[LogFile]:
    for stream in ("out", "err"):
        if entry.name == f"slurm-{job_id}.{stream}" and entry.is_file(follow_symlinks=False):
            return [LogFile(Path(entry.path), 0, "batch", stream)]
    return []


def _node_logs(folder: str, attempt: int, known: Container[str] = ()) -> list[LogFile]:
    """The node files in ``folder``, leaving out the ``known`` paths (cheaply: by name)."""
    return [
        LogFile(Path(entry.path), attempt, name[1], name[2])
        for entry in _entries(folder)
        if entry.path not in known
        and (name := _NODE_FILE.fullmatch(entry.name))
        and entry.is_file(follow_symlinks=False)
    ]


@dataclass
class _Tracked:
    log: LogFile
    offset: int = 0
    partial: bytes = b""


@dataclass
class Tail:
    """New complete lines of a job's log files, cycle by cycle (see the module's docstring)."""

    logs: Path
    job_id: str
    wants: Callable[[LogFile], bool]
    clock: Callable[[], float]
    within: Path | None = None  # the run folder: every log is read from inside it
    files: dict[str, _Tracked] = field(default_factory=dict)
    _order: list[str] = field(default_factory=list)
    _hot: dict[str, float] = field(default_factory=dict)
    _cursor: int = 0
    _folders: dict[str, int] = field(default_factory=dict)
    _next_rescan: float = float("-inf")

    def poll(self) -> Iterator[tuple[LogFile, bytes]]:
        """One cycle: look for new files, then check the hot ones and this cycle's slice."""
        now = self.clock()
        self._discover(now)
        slice_len = -(-len(self._order) // SWEEP_CYCLES)
        sweep = self._order[self._cursor : self._cursor + slice_len]
        self._cursor = (
            self._cursor + slice_len if self._cursor + slice_len < len(self._order) else 0
        )
        hot, files = self._hot, self.files
        for path in [*hot, *(p for p in sweep if p not in hot)]:
            try:
                size = os.stat(path, follow_symlinks=False).st_size
            except OSError:
                continue
            tracked = files[path]
            if size != tracked.offset:
                hot[path] = now
                yield from self._read(tracked, final=False)  # a regular file, or nothing
            elif path in hot and now - hot[path] > QUIET_AFTER_S:
                del hot[path]

    def finish(self) -> Iterator[tuple[LogFile, bytes]]:
        """After the job: every file read to its end, the last partial lines included."""
        self._discover(float("inf"))
        for path in self._order:
            yield from self._read(self.files[path], final=True)

    def _discover(self, now: float) -> None:
        """Add new files. The logs folder holds a handful of entries and is listed every cycle;
        an attempt folder only when its mtime moved, or when a rescan is due."""
        rescan = now >= self._next_rescan
        if rescan:
            self._next_rescan = now + RESCAN_S
        new = _scan(
            self.logs, self.job_id, lambda folder: self._changed(folder, rescan), self.files
        )
        first = not self._order
        for log in new:
            path = str(log.path)
            if path not in self.files and self.wants(log):
                self.files[path] = _Tracked(log)
                self._order.append(path)
                # A file that appears while the job runs is about to be written; the ones there
                # at the start are read once now, like every file, and swept after that.
                self._hot[path] = now if not first else float("-inf")

    def _changed(self, folder: os.DirEntry[str], rescan: bool) -> bool:
        try:
            mtime = folder.stat(follow_symlinks=False).st_mtime_ns
        except OSError:
            return False
        seen = self._folders.get(folder.path)
        self._folders[folder.path] = mtime
        return rescan or seen != mtime

    def _read(self, tracked: _Tracked, final: bool) -> Iterator[tuple[LogFile, bytes]]:
        """The new complete lines of ``tracked`` (READ_CHUNK at most; with ``final``, all that
        is there, chunk after chunk, and the last partial line)."""
        while True:
            size_before = tracked.offset
            yield from self._read_chunk(tracked, final)
            if not final or tracked.offset == size_before:
                return

    def _read_chunk(self, tracked: _Tracked, final: bool) -> Iterator[tuple[LogFile, bytes]]:
        try:  # a log replaced by a symlink since it was listed is not read
            handle = open_regular(tracked.log.path, self.within)
        except RunFolderError:
            return
        with handle:
            info = os.fstat(handle.fileno())
            if info.st_size < tracked.offset:
                tracked.offset, tracked.partial = 0, b""  # truncated: start again
            handle.seek(tracked.offset)
            chunk = tracked.partial + handle.read(READ_CHUNK)
            tracked.offset = handle.tell()
            at_end = tracked.offset >= info.st_size
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if len(rest) > MAX_PARTIAL and b"\r" in rest:
            rest = bars.unerased(rest)  # a bar redrawn on one line: its last state is enough
        if rest and ((final and at_end) or len(rest) > MAX_PARTIAL):
            lines.append(rest)
            rest = b""
        tracked.partial = rest
        for raw in lines:
            yield tracked.log, raw
