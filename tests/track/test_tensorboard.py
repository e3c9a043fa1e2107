"""TensorBoard for real: the relay's event files read back by TensorBoard's own reader."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from clustertrain import runs
from clustertrain.track import make, relay
from tests.track.conftest import write

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)


def _read(folder: Path) -> EventAccumulator:
    found = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    found.Reload()
    return found


def test_every_scalar_at_every_step_across_relays(run: runs.Run, tmp_path: Path) -> None:
    write(run, "started", nodes="node[1-2]")
    for step in range(50):
        write(run, "metrics", step=step, loss=1.0 / (step + 1), test_acc=step / 100)
    relay(run, make("tensorboard", run, logdir=str(tmp_path / "tb")), print)
    write(run, "requeued")
    write(run, "started", attempt=1, nodes="node[3-4]")
    for step in range(50, 80):
        write(run, "metrics", attempt=1, step=step, loss=1.0 / (step + 1), test_acc=step / 100)
    write(run, "ended", attempt=1, status="0")
    summary = relay(run, make("tensorboard", run, logdir=str(tmp_path / "tb")), print)
    assert summary.state == "COMPLETED"

    found = _read(tmp_path / "tb" / run.path.name)  # one TensorBoard run for the job
    acc = found.Scalars("test_acc")
    assert [(e.step, round(e.value, 6)) for e in acc] == [(s, round(s / 100, 6)) for s in range(80)]
    assert [e.step for e in found.Scalars("loss")] == list(range(80))
    assert [e.value for e in found.Scalars("clustertrain/requeues")] == [1.0]
    assert "clustertrain/params" in found.Tags()["tensors"]
    if importlib.util.find_spec("matplotlib"):  # with the plot extra, the plot
        assert found.Images("clustertrain/plot.png")[0].encoded_image_string[:4] == b"\x89PNG"

    again = relay(run, make("tensorboard", run, logdir=str(tmp_path / "tb")), print)
    assert again.sent == 0
    assert len(_read(tmp_path / "tb" / run.path.name).Scalars("test_acc")) == 80


def test_without_logdir_into_the_run_folder(run: runs.Run) -> None:
    write(run, "metrics", step=3, loss=0.5)
    relay(run, make("tensorboard", run), print)
    found = _read(run.path / "tensorboard" / "relay")
    assert [(e.step, e.value) for e in found.Scalars("loss")] == [(3, 0.5)]
