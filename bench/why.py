"""Why a job failed: how often the cause is right on the corpus, and what `status` costs on a
failed 16-node job's run folder with 1 GB of logs.

    python -m bench.why [--gigabytes 1] [--runs 5] [--write FILE]

Corpus: every case of ``tests/fixtures/why`` (and of ``tests/fixtures/why-slurm``, the failures
reproduced as real Slurm jobs, where present) laid out as a run folder and read as ``status``
reads it; a case scores when the headline names its kind, rank and node.

Timing: ``clustertrain status`` as a subprocess, with Slurm's commands failing as they do while
the controller is down (the state is the run folder's, as on a login node after the job), on
two run folders of a 16-node job of 8 ranks a node in which rank 77 raised: one whose node logs
hold only the failure (about 100 kB in all), one whose node logs are padded to ``--gigabytes``
with training lines before it. Alternated, ``--runs`` each; the ratio is the price of the size.
Goal: under 1 s with 1 GB (``status`` reads tails, not whole files).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODES, PER_NODE, FAILING = 16, 8, 77
CONTROLLER_DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


def corpus(folder: Path) -> tuple[list[tuple[str, bool, str]], int]:
    """Each case: its name, whether the cause names its kind, rank and node, and the headline."""
    sys.path.insert(0, str(ROOT))
    from tests.runs import test_why

    scored = []
    for at, name in enumerate(test_why.CASES):
        found, expected = test_why._cause(folder / str(at), name)
        right = found is not None and (
            found.kind == expected["kind"]
            and (found.rank, found.node) == (expected["rank"], expected["node"])
        )
        scored.append((name, right, found.headline if found else "(no cause)"))
    return scored, sum(right for _, right, _ in scored)


def _failed_job(root: Path, pad_bytes: int) -> Path:
    """A 16-node run folder whose rank 77 raised at the end, each node log padded before it."""
    sys.path.insert(0, str(ROOT))
    from clustertrain import runs
    from clustertrain.render import render
    from tests.conftest import job_spec

    spec = job_spec(name="big", nodes=NODES, procs_per_node=PER_NODE)
    job = render(spec, str(runs.new_run_dir(root, "big")), "/w")
    runs.write_run_files(job)
    run = runs.record_submission(job, "4242", "slurm")
    now = time.time()
    with run.events_path.open("a") as events:
        events.write(json.dumps({"time": now - 60, "event": "started", "attempt": 0}) + "\n")
        events.write(json.dumps({"time": now, "event": "ended", "status": 1, "attempt": 0}) + "\n")
    attempt = run.logs_dir / "attempt-0"
    attempt.mkdir(parents=True)
    for node in range(1, NODES + 1):
        _node_log(attempt / f"node{node}.err", node, pad_bytes // NODES)
    return run.path


def _node_log(path: Path, node: int, pad_bytes: int) -> None:
    ranks = range((node - 1) * PER_NODE, node * PER_NODE)
    line = "".join(f"[rank{r}]:step 100 loss 0.1234 lr 0.001 samples/s 812.5\n" for r in ranks)
    block = line.encode() * max(1, (1 << 20) // len(line))
    with path.open("wb") as out:
        for _ in range(pad_bytes // len(block)):
            out.write(block)
        if FAILING in ranks:
            out.write(
                f"[rank{FAILING}]:Traceback (most recent call last):\n"
                f'[rank{FAILING}]:  File "/w/train.py", line 88, in <module>\n'
                f"[rank{FAILING}]:    loss = step(batch)\n"
                f"[rank{FAILING}]:ValueError: rank {FAILING} gave up\n".encode()
            )
        else:
            out.write(f"[rank{ranks[0]}]:RuntimeError: Connection closed by peer\n".encode())


def _slurm_down(folder: Path) -> dict[str, str]:
    """Slurm's commands failing as they do while the controller is down."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "squeue", "sacct", "sinfo"):
        stub = bin_dir / name
        stub.write_text(f"#!/bin/sh\nprintf '%s\\n' {shlex.quote(CONTROLLER_DOWN)} >&2\nexit 1\n")
        stub.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "CLUSTERTRAIN_CLUSTER_DIR": str(folder / "no-cluster"),
    }


def _status(run_dir: Path, env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "clustertrain", "status", "4242", "--runs-dir", str(run_dir.parent)],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"status failed: {done.stderr.strip()}")
    return time.perf_counter() - started, done.stdout


def timing(folder: Path, gigabytes: float, runs: int) -> dict[str, object]:
    small = _failed_job(folder / "small", 0)
    big = _failed_job(folder / "big", int(gigabytes * (1 << 30)))
    size = sum(p.stat().st_size for p in (big / "logs").rglob("*.err"))
    env = _slurm_down(folder)
    times: dict[str, list[float]] = {"small": [], "big": []}
    said = ""
    for _ in range(runs):
        times["small"].append(_status(small, env)[0])
        seconds, said = _status(big, env)
        times["big"].append(seconds)
    return {
        "bytes": size,
        "small_median_s": statistics.median(times["small"]),
        "big_median_s": statistics.median(times["big"]),
        "big_max_s": max(times["big"]),
        "ratio": statistics.median(times["big"]) / statistics.median(times["small"]),
        "headline": next(line.strip() for line in said.splitlines() if "raised" in line),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write", help="Markdown file for the results.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="clustertrain-bench-why-") as tmp:
        scored, right = corpus(Path(tmp) / "corpus")
        timed = timing(Path(tmp) / "timing", args.gigabytes, args.runs)
    lines = [
        f"`python -m bench.why --gigabytes {args.gigabytes:g} --runs {args.runs}`",
        "",
        f"Corpus: {right} of {len(scored)} cases name the right kind, rank and node.",
        "",
        "| case | right | headline |",
        "|---|---|---|",
        *(f"| {n} | {'yes' if ok else '**no**'} | {h.replace('|', '/')} |" for n, ok, h in scored),
        "",
        f"`status` of a failed {NODES}-node job ({NODES * PER_NODE} ranks; rank {FAILING} raised), "
        f"Slurm unreachable (state from the run folder), medians of {args.runs} alternated runs:",
        "",
        "| node logs | median | max |",
        "|---|---:|---:|",
        f"| the failure only | {timed['small_median_s']:.2f} s | |",
        f"| {int(timed['bytes']) / (1 << 30):.2f} GiB | {timed['big_median_s']:.2f} s "  # type: ignore[call-overload]
        f"| {timed['big_max_s']:.2f} s |",
        "",
        f"Ratio: {timed['ratio']:.2f}. Headline: `{timed['headline']}`",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        Path(args.write).write_text(text)


if __name__ == "__main__":
    main()
