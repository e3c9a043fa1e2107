"""What a run's records say, as a tracker takes it: pure functions from the job's fields and
its events (read by :mod:`clustertrain.rank.events`, as every other reader reads them) to
params, points and tags. The counters that carry from one read to the next (the steps of
calls that gave none, restarts, requeues, attempts) are :class:`Progress`, kept in the
relay's position, so that a relay started again continues where the last one stopped."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from clustertrain.files import printable
from clustertrain.rank import events
from clustertrain.track.base import Point

# The relay's own series, beside the script's: how often the job restarted and was requeued,
# at the step it had reached (a metric name no log_metrics call can shadow: it has a '/').
RESTARTS, REQUEUES = "clustertrain/restarts", "clustertrain/requeues"
# What MLflow keeps of a param's value (6000 characters in MLflow 2); a job field's value is
# shorter, except a long command line.
MAX_PARAM = 500
# The job's `env` may hold tokens: its names are sent, never its values.
SECRET_FIELDS = ("env",)


@dataclass
class Progress:
    """What the events read so far add up to."""

    calls: int = 0  # log_metrics calls: the step of a call that gave none
    step: int = 0  # the newest step: where a restart or a requeue is drawn
    restarts: int = 0
    requeues: int = 0
    attempts: int = 0
    nodes: str = ""
    ended: str | None = None  # the supervisor's exit status, once it ended
    skipped: int = 0  # values that were not a finite number

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Progress:
        progress = cls()
        for key, default in vars(cls()).items():
            value = raw.get(key, default)
            if isinstance(default, int) and isinstance(value, int) and not isinstance(value, bool):
                setattr(progress, key, max(0, value))
            elif key in ("nodes", "ended") and isinstance(value, str):
                setattr(progress, key, value[:200])
        return progress


def points(found: Iterable[events.Event], progress: Progress) -> list[Point]:
    """The points ``found`` gives, ``progress`` advanced past them."""
    out: list[Point] = []
    for event in found:
        if event.name == "metrics":
            out += _metrics(event, progress)
        elif event.name == events.RESTARTED:
            progress.restarts += 1
            out.append(Point(RESTARTS, float(progress.restarts), progress.step, event.time))
        elif event.name == events.REQUEUED:
            progress.requeues += 1
            out.append(Point(REQUEUES, float(progress.requeues), progress.step, event.time))
        elif event.name == events.STARTED:
            progress.attempts = max(progress.attempts, event.attempt + 1)
            progress.nodes = str(event.values.get("nodes", progress.nodes))
            progress.ended = None
        elif event.name == events.ENDED:
            progress.ended = str(event.values.get("status", ""))
    return out


def _metrics(event: events.Event, progress: Progress) -> list[Point]:
    """One log_metrics call: its ``step``, else the number of calls before it (so the steps
    of a script that gives none continue across requeues, from the count kept)."""
    given = event.values.get("step")
    step = int(given) if _finite(given) else progress.calls
    progress.calls += 1
    progress.step = step
    out = []
    for name, value in event.values.items():
        if name == "step":
            continue
        if _finite(value):
            out.append(Point(name, float(value), step, event.time))
        else:
            progress.skipped += 1
    return out


def _finite(value: Any) -> TypeGuard[int | float]:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


def params(fields: Mapping[str, Any]) -> dict[str, str]:
    """The job's fields (its spec.yaml) as flat ``name: text`` params: a nested value under
    ``outer.inner``, a list as JSON, every text printable and at most :data:`MAX_PARAM` long."""
    flat: dict[str, str] = {}
    for key, value in fields.items():
        name = str(key)
        if name in SECRET_FIELDS and isinstance(value, Mapping):
            flat[name] = ",".join(sorted(str(k) for k in value)) + " (values not sent)"
        elif isinstance(value, Mapping):
            flat.update({f"{name}.{k}": v for k, v in params(value).items()})
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            flat[name] = printable(text)[:MAX_PARAM]
    return flat


def final_state(progress: Progress, said: str | None) -> str:
    """The job's end in Slurm's words: the supervisor's exit status where it recorded one,
    else what the scheduler ``said``, else UNKNOWN."""
    if progress.ended == "0":
        return "COMPLETED"
    if progress.ended is not None:
        return "FAILED"
    return said or "UNKNOWN"


def tags(job_id: str, name: str, progress: Progress, state: str) -> dict[str, str]:
    return {
        "clustertrain.job_id": job_id,
        "clustertrain.job_name": name,
        "clustertrain.nodes": printable(progress.nodes) or "-",
        "clustertrain.attempts": str(progress.attempts),
        "clustertrain.state": state,
    }
