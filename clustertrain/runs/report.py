"""What became of a job, and why it failed: one typed answer (:class:`Report`) from its state
and its run folder, which ``status``, ``list``, the notebook and ``Job.status()`` all ask.

The pieces are read where they are kept (timeline.py: attempts, progress, the headline metric;
logs.py: a hang, lost nodes) and why a job failed is said by its one owner (why.py: the cause,
its headline, hint and evidence); this module only gathers them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from clustertrain.files import printable
from clustertrain.jobstate import RUN_FOLDER, SACCT, Accounting, JobState
from clustertrain.rank.events import Event
from clustertrain.runs import timeline, why
from clustertrain.runs.folder import Run


@dataclass(frozen=True)
class Report:
    """A job as it stands: its ``state``, where training is (``progress``, while it runs), what
    happened on the way (``notes``: qualification, stragglers, restarts), its ``headline``
    metric once it ended, and for a job that did not complete, why: its ``cause`` (one owner:
    :mod:`clustertrain.runs.why`) and the details below it (``hang``, ``setup``), and the nodes
    it lost."""

    state: JobState
    progress: timeline.Progress | None = None
    notes: tuple[str, ...] = ()
    headline: timeline.Headline | None = None
    hang: str | None = None
    lost_nodes: tuple[str, ...] = ()
    # What the scheduler said when it could not be asked (the state is the run folder's).
    unreachable: str | None = None
    # Which of the job's setup lines failed (before any rank started), if one did.
    setup: str | None = None
    # What the scheduler's accounting recorded once the job ended (Slurm: sacct), where kept.
    accounting: Accounting | None = None
    # Why it did not complete, said once (clustertrain.runs.why); None while it runs or once
    # it completed.
    cause: why.Cause | None = None

    @property
    def source(self) -> str:
        """Where the state came from (:data:`clustertrain.jobstate.SOURCES`)."""
        return self.state.source

    def lines(self) -> list[str]:
        """What ``status`` prints below the job's state, a line each."""
        cause = self.cause
        said = cause.lines() if cause else []  # the headline first: what failed, and where
        if cause and cause.evidence:
            said.append(f"evidence: clustertrain status {self.state.job_id} --why")
        said += [self.progress.line()] if self.progress else []
        said += list(self.notes)
        said += (
            [f"final {self.headline.text()}"]
            if self.headline and not _said(cause, why.Kind.DIED_AT_EXIT, why.Kind.TIME_LIMIT)
            else []
        )
        said += [self.setup] if self.setup and not _said(cause, why.Kind.SETUP) else []
        said += [self.hang] if self.hang and not _said(cause, why.Kind.HANG) else []
        if self.lost_nodes and not _said(cause, why.Kind.NODE_LOST):
            when = (
                "the job ended NODE_FAIL" if self.state.state == "NODE_FAIL"
                else "in an earlier attempt"
            )  # fmt: skip
            said.append(
                f"lost node(s): {' '.join(self.lost_nodes)} (Slurm declared them down; {when})"
            )
        said += self.accounting.lines() if self.accounting else []
        return said + self.source_lines()

    def why_lines(self) -> list[str]:
        """What ``status --why`` prints: the headline and hint, then the evidence behind them
        (at most :data:`clustertrain.runs.why.MAX_EVIDENCE` lines, each writer's decisive
        lines, the consequences folded)."""
        if self.cause is None:
            return []
        return [*self.cause.lines(), "evidence:", *(f"  {line}" for line in self.cause.evidence)]

    def source_lines(self) -> list[str]:
        """Where the state came from, when not from Slurm's controller or a local run's own
        supervisor."""
        if self.source == RUN_FOLDER:
            said = f" ({printable(self.unreachable)})" if self.unreachable else ""
            return [f"Slurm not reachable: from the run folder{said}"]
        if self.source == SACCT:
            return ["from Slurm's accounting (sacct): the controller no longer holds the job"]
        return []


def _said(cause: why.Cause | None, *kinds: why.Kind) -> bool:
    """Whether the cause's headline already says what a detail line would: it is of one of
    ``kinds`` (the final metric of a job that died at exit or reached its time limit, the
    hang, the setup line, the lost nodes)."""
    return cause is not None and cause.kind in kinds


def report(
    run: Run,
    state: JobState,
    warn: Callable[[str], None],
    unreachable: str | None = None,
    accounting: Accounting | None = None,
) -> Report:
    """``run``'s report, given its ``state`` now (from its backend, or from its folder where
    the backend said ``unreachable``) and what its backend's ``accounting`` kept of it;
    ``warn`` hears of what in its run folder could not be read."""
    found = run.events(warn)
    attempts = timeline.attempts(found)
    notes = [
        printable(line) for line in (*timeline.qualification(found), *timeline.stragglers(found))
    ]
    notes += [restart.line() for restart in timeline.restarts(attempts)]
    failed = state.finished and state.state != "COMPLETED"
    records = why.read(run, state, accounting, found) if failed else None
    return Report(
        state=state,
        progress=None if state.finished else timeline.progress(attempts, run.metric),
        notes=tuple(notes),
        headline=timeline.headline(found, run.metric) if state.finished else None,
        setup=records.setup if records else None,
        hang=records.hang if records else None,
        lost_nodes=records.lost_nodes if records else why.lost_nodes(run, accounting),
        unreachable=unreachable,
        accounting=accounting,
        cause=why.cause(records) if records else None,
    )


def cause(run: Run, state: JobState, found: list[Event]) -> why.Cause | None:
    """Why ``run`` did not complete, given its ``state`` and its events already read (``list``
    asks this of each job it shows); None while it runs or once it completed."""
    if not state.finished or state.state == "COMPLETED":
        return None
    return why.cause(why.read(run, state, None, found))
