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

import inspect
import os
import pickle
import secrets
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from clustertrain import api, protocol
from clustertrain.errors import FieldError, UserError
from clustertrain.files import RunFolderError, parse_json, printable, read_own, read_regular
from clustertrain.jobstate import TERMINAL_STATES, JobState
from clustertrain.rank import notebook as rank_side
from clustertrain.runs import logs
from clustertrain.spec.fields import name_from

MAX_BYTES = 64 << 20
RUNNER = "clustertrain.rank.notebook"
# Fields the call itself decides: the entrypoint is the runner, and a call is one job.
_OWN_FIELDS = ("script", "module", "sweep", "max_parallel")
# Slurm's states of a job that has not started its ranks yet.
_WAITING = ("PENDING", "CONFIGURING")
_SAY_STILL_WAITING_S = 60.0
_CANCEL_WAIT_S = 30.0


class JobFailed(Exception):
    """A notebook's job that ended without rank 0's return value, in one line: the first rank
    that failed and its error, where the job says them."""

    def __init__(self, message: str, job: api.Job, rank: int | None = None) -> None:
        super().__init__(message)
        self.job, self.rank = job, rank


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
    **fields: Any,
) -> Any:
    """``fn(*args)`` on every rank of a job of ``nodes`` x ``procs_per_node`` processes under
    ``launcher`` (``accelerate`` or ``torchrun``); rank 0's return value.

    ``fields`` are the job file's keys, as ``clustertrain.submit`` takes them (``gpus_per_node``,
    ``partition``, ``time``, ``prepare``...). ``backend="local"`` runs the job on this machine
    without Slurm. The pickled call, and rank 0's pickled return value, may take ``max_bytes``
    each. Every rank's lines are printed to ``out`` (the cell's output) as they come.

    Bad input (a field, a function or argument that cannot be pickled, a call over
    ``max_bytes``) raises one :class:`~clustertrain.errors.UserError` before anything is queued.
    Interrupting the cell cancels the job. A job that fails raises :class:`JobFailed`, naming
    the first rank that failed and its error.
    """
    out = out or sys.stdout
    if backend == "slurm" and not fields.get("host") and os.environ.get("CLUSTERTRAIN_HOST"):
        fields["host"] = os.environ["CLUSTERTRAIN_HOST"]  # as submit reads it
    for name in ("host", *_OWN_FIELDS):
        if fields.get(name):
            raise FieldError(name, fields[name], _REFUSED.get(name, "the call decides it"))
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
        raise FieldError("max_bytes", max_bytes, "a number of bytes, e.g. 256 << 20")
    key = secrets.token_bytes(32)
    call = pack(fn, args, key, max_bytes)
    fields.setdefault("name", name_from(getattr(fn, "__name__", "") or "notebook"))
    fields.setdefault("max_restarts", 0)  # a call runs once; a failure comes back to the cell
    planned = api.plan(
        runs_dir=runs_dir, module=RUNNER, args=[str(max_bytes)], nodes=nodes,
        procs_per_node=procs_per_node, launcher=launcher, node_record=backend == "slurm",
        **fields,
    )  # fmt: skip
    job = api.schedule(planned, backend, preflight, runs_dir, {protocol.NOTEBOOK_CALL: call})
    try:
        state = _watch(job, out)
    except KeyboardInterrupt:
        _cancel(job, out)
        raise
    return outcome(job, state, key, max_bytes)


_REFUSED = {
    "host": "notebook_launcher submits from where the notebook runs; open the notebook on the "
    "login node (JupyterHub, Open OnDemand), or write the function into a script and "
    "clustertrain.submit(script=..., host=...)",
    "sweep": "a call is one job: call notebook_launcher once for each value",
    "script": "the call runs fn on every rank; leave script and module out",
    "module": "the call runs fn on every rank; leave script and module out",
}


def pack(fn: Callable[..., Any], args: Sequence[Any], key: bytes, max_bytes: int) -> bytes:
    """The call as the ranks read it, or a :class:`UserError` naming the object that cannot
    be pickled, or the largest one when the call is over ``max_bytes``."""
    import cloudpickle  # lazy: start-up time (a dry run needs no pickling)

    if not callable(fn):
        raise FieldError("fn", fn, "give the function each rank calls: notebook_launcher(f, args)")
    if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn):
        raise FieldError(
            "fn", fn, "a generator or coroutine cannot come back from the ranks; return a list"
        )
    if not isinstance(args, tuple | list):
        raise FieldError("args", args, "a tuple of fn's arguments, e.g. (config,)")
    try:
        data: bytes = cloudpickle.dumps({"fn": fn, "args": tuple(args), "key": key})
    except Exception as exc:
        where, why = next(_unpicklable(fn, args), ("the call", rank_side.error_line(exc)))
        raise UserError(
            f"{where} cannot be pickled ({why}); create it inside the function (open files "
            "there), or pass what makes it (a path, a seed) instead"
        ) from None
    if len(data) > max_bytes:
        where, size = max(_sizes(fn, args), key=lambda pair: pair[1], default=("the call", 0))
        raise UserError(
            f"the call is {_mib(len(data))} pickled, over max_bytes ({_mib(max_bytes)}); "
            f"{where} is {_mib(size)} of it: load large data inside the function (from a file "
            "the nodes read), or raise max_bytes"
        )
    return data


def _parts(fn: Callable[..., Any], args: Sequence[Any]) -> Iterator[tuple[str, Any]]:
    """What a pickled call holds, each named as a user would look for it: the arguments, and
    what the function carries with it (its closure's variables, the globals it uses, its
    defaults, a method's object)."""
    for at, arg in enumerate(args):
        yield f"args[{at}]", arg
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if hasattr(fn, "__self__") and not inspect.ismodule(fn.__self__):
        yield f"the object of {name}", fn.__self__
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    for var, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or (), strict=False):
        yield f"{var} (a variable of {name}'s closure)", _content(cell)
    seen, used = getattr(fn, "__globals__", {}), _names(code)
    for var in used:
        if var in seen and not inspect.ismodule(seen[var]):
            yield f"{var} (a global {name} uses)", seen[var]
    for at, default in enumerate(getattr(fn, "__defaults__", None) or ()):
        yield f"default {at} of {name}", default


def _names(code: Any) -> list[str]:
    """The global names a code object and those nested in it (comprehensions, inner
    functions) load, in order, once each."""
    found = dict.fromkeys(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            found.update(dict.fromkeys(_names(const)))
    return list(found)


def _content(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a variable not yet assigned
        return None


def _unpicklable(fn: Callable[..., Any], args: Sequence[Any]) -> Iterator[tuple[str, str]]:
    import cloudpickle  # lazy: start-up time, as in pack

    for where, part in _parts(fn, args):
        try:
            cloudpickle.dumps(part)
        except Exception as exc:
            yield where, rank_side.error_line(exc)


def _sizes(fn: Callable[..., Any], args: Sequence[Any]) -> Iterator[tuple[str, int]]:
    import cloudpickle  # lazy: start-up time, as in pack

    for where, part in _parts(fn, args):
        yield where, len(cloudpickle.dumps(part))


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


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


def _failure(job: api.Job, state: JobState) -> JobFailed:
    """The job's failure in one line: the first rank's own error where ranks wrote theirs, else
    what the launcher reported of it, else the job's state."""
    ended = f"job {job.job_id} ended {state.state}"
    reason = f" ({state.reason})" if state.reason else ""
    if state.state.startswith("CANCELLED"):  # the ranks' errors are the stop's, not theirs
        return JobFailed(f"{ended}{reason}; its lines: clustertrain logs {job.job_id}", job)
    first = first_error(job.run_dir, job.run.world_size)
    if first is None and (report := logs.first_failure(job.run)) is not None:
        first = (report.rank, report.node, report.error or f"exit code {report.exit_code}")
    if first is None:
        return JobFailed(f"{ended}{reason}; its lines: clustertrain logs {job.job_id}", job)
    rank, node, error = first
    return JobFailed(
        f"{ended}: rank {rank} on {node} failed first: {error} "
        f"(its lines: clustertrain logs {job.job_id} --rank {rank})",
        job,
        rank,
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
