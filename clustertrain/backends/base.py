"""The one interface every backend offers, like submitit's executors and TorchX's schedulers.

A job is rendered once (clustertrain.render); the pipeline (clustertrain.pipeline.schedule) asks
the backend to refuse what it could never run, writes the run folder and hands the job over;
then the backend answers for its state, its lines, its accounting and its nodes.
``clustertrain.api.Job`` and the CLI call only this.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

from clustertrain import runs
from clustertrain.errors import UserError
from clustertrain.jobstate import Accounting, Allocation, Holding, JobState
from clustertrain.render import RenderedJob
from clustertrain.runs import Run

if TYPE_CHECKING:
    from clustertrain.runs.logs import Filter


class Backend(ABC):
    """Where a job runs, registered by ``name`` in :data:`clustertrain.backends.BACKENDS` (the
    name a run folder records). ``job_ids`` matches the ids it hands out."""

    name: ClassVar[str]
    job_ids: ClassVar[re.Pattern[str]]
    accepted: ClassVar[str]  # what a submitted job is then: "queued", "started"
    # Whether this side prepares the job and writes its run folder before ``submit``; a
    # backend whose jobs another clustertrain queues (a login node's) says False.
    queues_here: ClassVar[bool] = True
    # Why ``report`` has no accounting's figures for its jobs, where :meth:`allocations` has none.
    no_accounting: ClassVar[str] = "no accounting"

    @classmethod
    def for_run(cls, run: Run) -> Backend:
        """The backend that answers for ``run``, a run of this kind."""
        return cls()

    @staticmethod
    @abstractmethod
    def cancel_command(job_id: str) -> str:
        """The shell command that ends the job, for when clustertrain cannot say it itself."""

    def fit(self, job: RenderedJob) -> RenderedJob:
        """``job`` with what it left to the cluster fitted to it (a Slurm partition's nodes: the
        default CPU request), asked before :meth:`check` where preflight runs; most backends
        have nothing to fit."""
        return job

    @abstractmethod
    def check(self, job: RenderedJob, preflight: bool = True) -> None:
        """Raise :class:`~clustertrain.errors.UserError` for a job this backend could never
        run; ``preflight=False`` skips the checks a user may overrule (a cluster's limits)."""

    @abstractmethod
    def submit(self, job: RenderedJob) -> str:
        """Queue or start ``job``, whose run folder is written; return its id."""

    def record(self, job: RenderedJob, job_id: str) -> Run:
        """The run of ``job``, accepted as ``job_id``, recorded in its run folder."""
        return runs.record_submission(job, job_id, self.name)

    @abstractmethod
    def state(self, run: Run) -> JobState:
        """The job's state now."""

    @abstractmethod
    def cancel(self, run: Run) -> None:
        """End the job, whatever its state."""

    def logs(self, run: Run, filters: Filter, follow: bool = False) -> Iterator[str]:
        """The run's lines, ``node1 rank0 | ...``; with ``follow``, new ones until it ends."""
        from clustertrain.runs import logs  # lazy: start-up time (a dry run reads no logs)

        if follow:
            return logs.follow_lines(run, filters, lambda: self.state(run))
        return logs.read_all(run, filters)

    def accounting(self, run: Run) -> Accounting | None:
        """What this backend's accounting recorded of the job (state, exit code, elapsed time,
        each step's memory and CPU time); None where it keeps no such record."""
        return None

    def allocations(self, run: Run) -> tuple[Allocation, ...] | None:
        """What this backend's accounting recorded of the job's allocations (when submitted,
        started and ended, nodes and GPUs: each attempt, each task of an array), which
        ``report`` prices; None where it keeps no such record (then the run folder alone
        answers: :mod:`clustertrain.runs.cost`)."""
        return None

    def priced(self, run: Run) -> tuple[tuple[Allocation, ...] | None, str]:
        """:meth:`allocations`, or None and why not, in words ``report`` prints."""
        try:
            found = self.allocations(run)
        except UserError as exc:  # the scheduler not reachable: the run folder still answers
            return None, f"no accounting: {str(exc)[:160]}"
        return (found, "") if found is not None else (None, self.no_accounting)

    def holding(self, run: Run) -> Holding:
        """The job's state, owner and nodes as its scheduler holds them now: what a command
        inside it is checked against (clustertrain.backends.inside)."""
        raise UserError(f"JOB: {run.job_id}: the {self.name} backend runs no command on its nodes")

    def node_command(
        self, run: Run, argv: Sequence[str], node: str | None = None, pty: bool = False
    ) -> list[str]:
        """The command line that runs ``argv`` inside the running job's allocation, once on each
        of its nodes (or on ``node`` alone, with a terminal where ``pty``): what a shell in the
        job, every rank's stack and a live view of its nodes are made of. Raises
        :class:`UserError` where it cannot."""
        raise UserError(f"JOB: {run.job_id}: the {self.name} backend runs no command on its nodes")

    def sync(self, run: Run) -> None:  # noqa: B027 - a hook: most backends write here already
        """Bring what the run folder's events and metrics say up to date here."""

    def relay(
        self, run: Run, command: str, args: Sequence[str] = (), follow: bool = False
    ) -> int | None:
        """For a backend whose answers are another clustertrain's (a login node's): run the
        CLI's ``command`` on ``run`` there, its output here, and return its exit status. None
        where this side answers itself, as every backend but the remote one does."""
        return None

    def host(self) -> str | None:
        """The login node that answers for this backend's runs, if another host does."""
        return None
