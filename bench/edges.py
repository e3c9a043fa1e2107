"""Hostile sizes at the edges, timed: what the tests check for correctness alone.

    python -m bench.edges [--runs 3]

- a dry run with a megabyte of arguments (100,000 words of 11 bytes), against one with one word;
- ``plot`` of a run folder with 1,000,000 step and metric events, against one with 1,000.

Each figure is the median of ``--runs``, in one process, on this host.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _timed(call: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def dry_run(words: int, work: Path) -> Callable[[], object]:
    import clustertrain
    from clustertrain.render import RenderedJob

    args = [f"--x={i:07d}" for i in range(words)]

    def render() -> str:
        job = clustertrain.submit(dry_run=True, module="m", args=args, runs_dir=str(work / "runs"))
        assert isinstance(job, RenderedJob)
        return job.dry_run_text()

    return render


def plot(steps: int, work: Path) -> Callable[[], object]:
    from clustertrain.runs import Run
    from clustertrain.runs import plot as drawing

    folder = work / f"plot-{steps}"
    folder.mkdir()
    metric = '{"time": T, "event": "metrics", "attempt": 0, "step": I, "loss": 0.5}\n'
    step = '{"time": T, "event": "step", "attempt": 0, "step": I}\n'
    start = time.time() - steps
    with open(folder / "events.jsonl", "w") as handle:
        for i in range(steps):
            line = metric if i % 2 else step
            handle.write(line.replace("T", f"{start + i:.3f}").replace("I", str(i)))
    run = Run(folder, "1", "bench", "2026-12-08T00:00:00+00:00", 1, 1, "torchrun")
    return lambda: drawing.draw(run, folder / "plot.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="clustertrain-bench-edges-") as name:
        work = Path(name)
        rows = [
            ("dry run, args", "1 word", dry_run(1, work), "100,000 words (1.1 MB)",
             dry_run(100_000, work)),
            ("plot, events", "1,000", plot(1_000, work), "1,000,000", plot(1_000_000, work)),
        ]  # fmt: skip
        print("| what | baseline | s | hostile size | s | ratio |\n|---|---|---:|---|---:|---:|")
        for what, small_name, small, big_name, big in rows:
            a, b = _timed(small, args.runs), _timed(big, args.runs)
            print(f"| {what} | {small_name} | {a:.3f} | {big_name} | {b:.3f} | {b / a:.0f}x |")


if __name__ == "__main__":
    main()
