"""Goodput and its badput, from a job's events: where its time went from its first start to its
last end, bucket by bucket, in the manner of Google's ml-goodput-measurement (productive
training against start-up, checkpoints, disruptions and the progress they cost). Pure: events
in, :class:`Goodput` out, built on the attempts and phases of :mod:`clustertrain.runs.timeline`.

Each second of an attempt lands in one bucket:

- **node check**: the supervisor's node check and qualification, before an attempt's training
  (up to its ``node_check``, ``qualified`` or ``flagged`` event);
- **start-up**: the rest of an attempt's start-up, to the script's last milestone or first
  progress;
- **checkpoint restore**: in a run that resumed from a checkpoint, from its data ready to its
  first progress (no event says where a restore ends, so this is an upper bound: it holds the
  steps before the first progress event too);
- **checkpoint save**: the ``seconds`` each ``checkpoint`` event says its write took;
- **restarts**: a step started again inside the allocation, from the fault (the watchdog's
  event, less the seconds it says the step was quiet) to training again;
- **lost progress**: training after the last checkpoint of a run that did not end cleanly,
  up to the fault, which a later run had to do again;
- **requeue wait**: in the queue between a requeued attempt's end and the next one's start.

Whatever the run folder does not see (Slurm's prolog, the batch script before the supervisor's
first event, the teardown after its last) is the caller's **other**
(:mod:`clustertrain.runs.cost`). Events are anyone's: every figure is clamped to the time it
could have taken, so forged values bend a bucket, never the total.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustertrain.rank import events
from clustertrain.rank.events import Event
from clustertrain.runs import timeline

# The buckets, in the order a job meets them, each with its column's key.
BUCKETS = {
    "node check": "node_check",
    "start-up": "startup",
    "checkpoint restore": "restore",
    "checkpoint save": "save",
    "restarts": "restarts",
    "lost progress": "lost",
    "requeue wait": "requeue_wait",
}
# Where the supervisor's node check and qualification say they are done.
_CHECKED = (events.NODE_CHECK, events.QUALIFIED, events.FLAGGED)


@dataclass(frozen=True)
class Goodput:
    """Productive training time and each badput bucket (:data:`BUCKETS`, in that order), in
    seconds, over the events' span: from the first attempt's start to the last one's end."""

    productive_s: float
    badput: tuple[tuple[str, float], ...]
    first_start: float | None
    last_end: float | None
    attempts: int
    restarts: int
    queue_wait_s: float | None  # from ``queued`` to the first attempt's start
    allocated_s: float  # the attempts' own spans, waits between them left out

    @property
    def wall_s(self) -> float | None:
        if self.first_start is None or self.last_end is None:
            return None
        return self.last_end - self.first_start

    @property
    def share(self) -> float | None:
        """Goodput: productive training over the wall time from the first start to the last
        end (waits in the queue between attempts included); None before any attempt."""
        wall = self.wall_s
        return min(1.0, max(0.0, self.productive_s / wall)) if wall else None

    def bucket(self, name: str) -> float:
        return dict(self.badput)[name]


def goodput(found: list[Event]) -> Goodput:
    """Where the time of the job whose events are ``found`` went (see the module)."""
    runs = timeline.attempts(found)
    spent = dict.fromkeys(BUCKETS, 0.0)
    productive, resumable = 0.0, False
    faults = iter(timeline.restarts(runs))
    for attempt in runs:
        spans = attempt.spans()
        for index, (segment, end, clean) in enumerate(spans):
            fault = next(faults).fault if index + 1 < len(spans) else None
            productive += _span(segment, end, clean, index > 0, resumable, fault, spent)
            resumable = resumable or any(e.name == events.CHECKPOINT for e in segment)
    # The wait before the first attempt is the queue's; those after it, the requeues'.
    first = runs[0].number if runs else None
    waits = timeline.waits(found, runs)
    queue_wait = next((p.seconds for n, p in waits if n == first), None)
    spent["requeue wait"] = float(sum(p.seconds for n, p in waits if n != first))
    return Goodput(
        productive_s=productive,
        badput=tuple(spent.items()),
        first_start=min((a.start for a in runs), default=None),
        last_end=max((a.end for a in runs), default=None),
        attempts=len(runs),
        restarts=sum(len(a.segments()) - 1 for a in runs),
        queue_wait_s=queue_wait,
        allocated_s=sum(a.end - a.start for a in runs),
    )


def _span(
    segment: tuple[Event, ...],
    end: float,
    clean: bool,
    restarted: bool,
    resumable: bool,
    fault: float | None,
    spent: dict[str, float],
) -> float:
    """One run of the step, its badput added to ``spent``; its productive seconds."""
    phases = {p.name: p for p in timeline.segment_phases(segment, end, clean)}
    startup, training = phases["start-up"], phases["training"]
    if restarted:  # a step started again: the fault's cost runs on to training again
        spent["restarts"] += startup.seconds
    else:
        checked = max((e.time for e in segment if e.name in _CHECKED), default=startup.start)
        check = min(checked, startup.end) - startup.start
        spent["node check"] += check
        spent["start-up"] += startup.seconds - check
    save = _saves(segment, training)
    restore = _restore(segment, training) if resumable else 0.0
    restore = min(restore, training.seconds - save)
    spent["checkpoint save"] += save
    spent["checkpoint restore"] += restore
    lost = phases.get("lost")
    if lost is not None:
        # A fault the watchdog saw splits what was lost from what recovering from it took.
        at = lost.end if fault is None else min(max(fault, lost.start), lost.end)
        spent["lost progress"] += at - lost.start
        spent["restarts"] += lost.end - at
    return training.seconds - save - restore


def _saves(segment: tuple[Event, ...], training: timeline.Phase) -> float:
    """What the checkpoints written in ``training`` say their writes took, each at most the
    time since the one before (a forged ``seconds`` of 1e300 counts as that, a negative one
    as none)."""
    total, since = 0.0, training.start
    for event in segment:
        if event.name == events.CHECKPOINT and training.start < event.time <= training.end:
            said = float(event.values.get("seconds", 0.0))
            total += min(max(said, 0.0), event.time - since)
            since = event.time
    return total


def _restore(segment: tuple[Event, ...], training: timeline.Phase) -> float:
    """In a run that resumed: from its last start-up milestone (training's start, where one
    was said) to its first progress."""
    said = any(e.name == timeline.READY and e.time == training.start for e in segment)
    first = next(
        (e.time for e in segment if e.name in timeline.PROGRESS and e.time >= training.start),
        training.start,
    )
    return min(first, training.end) - training.start if said else 0.0
