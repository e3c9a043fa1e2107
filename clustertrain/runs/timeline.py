"""Where a job's time went, from its events (:mod:`clustertrain.rank.events`): pure functions.

An attempt runs from ``started`` to ``ended`` or ``requeued`` (or its last event, when Slurm
killed the batch shell first). Inside it: start-up (to the node check, then the script's
milestones: ``runtime.milestone``), then training from the data ready or the first progress.
Between attempts, and before the first, the job waits in the queue. Training that a later
attempt had to redo (after the last checkpoint of an attempt that did not end cleanly) is lost.
Goodput and its badput buckets are built on these (:mod:`clustertrain.runs.goodput`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from clustertrain.rank import events
from clustertrain.rank.events import MILESTONES, Event

PROGRESS = ("step", "metrics", "epoch", events.CHECKPOINT, "stop")
# Start-up ends at the script's last milestone or its first progress, whichever comes first.
READY = MILESTONES[-1]
# Where a metric's values are read from: the first of these kinds of event that carries it, so
# a loss logged at every step is not drawn together with its average at each epoch's end.
_FINEST_FIRST = ("step", "metrics", "epoch")


@dataclass(frozen=True)
class Phase:
    name: str  # "queued", "start-up", "training", "lost"
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Attempt:
    number: int
    events: tuple[Event, ...]

    @property
    def start(self) -> float:
        return self.events[0].time

    @property
    def end(self) -> float:
        return self.events[-1].time

    @property
    def how(self) -> str:
        """How it ended: ``requeued``, ``ended`` (with the status), or ``killed`` (no word)."""
        last = self.events[-1]
        if last.name == events.ENDED:
            return f"ended {last.values.get('status', '?')}"
        return "requeued" if last.name == events.REQUEUED else "killed"

    @property
    def clean(self) -> bool:
        return self.how in ("requeued", "ended 0")

    def first(self, name: str) -> Event | None:
        return next((e for e in self.events if e.name == name), None)

    def segments(self) -> list[tuple[Event, ...]]:
        """The attempt's runs of its step: a hung step started again inside the allocation
        (``restarted``) begins a new one."""
        cuts = [i for i, e in enumerate(self.events) if e.name == events.RESTARTED and i > 0]
        bounds = [0, *cuts, len(self.events)]
        return [self.events[a:b] for a, b in itertools.pairwise(bounds) if b > a]

    def spans(self) -> list[tuple[tuple[Event, ...], float, bool]]:
        """Each run of the step (:meth:`segments`) with when it ended (the next one's start, or
        the attempt's end) and whether it ended cleanly (only the last can)."""
        runs = self.segments()
        return [
            (segment, self.end if index == len(runs) - 1 else runs[index + 1][0].time,
             index == len(runs) - 1 and self.clean)
            for index, segment in enumerate(runs)
        ]  # fmt: skip

    def phases(self) -> list[Phase]:
        """Per run of the step: start-up, training, and (when it did not end cleanly: a step
        that hung, an attempt that did not end well) the training lost after its last
        checkpoint."""
        phases = [p for span in self.spans() for p in segment_phases(*span)]
        return [p for p in phases if p.seconds > 0]


def segment_phases(found: tuple[Event, ...], end: float, clean: bool) -> list[Phase]:
    """One run of the step's start-up, training and (not ``clean``) training lost, to ``end``;
    a phase may be empty."""
    ready = next((e.time for e in found if e.name in PROGRESS or e.name == READY), end)
    saved = [e.time for e in found if e.name == events.CHECKPOINT]
    # A run that did not end cleanly keeps only what its last checkpoint holds.
    useful_end = end if clean else max(saved[-1] if saved else ready, ready)
    phases = [Phase("start-up", found[0].time, ready), Phase("training", ready, useful_end)]
    return phases + ([Phase("lost", useful_end, end)] if useful_end < end else [])


@dataclass(frozen=True)
class Restart:
    """A step started again inside the allocation: why, and what it cost."""

    attempt: int
    why: str  # "hang", or the lost nodes ("node2 lost")
    fault: float  # when the step stopped making progress (its last heartbeat), if known
    training_again: float | None  # the first progress after the restart

    def line(self) -> str:
        back = (
            f"training again {self.training_again - self.fault:.0f} s after the fault"
            if self.training_again is not None
            else "no progress since"
        )
        return f"step restarted in attempt {self.attempt} after {self.why}: {back}"


def restarts(runs: list[Attempt]) -> list[Restart]:
    """Every in-allocation restart of every attempt, in order."""
    found = []
    for attempt in runs:
        for segment in attempt.segments()[1:]:
            before = [e for e in attempt.events if e.time <= segment[0].time]
            # The watchdog's event, which says how long before it the step stopped.
            cause = next((e for e in reversed(before) if e.name in _FAULTS), None)
            fault = cause.time - cause.values.get("seconds", 0.0) if cause else segment[0].time
            again = next((e.time for e in segment if e.name in PROGRESS), None)
            found.append(Restart(attempt.number, _why(cause, segment[0]), fault, again))
    return found


_FAULTS = (events.HANG, events.NODE_LOST)


def _why(cause: Event | None, restarted: Event) -> str:
    if cause is not None and cause.name == events.NODE_LOST:
        return f"{cause.values.get('nodes', 'a node')} lost"
    return f"a {restarted.values.get('why', 'failure')}"


def attempts(found: list[Event]) -> list[Attempt]:
    """The job's attempts in order, each from its first event (``started`` under Slurm; a
    local run has the ranks' events only)."""
    by_attempt: dict[int, list[Event]] = {}
    for event in sorted(found, key=lambda e: e.time):
        if event.name != events.QUEUED:
            by_attempt.setdefault(event.attempt, []).append(event)
    return [Attempt(k, tuple(by_attempt[k])) for k in sorted(by_attempt)]


def waits(found: list[Event], runs: list[Attempt]) -> list[tuple[int, Phase]]:
    """Time in the queue before each attempt (from ``queued``, then from the last attempt's
    end), with the number of the attempt it precedes."""
    queued = next((e.time for e in found if e.name == events.QUEUED), None)
    ends = ([queued] + [a.end for a in runs])[: len(runs)]  # none before a first attempt
    return [
        (attempt.number, Phase("queued", end, attempt.start))
        for end, attempt in zip(ends, runs, strict=True)
        if end is not None and attempt.start > end
    ]


def series(found: list[Event], metric: str) -> list[Event]:
    """The events that carry ``metric``, in time order, of the finest kind that carries it."""
    for kind in _FINEST_FIRST:
        points = [e for e in found if e.name == kind and metric in e.values]
        if points:
            return sorted(points, key=lambda e: e.time)
    return []


def latest(found: list[Event], metric: str | None) -> float | None:
    """The newest value of ``metric`` (None when none is named, or none was logged)."""
    points = series(found, metric) if metric else []
    return float(points[-1].values[metric]) if metric and points else None


@dataclass(frozen=True)
class Headline:
    """A job's headline metric and its newest value."""

    metric: str
    value: float

    def text(self) -> str:
        return f"{self.metric} {self.value:.6g}"


def headline(found: list[Event], metric: str | None) -> Headline | None:
    value = latest(found, metric)
    return Headline(metric, value) if metric and value is not None else None


@dataclass(frozen=True)
class Progress:
    epoch: int
    epochs: int | None
    step: int
    headline: Headline | None
    eta_s: float | None

    def line(self) -> str:
        of = f"/{self.epochs}" if self.epochs else ""
        said = f", {self.headline.text()} so far" if self.headline else ""
        eta = f", about {duration(self.eta_s)} left" if self.eta_s is not None else ""
        return f"progress: epoch {self.epoch}{of}, step {self.step}{said}{eta}"


def progress(runs: list[Attempt], metric: str | None = None) -> Progress | None:
    """How far the newest attempt got, its headline ``metric`` so far, and the time left at its
    pace so far."""
    if not runs:
        return None
    last = runs[-1]
    moves = [
        e
        for e in last.events
        if e.name in ("step", "epoch") or (e.name == "metrics" and "step" in e.values)
    ]
    if not moves:
        return None
    now = moves[-1]
    epochs, steps = now.values.get("epochs"), now.values.get("steps")
    step = int(now.values.get("step", 0))
    eta = None
    if epochs and steps and len(moves) > 1 and step > moves[0].values.get("step", 0):
        pace = (now.time - moves[0].time) / (step - moves[0].values.get("step", 0))
        eta = max(0.0, (epochs * steps - step) * pace)
    return Progress(
        int(now.values.get("epoch", 0)),
        int(epochs) if epochs else None,
        step,
        headline([e for a in runs for e in a.events], metric),
        eta,
    )


def duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``12s``: a span as people read it."""
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return (
        f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
    )


def qualification(found: list[Event]) -> list[str]:
    """What the newest qualification said: the nodes qualified, and each flagged node with its
    figure (the supervisor's ``qualified`` and ``flagged`` events); [] without one."""
    said = [e for e in found if e.name == events.QUALIFIED]
    if not said:
        return []
    last = said[-1]
    nodes = str(last.values.get("nodes", "")).split()
    flagged = [
        e for e in found
        if e.name == events.FLAGGED and e.attempt == last.attempt and e.time >= last.time
    ]  # fmt: skip
    lines = [f"qualified: {' '.join(nodes) or '-'} (attempt {last.attempt}, "
             f"{len(flagged)} flagged)"]  # fmt: skip
    lines += [f"flagged: {e.values.get('nodes', '?')}: {e.values.get('why', '')}" for e in flagged]
    return lines


def stragglers(found: list[Event]) -> list[str]:
    """Each straggler the watchdog named, as it said it, with the attempt."""
    return [f"straggler: {e.values.get('why', '')} (attempt {e.attempt})"
            for e in found if e.name == events.STRAGGLER]  # fmt: skip
