"""The cost of a container: the same 2-node x 1-process DDP job on the host and in OCI images.

  python -m bench.container [--runs 3] [--steps 20] [--build] [--write FILE]

Each variant submits tests/jobs/in_container.py (gloo, a tiny model, STEPS steps of 0.2 s) on
the local cluster through the CLI and waits for it; reported is the median of the batch
shell's own time (events.jsonl: `started` to `ended`) and its ratio to the host's. Variants:
on the host (the project's venv, torch 2.14.1), in runc with the host's root filesystem as a
read-only image (same torch: the cost of the container alone), and in runc with Debian 12's
own torch 1.13 image (scripts/build-oci-image). ``--build`` first times a cold build of that
image into a fresh folder (1.4 GB, removed after). Needs `clustertrain cluster up` (root).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODES = ["--nodes", "2", "--procs-per-node", "1", "--cpus-per-task", "1"]
BUILD = ROOT / "scripts" / "build-oci-image"


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "clustertrain", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return done.stdout


def _job_seconds(env: dict[str, str], steps: int, flags: list[str]) -> float:
    """Submit, follow to the end, and return the batch shell's started-to-ended seconds."""
    out = _cli(env, "submit", *NODES, *flags, "--script", "tests/jobs/in_container.py", "--",
               str(steps))  # fmt: skip
    job_id = re.search(r"submitted job (\d+)", out)[1]  # type: ignore[index]
    run_dir = Path(re.search(r"run folder: (.+)", out)[1])  # type: ignore[index]
    _cli(env, "logs", job_id, "--follow")
    deadline = time.monotonic() + 60
    while True:  # the EXIT trap writes `ended` as the batch shell leaves
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        times = {e["event"]: e["time"] for e in events}
        if "ended" in times or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    status = [e for e in events if e["event"] == "ended"][0]["status"]
    if status != "0":
        raise SystemExit(f"job {job_id} ended with status {status}; see {run_dir}/logs")
    return float(times["ended"] - times["started"])


def _image(cache: Path) -> tuple[str, float]:
    start = time.perf_counter()
    done = subprocess.run([str(BUILD), str(cache)], capture_output=True, text=True, check=True)
    return done.stdout.strip(), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--build", action="store_true", help="time a cold image build first")
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    lines = []
    if args.build:
        cold = Path(tempfile.mkdtemp(prefix="clustertrain-bench-image-", dir="/var/tmp"))
        try:
            _, seconds = _image(cold)
            size = subprocess.run(["du", "-sh", str(cold)], capture_output=True, text=True)
            lines.append(f"Cold build of the Debian 12 torch image (`scripts/build-oci-image`): "
                         f"{seconds:.0f} s, {size.stdout.split()[0]}.\n")  # fmt: skip
        finally:
            shutil.rmtree(cold, ignore_errors=True)
    debian, _ = _image(Path("/var/cache/clustertrain/images"))
    if not ROOT.is_relative_to("/tmp"):  # the working directory's mount point (see README)
        (Path(debian) / ROOT.relative_to("/")).mkdir(parents=True, exist_ok=True)
    venv = Path(sys.prefix)
    variants = [
        ("on the host (venv, torch 2.14.1)", []),
        ("runc, the host's root read-only (torch 2.14.1)",
         ["--container-runtime", "oci", "--container-image", "/",
          "--container-env", f"PATH={venv}/bin:/usr/bin:/bin"]),
        ("runc, Debian 12 image (torch 1.13)",
         ["--container-runtime", "oci", "--container-image", debian]),
    ]  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="clustertrain-bench-container-") as work:
        env = {**os.environ, "CLUSTERTRAIN_RUNS_DIR": work}
        for name, flags in variants:
            times = [_job_seconds(env, args.steps, flags) for _ in range(args.runs)]
            rows.append((name, statistics.median(times), min(times), max(times)))
    base = rows[0][1]
    lines += [
        f"`python -m bench.container --runs {args.runs} --steps {args.steps}`: a 2-node x "
        f"1-process job of {args.steps} steps, the batch shell's time (started to ended, with "
        "the node check and srun), median of the runs.\n",
        "| where the ranks run | median | min-max | vs the host |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {med:.1f} s | {low:.1f}-{high:.1f} s | {med / base:.2f}x |"
        for name, med, low, high in rows
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.write:
        args.write.write_text(text)


if __name__ == "__main__":
    main()
