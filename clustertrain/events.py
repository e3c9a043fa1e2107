"""``clustertrain.events``, as training scripts import it (``from clustertrain import events``):
the run folder's event log: one JSON line per event (``record`` for your script; ``read`` and
``scan`` for readers).

The code is :mod:`clustertrain.rank.events`, the rank side's; these are its public names, the
very objects, re-exported from that one real module so that type checkers see them.
"""

from clustertrain.rank.events import (
    CHECKPOINT,
    ENDED,
    FLAGGED,
    HANG,
    MAX_BYTES,
    MAX_VALUES,
    MILESTONES,
    NAMES,
    NO_RESTART,
    NODE_CHECK,
    NODE_LOST,
    QUALIFIED,
    QUEUED,
    REQUEUED,
    RESTART_STORM,
    RESTARTED,
    SIGNAL,
    STARTED,
    STRAGGLER,
    Event,
    append,
    read,
    record,
    scan,
)

__all__ = [
    "CHECKPOINT",
    "ENDED",
    "Event",
    "FLAGGED",
    "HANG",
    "MAX_BYTES",
    "MAX_VALUES",
    "MILESTONES",
    "NAMES",
    "NODE_CHECK",
    "NODE_LOST",
    "NO_RESTART",
    "QUALIFIED",
    "QUEUED",
    "REQUEUED",
    "RESTARTED",
    "RESTART_STORM",
    "SIGNAL",
    "STARTED",
    "STRAGGLER",
    "append",
    "read",
    "record",
    "scan",
]
