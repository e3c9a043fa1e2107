"""The Python API: what the CLI does, for people who script their experiments.

Example::

    import clustertrain
    job = clustertrain.submit("jobs/mnist.yaml", nodes=2, extra_args=["--epochs", "1"])
    for line in job.logs(follow=True):    # every rank's lines until the job ends
        print(line)
    print(job.state, job.metrics()[-1])   # "COMPLETED", the closing record

    print(clustertrain.submit(nodes=4, gpus_per_node=8, dry_run=True).dry_run_text())
    job = clustertrain.Job.attach("42")   # a job submitted earlier, from the CLI or here

Fields are the job file's keys (``clustertrain.spec.FIELDS``), validated exactly as the CLI's
flags are; a bad value raises :class:`clustertrain.errors.FieldError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustertrain import backends, runs
from clustertrain.errors import FieldError, UserError
from clustertrain.pipeline.plan import default_job_file, plan
from clustertrain.render import RenderedJob
from clustertrain.spec.flags import as_flags

# Lazy below, for start-up time: a dry run needs neither the backends nor the log reader, and
# submitit alone costs 0.1 s.
if TYPE_CHECKING:
    from clustertrain.backends.base import Backend
    from clustertrain.backends.remote import RemoteBackend
    from clustertrain.backends.slurm import Slurm
    from clustertrain.jobstate import Accounting, JobState
    from clustertrain.runs.cost import Cost
    from clustertrain.runs.folderstate import Answer
    from clustertrain.runs.report import Report
    from clustertrain.runs.why import Cause
    from clustertrain.track import Summary

__all__ = [
    "Job",
    "backend_for",
    "costs_since",
    "default_job_file",
    "forget_bad_nodes",
    "login_node",
    "plan",
    "remember_bad_nodes",
    "run_local",
    "schedule",
    "slurm",
    "slurm_conf_hint",
    "submit",
    "submit_words",
]


def remember_bad_nodes(runs_dir: str | None = None) -> list[str]:
    """Your node record with what your newest run folders under the runs root say added, saved;
    its entries, a line each (``clustertrain nodes``)."""
    from clustertrain.settings import noderecord  # lazy: start-up time

    path = noderecord.mine()
    record = noderecord.read(path, runs.runs_root(runs_dir))
    noderecord.save(path, record)
    return [entry.line() for entry in record.entries]


def forget_bad_nodes(
    nodes: Sequence[str] = (), runs_dir: str | None = None, every: bool = False
) -> list[str]:
    """Clear ``nodes`` (``every``: all, even from a record that is not one) from your node
    record; what happened to them before now is not taken again. The nodes that were in it."""
    from clustertrain.settings import noderecord  # lazy: start-up time

    path = noderecord.mine()
    harvested = noderecord.harvest(runs.runs_root(runs_dir))
    if every:
        names = sorted({entry.node for entry in harvested})
        record = noderecord.Record([], {})
        with contextlib.suppress(UserError):
            record = noderecord.merged(noderecord.load(path), harvested)
        names = sorted({*names, *(entry.node for entry in record.entries)})
    else:
        names = [noderecord.node_name(node) for node in nodes]
        record = noderecord.merged(noderecord.load(path), harvested)
    there = [e.node for e in record.entries if e.node in names]
    noderecord.save(path, noderecord.clear(record, names))
    return there


def submit(
    job_file: str | None = None,
    *,
    dry_run: bool = False,
    preflight: bool = True,
    extra_args: Sequence[str] = (),
    runs_dir: str | None = None,
    host: str | None = None,
    allow_dirty: bool = False,
    remote_clustertrain: str | None = None,
    **fields: Any,
) -> Job | RenderedJob | None:
    """Validate, check against the partition (unless ``preflight=False``) and queue a job.

    With ``dry_run=True`` nothing is checked against Slurm, run or written: the rendered job
    comes back instead (``.batch_script``, ``.launch_script``, ``.dry_run_text()``). Otherwise
    the job's prepare commands run here first (see :mod:`clustertrain.pipeline.prepare`;
    ``skip_prepare=True`` skips them).

    With ``host`` (or ``$CLUSTERTRAIN_HOST``), a login node over ssh does all of that, in a
    snapshot of this git tree, as ``clustertrain submit --host`` (see
    :mod:`clustertrain.backends.remote`); the fields are checked here first. A dry run there
    prints what it would submit and returns None.
    """
    host = host or os.environ.get("CLUSTERTRAIN_HOST") or None
    job = plan(job_file, extra_args=extra_args, runs_dir=runs_dir, **fields)
    if host is not None:
        refuse_with_host(fields)
        switches = ["--dry-run"] * dry_run + ["--no-preflight"] * (not preflight)
        words = submit_words(job_file, extra_args, fields, switches)
        far = login_backend(host, words, runs_dir, allow_dirty, remote_clustertrain, job_file)
        if dry_run:
            far.check(job)
            far.dry_run()
            return None
        return Job.start(job, far, preflight)
    if dry_run:
        return job
    return schedule(job, "slurm", preflight, runs_dir)


def login_backend(
    host: str,
    words: Sequence[str],
    runs_dir: str | None = None,
    allow_dirty: bool = False,
    remote_clustertrain: str | None = None,
    job_file: str | None = None,
    echo: Callable[[str], None] = print,
    **request: Any,
) -> RemoteBackend:
    """The remote backend that has ``host``'s clustertrain queue ``clustertrain submit WORDS``
    (or the ``command`` of ``request``), in a snapshot of the git tree that holds this
    directory, the run recorded under this side's runs root, what the login node says
    ``echo``ed (see
    :mod:`clustertrain.backends.remote`). Which clustertrain runs there is your hosts file's
    choice (:func:`clustertrain.settings.hosts.clustertrain_for`), checked before any ssh."""
    from clustertrain.backends import remote  # lazy: start-up time
    from clustertrain.backends.remote import ssh  # lazy: start-up time
    from clustertrain.settings import hosts  # lazy: start-up time

    ssh.check_host(host)
    asked = remote.Request(
        host, tuple(words), hosts.clustertrain_for(host, remote_clustertrain),
        allow_dirty=allow_dirty, job_file=job_file, **request,
    )  # fmt: skip
    return remote.RemoteBackend(request=asked, runs_root=runs.runs_root(runs_dir), echo=echo)


def refuse_with_host(fields: Mapping[str, Any]) -> None:
    """What a job queued by a login node cannot take: a ``workdir`` (it runs at this
    directory's place in the code snapshot there)."""
    if fields.get("workdir") is not None:
        raise FieldError(
            "workdir", fields["workdir"], "with host the job runs at this directory's place "
            "in the code snapshot; leave workdir out",
        )  # fmt: skip


def schedule(
    job: RenderedJob,
    backend: str = "slurm",
    preflight: bool = True,
    runs_dir: str | None = None,
    private: Mapping[str, bytes] | None = None,
) -> Job:
    """Queue the planned ``job`` with ``backend`` (a name of ``clustertrain.backends.BACKENDS``:
    ``slurm``, or ``local`` to start it here), its ``private`` files (name: content, 0600) in its
    run folder. Slurm's first takes what your newest run folders say into your node record."""
    if backend not in backends.BY_NAME:
        raise FieldError("backend", backend, f"one of {', '.join(backends.BY_NAME)}")
    if backend == "slurm" and job.spec.avoid_bad_nodes:
        remember_bad_nodes(runs_dir)
    return Job.start(job, backends.named(backend), preflight, private)


def submit_words(
    job_file: str | None, extra_args: Sequence[str], fields: dict[str, Any], switches: list[str]
) -> list[str]:
    """``submit``'s command line for what ``fields`` ask (clustertrain.spec.flags), with
    ``switches`` of its own (a login node's clustertrain reads it: ``submit --host``, a
    notebook's call); what follows ``--`` is the training script's."""
    given = {name: value for name, value in fields.items() if name not in ("args", "skip_prepare")}
    # The job file's place in the snapshot is its place here, relative to this directory.
    words = [os.path.relpath(job_file)] if job_file else []
    words += as_flags(given) + ["--no-prepare"] * bool(fields.get("skip_prepare")) + switches
    if fields.get("args") is not None:
        return [*words, "--replace-args", "--", *fields["args"], *extra_args]
    return [*words, "--", *extra_args] if extra_args else words


def run_local(
    job_file: str | None = None,
    *,
    extra_args: Sequence[str] = (),
    runs_dir: str | None = None,
    preflight: bool = True,
    **fields: Any,
) -> Job:
    """Start the job on this machine without Slurm (see :mod:`clustertrain.backends.local`);
    returns at once. ``Job.wait()`` waits for it, ``Job.logs(follow=True)`` streams it.
    ``preflight=False`` starts even a module this host's Python cannot find."""
    job = plan(job_file, extra_args=extra_args, runs_dir=runs_dir, node_record=False, **fields)
    return schedule(job, "local", preflight)


def slurm() -> Slurm:
    """Slurm's commands, with this environment's configuration (``SLURM_CONF``, else Slurm's
    own default). The local test cluster is no default: ``clustertrain cluster up`` prints the
    ``export SLURM_CONF=...`` that points at it."""
    from clustertrain.backends.slurm import Slurm  # lazy: start-up time

    return Slurm()


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


def login_node(run: runs.Run) -> str | None:
    """The login node that answers for ``run`` (submitted with a host), else None."""
    return backends.for_run(run).host()


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

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, run_dir={str(self.run_dir)!r})"


def costs_since(
    period: str,
    runs_dir: str | None = None,
    warn: Callable[[str], None] | None = None,
    now: float | None = None,
) -> list[Cost]:
    """Each job's :meth:`Job.cost` (a sweep's total, its tasks in ``parts``), for the jobs
    under the runs root submitted within ``period`` (``7d``, ``12h``, ``30m``) before now,
    oldest first."""
    from clustertrain.runs import cost  # lazy: start-up time

    now = time.time() if now is None else now
    seconds = cost.period_s(period)
    found = cost.since(runs.all_runs(runs.runs_root(runs_dir), warn), seconds, now)
    return [Job(run).cost(warn, now) for run in found]
