"""Restarts that cannot help, on the real cluster: a restart storm is stopped (exit 7) before
max_restarts runs out, and a rank's exit 79 ends the job at once, neither restarted nor
requeued; status says why in one line (tests/jobs/storm.py)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from clustertrain import api
from clustertrain.runs import why
from tests.conftest import run_cli
from tests.e2e.test_slurm_e2e import cluster, submit  # noqa: F401  (cluster is a fixture)

pytestmark = pytest.mark.slurm

END_WITHIN_S = 300


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}


def _ended(env: dict[str, str], job_id: str, run_dir: Path) -> list[dict[str, object]]:
    job = api.Job.attach(job_id, env["CLUSTERTRAIN_RUNS_DIR"])
    deadline = time.monotonic() + END_WITHIN_S
    while not job.job_state().finished:
        assert time.monotonic() < deadline, f"job {job_id} never ended"
        time.sleep(2)
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_a_restart_storm_is_stopped_and_named(
    cluster: None,  # noqa: F811
    env: dict[str, str],
) -> None:
    job_id, run_dir = submit(
        env, "--nodes", "2", "--procs-per-node", "2", "--cpus-per-task", "1",
        "--max-restarts", "5", "--storm-restarts", "2", "--script", "tests/jobs/storm.py",
    )  # fmt: skip
    seen = _ended(env, job_id, run_dir)
    names = [e["event"] for e in seen]
    assert names.count("restarted") == 2 and "requeued" not in names, names
    storm = next(e for e in seen if e["event"] == "restart_storm")
    assert names.index("restart_storm") < names.index("ended"), names
    assert storm["restarts"] == 2 and "step 10" in str(storm["why"]), storm
    assert next(e for e in seen if e["event"] == "ended")["status"] in (7, "7")
    status = run_cli("status", job_id, env=env).stdout
    assert re.search(r"^  restart storm: 2 restarts never got past step 10", status, re.M), status


def test_an_exit_79_is_never_restarted_and_named(
    cluster: None,  # noqa: F811
    env: dict[str, str],
) -> None:
    job_id, run_dir = submit(
        env, "--nodes", "2", "--procs-per-node", "2", "--cpus-per-task", "1",
        "--max-restarts", "3", "--max-requeues", "3", "--env", "STORM=no-restart",
        "--script", "tests/jobs/storm.py",
    )  # fmt: skip
    seen = _ended(env, job_id, run_dir)
    names = [e["event"] for e in seen]
    assert "restarted" not in names and "requeued" not in names, names
    assert "no_restart" in names, names
    failure = api.Job.attach(job_id, env["CLUSTERTRAIN_RUNS_DIR"]).failure
    assert failure is not None and failure.kind is why.Kind.NO_RESTART, failure
    assert re.match(
        r"rank 3 on node\d asked not to be restarted \(exit 79\): error: no training data",
        failure.headline,
    ), failure
