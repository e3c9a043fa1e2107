"""From a fault to the first training step again, inside the allocation, on the local cluster.

    python bench/heal.py [--runs 3] [--only lost-node|crash|hang]

- lost node: the 2-node MNIST job of the tests (tests/e2e/test_preemption.py's arguments) with
  ``--spare-nodes 1 --no-qualify``; its second node is killed (`clustertrain cluster fail`) in
  epoch 2. The cluster is started afresh before each run with SlurmdTimeout=300, a site's
  default, so Slurm's own verdict on the node plays no part. Measured from the kill: the node
  named lost, the step started again on the spare, the first training step again.
- crash: tests/jobs/crash_once.py on 2 nodes x 2 ranks with ``--max-restarts 1``: rank 1
  raises at step 30, once, and torchrun starts the workers again in place.
- hang: tests/jobs/hang_rank.py likewise with ``--hang-timeout 15 --max-restarts 1`` (rank 1
  sleeps at step 30, once); fault to training again includes the 15 s.

Crash and hang measure from the last training step before the fault. Needs root and
`clustertrain cluster up` (namespace layout); leaves the cluster up as `cluster up` makes it.
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "clustertrain"]
MNIST = ["--recipe", "fast", "--limit-train", "4000", "--batch-size", "32", "--lr", "0.05"]
MNIST += ["--epochs", "3", "--log-every", "5", "--seed", "7", "--strategy", "ddp"]
SCRIPT = ["--nodes", "2", "--procs-per-node", "2", "--cpus-per-task", "2", "--max-restarts", "1"]
SCENARIOS = {
    "lost-node": [
        "jobs/mnist.yaml",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--spare-nodes",
        "1",
        "--no-qualify",  # the roll call's time, as measured before spares turned qualification on
        "--no-avoid-bad-nodes",
    ],  # node2, lost in the run before, is back: use it
    "crash": ["--script", "tests/jobs/crash_once.py", *SCRIPT],
    "hang": ["--script", "tests/jobs/hang_rank.py", "--hang-timeout", "15", *SCRIPT],
}


def _cli(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([*CLI, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"clustertrain {args[0]} failed: {done.stderr.strip()}")
    return done.stdout


def _submit(scenario: str, env: dict[str, str]) -> tuple[str, Path]:
    extra = ["--", *MNIST] if scenario == "lost-node" else []
    out = _cli("submit", *SCENARIOS[scenario], *extra, env=env)
    job_id = re.search(r"submitted job (\d+)", out)[1]  # type: ignore[index]
    return job_id, Path(re.search(r"run folder: (.+)", out)[1])  # type: ignore[index]


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _wait_for(path_glob: str, run_dir: Path, text: str) -> None:
    deadline = time.monotonic() + 300
    while not any(text in p.read_text() for p in run_dir.glob(path_glob)):
        if time.monotonic() > deadline:
            raise SystemExit(f"never saw {text!r} in {run_dir}/{path_glob}")
        time.sleep(0.2)


def lost_node(env: dict[str, str]) -> dict[str, float]:
    _cli("cluster", "down")
    _cli("cluster", "up", "--nodes", "4", "--gpus-per-node", "2", "--slurmd-timeout", "300")
    job_id, run_dir = _submit("lost-node", env)
    _wait_for("logs/attempt-0/*.out", run_dir, "epoch 2/3 step 20/")
    killed = time.time()
    _cli("cluster", "fail", "node2")
    subprocess.run([*CLI, "logs", job_id, "--follow"], cwd=ROOT, env=env, capture_output=True)
    seen = _events(run_dir)
    at = {e["event"]: e["time"] for e in seen if e["event"] in ("node_lost", "restarted")}
    again = min(e["time"] for e in seen if e["event"] == "step" and e["time"] > at["restarted"])
    return {
        "node named lost (the roll call)": at["node_lost"] - killed,
        "step started again on the spare": at["restarted"] - killed,
        "training again": again - killed,
    }


def in_place(scenario: str, env: dict[str, str]) -> dict[str, float]:
    job_id, run_dir = _submit(scenario, env)
    subprocess.run([*CLI, "logs", job_id, "--follow"], cwd=ROOT, env=env, capture_output=True)
    steps = sorted(e["time"] for e in _events(run_dir) if e["event"] == "step")
    gap = max(later - earlier for earlier, later in zip(steps, steps[1:], strict=False))
    return {"training again": gap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="clustertrain-heal-")
    env = {**os.environ, "CLUSTERTRAIN_RUNS_DIR": work, "XDG_CONFIG_HOME": work}  # own node record
    print(f"{args.runs} runs each; seconds from the fault\n")
    print("| fault | figure | median | min | max |\n|---|---|---:|---:|---:|")
    for scenario in [args.only] if args.only else list(SCENARIOS):
        measure = (
            (lambda: lost_node(env))
            if scenario == "lost-node"
            else (
                lambda: in_place(scenario, env)  # noqa: B023  (called before the loop moves on)
            )
        )
        results = [measure() for _ in range(args.runs)]
        for name in results[0]:
            values = [r[name] for r in results]
            low, mid, high = min(values), statistics.median(values), max(values)
            print(f"| {scenario} | {name} | {mid:.1f} | {low:.1f} | {high:.1f} |", flush=True)
    if "lost-node" in ([args.only] if args.only else SCENARIOS):
        _cli("cluster", "down")
        _cli("cluster", "up", "--nodes", "4", "--gpus-per-node", "2")


if __name__ == "__main__":
    main()
