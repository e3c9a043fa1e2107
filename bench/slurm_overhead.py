"""What clustertrain adds on top of a hand-written sbatch script, on the local Slurm cluster.

    python bench/slurm_overhead.py [--repeats 3]

Submits the same 2-node x 2-process MNIST job (DDP under torchrun, a few thousand images) both
ways, alternately, and reads the entrypoint's wall-clock phases from its metrics: the time from
the submit command to rank 0's first training step and to its end. Needs `clustertrain cluster
up`. Goal: clustertrain's overhead above plain sbatch at most 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN_ARGS = ["--strategy", "ddp", "--recipe", "fast", "--epochs", "1", "--limit-train", "4000"]
PLAIN_SBATCH = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=2
#SBATCH --cpus-per-task=2
#SBATCH --time=10
#SBATCH --output={out}/slurm-%j.out
export PYTHONUNBUFFERED=1
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --kill-on-bad-exit=1 {venv}/bin/torchrun --nnodes=2 --nproc-per-node=2 \\
    --rdzv-backend=c10d --rdzv-endpoint="$head:$((29500 + SLURM_JOB_ID % 20000))" \\
    --rdzv-id="$SLURM_JOB_ID" -m jobs.mnist.train {args} --out-dir {out}/out
"""


def _slurm_env() -> dict[str, str]:
    sys.path.insert(0, str(ROOT))
    from clustertrain import api

    return api.slurm().environ


def _phases(out_dir: Path, started: float) -> tuple[float, float]:
    for line in reversed((out_dir / "metrics.jsonl").read_text().splitlines()):
        record = json.loads(line)
        if record.get("event") == "done":
            phases = record["phases"]
            return phases["first_step"] - started, phases["end"] - started
    raise RuntimeError(f"no done record in {out_dir}")


def run_clustertrain(work: Path) -> tuple[float, float]:
    env = {**os.environ, "CLUSTERTRAIN_RUNS_DIR": str(work / "runs")}
    started = time.time()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "clustertrain",
            "submit",
            "jobs/mnist.yaml",
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--",
            *TRAIN_ARGS,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    job_id = done.stdout.split("submitted job ")[1].split(":")[0]
    subprocess.run(
        [sys.executable, "-m", "clustertrain", "logs", job_id, "--follow"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        check=True,
    )
    run_dir = next((work / "runs").iterdir())
    return _phases(run_dir / "out", started)


def run_plain_sbatch(work: Path) -> tuple[float, float]:
    script = work / "plain.sbatch"
    script.write_text(PLAIN_SBATCH.format(out=work, venv=sys.prefix, args=" ".join(TRAIN_ARGS)))
    started = time.time()
    subprocess.run(
        ["sbatch", "--wait", str(script)],
        cwd=ROOT,
        env=_slurm_env(),
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return _phases(work / "out", started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    repeats = parser.parse_args().repeats
    results: dict[str, list[tuple[float, float]]] = {"plain sbatch": [], "clustertrain": []}
    runners = {"plain sbatch": run_plain_sbatch, "clustertrain": run_clustertrain}
    for _ in range(repeats):
        for name, runner in runners.items():
            # The local cluster's nodes share this host's /tmp; a real cluster needs a shared FS.
            with tempfile.TemporaryDirectory() as work:
                results[name].append(runner(Path(work)))
    medians = {
        name: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        for name, runs in results.items()
    }
    base_first, base_end = medians["plain sbatch"]
    print(f"2 nodes x 2 processes, DDP, {' '.join(TRAIN_ARGS)}; median of {repeats}\n")
    print(
        f"| {'submitted with':<14} | submit -> first step (s) | submit -> end (s) | "
        f"overhead at first step |"
    )
    print(f"|{'-' * 16}|{'-' * 25}:|{'-' * 19}:|{'-' * 24}:|")
    for name, (first, end) in medians.items():
        print(f"| {name:<14} | {first:24.2f} | {end:17.2f} | {first - base_first:+21.2f} s |")
    overhead = medians["clustertrain"][0] - base_first
    print(
        f"\nclustertrain overhead {overhead:+.2f} s: "
        f"{'meets' if overhead <= 1.0 else 'MISSES'} the goal of at most 1 s"
    )


if __name__ == "__main__":
    main()
