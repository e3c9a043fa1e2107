"""How fast a hung rank is found and its step running again, on the local cluster.

    python bench/hang.py [--timeout 15] [--runs 3]

Submits tests/jobs/hang_rank.py on 2 nodes x 2 processes (rank 1 stops at step 30, once) with
``--hang-timeout T --max-restarts 1`` and reads each job's events: how long after the last
progress the hang was declared (T plus the watchdog's poll and the stack dump), how long the
step took to be ended and started again, and the job's whole time. Needs `clustertrain
cluster up`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one(timeout: int, runs_dir: str) -> dict[str, float]:
    env = {**os.environ, "CLUSTERTRAIN_RUNS_DIR": runs_dir}
    cli = [sys.executable, "-m", "clustertrain"]
    done = subprocess.run(
        [*cli, "submit", "--script", "tests/jobs/hang_rank.py", "--nodes", "2",
         "--procs-per-node", "2", "--cpus-per-task", "2", "--hang-timeout", str(timeout),
         "--max-restarts", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    job_id = re.search(r"submitted job (\d+)", done.stdout)[1]  # type: ignore[index]
    run_dir = Path(re.search(r"run folder: (.+)", done.stdout)[1])  # type: ignore[index]
    subprocess.run([*cli, "logs", job_id, "--follow"], cwd=ROOT, env=env, capture_output=True)
    seen = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    at = {e["event"]: e for e in seen}
    return {
        "declared after the timeout (s)": at["hang"]["seconds"] - timeout,
        "hang declared to step restarted (s)": at["restarted"]["time"] - at["hang"]["time"],
        "submitted to completed (s)": at["ended"]["time"] - at["queued"]["time"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=int, default=15)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs_dir = tempfile.mkdtemp(prefix="clustertrain-bench-hang-")
    results = [one(args.timeout, runs_dir) for _ in range(args.runs)]
    print(f"{args.runs} runs, hang_timeout_s {args.timeout}\n")
    print("| figure | median | min | max |\n|---|---:|---:|---:|")
    for name in results[0]:
        values = [r[name] for r in results]
        low, mid, high = min(values), statistics.median(values), max(values)
        print(f"| {name} | {mid:.1f} | {low:.1f} | {high:.1f} |")


if __name__ == "__main__":
    main()
