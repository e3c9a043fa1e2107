"""What a job did and when: one JSON line per event in the run folder's ``events.jsonl``.

Four writers append to the same file: ``submit`` (``queued``), the supervisor (``started``,
``node_check``, ``qualified``, ``flagged``, ``signal``, ``requeued``, ``restarted``,
``restart_storm``, ``no_restart``, ``ended``: clustertrain.node.supervisor), its watchdog
(``hang``, ``straggler``, ``node_lost``) and the training script's rank 0, through
:func:`record` or the runtime library (``runtime.milestone``: the :data:`MILESTONES`;
``runtime.log_metrics``: ``metrics``; and ``step``, ``epoch``, ``checkpoint``, ``stop``: the
supervisor reads ``checkpoint``'s ``step`` and ``epoch`` to tell a restart storm). Besides
its name, time and attempt, an event holds a few texts and at most :data:`MAX_VALUES`
numbers, each a finite number under a metric's name (:data:`clustertrain.protocol.METRIC_NAME`);
a line with anything else is left out whole.
Each line is one small ``write`` on a file opened for appending, which a local filesystem keeps
whole. The names are :data:`NAMES`;
``plot`` and ``status`` read them back with :func:`read`, which trusts nothing in the file: a run
folder is anyone's.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clustertrain import protocol
from clustertrain.files import RunFolderError, open_regular, parse_json, read_regular
from clustertrain.protocol import METRIC_NAME

# The names of the submit side's, the supervisor's and the watchdog's events, said here once:
# their writers and readers (clustertrain.runs.timeline, plot) use these.
QUEUED, STARTED, NODE_CHECK, SIGNAL = "queued", "started", "node_check", "signal"
QUALIFIED, FLAGGED = "qualified", "flagged"
REQUEUED, RESTARTED, ENDED = "requeued", "restarted", "ended"
HANG, NODE_LOST, CHECKPOINT = "hang", "node_lost", "checkpoint"
STRAGGLER = "straggler"
# The supervisor's end without a restart: restarts that never got past the last checkpoint, and
# a rank's exit with protocol.NO_RESTART_EXIT.
RESTART_STORM, NO_RESTART = "restart_storm", "no_restart"
# In the order a job goes through them.
NAMES = (
    QUEUED,
    STARTED,
    NODE_CHECK,
    QUALIFIED,
    FLAGGED,
    "rendezvous",
    "data_ready",
    "step",
    "metrics",
    "epoch",
    CHECKPOINT,
    SIGNAL,
    "stop",
    REQUEUED,
    HANG,
    STRAGGLER,
    NODE_LOST,
    RESTARTED,
    RESTART_STORM,
    NO_RESTART,
    ENDED,
)
# What a training script says of its start-up, in order: its process group is up, its data is
# ready (start-up ends there, or at its first step). runtime.milestone records them.
MILESTONES = ("rendezvous", "data_ready")
MAX_BYTES = 64 << 20
MAX_VALUES = 64
# A value an event may carry (a step, a loss), as far as a 64-bit integer goes: 1e308 is
# finite, and still breaks every axis drawn of it. Times are bounded by each reader's window.
MAX_MAGNITUDE = 1e18
_TEXTS = ("nodes", "why", "status")
_META = ("time", "event", "attempt")


@dataclass(frozen=True)
class Event:
    time: float
    name: str
    attempt: int
    values: dict[str, Any] = field(default_factory=dict)


def record(name: str, **values: Any) -> None:
    """Append an event for this job (rank 0 only; outside a clustertrain job, nothing)."""
    path = os.environ.get(protocol.ENV_EVENTS_FILE)
    if path and os.environ.get("RANK", "0") == "0":
        append(Path(path), name, _attempt(), **values)


def append(path: Path, name: str, attempt: int = 0, **values: Any) -> None:
    line = {"time": time.time(), "event": name, "attempt": attempt, **values}
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def _attempt() -> int:
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def read(path: Path) -> list[Event]:
    """The well-formed events of ``path`` in file order; anything else is left out."""
    return scan(path)[0]


def scan(
    path: Path,
    start: float = -math.inf,
    end: float = math.inf,
    max_bytes: int = MAX_BYTES,
    within: Path | None = None,
    most: int | None = None,
) -> tuple[list[Event], int]:
    """The well-formed events of ``path`` whose time lies in [start, end], in file order, and
    how many non-empty lines were left out: not an event, a value that is not a finite
    number, or a time outside the window (one line of ``"time": 1e308`` would otherwise
    stretch every timeline drawn from the file to 10^308 seconds). ``within``: the run folder
    that holds ``path``, as :func:`clustertrain.files.open_regular` takes it. With ``most``
    (a picture's points), ``metrics`` lines are thinned as they are read to about that many
    (:func:`_thinned`): a million of them would take a minute to parse, and a plot can show a
    few thousand."""
    try:
        data = read_regular(path, max_bytes, True, within).decode("utf-8", "replace")
    except RunFolderError:
        return [], 0
    lines = data.splitlines()
    found, dropped = [], 0
    for line in _thinned(lines, most) if most else lines:
        event = parse(line)
        if event is not None and start <= event.time <= end:
            found.append(event)
        elif line.strip():
            dropped += 1
    return found, dropped


@dataclass(frozen=True)
class Chunk:
    """What :func:`scan_from` read: the well-formed events, the offset just past the last whole
    line read (where the next read starts), how many non-empty lines were left out, and
    whether the file was found shorter than the offset asked for (cut or replaced)."""

    found: list[Event]
    offset: int
    dropped: int
    shrunk: bool = False


def scan_from(path: Path, offset: int, within: Path | None = None, most: int = 16 << 20) -> Chunk:
    """The events of ``path`` from byte ``offset`` to its last whole line, reading at most
    ``most`` bytes: a reader that keeps the offset (the tracker relay) reads each line once,
    and a line still being written (no newline yet) is left for the next read."""
    try:
        with open_regular(path, within) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < offset:
                return Chunk([], offset, 0, shrunk=True)
            handle.seek(offset)
            data = handle.read(most)
    except RunFolderError:
        return Chunk([], offset, 0)
    whole = data[: data.rfind(b"\n") + 1]
    if not whole and len(data) == most:  # one line longer than a read: no event, skipped
        return Chunk([], offset + most, 1)
    found, dropped = [], 0
    for line in whole.decode("utf-8", "replace").splitlines():
        event = parse(line)
        if event is not None:
            found.append(event)
        elif line.strip():
            dropped += 1
    return Chunk(found, offset + len(whole), dropped)


# How the lines of the events a job says most often look (json.dumps' own separators): a
# cheap test only ever used to skip a line, never to take one.
_FREQUENT = tuple(f'"event": "{name}"' for name in ("metrics", "step"))


def _thinned(lines: list[str], most: int) -> Iterator[str]:
    """``lines`` less all but every k-th ``metrics`` (and ``step``) line, k per kind so that
    about ``most`` of each are kept; the first one of a kind after another event, the last one
    before any line kept, and the very last, are kept too: each stretch of progress starts and
    ends where it did (start-up ends at the first step; the time lost ends at the last)."""
    kinds = [next((k for k, mark in enumerate(_FREQUENT) if mark in line), -1) for line in lines]
    every = [max(1, kinds.count(k) // max(most, 1)) for k in range(len(_FREQUENT))]
    held: dict[int, tuple[int, str]] = {}  # per kind, the last line skipped, and where
    seen = [0] * len(_FREQUENT)
    for number, (line, kind) in enumerate(zip(lines, kinds, strict=True)):
        if kind >= 0:
            seen[kind] += 1
            if seen[kind] > 1 and seen[kind] % every[kind]:
                held[kind] = (number, line)
                continue
            held.pop(kind, None)
        else:
            seen = [0] * len(_FREQUENT)  # after another event, the first of each is kept
        yield from _flushed(held)  # before this line: the events stay in file order
        yield line
    yield from _flushed(held)


def _flushed(held: dict[int, tuple[int, str]]) -> list[str]:
    lines = [line for _, line in sorted(held.values())]
    held.clear()
    return lines


def parse(line: str) -> Event | None:
    """One line of the file as an event; None for anything else (see :func:`scan`)."""
    try:
        raw = parse_json(line, "event")
    except RunFolderError:
        return None
    if not isinstance(raw, dict) or raw.get("event") not in NAMES:
        return None
    when, attempt = raw.get("time"), raw.get("attempt", 0)
    if not _number(when) or not isinstance(attempt, int) or not 0 <= attempt < 10_000:
        return None
    numbers = {k: v for k, v in raw.items() if k not in _META and k not in _TEXTS}
    # A value that is not a finite number under a metric's name drops its event: a picture
    # drawn from half an event would be as wrong as one drawn from a bogus one.
    if len(numbers) > MAX_VALUES or not all(
        METRIC_NAME.fullmatch(k) and _number(v) and abs(v) <= MAX_MAGNITUDE
        for k, v in numbers.items()
    ):
        return None
    texts = {k: raw[k][:200] for k in _TEXTS if isinstance(raw.get(k), str)}
    return Event(float(raw["time"]), raw["event"], attempt, {**numbers, **texts})


def _number(value: Any) -> bool:
    """A finite number that converts to a float: an integer of 400 digits does not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) if isinstance(value, float) else abs(value) < 2**63
