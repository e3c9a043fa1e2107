"""The one interface every backend offers, like submitit's executors and TorchX's schedulers.

A job is rendered once (clustertrain.render), its run folder written (clustertrain.runs), and
then a backend takes over: it refuses what it could never run, queues or starts the job, and
answers for its state. ``clustertrain.api.Job`` and the CLI call only this.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

from clustertrain.jobstate import JobState
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

    @staticmethod
    @abstractmethod
    def cancel_command(job_id: str) -> str:
        """The shell command that ends the job, for when clustertrain cannot say it itself."""

    @abstractmethod
    def check(self, job: RenderedJob, preflight: bool = True) -> None:
        """Raise :class:`~clustertrain.errors.UserError` for a job this backend could never
        run; ``preflight=False`` skips the checks a user may overrule (a cluster's limits)."""

    @abstractmethod
    def submit(self, job: RenderedJob) -> str:
        """Queue or start ``job``, whose run folder is written; return its id."""

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
