"""The cost of fault tolerance on the local Slurm cluster: preempt a job twice, time what it costs.

    python bench/fault_tolerance.py [--write bench/RESULTS-fault-tolerance.md]

Submits a 2-node x 1-process MNIST job (DDP under torchrun, 4,000 images, 3 epochs) and sends
`scancel --signal=USR2` mid-epoch twice, as Slurm's warning before the time limit would. The first
requeued attempt waits out Slurm's own requeue delay; the second is released at once with
`scontrol update StartTime=now` (root). Then the same job runs uninterrupted. Reports:
(a) the time from the signal to the job RUNNING again and to its first training step, and
(b) the training time lost per preemption: the summed running time of the interrupted job's
attempts minus the uninterrupted job's, over the number of preemptions, and the checkpoint write
time the entrypoint logs. Needs `clustertrain cluster up` and root (for StartTime=now).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clustertrain import api  # noqa: E402
from clustertrain.env import rendezvous_port  # noqa: E402
from clustertrain.node.nodecheck import probe  # noqa: E402

TRAIN_ARGS = ["--strategy", "ddp", "--recipe", "fast", "--limit-train", "4000"]
TRAIN_ARGS += ["--batch-size", "32", "--lr", "0.05", "--epochs", "3", "--log-every", "5"]
JOB = ["jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1", "--", *TRAIN_ARGS]
POLL_S = 0.1
NOTES = """
Notes: Slurm holds a requeued job about 120 s before it may start again (its BeginTime); an
admin can skip that with `scontrol update jobid=ID StartTime=now`. The rendezvous-port wait is
how long the node check of `clustertrain/nodecheck.py` takes to bind the port again (at once
since it binds with SO_REUSEADDR; 60 s of TIME_WAIT before). The time lost per preemption is
the restart cost (srun, node check, launcher, imports, data, rendezvous) on this 2-core host:
no training step is lost or repeated.
"""


def _slurm(*args: str) -> str:
    done = subprocess.run(
        list(args), capture_output=True, text=True, env=api.slurm().environ, check=True, timeout=30
    )
    return done.stdout.strip()


def _wait(what: str, ready: Callable[[], bool], timeout_s: float = 600) -> float:
    """Poll until ``ready``; returns when it first held."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(POLL_S)
    return time.monotonic()


def _log(run_dir: Path, attempt: int) -> str:
    folder = run_dir / "logs" / f"attempt-{attempt}"
    if not folder.is_dir():
        return ""
    return "".join(p.read_text(errors="replace") for p in sorted(folder.glob("*.out")))


def _submit(env: dict[str, str]) -> tuple[str, Path]:
    done = subprocess.run(
        [sys.executable, "-m", "clustertrain", "submit", *JOB],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    job_id = re.search(r"submitted job (\d+)", done.stdout)
    run_dir = re.search(r"run folder: (.+)", done.stdout)
    if not (job_id and run_dir):
        raise RuntimeError(done.stdout + done.stderr)
    return job_id[1], Path(run_dir[1])


class Preemption:
    """One warning signal and the way back to training, timed from the signal."""

    def __init__(self, job_id: str, run_dir: Path, attempt: int, epoch: int) -> None:
        self.job_id, self.run_dir, self.attempt = job_id, run_dir, attempt
        mid_epoch = re.compile(rf"epoch {epoch}/3 step 20/")
        _wait("mid-epoch", lambda: bool(mid_epoch.search(_log(run_dir, attempt))))
        self.signalled = time.monotonic()
        _slurm("scancel", "--signal=USR2", job_id)
        self.requeued = _wait("requeue", lambda: api.slurm().state(job_id).state == "PENDING")
        stop = re.search(r"stopping on .* written in ([\d.]+) s", _log(run_dir, attempt))
        if stop is None:
            raise RuntimeError(f"attempt {attempt} did not checkpoint:\n{_log(run_dir, attempt)}")
        self.write_s = float(stop[1])
        self.released: float | None = None

    def release_now(self) -> None:
        """Skip Slurm's requeue delay, once the node check's port probe passes (at once since it
        binds with SO_REUSEADDR; before, it waited out the last attempt's TIME_WAIT, 60 s)."""
        port = rendezvous_port(int(self.job_id))
        self.port_free = _wait("port", lambda: "error" not in probe("127.0.0.1", port, True))
        # slurmd revokes the last attempt's credential with a time in whole seconds: a new one
        # issued within the same second counts as revoked, and the job fails.
        time.sleep(max(0.0, self.requeued + 2 - time.monotonic()))
        _slurm("scontrol", "update", f"jobid={self.job_id}", "StartTime=now")
        self.released = time.monotonic()

    def back(self) -> None:
        self.running = _wait("running", lambda: api.slurm().state(self.job_id).state == "RUNNING")
        resumed = re.compile(r"resuming at epoch \d+ step \d+ from")
        self.training = _wait(
            "resumed", lambda: bool(resumed.search(_log(self.run_dir, self.attempt + 1)))
        )


def _run_time(job_id: str, start: float | None = None) -> float:
    """Seconds from RUNNING (or ``start``) until the job leaves RUNNING."""
    if start is None:
        start = _wait("running", lambda: api.slurm().state(job_id).state == "RUNNING")
    return _wait("end", lambda: api.slurm().state(job_id).state != "RUNNING") - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="fault-tolerance-")
    env = {**os.environ, "CLUSTERTRAIN_RUNS_DIR": work, "XDG_CONFIG_HOME": work}  # own node record

    job_id, run_dir = _submit(env)
    first_start = _wait("running", lambda: api.slurm().state(job_id).state == "RUNNING")
    slow = Preemption(job_id, run_dir, attempt=0, epoch=1)
    slow.back()  # Slurm's own requeue delay
    fast = Preemption(job_id, run_dir, attempt=1, epoch=2)
    fast.release_now()
    fast.back()
    last = _run_time(job_id, fast.running)
    if (
        "restarts: 2"
        not in subprocess.run(
            [sys.executable, "-m", "clustertrain", "status", job_id],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    ):
        raise RuntimeError(f"job {job_id} did not end after exactly 2 restarts")
    interrupted = (slow.requeued - first_start) + (fast.requeued - slow.running) + last

    whole_id, _ = _submit(env)
    whole = _run_time(whole_id)
    lost = (interrupted - whole) / 2

    rows = [
        ("signal → checkpoint written, job requeued (PENDING)", slow.requeued - slow.signalled),
        ("signal → RUNNING again, Slurm's requeue delay", slow.running - slow.signalled),
        ("signal → training resumed, Slurm's requeue delay", slow.training - slow.signalled),
        ("signal → requeued (PENDING), second preemption", fast.requeued - fast.signalled),
        ("wait for the rendezvous port to leave TIME_WAIT", (fast.port_free - fast.requeued)),
        ("`scontrol update StartTime=now` → RUNNING", fast.running - (fast.released or 0)),
        ("signal → RUNNING again, StartTime=now (incl. port wait)", fast.running - fast.signalled),
        (
            "signal → RUNNING again, StartTime=now (excl. port wait)",
            fast.running - fast.signalled - (fast.port_free - fast.requeued),
        ),
        ("signal → training resumed, StartTime=now", fast.training - fast.signalled),
        (
            "signal → training resumed, StartTime=now (excl. port wait)",
            fast.training - fast.signalled - (fast.port_free - fast.requeued),
        ),
        ("checkpoint write (rank 0, mean of 2)", (slow.write_s + fast.write_s) / 2),
        ("running time, uninterrupted job", whole),
        ("running time, job preempted twice (sum of 3 attempts)", interrupted),
        ("training time lost per preemption", lost),
    ]
    table = ["| measure | seconds |", "|---|---|"]
    table += [f"| {name} | {value:.2f} |" for name, value in rows]
    text = "\n".join(table)
    print(text)
    if args.write:
        args.write.write_text(
            "Fault tolerance on the local Slurm cluster (`python bench/fault_tolerance.py`): a\n"
            "2-node x 1-process DDP MNIST job (4,000 images, batch 32, 3 epochs) preempted twice\n"
            "mid-epoch with `scancel --signal=USR2`, 2 CPU cores, all nodes on one host.\n\n"
            + text
            + "\n"
            + NOTES
        )


if __name__ == "__main__":
    main()
