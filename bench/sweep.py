"""The cost of a sweep: one 16-task job array vs 16 separate submissions, on the local cluster.

  python -m bench.sweep [--tasks 16] [--write FILE]

Both go through the CLI as users run it (`clustertrain submit ... --sweep seed=1,...,16` once,
and `clustertrain submit ... -- --seed K` 16 times), held (`--hold`) so that nothing runs and
the measure is submission alone; everything is cancelled afterwards. Reported: wall time of the
submissions, Slurm jobs in the queue, run folders written. Needs `clustertrain cluster up`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = ["jobs/mnist.yaml", "--nodes", "2", "--sbatch-option=--hold"]


def _slurm_env() -> dict[str, str]:
    from clustertrain import api

    return api.slurm().environ


def _submit(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "clustertrain", "submit", *BASE, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return re.search(r"submitted job (\d+)", done.stdout)[1]  # type: ignore[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    seeds = [str(k) for k in range(1, args.tasks + 1)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="clustertrain-bench-sweep-") as work:
        env = {**os.environ, "CLUSTERTRAIN_RUNS_DIR": f"{work}/array"}
        start = time.perf_counter()
        array = [_submit(env, "--sweep", "seed=" + ",".join(seeds))]
        rows.append(("one job array (`--sweep`)", time.perf_counter() - start, f"{work}/array"))
        env["CLUSTERTRAIN_RUNS_DIR"] = f"{work}/separate"
        start = time.perf_counter()
        separate = [_submit(env, "--", "--seed", seed) for seed in seeds]
        rows.append(
            (f"{args.tasks} separate submissions", time.perf_counter() - start, f"{work}/separate")
        )
        subprocess.run(["scancel", *array, *separate], check=True, env=_slurm_env())
        folders = [len(list(Path(folder).iterdir())) for _, _, folder in rows]
    base = rows[0][1]
    jobs = [f"1 array of {args.tasks} tasks", f"{args.tasks} jobs"]
    text = (
        f"`python -m bench.sweep`: {args.tasks} tasks of a 2-node job, submitted held.\n\n"
        "| submitted as | wall time | vs the array | in Slurm | run folders |\n"
        "|---|---|---|---|---|\n"
        + "".join(
            f"| {name} | {seconds:.2f} s | {seconds / base:.1f}x | {jobs[k]} | {folders[k]} |\n"
            for k, (name, seconds, _) in enumerate(rows)
        )
    )
    print(text)
    if args.write:
        args.write.write_text(text)


if __name__ == "__main__":
    main()
