"""`clustertrain track`: the relay's CPU and latency for a run that logs 10,000 metric records.

  python -m bench.track [--records 10000] [--live 200] [--write FILE]

Builds a run folder whose events.jsonl holds ``--records`` log_metrics records (loss and
test_acc at each step: two points a record) over 2 attempts (one requeue), then, for
TensorBoard and for MLflow (a real ``mlflow server`` on 127.0.0.1 with SQLite, started here and
stopped by its PID):

- a whole relay of the finished records (CPU seconds of this process, and wall seconds),
  without the end (the plot costs what `plot` costs: bench/RESULTS-plot.md);
- a relay again, with nothing new;
- live: ``--live`` records appended at 20 a second while ``--follow`` relays them, each
  record's latency from its write to the tracker's answer, and the relay's CPU meanwhile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from clustertrain import runs, track
from clustertrain.render import render
from clustertrain.spec import build_spec
from clustertrain.track.base import Point, Tracker
from tests.track.mlflow_server import mlflow_server


def build(root: Path, records: int) -> runs.Run:
    job = render(
        build_spec(nodes=2, script="train.py"), str(runs.new_run_dir(root, "bench-track")), "/w"
    )
    runs.write_run_files(job)
    run = runs.record_submission(job, "77", "slurm")
    # Within the job's own window (a minute before it was queued on): older events are skipped.
    t, dt = time.time() - 50, 40 / max(records, 1)
    lines = []
    for attempt in range(2):
        lines.append({"time": t, "event": "started", "attempt": attempt, "nodes": "node[1-2]"})
        for step in range(attempt * records // 2, (attempt + 1) * records // 2):
            t += dt
            loss, acc = 2.3 / (1 + step / 500), 0.9 + step / (records * 20)
            line = {"step": step, "loss": loss, "test_acc": acc}
            lines.append({"time": t, "event": "metrics", "attempt": attempt, **line})
        if attempt == 0:
            lines.append({"time": t, "event": "requeued", "attempt": 0})
    with open(run.events_path, "a", encoding="utf-8") as handle:
        handle.writelines(json.dumps(line) + "\n" for line in lines)
    return run


class Timed(Tracker):
    """A tracker in front of another: when each point's call returned."""

    def __init__(self, inner: Tracker) -> None:
        super().__init__()
        self.inner, self.name = inner, inner.name  # type: ignore[misc]
        self.latency: list[float] = []

    def open(self, kept: Mapping[str, Any]) -> None:
        self.inner.open(kept)
        self.kept = self.inner.kept

    def params(self, values: Mapping[str, str]) -> None:
        self.inner.params(values)

    def points(self, points: Sequence[Point]) -> None:
        self.inner.points(points)
        now = time.time()
        self.latency += [now - p.time for p in points if p.name == "loss"]

    def tags(self, values: Mapping[str, str]) -> None:
        self.inner.tags(values)

    def finish(self, state: str, files: Sequence[Path]) -> None:
        self.inner.finish(state, files)

    def close(self) -> None:
        self.inner.close()


def whole(run: runs.Run, make: Callable[[], Tracker]) -> dict[str, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    sent = track.relay(run, make(), lambda _: None).sent
    first = {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall}
    cpu, wall = time.process_time(), time.perf_counter()
    track.relay(run, make(), lambda _: None)
    again = {"again_cpu_s": time.process_time() - cpu, "again_wall_s": time.perf_counter() - wall}
    return {"points": sent, **first, **again}


def live(run: runs.Run, make: Callable[[], Tracker], records: int) -> dict[str, float]:
    track.relay(run, make(), lambda _: None)  # caught up first
    timed = Timed(make())
    ended = threading.Event()
    follower = threading.Thread(
        target=track.relay,
        args=(run, timed, lambda _: None),
        kwargs={"follow": True, "state": lambda: "COMPLETED" if ended.is_set() else None},
    )
    cpu, wall = time.process_time(), time.perf_counter()
    follower.start()
    for step in range(records):
        line = {"time": time.time(), "event": "metrics", "attempt": 1, "step": 10**6 + step}
        with open(run.events_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({**line, "loss": 0.1}) + "\n")
        time.sleep(0.05)
    time.sleep(2)
    ended.set()
    follower.join()
    seconds = time.perf_counter() - wall
    latency = sorted(timed.latency)
    return {
        "records": len(latency),
        "median_s": statistics.median(latency),
        "p95_s": latency[int(len(latency) * 0.95)],
        "max_s": latency[-1],
        "cpu_per_s": (time.process_time() - cpu) / seconds,  # writer's share included
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--live", type=int, default=200)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    found: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        run = build(root / "runs", args.records)
        logdir = str(root / "tb")
        tensorboard = lambda: track.make("tensorboard", run, logdir=logdir)  # noqa: E731
        found["tensorboard"] = whole(run, tensorboard)
        found["tensorboard live"] = live(run, tensorboard, args.live)
        run = build(root / "runs", args.records)
        (root / "mlflow").mkdir()
        with mlflow_server(root / "mlflow") as uri:
            mlflow = lambda: track.make("mlflow", run, uri=uri)  # noqa: E731
            found["mlflow"] = whole(run, mlflow)
            found["mlflow live"] = live(run, mlflow, args.live)
    text = json.dumps(found, indent=1)
    print(text)
    if args.write:
        args.write.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
