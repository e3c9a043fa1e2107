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
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from clustertrain import backends, runs
from clustertrain.errors import FieldError, UserError
from clustertrain.job import Job, backend_for, slurm_conf_hint
from clustertrain.pipeline.plan import default_job_file, plan
from clustertrain.render import RenderedJob
from clustertrain.spec.flags import as_flags

# Lazy below, for start-up time: a dry run needs neither the backends nor the log reader, and
# submitit alone costs 0.1 s.
if TYPE_CHECKING:
    from clustertrain.backends.remote import RemoteBackend
    from clustertrain.backends.slurm import Slurm
    from clustertrain.runs.cost import Cost

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


def login_node(run: runs.Run) -> str | None:
    """The login node that answers for ``run`` (submitted with a host), else None."""
    return backends.for_run(run).host()


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
