"""Qualification on the local cluster: what it costs, and how often it flags a node.

    python bench/qualify.py [--runs 10] [--nodes 2,3,4] [--only cost|healthy|link|cpu]

- cost: a job of N nodes x 1 process (tests/jobs/hello_world.py) with ``--qualify`` and
  without; the qualification's cost is the time from the supervisor's ``started`` event to its
  ``qualified`` event, less the same span to ``node_check`` without it (the node check alone).
- healthy: RUNS qualifications of 4 nodes with nothing degraded: every flag is a false one.
  (With a node degraded, below, at most 10 runs.)
- link: node3's link at 10 Mbit (`cluster degrade node3 --link-rate 10mbit`): how often it is
  flagged (and how often another node is).
- cpu: node3's processes at 25 % of one CPU (`--cpu 25%`), likewise.
- straggler: a 2-node MNIST run (`jobs/mnist.yaml`, `--recipe fast --epochs 3`); once it
  logs steps, node2's CPU goes to 25 %: the time from then to the watchdog's ``straggler``
  event naming node2.

Each job uses ``--on-flagged warn`` (it trains on, and the next run starts). Needs root and
`clustertrain cluster up` (namespace layout); heals what it degrades. Prints a Markdown table.
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
# Without the node record: a node flagged in one run must be measured again in the next.
JOB = ["--script", "tests/jobs/hello_world.py", "--procs-per-node", "1", "--cpus-per-task", "1",
       "--on-flagged", "warn",
       "--no-avoid-bad-nodes"]  # fmt: skip


def _cli(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([*CLI, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"clustertrain {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _job(nodes: int, qualify: bool, env: dict[str, str]) -> list[dict]:
    """Submit, follow to the end; the run's events."""
    out = _cli("submit", *JOB, "--nodes", str(nodes), *(["--qualify"] * qualify), env=env)
    job_id = re.search(r"submitted job (\d+)", out)[1]  # type: ignore[index]
    run_dir = Path(re.search(r"run folder: (.+)", out)[1])  # type: ignore[index]
    subprocess.run([*CLI, "logs", job_id, "--follow"], cwd=ROOT, env=env,
                   capture_output=True, check=False)  # fmt: skip
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _span(found: list[dict], last: str) -> float:
    when = {e["event"]: e["time"] for e in found}
    return when[last] - when["started"]


def _flagged(found: list[dict]) -> list[str]:
    return [e["nodes"] for e in found if e["event"] == "flagged"]


def cost(counts: list[int], runs: int, env: dict[str, str]) -> list[str]:
    rows = ["| nodes | node check alone (s) | with qualification (s) | qualification (s) |",
            "|---:|---:|---:|---:|"]  # fmt: skip
    for nodes in counts:
        alone = [_span(_job(nodes, False, env), "node_check") for _ in range(runs)]
        both = [_span(_job(nodes, True, env), "qualified") for _ in range(runs)]
        a, b = statistics.median(alone), statistics.median(both)
        rows.append(f"| {nodes} | {a:.2f} | {b:.2f} | {b - a:.2f} |")
    return rows


def flags(label: str, runs: int, env: dict[str, str], degrade: list[str]) -> str:
    if degrade:
        _cli("cluster", "degrade", "node3", *degrade, env=env)
    try:
        seen = [_flagged(_job(4, True, env)) for _ in range(runs)]
    finally:
        if degrade:
            _cli("cluster", "heal", "node3", env=env)
    node3 = sum("node3" in f for f in seen)
    others = sum(len([n for n in f if n != "node3"]) for f in seen)
    return f"| {label} | {runs} | {node3} | {others} |"


def straggler(env: dict[str, str]) -> float:
    """Seconds from node2's slowdown to the straggler event naming it."""
    out = _cli("submit", "jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1",
               "--no-avoid-bad-nodes", "--sbatch-option=--nodelist=node1,node2", "--",
               "--recipe", "fast", "--epochs", "3", env=env)  # fmt: skip
    job_id = re.search(r"submitted job (\d+)", out)[1]  # type: ignore[index]
    events = Path(re.search(r"run folder: (.+)", out)[1]) / "events.jsonl"  # type: ignore[index]
    while '"step"' not in (events.read_text() if events.exists() else ""):
        time.sleep(0.5)
    time.sleep(5)
    slowed = time.time()
    _cli("cluster", "degrade", "node2", "--cpu", "25%", env=env)
    try:
        while True:
            found = [json.loads(line) for line in events.read_text().splitlines()]
            named = [e for e in found if e["event"] == "straggler" and e["nodes"] == "node2"]
            if named:
                return named[0]["time"] - slowed
            if time.time() - slowed > 300:
                raise SystemExit("no straggler named in 300 s")
            time.sleep(0.5)
    finally:
        _cli("cluster", "heal", "node2", env=env)
        _cli("cancel", job_id, env=env)
        subprocess.run([*CLI, "logs", job_id, "--follow"], cwd=ROOT, env=env,
                       capture_output=True, check=False)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--nodes", default="2,3,4")
    parser.add_argument("--only", choices=["cost", "healthy", "link", "cpu", "straggler"])
    args = parser.parse_args()
    runs_dir = tempfile.mkdtemp(prefix="bench-qualify-")
    env = {**os.environ, "CLUSTERTRAIN_RUNS_DIR": runs_dir, "XDG_CONFIG_HOME": runs_dir}
    started = time.time()
    if args.only in (None, "cost"):
        print("\n".join(cost([int(n) for n in args.nodes.split(",")], 3, env)), "\n")
    table = ["| 4 nodes, node3 | runs | node3 flagged | another node flagged |",
             "|---|---:|---:|---:|"]  # fmt: skip
    for label, only, degrade in (("healthy", "healthy", []),
                                 ("link at 10 Mbit", "link", ["--link-rate", "10mbit"]),
                                 ("CPU at 25 %", "cpu", ["--cpu", "25%"])):  # fmt: skip
        if args.only in (None, only):
            runs = args.runs if not degrade else min(args.runs, 10)  # a slow node: 10 runs
            table.append(flags(label, runs, env, degrade))
            print(table[-1], flush=True)
    print("\n".join(table))
    if args.only in (None, "straggler"):
        times = [straggler(env) for _ in range(min(args.runs, 5))]
        print(f"\nstraggler named after node2 slowed down: {', '.join(f'{t:.1f}' for t in times)}"
              f" s (median {statistics.median(times):.1f} s)")  # fmt: skip
    print(f"\n({time.time() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
