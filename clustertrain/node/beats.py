"""The ranks' heartbeats, read: each rank's newest step, when it got there, its totals so far.

:mod:`clustertrain.rank.runtime` writes them (the format: ``protocol.BEAT_PREFIX``); this is
their one reader, for the watchdog at every poll (a hang, the straggler scores) and for
``clustertrain top`` (two readings, what moved between them). They are read as input, as anyone
who can write the run folder may have crafted them: never through a symlink, a few hundred bytes
at most, a file that is not a heartbeat left out, a node's name kept only if it is one.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from clustertrain import protocol
from clustertrain.files import RunFolderError, open_regular, read_regular

# A rank's number as the writer spells it: no leading zero (two files never name one rank), and
# six digits at most, more ranks than any job has.
BEAT_FILE = re.compile(rf"{re.escape(protocol.BEAT_PREFIX)}(0|[1-9][0-9]{{0,5}})")
# The node of a rank whose node file is missing (not written yet) or holds no node's name: never
# a name protocol.NODE_NAME accepts, so never taken for a node.
UNKNOWN = "?"
# The writer's line is 63 bytes (three fields of 20 characters), a node's name at most 64.
BEAT_BYTES, NODE_BYTES = 256, 128


@dataclass(frozen=True)
class Beat:
    """A rank's heartbeat as read: its newest step, when (the file's mtime), its totals so far."""

    rank: int
    node: str  # UNKNOWN where its node file names none
    step: int
    time: float
    compute_s: float = 0.0  # the running total in runtime.compute() sections
    samples: int = 0


def read(
    folder: Path, within: Path | None = None, nodes: MutableMapping[int, str] | None = None
) -> dict[int, Beat]:
    """Every rank's heartbeat in ``folder``, by rank; with ``within`` (the run folder that holds
    ``folder``), no part of a path below it is followed through a symlink either. ``nodes``, kept
    by a caller that reads again and again (the watchdog polls every few seconds), holds the
    nodes' names read so far: each is read once, and a rank whose name is not there yet is asked
    again next time."""
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    found = {}
    for name in names:
        if not (match := BEAT_FILE.fullmatch(name)):
            continue
        rank = int(match[1])
        try:
            line = _line(folder / name, within)
        except (OSError, RunFolderError, UnicodeDecodeError, ValueError):
            continue
        found[rank] = Beat(rank, _node(folder / name, rank, within, nodes), *line)
    return found


def _line(path: Path, within: Path | None) -> tuple[int, float, float, int]:
    """The step, the mtime, the compute seconds (0 where not a finite number) and the samples
    (both 0 where an older runtime did not write them; a later one's further fields are left);
    ValueError where it is no heartbeat."""
    with open_regular(path, within) as handle:
        when = os.fstat(handle.fileno()).st_mtime
        data = handle.read(BEAT_BYTES + 1)
    words = data.decode().split()
    if not words or len(data) > BEAT_BYTES:
        raise ValueError(f"{path}: not a heartbeat")
    compute = float(words[1]) if len(words) > 1 else 0.0
    samples = int(words[2]) if len(words) > 2 else 0
    return int(words[0]), when, compute if math.isfinite(compute) else 0.0, samples


def _node(
    beat: Path, rank: int, within: Path | None, nodes: MutableMapping[int, str] | None
) -> str:
    """The rank's node, from ``nodes`` or its node file; UNKNOWN where that names none."""
    if nodes is not None and rank in nodes:
        return nodes[rank]
    path = beat.with_name(f"{beat.name}{protocol.BEAT_NODE_SUFFIX}")
    try:
        name = read_regular(path, NODE_BYTES, within=within).decode().strip()
    except (OSError, RunFolderError, UnicodeDecodeError):
        return UNKNOWN
    if not protocol.NODE_NAME.fullmatch(name):
        return UNKNOWN
    if nodes is not None:
        nodes[rank] = name
    return name
