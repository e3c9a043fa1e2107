"""The tracker relay against the real local cluster: the demo job (jobs/mnist.yaml) on 2 nodes,
relayed live, while it trains, to a real mlflow server and to TensorBoard, then read back
through MLflow's client and TensorBoard's reader: every test_acc the job logged, at its step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import clustertrain
from tests.conftest import ROOT
from tests.e2e.test_slurm_e2e import SMOKE, cluster  # noqa: F401  (cluster is a fixture)
from tests.track.test_mlflow import server  # noqa: F401  (server is a fixture)

pytestmark = pytest.mark.slurm
pytest.importorskip("tensorboard")
from mlflow.tracking import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)


def _follow(job_id: str, runs_dir: str, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "clustertrain", "track", job_id, "--follow", *flags],
        cwd=ROOT,
        env={**os.environ, "CLUSTERTRAIN_RUNS_DIR": runs_dir},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_mnist_on_two_nodes_relayed_live(
    cluster: None,  # noqa: F811
    server: str,  # noqa: F811
    tmp_path: Path,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CLUSTERTRAIN_DATA_DIR", str(data_dir))
    runs_dir = str(tmp_path / "runs")
    job = clustertrain.submit(
        "jobs/mnist.yaml", nodes=2, gpus_per_node=1,
        extra_args=[*SMOKE, "--epochs", "2"], runs_dir=runs_dir,
    )  # fmt: skip
    assert isinstance(job, clustertrain.Job)
    followers = [
        _follow(job.job_id, runs_dir, "--to", "mlflow", "--uri", server),
        _follow(job.job_id, runs_dir, "--to", "tensorboard", "--logdir", str(tmp_path / "tb")),
    ]
    assert job.wait(timeout=300) == "COMPLETED"
    for follower in followers:
        out, err = follower.communicate(timeout=120)
        assert follower.returncode == 0, err
        assert "ended COMPLETED" in out
    logged = [(r["step"], r["test_acc"]) for r in job.metrics() if "test_acc" in r]
    assert len(logged) == 2

    kept = json.loads((job.run_dir / "track" / "mlflow.json").read_text())["kept"]
    client = MlflowClient(server)
    history = client.get_metric_history(kept["run_id"], "test_acc")
    assert sorted((m.step, m.value) for m in history) == sorted(logged)
    assert client.get_run(kept["run_id"]).data.tags["clustertrain.nodes"]
    assert "plot.png" in [a.path for a in client.list_artifacts(kept["run_id"])]

    board = EventAccumulator(str(tmp_path / "tb" / job.run_dir.name), size_guidance={"scalars": 0})
    board.Reload()
    assert [(e.step, e.value) for e in board.Scalars("test_acc")] == [
        (step, pytest.approx(value)) for step, value in logged
    ]
