"""Slurm's controller stops mid-job and starts again (`clustertrain cluster fail controller`:
slurmctld stopped by its recorded PID; `cluster heal controller`: started again with its own
command line). The job trains on meanwhile; `status` answers from the run folder and says so,
`cancel` cancels nothing and says so, and a `logs --follow` started before the outage follows
the job to its end and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.e2e.test_preemption import RUN_TIMEOUT_S, SLURM_ARGS, _attempt_log, _wait
from tests.e2e.test_slurm_e2e import cluster, submit  # noqa: F401  (cluster is a fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
# Three short epochs on 2 nodes: the outage below starts in the first and ends well before the
# last (the job outlives it, so the follower sees the controller come back).
# 24,000 images an epoch: the job trains some 40 s, twice the outage (4,000 ended within it).
TRAIN = [*SLURM_ARGS[: SLURM_ARGS.index("--limit-train") + 1], "24000"]
TRAIN += SLURM_ARGS[SLURM_ARGS.index("--limit-train") + 2 :]
JOB = ["jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1", "--", *TRAIN]
OUTAGE_S = 20


@pytest.fixture
def env(tmp_path: Path, data_dir: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"), "CLUSTERTRAIN_DATA_DIR": str(data_dir)}


@pytest.fixture
def controller(cluster: None) -> Iterator[None]:  # noqa: F811
    """The shared cluster, its controller started again after the test whatever happened."""
    yield
    healed = run_cli("cluster", "heal", "controller")
    assert healed.returncode == 0, healed.stderr


def _follow(env: dict[str, str], job_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "clustertrain", "logs", job_id, "--follow"],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def test_with_the_controller_down_mid_job_commands_answer_and_the_follow_sees_the_end(
    controller: None, env: dict[str, str]
) -> None:
    job_id, run_dir = submit(env, *JOB)
    follower = _follow(env, job_id)
    try:
        _wait("training", lambda: "epoch 1/3 step 20/" in _attempt_log(run_dir, 0))
        stopped = run_cli("cluster", "fail", "controller")
        assert stopped.returncode == 0, stopped.stderr
        down_at = time.monotonic()

        status = run_cli("status", job_id, env=env)
        assert status.returncode == 0, status.stderr
        assert "Slurm not reachable: from the run folder (" in status.stdout, status.stdout
        assert "running as of its last event" in status.stdout, status.stdout
        as_json = json.loads(run_cli("status", job_id, "--json", env=env).stdout)
        assert (as_json["state"], as_json["source"]) == ("UNKNOWN", "run folder")
        cancelled = run_cli("cancel", job_id, env=env)
        assert cancelled.returncode == 2 and "nothing was cancelled" in cancelled.stderr
        assert follower.poll() is None, follower.communicate()

        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        healed = run_cli("cluster", "heal", "controller")
        assert healed.returncode == 0, healed.stderr
        out, err = follower.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        follower.kill()

    assert follower.returncode == 0, out[-3000:] + err
    assert "epoch 3/3" in out  # every line to the job's end
    assert err.count("following the run folder until the controller answers") == 1, err
    assert err.count("the controller answers again") == 1, err
    assert err.splitlines()[-1] == f"clustertrain: job {job_id} ended COMPLETED"
    after = run_cli("status", job_id, env=env).stdout
    assert f"job {job_id} (" in after and "): COMPLETED" in after and "final test_acc " in after
    assert "Slurm not reachable" not in after, after
