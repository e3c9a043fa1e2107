"""Where a crash restart's seconds go, on the local cluster: from a rank's crash to training again.

    python -m bench.restart [--runs 5]

A plain DDP script that does not import clustertrain (bench/jobs/restart_probe.py: 2 nodes x 2
ranks, gloo, rank 1 raising once at step 60, a checkpoint every 20 steps) is submitted with
``--max-restarts 1``; after each run its own stamps and the supervisor's events say when:

- the crash: rank 1's stamp as it raises;
- the step ended: srun returned to the supervisor (its ``restarted`` event, less ``stopped_s``);
- the decision: the supervisor's ``restarted`` event, the new step launched right after;
- each rank's process born (its first line, before any import), torch imported, the process
  group up (``init_process_group``), DDP built and the checkpoint loaded, the first step done.

Each phase is the last rank's (the slowest decides when training goes on), median of the runs.
Needs `clustertrain cluster up` (namespace layout).
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
CLI = [sys.executable, "-m", "clustertrain"]
PROBE = "bench/jobs/restart_probe.py"
JOB = ["--nodes", "2", "--procs-per-node", "2", "--cpus-per-task", "2", "--max-restarts", "1"]
# The phases, in order: each from the end of the one before it.
PHASES = (
    ("step ended (srun returned)", "ended"),
    ("restart decided, step launched", "decided"),
    ("srun, launcher, its rendezvous, worker spawned", "born"),
    ("python and torch imported", "imported"),
    ("process group up", "grouped"),
    ("DDP built, checkpoint loaded", "loaded"),
    ("first step done", "first_step"),
)


def _cli(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([*CLI, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"clustertrain {args[0]} failed: {done.stderr.strip()}")
    return done.stdout


def one_run(env: dict[str, str], out: Path) -> dict[str, float]:
    """One crash and its restart: each moment, in seconds after the crash."""
    out.mkdir(parents=True)
    submitted = _cli("submit", "--script", PROBE, *JOB, "--", str(out), env=env)
    job_id = re.search(r"submitted job (\d+)", submitted)[1]  # type: ignore[index]
    run_dir = Path(re.search(r"run folder: (.+)", submitted)[1])  # type: ignore[index]
    subprocess.run([*CLI, "logs", job_id, "--follow"], cwd=ROOT, env=env, capture_output=True)
    crash = json.loads((out / "crash.json").read_text())["time"]
    found = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    restarted = next(e for e in found if e["event"] == "restarted")
    stamps = [json.loads(line) for line in (out / "phases.jsonl").read_text().splitlines()]
    again = [s for s in stamps if s["born"] > restarted["time"]]
    if len(again) != 4:
        raise SystemExit(f"job {job_id}: {len(again)} ranks restarted, not 4 ({out})")
    moments = {
        "ended": restarted["time"] - restarted["stopped_s"],
        "decided": restarted["time"],
        **{key: max(s[key] for s in again) for _, key in PHASES[2:]},
    }
    return {key: when - crash for key, when in moments.items()}


def table(runs: list[dict[str, float]]) -> list[str]:
    """Each phase's median length and the median total, in a Markdown table."""
    rows = ["| phase | median s | min | max |", "|---|---:|---:|---:|"]
    before = dict.fromkeys(range(len(runs)), 0.0)
    for name, key in PHASES:
        lengths = [run[key] - before[i] for i, run in enumerate(runs)]
        before = {i: run[key] for i, run in enumerate(runs)}
        rows.append(
            f"| {name} | {statistics.median(lengths):.2f} | {min(lengths):.2f} "
            f"| {max(lengths):.2f} |"
        )
    totals = [run["first_step"] for run in runs]
    rows.append(
        f"| **crash to training again** | **{statistics.median(totals):.2f}** "
        f"| {min(totals):.2f} | {max(totals):.2f} |"
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="clustertrain-restart-"))
    env = {**os.environ, "CLUSTERTRAIN_RUNS_DIR": str(work / "runs"), "XDG_CONFIG_HOME": str(work)}
    runs = [one_run(env, work / f"out-{n}") for n in range(args.runs)]
    print(f"{args.runs} runs; a rank's crash to training again, phase by phase (the last rank)\n")
    print("\n".join(table(runs)))
    print("\nraw: " + json.dumps(runs))


if __name__ == "__main__":
    main()
