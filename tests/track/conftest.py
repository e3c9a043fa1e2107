"""A recorded run whose events a test writes, and a fake tracker that records every call."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from clustertrain import runs
from clustertrain.render import render
from clustertrain.track.base import Point, Tracker, Unreachable
from tests.conftest import job_spec


@pytest.fixture
def run(tmp_path: Path) -> runs.Run:
    spec = job_spec(name="mnist", nodes=2, env={"TOKEN": "secret"})
    job = render(spec, str(runs.new_run_dir(tmp_path / "runs", "mnist")), "/w")
    runs.write_run_files(job)
    return runs.record_submission(job, "42", "slurm")


def write(run: runs.Run, name: str, attempt: int = 0, **values: Any) -> None:
    """An event as a rank or the supervisor appends it."""
    line = {"time": time.time(), "event": name, "attempt": attempt, **values}
    with open(run.events_path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


class Fake(Tracker):
    """A tracker that keeps what it was sent; ``down`` calls fail as an unreachable one."""

    name = "fake"

    def __init__(self, down: int = 0) -> None:
        super().__init__()
        self.down = down
        self.sent: list[Point] = []
        self.calls: list[str] = []
        self.sent_params: dict[str, str] = {}
        self.sent_tags: dict[str, str] = {}
        self.ended: tuple[str, list[Path]] | None = None

    def _call(self, what: str) -> None:
        if self.down:
            self.down -= 1
            raise Unreachable("cannot reach fake://tracker")
        self.calls.append(what)

    def open(self, kept: Mapping[str, Any]) -> None:
        self._call("open")
        self.kept = {"run": kept.get("run") or f"run-{time.monotonic_ns()}"}

    def params(self, values: Mapping[str, str]) -> None:
        self._call("params")
        self.sent_params = dict(values)

    def points(self, points: Sequence[Point]) -> None:
        self._call("points")
        self.sent += points

    def tags(self, values: Mapping[str, str]) -> None:
        self._call("tags")
        self.sent_tags = dict(values)

    def finish(self, state: str, files: Sequence[Path]) -> None:
        self._call("finish")
        self.ended = (state, list(files))
