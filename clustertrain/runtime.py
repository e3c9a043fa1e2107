"""``clustertrain.runtime``, as training scripts import it (``from clustertrain import runtime``):
what a training script calls to take part in a clustertrain job: the stop request agreed across
ranks, the requeue handshake, heartbeats, metrics, milestones, the exit.

The code is :mod:`clustertrain.rank.runtime`, the rank side's; these are its public names, the
very objects, re-exported from that one real module so that type checkers see them.
"""

from clustertrain.rank.runtime import (
    NO_RESTART_EXIT,
    StopRequest,
    compute,
    finish,
    heartbeat,
    log_metrics,
    milestone,
    request_requeue,
    requeue_file,
    teardown,
    time_forward,
)

__all__ = [
    "NO_RESTART_EXIT",
    "StopRequest",
    "compute",
    "finish",
    "heartbeat",
    "log_metrics",
    "milestone",
    "request_requeue",
    "requeue_file",
    "teardown",
    "time_forward",
]
