"""`clustertrain plot` on a run with 10,000 metric records: how long the picture takes.

  python -m bench.plot [--records 10000] [--repeats 5] [--write FILE]

Builds a run folder whose events.jsonl holds ``--records`` step records over 3 attempts (two
preemptions), with their epochs, checkpoints and the batch script's events, then times the
whole command (`python -m clustertrain plot`, interpreter and matplotlib start included) and
reading the events alone. Median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clustertrain import events, runs
from clustertrain.render import render
from clustertrain.runs import goodput
from clustertrain.spec import build_spec

ROOT = Path(__file__).resolve().parent.parent


def build(root: Path, records: int) -> runs.Run:
    job = render(build_spec(nodes=2), str(runs.new_run_dir(root, "bench-plot")), "/w")
    runs.write_run_files(job)
    run = runs.record_submission(job, "77", "slurm")
    t, per_attempt = time.time(), records // 3 + 1
    lines: list[tuple[float, str, int, dict[str, object]]] = []
    steps, epoch_steps = 0, 1000
    for attempt in range(3):
        t += 30
        lines += [
            (t, "started", attempt, {"nodes": "node[1-2]"}),
            (t + 2, "node_check", attempt, {}),
        ]
        lines.append((t + 8, "data_ready", attempt, {"seconds": 6.0}))
        t += 8
        for _ in range(min(per_attempt, records - steps)):
            steps, t = steps + 1, t + 0.05
            epoch = steps // epoch_steps + 1
            loss = 2.3 / (1 + steps / 500)
            lines.append((t, "step", attempt, {"epoch": epoch, "step": steps, "loss": loss}))
            if steps % epoch_steps == 0:
                lines.append((t, "checkpoint", attempt, {"epoch": epoch, "seconds": 0.2}))
                lines.append(
                    (
                        t,
                        "epoch",
                        attempt,
                        {"epoch": epoch, "step": steps, "test_acc": 0.9 + 0.009 * epoch},
                    )
                )
        lines.append((t + 1, "requeued" if attempt < 2 else "ended", attempt, {"status": "0"}))
    with run.events_path.open("a") as handle:
        for when, name, attempt, values in lines:
            handle.write(
                json.dumps({"time": when, "event": name, "attempt": attempt, **values}) + "\n"
            )
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="clustertrain-bench-plot-") as work:
        run = build(Path(work), args.records)
        command = [sys.executable, "-m", "clustertrain", "plot", "77", "--runs-dir", work]
        whole, reading = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
            whole.append(time.perf_counter() - start)
            start = time.perf_counter()
            found = events.read(run.events_path)
            goodput.goodput(found)
            reading.append(time.perf_counter() - start)
        size = run.events_path.stat().st_size
    text = (
        f"`python -m bench.plot`: {args.records:,} step records over 3 attempts "
        f"({len(found):,} events, {size / 1e6:.1f} MB), median of {args.repeats}.\n\n"
        "| measure | seconds |\n|---|---|\n"
        f"| `clustertrain plot JOB` (the whole command) | {statistics.median(whole):.2f} |\n"
        f"| reading and checking the events, attempts and goodput | "
        f"{statistics.median(reading):.3f} |\n"
    )
    print(text)
    if args.write:
        args.write.write_text(text)


if __name__ == "__main__":
    main()
