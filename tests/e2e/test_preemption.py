"""Checkpoint on a stop signal, resume exactly (issue 5: jobs that survive).

Local runs start torchrun and accelerate the way clustertrain's launch script does (USR2 ignored
by the launcher) and signal the ranks mid-epoch; the SIGKILL test kills a checkpoint writer at
random moments; the Slurm test signals a real job twice and lets Slurm requeue it. On CPU, with
the same seed and world size, the interrupted runs must end bit for bit where uninterrupted ones
do.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from clustertrain import api, checkpoint
from clustertrain.env import rendezvous_port
from clustertrain.node.nodecheck import probe
from tests.conftest import ROOT, run_cli
from tests.e2e.test_slurm_e2e import cluster, submit  # noqa: F401  (cluster is a fixture)
from tests.rank.test_train import BIN, TRAIN, _clean_env, accelerate_2

# 4,000 images in batches of 32 on 2 ranks: 63 steps an epoch, a few seconds each, so a signal
# sent when step 20 is reported lands well inside the epoch.
ARGS = ["--recipe", "fast", "--limit-train", "4000", "--batch-size", "32", "--lr", "0.05"]
ARGS += ["--epochs", "3", "--log-every", "5", "--seed", "7"]
STEPS = 63
RUN_TIMEOUT_S = 300
CREDENTIAL_S = 2


def _ignore_usr2() -> None:
    """What launch.sh does before it execs the launcher: `trap '' USR2`."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def _children(pid: int) -> list[int]:
    """The PIDs whose parent is ``pid``, from /proc (by PID: never by process name)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name, in parentheses, may hold spaces: the fields follow the last ')'.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _workers(launcher_pid: int) -> list[int]:
    """The training ranks a launcher started: its children that run the entrypoint."""
    workers = []
    for pid in _children(launcher_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"\0".join(arg.encode() for arg in TRAIN) in cmdline:
            workers.append(pid)
    return workers


def _launcher(strategy: str) -> list[str]:
    if strategy == "ddp":
        return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"]
    return accelerate_2()


def _run(
    strategy: str,
    out: Path,
    data_dir: Path,
    interrupt_at: str | None = None,
    signum: signal.Signals = signal.SIGUSR2,
) -> tuple[int, str]:
    """Train under the launcher; with ``interrupt_at``, send ``signum`` to every rank once a line
    matching it appears. Returns the exit status and the output."""
    proc = subprocess.Popen(
        [
            *_launcher(strategy),
            *TRAIN,
            "--strategy",
            strategy,
            *ARGS,
            "--data-dir",
            str(data_dir),
            "--out-dir",
            str(out),
        ],
        cwd=ROOT,
        env=_clean_env(CLUSTERTRAIN_REQUEUE_FILE=str(out / "requeue")),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ignore_usr2,
        start_new_session=True,
    )
    # A hung run is killed, with its whole process group, instead of hanging the test.
    watchdog = threading.Timer(RUN_TIMEOUT_S, os.killpg, (proc.pid, signal.SIGKILL))
    watchdog.start()
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if interrupt_at and re.search(interrupt_at, line):
                interrupt_at = None
                workers = _workers(proc.pid)
                assert len(workers) == 2, (workers, "".join(lines))
                for pid in workers:
                    os.kill(pid, signum)
        return proc.wait(), "".join(lines)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _final_model(out: Path) -> dict[str, torch.Tensor]:
    state = torch.load(out / "checkpoints" / "epoch-0003.pt", weights_only=True)
    return state["model"]  # type: ignore[no-any-return]


def _assert_same_run(interrupted: Path, whole: Path) -> None:
    got, want = _records(interrupted), _records(whole)
    assert [r.get("epoch") for r in got] == [1, 2, 3, None], got
    assert got[-1]["event"] == "done"
    for key in ("train_loss", "test_loss", "test_acc"):  # bit for bit, every epoch
        assert [r[key] for r in got[:3]] == [r[key] for r in want[:3]], key
    assert got[-1]["test_acc"] == want[-1]["test_acc"]
    model, reference = _final_model(interrupted), _final_model(whole)
    assert model.keys() == reference.keys()
    assert all(torch.equal(model[k], reference[k]) for k in model)


def _interrupt_and_resume(
    strategy: str, out: Path, data_dir: Path, epoch: int, signum: signal.Signals
) -> None:
    """Signal the run mid-epoch ``epoch``, check what it left, and leave it to the next start.

    Every rank must exit 0: no abort on the way out after the stop (issue 8).
    """
    status, output = _run(strategy, out, data_dir, rf"^epoch {epoch}/3 step 20/{STEPS} ", signum)
    assert status == 0, output[-3000:]
    assert "terminate called" not in output, output[-3000:]
    stop = re.search(
        rf"stopping on {signum.name} at epoch {epoch} step (\d+)/{STEPS}: checkpoint", output
    )
    assert stop, output[-3000:]
    step = int(stop[1])
    assert 20 <= step < STEPS
    assert (out / "checkpoints" / f"epoch-{epoch:04d}-step-{step:06d}.pt").is_file()
    assert (out / "requeue").is_file()
    # Only completed epochs are recorded, and no "done" yet.
    assert [r.get("epoch") for r in _records(out)] == list(range(1, epoch))
    (out / "requeue").unlink()  # as the batch script does before requeueing


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[Any]:
    """One uninterrupted run per strategy, made on first use."""
    done: dict[str, Path] = {}

    def get(strategy: str) -> Path:
        if strategy not in done:
            out = tmp_path_factory.mktemp(f"whole-{strategy}")
            status, output = _run(strategy, out, data_dir)
            assert status == 0, output[-3000:]
            done[strategy] = out
        return done[strategy]

    yield get


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "accelerate"])
def test_signalled_twice_resumes_exactly(
    strategy: str, tmp_path: Path, data_dir: Path, uninterrupted: Callable[[str], Path]
) -> None:
    """Once by Slurm's warning signal (USR2), once by a plain TERM: each strategy meets both."""
    whole = uninterrupted(strategy)
    _interrupt_and_resume(strategy, tmp_path, data_dir, epoch=1, signum=signal.SIGUSR2)
    _interrupt_and_resume(strategy, tmp_path, data_dir, epoch=2, signum=signal.SIGTERM)
    status, output = _run(strategy, tmp_path, data_dir)
    assert status == 0, output[-3000:]
    assert re.search(r"resuming at epoch 2 step \d+ from", output), output[-3000:]
    assert not (tmp_path / "requeue").exists()
    _assert_same_run(tmp_path, whole)


# ---------------------------------------------------------------------------------------------
# SIGKILL while a checkpoint is written.

KILLS = 40


def _realistic_state() -> dict[str, Any]:
    """The reference recipe's model and optimizer state: about 14 MB, like a real checkpoint."""
    from jobs.mnist import model as mnist_model

    net = mnist_model.build("classic")
    optimizer = torch.optim.Adadelta(net.parameters())
    net(torch.zeros(2, 1, 28, 28)).sum().backward()
    optimizer.step()
    return {"model": net.state_dict(), "optimizer": optimizer.state_dict()}


def _position(seq: int) -> tuple[int, int | None]:
    """Checkpoint ``seq``'s place: alternately mid-epoch and end of epoch, always newer."""
    return seq // 2 + 1, (7 if seq % 2 == 0 else None)


def _write_forever(directory: Path, log: Path, state: dict[str, Any], first: int) -> None:
    """The child: write checkpoints back to back, logging each start and each durable end."""
    store = checkpoint.Store(directory)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    seq = first
    while True:
        os.write(fd, f"writing {seq}\n".encode())
        epoch, step = _position(seq)
        store.save(epoch, {**state, "seq": seq, "marker": torch.full((1000,), seq)}, step=step)
        os.write(fd, f"saved {seq}\n".encode())
        seq += 1


def test_sigkill_while_writing_never_loses_the_checkpoint(tmp_path: Path) -> None:
    directory, log = tmp_path / "checkpoints", tmp_path / "writer.log"
    state = _realistic_state()
    # fork: the child starts in milliseconds, with the state already built. It only serialises
    # (no parallel torch ops), so forking a process that has loaded torch is safe here.
    context = multiprocessing.get_context("fork")
    rng = random.Random(5)
    newest, killed_mid_write = -1, 0
    for _ in range(KILLS):
        writer = context.Process(
            target=_write_forever, args=(directory, log, state, newest + 1), daemon=True
        )
        writer.start()
        time.sleep(rng.uniform(0.01, 0.4))
        assert writer.pid is not None
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(10)
        assert writer.exitcode == -signal.SIGKILL
        lines = log.read_text().splitlines()
        last_saved = max(
            (int(line.split()[1]) for line in lines if line.startswith("saved ")), default=-1
        )
        killed_mid_write += lines[-1].startswith("writing ")

        warnings: list[str] = []
        loaded = checkpoint.Store(directory).load_newest(warnings.append)
        if last_saved < 0 and loaded is None:
            continue
        assert loaded is not None and not warnings, warnings
        # The newest durable one, whole: nothing saved is lost, nothing half-written is read.
        # One more may be there: killed after its rename, before it was logged as saved. The
        # one found last time counts as durable too, though its "saved" line was never logged.
        durable = max(last_saved, newest)
        assert loaded["seq"] in (durable, durable + 1), (loaded["seq"], newest, lines[-2:])
        newest = loaded["seq"]
        assert torch.equal(loaded["marker"], torch.full((1000,), newest))
        assert loaded["model"].keys() == state["model"].keys()
        assert all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())
        names = sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))
        assert len(names) <= checkpoint.KEEP + 1, names
    assert newest > KILLS // 2, "the writer hardly ever finished a checkpoint"
    assert killed_mid_write >= KILLS // 2, f"only {killed_mid_write} kills landed mid-write"


# ---------------------------------------------------------------------------------------------
# The real local Slurm cluster.

SLURM_ARGS = ["--strategy", "ddp", *ARGS]


def _slurm(*args: str) -> str:
    done = subprocess.run(
        list(args), capture_output=True, text=True, env=api.slurm().environ, check=True, timeout=30
    )
    return done.stdout.strip()


def _wait(what: str, ready: Callable[[], bool], deadline_s: float = 180) -> None:
    deadline = time.monotonic() + deadline_s
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _attempt_log(run_dir: Path, attempt: int) -> str:
    """Everything the nodes of one attempt wrote to their stdout logs."""
    folder = run_dir / "logs" / f"attempt-{attempt}"
    if not folder.is_dir():
        return ""
    return "".join(p.read_text(errors="replace") for p in sorted(folder.glob("*.out")))


def release_requeued(job_id: str, restarts: int) -> None:
    """Wait for the batch script to requeue the job (its ``restarts``-th requeue), then let it
    start again at once.

    Slurm holds a requeued job back (BeginTime, about 120 s after a requeue). As root (the local
    cluster's admin) the test lets it start at once, once the next attempt's node check can bind
    the rendezvous port (at once, since the probe binds with SO_REUSEADDR; without it the last
    attempt's TIME_WAIT connections held the port for 60 s).
    """

    def requeued() -> bool:
        state = api.slurm().state(job_id)
        return state.state == "PENDING" and state.restarts >= restarts

    _wait(f"job {job_id} requeued", requeued, 180)
    port = rendezvous_port(int(job_id))
    _wait(f"port {port} free", lambda: "error" not in probe("127.0.0.1", port, is_head=True), 90)
    # slurmd revokes the last attempt's credential with a time in whole seconds: a new one issued
    # within the same second counts as revoked, and the job fails ("Job credential revoked").
    time.sleep(CREDENTIAL_S)
    _slurm("scontrol", "update", f"jobid={job_id}", "StartTime=now")


def preempt_when(job_id: str, run_dir: Path, attempt: int, line: str) -> str:
    """Once attempt ``attempt`` logs a line matching ``line``, send the job USR2 as a user
    would, release it once requeued, and return what that attempt logged."""
    reached = re.compile(line)
    _wait(
        f"attempt {attempt} to log {line!r}",
        lambda: bool(reached.search(_attempt_log(run_dir, attempt))),
    )
    _slurm("scancel", "--signal=USR2", job_id)
    release_requeued(job_id, attempt + 1)
    return _attempt_log(run_dir, attempt)


def _signal_mid_epoch(job_id: str, run_dir: Path, attempt: int, epoch: int) -> None:
    log = preempt_when(job_id, run_dir, attempt, rf"epoch {epoch}/3 step 20/{STEPS} ")
    assert re.search(
        rf"stopping on SIGUSR2 at epoch {epoch} step \d+/{STEPS}: checkpoint .* written in", log
    ), log[-3000:]


@pytest.fixture
def slurm_env(tmp_path: Path, data_dir: Path) -> dict[str, str]:
    return {
        "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"),
        "CLUSTERTRAIN_DATA_DIR": str(data_dir),
    }


@pytest.mark.slurm
@pytest.mark.every_slurm
def test_slurm_job_signalled_twice_requeues_and_matches_an_uninterrupted_one(
    cluster: None,  # noqa: F811
    slurm_env: dict[str, str],
    uninterrupted_mnist: Path,
) -> None:
    job = ["jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1", "--", *SLURM_ARGS]
    job_id, run_dir = submit(slurm_env, *job)
    _signal_mid_epoch(job_id, run_dir, attempt=0, epoch=1)
    _signal_mid_epoch(job_id, run_dir, attempt=1, epoch=2)
    followed = run_cli("logs", job_id, "--follow", env=slurm_env, timeout=RUN_TIMEOUT_S)
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr
    status = run_cli("status", job_id, env=slurm_env).stdout
    assert "COMPLETED" in status and "restarts: 2" in status, status
    assert sorted(p.name for p in (run_dir / "logs").glob("attempt-*")) == [
        "attempt-0",
        "attempt-1",
        "attempt-2",
    ]
    assert re.search(r"resuming at epoch 2 step \d+ from", _attempt_log(run_dir, 2))
    _assert_same_run(run_dir / "out", uninterrupted_mnist)
    _assert_the_timeline_of_a_job_preempted_twice(run_dir)


def _assert_the_timeline_of_a_job_preempted_twice(run_dir: Path) -> None:
    """What `plot` and `status` draw from: the events the batch script and rank 0 wrote."""
    from clustertrain import events
    from clustertrain.runs import goodput, timeline

    found = events.read(run_dir / "events.jsonl")
    assert found[0].name == "queued"
    attempts = timeline.attempts(found)
    assert [a.how for a in attempts] == ["requeued", "requeued", "ended 0"]
    for attempt in attempts:
        names = [e.name for e in attempt.events]
        firsts = [names.index(n) for n in ("started", "node_check", "rendezvous", "data_ready")]
        assert firsts == sorted(firsts) and firsts[0] == 0, names
        assert names.index("data_ready") < names.index("step") < names.index("checkpoint")
        if attempt.how == "requeued":  # checkpointed on the signal, then requeued
            assert names[-3:] == ["checkpoint", "stop", "requeued"], names
    epochs = [e.values["epoch"] for e in found if e.name == "epoch"]
    assert epochs == [1, 2, 3]
    assert [w[0] for w in timeline.waits(found, attempts)] == [0, 1, 2]
    good = goodput.goodput(found).share
    assert good is not None and 0 < good < 1
