"""jobs/examples/accelerate_preemptible.py on the real local cluster: signalled mid-epoch, it
checkpoints, requeues, resumes, and finishes with every epoch done exactly once (a second
preemption of the same job is tests/e2e/test_preemption.py's)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clustertrain import api
from tests.conftest import run_cli
from tests.e2e.test_preemption import _attempt_log, preempt_when
from tests.e2e.test_slurm_e2e import cluster, submit  # noqa: F401  (cluster is a fixture)

pytestmark = pytest.mark.slurm
EXAMPLE = "jobs/examples/accelerate_preemptible.py"
STEPS = 20  # 640 samples, batches of 16, 2 processes


def _signal_at(job_id: str, run_dir: Path, attempt: int, epoch: int) -> None:
    preempt_when(job_id, run_dir, attempt, rf"epoch {epoch} step 5/{STEPS} ")


def test_the_preemptible_example_survives_a_preemption(
    cluster: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    job_id, run_dir = submit(
        env, "--launcher", "accelerate", "--script", EXAMPLE, "--nodes", "2",
        "--gpus-per-node", "0", "--procs-per-node", "1", "--cpus-per-task", "2",
        "--", "--epochs", "2", "--step-delay", "0.3",
    )  # fmt: skip
    _signal_at(job_id, run_dir, attempt=0, epoch=1)
    done = run_cli("logs", job_id, "--follow", env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    state = api.slurm().state(job_id)
    assert state.state == "COMPLETED" and state.restarts == 1, state
    logs = [_attempt_log(run_dir, attempt) for attempt in range(2)]
    assert "stopping on SIGUSR2 at step" in logs[0], logs[0][-2000:]
    assert re.search(r"resumed at step \d+ from", logs[1]), logs[1][-2000:]
    every = "".join(logs)
    assert [every.count(f"epoch {k} done") for k in (1, 2)] == [1, 1], every[-3000:]
    records = [json.loads(line) for line in (run_dir / "out" / "metrics.jsonl").open()]
    assert [r["epoch"] for r in records] == [1, 2]
