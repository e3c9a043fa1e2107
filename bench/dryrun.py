"""How long `clustertrain submit --nodes 4 --gpus-per-node 8 --dry-run` takes, start to exit.

    python bench/dryrun.py [--runs 21]

Prints the median wall time of repeated runs beside two references: a bare interpreter start,
and rendering the same allocation with submitit's own sbatch renderer (which needs submitit
imported). Goal: the dry run under 0.15 s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 0.15
SUBMITIT_RENDER = (
    "from submitit.slurm.slurm import _make_sbatch_string\n"
    "_make_sbatch_string(command='torchrun train.py', folder='/tmp/x', job_name='mnist', "
    "nodes=4, ntasks_per_node=1, gpus_per_node=8, cpus_per_task=4, time=60)\n"
)
COMMANDS = {
    "clustertrain submit --dry-run (4x8)": [
        sys.executable,
        "-m",
        "clustertrain",
        "submit",
        "--nodes",
        "4",
        "--gpus-per-node",
        "8",
        "--dry-run",
    ],
    "python -c pass (interpreter start)": [sys.executable, "-c", "pass"],
    "submitit's renderer, same allocation": [sys.executable, "-c", SUBMITIT_RENDER],
}


def median_s(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    runs = parser.parse_args().runs
    results = {name: median_s(argv, runs) for name, argv in COMMANDS.items()}
    ours = results[next(iter(COMMANDS))]
    print(f"median of {runs} runs, {sys.platform}, python {sys.version.split()[0]}\n")
    print(f"| {'command':<40} | {'median s':>8} | {'vs dry run':>10} |")
    print(f"|{'-' * 42}|{'-' * 10}:|{'-' * 11}:|")
    for name, seconds in results.items():
        print(f"| {name:<40} | {seconds:8.3f} | {seconds / ours:9.2f}x |")
    verdict = "meets" if ours < GOAL_S else "MISSES"
    print(f"\ndry run {ours:.3f} s: {verdict} the goal of {GOAL_S} s")


if __name__ == "__main__":
    main()
