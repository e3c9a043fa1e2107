"""Following a job's log files while it runs: every line, within a second, at any number of files.

A 2,048-node job writes 4,096 node files per attempt (``logs/attempt-K/<node>.{out,err}``). How
the follower learns which of them grew depends on where the run folder lives
(:mod:`clustertrain.runs.follow_mode`): on a local filesystem inotify says so
(:mod:`clustertrain.runs.inotify`); on a shared one (NFS, Lustre), where inotify does not hear what
other nodes write, it polls, and spends its polling where the lines are. Each cycle
(``CYCLE_S``):

- **Polling, files**: each check is one ``stat``; a file that grew is read from its offset. Files
  that grew in the last ``QUIET_AFTER_S`` are checked every cycle; every file, quiet or not, is
  checked once per ``SWEEP_CYCLES`` cycles, a slice of them each cycle, so the cost is even and a
  quiet file's first new line waits at most ``CYCLE_S * SWEEP_CYCLES``.
- **Polling, folders**: a folder is listed again when its mtime changes (a new file), and at least
  every ``RESCAN_S`` whatever its mtime says (an NFS client may cache a folder's attributes).
- **inotify, files**: one watch per folder (the logs folder, each attempt folder), none per file.
  A cycle checks only the files that had events since the last, and those a ``READ_CHUNK`` left
  unfinished. A safety sweep checks every file once per ``SAFETY_S`` (a slice each cycle) and
  lists again each folder whose mtime moved (every folder once per ``RELIST_S``), so an event
  that never came delays a line, never loses it. A queue that overflowed, a folder moved or
  deleted: the next cycle checks every file and lists every folder.
- **inotify, folders**: a new attempt folder is heard in the logs folder's events; it is watched
  first, then listed, so no file made between the two is missed. A logs folder that cannot be
  watched (a symlink, gone), or inotify spent, and the follower polls.
- **Memory**: per file an offset and at most one partial line (``MAX_PARTIAL`` bytes, less what
  its ``\r`` overwrote: a progress bar never ends its line); nothing of the history is kept.
- **The end**: after the job ends, a last pass lists every folder, opens every file and reads
  it to its end (an open makes an NFS client revalidate), so no line is lost to a stale ``stat``
  or a lost event; each folder is opened once for the files in it.

Only regular files inside the run's own ``logs`` folder are read; symlinks are skipped.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from clustertrain import protocol
from clustertrain.files import RunFolderError, open_folder, open_regular, open_regular_at
from clustertrain.runs import bars
from clustertrain.runs.inotify import Watcher

CYCLE_S = 0.25
SWEEP_CYCLES = 3
QUIET_AFTER_S = 5.0
RESCAN_S = 2.0
# With inotify: how long a line can wait for an event that never came (every file checked,
# every folder whose mtime moved listed), and for a folder whose mtime did not show it (a file
# made within the same tick of the filesystem's coarse clock as the last listing).
SAFETY_S = 10.0
SAFETY_CYCLES = round(SAFETY_S / CYCLE_S)
RELIST_S = 60.0
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
        batch = _log_named(str(logs), entry.name, None, job_id)
        if batch is not None and entry.is_file(follow_symlinks=False):
            found.append(batch)
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


def _log_named(folder: str, name: str, attempt: int | None, job_id: str) -> LogFile | None:
    """The log file that ``name`` in ``folder`` would be (the logs folder's batch shell log when
    ``attempt`` is None, else a node's), or None: a name is input, and only these are read."""
    if attempt is None:
        for stream in ("out", "err"):
            if name == f"slurm-{job_id}.{stream}":
                return LogFile(Path(folder, name), 0, "batch", stream)
        return None
    node = _NODE_FILE.fullmatch(name)
    return LogFile(Path(folder, name), attempt, node[1], node[2]) if node else None


def _node_logs(folder: str, attempt: int, known: Container[str] = ()) -> list[LogFile]:
    """The node files in ``folder``, leaving out the ``known`` paths (cheaply: by name)."""
    base = Path(folder)  # each path made from it parses its name alone: 65,536 add up
    return [
        LogFile(base / entry.name, attempt, name[1], name[2])
        for entry in _entries(folder)
        if entry.path not in known
        and (name := _NODE_FILE.fullmatch(entry.name))
        and entry.is_file(follow_symlinks=False)
    ]


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


@dataclass
class _Tracked:
    log: LogFile
    offset: int = 0
    partial: bytes = b""


@dataclass
class Tail:
    """New complete lines of a job's log files, cycle by cycle (see the module's docstring).
    With a ``watcher`` (one inotify instance a follow's tails share) it reads what inotify
    heard; without one, or once its logs folder cannot be watched, it polls."""

    logs: Path
    job_id: str
    wants: Callable[[LogFile], bool]
    clock: Callable[[], float]
    within: Path | None = None  # the run folder: every log is read from inside it
    watcher: Watcher | None = None
    files: dict[str, _Tracked] = field(default_factory=dict)
    _order: list[str] = field(default_factory=list)
    _hot: dict[str, float] = field(default_factory=dict)
    _cursor: int = 0
    _folders: dict[str, int] = field(default_factory=dict)
    _next_rescan: float = float("-inf")
    # inotify's: the watcher's generation this tail last checked every file for, the attempt
    # folders heard of (path: number), the files a READ_CHUNK left unfinished.
    _polling: bool = False
    _generation: int = -1
    _next_safety: float = float("-inf")
    _next_relist: float = float("-inf")
    _attempts: dict[str, int] = field(default_factory=dict)
    _pending: set[str] = field(default_factory=set)

    def poll(self) -> Iterator[tuple[LogFile, bytes]]:
        """One cycle: the files inotify heard of, or by polling the hot ones and a slice."""
        now = self.clock()
        due = self._heard(now)
        watched = due is not None
        if due is None:
            due = self._polled(now)
        hot, files, pending = self._hot, self.files, self._pending
        for path in due:
            try:
                size = os.stat(path, follow_symlinks=False).st_size
            except OSError:
                continue
            tracked = files[path]
            pending.discard(path)
            if size != tracked.offset:
                yield from self._read(tracked, final=False)  # a regular file, or nothing
                if not watched:
                    hot[path] = now
                elif tracked.offset < size:
                    pending.add(path)  # the rest of a READ_CHUNK: no event will say so
            elif path in hot and now - hot[path] > QUIET_AFTER_S:
                del hot[path]

    def finish(self) -> Iterator[tuple[LogFile, bytes]]:
        """After the job: every file opened and read to its end, the last partial lines
        included. Each folder is opened once (as every file would be: from the run folder, never
        through a symlink), and each file in it from its descriptor."""
        self._discover(float("inf"))
        for folder, paths in itertools.groupby(self._order, key=os.path.dirname):
            try:
                fd = open_folder(Path(folder), self.within)
            except RunFolderError:
                continue  # swapped for a symlink, or gone: its files are not read
            try:
                for path in paths:
                    yield from self._read(self.files[path], final=True, folder=fd)
            finally:
                os.close(fd)

    def _polled(self, now: float) -> list[str]:
        """Polling's cycle: new files found, then the hot ones and this cycle's slice."""
        self._discover(now)
        hot = self._hot
        return [*hot, *(p for p in self._slice(SWEEP_CYCLES) if p not in hot)]

    def _slice(self, cycles: int) -> list[str]:
        """The next of ``cycles`` slices of the files, so each is checked once per that many."""
        length = -(-len(self._order) // cycles)
        sweep = self._order[self._cursor : self._cursor + length]
        self._cursor = self._cursor + length if self._cursor + length < len(self._order) else 0
        return sweep

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
            if path := self._track(log):
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

    def _track(self, log: LogFile) -> str | None:
        """Follow ``log`` from now on, if it is new and wanted; its path then."""
        path = str(log.path)
        if path in self.files or not self.wants(log):
            return None
        self.files[path] = _Tracked(log)
        self._order.append(path)
        return path

    def _heard(self, now: float) -> list[str] | None:
        """inotify's cycle: the files written since the last (new ones tracked), those left
        unfinished, and a slice of the safety sweep; every file after a lost event. None where
        there is no inotify to ask: the caller polls."""
        watcher = self.watcher
        if watcher is None or watcher.broken or self._polling:
            return None
        watcher.drain()
        if self._generation != watcher.generation:  # the first cycle, or events lost
            self._generation = watcher.generation
            if not watcher.watch(str(self.logs), self._logs_names()):
                self._polling = True
                return None
            self._rescan(now, every=True)
            return list(self._order)
        due = dict.fromkeys(self._pending)
        if now >= self._next_safety:
            due.update(dict.fromkeys(self._rescan(now, every=now >= self._next_relist)))
        for folder, attempt in [(str(self.logs), None), *self._attempts.items()]:
            for name in sorted(watcher.take(folder) or ()):
                due.update(dict.fromkeys(self._written(folder, name, attempt)))
        due.update(dict.fromkeys(self._slice(SAFETY_CYCLES)))
        return list(due)

    def _logs_names(self) -> re.Pattern[str]:
        """The names heard in the logs folder: attempt folders and the batch shell's logs."""
        batch = re.escape(f"slurm-{self.job_id}.") + r"(?:out|err)"
        return re.compile(f"{ATTEMPT.pattern}|{batch}")

    def _rescan(self, now: float, every: bool) -> list[str]:
        """List the folders again, each attempt folder watched before it is listed: ``every``
        one, or those whose mtime moved since they were last listed. The new files' paths."""
        self._next_safety = now + SAFETY_S
        if every:
            self._next_relist = now + RELIST_S

        def listed(folder: os.DirEntry[str]) -> bool:
            return self._watch_attempt(folder) and self._changed(folder, every)

        new = _scan(self.logs, self.job_id, listed, self.files)
        return [path for log in new if (path := self._track(log))]

    def _watch_attempt(self, folder: os.DirEntry[str]) -> bool:
        number = ATTEMPT.fullmatch(folder.name)
        if number and self.watcher is not None and self.watcher.watch(folder.path, _NODE_FILE):
            self._attempts[folder.path] = int(number[1])
        return True

    def _written(self, folder: str, name: str, attempt: int | None) -> list[str]:
        """The files to check for an event on ``name`` in ``folder``: a new attempt folder's,
        or the file's own if it is a wanted regular file."""
        path = os.path.join(folder, name)
        if attempt is None and (number := ATTEMPT.fullmatch(name)):
            return self._new_attempt(path, int(number[1]))
        if path in self.files:
            return [path]
        log = _log_named(folder, name, attempt, self.job_id)
        if log is None or not self.wants(log) or not _regular(path):
            return []
        return [p for p in [self._track(log)] if p]

    def _new_attempt(self, path: str, number: int) -> list[str]:
        """A new attempt folder's files: watched first, then listed, so no file made between
        the two is missed (one made after is heard)."""
        watcher = self.watcher
        if path in self._attempts or watcher is None or not watcher.watch(path, _NODE_FILE):
            return []  # heard of already, or no folder (a symlink, gone)
        self._attempts[path] = number
        return [p for log in _node_logs(path, number, self.files) if (p := self._track(log))]

    def _read(
        self, tracked: _Tracked, final: bool, folder: int | None = None
    ) -> Iterator[tuple[LogFile, bytes]]:
        """The new complete lines of ``tracked`` (READ_CHUNK at most; with ``final``, all that
        is there, chunk after chunk, and the last partial line), opened in ``folder`` if given
        (its folder's descriptor)."""
        while True:
            size_before = tracked.offset
            yield from self._read_chunk(tracked, final, folder)
            if not final or tracked.offset == size_before:
                return

    def _read_chunk(
        self, tracked: _Tracked, final: bool, folder: int | None
    ) -> Iterator[tuple[LogFile, bytes]]:
        path = tracked.log.path
        try:  # a log replaced by a symlink since it was listed is not read
            handle = (
                open_regular(path, self.within) if folder is None else open_regular_at(folder, path)
            )
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
