"""A dead rank ends the whole job quickly, and status names it (real local Slurm cluster)."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from clustertrain import api
from clustertrain.runs import why
from tests.conftest import run_cli
from tests.e2e.test_preemption import release_requeued
from tests.e2e.test_slurm_e2e import cluster, submit  # noqa: F401  (cluster is a fixture)

pytestmark = pytest.mark.slurm
# The bound for a dead rank to end the job; far above what it takes (seconds).
END_WITHIN_S = 60


def _rank_pid(run_dir: Path, rank: int, deadline_s: float = 60) -> int:
    """The PID of global rank ``rank`` of the job in ``run_dir``, from /proc environments."""
    wanted = {f"CLUSTERTRAIN_RUN_DIR={run_dir}".encode(), f"RANK={rank}".encode()}
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            try:
                environ = set((proc / "environ").read_bytes().split(b"\0"))
            except OSError:
                continue
            if wanted <= environ and b"LOCAL_RANK" in b"".join(environ):
                return int(proc.name)
        time.sleep(0.5)
    raise AssertionError(f"rank {rank} of {run_dir} never started")


def _wait_for_line(env: dict[str, str], job_id: str, text: str, deadline_s: float = 90) -> None:
    deadline = time.monotonic() + deadline_s
    while text not in run_cli("logs", job_id, env=env).stdout:
        assert time.monotonic() < deadline, f"never saw {text!r}"
        time.sleep(1)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}


def test_a_rank_killed_with_sigkill_ends_the_job_and_is_named(
    cluster: None,  # noqa: F811
    env: dict[str, str],
) -> None:
    job_id, run_dir = submit(
        env, "--nodes", "2", "--gpus-per-node", "2", "--cpus-per-task", "2",
        "--script", "tests/jobs/fail_rank.py",
    )  # fmt: skip
    _wait_for_line(env, job_id, "rank 3 ready")
    os.kill(_rank_pid(run_dir, 3), signal.SIGKILL)
    ended = run_cli("logs", job_id, "--follow", env=env, timeout=END_WITHIN_S)
    assert ended.returncode != 0 and "FAILED" in ended.stderr
    # The follower's last words are the cause, as status says it.
    headline = re.compile(
        r"rank 3 on node\d was killed by SIGKILL \(signal 9, killed without warning\)"
    )
    assert headline.search(ended.stderr.splitlines()[-2]), ended.stderr
    status = run_cli("status", job_id, env=env).stdout
    assert "FAILED" in status
    assert headline.search(status), status


def test_a_rank_that_raises_ends_the_job_and_its_traceback_is_shown(
    cluster: None,  # noqa: F811
    env: dict[str, str],
) -> None:
    job_id, _ = submit(
        env,
        "--nodes", "2", "--gpus-per-node", "2", "--cpus-per-task", "2", "--env", "FAIL_RANK=1",
        "--script", "tests/jobs/fail_rank.py",
    )  # fmt: skip
    # The bound includes the job's start-up (imports, rendezvous) before the raise.
    ended = run_cli("logs", job_id, "--follow", env=env, timeout=END_WITHIN_S + 60)
    assert ended.returncode != 0 and "FAILED" in ended.stderr
    status = run_cli("status", job_id, env=env).stdout
    headline = "raised ValueError: rank 1 gave up at step 20 (fail_rank.py:16)"
    assert re.search(r"  rank 1 on node\d " + re.escape(headline), status), status
    errors = run_cli("logs", job_id, "--errors", env=env).stdout.splitlines()
    assert errors[0].endswith(headline) and errors[1].startswith("hint: "), errors
    evidence = run_cli("status", job_id, "--why", env=env).stdout.splitlines()
    assert any(line.endswith("! ValueError: rank 1 gave up at step 20") for line in evidence)
    assert len(evidence) <= 4 + why.MAX_EVIDENCE, evidence


def test_a_rank_that_crashes_after_the_requeue_request_cannot_fail_the_job(
    cluster: None,  # noqa: F811
    env: dict[str, str],
) -> None:
    """Once the checkpoint is taken and the requeue asked for, the job is requeued whatever the
    ranks' exit status: here rank 1 aborts (SIGABRT) after the request, and the job still
    requeues, resumes and completes."""
    job_id, run_dir = submit(
        env, "--nodes", "2", "--gpus-per-node", "1", "--cpus-per-task", "2",
        "--script", "tests/jobs/abort_after_requeue.py",
    )  # fmt: skip
    release_requeued(job_id, restarts=1)
    ended = run_cli("logs", job_id, "--follow", env=env, timeout=END_WITHIN_S + 120)
    assert ended.returncode == 0, ended.stdout[-3000:] + ended.stderr
    assert "rank 1 aborting at exit" in ended.stdout
    assert ended.stdout.count("resumed from step 20") == 2, ended.stdout[-3000:]
    state = api.slurm().state(job_id)
    assert state.state == "COMPLETED" and state.restarts == 1, state
    first = (run_dir / "logs" / "attempt-0").glob("*.err")
    assert any("SIGABRT" in p.read_text() or "-6" in p.read_text() for p in first)
