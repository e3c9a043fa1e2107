"""MLflow for real: a ``mlflow server`` on 127.0.0.1 (SQLite, local artifacts) started here and
stopped by its PID; what the relay sent, read back through MLflow's own client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from clustertrain import runs
from clustertrain.backends.local import free_port
from clustertrain.errors import UserError
from clustertrain.track import make, relay
from tests.track.conftest import write
from tests.track.mlflow_server import mlflow_server

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


def _run_id(run: runs.Run) -> str:
    return str(json.loads((run.path / "track" / "mlflow.json").read_text())["kept"]["run_id"])


def test_params_metrics_per_step_and_the_plot(server: str, run: runs.Run) -> None:
    write(run, "started", nodes="node[1-2]")
    for step in range(1, 4):
        write(run, "metrics", step=step * 100, loss=1.0 / step, test_acc=0.8 + step / 100)
    relay(run, make("mlflow", run, uri=server), print)
    write(run, "requeued")
    write(run, "started", attempt=1, nodes="node[3-4]")
    write(run, "metrics", attempt=1, step=400, loss=0.2, test_acc=0.84)
    write(run, "ended", attempt=1, status="0")
    summary = relay(run, make("mlflow", run, uri=server), print)
    assert summary.state == "COMPLETED"

    client = MlflowClient(server)
    found = client.get_run(_run_id(run))  # one MLflow run for both attempts
    assert found.data.params["name"] == "mnist" and found.data.params["nodes"] == "2"
    assert found.data.tags["clustertrain.job_id"] == "42"
    assert found.data.tags["clustertrain.attempts"] == "2"
    assert found.data.tags["clustertrain.state"] == "COMPLETED"
    assert found.info.status == "FINISHED"
    history = client.get_metric_history(found.info.run_id, "test_acc")
    assert sorted((m.step, round(m.value, 6)) for m in history) == [
        (100, 0.81), (200, 0.82), (300, 0.83), (400, 0.84)
    ]  # fmt: skip
    names = [a.path for a in client.list_artifacts(found.info.run_id)]
    assert "spec.yaml" in names and "plot.png" in names
    png = client.download_artifacts(found.info.run_id, "plot.png", str(run.path / "back"))
    assert Path(png).read_bytes()[:4] == b"\x89PNG"


def test_relay_and_relay_again_no_duplicate_point(server: str, run: runs.Run) -> None:
    for step in range(20):
        write(run, "metrics", step=step, test_acc=step / 20)
    assert relay(run, make("mlflow", run, uri=server), print).sent == 20
    assert relay(run, make("mlflow", run, uri=server), print).sent == 0
    history = MlflowClient(server).get_metric_history(_run_id(run), "test_acc")
    assert sorted(m.step for m in history) == list(range(20))


def test_an_unreachable_server_loses_nothing(server: str, run: runs.Run) -> None:
    write(run, "metrics", step=1, test_acc=0.5)
    closed = f"http://127.0.0.1:{free_port()}"
    said: list[str] = []
    waits: list[float] = []
    with pytest.raises(UserError, match="nothing was lost"):
        relay(run, make("mlflow", run, uri=closed), said.append, sleep=waits.append)
    assert waits == [1.0, 2.0, 4.0]  # bounded backoff
    assert len([line for line in said if "cannot reach" in line]) == 1
    assert not (run.path / "track" / "mlflow.json").exists()  # nothing taken for sent
    relay(run, make("mlflow", run, uri=server), print)
    history = MlflowClient(server).get_metric_history(_run_id(run), "test_acc")
    assert [(m.step, m.value) for m in history] == [(1, 0.5)]
