"""From a notebook to the cluster: :func:`notebook_launcher` runs a function of the notebook on
every rank of a job, streams the ranks' lines into the cell, and returns rank 0's return value.

Example, in a notebook cell::

    import clustertrain

    def training(epochs):
        from jobs.mnist import train
        return train.train(train.parse_args(["--strategy", "accelerate", "--epochs", str(epochs)]))

    final = clustertrain.notebook_launcher(training, (2,), nodes=2, procs_per_node=2)

The function and its arguments are pickled here (cloudpickle: the notebook's own functions by
value, an installed module's by name), each object that cannot be pickled or is too large named
before anything is queued, and written into the run folder, 0600. Every rank runs
``python -m clustertrain.rank.notebook`` under the launcher, with the environment any script
gets (:mod:`clustertrain.rank.notebook` says what it reads and writes, and why the value read
back here is trusted). The job is planned as ``submit`` plans one (the same fields, checked the
same way) and queued with the ``slurm`` backend, or started here with ``local`` (``run``).
"""

from __future__ import annotations

import os
import pickle
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from clustertrain import api, protocol
from clustertrain.errors import FieldError
from clustertrain.files import RunFolderError, parse_json, printable, read_own, read_regular
from clustertrain.jobstate import TERMINAL_STATES, JobState
from clustertrain.rank import notebook as rank_side
from clustertrain.runs import logs
from clustertrain.runs.why import Cause, Kind
from clustertrain.spec.fields import name_from

from .pack import pack

__all__ = ["JobFailed", "notebook_launcher", "pack", "queue"]

MAX_BYTES = 64 << 20
RUNNER = "clustertrain.rank.notebook"
# The login node's command that queues a call it reads on stdin (clustertrain.cli.notebook).
FAR_COMMAND = "notebook-submit"
# Fields the call itself decides: the entrypoint is the runner, and a call is one job.
_OWN_FIELDS = ("script", "module", "sweep", "max_parallel")
# Slurm's states of a job that has not started its ranks yet.
_WAITING = ("PENDING", "CONFIGURING")
_SAY_STILL_WAITING_S = 60.0
# What a login node's clustertrain says of a job it queued, which _watch says here.
_SAID_BY_WATCH = ("submitted job ", "run folder: ", "follow it: ")
_CANCEL_WAIT_S = 30.0


class JobFailed(Exception):
    """A notebook's job that ended without rank 0's return value, in one line: why, as
    ``status`` says it; the ``cause`` itself (:class:`clustertrain.runs.why.Cause`) where the
    job's records name one, and the ``rank`` that failed."""

    def __init__(
        self, message: str, job: api.Job, rank: int | None = None, cause: Cause | None = None
    ) -> None:
        super().__init__(message)
        self.job, self.rank, self.cause = job, rank, cause


def notebook_launcher(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    nodes: int | None = None,
    procs_per_node: int | None = None,
    launcher: str = "accelerate",
    backend: str = "slurm",
    runs_dir: str | None = None,
    preflight: bool = True,
    max_bytes: int = MAX_BYTES,
    out: TextIO | None = None,
    host: str | None = None,
    allow_dirty: bool = False,
    remote_clustertrain: str | None = None,
    **fields: Any,
) -> Any:
    """``fn(*args)`` on every rank of a job of ``nodes`` x ``procs_per_node`` processes under
    ``launcher`` (``accelerate`` or ``torchrun``); rank 0's return value.

    ``fields`` are the job file's keys, as ``clustertrain.submit`` takes them (``gpus_per_node``,
    ``partition``, ``time``, ``prepare``...). ``backend="local"`` runs the job on this machine
    without Slurm. With ``host`` (or ``$CLUSTERTRAIN_HOST``) the login node's clustertrain
    queues it, in a snapshot of the git tree this notebook runs in, as ``submit --host`` does
    (``allow_dirty``, ``remote_clustertrain`` as there). The pickled call, and rank 0's pickled
    return value, may take ``max_bytes`` each. Every rank's lines are printed to ``out`` (the
    cell's output) as they come.

    Bad input (a field, a function or argument that cannot be pickled, a call over
    ``max_bytes``) raises one :class:`~clustertrain.errors.UserError` before anything is queued.
    Interrupting the cell cancels the job. A job that fails raises :class:`JobFailed`, naming
    the first rank that failed and its error.
    """
    out = out or sys.stdout
    if backend == "slurm":
        host = host or os.environ.get("CLUSTERTRAIN_HOST") or None  # as submit reads it
    elif host:
        raise FieldError("host", host, "a login node queues Slurm jobs: leave backend out")
    _refuse_own(fields)
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
        raise FieldError("max_bytes", max_bytes, "a number of bytes, e.g. 256 << 20")
    key = secrets.token_bytes(32)
    call = pack(fn, args, key, max_bytes)
    fields.setdefault("name", name_from(getattr(fn, "__name__", "") or "notebook"))
    fields.setdefault("max_restarts", 0)  # a call runs once; a failure comes back to the cell
    fields.update(nodes=nodes, procs_per_node=procs_per_node, launcher=launcher)
    if host is not None:
        far = (host, allow_dirty, remote_clustertrain)
        job = _queue_far(far, call, max_bytes, (runs_dir, preflight, out), fields)
    else:
        job = queue(call, max_bytes, backend, preflight, runs_dir, **fields)
    try:
        state = _watch(job, out)
    except KeyboardInterrupt:
        _cancel(job, out)
        raise
    return outcome(job, state, key, max_bytes)


def queue(
    call: bytes,
    max_bytes: int,
    backend: str = "slurm",
    preflight: bool = True,
    runs_dir: str | None = None,
    **fields: Any,
) -> api.Job:
    """The job of a packed ``call`` (:func:`pack`), planned as ``submit`` plans one and queued
    with ``backend``, the call 0600 in its run folder. A login node's clustertrain queues the
    call it receives from a notebook elsewhere with this (``clustertrain notebook-submit``)."""
    _refuse_own(fields)
    fields = {name: value for name, value in fields.items() if name not in _OWN_FIELDS}
    planned = api.plan(
        runs_dir=runs_dir, module=RUNNER, args=[str(max_bytes)],
        node_record=backend == "slurm", **fields,
    )  # fmt: skip
    return api.schedule(planned, backend, preflight, runs_dir, {protocol.NOTEBOOK_CALL: call})


def _queue_far(
    far: tuple[str, bool, str | None],
    call: bytes,
    max_bytes: int,
    here: tuple[str | None, bool, TextIO],
    fields: dict[str, Any],
) -> api.Job:
    """The call queued by ``host``'s clustertrain (``far``: the host, allow_dirty, its
    clustertrain; ``here``: the runs dir, preflight, the cell), the fields checked here first;
    the job as this side records it. What the host says goes to the cell, less the lines
    that :func:`_watch` says in its own words."""
    from clustertrain.backends.remote import ssh  # lazy: start-up time

    host, allow_dirty, clustertrain = far
    runs_dir, preflight, out = here
    ssh.check_host(host)
    api.refuse_with_host(fields)
    planned = api.plan(
        runs_dir=runs_dir, module=RUNNER, args=[str(max_bytes)], node_record=False, **fields
    )  # fmt: skip
    switches = [f"--max-bytes={max_bytes}"] + ["--no-preflight"] * (not preflight)
    backend = api.login_backend(
        host, api.submit_words(None, (), fields, switches), runs_dir, allow_dirty, clustertrain,
        command=FAR_COMMAND, stdin=call,
        echo=lambda line: None if line.startswith(_SAID_BY_WATCH) else print(line, file=out),
    )  # fmt: skip
    return api.Job.start(planned, backend, preflight)


def _refuse_own(fields: dict[str, Any]) -> None:
    for name in _OWN_FIELDS:
        if fields.get(name):
            raise FieldError(name, fields[name], _REFUSED[name])


_REFUSED = {
    "sweep": "a call is one job: call notebook_launcher once for each value",
    "max_parallel": "a call is one job: call notebook_launcher once for each value",
    "script": "the call runs fn on every rank; leave script and module out",
    "module": "the call runs fn on every rank; leave script and module out",
}


def _watch(job: api.Job, out: TextIO) -> JobState:
    """A progress line while the job waits for its nodes, then every rank's lines as ``logs
    --follow`` prints them, until it ends; its state then."""
    run = job.run
    what = f"{run.nodes} node(s) x {run.world_size // run.nodes} process(es), {run.launcher}"
    _say(out, f"job {run.job_id} {job.backend.accepted}: {what}; run folder {run.path}")
    state = _until_started(job, out)
    if not state.finished:
        where = f" on {state.nodes}" if state.nodes else ""
        _say(out, f"job {run.job_id} {state.state}{where}: the ranks are starting")
        for line in job.logs(follow=True):
            print(line, file=out, flush=True)
        state = job.job_state()
    _say(out, f"job {run.job_id} ended {state.state}")
    return state


def _until_started(
    job: api.Job,
    out: TextIO,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> JobState:
    """The job's state once it is no longer waiting, said when it changes (and every minute
    while it waits)."""
    started, said, said_at = clock(), "", 0.0
    while True:
        state = job.job_state()
        if state.state not in _WAITING:
            return state
        now = f"{state.state}" + (f" ({state.reason})" if state.reason else "")
        if now != said or clock() - said_at >= _SAY_STILL_WAITING_S:
            _say(out, f"job {job.job_id} {now}, {clock() - started:.0f} s since it was queued")
            said, said_at = now, clock()
        sleep(logs.STATE_POLL_S)


def _cancel(job: api.Job, out: TextIO) -> None:
    job.cancel()
    state = job.wait(timeout=_CANCEL_WAIT_S, poll_s=1.0)
    if state in TERMINAL_STATES:
        _say(out, f"cell interrupted: job {job.job_id} cancelled ({state})")
    else:
        _say(
            out, f"cell interrupted: job {job.job_id} was told to stop, and is still {state} "
            f"after {_CANCEL_WAIT_S:.0f} s; see `clustertrain status {job.job_id}`",
        )  # fmt: skip


def _say(out: TextIO, line: str) -> None:
    print(f"clustertrain: {line}", file=out, flush=True)


def outcome(job: api.Job, state: JobState, key: bytes, max_bytes: int) -> Any:
    """Rank 0's return value, read back from a job that completed; else :class:`JobFailed`."""
    _bring_back(job, max_bytes)
    if state.state != "COMPLETED":
        raise _failure(job, state)
    path = job.run_dir / protocol.NOTEBOOK_RESULT
    try:
        data = rank_side.unseal(key, read_own(path, max_bytes + rank_side.SEAL_BYTES))
    except RunFolderError as exc:
        raise JobFailed(
            f"job {job.job_id} COMPLETED without rank 0's return value: {exc}", job
        ) from None
    if data is None:
        raise JobFailed(f"{path}: not written by this run's rank 0; it is not unpickled", job)
    try:
        return pickle.loads(data)
    except Exception as exc:
        raise JobFailed(
            f"job {job.job_id}: rank 0's return value cannot be unpickled here "
            f"({rank_side.error_line(exc)}); return plain data (a CPU tensor, numbers)",
            job,
        ) from None


def _bring_back(job: api.Job, max_bytes: int) -> None:
    """A job queued by a login node: its result and errors, copied from the run folder there
    into this side's (the result is still read as :func:`outcome` reads any)."""
    from clustertrain.backends import remote  # lazy: start-up time

    far = remote.of(job.run)
    if far is not None:
        names = (protocol.NOTEBOOK_RESULT, protocol.NOTEBOOK_ERROR.format(rank="*"))
        limit = max_bytes + rank_side.SEAL_BYTES + job.run.world_size * 8192 + (1 << 20)
        remote.fetch(far, job.run_dir, names, limit)


def _failure(job: api.Job, state: JobState) -> JobFailed:
    """The job's failure in one line, as ``status`` says it (clustertrain.runs.why): its cause
    where one is known; else the first rank's own error where ranks wrote theirs; else the
    job's state."""
    ended = f"job {job.job_id} ended {state.state}"
    cause = job.status(state=state).cause
    if cause is not None and cause.kind is not Kind.UNKNOWN:
        pick = f" --rank {cause.rank}" if cause.rank is not None else ""
        return JobFailed(
            f"{ended}: {cause.headline} (its lines: clustertrain logs {job.job_id}{pick})",
            job,
            cause.rank,
            cause,
        )
    first = (
        None
        if state.state.startswith("CANCELLED")
        else first_error(job.run_dir, job.run.world_size)
    )
    if first is None:
        reason = f" ({state.reason})" if state.reason else ""
        return JobFailed(
            f"{ended}{reason}; its lines: clustertrain logs {job.job_id}", job, None, cause
        )
    rank, node, error = first
    return JobFailed(
        f"{ended}: rank {rank} on {node} failed first: {error} "
        f"(its lines: clustertrain logs {job.job_id} --rank {rank})",
        job,
        rank,
        cause,
    )


def first_error(run_dir: Path, world_size: int) -> tuple[int, str, str] | None:
    """(rank, node, error) of the rank that wrote the earliest error, from the run folder's
    error files (:mod:`clustertrain.rank.notebook`); each read as text anyone may have forged."""
    found: list[tuple[float, int, str, str]] = []
    for rank in range(world_size):
        name = protocol.NOTEBOOK_ERROR.format(rank=rank)
        try:
            record = parse_json(read_regular(run_dir / name, 4096), name)
        except RunFolderError:
            continue
        if not isinstance(record, dict) or record.get("rank") != rank:
            continue
        when, node, error = record.get("time"), record.get("node"), record.get("error")
        if isinstance(when, int | float) and isinstance(node, str) and isinstance(error, str):
            found.append((float(when), rank, printable(node)[:64], printable(error)[:1000]))
    return min(found)[1:] if found else None
