"""What every training script needs inside a clustertrain job: a stop request agreed across
ranks, the "checkpoint taken, requeue me" handshake, and a way out that cannot abort.

A preemptible loop, in a handful of added lines::

    from clustertrain import runtime
    stop = runtime.StopRequest.install()           # USR2 (Slurm's warning) and SIGTERM
    for step, batch in enumerate(loader, start):
        ...train one step...
        if stop.agreed():                          # every rank gets the same answer
            save_checkpoint(...)                   # rank 0, e.g. clustertrain.rank.checkpoint.Store
            runtime.request_requeue()              # the batch script requeues the job
            break
    runtime.finish()                               # barrier, destroy, exit

Metrics and milestones, for ``status``, ``results``, ``plot`` and the timeline::

    runtime.milestone("rendezvous")                # the process group is up
    runtime.milestone("data_ready")                # start-up ends here (or at the first step)
    runtime.log_metrics(step, loss=loss)           # every N steps: the loss curve
    runtime.log_metrics(step, val_loss=val_loss)   # the job's headline if it says metric: val_loss

The names the batch script reads come from :mod:`clustertrain.protocol`. torch is imported
inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from clustertrain import protocol
from clustertrain.rank import env, events

# The exit status that asks the supervisor not to restart the step, nor to requeue the job:
# ``runtime.finish(runtime.NO_RESTART_EXIT)`` (or ``sys.exit``) where restarting cannot help.
NO_RESTART_EXIT = protocol.NO_RESTART_EXIT


class StopRequest:
    """Remembers a request to checkpoint and stop; the loop reads it at step boundaries.

    ``SIGUSR2`` is Slurm's warning before the time limit (clustertrain's batch script passes it
    on to every rank; ``scancel --signal=USR2 JOB`` sends it directly), ``SIGTERM`` is what
    Slurm sends on preemption and ``scancel``, KillWait seconds before SIGKILL. The handler only
    sets a flag: a step interrupted half-way could not be checkpointed. USR2 must be installed
    explicitly: clustertrain's launch script ignores it in the launcher, and workers inherit
    that.
    """

    SIGNALS = (getattr(signal, f"SIG{protocol.STOP_SIGNAL}"), signal.SIGTERM)

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    @classmethod
    def install(cls) -> StopRequest:
        """A request whose handlers are installed (in the main thread; elsewhere, e.g. a
        notebook's helper thread, Python cannot install handlers and the caller keeps its own)."""
        stop = cls()
        if threading.current_thread() is threading.main_thread():
            for signum in cls.SIGNALS:
                stop._previous[signum] = signal.signal(signum, stop._handle)
        return stop

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signal.Signals(signum).name

    def agreed(self, device: Any = None) -> bool:
        """Whether any rank was asked to stop; every rank gets the same answer (a collective
        when a process group is up, so call it on every rank at the same step).

        The signal reaches the ranks at slightly different moments; agreeing at each step
        boundary makes all of them stop after the same step.
        """
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self.received is not None
        if device is None:
            nccl = dist.get_backend() == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu"
        flag = torch.tensor([int(self.received is not None)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def requeue_file() -> Path | None:
    """Where this job's batch script looks for a requeue request; None outside a job."""
    path = os.environ.get(protocol.ENV_REQUEUE_FILE)
    return Path(path) if path else None


def request_requeue() -> Path | None:
    """Ask the batch script to requeue the job once this attempt ends.

    Call it after the checkpoint is durable (on any rank; rank 0 is the usual one). Once the
    file exists the job is requeued whatever the ranks' exit status, so a rank that crashes on
    its way out cannot turn a clean stop into a failed job. Returns the file, or None outside a
    clustertrain job (start the script again to resume).
    """
    path = requeue_file()
    if path is not None:
        path.touch()
    return path


def teardown(accelerator: Any = None) -> None:
    """Leave the process group together: a barrier, then destroy it (Accelerate's
    ``end_training`` when an ``accelerator`` is given). Safe to call when none is up.

    The barrier matters: a rank that closes its connections while a peer is still inside its
    last collective makes that peer fail.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    if accelerator is not None:
        accelerator.end_training()
    env.destroy_process_group()


def finish(code: int = 0, accelerator: Any = None) -> NoReturn:
    """:func:`teardown`, then end this process with ``code`` without the native teardown
    that can abort it.

    Why: once a model has been wrapped in ``DistributedDataParallel`` (directly or by
    Accelerate), torch keeps its process group alive after ``destroy_process_group``; its
    worker and I/O threads (``pt_gloo_runloop``, ``gloo_tcp_loop``, NCCL's watchdog) are still
    running when the interpreter exits, and the exit destroys the C++ objects under them. That
    race is the rare "terminate called without an active exception" (SIGABRT) after a clean
    stop. Here the Python side ends normally, atexit handlers run and every stream is flushed,
    and then ``os._exit`` ends the process: the threads are never torn down while they run.
    As with multiprocessing's workers, which end the same way, files must be closed first.
    """
    try:
        teardown(accelerator)
    except BaseException:
        # A peer that died first makes the barrier fail: say so, and exit non-zero.
        traceback.print_exc()
        code = code or 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def log_metrics(step: int | None = None, **values: Any) -> None:
    """Record this job's metrics at ``step`` (rank 0 records; every other rank, and a script
    run outside a clustertrain job, does nothing). A value may be a number or a one-element
    tensor; its name must be a metric name (e.g. ``loss``, ``val_loss``, ``val/acc``).

    The job file's ``metric`` names the headline that ``status``, ``results`` (a sweep's best
    first, by ``metric_mode``) and ``plot`` show; ``plot`` also draws ``loss``.
    """
    for name in values:
        if not protocol.METRIC_NAME.fullmatch(name):
            raise ValueError(f"log_metrics: {name!r} is not a metric name (e.g. val_loss)")
    numbers = {name: float(value) for name, value in values.items()}
    events.record("metrics", **({} if step is None else {"step": int(step)}), **numbers)


def milestone(name: str, seconds: float | None = None) -> None:
    """Mark a point of this job's start-up on its timeline (rank 0 records): ``rendezvous``
    once the process group is up, ``data_ready`` once the data is loaded (start-up ends at the
    first of it and the first step); ``seconds`` what it took, if the script knows."""
    if name not in events.MILESTONES:
        raise ValueError(f"milestone: {name!r} is none of {', '.join(events.MILESTONES)}")
    events.record(name, **({} if seconds is None else {"seconds": float(seconds)}))


class _Heartbeat:
    """One rank's progress file: the newest step, the running totals of seconds in
    :func:`compute` sections and of samples, written in place at every call (one pwrite of a
    fixed-width line: microseconds, bench/heartbeat.py), its mtime the time of progress. Beside
    it, once, the rank's node (``rank-N.node``). One reader reads both (clustertrain.node.beats)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.ready = False
        self.compute_s = 0.0
        self.samples = 0

    def beat(self, step: int) -> None:
        if not self.ready:
            self._start()
        if self.fd is not None:
            line = f"{step:>20} {self.compute_s:>20.6f} {self.samples:>20}\n"
            os.pwrite(self.fd, line.encode(), 0)

    def _start(self) -> None:
        """Open the file, and have every thread's stack appended beside it on DUMP_SIGNAL
        (faulthandler: it works even while the rank is blocked inside a C call)."""
        self.ready = True
        folder = os.environ.get(protocol.ENV_HEARTBEAT_DIR)
        if not folder:
            return
        rank = env.from_environ().rank
        Path(folder).mkdir(parents=True, exist_ok=True)
        beat = Path(folder, f"{protocol.BEAT_PREFIX}{rank}")
        self.fd = os.open(beat, os.O_WRONLY | os.O_CREAT, 0o644)
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        Path(f"{beat}{protocol.BEAT_NODE_SUFFIX}").write_text(node + "\n", encoding="utf-8")
        # Appended to at each signal: whoever sent it reads what came after (node.stacks).
        dumps = Path(f"{beat}{protocol.DUMPS_SUFFIX}")
        stacks = open(dumps, "w")  # noqa: SIM115 - kept open
        signum = getattr(signal, f"SIG{protocol.DUMP_SIGNAL}")
        faulthandler.register(signum, file=stacks, all_threads=True, chain=False)


_HEARTBEAT = _Heartbeat()


@contextlib.contextmanager
def compute() -> Iterator[None]:
    """Time this rank's own work: a section with no collective in it (DDP's backward waits for
    every rank in its all-reduce, and so does a whole step). Its running total rides on
    :func:`heartbeat`, and the watchdog names a node whose ranks stay slower than the others'
    (``straggler: node3 ...``). Costs two clock reads.

    Not around a DDP model's call: DDP's forward begins with a broadcast of the module's
    buffers (BatchNorm's statistics) from rank 0, in which rank 0 waits for the slowest rank,
    so a slow node makes rank 0 look slow too. :func:`time_forward` times the module inside.
    """
    started = time.perf_counter()
    try:
        yield
    finally:
        _HEARTBEAT.compute_s += time.perf_counter() - started


def time_forward(module: Any) -> None:
    """Time every training-mode forward pass of ``module`` (a ``torch.nn.Module``, before DDP or
    Accelerate wraps it) as this rank's own work, as :func:`compute` does: the module inside
    the wrapper, after DDP's broadcast of its buffers, has no collective in it."""
    started: list[float] = []

    def before(*_: Any) -> None:
        if module.training:
            started.append(time.perf_counter())

    def after(*_: Any) -> None:
        if started:
            _HEARTBEAT.compute_s += time.perf_counter() - started.pop()

    module.register_forward_pre_hook(before)
    module.register_forward_hook(after)


def heartbeat(step: int, samples: int = 0) -> None:
    """Say this rank made progress (call it once per training step, on every rank); with
    ``samples``, how many this rank trained on since its last call (``clustertrain top`` shows
    samples per second from their running total).

    In a clustertrain job, the batch script's watchdog declares a hang when no rank has called
    this for ``hang_timeout_s`` seconds: it saves every rank's stack in the run folder, names
    the ranks that are stuck and where, and ends the job instead of letting it burn its
    allocation until the time limit. Outside a job it does nothing.
    """
    _HEARTBEAT.samples += int(samples)
    _HEARTBEAT.beat(step)
