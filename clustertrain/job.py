"""A submitted job, found through its run folder (:class:`Job`): its state, logs, metrics,
what became of it and why, what it cost, a look inside it while it runs, and its relay to a
tracker. Each answer is asked of the job's backend and its run folder afresh. ``clustertrain.api``
queues jobs and hands back these; scripts import it from there (``clustertrain.Job``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustertrain import backends, runs
from clustertrain.errors import UserError

# Lazy below, for start-up time: a dry run needs neither the backends nor the log reader.
if TYPE_CHECKING:
    from clustertrain.backends.base import Backend
    from clustertrain.backends.inside import Stacks
    from clustertrain.jobstate import Accounting, JobState
    from clustertrain.render import RenderedJob
    from clustertrain.runs.cost import Cost
    from clustertrain.runs.folderstate import Answer
    from clustertrain.runs.report import Report
    from clustertrain.runs.top import View
    from clustertrain.runs.why import Cause
    from clustertrain.track import Summary

__all__ = ["Job", "backend_for", "slurm_conf_hint"]


def slurm_conf_hint(message: str) -> str:
    """Slurm's ``message``, and where it says Slurm found no configuration while the local
    cluster is up, the ``SLURM_CONF`` to export for it."""
    from clustertrain.backends.slurm import lacks_configuration  # lazy: start-up time

    if not lacks_configuration(message):
        return message
    from clustertrain.localcluster.lifecycle import local_slurm_conf  # lazy: start-up time

    try:
        conf = local_slurm_conf()
    except (OSError, ValueError, KeyError, TypeError):  # a state.json not as `up` writes it
        return message
    return f"{message}; the local cluster is up: export SLURM_CONF={conf}" if conf else message


def backend_for(run: runs.Run) -> Backend:
    """The backend that answers for ``run`` (:func:`clustertrain.backends.for_run`)."""
    return backends.for_run(run)


class Job:
    """A submitted job, found through its run folder. Every property reads afresh."""

    def __init__(self, run: runs.Run, backend: Backend | None = None) -> None:
        self.run = run
        self.backend = backend or backend_for(run)

    @classmethod
    def start(
        cls,
        job: RenderedJob,
        backend: Backend,
        preflight: bool = True,
        private: Mapping[str, bytes] | None = None,
    ) -> Job:
        """Hand a rendered job to ``backend`` (see :mod:`clustertrain.pipeline.schedule`)."""
        from clustertrain.pipeline.schedule import schedule as queue  # lazy: start-up time

        return cls(queue(job, backend, check=preflight, private=private), backend)

    @classmethod
    def attach(cls, ref: str, runs_dir: str | None = None) -> Job:
        """A job by id, run folder or ``"last"``, as the CLI's JOB argument."""
        return cls(runs.find_run(runs.runs_root(runs_dir), str(ref)))

    @property
    def job_id(self) -> str:
        return self.run.job_id

    @property
    def run_dir(self) -> Path:
        return self.run.path

    @property
    def state(self) -> str:
        """The state now, in Slurm's words: PENDING, RUNNING, COMPLETED, FAILED..."""
        return self.job_state().state

    def job_state(self) -> JobState:
        """State, nodes, elapsed time and restarts, as the backend reports them now; where it
        cannot be reached (Slurm's controller down), as the run folder says (its ``source``
        then says "run folder": see :mod:`clustertrain.runs.folderstate`)."""
        return self._ask().state

    def _ask(self) -> Answer:
        from clustertrain.runs import folderstate  # lazy: start-up time

        answer = folderstate.ask(self.run, lambda: self.backend.state(self.run))
        if answer.unreachable is None:
            return answer
        return dataclasses.replace(answer, unreachable=slurm_conf_hint(answer.unreachable))

    def wait(self, timeout: float | None = None, poll_s: float = 3.0) -> str:
        """Block until the job ends (or ``timeout`` seconds pass); return the state then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.job_state()
            if state.finished or (deadline is not None and time.monotonic() >= deadline):
                return str(state.state)
            left = poll_s if deadline is None else deadline - time.monotonic()
            time.sleep(max(0.0, min(poll_s, left)))

    def logs(
        self,
        follow: bool = False,
        rank: int | None = None,
        node: str | None = None,
        raw: bool = False,
    ) -> Iterator[str]:
        """Every rank's lines, ``node1 rank0 | ...`` (only ``rank``'s or ``node``'s if given);
        with ``follow``, new ones as they come, until the job ends. What follows a failure is
        folded to a line per run unless ``raw``."""
        from clustertrain.runs import logs  # lazy: start-up time

        return self.backend.logs(self.run, logs.Filter(rank=rank, node=node, raw=raw), follow)

    def cancel(self) -> None:
        self.backend.cancel(self.run)

    def relay(self, command: str, *args: str, follow: bool = False) -> int | None:
        """The CLI's ``command`` on this job, answered by the clustertrain that owns it where
        that is another's (a login node's: its output is printed here, its exit status comes
        back); None where this side answers (see :meth:`Backend.relay`)."""
        return self.backend.relay(self.run, command, args, follow)

    def metrics(self) -> list[dict[str, Any]]:
        """What the job's ``runtime.log_metrics`` calls recorded, in order (each call's values,
        its ``step``, ``time`` and ``attempt``), from its events: any script's."""
        self.backend.sync(self.run)
        return self.run.metrics()

    def track(
        self,
        to: str,
        follow: bool = False,
        uri: str | None = None,
        logdir: str | None = None,
        say: Callable[[str], None] = print,
    ) -> Summary:
        """Relay the job's records to tracker ``to`` (``mlflow``, ``tensorboard``, ``wandb``)
        from where the last relay stopped; with ``follow``, live until the job ended (see
        :mod:`clustertrain.track`). ``say`` hears what the relay has to say."""
        from clustertrain import track  # lazy: start-up time

        if runs.tasks(self.run):
            raise UserError(f"JOB: {self.job_id} is a sweep; track each task ({self.job_id}_K)")
        self.backend.sync(self.run)
        tracker = track.make(to, self.run, uri, logdir, say)

        def ended() -> str | None:
            self.backend.sync(self.run)  # a remote run's new events, fetched
            state = self.job_state()
            return str(state.state) if state.finished else None

        return track.relay(self.run, tracker, say, follow=follow, state=ended)

    def relaying(
        self, say: Callable[[str], None] = print
    ) -> contextlib.AbstractContextManager[None]:
        """While the body runs (``logs --follow``), the job's records relayed live to each
        tracker its job file names (``track``); a relay that fails is said, never the body's
        end."""
        from clustertrain import track  # lazy: start-up time

        named = track.job_fields(self.run).get("track")
        names = [n for n in named if n in track.NAMES] if isinstance(named, list) else []
        relays = [functools.partial(self.track, n, follow=True, say=say) for n in names]
        return track.alongside(relays, say)

    def status(
        self, warn: Callable[[str], None] | None = None, state: JobState | None = None
    ) -> Report:
        """What became of the job: its state, progress, headline metric and, for a job that did
        not complete, why (see :mod:`clustertrain.runs.report`); ``warn`` hears of what in
        its run folder could not be read. A ``state`` already known (the one a follower saw the
        job end in) is not asked again."""
        from clustertrain.runs.folderstate import Answer  # lazy: start-up time
        from clustertrain.runs.report import report

        answer = Answer(state) if state is not None else self._ask()
        kept = None
        if answer.state.finished and not answer.unreachable:
            try:
                kept = self.backend.accounting(self.run)
            except UserError:  # accounting down (slurmdbd), or none: the rest still answers
                kept = None
        return report(self.run, answer.state, warn or (lambda _: None), answer.unreachable, kept)

    @property
    def failure(self) -> Cause | None:
        """Why the job did not complete: its kind, rank, node, one-line headline, decisive line,
        hint and evidence (see :mod:`clustertrain.runs.why`); None while it runs or once it
        completed. ``status`` prints the same headline."""
        return self.status().cause

    def accounting(self) -> Accounting | None:
        """What the backend's accounting recorded of the job (Slurm: sacct), or None."""
        return self.backend.accounting(self.run)

    def cost(self, warn: Callable[[str], None] | None = None, now: float | None = None) -> Cost:
        """What the job cost and its goodput: queue wait, wall time, node- and GPU-hours
        (accounting's where kept, else its run folder's, with what is missing said) and the
        badput buckets (see :mod:`clustertrain.runs.cost`); a sweep's, the total of its tasks'
        (``parts``). ``warn`` hears of what in a run folder could not be read."""
        from clustertrain.runs import cost  # lazy: start-up time

        self.backend.sync(self.run)
        allocations, why = self.backend.priced(self.run)
        return cost.of_run(self.run, allocations, time.time() if now is None else now, why, warn)

    def stacks(self) -> Stacks:
        """Every rank's Python stack now, the job left running, grouped (``.groups``: ranks in
        the same frames once, the odd ones first; ``.lines()``, ``.as_dict()``)."""
        from clustertrain.backends import inside  # lazy: start-up time

        return inside.stacks(self.backend, self.run)

    def top(self) -> View:
        """The job's nodes (CPU, memory, GPUs) and ranks (step, step time, samples/s) now."""
        from clustertrain.backends import inside  # lazy: start-up time

        return inside.top(self.backend, self.run)[0]

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, run_dir={str(self.run_dir)!r})"
