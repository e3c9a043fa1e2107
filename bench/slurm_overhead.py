"""What clustertrain adds on top of a hand-written sbatch script, on the local Slurm cluster.

    python bench/slurm_overhead.py [--repeats 3]

Submits the same 2-node x 2-process MNIST job (DDP under torchrun, same seed, same steps) three
ways, alternated in each round: a hand-written sbatch + srun torchrun (no clustertrain on the
nodes), clustertrain's rendered job (its supervisor, node check, heartbeats and straggler score,
which is on by default), and the same with qualification (``--qualify``). It reads the
entrypoint's own figures from its metrics: the time from the submit command to rank 0's first
training step and to its end, and the training images/s. Needs `clustertrain cluster up`.
Goals: clustertrain's images/s at least 99 % of the plain run's; its first step within 1 s.
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


def _phases(out_dir: Path, started: float) -> tuple[float, float, float]:
    """Submit to first step, submit to end, and the training images/s (the epochs' mean)."""
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["images_per_s"] for r in records if "images_per_s" in r]
    for record in reversed(records):
        if record.get("event") == "done":
            phases = record["phases"]
            rate = statistics.mean(rates) if rates else 0.0
            return phases["first_step"] - started, phases["end"] - started, rate
    raise RuntimeError(f"no done record in {out_dir}")


def run_qualified(work: Path) -> tuple[float, float, float]:
    return run_clustertrain(work, "--qualify")


def run_clustertrain(work: Path, *extra: str) -> tuple[float, float, float]:
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
            *extra,
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


def run_plain_sbatch(work: Path) -> tuple[float, float, float]:
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
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    runners = {
        "plain sbatch": run_plain_sbatch,
        "clustertrain": run_clustertrain,
        "clustertrain --qualify": run_qualified,
    }
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, runner in runners.items():
            # The local cluster's nodes share this host's /tmp; a real cluster needs a shared FS.
            with tempfile.TemporaryDirectory() as work:
                results[name].append(runner(Path(work)))
    medians = {
        name: tuple(statistics.median(r[k] for r in runs) for k in range(3))
        for name, runs in results.items()
    }
    base_first, _, base_rate = medians["plain sbatch"]
    print(f"2 nodes x 2 processes, DDP, {' '.join(TRAIN_ARGS)}; median of {repeats}, alternated\n")
    print("| submitted with | submit -> first step (s) | submit -> end (s) | images/s "
          "| first step vs plain | images/s vs plain |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for name, (first, end, rate) in medians.items():
        print(f"| {name} | {first:.2f} | {end:.2f} | {rate:.0f} | {first - base_first:+.2f} s "
              f"| {rate / base_rate:.3f} |")  # fmt: skip
    print("\nraw: " + json.dumps(results))


if __name__ == "__main__":
    main()
