"""Slurm's accounting on the local cluster (slurmdbd on MariaDB, as sites run it): a finished
job and its steps are in ``sacct``, ``status`` reads its exit code and memory from there, and a
job queued and run while slurmdbd is down is in ``sacct`` once slurmdbd is back."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clustertrain import localcluster as local
from tests.conftest import run_cli
from tests.e2e.test_slurm_e2e import cluster, follow, submit  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slurm
HELLO = ["--launcher", "torchrun", "--script", "tests/jobs/hello_world.py", "--nodes", "2",
         "--gpus-per-node", "0", "--cpus-per-task", "1"]  # fmt: skip


@pytest.fixture
def layout(cluster: None) -> local.Layout:  # noqa: F811
    found = local.current_layout(local.default_state_dir())
    assert found is not None
    if not found.accounting:
        pytest.skip("the local cluster runs without accounting (cluster up --no-accounting)")
    return found


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}


def sacct(job_id: str) -> dict[str, str]:
    """``sacct -j JOB``'s rows: each step's id and state."""
    done = subprocess.run(
        ["sacct", "-j", job_id, "-n", "-P", "-o", "JobID,State"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    return dict(line.split("|", 1) for line in done.stdout.splitlines() if "|" in line)


@pytest.mark.every_slurm
def test_sacct_has_the_job_and_its_steps_and_status_reads_them(
    layout: local.Layout, env: dict[str, str]
) -> None:
    job_id, _ = submit(env, *HELLO)
    assert follow(env, job_id).returncode == 0
    steps = sacct(job_id)
    assert steps.get(job_id) == "COMPLETED", steps
    assert steps.get(f"{job_id}.batch") == "COMPLETED", steps
    assert f"{job_id}.0" in steps, steps  # the launch step, one task per node
    status = run_cli("status", job_id, env=env)
    assert status.returncode == 0, status.stderr
    assert "exit code 0" in status.stdout, status.stdout
    assert "MaxRSS" in status.stdout, status.stdout


@pytest.fixture
def accounting_down(layout: local.Layout) -> Iterator[None]:
    local.stop_service(layout.state_dir, "accounting")
    try:
        yield
    finally:
        local.start_service(layout.state_dir, "accounting")


def test_a_job_run_while_slurmdbd_is_down_is_in_sacct_once_it_is_back(
    layout: local.Layout, env: dict[str, str], accounting_down: None
) -> None:
    job_id, _ = submit(env, *HELLO)
    followed = follow(env, job_id)
    assert followed.returncode == 0, followed.stdout[-2000:] + followed.stderr
    status = run_cli("status", job_id, env=env)
    assert status.returncode == 0 and "COMPLETED" in status.stdout, status.stdout + status.stderr
    print(local.start_service(layout.state_dir, "accounting"))
    deadline = time.monotonic() + 60  # slurmctld sends what it kept on its next contact
    while sacct(job_id).get(job_id) != "COMPLETED" and time.monotonic() < deadline:
        time.sleep(1)
    assert sacct(job_id).get(job_id) == "COMPLETED", sacct(job_id)
    assert os.path.exists(layout.state_dir / "run" / "mariadb.sock")
