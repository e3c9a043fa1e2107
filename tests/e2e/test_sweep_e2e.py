"""A sweep on the real local cluster: a 2-task job array of 2-node DDP jobs whose tasks run at
the same time on the same nodes, each with its own rendezvous and its own arguments."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clustertrain import events
from clustertrain.runs import timeline
from tests.conftest import run_cli
from tests.e2e.test_slurm_e2e import JOB_TIMEOUT_S, cluster, submit  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slurm


@pytest.fixture
def env(tmp_path: Path, data_dir: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"), "CLUSTERTRAIN_DATA_DIR": str(data_dir)}


@pytest.mark.every_slurm
def test_two_tasks_on_the_same_nodes_at_once_each_with_its_own_port_and_arguments(
    cluster: None,  # noqa: F811
    env: dict[str, str],
) -> None:
    job_id, run_dir = submit(
        env, "jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "0", "--cpus-per-task", "1",
        "--sbatch-option=--nodelist=node1,node2", "--sweep", "lr=0.05,0.1",
        "--", "--strategy", "ddp", "--epochs", "1", "--limit-train", "2000", "--log-every", "10",
    )  # fmt: skip
    followed = run_cli("logs", job_id, "--follow", env=env, timeout=JOB_TIMEOUT_S)
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr
    ports, spans = [], []
    for task, lr in ((0, "0.05"), (1, "0.1")):
        lines = [line for line in followed.stdout.splitlines() if line.startswith(f"task {task} ")]
        port = re.search(r"rendezvous node1:(\d+)", "\n".join(lines))
        assert port, lines[:20]
        ports.append(port[1])
        assert any(f"lr {lr}" in line for line in lines), lines[-20:]
        attempt = timeline.attempts(events.read(run_dir / "tasks" / str(task) / "events.jsonl"))
        assert [a.how for a in attempt] == ["ended 0"]
        spans.append((attempt[0].start, attempt[0].end))
    assert ports[0] != ports[1]
    # At the same time: each task started before the other ended.
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans
    status = run_cli("status", job_id, env=env).stdout
    assert f"sweep {job_id}" in status and "2 COMPLETED" in status, status
    table = json.loads(run_cli("results", job_id, "--json", env=env).stdout)
    assert sorted(r["params"]["lr"] for r in table) == ["0.05", "0.1"]
    assert {r["metric"] for r in table} == {"test_acc"}  # jobs/mnist.yaml's headline
    assert [r["value"] for r in table] == sorted((r["value"] for r in table), reverse=True)
    one = run_cli("logs", f"{job_id}_1", env=env).stdout
    assert "lr 0.1" in one and "lr 0.05" not in one
