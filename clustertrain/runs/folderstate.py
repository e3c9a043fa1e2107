"""A job's state when its scheduler cannot be asked: what its run folder alone says, and how
every reader falls back to it (``status``, ``list``, ``logs --follow``, ``Job.wait``).

The batch side's supervisor (:mod:`clustertrain.node.supervisor`) writes ``started`` when an
attempt begins, and then either ``ended`` with the job's exit status or ``requeued``; attempts
are read as :mod:`clustertrain.runs.timeline` reads them. From those alone (:func:`implied`):

- the newest attempt ``ended`` with status 0: COMPLETED;
- ``ended`` with another status: FAILED, that status its exit code;
- no end: UNKNOWN, with what the folder last said ("running as of its last event (step,
  12s ago)", "requeued as of ...", "queued as of ..."). A batch shell that Slurm killed
  (a node lost, SIGKILL) writes no end, so a folder cannot tell such a job from a running one.

Such a state says so: ``source`` is :data:`~clustertrain.jobstate.RUN_FOLDER`. The scheduler's
own answer wins whenever it gives one, but for UNKNOWN (it forgot the job): then a folder's
recorded end stands.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from clustertrain.errors import SchedulerUnreachable
from clustertrain.jobstate import RUN_FOLDER, JobState
from clustertrain.rank import events
from clustertrain.rank.events import Event
from clustertrain.runs import timeline
from clustertrain.runs.folder import Run, tasks

# The supervisor's exit status as a shell says it (clustertrain.node.supervisor.shell_status),
# and its nodes as Slurm lists them (SLURM_JOB_NODELIST): what a run folder says is input.
_STATUS = re.compile(r"[0-9]{1,3}")
_NODELIST = re.compile(r"[A-Za-z0-9_.,\[\]-]{1,200}")
# While the scheduler cannot be reached, a follower asks it again after this long, doubling up
# to RETRY_MAX_S: a controller that is back is noticed within seconds, and one that stays down
# (each failed ask may cost Slurm's own timeout) is not hammered.
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 15.0


def implied(job_id: str, found: Sequence[Event], now: float) -> JobState:
    """What the events ``found`` alone say of job ``job_id``'s state at time ``now``."""
    attempts = timeline.attempts(list(found))
    if not attempts:
        said = f"queued as of its last event ({_ago(found[-1], now)})" if found else "no events"
        return JobState(job_id, "UNKNOWN", reason=said, source=RUN_FOLDER)
    newest = attempts[-1]
    last, started = newest.events[-1], newest.first(events.STARTED)
    known = JobState(
        job_id, "UNKNOWN",
        nodes=_nodes(started),
        elapsed=_elapsed(last.time - newest.start),
        restarts=newest.number,  # Slurm's restart count: each requeue is an attempt
        source=RUN_FOLDER,
    )  # fmt: skip
    if last.name != events.ENDED:
        what = "requeued" if last.name == events.REQUEUED else "running"
        return replace(known, reason=f"{what} as of its last event ({_ago(last, now)})")
    status = str(last.values.get("status", ""))
    if status == "0":
        return replace(known, state="COMPLETED", exit_code="0:0")
    if not _STATUS.fullmatch(status):
        return replace(known, state="FAILED", reason="its supervisor ended with no exit status")
    number = int(status)
    # As a shell says a process that signal N ended: 128 + N (SIGTERM: scancel, the time limit).
    signal = f" (signal {number - 128}: cancelled, or the time limit?)" if number > 128 else ""
    return replace(
        known, state="FAILED", exit_code=f"{number}:0",
        reason=f"its supervisor ended with exit status {number}{signal}",
    )  # fmt: skip


def _nodes(started: Event | None) -> str:
    """The attempt's nodes as Slurm listed them (``node[1-2]``); anything else is left out."""
    nodes = str(started.values.get("nodes", "")) if started else ""
    return nodes if _NODELIST.fullmatch(nodes) else ""


def _ago(event: Event, now: float) -> str:
    return f"{event.name}, {timeline.duration(max(0.0, now - event.time))} ago"


def _elapsed(seconds: float) -> str:
    """As Slurm writes a run time: ``00:01:07``, ``2-03:00:00``."""
    minutes, secs = divmod(max(0, int(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days}-" * bool(days) + f"{hours:02d}:{minutes:02d}:{secs:02d}"


def folder_state(run: Run, warn: Callable[[str], None] | None = None) -> JobState:
    """What ``run``'s folder says of its state now; a sweep's, from each task's folder: ended
    when every task ended (COMPLETED if each did, else the first other end), else UNKNOWN."""
    now = time.time()
    sweep = tasks(run)
    if not sweep:
        return implied(run.job_id, run.events(warn), now)
    states = [(t.task_number or 0, implied(t.job_id, t.events(warn), now)) for t in sweep]
    ends = [s.state for _, s in states if s.finished]
    whole = (
        next((s for s in ends if s != "COMPLETED"), "COMPLETED")
        if len(ends) == len(states) else "UNKNOWN"
    )  # fmt: skip
    listed = tuple((number, s.state) for number, s in states)
    reason = f"{len(ends)} of {len(states)} tasks ended, as their folders say"
    return JobState(run.job_id, whole, reason=reason, tasks=listed, source=RUN_FOLDER)


def settled(run: Run, said: JobState) -> JobState:
    """The scheduler's answer, but where it no longer knows the job (UNKNOWN: a restarted
    controller, no accounting) and the folder recorded an end, that end."""
    if said.state != "UNKNOWN":
        return said
    found = folder_state(run)
    return found if found.finished else said


@dataclass(frozen=True)
class Answer:
    """A job's state, and, when the scheduler could not be asked, what it said instead (the
    state is then the run folder's)."""

    state: JobState
    unreachable: str | None = None


def ask(run: Run, scheduler: Callable[[], JobState]) -> Answer:
    """``scheduler()``'s state of ``run``, else, when it cannot be reached, its folder's."""
    try:
        return Answer(settled(run, scheduler()))
    except SchedulerUnreachable as exc:
        return Answer(folder_state(run), str(exc))


@dataclass
class Asker:
    """:func:`ask` for many runs (``list``): once a backend could not be reached, its later
    runs are answered from their folders at once, each failed ask costing Slurm's own timeout
    (seconds)."""

    down: dict[str, str] = field(default_factory=dict)  # backend: what it said

    def ask(self, run: Run, backend: str, scheduler: Callable[[], JobState]) -> Answer:
        if backend in self.down:
            return Answer(folder_state(run), self.down[backend])
        answer = ask(run, scheduler)
        if answer.unreachable is not None:
            self.down[backend] = answer.unreachable
        return answer


@dataclass
class Watch:
    """A follower's view of the job's state (``logs --follow``): the scheduler's while it
    answers; while it cannot be reached, the run folder's, the scheduler asked again after
    RETRY_FIRST_S, doubling to RETRY_MAX_S. ``say`` hears once that it was lost and once that it
    is back. A silent scheduler never ends the follow: only an end does, the folder's or the
    scheduler's."""

    run: Run
    scheduler: Callable[[], JobState]
    say: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    lost: str | None = None  # what the scheduler said when it could not be reached
    lost_at: float = 0.0
    retry_s: float = 0.0
    retry_at: float = 0.0

    def state(self) -> JobState:
        if self.lost is None or self.clock() >= self.retry_at:
            try:
                said = self.scheduler()
            except SchedulerUnreachable as exc:
                self._lost(str(exc))
            else:
                if self.lost is not None:
                    gone = timeline.duration(self.clock() - self.lost_at)
                    self.say(f"the controller answers again (after {gone}): following job "
                             f"{self.run.job_id} with it")  # fmt: skip
                self.lost = None
                return settled(self.run, said)
        return folder_state(self.run)

    def _lost(self, why: str) -> None:
        if self.lost is None:
            self.say(f"{why}; following the run folder until the controller answers (asking "
                     f"again every {RETRY_MAX_S:.0f} s at most)")  # fmt: skip
            self.lost_at, self.retry_s = self.clock(), RETRY_FIRST_S
        else:
            self.retry_s = min(self.retry_s * 2, RETRY_MAX_S)
        self.lost = why
        # From the failed ask's end: it may have taken the command's whole timeout.
        self.retry_at = self.clock() + self.retry_s

    def wait_s(self, poll_s: float) -> float:
        """How long until the state is worth asking again: ``poll_s``, or sooner when a retry
        of the scheduler is due."""
        if self.lost is None:
            return poll_s
        return max(0.0, min(poll_s, self.retry_at - self.clock()))
