"""Local runs: the same spec on this machine, without Slurm, into the same run-folder layout.

``clustertrain run`` starts ``python -m clustertrain.backends.local RUN_DIR`` (the supervisor) and
follows its logs. The supervisor starts one launcher with ``--standalone`` rendezvous and
``nodes x processes`` ranks here, writes its output where a Slurm job's node would
(``logs/attempt-0/<host>.{out,err}``), and records the outcome in ``local.json``, so
``status``, ``logs`` and ``list`` read a local run as they read a Slurm job. Its id is
``local-<supervisor pid>``; ``cancel`` sends the supervisor SIGTERM, which it passes on.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clustertrain import protocol
from clustertrain.backends.base import Backend
from clustertrain.errors import UserError
from clustertrain.files import RunFolderError, parse_json, read_regular
from clustertrain.jobstate import JOB_IDS, LOCAL, Accounting, Holding, JobState
from clustertrain.procs import start_time
from clustertrain.render import (
    OFFLINE_ENV,
    RenderedJob,
    launcher_argv,
    rank_environment,
    venv_environment,
)
from clustertrain.runs import Run
from clustertrain.spec import JobSpec, build_spec

STATE_FILE = "local.json"
NODE = re.sub(r"[^A-Za-z0-9._-]", "-", os.uname().nodename) or "localhost"


# The module a local run's supervisor runs as (python -m), which cancel checks it is.
SUPERVISOR = "clustertrain.backends.local"


def environment(spec: JobSpec, run_dir: Path, base: dict[str, str]) -> dict[str, str]:
    """What the batch script exports for the ranks (templates/slurm/sbatch.sh.j2), here."""
    env = dict(base)
    # No requeue here: a rank that checkpoints on a stop request is told to start it again.
    env.pop(protocol.ENV_REQUEUE_FILE, None)
    env.update(rank_environment(spec, str(run_dir), requeue=False))
    env.update(venv_environment(spec.venv, env))
    if spec.offline:
        for key, value in OFFLINE_ENV:
            env.setdefault(key, value)
    env.update(dict(spec.env))
    # The ranks share this machine's CPUs, as a node's share its task's (launch.sh.j2).
    cpus = len(os.sched_getaffinity(0))
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpus // spec.world_size)))
    no_gpu = not glob.glob(protocol.NVIDIA_DEVICES)
    if spec.launcher == "accelerate" and no_gpu:
        env.setdefault("ACCELERATE_USE_CPU", "1")  # as launch.sh.j2: train across the world
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_state(run_dir: Path, **fields: Any) -> None:
    """``local.json``: the supervisor's pid and start, then its launcher's exit status."""
    tmp = run_dir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(fields) + "\n", encoding="utf-8")
    tmp.replace(run_dir / STATE_FILE)


def read_state(run_dir: Path) -> dict[str, Any]:
    try:
        record = parse_json(read_regular(run_dir / STATE_FILE, 4096), STATE_FILE)
    except RunFolderError:
        return {}
    return record if isinstance(record, dict) else {}


def state(run_dir: Path, job_id: str) -> JobState:
    """The run's :class:`~clustertrain.jobstate.JobState`, in Slurm's words."""
    record = read_state(run_dir)
    pid, started, code = record.get("pid"), record.get("start_time"), record.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        cancelled = record.get("cancelled") is True
        name = "CANCELLED" if cancelled else "COMPLETED" if code == 0 else "FAILED"
        return JobState(job_id, name, NODE, exit_code=f"{code}:0", source=LOCAL)
    if isinstance(pid, int) and started is not None and _supervises(pid, started, run_dir):
        return JobState(job_id, "RUNNING", NODE, source=LOCAL)
    # The supervisor is gone without recording an end: killed (SIGKILL, a reboot).
    reason = "the local supervisor ended without a record"
    return JobState(job_id, "FAILED", NODE, reason=reason, source=LOCAL)


def _supervises(pid: int, started: object, run_dir: Path) -> bool:
    """Whether ``pid`` is this run's supervisor, as clustertrain started it: its start time,
    its owner (this user) and its command line (``python -m clustertrain.backends.local
    RUN_DIR``). A run folder is anyone's to write: a pid and a start time in it are claims, and
    every process's start time is readable in /proc."""
    if start_time(pid) != started:
        return False
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return False
    if owner != os.getuid() or len(argv) != 4 or argv[1:3] != [b"-m", SUPERVISOR.encode()]:
        return False
    return Path(os.fsdecode(argv[3])).resolve() == run_dir.resolve()


def cancel(run_dir: Path, job_id: str) -> None:
    """End the run: SIGTERM to its supervisor, only when it is provably this run's."""
    record = read_state(run_dir)
    pid = record.get("pid")
    if state(run_dir, job_id).state == "RUNNING" and isinstance(pid, int):
        os.kill(pid, signal.SIGTERM)


def supervise(run_dir: Path) -> int:
    """Run the spec recorded in ``run_dir``; returns the launcher's exit status."""
    import yaml  # lazy: start-up time, as in clustertrain.spec.jobfile

    spec = build_spec(yaml.safe_load((run_dir / protocol.SPEC_FILE).read_text(encoding="utf-8")))
    me = os.getpid()
    stop = _Stop()
    write_state(run_dir, pid=me, start_time=start_time(me))
    log_dir = run_dir / protocol.LOGS_DIR / f"{protocol.ATTEMPT_DIR}0"
    log_dir.mkdir(parents=True, exist_ok=True)
    argv = launcher_argv(spec, standalone_port=free_port())
    with open(log_dir / f"{NODE}.out", "ab") as out, open(log_dir / f"{NODE}.err", "ab") as err:
        out.write(f"clustertrain: local run on {NODE}: {' '.join(argv)}\n".encode())
        out.flush()
        try:
            # A session of its own: a terminal's or a notebook kernel's interrupt reaches the
            # launcher once, through _Stop, not twice.
            env = environment(spec, run_dir, dict(os.environ))
            # The ranks' heartbeats, as on a node: what `stacks` and `top` read (no watchdog).
            env[protocol.ENV_HEARTBEAT_DIR] = str(log_dir / protocol.HEARTBEAT_DIR)
            launcher = subprocess.Popen(
                argv, stdout=out, stderr=err, env=env, start_new_session=True
            )
        except OSError as exc:
            err.write(f"clustertrain: cannot start {argv[0]}: {exc.strerror}\n".encode())
            write_state(run_dir, pid=me, start_time=start_time(me), exit_code=127)
            return 127
    stop.started(launcher)
    code = launcher.wait()
    code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
    cancelled = stop.signum is not None
    write_state(run_dir, pid=me, start_time=start_time(me), exit_code=code, cancelled=cancelled)
    return code


class _Stop:
    """The supervisor's first SIGTERM or SIGINT (``cancel``, an interrupt), passed on to the
    launcher once, even one that came before the launcher started: torchrun signalled again
    while it stopped its ranks hung in its own shutdown for half a minute."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.sent = False
        self.launcher: subprocess.Popen[bytes] | None = None
        signal.signal(signal.SIGTERM, self.received)
        signal.signal(signal.SIGINT, self.received)

    def received(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
            if self.launcher is not None:
                self.sent = True
                self.launcher.send_signal(signum)

    def started(self, launcher: subprocess.Popen[bytes]) -> None:
        self.launcher = launcher
        if self.signum is not None and not self.sent:
            self.sent = True
            launcher.send_signal(self.signum)


class LocalBackend(Backend):
    """This machine, without Slurm: one supervisor process per run (see the module's doc)."""

    name = "local"
    job_ids = JOB_IDS[name]
    accepted = "started"
    no_accounting = "no accounting: a local run"

    @staticmethod
    def cancel_command(job_id: str) -> str:
        return f"kill {job_id.removeprefix('local-')}"

    def __init__(self) -> None:
        # The supervisors started here, to reap once they end (a zombie would look alive).
        self._started: dict[str, subprocess.Popen[bytes]] = {}

    def check(self, job: RenderedJob, preflight: bool = True) -> None:
        if job.spec.sweep:
            raise UserError("sweep: a local run is one job; submit a sweep to Slurm (job array)")
        if job.spec.spare_nodes:
            raise UserError(
                f"spare_nodes: {job.spec.spare_nodes}: a local run has one node; "
                "submit to Slurm to hold spare nodes"
            )
        if job.spec.container_image:
            raise UserError(
                f"container_image: a local run uses this machine's Python, not "
                f"{job.spec.container_image}; submit the job to Slurm to run it in the container"
            )

    def submit(self, job: RenderedJob) -> str:
        argv = [sys.executable, "-m", SUPERVISOR, job.run_dir]
        supervisor = subprocess.Popen(argv)
        write_state(Path(job.run_dir), pid=supervisor.pid, start_time=start_time(supervisor.pid))
        job_id = f"local-{supervisor.pid}"
        self._started[job_id] = supervisor
        return job_id

    def state(self, run: Run) -> JobState:
        # A supervisor started here is known by its Popen: between its fork and its exec, its
        # command line is not yet the one _supervises checks (a state asked at once said FAILED).
        if self._running_here(run):
            return JobState(run.job_id, "RUNNING", NODE, source=LOCAL)
        return state(run.path, run.job_id)

    def accounting(self, run: Run) -> Accounting | None:
        """What this machine kept: the supervisor's end (state, exit code); no steps, no
        measured use (no accounting daemon measures a local run)."""
        found = self.state(run)
        if not found.finished:
            return None
        return Accounting(run.job_id, found.state, found.exit_code)

    def holding(self, run: Run) -> Holding:
        """This machine, the one node, while the run's supervisor runs (started by this user:
        its run folder is theirs)."""
        return Holding(run.job_id, self.state(run).state, os.getuid(), (NODE,))

    def node_command(
        self, run: Run, argv: Sequence[str], node: str | None = None, pty: bool = False
    ) -> list[str]:
        """A local run's one node is this machine: the command itself (in this terminal)."""
        if node not in (None, NODE):
            raise UserError(f"node: {node!r}: a local run has one node, {NODE}")
        return list(argv)

    def cancel(self, run: Run) -> None:
        if self._running_here(run):
            self._started[run.job_id].terminate()
        else:
            cancel(run.path, run.job_id)

    def _running_here(self, run: Run) -> bool:
        """Whether ``run``'s supervisor was started here and has not recorded its end."""
        started = self._started.get(run.job_id)
        if started is None or started.poll() is not None:  # poll: reap it once it ends
            return False
        return "exit_code" not in read_state(run.path)

    def wait(self, run: Run, timeout: float) -> None:
        """Wait for a supervisor started here to end (after an interrupt, say)."""
        if run.job_id in self._started:
            self._started[run.job_id].wait(timeout)


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
