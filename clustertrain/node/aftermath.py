"""What one run of the step left that the policy weighs besides its exit status, read from where
each file stood when the run began (a restarted step appends to the same files): the
checkpoints rank 0 recorded (``checkpoint`` events in ``events.jsonl``) and the ranks' exit codes
in each node launcher's failure report (torchrun exits 1 whatever its ranks' codes, and srun
passes on the highest of its tasks', or 128 + a signal for a node it killed: neither carries a
rank's :data:`clustertrain.protocol.NO_RESTART_EXIT`).

Each read is bounded and never follows a symlink; the supervisor reads it once per run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clustertrain import protocol
from clustertrain.files import RunFolderError, open_regular
from clustertrain.rank import events
from clustertrain.rank.events import Event

_EVENT_BYTES = events.MAX_BYTES  # of events written by one run of the step
_REPORT_BYTES = 256 << 10  # of each node's stderr: the launcher's report is at its end
_NODE_LOG = ".err"  # the launch script's stderr, LOG_DIR/<node>.err


def size(path: Path) -> int:
    """Where ``path`` ends now (0 while it does not exist): a run's start."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def node_logs(log_dir: Path) -> dict[Path, int]:
    """Each node's stderr in the attempt's log folder, and where it ends now."""
    try:
        found = [p for p in log_dir.iterdir() if p.name.endswith(_NODE_LOG)]
    except OSError:
        return {}
    return {path: size(path) for path in found}


def _read(path: Path, start: int, limit: int) -> str:
    """The text of ``path`` from ``start`` on, its last ``limit`` bytes at most."""
    try:
        with open_regular(path) as handle:
            end = os.fstat(handle.fileno()).st_size
            handle.seek(max(start, end - limit) if end >= start else 0)
            return handle.read(limit).decode("utf-8", "replace")
    except (RunFolderError, OSError):
        return ""


def checkpoints(path: Path, start: int) -> list[Event]:
    """The ``checkpoint`` events written to ``path`` from byte ``start`` on, in order."""
    text = _read(path, start, _EVENT_BYTES)
    found = (events.parse(line) for line in text.splitlines() if events.CHECKPOINT in line)
    return [event for event in found if event is not None and event.name == events.CHECKPOINT]


def where(checkpoint: Event) -> str:
    """Where a checkpoint stands, as its event says: ``step 41 of epoch 3``, ``epoch 3``,
    ``step 120``, or ``""`` when it says neither."""
    values: Mapping[str, Any] = checkpoint.values
    step, epoch = values.get("step"), values.get("epoch")
    said = f"step {step:g}" if isinstance(step, int | float) else ""
    if isinstance(epoch, int | float):
        said = f"{said} of epoch {epoch:g}" if said else f"epoch {epoch:g}"
    return said


def no_restart(log_dir: Path, before: Mapping[Path, int]) -> tuple[int, str] | None:
    """The first rank (and its node) that a launcher's report in ``log_dir``, written since
    the offsets ``before`` (:func:`node_logs`; a node's log begun since, from its start), says
    exited with :data:`clustertrain.protocol.NO_RESTART_EXIT`."""
    for path in sorted(node_logs(log_dir)):
        rank = None
        for line in _read(path, before.get(path, 0), _REPORT_BYTES).splitlines():
            if match := protocol.REPORT_RANK.search(line):
                rank = int(match[1])
            elif rank is not None and (match := protocol.REPORT_EXIT.search(line)):
                if int(match[1]) == protocol.NO_RESTART_EXIT:
                    return rank, path.name.removesuffix(_NODE_LOG)
                rank = None
    return None
