"""Submitting over ssh against submitting on the login node, and how late a followed line is.

    python bench/remote.py [--runs 5]

Needs `clustertrain cluster up` (namespace layout: its login node runs sshd). From a clone of
this project with a commit of its own, each run submits tests/jobs/hello_world.py on 1 node and
cancels it at once:

- on the login node: `clustertrain submit` run there (timed there, over an open connection);
- over ssh, cold: no master connection and a snapshot the login node does not have yet;
- over ssh, warm: the master connection open and the snapshot there.

Then a job that prints the time every 0.2 s for 20 s is followed with `logs --follow` from here
(over ssh) and from the login node itself; each line's lateness is the time it is read here minus
the time it was printed on its node (one machine, one clock).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from clustertrain.backends.remote import ssh

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-P", "-m", "clustertrain"]
JOB = [
    "--script",
    "tests/jobs/hello_world.py",
    "--nodes",
    "1",
    "--cpus-per-task",
    "1",
    "--no-prepare",
]
TICKER = """import time
for _ in range(100):
    print("tick", time.time(), flush=True)
    time.sleep(0.2)
"""


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, done.stdout


def _commit(tree: Path) -> None:
    (tree / "NOTE").write_text(f"{uuid.uuid4()}\n")
    for args in (
        ["add", "NOTE"],
        ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "b"],
    ):
        subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True)


def _cancel(out: str, env: dict[str, str], tree: Path) -> None:
    job = re.search(r"submitted job (\d+)", out)
    if job:
        subprocess.run([*CLI, "cancel", job[1]], cwd=tree, env=env, capture_output=True)


def submits(tree: Path, env: dict[str, str], runs: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {
        "on the login node": [],
        "over ssh, cold": [],
        "over ssh, warm": [],
    }
    for _ in range(runs):
        ssh.stop_master("login")
        _commit(tree)
        took, out = _run([*CLI, "submit", "--host", "login", *JOB], tree, env)
        found["over ssh, cold"].append(took)
        _cancel(out, env, tree)
        took, out = _run([*CLI, "submit", "--host", "login", *JOB], tree, env)
        found["over ssh, warm"].append(took)
        _cancel(out, env, tree)
        # Timed on the login node itself: its clock, its clustertrain, no ssh in the figure.
        there = (
            f"cd {tree} && s=$(date +%s.%N) && out=$(clustertrain submit {' '.join(JOB)}) && "
            'echo "$(date +%s.%N) $s" && echo "$out"'
        )
        timed = ssh.run("login", [], raw=there).stdout.decode()
        end, start = map(float, timed.splitlines()[0].split())
        found["on the login node"].append(end - start)
        _cancel(timed, env, tree)
    return found


def lateness(tree: Path, env: dict[str, str], over_ssh: bool) -> list[float]:
    (tree / "ticker.py").write_text(TICKER)
    argv = [
        *CLI,
        "submit",
        "--script",
        "ticker.py",
        "--nodes",
        "1",
        "--cpus-per-task",
        "1",
        "--no-prepare",
    ]
    if over_ssh:
        at = argv.index("submit") + 1
        argv[at:at] = ["--host", "login", "--allow-dirty"]
    out = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=True).stdout
    job = re.search(r"submitted job (\d+)", out)[1]  # type: ignore[index]
    follow = subprocess.Popen([*CLI, "logs", "last" if over_ssh else job, "--follow"], cwd=tree,
                              env=env, stdout=subprocess.PIPE, text=True)  # fmt: skip
    late = []
    assert follow.stdout is not None
    for line in follow.stdout:
        if m := re.search(r"tick (\d+\.\d+)", line):
            late.append(time.time() - float(m[1]))
    follow.wait()
    return late


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="clustertrain-bench-remote-"))
    tree = scratch / "laptop"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(tree)], check=True)
    env = {**os.environ, "CLUSTERTRAIN_RUNS_DIR": str(scratch / "runs")}
    remote = [Path.home() / ".clustertrain" / sub for sub in ("code", "runs")]
    before = {path for folder in remote for path in folder.glob("*")}
    try:
        print("| submit | median (s) | min | max |\n|---|---:|---:|---:|")
        for name, values in submits(tree, env, args.runs).items():
            mid, low, high = statistics.median(values), min(values), max(values)
            print(f"| {name} | {mid:.2f} | {low:.2f} | {high:.2f} |")
        print("\n| follow | lines | median lateness (s) | p95 (s) |\n|---|---:|---:|---:|")
        for name, over in (("here, from the run folder", False), ("over ssh", True)):
            late = sorted(lateness(tree, env, over))
            p95 = late[int(0.95 * (len(late) - 1))]
            print(f"| {name} | {len(late)} | {statistics.median(late):.2f} | {p95:.2f} |")
    finally:
        ssh.stop_master("login")
        for made in {path for folder in remote for path in folder.glob("*")} - before:
            shutil.rmtree(made)  # what the bench sent and ran on the login node (this machine)
        shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
