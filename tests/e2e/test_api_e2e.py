"""The Python API against the real local cluster: submit, wait, logs, metrics, attach, cancel."""

from __future__ import annotations

from pathlib import Path

import pytest

import clustertrain
from clustertrain.errors import FieldError
from clustertrain.render import RenderedJob
from tests.conftest import run_cli
from tests.e2e.test_slurm_e2e import SMOKE, cluster  # noqa: F401  (cluster is a fixture)

pytestmark = pytest.mark.slurm


@pytest.fixture
def runs_dir(tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CLUSTERTRAIN_DATA_DIR", str(data_dir))
    return str(tmp_path / "runs")


def test_submit_wait_logs_metrics_and_attach(
    cluster: None,  # noqa: F811
    runs_dir: str,
) -> None:
    job = clustertrain.submit(
        "jobs/mnist.yaml",
        nodes=2,
        gpus_per_node=1,
        extra_args=[*SMOKE, "--epochs", "2"],
        runs_dir=runs_dir,
    )
    assert isinstance(job, clustertrain.Job) and job.job_id.isdigit()
    followed = list(job.logs(follow=True))
    assert job.wait(timeout=120) == "COMPLETED" and job.state == "COMPLETED"
    # torchrun's c10d rendezvous numbers the nodes in the order they join.
    who = [line.split(" | ")[0].split() for line in followed if " rank" in line.split(" | ")[0]]
    assert {w[0] for w in who} == {"node1", "node2"} and {w[1] for w in who} == {"rank0", "rank1"}
    records = job.metrics()
    # What the job's log_metrics recorded, an epoch each, read from its events.
    assert [r["epoch"] for r in records] == [1, 2] and 0 < records[-1]["test_acc"] <= 1
    assert records[-1]["world_size"] == 2 and records[-1]["step"] > records[0]["step"] > 0
    again = clustertrain.Job.attach(job.job_id, runs_dir=runs_dir)
    assert again.run_dir == job.run_dir and list(again.logs()) == list(job.logs())
    # The CLI sees the same job.
    status = run_cli("status", job.job_id, "--runs-dir", runs_dir).stdout
    assert "COMPLETED" in status


def test_cancel_and_a_bounded_wait(
    cluster: None,  # noqa: F811
    runs_dir: str,
) -> None:
    job = clustertrain.submit(
        nodes=1, script="tests/jobs/fail_rank.py", runs_dir=runs_dir, node_check=False,
        cpus_per_task=1,
    )  # fmt: skip
    assert isinstance(job, clustertrain.Job)
    assert job.wait(timeout=1, poll_s=0.5) in ("PENDING", "RUNNING")
    job.cancel()
    assert job.wait(timeout=120, poll_s=0.5) == "CANCELLED"


def test_dry_run_and_bad_fields_touch_nothing(tmp_path: Path) -> None:
    runs_dir = str(tmp_path / "runs")
    planned = clustertrain.submit(nodes=4, gpus_per_node=8, dry_run=True, runs_dir=runs_dir)
    assert isinstance(planned, RenderedJob) and "#SBATCH --nodes=4" in planned.batch_script
    with pytest.raises(FieldError, match="nodes"):
        clustertrain.submit(nodes=0, runs_dir=runs_dir)
    assert not Path(runs_dir).exists()
