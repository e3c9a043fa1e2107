"""Local runs: the same spec on this machine, without Slurm, into the same run-folder layout.

``clustertrain run`` starts ``python -m clustertrain.backends.local RUN_DIR`` (the supervisor) and
follows its logs. The supervisor starts one launcher with ``--standalone`` rendezvous and
``nodes x processes`` ranks here, writes its output where a Slurm job's node would
(``logs/attempt-0/<host>.{out,err}``), and records the outcome in ``local.json``, so
``status``, ``logs`` and ``list`` read a local run as they read a Slurm job. Its id is
``local-<supervisor pid>``; ``cancel`` sends the supervisor SIGTERM, which it passes on.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from clustertrain import protocol
from clustertrain.files import RunFolderError, read_regular
from clustertrain.jobstate import LOCAL_ID, JobState
from clustertrain.procs import start_time
from clustertrain.render import OFFLINE_ENV, rank_environment
from clustertrain.spec import JobSpec

STATE_FILE = "local.json"
NODE = re.sub(r"[^A-Za-z0-9._-]", "-", os.uname().nodename) or "localhost"


def is_local(job_id: str) -> bool:
    return LOCAL_ID.fullmatch(job_id) is not None


def launcher_argv(spec: JobSpec, port: int) -> tuple[str, ...]:
    """One launcher for the whole world on this machine, its rendezvous on ``port``."""
    world = spec.world_size
    if spec.launcher == "accelerate":
        head: tuple[str, ...] = ("accelerate", "launch")
        head += ("--multi_gpu",) if world > 1 else ()
        head += ("--num_machines", "1", "--num_processes", str(world))
        head += ("--main_process_port", str(port), "--max_restarts", str(spec.max_restarts))
        head += ("--tee", "3")
    else:
        head = ("torchrun", "--standalone", "--nnodes=1", f"--nproc_per_node={world}")
        head += (f"--max_restarts={spec.max_restarts}", "--tee=3")
    return (*head, *spec.entrypoint, *spec.args)


def environment(spec: JobSpec, run_dir: Path, base: dict[str, str]) -> dict[str, str]:
    """What the batch script exports for the ranks (render/templates/sbatch.sh.j2), here."""
    env = dict(base)
    # No requeue here: a rank that checkpoints on a stop request is told to start it again.
    env.pop(protocol.ENV_REQUEUE_FILE, None)
    env.update(rank_environment(spec, str(run_dir), requeue=False))
    if spec.venv:
        env["VIRTUAL_ENV"] = spec.venv
        env["PATH"] = f"{spec.venv}/bin:{env.get('PATH', '')}"
    if spec.offline:
        for key, value in OFFLINE_ENV:
            env.setdefault(key, value)
    env.update(dict(spec.env))
    # The ranks share this machine's CPUs, as a node's share its task's (launch.sh.j2).
    cpus = len(os.sched_getaffinity(0))
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpus // spec.world_size)))
    no_gpu = not any(p.name[len("nvidia") :].isdigit() for p in Path("/dev").glob("nvidia*"))
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
        record = json.loads(read_regular(run_dir / STATE_FILE, 4096).decode("utf-8"))
    except (RunFolderError, UnicodeDecodeError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def state(run_dir: Path, job_id: str) -> Any:
    """The run's :class:`~clustertrain.jobstate.JobState`, in Slurm's words."""
    record = read_state(run_dir)
    pid, started, code = record.get("pid"), record.get("start_time"), record.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        cancelled = record.get("cancelled") is True
        name = "CANCELLED" if cancelled else "COMPLETED" if code == 0 else "FAILED"
        return JobState(job_id, name, NODE, exit_code=f"{code}:0")
    if isinstance(pid, int) and started is not None and start_time(pid) == started:
        return JobState(job_id, "RUNNING", NODE)
    # The supervisor is gone without recording an end: killed (SIGKILL, a reboot).
    return JobState(job_id, "FAILED", NODE, reason="the local supervisor ended without a record")


def cancel(run_dir: Path, job_id: str) -> None:
    record = read_state(run_dir)
    pid = record.get("pid")
    if state(run_dir, job_id).state == "RUNNING" and isinstance(pid, int):
        os.kill(pid, signal.SIGTERM)


def supervise(run_dir: Path) -> int:
    """Run the spec recorded in ``run_dir``; returns the launcher's exit status."""
    import yaml

    from clustertrain.spec import build_spec

    spec = build_spec(yaml.safe_load((run_dir / "spec.yaml").read_text(encoding="utf-8")))
    me = os.getpid()
    write_state(run_dir, pid=me, start_time=start_time(me))
    log_dir = run_dir / "logs" / "attempt-0"
    log_dir.mkdir(parents=True, exist_ok=True)
    argv = launcher_argv(spec, free_port())
    with open(log_dir / f"{NODE}.out", "ab") as out, open(log_dir / f"{NODE}.err", "ab") as err:
        out.write(f"clustertrain: local run on {NODE}: {' '.join(argv)}\n".encode())
        out.flush()
        try:
            launcher = subprocess.Popen(
                argv, stdout=out, stderr=err, env=environment(spec, run_dir, dict(os.environ))
            )
        except OSError as exc:
            err.write(f"clustertrain: cannot start {argv[0]}: {exc.strerror}\n".encode())
            write_state(run_dir, pid=me, start_time=start_time(me), exit_code=127)
            return 127
    cancelled = False

    def forward(signum: int, frame: Any) -> None:
        nonlocal cancelled
        cancelled = True
        launcher.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = launcher.wait()
    code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
    write_state(run_dir, pid=me, start_time=start_time(me), exit_code=code, cancelled=cancelled)
    return code


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
